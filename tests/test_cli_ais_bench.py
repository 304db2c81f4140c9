"""ais_bench's command lines on ``run`` and ``bench``: ``--input`` folders (the i-th file of
each folder makes the i-th inference, outputs named ``<first input's file stem>_<output
index>``), ``--batchsize`` (the throughput's items per run), ais_bench's Performance Summary
lines and their JSON, ``--warmup_count``. In process (``cli.main``), like test_cli.py; the
hostile command lines of these flags are rows of test_cli_hostile.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_support import assert_one_line_error, run_cli
from models import passthrough_model, run_model, two_batch_model

import gear_runtime as gr
from gear_runtime.cli import run as run_cmd
from gear_runtime.errors import InputError

#: ais_bench's lines, as the scripts that read its output parse them.
NPU_LINE = re.compile(r"^NPU_compute_time \(ms\): min = ([\d.]+), max = ([\d.]+), mean = "
                      r"([\d.]+), median = ([\d.]+), percentile\(99%\) = ([\d.]+)$", re.M)
THROUGHPUT_LINE = re.compile(r"^throughput 1000\*batchsize\.mean\(([\d.]+)\)/"
                             r"NPU_compute_time\.mean\(([\d.]+)\): ([\d.]+)$", re.M)
TITLE_LINE = re.compile(r"^Performance Summary \(ais_bench\) of (.+): (\d+) execute\(\) runs, "
                        r"batchsize ([\d.]+)$", re.M)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> SimpleNamespace:
    """``add``: y = a + b, a and b float32 [N, 4], batch gears 1 and 4; ``passthrough``: three
    outputs (relu(x), x, the weight w), batch gears 2 and 5."""
    d = tmp_path_factory.mktemp("ais_bench")
    add, passthrough = d / "add.gear.onnx", d / "pt.gear.onnx"
    gr.compile(two_batch_model(), gr.GearSpec.from_atc("a:-1,4;b:-1,4", dynamic_batch_size="1,4"),
               str(add), progress=False)
    gr.compile(passthrough_model(), gr.GearSpec.from_atc("x:-1,4", dynamic_batch_size="2,5"),
               str(passthrough), progress=False)
    return SimpleNamespace(add=str(add), passthrough=str(passthrough))


def _array(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 4)).astype(np.float32)


def _add_folders(root: Path) -> tuple[Path, Path, list[tuple[str, np.ndarray, np.ndarray]]]:
    """Folder ``a`` of .npy files x1, x2, x10 (batches 1, 4, 1: by value, x2 comes before
    x10, where a plain sort puts x10 first) and folder ``b`` of raw .bin files p, q, r (their
    shapes found from their sizes): x1+p, x2+q, x10+r are the inferences, in this order."""
    a, b = root / "a", root / "b"
    a.mkdir()
    b.mkdir()
    expected = []
    for k, (stem, other, batch) in enumerate([("x1", "p", 1), ("x2", "q", 4), ("x10", "r", 1)]):
        va, vb = _array(batch, k), _array(batch, 10 + k)
        np.save(a / f"{stem}.npy", va)
        vb.tofile(b / f"{other}.bin")
        expected.append((stem, va, vb))
    return a, b, expected


# ---- --input folders --------------------------------------------------------------------------
def test_input_folders_run_one_inference_per_file_in_name_order(capsys, models,
                                                                 tmp_path) -> None:
    a, b, expected = _add_folders(tmp_path)
    out = tmp_path / "out"
    code, text, err = run_cli(capsys, "run", "--model", models.add, "--input", f"{a},{b}",
                              "--output", out, "--loop", "2", "--warmup", "1",
                              "--json", tmp_path / "r.json")
    assert code == 0, err
    # ais_bench's names: the first input's file without its suffix, then the output index
    assert sorted(os.listdir(out)) == sorted(f"{stem}_0.npy" for stem, _, _ in expected)
    for stem, va, vb in expected:  # the i-th file of each folder together
        np.testing.assert_array_equal(np.load(out / f"{stem}_0.npy"), va + vb)
    assert text.startswith("3 inferences, the i-th file of each --input folder together")
    assert "gear 0 (dims 1): 2 inference(s); gear 1 (dims 4): 1 inference(s)" in text
    assert "6 runs (3 inferences x --loop 2) after 1 warm-up" in text
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["input_folders"] == [str(a), str(b)]
    assert [r["inputs"] for r in doc["inferences"]] == [
        [str(a / f"{stem}.npy"), str(b / f"{other}.bin")]
        for stem, other in [("x1", "p"), ("x2", "q"), ("x10", "r")]]
    assert [r["gear"] for r in doc["inferences"]] == [0, 1, 0]
    assert [r["outputs"] for r in doc["inferences"]] == [
        [str(out / f"{stem}_0.npy")] for stem, _, _ in expected]
    timing = doc["timing"]
    assert timing["inferences"] == 3 and len(timing["samples_ns"]) == 6
    # the last inference is the document's run, inputs and outputs
    assert doc["run"]["gear"] == 0 and doc["inputs"][0]["file"] == str(a / "x10.npy")
    # ais_bench's default batchsize: the first dim of the first input, its mean over runs
    assert timing["ais_bench"]["batchsize"] == 2  # (1 + 4 + 1) / 3


def test_input_folders_are_read_one_inference_at_a_time(capsys, models, tmp_path,
                                                         monkeypatch) -> None:
    """Streamed: an inference's files are read after the previous one's outputs are saved
    (never every file up front); each runs --loop times, the --warmup runs (ais_bench's
    --warmup_count) before the first one's only."""
    from gear_runtime.runtime.executor import Executor

    a, b, _ = _add_folders(tmp_path)
    events: list[str] = []
    feeds, save, execute = run_cmd._feeds, run_cmd._save, Executor.execute

    def spy(event, real):
        return lambda *args, **kwargs: (events.append(event), real(*args, **kwargs))[1]

    monkeypatch.setattr(run_cmd, "_feeds", spy("read", feeds))
    monkeypatch.setattr(run_cmd, "_save", spy("save", save))
    monkeypatch.setattr(Executor, "execute", spy("run", execute))
    code, _, err = run_cli(capsys, "run", models.add, "--input", f"{a},{b}", "--output",
                           tmp_path / "out", "--loop", "2", "--warmup_count", "3")
    assert code == 0, err
    assert events == (["read", *["run"] * 5, "save"]
                      + ["read", "run", "run", "save"] * 2)


