"""Generation over Triton's sequence protocol: what a tritonclient user pays per token next to
the same pipeline in process.

    python benchmarks/bench_sequences.py [--size small|bench] [--prompt 16] [--tokens 32]
                                         [--rounds 3] [--workdir DIR]

The pair is the built-in example (:mod:`gear_runtime.examples.causal_lm`; ``--size bench``:
167 M parameters, 638 MiB of float32 weights, a 64 MiB KV cache). Served with
``--state past_kv=present_kv --sequence-start prefill.gear.onnx`` (one server, HTTP and gRPC,
1 executor slot per sequence), a client sends the prompt in one start request and then one
request per token, with ``tritonclient.http`` and ``tritonclient.grpc``; in process the
same model files run through :class:`gear_runtime.tools.generate.Generator`. The three ways
alternate round by round. Reported per way: time to first token, per-token latency (median
over the tokens and rounds), and whether the tokens equal the in-process ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _client_run(client, module, prompt: np.ndarray, tokens: int, seq: int
                ) -> tuple[list[int], float, list[float]]:
    started = time.perf_counter()
    first = [module.InferInput("input_ids", list(prompt.shape), "INT64"),
             module.InferInput("attention_mask", list(prompt.shape), "INT64")]
    first[0].set_data_from_numpy(prompt)
    first[1].set_data_from_numpy(np.ones_like(prompt))
    out = [int(client.infer("decode", first, sequence_id=seq, sequence_start=True)
               .as_numpy("logits").argmax())]
    ttft, steps = time.perf_counter() - started, []
    for t in range(tokens - 1):
        step = [module.InferInput("input_ids", [1, 1], "INT64"),
                module.InferInput("position", [1], "INT64")]
        step[0].set_data_from_numpy(np.array([[out[-1]]], np.int64))
        step[1].set_data_from_numpy(np.array([prompt.shape[1] + t], np.int64))
        begin = time.perf_counter()
        result = client.infer("decode", step, sequence_id=seq, sequence_end=t == tokens - 2)
        out.append(int(result.as_numpy("logits").argmax()))
        steps.append(time.perf_counter() - begin)
    return out, ttft, steps


def _local_run(gen, prompt: np.ndarray, tokens: int) -> tuple[list[int], float, list[float]]:
    started = time.perf_counter()
    out = [gen.first_token(prompt)]
    ttft, steps = time.perf_counter() - started, []
    for t in range(tokens - 1):
        begin = time.perf_counter()
        out.append(gen.step(out[-1], prompt.shape[1] + t))
        steps.append(time.perf_counter() - begin)
    return out, ttft, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("small", "bench"), default="small")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)

    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    from serving_support import HOST, live

    from gear_runtime.examples import causal_lm
    from gear_runtime.serving import ServeOptions, build_server
    from gear_runtime.tools import generate

    sizes = causal_lm.BENCH if args.size == "bench" else causal_lm.SMALL
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-seq-"))
    _, prefill_gear, decode = generate.build_pair(work, sizes)
    prompt = causal_lm.prompt(args.prompt, sizes, seed=1)
    gen = generate.Generator(prefill_gear, decode)
    server = build_server([str(decode)], options=ServeOptions(
        state=tuple(causal_lm.STATE.items()), max_sequences=1, sequence_start=str(prefill_gear)))
    results: dict[str, dict[str, list]] = {k: {"ttft": [], "step": [], "same": []}
                                           for k in ("in process", "HTTP", "gRPC")}
    with live(server, grpc=True) as running:
        clients = {"HTTP": (thttp.InferenceServerClient(f"{HOST}:{running.port}"), thttp),
                   "gRPC": (tgrpc.InferenceServerClient(f"{HOST}:{running.grpc_port}"), tgrpc)}
        want, _, _ = _local_run(gen, prompt, args.tokens)  # also the warm-up
        for client, module in clients.values():
            _client_run(client, module, prompt, 2, 99)  # warm-up
        for r in range(args.rounds):
            for way in results:
                if way == "in process":
                    got, ttft, steps = _local_run(gen, prompt, args.tokens)
                else:
                    client, module = clients[way]
                    got, ttft, steps = _client_run(client, module, prompt, args.tokens, r + 1)
                results[way]["ttft"].append(ttft)
                results[way]["step"] += steps
                results[way]["same"].append(got == want)
    gen.close()
    base = statistics.median(results["in process"]["step"])
    print(f"model: causal_lm {args.size} ({sizes.parameters() / 1e6:.1f} M parameters, "
          f"{sizes.parameters() * 4 / 2**20:.0f} MiB float32), prompt {args.prompt}, "
          f"{args.tokens} tokens, {args.rounds} rounds")
    print(f"{'way':<12} {'TTFT ms':>9} {'step ms':>9} {'step / in process':>18} "
          f"{'tokens equal':>13}")
    for way, r in results.items():
        step = statistics.median(r["step"])
        print(f"{way:<12} {1000 * statistics.median(r['ttft']):9.2f} {1000 * step:9.3f} "
              f"{step / base:18.2f} {str(all(r['same'])):>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
