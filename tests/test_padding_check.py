"""check_padding / ``gear-runtime check-padding``: flags an unsafe model, passes a safe one."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import gear_runtime as gr
from gear_runtime.cli import main
from gear_runtime.tools.check.padding import default_samples


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


# ---- hostile inputs, JSON, memory ---------------------------------------------------------------
def test_a_source_model_that_does_not_match_is_named(tmp_path) -> None:
    """(The CLI's one-line errors for these: tests/test_cli_hostile.py.)"""
    _, gear = compiled(tmp_path, mean=False)
    other = tmp_path / "other.onnx"
    model = seq_model(mean=False)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 8  # x [1, S, 8]
    onnx.save(model, str(other))
    with pytest.raises(gr.InputError, match=r"does not match the gear file \(inputs x \(1, 3, 4\)"):
        gr.check_padding(gear, str(other), samples=[3])
    with pytest.raises(gr.GearMismatchError, match="covered by no gear"):
        gr.check_padding(gear, str(other), samples=[10**8])  # refused before any run
    renamed = seq_model(mean=False)
    renamed.graph.input[0].name = "tokens"
    renamed.graph.node[0].input[0] = "tokens"
    onnx.save(renamed, str(other))
    with pytest.raises(gr.InputError, match="x missing .* tokens is not an input"):
        gr.check_padding(gear, str(other))


def test_cli_json(tmp_path, capsys) -> None:
    source, gear = compiled(tmp_path, mean=True)
    out = tmp_path / "padding.json"
    assert main(["check-padding", gear, source, "--samples", "3;5", "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["schema"] == "gear-runtime-check-padding/1" and data["safe"] is False
    assert data["samples"] == [[3], [5]]
    y, m = data["outputs"]
    assert y["safe"] and not m["safe"] and m["failed_samples"] == [[3], [5]]
    capsys.readouterr()
    assert main(["check-padding", gear, source, "--samples", "3", "--json", "-"]) == 1
    assert json.loads(capsys.readouterr().out)["outputs"][1]["name"] == "m"


def test_integer_outputs_must_be_equal_and_chunks_change_nothing(monkeypatch) -> None:
    from gear_runtime.tools.check import padding

    check = padding.OutputCheck("ids")
    got = np.full(10, 1_000_000, np.int64)
    want = got.copy()
    want[7] += 1  # allclose(rtol=1e-4) would call this equal
    padding._compare(check, (10,), got, want, 1e-4, 1e-5)
    assert check.failed == [(10,)] and check.max_abs == 1.0
    rng = np.random.default_rng(0)
    g = rng.standard_normal((3, 1000)).astype(np.float32)
    w = g + rng.standard_normal((3, 1000)).astype(np.float32) * 1e-3
    whole = padding.OutputCheck("f")
    padding._compare(whole, (3,), g, w, 1e-4, 1e-5)
    monkeypatch.setattr(padding, "CHUNK_ELEMENTS", 7)
    chunked = padding.OutputCheck("f")
    padding._compare(chunked, (3,), g, w, 1e-4, 1e-5)
    assert (chunked.max_abs, chunked.max_rel, chunked.failed) == (
        whole.max_abs, whole.max_rel, whole.failed)
    nan = padding.OutputCheck("nan")
    padding._compare(nan, (1,), np.array([np.nan, 1.0, np.inf]),
                     np.array([np.nan, 1.0, np.inf]), 1e-4, 1e-5)
    assert nan.safe and nan.max_abs == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_a_difference_in_an_early_chunk_is_not_forgotten_by_the_last(monkeypatch,
                                                                      dtype) -> None:
    """The verdict folds EVERY chunk: outputs that differ only in their first chunk and agree
    in the last one are UNSAFE (chunks of 4 elements: 5 chunks of 20)."""
    from gear_runtime.tools.check import padding

    monkeypatch.setattr(padding, "CHUNK_ELEMENTS", 4)
    want = np.arange(1, 21, dtype=dtype).reshape(4, 5)
    for where in (0, 9):  # the first chunk, a middle one; the last chunk agrees
        got = want.copy()
        got.flat[where] += 100
        check = padding.OutputCheck("y")
        padding._compare(check, (4,), got, want, 1e-4, 1e-5)
        assert check.failed == [(4,)] and not check.safe and check.max_abs == 100.0, where
    check = padding.OutputCheck("y")
    padding._compare(check, (4,), want.copy(), want, 1e-4, 1e-5)
    assert check.safe and check.failed == []


def first_is_mean_model() -> onnx.ModelProto:
    """x [1, S] -> y [1, S]: y[0] = mean(x) (reads the padded positions), y[1:] = x[1:] (safe):
    padding spoils only the FIRST element of the output."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Slice", ["x", "one", "big", "one"], ["rest"]),
             helper.make_node("Concat", ["m", "rest"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "first_is_mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S"])],
        [helper.make_tensor("one", TensorProto.INT64, [1], [1]),
         helper.make_tensor("big", TensorProto.INT64, [1], [1 << 30])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_check_padding_flags_a_model_that_differs_in_its_first_chunk_only(tmp_path,
                                                                          monkeypatch) -> None:
    """check_padding end to end, the outputs compared in chunks of 2 elements: only the first
    element (so the first chunk) of a padded run differs, and the model is UNSAFE."""
    from gear_runtime.tools.check import padding

    source = str(tmp_path / "first_is_mean.onnx")
    onnx.save(first_is_mean_model(), source)
    gear = str(tmp_path / "first_is_mean.gear.onnx")
    gr.compile(source, gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="8;16"), gear,
               progress=False)
    monkeypatch.setattr(padding, "CHUNK_ELEMENTS", 2)
    report = gr.check_padding(gear, source, samples=[5, 8, 11])
    (y,) = report.outputs
    assert not report.safe and y.failed == [(5,), (11,)] and "UNSAFE" in y.verdict
    assert report.outputs[0].max_abs > 1e-3


_PEAK = r"""
import json, sys
import numpy as np, onnxruntime as ort
import gear_runtime as gr
from gear_runtime.tools.check import padding  # noqa: F401  (modules imported before the baseline)
from gear_runtime.tools.bench import engine  # noqa: F401
what, gear, source = sys.argv[1:4]
def hwm():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM:")).split()[1]) * 1024
base = hwm()
if what == "check":
    report = gr.check_padding(gear, source, samples=[200, 255])
    assert report.safe, report.table()
else:  # the gear model and the source, each run once at the largest gear
    x = {"x": np.ones((1, 256, 16), np.float32)}
    with gr.load(gear) as model:
        out = model.create_executor().execute(x)
        s = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
        ref = s.run(None, x)
print(json.dumps({"peak": hwm() - base}))
"""


def test_check_padding_peak_memory_on_large_outputs(tmp_path) -> None:
    """Outputs of 64 MiB at the largest gear: check-padding's peak stays within 1.3x of
    running the gear model and the source once each (float64 copies of both outputs and
    full-size difference arrays made it ~4x)."""
    import subprocess
    import sys

    from onnx import numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal(
        (16, 65536)).astype(np.float32) * 0.1, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 65536])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source = str(tmp_path / "big.onnx")
    onnx.save(model, source)
    gear = str(tmp_path / "big.gear.onnx")
    gr.compile(source, gr.GearSpec.from_atc(input_shape="x:1,-1,16", dynamic_dims="128;256"),
               gear, progress=False)
    peaks = {}
    for what in ("once", "check"):
        out = subprocess.run([sys.executable, "-c", _PEAK, what, gear, source],
                             capture_output=True, text=True, check=True, timeout=300)
        peaks[what] = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    assert peaks["check"] <= 1.3 * peaks["once"], peaks


def test_progress_on_a_terminal_and_nothing_on_a_log(tmp_path, capsys, monkeypatch) -> None:
    from gear_runtime import progress as progress_mod

    source, gear = compiled(tmp_path, mean=False)
    assert main(["check-padding", gear, source, "--samples", "3;5"]) == 0
    assert capsys.readouterr().err == ""  # stderr is a file here: no bar in the log
    monkeypatch.setattr(progress_mod, "stderr_is_terminal", lambda: True)
    assert main(["check-padding", gear, source, "--samples", "3;5"]) == 0
    assert "check-padding" in capsys.readouterr().err  # the bar
    assert main(["check-padding", gear, source, "--samples", "3;5", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_a_difference_from_an_exact_zero_is_counted_not_divided() -> None:
    """A padded value far from an exact 0 has no relative difference (not ~1e308 from a tiny
    divisor): it is counted apart, without numpy's warnings on the user's terminal; a value
    within atol of an exact 0 agrees and is not counted."""
    import warnings

    from gear_runtime.tools.check.padding import _differences

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        absolute, relative, zeros = _differences(np.array([1e10, 0.0, 1e-6, 3.0]),
                                                 np.array([0.0, 0.0, 0.0, 2.0]), atol=1e-5)
        tiny = _differences(np.array([1.0]), np.array([5e-324]))  # past float64: inf, no warning
    assert (absolute, relative, zeros) == (1e10, 0.5, 1)
    assert tiny[1] == np.inf and tiny[2] == 0


def test_a_cache_padded_to_a_fixed_length_points_to_valid(tmp_path, capsys) -> None:
    """The seed's prefill: its present_kv is padded to max_seq, and its pad slots hold the pad
    tokens' K / V where the exact run has zeros. The report says so (no relative difference
    of ~1e308 from dividing by a tiny number) and points to --valid present_kv:4, which
    then passes."""
    from gear_runtime.examples import causal_lm
    from gear_runtime.tools import generate

    source, gear, _ = generate.build_pair(tmp_path, causal_lm.SMALL)
    report = gr.check_padding(gear, source, samples=[1, 20, 100])
    logits, cache = report.outputs
    assert logits.safe and not cache.safe and cache.failed == [(1, 1), (20, 20), (100, 100)]
    assert cache.max_rel < 1e3 and cache.zero_reference > 0 and cache.valid_hint == 4
    assert "differ where the exact output is 0" in cache.verdict
    assert "only past the request's length along axis 4" in cache.verdict
    assert "--valid present_kv:4" in report.table()
    assert report.to_json()["outputs"][1]["valid_axis_hint"] == 4
    assert main(["check-padding", str(gear), str(source), "--samples", "1;20;100",
                 "--json", "-"]) == 1
    doc = json.loads(capsys.readouterr().out)["outputs"][1]
    assert doc["max_rel_diff"] < 1e3 and doc["zero_reference_diffs"] == cache.zero_reference
    assert main(["check-padding", str(gear), str(source), "--samples", "1;20;100",
                 "--valid", "present_kv:4"]) == 0
    assert "padding is SAFE" in capsys.readouterr().out


def test_no_valid_hint_where_the_valid_part_differs_too(tmp_path) -> None:
    """A mean over the padded axis differs everywhere: no axis to point --valid at (its
    last axis, 4 long, is longer than the requests but differs within them too)."""
    source, gear = compiled(tmp_path, mean=True)
    report = gr.check_padding(gear, source, samples=[2, 3])
    m = report.outputs[1]
    assert not m.safe and m.valid_hint is None and "--valid" not in report.table()