def test_input_folder_outputs_are_numbered_by_output_index(capsys, models, tmp_path) -> None:
    """Three outputs, --outfmt BIN: <stem>_0.bin, <stem>_1.bin, <stem>_2.bin per inference, in
    the model's output order."""
    folder = tmp_path / "x"
    folder.mkdir()
    arrays = {"img_a": _array(2, 1), "img_b": _array(5, 2)}
    for stem, value in arrays.items():
        with open(folder / f"{stem}.NPY", "wb") as f:  # ais_bench's suffixes in any case
            np.save(f, value)  # (np.save would add .npy to the name)
    (folder / "notes.txt").write_text("not an input")  # neither .npy nor .bin: not listed
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "run", models.passthrough, "--input", folder, "--output",
                           out, "--outfmt", "BIN")
    assert code == 0, err
    assert sorted(os.listdir(out)) == [f"{s}_{k}.bin" for s in arrays for k in range(3)]
    for stem, x in arrays.items():
        want = run_model(passthrough_model(), {"x": x})
        for k, w in enumerate(want):
            got = np.fromfile(out / f"{stem}_{k}.bin", dtype=w.dtype).reshape(w.shape)
            np.testing.assert_allclose(got, w, rtol=1e-6)


def test_bin_folders_take_their_shape_from_dymshape(capsys, models, tmp_path) -> None:
    """ais_bench's --input of .bin files with --dymShape: the shape of every file."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for k in range(2):
        _array(1, k).tofile(a / f"{k}.bin")
        _array(1, 5 + k).tofile(b / f"{k}.bin")
    code, _, err = run_cli(capsys, "run", models.add, "--input", f"{a},{b}", "--dymShape",
                           "a:1,4;b:1,4", "--output", tmp_path / "out")
    assert code == 0, err
    for k in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / "out" / f"{k}_0.npy"),
                                      _array(1, k) + _array(1, 5 + k))


def _bad_folders(root: Path, case: str) -> tuple[list[str], list[str]]:
    """The --input of a refused case and the fragments its one error line must hold."""
    a, b = root / "a", root / "b"
    a.mkdir()
    b.mkdir()
    for k in range(3):
        np.save(a / f"{k}.npy", _array(1, k))
        np.save(b / f"{k}.npy", _array(1, k))
    if case == "counts":
        (b / "2.npy").unlink()
        return [f"{a},{b}"], ["different numbers of .npy/.bin files", f"{a}: 3", f"{b}: 2"]
    if case == "mixed":
        return [f"{a},{b / '0.npy'}"], ["mixes folders", repr(str(a)), repr(str(b / "0.npy"))]
    if case == "one-folder-two-inputs":
        return [str(a)], ["gives 1 folder(s)", "2 inputs (a, b)", "one folder per input"]
    if case == "empty":
        for f in b.iterdir():
            f.unlink()
        (b / "readme.txt").write_text("no inputs here")
        return [f"{a},{b}"], [f"--input folder {str(b)!r} holds no .npy or .bin file"]
    if case == "not-a-file":
        (b / "2.npy").unlink()
        (b / "2.npy").mkdir()
        return [f"{a},{b}"], [f"--input folder {str(b)!r}: '2.npy' is not a regular file"]
    if case == "same-stem":
        _array(1, 9).tofile(a / "0.bin")
        np.save(b / "3.npy", _array(1, 3))
        return [f"{a},{b}"], ["'0.bin' and '0.npy'", "would write the same output files"]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["counts", "mixed", "one-folder-two-inputs", "empty",
                                  "not-a-file", "same-stem"])
def test_bad_input_folders_are_refused_before_anything_runs(capsys, models, tmp_path,
                                                            case) -> None:
    inputs, fragments = _bad_folders(tmp_path, case)
    out = tmp_path / "out"
    code, text, err = run_cli(capsys, "run", models.add, "--input", *inputs, "--output", out)
    assert code == 2 and text == ""
    assert_one_line_error(err, *fragments)
    assert not out.exists()  # refused before the first inference


def test_a_folder_past_the_bound_is_refused(capsys, models, tmp_path, monkeypatch) -> None:
    inputs, _ = _bad_folders(tmp_path, "mixed")
    monkeypatch.setattr(run_cmd, "MAX_INFERENCES", 2)
    a = inputs[0].split(",")[0]
    code, _, err = run_cli(capsys, "run", models.add, "--input", f"{a},{tmp_path / 'b'}")
    assert code == 2
    assert_one_line_error(err, f"--input folder {a!r} holds more than 2 .npy/.bin files")


# ---- --batchsize and ais_bench's summary ------------------------------------------------------
def _figures(samples_ns: list[int]) -> dict[str, float]:
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return {"min": ms.min(), "max": ms.max(), "mean": ms.mean(), "median": np.median(ms),
            "percentile_99": np.percentile(ms, 99)}


def _check_summary(text: str, ais: dict, samples_ns: list[int], batchsize: float) -> None:
    """The JSON's ais_bench object and the printed lines: ais_bench's figures of the samples,
    throughput 1000 * batchsize / mean."""
    want = _figures(samples_ns)
    assert ais["batchsize"] == batchsize and ais["count"] == len(samples_ns)
    assert ais["compute_time_ms"] == pytest.approx(want, rel=1e-12)
    assert ais["throughput"] == pytest.approx(batchsize * 1e3 / want["mean"], rel=1e-12)
    ms = ais["compute_time_ms"]  # the figures printed, to the 4 decimals printed
    npu, = NPU_LINE.findall(text)
    assert list(npu) == [f"{ms[k]:.4f}" for k in ("min", "max", "mean", "median",
                                                   "percentile_99")]
    (size, mean, throughput), = THROUGHPUT_LINE.findall(text)
    assert float(size) == batchsize and mean == f"{ms['mean']:.4f}"
    assert throughput == f"{ais['throughput']:.2f}"


@pytest.mark.parametrize("flags, batchsize", [([], 4), (["--batchsize", "32"], 32)])
def test_run_loop_prints_ais_bench_summary_with_the_batchsize(capsys, models, tmp_path, flags,
                                                              batchsize) -> None:
    """Default batchsize: the first dim of the first input (the --dymBatch 4 gear's); with
    --batchsize, that one; the model runs the same either way."""
    code, text, err = run_cli(capsys, "run", models.add, "--dymBatch", "4", "--loop", "5",
                              "--output-dir", tmp_path, "--json", tmp_path / "r.json", *flags)
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["outputs"][0]["shape"] == [4, 4]
    (what, runs, size), = TITLE_LINE.findall(text)
    assert what == "gear 1 (dims 4)" and runs == "5" and float(size) == batchsize
    _check_summary(text, doc["timing"]["ais_bench"], doc["timing"]["samples_ns"], batchsize)


def test_run_once_prints_the_summary_only_when_a_batchsize_is_given(capsys, models,
                                                                    tmp_path) -> None:
    argv = ["run", models.add, "--dymBatch", "1", "--output-dir", tmp_path]
    code, text, err = run_cli(capsys, *argv)
    assert code == 0 and "Performance Summary" not in text, err
    code, text, err = run_cli(capsys, *argv, "--batchsize", "3", "--json", tmp_path / "r.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    _check_summary(text, doc["timing"]["ais_bench"], doc["timing"]["samples_ns"], 3)


def test_bench_prints_ais_bench_summary_per_gear(capsys, models, tmp_path) -> None:
    code, text, err = run_cli(capsys, "bench", models.add, "--iterations", "6",
                              "--warmup_count", "0", "--no-progress", "--json",
                              tmp_path / "b.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["context"]["settings"]["warmup"] == 0  # ais_bench's --warmup_count
    assert text.splitlines()[0].split()[:2] == ["gear", "dims"]  # our table, first
    titles = TITLE_LINE.findall(text)
    assert titles == [("gear 0 (dims 1)", "6", "1"), ("gear 1 (dims 4)", "6", "4")]
    blocks = text.split("Performance Summary (ais_bench) of ")[1:]
    for gear, block in zip(doc["gears"], blocks, strict=True):
        batch = gear["dims"][0]  # default: the first dim of the first input
        _check_summary(block, gear["ais_bench"], gear["samples_ns"]["execute"], batch)
    assert "NPU_compute_time above = execute(): input staging + run + output copy" in text


def test_bench_batchsize_leaves_the_table_as_it_is(capsys, models, tmp_path) -> None:
    """--batchsize changes ais_bench's throughput only: the table's (and the JSON's own
    ``throughput``) still counts the gear's batch."""
    code, text, err = run_cli(capsys, "bench", "--model", models.add, "--dymShape",
                              "a:4,4;b:4,4", "--batchsize", "16", "--loop", "5",
                              "--warmup-count", "1", "--no-progress", "--json",
                              tmp_path / "b.json")
    assert code == 0, err
    gear, = json.loads((tmp_path / "b.json").read_text())["gears"]
    mean = gear["execute_ms"]["mean"]
    assert gear["throughput"] == {"value": pytest.approx(4e3 / mean), "unit": "items/s"}
    assert f"{4e3 / mean:,.0f} items/s" in text.splitlines()[2]
    _check_summary(text, gear["ais_bench"], gear["samples_ns"]["execute"], 16)


def test_bench_json_to_stdout_is_the_document_alone(capsys, models) -> None:
    code, out, err = run_cli(capsys, "bench", models.add, "--iterations", "2", "--warmup", "0",
                             "--no-progress", "--batchsize", "2", "--json", "-")
    assert code == 0, err
    assert [g["ais_bench"]["batchsize"] for g in json.loads(out)["gears"]] == [2, 2]


@pytest.mark.parametrize("argv, fragments", [
    (["run", "{add}", "--batchsize", "0"], ["--batchsize", "'0' must be >= 1"]),
    (["run", "{add}", "--batchsize", "1.5"], ["--batchsize", "'1.5' is not an integer"]),
    (["bench", "{add}", "--batchsize", "-2"], ["--batchsize", "'-2' must be >= 1"]),
    (["bench", "--compare", "{add}", "{add}", "--batchsize", "2"],
     ["--batchsize counts the items of a benchmark run", "drop it"]),
])
def test_a_bad_batchsize_is_one_line(capsys, models, argv, fragments) -> None:
    code, _, err = run_cli(capsys, *[a.replace("{add}", models.add) for a in argv])
    assert code == 2
    assert_one_line_error(err, *fragments)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "4"])
