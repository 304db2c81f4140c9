"""Per-gear benchmarks (``gear-runtime bench``) and the comparison of two runs."""
