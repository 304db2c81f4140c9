"""Tools around the runtime: per-gear benchmarks and their comparison (``bench``), the gear
planner (``plan``), the padding check (``padding``), the description of a gear file
(``inspect``), the demo (``demo``) and the text tables they print (``textfmt``)."""
