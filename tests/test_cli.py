"""The ``gear-runtime`` command line: exit codes, one-line errors, run/inspect/bench/demo.

Everything runs ``cli.main([...])`` in process, except ONE test of the installed console
script (skipped when the package is not installed in this environment).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
from gear_runtime.tools.bench.context import FILES_DIGEST


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> SimpleNamespace:
    """The example compiled through the CLI itself, and .npy inputs of gear 1 (seq 64)."""
    d = tmp_path_factory.mktemp("cli")
    model_path, config_path = prefill.write_example(d)
    gear = d / "prefill.gear.onnx"
    assert cli.main(["compile", str(model_path), "--config", str(config_path),
                     "-o", str(gear)]) == 0
    spec = gr.GearSpec.from_config(str(config_path))
    feeds = prefill.example_inputs(spec, 1, seed=1)
    args = []
    for name, value in feeds.items():
        np.save(d / f"{name}.npy", value)
        args += ["--input", f"{name}={d / (name + '.npy')}"]
    return SimpleNamespace(dir=d, model=model_path, config=config_path, gear=gear, spec=spec,
                           feeds=feeds, input_args=args)


# ---- usage errors -----------------------------------------------------------------------------
def test_bad_subcommand(capsys) -> None:
    code, out, err = run_cli(capsys, "frobnicate")
    assert code == 2 and out == ""
    assert_one_line_error(err, "invalid choice", "frobnicate")


def test_no_subcommand(capsys) -> None:
    code, _, err = run_cli(capsys)
    assert code == 2
    assert_one_line_error(err, "COMMAND")


def test_help_exits_zero(capsys) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "compile" in out and "demo" in out


@pytest.mark.parametrize("option, value, fragment", [
    ("--iterations", "0", "'0' must be in 1..100000"), ("--warmup", "-1", "'-1' must be >= 0"),
    ("--warmup", "0.5", "'0.5' is not an integer"), ("--threads", "x", "'x' is not an integer"),
])
def test_bad_option_value(capsys, example, option, value, fragment) -> None:
    code, out, err = run_cli(capsys, "bench", example.gear, option, value)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"argument {option}", fragment)


@pytest.mark.parametrize("command", ["inspect", "run", "bench"])
def test_missing_file(capsys, tmp_path, command) -> None:
    missing = tmp_path / "nope.gear.onnx"
    code, _, err = run_cli(capsys, command, missing)
    assert code == 2
    assert_one_line_error(err, "[145002]", str(missing), "does not exist")


def test_compile_missing_model(capsys, tmp_path) -> None:
    code, _, err = run_cli(capsys, "compile", tmp_path / "m.onnx", "--input-shape", "x:-1,2",
                           "--dynamic-batch-size", "1,2", "-o", tmp_path / "o.onnx")
    assert code == 2
    assert_one_line_error(err, "m.onnx", "does not exist")


def test_compile_needs_a_spec(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "compile", example.model, "-o", tmp_path / "o.onnx")
    assert code == 2
    assert_one_line_error(err, "--input-shape", "--config")
    code, _, err = run_cli(capsys, "compile", example.model, "--input-shape", "x:-1,2",
                           "-o", tmp_path / "o.onnx")
    assert code == 2
    assert_one_line_error(err, "--dynamic-batch-size")


def test_compile_spec_rejected_with_ge_code(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(
        capsys, "compile", example.model, "-o", tmp_path / "o.onnx", "--input-shape",
        "input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,64",
        "--dynamic-dims", "32,32,32,16")  # one gear: GE wants at least two
    assert code == 2
    assert_one_line_error(err, "[E10035]")
    assert not (tmp_path / "o.onnx").exists()


def test_compile_config_with_a_bad_input_format(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "compile", example.model, "--config", example.config,
                           "--input-format", "XYZ", "-o", tmp_path / "o.onnx")
    assert code == 2
    assert_one_line_error(err, "[E10001]", "input_format 'XYZ'")
    assert not (tmp_path / "o.onnx").exists()


def test_compile_config_input_format_picks_the_image_axes(capsys, tmp_path) -> None:
    """--input-format overrides the config's and moves H/W, as in the config itself."""
    model = tmp_path / "conv.onnx"
    onnx.save(conv_model(), str(model))
    config = tmp_path / "c.ini"
    config.write_text('[acl_build_options]\ninput_shape="data:1,3,-1,-1"\n'
                      'dynamic_image_size="8,8;16,16"\n')
    code, _, err = run_cli(capsys, "compile", model, "--config", config, "--input-format",
                           "NHWC", "-o", tmp_path / "o.onnx")  # NHWC: H, W are dims 1, 2
    assert code == 2
    assert_one_line_error(err, "NHWC")
    code, out, _ = run_cli(capsys, "compile", model, "--config", config, "--input-format",
                           "NCHW", "-o", tmp_path / "o.onnx")
    assert code == 0 and "image_size mode" in out
    assert gr.load(str(tmp_path / "o.onnx")).spec.input_format == "NCHW"


