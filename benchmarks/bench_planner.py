"""The gear planner vs a hand-picked gear set (32/512/1024/2048) on a prompt-length trace.

Trace: 10,000 prompt lengths from a log-normal with median 200 and sigma 1.0 (ln-space),
rounded up to integers >= 1 and capped at 2048 (a prefill service's lengths). Cost: latency
MEASURED on the built-in prefill model (built with 2048 positions so that it runs at these
sizes), compiled with a ladder of gears up to 2048 and benchmarked with the bench engine,
interpolated piecewise linearly. Every request runs padded on its cheapest covering gear.

Prints ONE table: per gear set (the hand-picked one, the planner's with 4 gears on measured
cost, the planner's with 4 gears on element cost, and the planner's with 8), the expected mean
and p99 latency per request and the padding waste:

    python benchmarks/bench_planner.py [--ladder N] [--iterations N] [--sigma S]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx

import gear_runtime as gr
from gear_runtime.examples import prefill
from gear_runtime.tools.plan import (
    elements_cost,
    evaluate,
    ladder_sizes,
    measure_latency,
    plan_gears,
)

HAND_GEARS = (32, 512, 1024, 2048)


def trace(n: int, median: float, sigma: float, cap: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = np.ceil(rng.lognormal(np.log(median), sigma, n)).astype(np.int64)
    return np.clip(lengths, 1, cap)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ladder", type=int, default=10, help="gears measured (default 10)")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--sigma", type=float, default=1.0)
    args = parser.parse_args(argv)
    lengths = trace(10_000, 200, args.sigma, 2048)
    requests = [(int(s), int(s), int(s), prefill.IMAGE_TOKENS) for s in lengths]
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "prefill2048.onnx")
        onnx.save(prefill.build_prefill_model(max_positions=2048), source)
        config = os.path.join(tmp, "config.ini")
        with open(config, "w", encoding="utf-8") as f:
            f.write(prefill.prefill_config())
        spec = gr.GearSpec.from_config(config)
        ladder = [(s, s, s, prefill.IMAGE_TOKENS) for s in ladder_sizes(2048, args.ladder)]
        curve = measure_latency(source, spec, ladder, 0, iterations=args.iterations,
                                inputs=lambda m, g: prefill.example_inputs(m.spec, g))

    def latency(gear: tuple[int, ...]) -> float:
        return curve(gear[0])

    size = elements_cost(spec)
    hand_plan = evaluate([(s, s, s, 16) for s in HAND_GEARS], requests, latency, "ms",
                         element_cost=size)
    measured4 = plan_gears(requests, 4, "measured", curve=curve, spec=spec)
    elements4 = plan_gears(requests, 4, "elements", spec=spec)
    elements4 = evaluate(elements4.gears, requests, latency, "ms", element_cost=size)
    measured8 = plan_gears(requests, 8, "measured", curve=curve, spec=spec)
    print(f"trace: 10,000 lengths, log-normal median 200, sigma {args.sigma}, capped at 2048 "
          f"(p50 {np.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, "
          f"{(lengths == 2048).mean():.1%} at the cap)")
    print("measured latency (tokens: ms): " + ", ".join(
        f"{s}: {v:.3f}" for s, v in zip(curve.sizes, curve.latency_ms, strict=True)))
    print(f"{'gear set':<44} {'mean ms':>8} {'p99 ms':>8} {'waste':>7} {'vs hand':>8}")
    plans = (("hand-picked 32/512/1024/2048", hand_plan),
             ("planned, 4 gears, measured", measured4),
             ("planned, 4 gears, elements", elements4), ("planned, 8 gears, measured", measured8))
    for name, plan in plans:
        gears = "/".join(str(g[0]) for g in plan.gears)
        print(f"{name + ' (' + gears + ')':<44.44} {plan.mean_cost:>8.3f} {plan.p99_cost:>8.3f} "
              f"{plan.waste:>7.1%} {plan.mean_cost / hand_plan.mean_cost:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
