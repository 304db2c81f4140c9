"""Round 3's F8: a compile killed at any moment of putting its two files in place leaves a
pair that belongs together (the old model or the new one, never the old gear file with the
new data file), and the next compile removes what the killed one left."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gear_runtime as gr
from tests.models import heavy_model

SPEC = {"input_shape": "x:-1,512", "dynamic_batch_size": "1,2"}

KILL_AT = textwrap.dedent("""
    import os, signal, sys
    import gear_runtime as gr
    from gear_runtime.compiler import build
    calls, at = [0], int(sys.argv[3])
    real = os.replace
    def replace(src, dst):  # SIGKILL right before the at-th rename: no finally runs
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)
    build.os.replace = replace
    spec = gr.GearSpec.from_atc(input_shape="x:-1,512", dynamic_batch_size="1,2")
    gr.compile(sys.argv[1], spec, sys.argv[2], external_data=True, progress=False)
""")


def outputs(path: str) -> np.ndarray:
    ex = gr.load(path).create_executor()
    return ex.execute({"x": np.ones((1, 512), np.float32)})[0]


@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_killed_compile_leaves_a_whole_pair(tmp_path: Path, at: int) -> None:
    import onnx

    old_src, new_src = tmp_path / "old.onnx", tmp_path / "new.onnx"
    onnx.save(heavy_model(seed=1), old_src)
    onnx.save(heavy_model(seed=2), new_src)
    gear = tmp_path / "m.gear.onnx"
    spec = gr.GearSpec.from_atc(**SPEC)
    gr.compile(str(old_src), spec, str(gear), external_data=True, progress=False)
    old = outputs(str(gear))
    proc = subprocess.run([sys.executable, "-c", KILL_AT, str(new_src), str(gear), str(at)],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == -9, proc.stderr[-1000:]
    got = outputs(str(gear))  # loads: a whole pair
    gr.compile(str(new_src), spec, str(tmp_path / "ref.gear.onnx"), external_data=True,
               progress=False)
    new = outputs(str(tmp_path / "ref.gear.onnx"))
    assert np.array_equal(got, old) or np.array_equal(got, new)
    # the next compile to the same name succeeds and cleans up after the killed one
    gr.compile(str(new_src), spec, str(gear), external_data=True, progress=False)
    np.testing.assert_array_equal(outputs(str(gear)), new)
    left = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert left == [], left