# ---- compile / inspect ------------------------------------------------------------------------
def test_compile_external_data_and_inspect_lists_the_files(capsys, tmp_path) -> None:
    model = tmp_path / "conv.onnx"
    onnx.save(conv_model(hidden=32), str(model))
    out_path = tmp_path / "c.gear.onnx"
    code, out, _ = run_cli(capsys, "compile", model, "--input-shape", "data:-1,3,8,8",
                           "--dynamic-batch-size", "1,2", "--external-data", "yes",
                           "-o", out_path)
    assert code == 0 and f"weights in {out_path}.data" in out
    code, out, _ = run_cli(capsys, "inspect", out_path)
    assert code == 0 and f"{out_path}.data" in out and out.count("format") == 1
    code, _, _ = run_cli(capsys, "compile", model, "--input-shape", "data:-1,3,8,8",
                         "--dynamic-batch-size", "1,2", "--external-data", "no", "-o", out_path)
    assert code == 0 and not Path(f"{out_path}.data").exists()


def test_compile_from_flags_and_inspect(capsys, example, tmp_path) -> None:
    out_path = tmp_path / "flags.gear.onnx"
    code, out, _ = run_cli(
        capsys, "compile", example.model, "-o", out_path, "--input-shape",
        "input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,64",
        "--dynamic-dims", "32,32,32,16;64,64,64,16")
    assert code == 0 and out_path.is_file()
    assert "2 gears" in out and "32,32,32,16; 64,64,64,16" in out
    code, out, _ = run_cli(capsys, "inspect", out_path)
    assert code == 0
    assert "32,32,32,16" in out and "64,64,64,16" in out


def test_inspect_prints_the_gears(capsys, example) -> None:
    code, out, err = run_cli(capsys, "inspect", example.gear)
    assert code == 0 and err == ""
    for g in example.spec.gears:
        assert ",".join(map(str, g)) in out


# ---- run --------------------------------------------------------------------------------------
def test_run_writes_outputs_with_the_gear_shapes(capsys, example, tmp_path) -> None:
    code, out, _ = run_cli(capsys, "run", example.gear, *example.input_args,
                           "--dynamic-dims", "64,64,64,16", "--output-dir", tmp_path / "out")
    assert code == 0
    assert "gear 1" in out and "64,64,64,16" in out
    logits = np.load(tmp_path / "out" / "logits.npy")
    next_token = np.load(tmp_path / "out" / "next_token.npy")
    assert logits.shape == (1, 64, prefill.VOCAB) and next_token.shape == (1, 64)
    assert next_token.dtype == np.int64
    np.testing.assert_array_equal(next_token, logits.argmax(-1))
    assert "[1, 64, 512]" in out


def test_run_derives_the_gear_from_the_inputs(capsys, example, tmp_path) -> None:
    code, out, _ = run_cli(capsys, "run", example.gear, *example.input_args,
                           "--output-dir", tmp_path)
    assert code == 0 and "gear 1" in out


def test_run_out_of_gear_dims(capsys, example, tmp_path) -> None:
    code, out, err = run_cli(capsys, "run", example.gear, *example.input_args,
                             "--dynamic-dims", "100,100,100,16", "--output-dir", tmp_path)
    assert code == 2 and out == ""
    assert_one_line_error(err, "[145013]")
    assert not list(tmp_path.glob("*.npy"))


