"""Hostile and corrupt gear files: every outcome is a GearRuntimeError or the original's
outputs, never another exception, never a silent different answer, and the integrity digests
name the part that changed. (Locations, FIFOs, devices and oversized files: in
test_external_data.py; the runtime side: test_hostile_runtime.py.)

The mutation and classification code is benchmarks/fuzz_gearfile.py's, which runs the long
fuzz (thousands of mutations in subprocess batches); here a seeded subset runs in seconds.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import gear_runtime as gr
from gear_runtime.gearfile.digest import reseal
from gear_runtime.gearfile.format import (
    ATTR_DYNAMIC_GRAPH,
    ATTR_DYNAMIC_OUTPUT_DIMS,
    META_DIGEST,
    META_SPEC,
    parse_output_dims,
)
from gear_runtime.gearfile.reader import read_gear_file
from gear_runtime.tools.check.inspect import describe

_SPEC = importlib.util.spec_from_file_location(
    "fuzz_gearfile", Path(__file__).parents[1] / "benchmarks" / "fuzz_gearfile.py")
assert _SPEC is not None and _SPEC.loader is not None
fuzz = importlib.util.module_from_spec(_SPEC)
sys.modules["fuzz_gearfile"] = fuzz
_SPEC.loader.exec_module(fuzz)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, list[np.ndarray]]:
    """The fuzz model's gear file, data file and reference outputs."""
    folder = tmp_path_factory.mktemp("orig")
    gear, data = fuzz.build(folder)
    model = gr.load(str(folder / fuzz.GEAR))
    want = model.create_executor().execute(fuzz.feeds())
    model.close()
    return gear, data, want


@pytest.fixture
def folder(tmp_path: Path, built) -> Path:
    """A fresh copy of both files."""
    (tmp_path / fuzz.GEAR).write_bytes(built[0])
    (tmp_path / fuzz.DATA).write_bytes(built[1])
    return tmp_path


def _model(folder: Path) -> onnx.ModelProto:
    return onnx.load(str(folder / fuzz.GEAR), load_external_data=False)


