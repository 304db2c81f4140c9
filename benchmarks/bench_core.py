"""Benchmark of the hot path: the C++ core (gear_runtime._core) against its pure-Python twin.

Prints ONE table, everything measured side by side in one run:

* per-call time of ``match``, ``extract`` + ``match`` and ``stage`` (4 inputs, a few KB in
  all), C++ vs reference; target: the C++ core at least 20x faster;
* ``stage`` of 4 inputs of 64 MiB in all (C++ vs reference, for information) and its
  bandwidth against ONE ``np.copyto`` of the same bytes; target: >= 0.8x;
* ``match`` with 100 gears vs 2 gears (C++); target: the 100-gear lookup within 1.2x.

Timing: ``time.perf_counter_ns`` around a loop of many calls, the best of several repeats
(the minimum is the least disturbed by other processes). Runs in well under a minute:

    python benchmarks/bench_core.py [--repeats N] [--quick]

Exit status 0 when every target passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from typing import Any

import numpy as np

from gear_runtime.core import reference

try:
    from gear_runtime import _core as native
except ImportError as exc:  # the benchmark is about the C++ core: no fallback
    sys.exit(f"gear_runtime._core is not built ({exc}); run `pip install .` first")

SMALL_TARGET = 20.0  # C++ at least this many times faster than the reference
GEARS_TARGET = 1.2  # 100-gear match at most this many times the 2-gear match
COPY_TARGET = 0.8  # staging bandwidth at least this fraction of np.copyto's


def interleaved_ns(stmts: list[str], env: dict[str, Any], calls: int,
                   repeats: int) -> list[float]:
    """Best-of-``repeats`` per-call times of several statements measured in turn, so that
    they share the machine's conditions (other processes, memory bandwidth).

    Each statement is compiled into timeit's loop of ``calls`` with bound methods prefetched
    into ``env``, so the time is the call itself, not a lambda or attribute lookups around it.
    """
    timers = [timeit.Timer(s, globals=env, timer=time.perf_counter_ns) for s in stmts]
    for t in timers:
        t.timeit(1)  # warm up (first-touch page faults, caches)
    best = [float("inf")] * len(stmts)
    for _ in range(repeats):
        for k, t in enumerate(timers):
            best[k] = min(best[k], t.timeit(calls) / calls)
    return best


def per_call_ns(stmt: str, env: dict[str, Any], calls: int, repeats: int) -> float:
    """Best-of-``repeats`` per-call time of one statement (see :func:`interleaved_ns`)."""
    return interleaved_ns([stmt], env, calls, repeats)[0]


def make_core(mod: Any, names: list[str], shapes: list[list[int]],
              positions: list[tuple[int, int, int]], gears: list[list[int]],
              dtype: Any = np.float32, fusion_size: int = 131072) -> tuple[Any, np.ndarray]:
    """A core over inputs of one ``dtype`` with its own staging buffer (positions given)."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = []
    for gear in gears:
        row = []
        for i, shape in enumerate(shapes):
            full = list(shape)
            for inp, axis, v in positions:
                if inp == i:
                    full[axis] = gear[v]
            row.append(int(np.prod(full)) * itemsize)
        nbytes.append(row)
    width = max(v for *_, v in positions) + 1
    layout = mod.plan_layout(nbytes, width, fusion_size)
    staging = np.zeros(layout.total_bytes, np.uint8)
    core = mod.ExecutorCore(names, shapes, positions, gears, [np.dtype(dtype)] * len(shapes),
                            layout, staging)
    return core, staging


def four_inputs(mod: Any, row: int, fusion_size: int = 131072) -> tuple[Any, list[np.ndarray]]:
    """4 inputs (batch -1 on axis 0, ``row`` float32 per batch row), gears 1, 2, 4, 8."""
    names = ["a", "b", "c", "d"]
    shapes = [[-1, row]] * 4
    positions = [(i, 0, 0) for i in range(4)]
    core, _ = make_core(mod, names, shapes, positions, [[1], [2], [4], [8]],
                        fusion_size=fusion_size)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((8, row)).astype(np.float32) for _ in range(4)]
    return core, arrays