def test_bench_model_refuses_a_bad_batchsize(models, value) -> None:
    from gear_runtime.tools.bench.engine import bench_model

    with pytest.raises(InputError, match="batchsize must be an integer >= 1"):
        bench_model(models.add, iterations=1, warmup=0, progress=False, batchsize=value)


# ---- docs/json.md -----------------------------------------------------------------------------
def _section(title: str) -> str:
    """The text of the docs/json.md section whose heading starts with ``title``."""
    text = (Path(__file__).parent.parent / "docs" / "json.md").read_text(encoding="utf-8")
    return text.split(f"## `{title}")[1].split("\n## ")[0]


def test_json_md_names_every_field_of_the_new_documents(capsys, models, tmp_path) -> None:
    """Every key of run's document, of a bench gear and of their ais_bench objects is named
    in its docs/json.md section (a field added without its doc fails here)."""
    a, b, _ = _add_folders(tmp_path)
    code, out, err = run_cli(capsys, "run", models.add, "--input", f"{a},{b}", "--output",
                             tmp_path / "out", "--json", "-")
    assert code == 0, err
    run_doc = json.loads(out)
    code, out, err = run_cli(capsys, "bench", models.add, "--iterations", "2", "--warmup",
                             "0", "--no-progress", "--json", "-")
    assert code == 0, err
    gear = json.loads(out)["gears"][0]
    run_section, bench_section = _section("gear-runtime-run/"), _section("gear-runtime-bench/")
    for section, keys in [
            (run_section, [k for k in run_doc if k != "schema"]),
            (run_section, run_doc["timing"]), (run_section, run_doc["inferences"][0]),
            (bench_section, gear), (bench_section, gear["ais_bench"]),
            (bench_section, gear["ais_bench"]["compute_time_ms"]),
            (bench_section, run_doc["timing"]["ais_bench"])]:
        missing = [k for k in keys if not re.search(rf"[`{{, ]{re.escape(k)}[`}}:,]", section)]
        assert missing == [], missing