def test_run_dims_that_are_not_integers(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, *example.input_args,
                           "--dynamic-dims", "64,x", "--output-dir", tmp_path)
    assert code == 2
    assert_one_line_error(err, "--dynamic-dims", "integers")


def test_run_batch_size_on_a_dims_model(capsys, example, tmp_path) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, *example.input_args,
                           "--dynamic-batch-size", "4", "--output-dir", tmp_path)
    assert code == 2
    assert_one_line_error(err, "set_dynamic_batch_size")


def test_run_outputs_whose_file_names_collide(capsys, tmp_path) -> None:
    """``y:0`` and ``y_0`` both sanitise to y_0.npy: each output must keep its own file."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2])
    outs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["N", 2])
            for n in ("y:0", "y_0", "Y_0")]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y:0"]),
         onnx.helper.make_node("Neg", ["x"], ["y_0"]),
         onnx.helper.make_node("Identity", ["x"], ["Y_0"])], "g", [x], outs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    src, gear = tmp_path / "three.onnx", tmp_path / "three.gear.onnx"
    onnx.save(model, str(src))
    assert cli.main(["compile", str(src), "--input-shape", "x:-1,2", "--dynamic-batch-size",
                     "1,2", "-o", str(gear)]) == 0
    x_value = np.array([[1.0, -2.0], [3.0, -4.0]], np.float32)
    np.save(tmp_path / "x.npy", x_value)
    code, out, _ = run_cli(capsys, "run", gear, "--input", f"x={tmp_path / 'x.npy'}",
                           "--output-dir", tmp_path / "out")
    assert code == 0
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["Y_0_3.npy", "y_0.npy", "y_0_2.npy"], out  # Y_0: case-insensitive FS
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y_0.npy"), np.maximum(x_value, 0))
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y_0_2.npy"), -x_value)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "Y_0_3.npy"), x_value)
    assert "y:0: float32 [2, 2] -> " in out and "y_0_2.npy" in out


@pytest.mark.parametrize("bad, fragment", [
    ("input_ids", "must be NAME=FILE.npy"),
    ("input_ids=/nonexistent/ids.npy", "--input input_ids: '/nonexistent/ids.npy' does not exist"),
    ("input_ids={dir}", "is not a file"),
    ("pixel_values={dir}/input_ids.npy", "no input 'pixel_values'"),
])
def test_run_bad_input(capsys, example, bad, fragment) -> None:
    args = [arg for name in example.feeds if name != "input_ids"
            for arg in ("--input", f"{name}={example.dir / (name + '.npy')}")]
    code, out, err = run_cli(capsys, "run", example.gear, *args, "--input",
                             bad.format(dir=example.dir))
    assert code == 2 and out == ""
    assert_one_line_error(err, "[145000]", fragment)


def test_run_missing_input(capsys, example) -> None:
    code, _, err = run_cli(capsys, "run", example.gear, *example.input_args[:2])
    assert code == 2
    assert_one_line_error(err, "missing --input", "attention_mask")


@pytest.mark.parametrize("kind", ["text", "onnx model", "empty"])
def test_run_file_that_is_not_npy(capsys, example, tmp_path, kind) -> None:
    """Any other file (a model given by mistake, above all) is named with its input and the
    expected kind, never with numpy's message about pickled data."""
    bad = {"text": tmp_path / "bad.npy", "onnx model": example.model,
           "empty": tmp_path / "empty.npy"}[kind]
    if kind == "text":
        bad.write_text("not numpy")
    elif kind == "empty":
        bad.write_bytes(b"")
    args = [*example.input_args[2:], "--input", f"input_ids={bad}"]
    code, out, err = run_cli(capsys, "run", example.gear, *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, "[145000]", f"--input input_ids={bad}", "not a .npy file",
                          "a .npy array is expected")
    assert "pickle" not in err