def row(table: list[list[str]], case: str, a: tuple[str, float], b: tuple[str, float],
        unit: str, ratio: tuple[str, float], target: str, ok: bool | None) -> bool:
    """One table line: A and B named with their times, the ratio named with its formula."""
    verdict = "" if ok is None else ("PASS" if ok else "FAIL")
    table.append([case, f"{a[0]} {a[1]:,.1f} {unit}", f"{b[0]} {b[1]:,.1f} {unit}",
                  f"{ratio[0]} = {ratio[1]:.2f}x", target, verdict])
    return ok is not False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="best of this many loops")
    parser.add_argument("--quick", action="store_true", help="10x fewer calls per loop")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    reps = args.repeats
    table: list[list[str]] = []
    ok = True

    # -- small case: 4 inputs, 8 x 32 float32 each = 1 KiB each, 4 KiB in all ----------------
    nat, small = four_inputs(native, 32)
    ref, _ = four_inputs(reference, 32)
    env = {"nat_match": nat.match, "ref_match": ref.match, "nat_extract": nat.extract,
           "ref_extract": ref.extract, "nat_stage": nat.stage, "ref_stage": ref.stage,
           "values": (8,), "arrays": small}
    t_nat = per_call_ns("nat_match(values)", env, 200_000 // scale, reps)
    t_ref = per_call_ns("ref_match(values)", env, 20_000 // scale, reps)
    ok &= row(table, "match (4 gears)", ("_core", t_nat), ("ref", t_ref), "ns",
              ("ref/_core", t_ref / t_nat), f">= {SMALL_TARGET:.0f}x",
              t_ref / t_nat >= SMALL_TARGET)
    t_nat = per_call_ns("nat_match(nat_extract(arrays))", env, 100_000 // scale, reps)
    t_ref = per_call_ns("ref_match(ref_extract(arrays))", env, 10_000 // scale, reps)
    ok &= row(table, "extract+match (4 inputs)", ("_core", t_nat), ("ref", t_ref), "ns",
              ("ref/_core", t_ref / t_nat), f">= {SMALL_TARGET:.0f}x",
              t_ref / t_nat >= SMALL_TARGET)
    t_nat = per_call_ns("nat_stage(arrays)", env, 100_000 // scale, reps)
    t_ref = per_call_ns("ref_stage(arrays)", env, 5_000 // scale, reps)
    ok &= row(table, "stage small (4 inputs, 4 KiB)", ("_core", t_nat), ("ref", t_ref), "ns",
              ("ref/_core", t_ref / t_nat), f">= {SMALL_TARGET:.0f}x",
              t_ref / t_nat >= SMALL_TARGET)

    # -- large case: 4 inputs, 8 x 512 Ki float32 each = 16 MiB each, 64 MiB in all, all in
    # the merged span (fusion size at GE's 32 MiB cap) ------------------------------------------
    big_row = 1 << 19
    nat_big, large = four_inputs(native, big_row, native.MAX_FUSION_SIZE)
    ref_big, _ = four_inputs(reference, big_row, reference.MAX_FUSION_SIZE)
    assert nat_big.layout.merged and all(nat_big.layout.fused(i) for i in range(4))
    total = sum(a.nbytes for a in large)
    src = np.concatenate([a.ravel() for a in large]).view(np.uint8)
    dst = np.empty_like(src)
    env = {"nat_stage": nat_big.stage, "ref_stage": ref_big.stage, "arrays": large,
           "copyto": np.copyto, "src": src, "dst": dst}
    t_nat, t_ref, t_copy = interleaved_ns(
        ["nat_stage(arrays)", "ref_stage(arrays)", "copyto(dst, src)"], env, 2,
        max(3, 2 * reps // scale))
    row(table, f"stage large (4 inputs, {total >> 20} MiB)", ("_core", t_nat / 1e6),
        ("ref", t_ref / 1e6), "ms", ("ref/_core", t_ref / t_nat), "(info)", None)
    gbps_nat, gbps_copy = total / t_nat, total / t_copy  # bytes per ns = GB/s
    ok &= row(table, "stage large: bandwidth", ("_core", gbps_nat), ("np.copyto", gbps_copy),
              "GB/s", ("_core/copyto", gbps_nat / gbps_copy), f">= {COPY_TARGET}x",
              gbps_nat / gbps_copy >= COPY_TARGET)

    # -- match with 2 vs 100 gears (C++): same query shape, every gear queried in turn --------
    env = {}
    for count in (2, 100):
        gears = [[3 * g + 1, g % 5 + 1] for g in range(count)]
        core, _ = make_core(native, ["x"], [[-1, -1]], [(0, 0, 0), (0, 1, 1)], gears)
        env[f"match{count}"] = core.match
        env[f"queries{count}"] = [tuple(g) for g in gears] * (100 // count)  # 100 either way
    t100, t2 = interleaved_ns(["for q in queries100: match100(q)", "for q in queries2: match2(q)"],
                              env, 2_000 // scale, reps)
    timings = {100: t100 / 100, 2: t2 / 100}
    ratio = timings[100] / timings[2]
    ok &= row(table, "_core match: 100 vs 2 gears", ("100 gears", timings[100]),
              ("2 gears", timings[2]), "ns", ("100/2", ratio), f"<= {GEARS_TARGET}x",
              ratio <= GEARS_TARGET)

    header = ["case", "A", "B", "ratio", "target", "result"]
    widths = [max(len(r[c]) for r in [header, *table]) for c in range(len(header))]
    print(f"gear_runtime core benchmark: per-call times, best of {reps} loops")
    for line in [header, ["-" * w for w in widths], *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
