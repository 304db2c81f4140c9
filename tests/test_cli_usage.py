"""The command line as atc / trtexec / ais_bench users expect it (#21): atc's spellings (a
pasted atc line compiles), synthetic inputs (``--shapes``, a gear flag alone), ``--pad``,
``--loop``, ``--backend/--providers``, ``--json`` documents, help for every flag, and plots
whose legends and labels never hide data. In process (``cli.main``), like test_cli.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from cli_support import assert_one_line_error, run_cli
from models import conv_model

import gear_runtime as gr
from gear_runtime.cli import app as cli
from gear_runtime.examples import prefill
from gear_runtime.tools.common import jsonout

SHAPES_100 = "input_ids:1x100,attention_mask:1x100,position_ids:4x1x100,image_embeds:16x64"


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("usage")
    model_path, config_path = prefill.write_example(d)
    gear = d / "prefill.gear.onnx"
    spec = gr.GearSpec.from_config(str(config_path))
    gr.compile(str(model_path), spec, str(gear), progress=False)
    conv = d / "conv.onnx"
    onnx.save(conv_model(), str(conv))
    return SimpleNamespace(dir=d, model=model_path, gear=gear, spec=spec, conv=conv)


# ---- atc's spellings --------------------------------------------------------------------------
def test_a_pasted_atc_line_compiles(capsys, example, tmp_path) -> None:
    """atc's own command line (its flags, its = form, its --framework / --soc_version /
    --log) after ``gear-runtime compile``: the gear file atc's --output names (+ .gear.onnx,
    as atc adds .om), in a folder created for it, with the gears of the spec."""
    atc = ("--model={model} --framework=5 --output={out} --input_format=NCHW "
           '--input_shape=data:-1,3,32,32 --dynamic_batch_size=1,2,4,8 '
           "--soc_version=Ascend310P3 --log=error")
    argv = atc.format(model=example.conv, out=tmp_path / "new" / "resnet").split()
    code, out, err = run_cli(capsys, "compile", *argv)
    assert code == 0, err
    written = tmp_path / "new" / "resnet.gear.onnx"
    assert f"wrote {written}" in out
    model = gr.load(str(written))
    assert model.mode == "batch" and model.gears == [(1,), (2,), (4,), (8,)]
    assert model.spec.input_format == "NCHW"


def test_an_atc_line_with_the_common_flags_compiles_and_says_what_is_not_applied(
        capsys, example, tmp_path) -> None:
    aipp = tmp_path / "aipp.cfg"
    aipp.write_text("aipp_op {}\n")
    atc = ("--model={model} --framework=5 --output={out} --input_shape=data:-1,3,32,32 "
           "--dynamic_batch_size=1,2 --soc_version=Ascend310P3 --precision_mode=force_fp32 "
           "--output_type=FP32 --insert_op_conf={aipp} --input_fp16_nodes=data --log=error")
    argv = atc.format(model=example.conv, out=tmp_path / "m", aipp=aipp).split()
    code, out, err = run_cli(capsys, "compile", *argv)
    assert code == 0, err
    assert "precision_mode force_fp32" in out
    lines = [x for x in err.splitlines() if "accepted, not applied" in x]
    assert [x.split()[2].split("=")[0] for x in lines] == [
        "--output_type", "--insert_op_conf", "--input_fp16_nodes"]
    assert gr.load(str(tmp_path / "m.gear.onnx")).spec.precision_mode == "force_fp32"
    code, _, err = run_cli(capsys, "compile", *argv, "--out_nodes=no_such_node:0")
    assert code == 2 and "--out_nodes" in err and "'no_such_node:0' is neither" in err


def _two_step_model():
    """x [B, 4] -> Relu (node 'r') -> a -> Neg (node 'n') -> y; outputs y and s = sum(x)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="r"),
         helper.make_node("Neg", ["a"], ["y"], name="n"),
         helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0)], "two_step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("out_nodes, names", [
    ("r:0;n:0", ["a", "y"]),  # atc's node form: an intermediate output too
    ("s;y", ["s", "y"]),  # ONNX output names: another order
    ("y", ["y"]),  # a subset
])
def test_compile_out_nodes_selects_the_outputs(capsys, tmp_path, out_nodes, names) -> None:
    import onnx

    src = tmp_path / "two.onnx"
    onnx.save(_two_step_model(), str(src))
    out = tmp_path / "two.gear.onnx"
    code, _, err = run_cli(capsys, "compile", f"--model={src}", "--framework=5",
                           f"--output={out}", "--input_shape=x:-1,4", "--dynamic_batch_size=1,3",
                           f"--out_nodes={out_nodes}")
    assert code == 0, err
    model = gr.load(str(out))
    assert list(model.output_names) == names
    x = np.array([[-1, 2, -3, 4]] * 3, np.float32)
    want = {"a": np.maximum(x, 0), "y": -np.maximum(x, 0), "s": x.sum()}
    got = model.create_executor().execute({"x": x})
    for name, value in zip(names, got, strict=True):
        np.testing.assert_allclose(value, want[name])


