"""The seed's service, timed: a prefill at seq gears + a static decode with the cache resident,
against plain ONNX Runtime driven the two ways a CPU user would.

    python benchmarks/bench_generate.py [--size bench|small] [--prompts 16,64,200,512]
                                        [--tokens 16] [--threads 1] [--workdir DIR]

The pair is the built-in example (:mod:`gear_runtime.examples.causal_lm`) at ``--size
bench``: hidden 1024, 16 heads, 8 layers, vocab 32,000, max_seq 1024 -- 167 M parameters
(638 MiB of float32 weights, in external data), a KV cache of 64 MiB -- with the prefill
compiled at seq gears 64/128/256/512. Side by side in ONE process, the same ORT thread count,
per prompt length, the ways in lockstep (each way's prefill in turn, then each way's first
step, each way's second, ...: a slow spell of the machine hits them alike), ``--rounds``
times, after one warm-up generation of each at that gear:

* ``gear shared``: :class:`gear_runtime.tools.generate.Generator`, the recipe: the decode's
  executor keeps the cache resident (``state=``), the prefill writes its cache into it
  (``out=``), the weights are held once (``share_weights_with=``: prepacking off);
* ``gear``: the same with each model's own weights (ORT's prepacking on);
* ``ORT run``: plain ``InferenceSession.run``; prefill on the padded gear, the cache handed
  back in as numpy every step;
* ``ORT IOBinding``: the fastest plain ORT loop: two pre-built bindings whose past / present
  buffers swap each step (the cache never leaves its two buffers), the prefill bound to
  write its cache into the first.

Reported: time to first token (prefill at the covering gear + argmax) and per-token decode
(median over ``--tokens`` steps), the greedy tokens' agreement with ``ORT run``, the bytes
memcpy'd / memmove'd per decode step (``LD_PRELOAD`` of a counter built here with gcc: every
call through the PLT, so ORT's and numpy's copies, not glibc's internal ones), and the
resident memory of the loaded pair after one generation (each way in a fresh process).
Goals (the issue's): decode <= 1.00x ORT IOBinding, no bytes copied beyond the graph's own;
TTFT <= 1.02x ORT on the same padded gear; RSS <= 1.1x one copy of the weights + caches.
onnxruntime-genai and transformers are not run here (the first needs its model builder's
graph, whose in-place cache the runtime does not bind yet; see the README).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdatomic.h>
static _Atomic unsigned long long counted;
static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);
unsigned long long gear_counted_bytes(void) { return counted; }
void *memcpy(void *d, const void *s, size_t n) {
  if (!real_memcpy) real_memcpy = dlsym(RTLD_NEXT, "memcpy");
  counted += n; return real_memcpy(d, s, n);
}
void *memmove(void *d, const void *s, size_t n) {
  if (!real_memmove) real_memmove = dlsym(RTLD_NEXT, "memmove");
  counted += n; return real_memmove(d, s, n);
}
void *__memcpy_chk(void *d, const void *s, size_t n, size_t m) { (void)m; return memcpy(d, s, n); }
"""

COUNTER_ENV = "GEAR_BENCH_COUNTER"


def build_counter(folder: Path) -> Path | None:
    """The memcpy counter as a shared library (None when gcc is missing or fails)."""
    src, lib = folder / "memcpy_counter.c", folder / "memcpy_counter.so"
    src.write_text(COUNTER_C)
    try:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return lib


def _counter_fn() -> Callable[[], int] | None:
    if not os.environ.get(COUNTER_ENV):
        return None
    fn = ctypes.CDLL(None).gear_counted_bytes
    fn.restype = ctypes.c_ulonglong
    return lambda: int(fn())


def rerun_with_counter(script: str, argv: Sequence[str] | None) -> int | None:
    """Re-run ``script`` with the memcpy counter preloaded, unless it is (its exit code);
    None: go on here (counting already, or no gcc: then bytes are not counted)."""
    if os.environ.get(COUNTER_ENV):
        return None
    lib = build_counter(Path(tempfile.mkdtemp(prefix="gear-bench-counter-")))
    if lib is None:
        print("gcc not found: bytes copied are not counted")
        return None
    env = {**os.environ, "LD_PRELOAD": str(lib), COUNTER_ENV: "1"}
    return subprocess.call([sys.executable, script, *(argv or sys.argv[1:])], env=env)


