"""Per gear, on the built-in prefill example: the gear executor (ONE session over the source
graph, bound at each gear's static shapes) vs ONNX Runtime running the original
dynamic-shape model vs the naive per-input ``session.run`` of the model's session.

    python benchmarks/bench_gears.py [--iterations N] [--threads N]

All columns are measured in the same run, interleaved per iteration in a shuffled order, on
the same inputs and with the same number of ORT threads (gear_runtime.tools.bench.engine).
The ratios are reported without a target: the project states none for them, and on ONNX
Runtime's CPU provider the graph at a gear's static shapes is not expected to beat the same
graph run with dynamic shapes by much (ORT's CPU kernels are the same; only per-run shape
work differs). The runtime's own overhead per call (execute minus the backend's bare run of
the same pre-bound gear) is reported too. Realistic sizes (tens to hundreds of MB of
weights) are in bench_scale.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

def run(iterations: int = 200, warmup: int = 20, threads: int = 1, verbose: bool = False,
        workdir: str | Path | None = None) -> list[dict[str, Any]]:
    """Benchmark every gear of the example; return run_all rows (and print the table)."""
    from run_all import row

    import gear_runtime as gr
    from gear_runtime.compiler import compile_model
    from gear_runtime.examples import prefill
    from gear_runtime.tools.bench.engine import bench_model

    with tempfile.TemporaryDirectory(prefix="bench-gears-") as tmp:
        d = Path(workdir or tmp)
        model_path, config_path = prefill.write_example(d)
        spec = gr.GearSpec.from_config(str(config_path))
        gear_path = compile_model(str(model_path), spec, str(d / "prefill.gear.onnx"),
                                  progress=False)
        with gr.load(gear_path, intra_op_num_threads=threads) as model:
            report = bench_model(
                model, iterations=iterations, warmup=warmup, threads=threads,
                reference=str(model_path), progress=verbose,
                inputs=lambda m, g: prefill.example_inputs(m.spec, g, seed=g))
        report.model = "built-in prefill example"
    if verbose:
        print(report.table())
    rows = []
    for r in report.gears:
        name = f"gear {r.gear} (seq {r.dims[0]})"
        rows += [
            row("gears", f"{name} speed-up vs ORT dynamic", r.speedup_vs_dynamic, "x"),
            row("gears", f"{name} p50 execute", r.execute.p50, "ms"),
            row("gears", f"{name} speed-up vs naive session.run", r.speedup_vs_naive, "x"),
            row("gears", f"{name} runtime overhead per call (incl. output copy)",
                r.overhead_us, "us"),
        ]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    from run_all import format_rows

    rows = run(args.iterations, args.warmup, args.threads, verbose=True)
    print()
    print(format_rows(rows))
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
