"""Tools around the runtime, one folder per moment of the flow:

* ``plan/`` -- before compile: the gears to compile for a trace of requests;
* ``check/`` -- after compile: the description of a gear file (``inspect``) and the padding
  check (``padding``);
* ``bench/`` -- after load: per-gear benchmarks and their comparison;
* ``demo`` walks every stage on the built-in example, ``generate`` is the seed's generation
  loop on loaded models (prefill, then decode with the state resident);
* ``common/`` -- what they share: inputs, the ``--json`` documents, the source model's facts,
  text tables."""
