"""Many sequences at once: the LLM engine against onnxruntime-genai and today's way, on the
same weights, in one interleaved run.

    python benchmarks/bench_engine.py [--size bench|small] [--sequences 1,2,4,8,16]
                                      [--new 64] [--threads 2] [--rounds 2] [--workdir DIR]
                                      [--ways engine,genai,per-sequence]

The model is :mod:`gear_runtime.examples.gqa_lm` with a batch axis, written as an
onnxruntime-genai folder (``genai_config.json`` + ``gqa_lm.onnx`` + data: the builder's
layout, GroupQueryAttention with the cache in place): at ``--size bench`` hidden 1024, 8
layers, vocab 32,000, max_seq 512, 167 M parameters (635 MiB of float32 weights). N prompts
of 40-200 tokens (seeded), ``--new`` tokens each, greedy; every way gets the same prompts and
the same ORT thread count (``--threads``, the machine's compute threads in all):

* ``engine``: :class:`gear_runtime.llm.Engine` (``max_sequences`` the largest N: batch gears
  1, 2, 4, 8, 16; its default prompt gears), all N submitted at once; its steady decode rate
  (decode tokens per second of decode steps alone, the prompts left out) is printed too;
* ``genai``: onnxruntime-genai, one ``Generator`` of batch N (prompts left to its padding,
  every one to the longest), ``min_length`` forcing ``--new`` tokens;
* ``per-sequence``: today's way before the engine: one executor per sequence with its cache
  resident in place (the batch-1 gear file, prompt gears 32-256 and the step), a thread each,
  ORT's threads divided among them.

Per N and way (median over ``--rounds``; the ways' order rotates every round): aggregate
tokens/s (all generated tokens / wall time), per-token latency p50 / p99 (the gaps between a
sequence's tokens), time to first token p50 / max, and the engine's greedy tokens checked
equal to the per-sequence executors'. Also this machine's ceiling measured in the same run:
the weight stream (the engine's steady step at N = 1, which reads every weight once for one
token: the floor of any step; the read bandwidth it implies is printed) and ORT's fp32
MatMul peak at ``--threads``; steady decode at N cannot beat ``N / max(stream, 2 * params *
N / peak)`` tokens/s (prompts add their own compute on top). "vs genai": the engine's
tokens/s over onnxruntime-genai's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

Result = dict[str, Any]


#: prompt lengths per size: (shortest, longest)
LENGTHS = {"bench": (40, 200), "small": (10, 60)}


def prompts_for(n: int, vocab: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed + n)
    low, high = lengths
    return [rng.integers(1, vocab, int(rng.integers(low, high + 1))).tolist()
            for _ in range(n)]


def summarise(start: float, times: list[list[float]], wall: float) -> Result:
    """tokens/s, per-token p50/p99 (ms), TTFT p50/max (ms) from each sequence's token times."""
    gaps = [b - a for t in times for a, b in zip(t, t[1:], strict=False)]
    ttft = [t[0] - start for t in times if t]
    tokens = sum(len(t) for t in times)

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")

    return {"tokens_per_s": tokens / wall, "token_p50_ms": pct(gaps, 50),
            "token_p99_ms": pct(gaps, 99), "ttft_p50_ms": pct(ttft, 50),
            "ttft_max_ms": max(ttft) * 1e3 if ttft else float("nan")}


class EngineWay:
    def __init__(self, folder: Path, cache: Path, max_n: int, threads: int,
                 max_seq: int) -> None:
        from gear_runtime.llm import Engine

        self.engine = Engine.from_folder(folder, max_sequences=max_n, cache_dir=cache,
                                         threads=threads)
        self.tokens: dict[int, list[list[int]]] = {}

    def run(self, prompts: list[list[int]], new: int) -> Result:
        start = time.perf_counter()
        streams = [self.engine.submit(p, new, stop_token_ids=[]) for p in prompts]
        outs = [s.result() for s in streams]
        wall = time.perf_counter() - start
        self.tokens[len(prompts)] = outs
        return summarise(start, [s.token_times for s in streams], wall)

    def steady(self) -> float:
        """Decode tokens per second of decode time so far (prompts left out)."""
        st = self.engine.stats
        return st.step_sequences / st.decode_seconds if st.decode_seconds else float("nan")