def test_run_npy_that_is_broken(capsys, example, tmp_path) -> None:
    bad = tmp_path / "cut.npy"
    np.save(bad, np.ones((1, 64), np.int64))
    bad.write_bytes(bad.read_bytes()[:20])  # the magic, then a cut header
    args = [*example.input_args[2:], "--input", f"input_ids={bad}"]
    code, _, err = run_cli(capsys, "run", example.gear, *args)
    assert code == 2
    assert_one_line_error(err, "input_ids", "not a readable .npy")


@pytest.mark.parametrize("flags", [["--dynamic-batch-size", "1,4"],
                                   ["--dynamic-image-size", "16,16;32,32"]])
def test_compile_hybrid_outside_dims_mode_is_refused(capsys, tmp_path, flags) -> None:
    """GE has hybrid mode only with dynamic dims: one line with GE's code, no file."""
    model = tmp_path / "conv.onnx"
    onnx.save(conv_model(), str(model))
    shape = "data:-1,3,32,32" if flags[0] == "--dynamic-batch-size" else "data:1,3,-1,-1"
    code, out, err = run_cli(capsys, "compile", model, "--input-shape", shape, *flags,
                             "--hybrid", "-o", tmp_path / "o.onnx")
    assert code == 2 and out == ""
    assert_one_line_error(err, "[E10001]", "hybrid mode needs a dims spec")
    assert not (tmp_path / "o.onnx").exists()


# ---- bench ------------------------------------------------------------------------------------
def test_bench_json_has_every_gear(capsys, example, tmp_path) -> None:
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    code, out, _ = run_cli(capsys, "bench", example.gear, "--iterations", "3", "--warmup", "1",
                           "--threads", "1", "--reference", example.model, "--json", out_json,
                           "--plot", out_png, "--no-progress")
    assert code == 0
    data = json.loads(out_json.read_text())
    assert [g["gear"] for g in data["gears"]] == [0, 1, 2, 3]
    for g in data["gears"]:
        assert g["execute_ms"]["p50"] <= g["execute_ms"]["p90"] <= g["execute_ms"]["p99"]
        assert g["dynamic_ms"] is not None and g["naive_ms"] is not None
        assert len(g["samples_ns"]["execute"]) == 3
    assert data["context"]["settings"]["copy"] is True
    assert data["context"]["model"]["path"] == str(Path(example.gear).resolve())
    assert out.splitlines()[0].startswith("gear")
    assert "overhead us = median over iterations of (execute - bare): includes the output " \
           "copy" in out
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_no_copy_says_what_it_timed(capsys, example, tmp_path) -> None:
    out_json = tmp_path / "b.json"
    code, out, _ = run_cli(capsys, "bench", example.gear, "--gears", "0", "--iterations", "2",
                           "--warmup", "0", "--no-copy", "--json", out_json)
    assert code == 0
    assert json.loads(out_json.read_text())["context"]["settings"]["copy"] is False
    assert "execute(copy=False)" in out and "(execute - bare): no output copy" in out


def test_bench_progress_never_in_a_log(example, tmp_path) -> None:
    """stdout and stderr in one log file: the table is clean, no bar's carriage returns."""
    log = tmp_path / "bench.log"
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "gear_runtime.cli", "bench",
                               str(example.gear), "--gears", "0", "--iterations", "30",
                               "--warmup", "0"], stdout=f, stderr=subprocess.STDOUT,
                              timeout=120)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "\r" not in text and "it/s" not in text
    assert text.splitlines()[0].split()[:2] == ["gear", "dims"]


@pytest.fixture(scope="module")
def results(example, tmp_path_factory) -> SimpleNamespace:
    """Two bench --json files of the same model: a real run (its execute times replaced by
    steady seeded ones), and a copy with gear 1's times made 30% slower."""
    d = tmp_path_factory.mktemp("compare")
    before = d / "before.json"
    assert cli.main(["bench", str(example.gear), "--gears", "0,1", "--iterations", "30",
                     "--warmup", "2", "--threads", "1", "--json", str(before)]) == 0
    data = json.loads(before.read_text())
    rng = np.random.default_rng(0)
    for g in data["gears"]:  # steady times: the verdicts must not hang on the machine's load
        times = rng.lognormal(np.log(2e5), 0.05, 30)
        times[rng.random(30) < 0.05] *= 20
        g["samples_ns"]["execute"] = times.astype(np.int64).tolist()
    before.write_text(json.dumps(data))
    g = data["gears"][1]
    g["samples_ns"]["execute"] = [int(v * 1.3) for v in g["samples_ns"]["execute"]]
    slow = d / "slow.json"
    slow.write_text(json.dumps(data))
    return SimpleNamespace(dir=d, before=before, slow=slow)