def _case(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Case")


def _dynamic(model: onnx.ModelProto) -> onnx.GraphProto:
    return next(a for a in _case(model).attribute if a.name == ATTR_DYNAMIC_GRAPH).g


# ---- integrity -------------------------------------------------------------------------------
def test_a_file_without_a_digest_is_refused_saying_to_recompile(folder: Path) -> None:
    model = _model(folder)
    kept = [p for p in model.metadata_props if p.key != META_DIGEST]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    (folder / fuzz.GEAR).write_bytes(model.SerializeToString())
    with pytest.raises(gr.GearFileError, match="no integrity digest.*recompile"):
        read_gear_file(folder / fuzz.GEAR)


def test_a_changed_graph_is_refused_naming_the_graph(folder: Path) -> None:
    model = _model(folder)
    _dynamic(model).node[0].name = "edited"
    (folder / fuzz.GEAR).write_bytes(model.SerializeToString())
    for load in (read_gear_file, lambda p: gr.load(str(p), backend="null"), describe):
        with pytest.raises(gr.GearFileError, match="corrupt: its graph changed"):
            load(folder / fuzz.GEAR)


def test_changed_metadata_is_refused_naming_the_metadata(folder: Path) -> None:
    model = _model(folder)
    model.metadata_props.add(key="note", value="edited")
    (folder / fuzz.GEAR).write_bytes(model.SerializeToString())
    with pytest.raises(gr.GearFileError, match="corrupt: its metadata"):
        read_gear_file(folder / fuzz.GEAR)


def test_a_deliberate_edit_resealed_loads(folder: Path, built) -> None:
    model = _model(folder)
    model.metadata_props.add(key="note", value="edited")
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    ex = gr.load(str(folder / fuzz.GEAR)).create_executor()
    assert all(np.array_equal(g, w) for g, w in zip(ex.execute(fuzz.feeds()), built[2],
                                                     strict=True))


def test_a_changed_data_file_is_refused_naming_it_at_load_and_inspect(folder: Path) -> None:
    data = bytearray((folder / fuzz.DATA).read_bytes())
    data[len(data) // 2] ^= 0x10  # inside a weight: would change the outputs silently
    (folder / fuzz.DATA).write_bytes(bytes(data))
    path = str((folder / fuzz.DATA).resolve())
    with pytest.raises(gr.GearFileError, match=f"data file '{path}' is corrupt: its content"):
        gr.load(str(folder / fuzz.GEAR))
    with pytest.raises(gr.GearFileError, match="data file .* is corrupt"):
        describe(folder / fuzz.GEAR)
    gr.load(str(folder / fuzz.GEAR), backend="null").close()  # reads no weight: no hash


@pytest.mark.parametrize(("change", "words"), [
    (lambda b: b[:-1], "past the end of the file"),  # a weight's span is checked first
    (lambda b: b + b"\0", "data file .* bytes, compile wrote")])
def test_a_data_file_of_another_size_is_refused_at_read(folder: Path, change, words) -> None:
    (folder / fuzz.DATA).write_bytes(change((folder / fuzz.DATA).read_bytes()))
    with pytest.raises(gr.GearFileError, match=words):
        gr.load(str(folder / fuzz.GEAR), backend="null")


def test_a_corrupt_data_file_is_reported_even_when_ort_fails_first(folder: Path) -> None:
    model = _model(folder)
    _dynamic(model).node[0].op_type = "NoSuchOp"
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    data = bytearray((folder / fuzz.DATA).read_bytes())
    data[100] ^= 1
    (folder / fuzz.DATA).write_bytes(bytes(data))
    with pytest.raises(gr.GearFileError, match="data file .* corrupt"):
        gr.load(str(folder / fuzz.GEAR))


# ---- every byte validated --------------------------------------------------------------------
def _resealed_with_byte(folder: Path, built, needle: bytes) -> None:
    """The gear file with the first byte of ``needle`` made 0xff (invalid UTF-8), resealed."""
    blob = bytearray(built[0])
    at = blob.find(needle)
    assert at >= 0
    blob[at] = 0xFF
    (folder / fuzz.GEAR).write_bytes(fuzz.reseal_bytes(bytes(blob), built[0]))


@pytest.mark.parametrize(("needle", "field"), [(b"mm1", "NodeProto.name"),
                                               (b"gear_runtime.kind", "metadata key")])
def test_text_that_is_not_utf8_is_a_gear_file_error(folder: Path, built, needle: bytes,
                                                    field: str) -> None:
    _resealed_with_byte(folder, built, needle)
    with pytest.raises(gr.GearFileError, match=f"{field}.*not valid UTF-8"):
        read_gear_file(folder / fuzz.GEAR).branches  # noqa: B018 - branches: on first use


def test_output_dims_that_overflow_int64_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit in int64"):
        parse_output_dims([f"0,0,{2**32},{2**32}"], 1, 1)
    with pytest.raises(ValueError):
        parse_output_dims(["0,0," + "9" * 5000], 1, 1)  # beyond int()'s digit limit


@pytest.mark.parametrize("dims", [f"{2**40},{2**40}", "9" * 30])
def test_a_crafted_output_size_is_a_gear_file_error(folder: Path, dims: str) -> None:
    model = _model(folder)
    for a in _case(model).attribute:
        if a.name == ATTR_DYNAMIC_OUTPUT_DIMS:
            a.strings[0] = f"0,0,{dims}".encode()
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    with pytest.raises(gr.GearFileError, match="dynamic_output_dims"):
        read_gear_file(folder / fuzz.GEAR)


@pytest.mark.parametrize("gears", [[[2**31]], [[-1]], [["1"]], [[1.5]], "x"])
def test_crafted_spec_values_are_a_gear_file_error(folder: Path, gears: object) -> None:
    model = _model(folder)
    for p in model.metadata_props:
        if p.key == META_SPEC:
            p.value = p.value.replace('"gears":[[1],[2],[4]]', f'"gears":{gears!r}'
                                      .replace("'", '"'))
            assert str(gears).replace("'", '"')[:3] in p.value
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    with pytest.raises(gr.GearFileError, match="not a valid spec"):
        read_gear_file(folder / fuzz.GEAR)


@pytest.mark.parametrize(("key", "value"), [("offset", str(2**70)), ("length", str(2**70)),
                                            ("offset", "-4096"), ("length", "1e3")])
def test_crafted_external_spans_are_a_gear_file_error(folder: Path, key: str,
                                                      value: str) -> None:
    model = _model(folder)
    t = next(t for t in model.graph.initializer if t.external_data)
    next(e for e in t.external_data if e.key == key).value = value
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    with pytest.raises(gr.GearFileError, match=t.name):
        read_gear_file(folder / fuzz.GEAR)


# ---- flips and fuzz --------------------------------------------------------------------------
def test_3000_single_byte_flips_resealed_raise_only_gear_file_errors(built, tmp_path) -> None:
    """Resealed, so each flip reaches the reader's own checks (the digest would refuse every
    one of them first); the reader (branches included) and the null backend must never raise
    anything else."""
    rng = random.Random(3000)
    outcomes = {"refused": 0, "read": 0}
    path = tmp_path / fuzz.GEAR
    (tmp_path / fuzz.DATA).write_bytes(built[1])
    for _ in range(3000):
        blob = bytearray(built[0])
        blob[rng.randrange(len(blob))] ^= rng.randrange(1, 256)
        path.write_bytes(fuzz.reseal_bytes(bytes(blob), built[0]))
        try:
            gr.load(str(path), backend="null").close()
            read_gear_file(path).branches  # noqa: B018 - branches are checked on first use
            outcomes["read"] += 1
        except gr.GearFileError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 2000, outcomes


def test_200_random_flips_never_give_silent_different_outputs(built, tmp_path) -> None:
    rng = random.Random(200)
    results = [fuzz.run_one(tmp_path, built[:2], built[2], 200, i,
                            ("raw", rng.choice(fuzz.TARGETS), "flip")) for i in range(200)]
    outcomes = [r["outcome"] for r in results]
    assert set(outcomes) <= {"refused", "same"}, [r for r in results
                                                  if r["outcome"] not in ("refused", "same")][:3]
    assert outcomes.count("refused") > 150


def test_fuzz_subset_flips_truncations_insertions_over_both_files(built, tmp_path) -> None:
    """Both modes, every kind, both files: GearRuntimeError or the original's outputs (raw);
    never another exception (both)."""
    jobs = fuzz.plan(7, 1000)
    results = [fuzz.run_one(tmp_path, built[:2], built[2], 7, i, job)
               for i, job in enumerate(jobs)]
    summary = fuzz.summary(results)
    assert summary["bad"] == 0, summary["bad_examples"]
    seen = {(r["mode"], r["target"], r["kind"]) for r in results}
    assert len(seen) == 3 * 2 + 3  # raw: 2 files x 3 kinds; resealed: the gear file x 3


# ---- ONNX Runtime's own logging --------------------------------------------------------------
def test_a_failing_ort_run_prints_nothing_and_raises_backend_error_once(
        folder: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = _model(folder)
    graph = _dynamic(model)
    last = graph.node[-1]
    out, last.output[0] = last.output[0], "pre"
    graph.initializer.append(numpy_helper.from_array(np.array([600], np.int64), "bad_index"))
    graph.node.extend([  # an index out of range: fails inside the kernel, at run time
        helper.make_node("Gather", ["pre", "bad_index"], ["picked"], axis=1, name="bad_gather"),
        helper.make_node("Add", ["pre", "picked"], [out], name="bad_add")])
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    ex = gr.load(str(folder / fuzz.GEAR)).create_executor()
    capfd.readouterr()
    with pytest.raises(gr.BackendError, match="bad_gather") as info:
        ex.execute(fuzz.feeds())
    assert str(info.value).count("out of data bounds") == 1
    assert capfd.readouterr() == ("", "")


def test_a_broken_source_graph_prints_nothing_at_load(
        folder: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = _model(folder)
    _dynamic(model).node[0].op_type = "NoSuchOp"
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    capfd.readouterr()
    with pytest.raises(gr.BackendError, match="NoSuchOp"):
        gr.load(str(folder / fuzz.GEAR))
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("text", ["[" * 100000, '[{"0": "x"}]', '{"a": 1}', "[[1, 2]]", "7"])
def test_crafted_output_axes_are_a_gear_file_error(folder: Path, text: str) -> None:
    from gear_runtime.gearfile.format import META_OUTPUT_AXES

    model = _model(folder)
    entry = next(p for p in model.metadata_props if p.key == META_OUTPUT_AXES)
    entry.value = text
    (folder / fuzz.GEAR).write_bytes(reseal(model))
    with pytest.raises(gr.GearFileError, match="output_dynamic_axes"):
        read_gear_file(folder / fuzz.GEAR)