@pytest.mark.parametrize("out_nodes, fragment", [
    ("r:1", "node 'r' (Relu) has 1 output(s), 0..0"),
    ("r:0;y", "'y' is not NODE:INDEX while others are"),
    ("y;y", "names the tensor 'y' twice"),
    ("a", "'a' is neither a graph output (y, s) nor NODE:INDEX of a node"),
    (";", "names no output"),
])
def test_compile_out_nodes_refuses_in_one_line(capsys, tmp_path, out_nodes, fragment) -> None:
    import onnx

    src = tmp_path / "two.onnx"
    onnx.save(_two_step_model(), str(src))
    code, _, err = run_cli(capsys, "compile", str(src), "--input_shape=x:-1,4",
                           "--dynamic_batch_size=1,3", "-o", tmp_path / "t.gear.onnx",
                           f"--out_nodes={out_nodes}")
    assert code == 2
    assert_one_line_error(err, fragment)
    assert not (tmp_path / "t.gear.onnx").exists()


@pytest.mark.parametrize("flag", ["--dynamic_dims", "--dymDims"])
def test_run_takes_atc_and_ais_bench_spellings(capsys, example, tmp_path, flag) -> None:
    code, out, err = run_cli(capsys, "run", example.gear, flag, "64,64,64,16",
                             "--output-dir", tmp_path)
    assert code == 0, err
    assert out.startswith("gear 1: dims 64,64,64,16")


def test_compile_says_a_gear_file_is_one(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "compile", example.gear, "--input-shape", "input_ids:1,-1",
                           "--dynamic-dims", "32;64", "-o", tmp_path / "x.gear.onnx")
    assert code == 2
    assert_one_line_error(err, "already a gear file", "compile the source model")


def test_compile_creates_the_output_folder(capsys, example, tmp_path) -> None:
    out = tmp_path / "a" / "b" / "c.gear.onnx"
    code, _, err = run_cli(capsys, "compile", example.conv, "--input-shape", "data:-1,3,32,32",
                           "--dynamic-batch-size", "1,2", "-o", out)
    assert code == 0 and out.is_file(), err


