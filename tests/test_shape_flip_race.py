"""Round 3's F1: another thread rewriting an array's shape (or dtype) while a PADDED copy of
it runs with the GIL released must not crash the process: the core copies the request's
shape before it releases the GIL. Run in a subprocess, so a segfault fails the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import gear_runtime as gr

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    import numpy as np
    import gear_runtime as gr
    model = gr.load(sys.argv[1], backend=sys.argv[2])
    ex = model.create_executor()
    x = np.ones((1000, 1000), np.float32)
    stop = time.monotonic() + float(sys.argv[3])
    def flip():
        while time.monotonic() < stop:
            x.shape = (2000, 500)
            x.shape = (1000, 1000)
            x.dtype = np.uint8
            x.dtype = np.float32
    t = threading.Thread(target=flip)
    t.start()
    runs = errors = 0
    while time.monotonic() < stop:
        try:
            ex.execute({"x": x}, pad=True, copy=False)
            runs += 1
        except gr.GearRuntimeError:
            errors += 1
    t.join()
    print(runs, errors)
""")


@pytest.fixture(scope="module")
def square_gears(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("flip")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "cols"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows"])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                              "g", [x], [y], [axes])
    src = folder / "sum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    out = folder / "sum.gear.onnx"
    gr.compile(str(src), gr.GearSpec.from_atc("x:-1,-1", dynamic_dims="4,4;1024,1024"),
               str(out), progress=False)
    return str(out)


@pytest.mark.parametrize("backend", ["onnxruntime", "null"])
def test_a_shape_rewritten_during_a_padded_copy_does_not_crash(square_gears: str,
                                                                backend: str) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, square_gears, backend, "3"],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    runs, _ = map(int, proc.stdout.split())
    assert runs > 0
