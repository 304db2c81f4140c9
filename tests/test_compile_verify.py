"""compile runs every gear once before it writes (atc refuses a model it cannot build, so
do we): a shape the export baked into the graph is refused naming the gear, the node and
ORT's reason; dims the model names alike must agree; the output may not be the source."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from cli_support import run_cli
from onnx import TensorProto, helper, numpy_helper

import gear_runtime as gr
from gear_runtime.compiler import build
from gear_runtime.compiler.build import compile_gears


def baked_reshape(baked_seq: int = 64) -> onnx.ModelProto:
    """x [1, seq, 64] -> Reshape to a shape traced at seq = ``baked_seq`` (what torch.onnx
    with dynamo=False writes when the size is not marked dynamic) -> [1, 64, 4, baked/4]."""
    shape = numpy_helper.from_array(np.array([1, 64, 4, baked_seq // 4], np.int64), "baked")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "baked"], ["y"], name="/model/Reshape")], "baked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


SPEC = gr.GearSpec.from_atc("x:1,-1,64", dynamic_dims="16;32;64;128")


def test_a_gear_the_export_baked_away_is_refused_before_anything_is_written(tmp_path) -> None:
    out = tmp_path / "m.gear.onnx"
    with pytest.raises(gr.CompileError) as info:
        gr.compile(baked_reshape(), SPEC, str(out), progress=False)
    message = str(info.value)
    assert "gear 0 [16] cannot run" in message
    assert "Reshape node '/model/Reshape'" in message and "Input shape:{1,16,64}" in message
    assert "onnxruntime_src" not in message  # ORT's source location is left out
    assert not out.exists() and os.listdir(tmp_path) == []


def test_verify_false_writes_the_file_and_the_baked_gear_then_fails_at_run(tmp_path) -> None:
    spec = gr.GearSpec.from_atc("x:1,-1,64", dynamic_dims="16;64")
    out = str(tmp_path / "a.gear.onnx")
    report = compile_gears(baked_reshape(), spec, out, progress=False, verify=False)
    assert report.verified == [] and report.unverified == [0, 1]
    ex = gr.load(out).create_executor()
    assert ex.execute({"x": np.zeros((1, 64, 64), np.float32)})[0].shape == (1, 64, 4, 16)
    with pytest.raises(gr.GearRuntimeError):  # what the check at compile time prevents
        ex.execute({"x": np.zeros((1, 16, 64), np.float32)})


def test_every_gear_of_a_good_model_is_run_once(tmp_path) -> None:
    from models import HEAVY_SPEC, heavy_model
    spec = gr.GearSpec.from_atc(**HEAVY_SPEC)
    report = compile_gears(heavy_model(), spec, str(tmp_path / "h.gear.onnx"), progress=False)
    assert report.verified == list(range(spec.gear_count)) and report.unverified == []


def test_the_budget_leaves_gears_unrun_and_says_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(build, "VERIFY_MAX_WEIGHT_BYTES", 0)  # every source is "too big"
    src = tmp_path / "baked.onnx"
    onnx.save(baked_reshape(), src)
    code, out, _ = run_cli(capsys, "compile", str(src), "--input_shape=x:1,-1,64",
                           "--dynamic_dims=16;32", "-o", str(tmp_path / "m"))
    assert code == 0 and "not run at compile time: gear(s) [0, 1]" in out
    code, _, err = run_cli(capsys, "compile", str(src), "--input_shape=x:1,-1,64",
                           "--dynamic_dims=16;32", "--verify", "yes", "-o", str(tmp_path / "m"))
    assert code != 0 and "gear 0 [16] cannot run" in err


def test_dims_the_model_names_alike_must_agree_in_every_gear(tmp_path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["input_ids", "attention_mask"], ["y"])], "tied",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "seq"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    spec = gr.GearSpec.from_atc("input_ids:1,-1;attention_mask:1,-1", dynamic_dims="32,64;64,64")
    with pytest.raises(gr.CompileError) as info:
        gr.compile(model, spec, str(tmp_path / "t.gear.onnx"), progress=False)
    message = str(info.value)
    assert "input 'input_ids' axis 1 is 32 but input 'attention_mask' axis 1 is 64" in message
    assert "'seq'" in message and "gear 0" in message


def test_the_output_may_not_be_the_source(tmp_path, capsys) -> None:
    from models import heavy_model
    src = tmp_path / "convnet.onnx"
    onnx.save(heavy_model(width=64, layers=1), src)
    before = src.read_bytes()
    code, _, err = run_cli(capsys, "compile", str(src), "--input_shape=x:-1,64",
                           "--dynamic_batch_size=1,2", "-o", str(src))
    assert code != 0 and "is the source model itself" in err
    assert src.read_bytes() == before


def test_a_source_onnx_runtime_cannot_load_is_said_so_not_blamed_on_a_gear(tmp_path) -> None:
    """A graph ORT refuses (a node reading a name nothing produces) is the source's fault:
    one line with ORT's reason, no ORT prefix or source location, no baked-shape advice."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["nope"], ["y"])], "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    spec = gr.GearSpec.from_atc("x:-1,8", dynamic_batch_size="1,2")
    with pytest.raises(gr.CompileError) as info:
        gr.compile(model, spec, str(tmp_path / "b.gear.onnx"), progress=False)
    message = str(info.value)
    assert "ONNX Runtime cannot load the source model: " in message
    assert "Node input 'nope' is not a graph input" in message
    assert "[ONNXRuntimeError]" not in message and "baked" not in message
