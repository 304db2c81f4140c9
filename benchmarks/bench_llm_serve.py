"""Served against in process: N streaming clients of ``gear-runtime serve MODEL_DIR`` (the
real ``openai`` client, OpenAI's /v1/completions with ``stream: true``) against the same
engine in this process, on the same model, in one interleaved run.

    python benchmarks/bench_llm_serve.py [--size bench|small] [--sequences 1,4,8,16]
                                         [--new 64] [--threads 2] [--rounds 2] [--workdir DIR]

The model is bench_engine.py's (:mod:`gear_runtime.examples.gqa_lm` as an onnxruntime-genai
folder, ``--size bench``: 167 M parameters) with a tokenizer beside it; prompts are
bench_engine.py's (40-200 token ids, seeded), ``--new`` tokens each (``ignore_eos``), greedy.

* ``in-process``: :class:`gear_runtime.llm.Engine`, every prompt submitted at once, each
  token timed as the engine hands it over;
* ``served``: ``gear-runtime serve`` in its own process (``--max-sequences`` the largest N,
  ``--intra-op-threads`` ``--threads``, the same compiled gears), N ``AsyncOpenAI`` streams
  opened at once from this process; each token timed as its chunk arrives (chunks carry
  their ``token_ids``: vLLM's ``return_token_ids``), and checked equal to in-process.

Per N and way (median over ``--rounds``; the order alternates): aggregate tokens/s, time to
first token p50 / p99, inter-token latency p50 / p99 (ms). "served / in-process": the
tokens/s ratio (goal >= 0.95). The server's own figure of how long a made token waits before
its stream has it (``gear_llm_token_delivery_seconds``, from /metrics) is printed after the
table, as the fraction of tokens delivered within 1 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_engine import LENGTHS, EngineWay, prompts_for

Result = dict[str, Any]


def summarise(starts: list[float], times: list[list[float]], wall: float) -> Result:
    gaps = [b - a for t in times for a, b in zip(t, t[1:], strict=False)]
    ttft = [t[0] - s for s, t in zip(starts, times, strict=True) if t]

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")

    return {"tokens_per_s": sum(len(t) for t in times) / wall,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "itl_p50_ms": pct(gaps, 50), "itl_p99_ms": pct(gaps, 99)}


class InProcess(EngineWay):
    """bench_engine.py's engine way, summarised as the served way is."""

    def run(self, prompts: list[list[int]], new: int) -> Result:
        start, streams, wall = self.generate(prompts, new)
        return summarise([start] * len(prompts), [s.token_times for s in streams], wall)


class Served:
    def __init__(self, folder: Path, max_n: int, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gear_runtime.cli", "serve", str(folder), "--port", "0",
             "--max-sequences", str(max_n), "--intra-op-threads", str(threads)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not match:
            raise RuntimeError(f"the server did not start: {line!r}")
        self.port = int(match.group(1))
        self.name = folder.name
        self.tokens: dict[int, list[list[int]]] = {}

    def run(self, prompts: list[list[int]], new: int) -> Result:
        return asyncio.run(self._run(prompts, new))

    async def _run(self, prompts: list[list[int]], new: int) -> Result:
        import openai

        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{self.port}/v1",
                                    api_key="none", max_retries=0, timeout=600)

        async def one(prompt: list[int]) -> tuple[float, list[float], list[int]]:
            sent = time.perf_counter()
            times: list[float] = []
            ids: list[int] = []
            stream = await client.completions.create(
                model=self.name, prompt=prompt, max_tokens=new, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            async for chunk in stream:
                now = time.perf_counter()
                got = chunk.choices[0].token_ids if chunk.choices else []
                times += [now] * len(got)
                ids += got
            return sent, times, ids

        start = time.perf_counter()
        done = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - start
        await client.close()
        self.tokens[len(prompts)] = [ids for _, _, ids in done]
        return summarise([s for s, _, _ in done], [t for _, t, _ in done], wall)

    def delivery(self) -> tuple[float, float]:
        """(tokens delivered within 1 ms, all tokens) from the server's histogram."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics").read()
        within = total = 0.0
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if s.name == "gear_llm_token_delivery_seconds_bucket":
                    if s.labels["le"] == "0.001":
                        within = s.value
                    if s.labels["le"] == "+Inf":
                        total = s.value
        return within, total

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def build(workdir: Path, size: str) -> tuple[Path, Any]:
    from gear_runtime.examples import gqa_lm

    sizes = gqa_lm.BENCH if size == "bench" else gqa_lm.SMALL
    return gqa_lm.write_genai_folder(workdir / "model", sizes, batch=True), sizes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["bench", "small"], default="bench")
    ap.add_argument("--sequences", default="1,4,8,16")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.sequences.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_llm_serve_"))
    os.environ["GEAR_RUNTIME_LLM_CACHE"] = str(work / "cache")  # one compile for both
    folder, sizes = build(work, args.size)
    ways: dict[str, Any] = {"in-process": InProcess(folder, None, max(counts), args.threads)}
    ways["served"] = Served(folder, max(counts), args.threads)
    try:
        for way in ways.values():  # warm-up: the gears the runs touch
            way.run(prompts_for(min(4, max(counts)), sizes.vocab, LENGTHS[args.size], 99), 4)
        results: dict[tuple[int, str], list[Result]] = {}
        order = list(ways)
        for r in range(args.rounds):
            for n in counts:
                prompts = prompts_for(n, sizes.vocab, LENGTHS[args.size])
                for name in order[r % 2:] + order[:r % 2]:
                    results.setdefault((n, name), []).append(ways[name].run(prompts,
                                                                            args.new))
                    print(f"round {r} N={n} {name}: "
                          f"{results[(n, name)][-1]['tokens_per_s']:.1f} tok/s", flush=True)
        report(results, counts, order)
        for n in counts:
            same = ways["served"].tokens[n] == ways["in-process"].tokens[n]
            print(f"N={n}: served tokens equal in-process: {same}")
        within, total = ways["served"].delivery()
        print(f"server: {within:.0f} of {total:.0f} tokens ({within / max(total, 1):.1%}) "
              "reached their client's stream within 1 ms of the engine making them")
    finally:
        for way in ways.values():
            way.close()
    return 0


def report(results: dict[tuple[int, str], list[Result]], counts: Sequence[int],
           order: Sequence[str]) -> None:
    print("\n| N | way | tokens/s | TTFT p50 / p99 ms | inter-token p50 / p99 ms |"
          " served / in-process |")
    print("|---|---|---|---|---|---|")
    for n in counts:
        med = {w: {k: statistics.median(r[k] for r in results[(n, w)])
                   for k in results[(n, w)][0]} for w in order}
        base = med["in-process"]["tokens_per_s"]
        for w, m in med.items():
            ratio = f"{m['tokens_per_s'] / base:.2f}x" if w == "served" else ""
            print(f"| {n} | {w} | {m['tokens_per_s']:.1f} | {m['ttft_p50_ms']:.0f} / "
                  f"{m['ttft_p99_ms']:.0f} | {m['itl_p50_ms']:.1f} / {m['itl_p99_ms']:.1f} |"
                  f" {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