# ---- synthetic inputs, --pad, --loop ----------------------------------------------------------
def test_run_on_the_inputs_of_a_gear_named_by_its_flag(capsys, example, tmp_path) -> None:
    """No .npy files: a --dynamic-* flag alone runs that gear on synthetic inputs of the
    model's dtypes; the outputs equal ONNX Runtime on the source model with those inputs."""
    code, out, err = run_cli(capsys, "run", example.gear, "--dynamic-dims", "128,128,128,16",
                             "--output-dir", tmp_path, "--json", tmp_path / "r.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == jsonout.schema_name("run", 1)
    assert doc["run"]["gear"] == 2 and doc["run"]["dynamic_dims"] == [128, 128, 128, 16]
    inputs = {i["name"]: i for i in doc["inputs"]}
    assert all(i["synthetic"] and i["fill"] == "random" for i in inputs.values())
    assert inputs["input_ids"]["dtype"] == "int64" and inputs["input_ids"]["shape"] == [1, 128]
    assert inputs["image_embeds"]["dtype"] == "float32"
    import onnxruntime as ort

    from gear_runtime.tools.common.inputs import synthetic_inputs

    dtypes = dict(zip(prefill.INPUT_NAMES, [np.int64] * 3 + [np.float32], strict=True))
    feeds = synthetic_inputs(dtypes, example.spec.shapes(2))
    want = ort.InferenceSession(str(example.model)).run(None, feeds)
    got = [np.load(o["file"]) for o in doc["outputs"]]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


def test_run_shapes_between_gears_with_pad(capsys, example, tmp_path) -> None:
    """trtexec's --shapes: a request of seq 100, padded to gear 2 (128), outputs trimmed."""
    code, out, err = run_cli(capsys, "run", example.gear, "--shapes", SHAPES_100, "--pad",
                             "--pad-value", "attention_mask=0", "--output-dir", tmp_path,
                             "--json", "-")
    assert code == 0, err
    doc = json.loads(out)  # with --json -, stdout is the document alone
    assert doc["run"]["gear"] == 2 and doc["run"]["pad"]
    assert doc["run"]["request_dims"] == [100, 100, 100, 16]
    assert {o["name"]: o["shape"] for o in doc["outputs"]} == {
        "logits": [1, 100, prefill.VOCAB], "next_token": [1, 100]}
    assert np.load(tmp_path / "logits.npy").shape == (1, 100, prefill.VOCAB)


def test_run_shapes_without_pad_must_hit_a_gear(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, "--shapes", SHAPES_100,
                           "--output-dir", tmp_path)
    assert code == 2
    assert_one_line_error(err, "[145013]")


@pytest.mark.parametrize("fill, expect", [("zeros", 0), ("ones", 1)])
def test_run_fills_constant_inputs(capsys, example, tmp_path, fill, expect) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, "--dynamic-dims", "32,32,32,16",
                           "--fill", fill, "--output-dir", tmp_path, "--json",
                           tmp_path / "r.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert all(i["fill"] == fill for i in doc["inputs"])
    # the same run on ONNX Runtime with constant inputs gives the saved logits
    import onnxruntime as ort

    feeds = {n: np.full(s, expect, dtype=np.float32 if n == "image_embeds" else np.int64)
             for n, s in example.spec.shapes(0).items()}
    want = ort.InferenceSession(str(example.model)).run(None, feeds)[0]
    np.testing.assert_allclose(np.load(doc["outputs"][0]["file"]), want, rtol=1e-5, atol=1e-5)


def test_run_loop_reports_every_timed_run(capsys, example, tmp_path) -> None:
    code, out, err = run_cli(capsys, "run", example.gear, "--dynamic-dims", "32,32,32,16",
                             "--loop", "7", "--warmup", "2", "--output-dir", tmp_path,
                             "--json", tmp_path / "r.json")
    assert code == 0, err
    assert "7 runs after 2 warm-up: p50" in out
    timing = json.loads((tmp_path / "r.json").read_text())["timing"]
    assert timing["loop"] == 7 and timing["warmup"] == 2 and len(timing["samples_ns"]) == 7
    assert all(s > 0 for s in timing["samples_ns"])
    assert timing["ms"]["min"] <= timing["ms"]["p50"] <= timing["ms"]["p99"]


def test_the_short_dims_form_is_explained(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, "--dynamic-dims", "64",
                           "--output-dir", tmp_path)
    assert code == 2
    assert_one_line_error(err, "[145012]", "4 dynamic value(s)", "9 values")


# ---- backends and providers -------------------------------------------------------------------
@pytest.mark.parametrize("flags", [["--backend", "cuda"], ["--providers", "cuda,cpu"]])
def test_cuda_is_refused_clearly_without_a_gpu(capsys, example, tmp_path, flags) -> None:
    """CUDA from the command line: onnxruntime's CUDA provider, refused in one line that
    says what to install where it is missing (this machine: no GPU, CPU onnxruntime)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    code, _, err = run_cli(capsys, "run", example.gear, "--dynamic-dims", "32,32,32,16",
                           "--output-dir", tmp_path, *flags)
    assert code == 1  # a backend failure, not a bad command line
    assert_one_line_error(err, "CUDAExecutionProvider", "onnxruntime-gpu")


def test_providers_cpu_and_threads_run(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, "--dynamic-dims", "32,32,32,16",
                           "--providers", "cpu", "--threads", "1", "--output-dir", tmp_path,
                           "--json", tmp_path / "r.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["model"]["providers"] == ["CPUExecutionProvider"]


# ---- bench ------------------------------------------------------------------------------------
def test_bench_a_padded_request_by_its_shapes(capsys, example) -> None:
    code, out, err = run_cli(capsys, "bench", example.gear, "--shapes", SHAPES_100, "--pad",
                             "--iterations", "3", "--warmup", "0", "--no-progress",
                             "--json", "-")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "gear-runtime-bench/2"
    assert [g["gear"] for g in doc["gears"]] == [2]
    assert doc["context"]["settings"]["pad"] is True
    assert doc["context"]["settings"]["request"]["input_ids"] == [1, 100]
    assert len(doc["gears"][0]["samples_ns"]["execute"]) == 3


# ---- inspect --json ---------------------------------------------------------------------------
def test_inspect_json_carries_what_the_text_says(capsys, example, tmp_path) -> None:
    code, out, err = run_cli(capsys, "inspect", example.gear, "--json", "-")
    assert code == 0, err
    doc = json.loads(out)
    model = gr.load(str(example.gear))
    assert doc["schema"] == "gear-runtime-inspect/1" and doc["mode"] == "dims"
    assert [g["dims"] for g in doc["gears"]] == [list(g) for g in model.gears]
    assert [i["name"] for i in doc["inputs"]] == list(model.input_names)
    assert doc["gears"][3]["outputs"]["logits"] == list(model.output_shape(3, 0))
    assert doc["gears"][3]["output_bytes"] == sum(model.output_size(3, k) for k in range(2))
    assert doc["integrity"]["verified"] is True
    code, text, _ = run_cli(capsys, "inspect", example.gear, "--json", tmp_path / "i.json")
    assert code == 0 and "gear file" in text and f"wrote {tmp_path / 'i.json'}" in text
    assert json.loads((tmp_path / "i.json").read_text()) == doc


def test_json_documents_are_strict() -> None:
    """NaN / infinity become null: other tools' JSON parsers refuse them."""
    doc = jsonout.document("x", 1, {"a": float("nan"), "b": [float("inf"), 1.5]})
    assert doc["schema"] == "gear-runtime-x/1"
    import io
    import sys

    buf, real = io.StringIO(), sys.stdout
    sys.stdout = buf
    try:
        jsonout.write(jsonout.STDOUT, doc)
    finally:
        sys.stdout = real
    assert json.loads(buf.getvalue(), parse_constant=lambda c: pytest.fail(c)) == {
        "schema": "gear-runtime-x/1", "a": None, "b": [None, 1.5]}


# ---- help -------------------------------------------------------------------------------------
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions
                if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_and_flag_has_help(capsys) -> None:
    """Every command has a description, every flag a help text, and COMMAND --help works."""
    for command, p in _subparsers().items():
        assert p.description, f"{command} has no description"
        bare = [a.dest for a in p._actions if not a.help]
        assert bare == [], f"{command}: no help for {bare}"
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0 and "usage: gear-runtime " + command in out


#: ais_bench's flags (its own spellings) that each command takes.
AIS_BENCH_FLAGS = {
    "run": ["--model", "--input", "--output", "--outfmt", "--loop", "--batchsize",
            "--warmup_count", "--warmup-count", "--dymBatch", "--dymHW", "--dymDims",
            "--dymShape", "--dym-shape", "--device"],
    "bench": ["--model", "--loop", "--batchsize", "--warmup_count", "--warmup-count",
              "--dymBatch", "--dymHW", "--dymDims", "--dymShape", "--dym-shape", "--device"],
}


@pytest.mark.parametrize("command", sorted(AIS_BENCH_FLAGS))
def test_every_ais_bench_flag_shows_in_help(capsys, command) -> None:
    """Each ais_bench flag the command takes is one of its options, with a help text, and
    COMMAND --help shows it (a pasted ais_bench line finds its flags there)."""
    import re

    options = {o: a for a in _subparsers()[command]._actions for o in a.option_strings}
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    for flag in AIS_BENCH_FLAGS[command]:
        assert flag in options and options[flag].help, flag
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), flag