@pytest.mark.parametrize("flags, gear", [
    (["--dymBatch", "4"], [4]),
    (["--dynamic-batch-size", "1"], [1]),
    (["--dymDims", "a:4,4;b:4,4"], [4]),  # ais_bench's named form
    (["--dymDims", "4,4,4,4"], [4]),  # the full dims of every input
])
def test_bench_times_the_gear_an_ais_bench_gear_flag_names(capsys, models, tmp_path, flags,
                                                           gear) -> None:
    """ais_bench's benchmark line ``--dymBatch 4 --loop N``: bench times that gear alone."""
    code, _, err = run_cli(capsys, "bench", models.add, *flags, "--loop", "3", "--warmup", "0",
                           "--no-progress", "--json", tmp_path / "b.json")
    assert code == 0, err
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [g["dims"] for g in doc["gears"]] == [gear]


@pytest.mark.parametrize("flags, fragments", [
    (["--dymBatch", "3"], ["[145013]", "(3,)", "legal gears"]),
    (["--dymBatch", "4", "--gears", "0"], ["name the one gear to time", "drop --gears"]),
    (["--dymBatch", "4", "--dymShape", "a:4,4;b:4,4"], ["drop --gears and --shapes"]),
    (["--dymDims", "a:4,4;c:4,4"], ["'c', which is not an input"]),
])
def test_bench_gear_flags_refuse_in_one_line(capsys, models, flags, fragments) -> None:
    code, _, err = run_cli(capsys, "bench", models.add, *flags, "--loop", "1", "--no-progress")
    assert code == 2
    assert_one_line_error(err, *fragments)