def lockstep(ways: dict[str, tuple[Callable[..., int], Callable[[int, int], int]]],
             ids: np.ndarray, tokens: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Per way (first(ids) -> token, step(token, position) -> token): one warm-up
    generation, then ``rounds`` in lockstep (each way's prefill in turn, then each way's
    first step, ...). Per way: the median TTFT and step, the median bytes memcpy'd per step
    (None without the counter) and the last round's tokens."""
    counter = _counter_fn()
    length = ids.shape[1]
    got: dict[str, dict[str, Any]] = {w: {"ttft": [], "steps": [], "bytes": []} for w in ways}
    for first, step in ways.values():  # warm-up: each way's first run of this gear
        step(first(ids), length)
    toks: dict[str, list[int]] = {}
    for _ in range(rounds):
        for way, (first, _) in ways.items():
            start = time.perf_counter()
            toks[way] = [first(ids)]
            got[way]["ttft"].append(time.perf_counter() - start)
        for t in range(tokens - 1):
            for way, (_, step) in ways.items():
                before = counter() if counter else 0
                start = time.perf_counter()
                toks[way].append(step(toks[way][-1], length + t))
                got[way]["steps"].append(time.perf_counter() - start)
                if counter:
                    got[way]["bytes"].append(counter() - before)
    return {way: {"ttft": statistics.median(g["ttft"]), "step": statistics.median(g["steps"]),
                  "bytes": statistics.median(g["bytes"]) if g["bytes"] else None,
                  "tokens": toks[way]} for way, g in got.items()}


def child_rss(code: str) -> float:
    """The ``{"rss": MiB}`` a fresh Python process running ``code`` prints last (without the
    memcpy counter preloaded)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", COUNTER_ENV)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rss"])


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class OrtLoops:
    """Plain ORT: ``run`` with numpy, and IOBinding with two swapped cache buffers."""

    def __init__(self, prefill: Path, decode: Path, threads: int, sizes: Any) -> None:
        from gear_runtime.tools import generate

        self.generate = generate
        self.prefill, self.decode = generate.ort_sessions(
            prefill, decode, {"intra_op_num_threads": threads})
        self.sizes = sizes
        self.buffers = [np.zeros(sizes.cache_shape, np.float32) for _ in range(2)]
        self.token, self.position = np.zeros((1, 1), np.int64), np.zeros(1, np.int64)
        self.logits = np.zeros((1, 1, sizes.vocab), np.float32)
        self.bindings = [self._bind(p) for p in range(2)]

    def _bind(self, parity: int) -> Any:
        b = self.decode.io_binding()
        for name, arr in (("input_ids", self.token), ("position", self.position),
                          ("past_kv", self.buffers[parity])):
            b.bind_input(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        for name, arr in (("logits", self.logits), ("present_kv", self.buffers[1 - parity])):
            b.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        return b

    def run_first(self, ids: np.ndarray, gear: int) -> tuple[int, np.ndarray]:
        logits, cache = self.prefill.run(None, self.generate.padded_feeds(ids, gear))
        return int(logits.argmax()), cache

    def run_step(self, cache: np.ndarray, token: int, position: int) -> tuple[int, np.ndarray]:
        logits, cache = self.decode.run(None, {"input_ids": np.array([[token]], np.int64),
                                               "position": np.array([position], np.int64),
                                               "past_kv": cache})
        return int(logits.argmax()), cache

    def bound_first(self, ids: np.ndarray, gear: int) -> int:
        b = self.prefill.io_binding()
        for name, arr in self.generate.padded_feeds(ids, gear).items():
            b.bind_cpu_input(name, arr)
        b.bind_output("logits", "cpu")
        b.bind_output("present_kv", "cpu", 0, np.float32, list(self.sizes.cache_shape),
                      self.buffers[0].ctypes.data)
        self.prefill.run_with_iobinding(b)
        self.parity = 0
        return int(b.get_outputs()[0].numpy().argmax())

    def bound_step(self, token: int, position: int) -> int:
        self.token[0, 0], self.position[0] = token, position
        self.decode.run_with_iobinding(self.bindings[self.parity])
        self.parity ^= 1
        return int(self.logits.argmax())


def time_ways(pair: tuple[Path, Path, Path], sizes: Any, prompts: Sequence[int], tokens: int,
              threads: int, rounds: int) -> list[dict[str, Any]]:
    """Per prompt and way: TTFT, decode step times, bytes copied per step, tokens."""
    from gear_runtime.examples import causal_lm
    from gear_runtime.tools import generate

    shared = generate.Generator(pair[1], pair[2], intra_op_num_threads=threads)
    own = generate.Generator(pair[1], pair[2], share_weights=False, intra_op_num_threads=threads)
    ort_loops = OrtLoops(pair[0], pair[2], threads, sizes)

    def gear_way(gen: generate.Generator) -> tuple[Callable[..., int], Callable[..., int]]:
        return gen.first_token, gen.step

    cache: dict[str, np.ndarray] = {}

    def run_first(ids: np.ndarray) -> int:
        token, cache["kv"] = ort_loops.run_first(ids, generate.covering_gear(ids.shape[1],
                                                                            sizes.seq_gears))
        return token

    def run_step(token: int, position: int) -> int:
        token, cache["kv"] = ort_loops.run_step(cache["kv"], token, position)
        return token

    ways = {"gear shared": gear_way(shared), "gear": gear_way(own),
            "ORT run": (run_first, run_step),
            "ORT IOBinding": (lambda ids: ort_loops.bound_first(
                ids, generate.covering_gear(ids.shape[1], sizes.seq_gears)),
                ort_loops.bound_step)}
    rows = []
    for length in prompts:
        got = lockstep(ways, causal_lm.prompt(length, sizes, seed=length), tokens, rounds)
        for way, g in got.items():
            rows.append({"prompt": length, "way": way, "ttft": g["ttft"], "step": g["step"],
                         "bytes": g["bytes"],
                         "same_tokens": g["tokens"] == got["ORT run"]["tokens"]})
        print(f"  prompt {length}: done", flush=True)
    return rows


RSS_CHILD = r"""
import json, os, sys
import numpy as np
sys.path.insert(0, {root!r})
from gear_runtime.examples import causal_lm
from gear_runtime.tools import generate
from benchmarks.bench_generate import rss_mib, OrtLoops
way, sizes = {way!r}, getattr(causal_lm, {size!r})
base = rss_mib()
length = min(200, max(sizes.seq_gears))
ids = causal_lm.prompt(length, sizes)
gear = generate.covering_gear(length, sizes.seq_gears)
if way.startswith("gear"):
    gen = generate.Generator({gear_file!r}, {decode!r}, share_weights=way == "gear shared",
                             intra_op_num_threads=1)
    gen.generate(ids, 4)
else:
    loops = OrtLoops({prefill!r}, {decode!r}, 1, sizes)
    loops.bound_first(ids, gear)
    for t in range(3):
        loops.bound_step(1, length + t)
print(json.dumps({{"rss": rss_mib() - base}}))
"""


def rss_of(way: str, pair: tuple[Path, Path, Path], size: str) -> float:
    root = str(Path(__file__).resolve().parent.parent)
    return child_rss(RSS_CHILD.format(root=root, way=way, size=size.upper(),
                                      gear_file=str(pair[1]), decode=str(pair[2]),
                                      prefill=str(pair[0])))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("bench", "small"), default="bench")
    parser.add_argument("--prompts", default="16,64,200,512")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    code = rerun_with_counter(__file__, argv)
    if code is not None:
        return code

    from gear_runtime.examples import causal_lm
    from gear_runtime.tools import generate

    sizes = getattr(causal_lm, args.size.upper())
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gear-bench-generate-"))
    if not (workdir / "prefill.gear.onnx").exists():
        start = time.perf_counter()
        generate.build_pair(workdir, sizes)
        print(f"built the pair in {workdir} ({time.perf_counter() - start:.0f} s)")
    pair = (workdir / "prefill.onnx", workdir / "prefill.gear.onnx", workdir / "decode.onnx")
    prompts = [int(p) for p in args.prompts.split(",")]
    print(f"pair: {sizes.parameters() / 1e6:.0f} M parameters ({sizes.parameters() * 4 / 2**20:.0f}"
          f" MiB float32), KV cache {list(sizes.cache_shape)} = "
          f"{sizes.cache_nbytes / 2**20:.0f} MiB, prefill gears {list(sizes.seq_gears)}; "
          f"{args.threads} ORT thread(s), {args.tokens} tokens, {args.rounds} rounds")
    rows = time_ways(pair, sizes, prompts, args.tokens, args.threads, args.rounds)
    print_table(rows)
    print_memory(pair, args.size, sizes)
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    ref = {(r["prompt"], r["way"]): r for r in rows}
    print(f"\n{'prompt':>6} {'way':<14} {'TTFT ms':>8} {'/ORT run':>8} {'step ms':>8} "
          f"{'/IOBind':>8} {'MiB copied/step':>15} {'tokens':>7}")
    for r in rows:
        run, bound = ref[(r["prompt"], "ORT run")], ref[(r["prompt"], "ORT IOBinding")]
        copied = "-" if r["bytes"] is None else f"{r['bytes'] / 2**20:.2f}"
        print(f"{r['prompt']:>6} {r['way']:<14} {r['ttft'] * 1e3:>8.1f} "
              f"{r['ttft'] / run['ttft']:>8.3f} {r['step'] * 1e3:>8.2f} "
              f"{r['step'] / bound['step']:>8.3f} {copied:>15} "
              f"{'same' if r['same_tokens'] else 'DIFFER':>7}")


def print_memory(pair: tuple[Path, Path, Path], size: str, sizes: Any) -> None:
    weights = sizes.parameters() * 4 / 2**20
    floor = weights + 2 * sizes.cache_nbytes / 2**20
    print(f"\nresident memory of the loaded pair after one generation (fresh process each; "
          f"one copy of the weights + two caches = {floor:.0f} MiB):")
    for way in ("gear shared", "gear", "ORT IOBinding"):
        rss = rss_of(way, pair, size)
        print(f"  {way:<14} +{rss:7.0f} MiB  ({rss / floor:.2f}x)")


if __name__ == "__main__":
    raise SystemExit(main())