# ---- plots ------------------------------------------------------------------------------------
def test_bench_and_compare_plots_keep_their_legends_off_the_data(capsys, example, tmp_path,
                                                                 figures) -> None:
    """Both PNGs: no legend inside a panel (one below them), PNG bytes, and the compare
    plot marks the bare and normalised ratios next to execute's."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        code, _, err = run_cli(capsys, "bench", example.gear, "--gears", "0,1", "--iterations",
                               "4", "--warmup", "0", "--no-progress", "--json", path)
        assert code == 0, err
    code, _, err = run_cli(capsys, "bench", example.gear, "--gears", "0", "--iterations", "4",
                           "--warmup", "0", "--no-progress", "--plot", tmp_path / "b.png")
    assert code == 0, err
    code, _, err = run_cli(capsys, "bench", "--compare", a, b, "--plot", tmp_path / "c.png")
    assert code in (0, 1), err
    assert len(figures) == 2
    for fig in figures:
        assert all(ax.get_legend() is None for ax in fig.axes)
        assert len(fig.legends) == 1
    for png in ("b.png", "c.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ratios = figures[1].axes[0]
    markers = {ln.get_marker() for ln in ratios.get_lines()}
    assert {"D", "s", "o"} <= markers


def test_a_narrow_log_range_gets_enough_labels() -> None:
    pytest.importorskip("matplotlib")
    from gear_runtime.tools.bench.plot import log_axis, pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0.004, 0.03])
    ax.set_ylim(0.004, 0.03)
    log_axis(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()
              and 0.004 <= t.get_position()[1] <= 0.03]
    plt.close(fig)
    assert len(labels) >= 5, labels


def test_a_plot_named_jpg_is_refused_first(capsys, example, tmp_path) -> None:
    code, out, err = run_cli(capsys, "bench", example.gear, "--plot", tmp_path / "b.jpg")
    assert code == 2 and out == ""
    assert_one_line_error(err, "written as PNG", ".png")
    assert not Path(tmp_path / "b.jpg").exists()


def test_run_takes_ais_bench_inputs_outputs_and_shapes(capsys, tmp_path) -> None:
    """ais_bench's --model, --input a.bin,b.bin (raw values, the gear found from the file's
    size), --dymShape, --output and --outfmt BIN / TXT."""
    from models import heavy_model, run_model
    model = heavy_model(width=16, layers=1)
    gear = str(tmp_path / "h.gear.onnx")
    gr.compile(model, gr.GearSpec.from_atc("x:-1,16", dynamic_batch_size="1,4"), gear,
               progress=False)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    want = run_model(model, {"x": x})[0]
    out = tmp_path / "out"
    code, text, err = run_cli(capsys, "run", "--model", gear, "--input", str(tmp_path / "x.bin"),
                              "--output", str(out), "--outfmt", "BIN")
    assert code == 0, err
    got = np.fromfile(next(out.glob("*.bin")), np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    code, _, err = run_cli(capsys, "run", gear, "--dymShape", "x:1,16", "--output", str(out),
                           "--outfmt", "TXT")
    assert code == 0, err
    assert np.loadtxt(next(out.glob("*.txt"))).shape == (16,)
    (tmp_path / "bad.bin").write_bytes(b"\0" * 12)
    code, _, err = run_cli(capsys, "run", gear, "--input", f"x={tmp_path / 'bad.bin'}")
    assert code == 2 and "12 bytes of float32 fit 0 of the gears' shapes" in err
    # --input folders (one inference per file): tests/test_cli_ais_bench.py


def test_bench_takes_ais_bench_spellings(capsys, tmp_path) -> None:
    from models import heavy_model
    gear = str(tmp_path / "h.gear.onnx")
    gr.compile(heavy_model(width=16, layers=1), gr.GearSpec.from_atc(
        "x:-1,16", dynamic_batch_size="1,4"), gear, progress=False)
    code, out, err = run_cli(capsys, "bench", "--model", gear, "--dymShape", "x:4,16",
                             "--loop", "3", "--warmup", "0", "--no-progress", "--json",
                             tmp_path / "b.json")
    assert code == 0, err
    import json
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [g["dims"] for g in doc["gears"]] == [[4]]
    assert doc["context"]["settings"]["iterations"] == 3