class GenaiWay:
    def __init__(self, folder: Path) -> None:
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(str(folder))
        config.clear_providers()
        self.model = og.Model(config)

    def run(self, prompts: list[list[int]], new: int) -> Result:
        og = self.og
        longest = max(len(p) for p in prompts)
        ids = np.zeros((len(prompts), longest), np.int32)  # 0: the pad id (genai_config)
        for r, p in enumerate(prompts):
            ids[r, longest - len(p):] = p  # left-padded, as genai pads a batch
        start = time.perf_counter()
        params = og.GeneratorParams(self.model)
        total = longest + new
        params.set_search_options(batch_size=len(prompts), max_length=total,
                                  min_length=total, do_sample=False)
        gen = og.Generator(self.model, params)
        gen.append_tokens(ids)
        times: list[float] = []
        while not gen.is_done():
            gen.generate_next_token()
            times.append(time.perf_counter())
        wall = time.perf_counter() - start
        return summarise(start, [times] * len(prompts), wall)


class PerSequenceWay:
    def __init__(self, gear_file: Path, sizes: Any, threads: int, max_n: int) -> None:
        import gear_runtime as gr
        from gear_runtime.examples import gqa_lm

        self.gqa, self.sizes = gqa_lm, sizes
        self.model = gr.load(str(gear_file), intra_op_num_threads=threads)
        self.executors = [self.model.create_executor(state=gqa_lm.state_pairs(sizes),
                                                     in_place_state=True)
                          for _ in range(max_n)]
        self.tokens: dict[int, list[list[int]]] = {}

    def _one(self, ex: Any, prompt: list[int], new: int, times: list[float],
             out: list[int]) -> None:
        gqa, sizes = self.gqa, self.sizes
        ex.reset_state()
        ids = np.array([prompt], np.int64)
        (logits,) = ex.execute(gqa.prompt_feeds(ids, sizes), copy=False)
        out.append(int(logits[0, len(prompt) - 1].argmax()))
        times.append(time.perf_counter())
        for pos in range(len(prompt), len(prompt) + new - 1):
            (logits,) = ex.execute(gqa.step_feeds(out[-1], pos, sizes), copy=False)
            out.append(int(logits[0, 0].argmax()))
            times.append(time.perf_counter())

    def run(self, prompts: list[list[int]], new: int) -> Result:
        times: list[list[float]] = [[] for _ in prompts]
        outs: list[list[int]] = [[] for _ in prompts]
        start = time.perf_counter()
        threads = [threading.Thread(target=self._one, args=(self.executors[k], p, new,
                                                             times[k], outs[k]))
                   for k, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        self.tokens[len(prompts)] = outs
        return summarise(start, times, wall)


def _session(graph: Any, threads: int) -> Any:
    import onnxruntime as ort
    from onnx import helper

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(helper.make_model(graph).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def matmul_peak(threads: int) -> float:
    """ORT's fp32 MatMul peak (GFLOP/s, [256, 1024] x [1024, 4096] at ``threads``)."""
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 4096])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.tobytes(), raw=True)])
    sess = _session(graph, threads)
    x = np.ones((256, 1024), np.float32)
    sess.run(None, {"x": x})
    mm = min(_timed(lambda: sess.run(None, {"x": x})) for _ in range(10))
    return 2 * 256 * 1024 * 4096 / mm / 1e9