def test_bench_compare_table_and_fail_on_regression(capsys, results) -> None:
    code, out, _ = run_cli(capsys, "bench", "--compare", results.before, results.slow)
    assert code == 0  # a slower gear alone is reported, not an error
    rows = {line.split()[0]: line for line in out.splitlines()[2:4]}
    assert rows["1"].endswith("slower") and rows["0"].endswith("within noise")
    code, out, _ = run_cli(capsys, "bench", "--compare", results.before, results.slow,
                           "--fail-on-regression", "10")
    assert code == 1 and "gear 1 +" in out.splitlines()[-1]
    code, _, _ = run_cli(capsys, "bench", "--compare", results.before, results.slow,
                         "--fail-on-regression", "50")
    assert code == 0  # 30% is below 50%
    code, out, _ = run_cli(capsys, "bench", "--compare", results.before, results.before,
                           "--fail-on-regression", "0")
    assert code == 0 and out.count("within noise") == 2


def test_bench_compare_plot(capsys, results) -> None:
    pytest.importorskip("matplotlib")
    png = results.dir / "cmp.png"
    code, out, _ = run_cli(capsys, "bench", "--compare", results.before, results.slow,
                           "--plot", png)
    assert code == 0 and f"wrote {png}" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_compare_refuses_different_models(capsys, results, tmp_path) -> None:
    data = json.loads(results.before.read_text())
    data["context"]["model"]["digest"] = f"{FILES_DIGEST}:" + "f" * 32
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "bench", "--compare", results.before, other)
    assert code == 2 and out == ""
    assert_one_line_error(err, "measured different models")


def test_bench_compare_warns_about_different_settings(capsys, results, tmp_path) -> None:
    data = json.loads(results.before.read_text())
    data["context"]["settings"]["threads"] = 8
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "bench", "--compare", results.before, other)
    assert code == 0
    assert "gear-runtime: warning: different settings: threads 1 vs 8" in err


@pytest.mark.parametrize("argv, fragment", [
    (["bench"], "give a gear FILE to benchmark, or --compare"),
    (["bench", "{gear}", "--fail-on-regression", "5"], "--fail-on-regression needs --compare"),
    (["bench", "{gear}", "--compare", "{json}", "{json}"], "drop the gear file"),
    (["bench", "--compare", "{json}", "{json}", "--fail-on-regression", "x"], "not a number"),
    (["bench", "--compare", "{json}", "/nonexistent.json"],
     "'/nonexistent.json' cannot be read"),
])
def test_bench_compare_usage_errors(capsys, example, results, argv, fragment) -> None:
    argv = [a.format(gear=example.gear, json=results.before) for a in argv]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, fragment)


def test_bench_output_directory_checked_first(capsys, example, tmp_path) -> None:
    code, out, err = run_cli(capsys, "bench", example.gear, "--json", tmp_path / "no" / "b.json")
    assert code == 2 and out == ""  # refused before any benchmark ran
    assert_one_line_error(err, "--json", "does not exist")


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_output_that_is_a_directory_checked_first(capsys, example, tmp_path, flag) -> None:
    code, out, err = run_cli(capsys, "bench", example.gear, flag, tmp_path)
    assert code == 2 and out == ""  # refused before any benchmark ran
    assert_one_line_error(err, "[145000]", flag, str(tmp_path), "is a directory")


def test_bench_bad_gears(capsys, example) -> None:
    code, _, err = run_cli(capsys, "bench", example.gear, "--gears", "0,9")
    assert code == 2
    assert_one_line_error(err, "index 9 is out of range")


