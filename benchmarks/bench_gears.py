"""Per gear, on the built-in prefill example: the gear executor (ONE session over the source
graph, bound at each gear's static shapes) vs ONNX Runtime running the original
dynamic-shape model vs the naive per-input ``session.run`` of the model's session.

    python benchmarks/bench_gears.py [--iterations N] [--threads N] [--repeats N]

All columns are measured in the same run, interleaved per iteration in a shuffled order, on
the same inputs and with the same number of ORT threads (gear_runtime.tools.bench.engine).
The ratios are reported without a target: the project states none for them, and on ONNX
Runtime's CPU provider the graph at a gear's static shapes is not expected to beat the same
graph run with dynamic shapes by much (ORT's CPU kernels are the same; only per-run shape
work differs). The runtime's own overhead per call (execute minus the backend's bare run of
the same pre-bound gear) is reported too, with outputs copied (``execute()``, the default:
what ``gear-runtime bench`` and the demo time) and without (``copy=False``: ``bench
--no-copy``), the two alternating on one loaded model. Realistic sizes (tens to hundreds of MB of
weights) are in bench_scale.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

def run(iterations: int = 200, warmup: int = 20, threads: int = 1, verbose: bool = False,
        workdir: str | Path | None = None, repeats: int = 3) -> list[dict[str, Any]]:
    """Benchmark every gear of the example with outputs copied (``execute()``, the default)
    and without (``execute(copy=False)``), the two alternating ``repeats`` times on one
    loaded model; return run_all rows (medians over the repeats) and, verbose, print each
    run's table and the min-max of every figure over the repeats."""
    from bench_rows import row

    import gear_runtime as gr
    from gear_runtime.compiler import compile_model
    from gear_runtime.examples import prefill
    from gear_runtime.tools.bench.engine import bench_model

    reports: dict[bool, list[Any]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-gears-") as tmp:
        d = Path(workdir or tmp)
        model_path, config_path = prefill.write_example(d)
        spec = gr.GearSpec.from_config(str(config_path))
        gear_path = compile_model(str(model_path), spec, str(d / "prefill.gear.onnx"),
                                  progress=False)
        with gr.load(gear_path, intra_op_num_threads=threads) as model:
            for _ in range(repeats):
                for copy in (True, False):  # alternating: the machine's drift hits both
                    report = bench_model(
                        model, iterations=iterations, warmup=warmup, threads=threads,
                        reference=str(model_path), progress=verbose, copy=copy,
                        inputs=lambda m, g: prefill.example_inputs(m.spec, g, seed=g))
                    report.model = "built-in prefill example"
                    reports[copy].append(report)
                    if verbose:
                        print(report.table() + "\n")
    if verbose:
        print(_range_table(reports))
    rows = []
    for g, r in enumerate(reports[True][0].gears):
        name = f"gear {r.gear} (seq {r.dims[0]})"

        def median(copy: bool, field: str, g: int = g) -> float:
            return float(np.median([getattr(rep.gears[g], field) for rep in reports[copy]]))

        rows += [
            row("gears", f"{name} speed-up vs ORT dynamic", median(True, "speedup_vs_dynamic"),
                "x"),
            row("gears", f"{name} p50 execute", float(np.median(
                [rep.gears[g].execute.p50 for rep in reports[True]])), "ms"),
            row("gears", f"{name} speed-up vs naive session.run",
                median(True, "speedup_vs_naive"), "x"),
            row("gears", f"{name} runtime overhead per call (incl. output copy)",
                median(True, "overhead_us"), "us"),
            row("gears", f"{name} runtime overhead per call (copy=False)",
                median(False, "overhead_us"), "us"),
        ]
    return rows


def _range_table(reports: dict[bool, list[Any]]) -> str:
    """Per gear, the min-max over the repeats of the overhead and of the speed-up vs ORT on
    the dynamic model, with outputs copied and without."""
    from gear_runtime.tools.common.textfmt import format_table

    def span(copy: bool, g: int, field: str, fmt: str) -> str:
        values = [getattr(rep.gears[g], field) for rep in reports[copy]]
        return f"{format(min(values), fmt)}-{format(max(values), fmt)}"

    rows = [["gear", "dims", "overhead us (copy)", "overhead us (copy=False)",
             "x ORT dynamic (copy)", "x ORT dynamic (copy=False)"]]
    for g, r in enumerate(reports[True][0].gears):
        rows.append([str(r.gear), ",".join(map(str, r.dims)),
                     span(True, g, "overhead_us", ".1f"), span(False, g, "overhead_us", ".1f"),
                     span(True, g, "speedup_vs_dynamic", ".2f"),
                     span(False, g, "speedup_vs_dynamic", ".2f")])
    n = len(reports[True])
    return "\n".join([f"min-max over {n} runs of each, alternating (built-in prefill example, "
                      "1 ORT thread unless --threads):",
                      *format_table(rows, right=lambda c: c >= 2, rule=True)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each copy mode, alternating (default 3)")
    args = parser.parse_args(argv)
    from bench_rows import format_rows

    rows = run(args.iterations, args.warmup, args.threads, verbose=True, repeats=args.repeats)
    print()
    print(format_rows(rows))
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