def ceiling(weight_bytes: int, step_floor: float, peak: float,
            counts: Sequence[int]) -> dict[str, float]:
    """Steady decode's ceiling at each N: ``N / max(step_floor, 2 * params * N / peak)``."""
    params = weight_bytes // 4
    return {"read_gb_s": weight_bytes / step_floor / 1e9, "matmul_gflop_s": peak,
            "step_floor_ms": step_floor * 1e3,
            **{f"ceiling_{n}": n / max(step_floor, 2 * params * n / (peak * 1e9))
               for n in counts}}


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def build(workdir: Path, size: str, threads: int) -> tuple[Path, Path, Any]:
    from gear_runtime.examples import gqa_lm

    sizes = gqa_lm.BENCH if size == "bench" else gqa_lm.SMALL
    folder = gqa_lm.write_genai_folder(workdir / "model", sizes, batch=True)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"].update(
        {"intra_op_num_threads": threads, "inter_op_num_threads": 1})
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2))
    _, gear = gqa_lm.write_model(workdir / "batch1", sizes)
    assert gear is not None
    return folder, gear, sizes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["bench", "small"], default="bench")
    ap.add_argument("--sequences", default="1,2,4,8,16")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ways", default="engine,genai,per-sequence")
    ap.add_argument("--workdir")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.sequences.split(",")]
    names = args.ways.split(",")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_engine_"))
    folder, gear, sizes = build(work, args.size, args.threads)
    ways: dict[str, Any] = {}
    if "engine" in names:
        ways["engine"] = EngineWay(folder, work / "cache", max(counts), args.threads,
                                   sizes.max_seq)
    if "genai" in names:
        ways["genai"] = GenaiWay(folder)
    if "per-sequence" in names:
        ways["per-sequence"] = PerSequenceWay(gear, sizes, args.threads, max(counts))
    from gear_runtime.gearfile.reader import read_gear_file

    weight_bytes = read_gear_file(str(gear)).weight_bytes
    peak = matmul_peak(args.threads)
    for way in ways.values():  # warm-up: every gear the runs touch, once
        way.run(prompts_for(min(4, max(counts)), sizes.vocab, LENGTHS[args.size], seed=99), 4)
    results: dict[tuple[int, str], list[Result]] = {}
    order = list(ways)
    for r in range(args.rounds):
        for n in counts:
            prompts = prompts_for(n, sizes.vocab, LENGTHS[args.size])
            for name in order[r % len(order):] + order[:r % len(order)]:
                way = ways[name]
                before = _decode_stats(way)
                result = way.run(prompts, args.new)
                after = _decode_stats(way)
                if before is not None and after is not None and after[1] > before[1]:
                    result["steady_tokens_per_s"] = (after[0] - before[0]) / (after[1] -
                                                                              before[1])
                results.setdefault((n, name), []).append(result)
                print(f"round {r} N={n} {name}: "
                      f"{results[(n, name)][-1]['tokens_per_s']:.1f} tok/s", flush=True)
    one = [r.get("steady_tokens_per_s") for r in results.get((1, "engine"), [])]
    floor = 1 / max(one) if one and all(one) else float("nan")
    machine = ceiling(weight_bytes, floor, peak, counts)
    print(f"\nmodel: {weight_bytes / 2**20:.0f} MiB of weights; one step at N = 1 "
          f"{machine['step_floor_ms']:.1f} ms (reads {machine['read_gb_s']:.1f} GB/s); ORT "
          f"fp32 MatMul {peak:.0f} GFLOP/s at {args.threads} threads", flush=True)
    table = report(results, counts, order, machine)
    if "engine" in ways and "per-sequence" in ways:
        for n in counts:
            same = ways["engine"].tokens[n] == ways["per-sequence"].tokens[n]
            print(f"N={n}: engine tokens equal the per-sequence executors': {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": table}, indent=2))
    for way in ways.values():
        if hasattr(way, "engine"):
            way.engine.close()
    return 0


def _decode_stats(way: Any) -> tuple[int, float] | None:
    """(decode tokens, decode seconds) of an engine way so far; None for the others."""
    if not hasattr(way, "engine"):
        return None
    st = way.engine.stats
    return st.step_sequences, st.decode_seconds


def report(results: dict[tuple[int, str], list[Result]], counts: Sequence[int],
           order: Sequence[str], machine: dict[str, float]) -> list[Result]:
    rows = []
    print("\n| N | way | tokens/s | per-token p50 / p99 ms | TTFT p50 / max ms | vs genai |"
          " steady decode tok/s | decode ceiling tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for n in counts:
        med = {w: {k: statistics.median(r.get(k, float("nan")) for r in results[(n, w)])
                   for k in results[(n, w)][0]} for w in order if (n, w) in results}
        genai = med.get("genai", {}).get("tokens_per_s")
        for w, m in med.items():
            vs = f"{m['tokens_per_s'] / genai:.2f}x" if w == "engine" and genai else ""
            print(f"| {n} | {w} | {m['tokens_per_s']:.1f} | {m['token_p50_ms']:.1f} / "
                  f"{m['token_p99_ms']:.1f} | {m['ttft_p50_ms']:.0f} / {m['ttft_max_ms']:.0f} |"
                  f" {vs} | {m.get('steady_tokens_per_s', float('nan')):.0f} |"
                  f" {machine.get(f'ceiling_{n}', float('nan')):.0f} |")
            rows.append({"n": n, "way": w, **m})
    return rows


if __name__ == "__main__":
    sys.exit(main())