# ---- demo -------------------------------------------------------------------------------------
def test_demo_quick(capsys, tmp_path) -> None:
    code, out, _ = run_cli(capsys, "demo", "--quick", "--iterations", "5", "--workdir", tmp_path,
                           "--no-progress")
    assert code == 0, out
    assert "FAIL" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("demo: all ") and last.endswith(" checks passed")
    assert int(last.split()[2]) >= 10
    assert "[145013]" in out  # the refused out-of-gear request and its message
    assert "x dynamic" in out and "overhead us" in out  # the benchmark table
    assert (tmp_path / "prefill.gear.onnx").is_file()
    assert (tmp_path / "prefill.hybrid.onnx").is_file()
    assert f"files in {tmp_path} (kept)" in out.splitlines()[0]
    assert "overhead us = median over iterations of (execute - bare): includes the output " \
           "copy" in out


def test_demo_without_workdir_says_how_to_keep_the_files(capsys, monkeypatch) -> None:
    """The temporary folder is named, said to be removed, and --workdir offered, at the start
    and at the end (where a reader looks for the files)."""
    from gear_runtime.tools import demo

    seen: list[Path] = []
    real = demo._run

    def record(workdir, *args, **kwargs):
        seen.append(workdir)
        return real(workdir, *args, **kwargs)

    monkeypatch.setattr(demo, "_run", record)
    code, out, _ = run_cli(capsys, "demo", "--quick", "--iterations", "2", "--no-progress")
    assert code == 0, out
    lines = out.strip().splitlines()
    assert f"temporary folder {seen[0]}, removed at the end" in lines[0]
    assert "gear-runtime demo --workdir DIR" in lines[0]
    assert lines[-1] == f"removed {seen[0]}; to keep the files, run: gear-runtime demo " \
                        "--workdir DIR"
    assert not seen[0].exists()


# ---- the installed console script ---------------------------------------------------------------
def _console_script() -> str | None:
    here = Path(sys.executable).with_name("gear-runtime")
    return str(here) if here.exists() else shutil.which("gear-runtime")


@pytest.mark.skipif(_console_script() is None,
                    reason="the gear-runtime console script is not installed (pip install -e .)")
def test_installed_entry_point(example) -> None:
    script = _console_script()
    ok = subprocess.run([script, "inspect", str(example.gear)], capture_output=True, text=True,
                        timeout=60, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert ok.returncode == 0 and "32,32,32,16" in ok.stdout
    bad = subprocess.run([script, "run", str(example.gear), "--input", "nonsense"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("gear-runtime: error:") and "Traceback" not in bad.stderr


@pytest.mark.parametrize("command", ["demo", "run"])
def test_directory_that_cannot_be_created(capsys, example, tmp_path, command) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = (["demo", "--workdir", blocker] if command == "demo" else
            ["run", example.gear, *example.input_args, "--output-dir", blocker])
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    flag = "--workdir" if command == "demo" else "--output-dir"
    assert_one_line_error(err, "[145000]", f"{flag} {str(blocker)!r} cannot be created")


def test_demo_exit_code_1_when_a_check_fails(capsys, tmp_path, monkeypatch) -> None:
    from gear_runtime.tools import demo

    real = demo.compare_outputs
    calls = []

    def wrong_once(got, want, names):  # the second comparison reports a mismatch
        calls.append(1)
        ok, detail = real(got, want, names)
        return (ok and len(calls) != 2), detail

    monkeypatch.setattr(demo, "compare_outputs", wrong_once)
    code, out, _ = run_cli(capsys, "demo", "--quick", "--iterations", "2", "--workdir",
                           tmp_path, "--no-progress")
    assert code == 1
    assert "[FAIL] gear 1" in out
    assert out.strip().splitlines()[-1].startswith("demo: 1 of ")


def test_backend_failure_is_exit_1(capsys, example, monkeypatch) -> None:
    from gear_runtime.errors import BackendError

    def broken(*args, **kwargs):
        raise BackendError("onnxruntime run of gear 1 failed: out of memory", "507899")

    monkeypatch.setattr(gr, "load", broken)
    code, _, err = run_cli(capsys, "run", example.gear, *example.input_args)
    assert code == 1
    assert_one_line_error(err, "[507899]", "out of memory")
