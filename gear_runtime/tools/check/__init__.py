"""After compile: what a gear file is (``inspect``) and whether padding is safe for it
(``padding``, ``gear-runtime check-padding``)."""
