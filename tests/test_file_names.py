"""Any file name a user may give a gear file works end to end (compile, onnx.checker, load,
run), with its weights inside it or in its data file; a path that cannot name a file is refused
by compile up front, with the reason. Never an "internal error" for a user's choice of name.

The data file's name is the gear file's + ``.data`` with ``%``, ``:``, ``\\`` and ``..``
escaped (gearfile.external_data.data_file_name): its location must read as a plain file name
in the gear file's folder for this reader, ONNX Runtime and onnx.checker alike.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import heavy_model, run_model

import gear_runtime as gr
from gear_runtime.gearfile.external_data import data_file_name

SPEC = dict(input_shape="x:-1,64", dynamic_batch_size="1,2")
SOURCE = heavy_model(width=64, layers=2)

#: name -> its data file's name
NAMES = {
    "model:v1.gear.onnx": "model%3Av1.gear.onnx.data",
    "C:drive.gear.onnx": "C%3Adrive.gear.onnx.data",
    "a..b.gear.onnx": "a.%2Eb.gear.onnx.data",
    ".hidden": ".hidden.data",
    "back\\slash.gear.onnx": "back%5Cslash.gear.onnx.data",
    "100%.gear.onnx": "100%25.gear.onnx.data",
    "...": ".%2E.%2Edata",
    "tail.": "tail.%2Edata",
    "sp ace.gear.onnx": "sp ace.gear.onnx.data",
    "ü-ñ.gear.onnx": "ü-ñ.gear.onnx.data",
    "new\nline.onnx": "new\nline.onnx.data",
    "-dash": "-dash.data",
    "x" * 200: "x" * 200 + ".data",
}


def test_the_table_is_the_escaping_rule() -> None:
    assert {n: data_file_name(n) for n in NAMES} == NAMES
    assert all(".." not in d and ":" not in d and "\\" not in d for d in NAMES.values())


@pytest.mark.parametrize("external", [True, False], ids=["data file", "one file"])
@pytest.mark.parametrize("name", list(NAMES), ids=[repr(n)[:24] for n in NAMES])
def test_every_name_compiles_checks_loads_and_runs(tmp_path: Path, name: str,
                                                   external: bool) -> None:
    path = tmp_path / name
    gr.compile(SOURCE, gr.GearSpec.from_atc(**SPEC), str(path), progress=False,
               external_data=external)
    expected = {name, NAMES[name]} if external else {name}
    assert set(os.listdir(tmp_path)) == expected  # and no temporary file left
    view = tmp_path / "plain-name.onnx"  # onnx.checker takes "\\" in a model's name for a
    os.link(path, view)                   # folder: check the locations under a plain name
    onnx.checker.check_model(str(view))  # they hold for ONNX's own checker too
    view.unlink()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)}
    with gr.load(str(path)) as model:
        got = model.create_executor().execute(feeds)
    np.testing.assert_allclose(got[0], run_model(SOURCE, feeds)[0], rtol=1e-5, atol=1e-6)


def test_names_that_escape_alike_get_data_files_of_their_own(tmp_path: Path) -> None:
    feeds = {"x": np.ones((1, 64), np.float32)}
    outputs = []
    for name, seed in (("a:b.gear.onnx", 1), ("a%3Ab.gear.onnx", 2)):
        gr.compile(heavy_model(width=64, layers=2, seed=seed), gr.GearSpec.from_atc(**SPEC),
                   str(tmp_path / name), progress=False, external_data=True)
    for name in ("a:b.gear.onnx", "a%3Ab.gear.onnx"):
        with gr.load(str(tmp_path / name)) as model:
            outputs.append(model.create_executor().execute(feeds)[0])
    assert len(os.listdir(tmp_path)) == 4
    assert not np.array_equal(outputs[0], outputs[1])  # each read its own weights


@pytest.mark.parametrize(("output", "words"), [
    ("", "names a directory, not a file"),
    (".", "names a directory, not a file"),
    ("..", "names a directory, not a file"),
    ("sub/", "names a directory, not a file"),
    ("a\0b.gear.onnx", "holds a NUL character"),
    ("missing/m.gear.onnx", "does not exist"),
    (12, "must be a file path, got int"),
])
def test_a_path_that_cannot_name_a_file_is_refused_up_front(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: object, words: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(gr.CompileError, match=words) as info:
        gr.compile(SOURCE, gr.GearSpec.from_atc(**SPEC), output, progress=False,
                   external_data=True)
    assert "internal error" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["sub"] and os.listdir(tmp_path / "sub") == []


def test_an_existing_folder_as_the_output_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.gear.onnx").mkdir()
    with pytest.raises(gr.CompileError, match="names a directory"):
        gr.compile(SOURCE, gr.GearSpec.from_atc(**SPEC), str(tmp_path / "m.gear.onnx"),
                   progress=False)
