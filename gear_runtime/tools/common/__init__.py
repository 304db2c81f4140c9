"""What the tools share: synthetic and request inputs (``inputs``), the ``--json`` documents
(``jsonout``), the source model's facts (``source``) and the text tables (``textfmt``)."""
