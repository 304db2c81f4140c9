"""Large CPU inputs: what ``execute`` pays for an input that ONNX Runtime reads in place.

ORT's own ``InferenceSession.run`` reads a C-contiguous numpy input where it is; the executor
copies every input into its staging buffer (the merged copy, which is what a device needs),
except an input of at least ``IN_PLACE_INPUT_BYTES`` that needs no padding, which it binds
where the caller has it. The model is a sum over a ``[1, s]`` float32 input (one output
element: the time is the input's), compiled with one gear per size. Per size, interleaved
call by call in one process: ORT's own run of the source model, ``execute`` as it is (in
place from the threshold up) and ``execute`` with every input staged (the core's in-place
size set to 0); the median over iterations, in ms, and the ratios to ORT.

    python benchmarks/bench_inputs.py [--sizes-kib 64,256,1024,4096,65536,262144]
                                      [--iterations 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import gear_runtime as gr
from gear_runtime.backends.onnxruntime import IN_PLACE_INPUT_BYTES
from gear_runtime.spec import GearSpec


def sum_model(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["a"], ["y"], keepdims=1)], "sum",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), str(path))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-kib", default="64,256,1024,4096,65536,262144")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads, both")
    args = parser.parse_args()
    sizes = [int(k) * 1024 // 4 for k in args.sizes_kib.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        source, gear_file = Path(tmp) / "sum.onnx", Path(tmp) / "sum.gear.onnx"
        sum_model(source)
        spec = GearSpec.from_atc(input_shape="a:1,-1",
                                 dynamic_dims=";".join(str(s) for s in sizes))
        gr.compile(str(source), spec, str(gear_file), progress=False)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        plain = ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        model = gr.load(str(gear_file), intra_op_num_threads=args.threads)
        placed, staged = model.create_executor(), model.create_executor()
        staged._core.in_place_bytes = 0  # every input copied into staging
        print(f"ReduceSum over one [1, s] float32 input; {args.iterations} iterations per "
              f"size, interleaved; {args.threads} intra-op thread(s); in place from "
              f"{IN_PLACE_INPUT_BYTES // 1024} KiB (IN_PLACE_INPUT_BYTES)")
        print("| input | ORT run ms | execute ms | staged ms | execute / ORT | "
              "staged / ORT |")
        print("|---|---|---|---|---|---|")
        for s in sizes:
            a = np.random.default_rng(s).standard_normal((1, s)).astype(np.float32)
            expected = plain.run(None, {"a": a})[0]
            for ex in (placed, staged):
                np.testing.assert_allclose(ex.execute({"a": a})[0], expected, rtol=1e-5)
            times: dict[str, list[float]] = {"ort": [], "placed": [], "staged": []}
            feeds = {"a": a}
            calls = {"ort": lambda f=feeds: plain.run(None, f),
                     "placed": lambda f=feeds: placed.execute(f),
                     "staged": lambda f=feeds: staged.execute(f)}
            for _ in range(args.iterations):
                for name, call in calls.items():
                    times[name].append(timed(call))
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            size = f"{a.nbytes // 2**20} MiB" if a.nbytes >= 2**20 else f"{a.nbytes // 1024} KiB"
            print(f"| {size} | {ms['ort']:.3f} | {ms['placed']:.3f} | {ms['staged']:.3f} | "
                  f"{ms['placed'] / ms['ort']:.2f}x | {ms['staged'] / ms['ort']:.2f}x |",
                  flush=True)
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
