"""Per-gear benchmarks (``gear-runtime bench``) and the comparison of two runs, one module per
concern: ``engine`` (the timed runs), ``report`` (the results and their JSON), ``context``
(machine, versions, model digest, memory), ``table`` (the text), ``plot`` (the PNG and the
plotting helpers ``compare`` shares) and ``compare`` (two runs, gear by gear)."""
