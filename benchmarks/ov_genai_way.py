"""openvino-genai's ContinuousBatchingPipeline as one way of ``bench_engine.py``, run in ITS
OWN virtual environment (openvino-genai and optimum-intel pin a transformers the project's
environment does not have), speaking JSON lines over stdin / stdout.

    OV_PYTHON benchmarks/ov_genai_way.py --ir OV_DIR [--threads 2] [--max-seqs 16]
                                         [--cache-gb 1]

``OV_DIR``: ``optimum-cli export openvino --task text-generation-with-past --weight-format
fp32`` of the checkpoint (``openvino_model.xml`` + the tokenizer models, which the pipeline
loads but this script never uses: token ids go in and out). The pipeline runs on OpenVINO's
CPU plugin at f32 (``INFERENCE_PRECISION_HINT``) with an f32 KV cache (``KV_CACHE_PRECISION``;
the CPU's default is u8), ``INFERENCE_NUM_THREADS`` threads, prefix caching off (every round
sends the same prompts: a cached prefix would skip their prefill), ``max_num_seqs`` the most
sequences asked for; the other scheduler settings are openvino-genai's defaults
(``max_num_batched_tokens`` 256, ``dynamic_split_fuse``: a prompt runs in chunks beside the
decoding sequences).

Protocol, one JSON object per line:

* first line out: ``{"ready": true, "versions": {...}, "scheduler": "..."}`` once the
  pipeline is compiled, or ``{"error": "..."}`` and exit 1;
* in: ``{"prompts": [[ids], ...], "new": N}``: every prompt added at once as a request
  (greedy, exactly ``N`` new tokens: ``min_new_tokens`` and ``ignore_eos``), then ``step()``
  until all finish; out: ``{"tokens": [[ids], ...], "times": [[s, ...], ...], "wall": s}``,
  each token's time in seconds since the request line was read (a step's tokens share its
  end time), ``wall`` the seconds until the last one;
* in: ``{"quit": true}`` or end of input: exit 0.

Nothing but those lines is written to stdout: the real stdout is kept for them and fd 1 is
pointed at stderr, so anything OpenVINO prints goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, TextIO


def protocol_stream() -> TextIO:
    """The process's stdout kept for the JSON lines; fd 1 (and ``sys.stdout``) redirected to
    stderr, so no library output can break a line."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def load(ir: str, threads: int, max_seqs: int, cache_gb: int) -> tuple[Any, dict[str, Any]]:
    """(the pipeline, the hello line's fields)."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints
    import openvino_genai as ov_genai

    scheduler = ov_genai.SchedulerConfig()
    scheduler.max_num_seqs = max_seqs
    scheduler.cache_size = cache_gb  # GB of KV blocks, allocated up front
    scheduler.enable_prefix_caching = False
    properties = {hints.inference_precision: ov.Type.f32,
                  hints.kv_cache_precision: ov.Type.f32,
                  props.inference_num_threads: threads}
    pipe = ov_genai.ContinuousBatchingPipeline(ir, scheduler, "CPU", properties)
    hello = {"ready": True, "scheduler": " ".join(scheduler.to_string().split()),
             "versions": {"openvino": ov.get_version(),
                          "openvino_genai": ov_genai.__version__},
             "properties": {k: v.get_type_name() if isinstance(v, ov.Type) else str(v)
                            for k, v in properties.items()}}
    return pipe, hello


class Runner:
    """Runs one request line on the pipeline; request ids count up over the process."""

    def __init__(self, pipe: Any) -> None:
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai

        self.pipe, self.np, self.ov, self.ov_genai = pipe, np, ov, ov_genai
        self.next_id = 0

    def config(self, new: int) -> Any:
        cfg = self.ov_genai.GenerationConfig()
        cfg.max_new_tokens = new
        cfg.min_new_tokens = new
        cfg.ignore_eos = True
        cfg.do_sample = False
        return cfg

    def run(self, prompts: list[list[int]], new: int) -> dict[str, Any]:
        """All prompts as requests at once, stepped to the end: tokens and their times."""
        start = time.perf_counter()
        cfg = self.config(new)
        handles = []
        for p in prompts:
            ids = self.ov.Tensor(self.np.array([p], dtype=self.np.int64))
            handles.append(self.pipe.add_request(self.next_id, ids, cfg))
            self.next_id += 1
        tokens: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            self._read(handles, tokens, times, time.perf_counter() - start)
        self._read(handles, tokens, times, time.perf_counter() - start)  # the last step's
        return {"tokens": tokens, "times": times, "wall": time.perf_counter() - start}

    @staticmethod
    def _read(handles: list[Any], tokens: list[list[int]], times: list[list[float]],
              now: float) -> None:
        """Each handle's new tokens (greedy: one output per handle) stamped ``now``."""
        for k, handle in enumerate(handles):
            while handle.can_read():
                for out in handle.read().values():
                    got = list(out.generated_ids)
                    tokens[k].extend(got)
                    times[k].extend([now] * len(got))


def serve(pipe: Any, inp: TextIO, out: TextIO) -> None:
    runner = Runner(pipe)
    for line in inp:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("quit"):
            return
        out.write(json.dumps(runner.run(request["prompts"], int(request["new"]))) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ir", required=True, help="optimum-cli's OpenVINO export of the model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seqs", type=int, default=16)
    ap.add_argument("--cache-gb", type=int, default=1, help="GB of KV cache blocks")
    args = ap.parse_args()
    out = protocol_stream()
    try:
        pipe, hello = load(args.ir, args.threads, args.max_seqs, args.cache_gb)
    except Exception as exc:  # the parent prints it as the reason the way is left out
        out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    out.write(json.dumps(hello) + "\n")
    serve(pipe, sys.stdin, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
