"""check_padding / ``gear-runtime check-padding``: flags an unsafe model, passes a safe one."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import gear_runtime as gr
from gear_runtime.cli import main
from gear_runtime.tools.padding import default_samples


def seq_model(mean: bool) -> onnx.ModelProto:
    """x [1, S, 4] -> y = 2x + 1 [1, S, 4] (safe to pad), and with ``mean`` also
    m = mean of x over S [1, 1, 4] (reads the padded positions: unsafe)."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 4])]
    if mean:
        nodes.append(helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1))
        outputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, 4]))
    graph = helper.make_graph(
        nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 4])],
        outputs, [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
                  helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def compiled(tmp_path, mean: bool) -> tuple[str, str]:
    source = str(tmp_path / f"seq{int(mean)}.onnx")
    onnx.save(seq_model(mean), source)
    gear = str(tmp_path / f"seq{int(mean)}.gear.onnx")
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1,4", dynamic_dims="4;8;16")
    gr.compile(source, spec, gear, progress=False)
    return source, gear


def test_safe_model_passes(tmp_path) -> None:
    source, gear = compiled(tmp_path, mean=False)
    report = gr.check_padding(gear, source)
    assert report.safe and [o.name for o in report.outputs] == ["y"]
    assert report.samples == default_samples(gr.load(gear, backend="null").spec)
    assert (1,) in report.samples and (9,) in report.samples and (15,) in report.samples
    assert "SAFE" in report.table()


def test_mean_over_the_padded_axis_is_flagged(tmp_path) -> None:
    source, gear = compiled(tmp_path, mean=True)
    report = gr.check_padding(gear, source, samples=[3, 5, 16])
    assert not report.safe
    y, m = report.outputs
    assert y.safe and not m.safe
    assert m.failed == [(3,), (5,)]  # the exact gear 16 runs unpadded: no difference
    assert m.max_abs > 1e-3 and "UNSAFE" in m.verdict
    # a pad value that makes the mean right cannot exist; the verdict does not depend on it
    assert not gr.check_padding(gear, source, samples=[3], pad_values={"x": 1.0}).safe


def test_cli_exit_codes(tmp_path, capsys) -> None:
    source, gear = compiled(tmp_path, mean=False)
    assert main(["check-padding", gear, source]) == 0
    assert "padding is SAFE" in capsys.readouterr().out
    source, gear = compiled(tmp_path, mean=True)
    assert main(["check-padding", gear, source, "--samples", "3;5",
                 "--pad-value", "x=0"]) == 1
    out = capsys.readouterr().out
    assert "UNSAFE" in out and "m " in out
    assert main(["check-padding", gear, source, "--pad-value", "x"]) == 2


def test_prefill_is_safe_with_the_mask_padded_with_zero(tmp_path) -> None:
    from gear_runtime.examples import prefill

    source, config = prefill.write_example(tmp_path)
    gear = str(tmp_path / "p.gear.onnx")
    gr.compile(str(source), gr.GearSpec.from_config(str(config)), gear, progress=False)
    report = gr.check_padding(gear, str(source), pad_values={"attention_mask": 0},
                              inputs=lambda shapes: prefill.inputs_for_shapes(shapes))
    assert report.safe, report.table()
    assert np.isfinite(report.outputs[0].max_abs)
