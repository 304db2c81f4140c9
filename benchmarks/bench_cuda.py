"""Per gear on CUDA: the gear executor with and without one CUDA graph per gear (one run).

    python benchmarks/bench_cuda.py [--iterations N]

Needs onnxruntime-gpu and an NVIDIA GPU; elsewhere it says so and exits 2 (not part of
run_all, which runs on CPU machines). On the device machine of this workplace, one command:

    pip install -q onnxruntime-gpu && pip install -e . && \\
      python -m pytest -m cuda tests/test_backend_cuda.py && python benchmarks/bench_cuda.py

Both variants are measured one after the other in the same process (gear_runtime.bench, the
same inputs and iterations), on the built-in prefill example; the table gives p50 per gear and
the graph / no-graph ratio. Not yet run: no GPU was lent to the sessions that wrote it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args(argv)

    import gear_runtime as gr
    from gear_runtime.backends.onnxruntime import cuda_available, gpu_present
    from gear_runtime.bench import bench_model
    from gear_runtime.examples import prefill

    if not (cuda_available() and gpu_present()):
        print("bench_cuda: needs onnxruntime-gpu and an NVIDIA GPU; none here", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        model_path, config_path = prefill.write_example(Path(tmp))
        spec = gr.GearSpec.from_config(str(config_path))
        path = gr.compile(str(model_path), spec, str(Path(tmp) / "p.gear.onnx"),
                          progress=False)
        p50 = {}
        for graph in (False, True):
            model = gr.load(path, providers=CUDA, cuda_graph=graph)
            report = bench_model(model, iterations=args.iterations, warmup=20, progress=False,
                                 inputs=lambda m, g: prefill.example_inputs(m.spec, g, seed=g))
            p50[graph] = {r.gear: r.execute.p50 for r in report.gears}
            model.close()
    print(f"{'gear':<6}{'dims':<18}{'p50 ms':>10}{'graph p50 ms':>14}{'speed-up':>10}")
    for g, dims in enumerate(spec.gears):
        plain, graph = p50[False][g], p50[True][g]
        print(f"{g:<6}{','.join(map(str, dims)):<18}{plain:>10.3f}{graph:>14.3f}"
              f"{plain / graph:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
