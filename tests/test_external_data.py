"""Weights in a data file beside the gear file: written by compile, resolved against the gear
file's folder only, checked before anything reads them, nothing written at load.

These run the code path of a model over 2 GiB (external data end to end, a source kept in
external data streamed file to file) on small models; benchmarks/bench_scale.py --big runs it
at 2.25 GiB.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import assert_same, heavy_model, prefill_model, random_inputs, run_model

import gear_runtime as gr
from gear_runtime.compiler import compile_gears
from gear_runtime.gearfile.digest import reseal
from gear_runtime.gearfile.external_data import AUTO_EXTERNAL_BYTES, DATA_ALIGNMENT
from gear_runtime.gearfile.reader import read_gear_file
from gear_runtime.tools.check.inspect import describe

PREFILL = dict(input_shape="input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;"
                           "image_embeds:-1,64",
               dynamic_dims="8,8,8,2;16,16,16,4;20,20,20,4")
HEAVY = dict(input_shape="x:-1,512", dynamic_batch_size="1,4,8")


def _compile(model: onnx.ModelProto | str, spec: gr.GearSpec, path: Path, **kw) -> Path:
    compile_gears(model, spec, path, progress=False, **kw)
    return path


def _check_every_gear(gear_path: Path, source: onnx.ModelProto, spec: gr.GearSpec) -> None:
    ex = gr.load(str(gear_path)).create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(source, spec.shapes(g), seed=g)
        assert_same(ex.execute(feeds), run_model(source, feeds))


@pytest.fixture
def external(tmp_path: Path) -> tuple[Path, onnx.ModelProto, gr.GearSpec]:
    """A prefill gear file with its weights in a data file, in its own folder."""
    source, spec = prefill_model(), gr.GearSpec.from_atc(**PREFILL)
    folder = tmp_path / "model"
    folder.mkdir()
    return _compile(source, spec, folder / "p.gear.onnx", external_data=True), source, spec


def test_the_weights_go_to_one_aligned_data_file_beside_the_gear_file(external) -> None:
    path, source, spec = external
    data = Path(str(path) + ".data")
    assert sorted(p.name for p in path.parent.iterdir()) == ["p.gear.onnx", "p.gear.onnx.data"]
    gf = read_gear_file(path)
    assert gf.files == [str(path), str(data)]
    big = {t.name for t in source.graph.initializer if t.ByteSize() >= 1024}
    assert set(gf.external) == big and big
    for name, span in gf.external.items():
        assert span.offset % DATA_ALIGNMENT == 0
        want = onnx.numpy_helper.to_array(next(t for t in source.graph.initializer
                                               if t.name == name))
        np.testing.assert_array_equal(gf.weight_array(name), want)
    # every branch, the source graph: weights stored once, in the data file
    assert path.stat().st_size < data.stat().st_size
    text = describe(path)
    assert "files:" in text and str(data) in text and f"{len(big)} in the data file" in text


def test_loads_from_any_working_directory_and_after_the_folder_moves(
        external, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, source, spec = external
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # external data never resolves against the cwd
    _check_every_gear(path, source, spec)
    moved = tmp_path / "moved"
    path.parent.rename(moved)
    monkeypatch.chdir("/")
    _check_every_gear(moved / path.name, source, spec)


def test_nothing_is_written_at_load(external, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path, source, spec = external
    import tempfile

    private = tmp_path / "tmp"  # the temp dir this process would write to, and nobody else
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))

    def snapshot() -> dict[str, tuple[int, float]]:
        out = {}
        for root in (str(tmp_path),):
            for dirpath, _, files in os.walk(root):
                for f in files:
                    p = os.path.join(dirpath, f)
                    try:
                        st = os.stat(p)
                    except OSError:
                        continue
                    out[p] = (st.st_size, st.st_mtime)
        return out

    def written() -> int | None:  # bytes this process passed to write(), any file
        try:
            with open("/proc/self/io", encoding="ascii") as f:
                return int(next(ln for ln in f if ln.startswith("wchar:")).split()[1])
        except OSError:
            return None

    import onnxruntime  # noqa: F401  (its import, not the load, writes a usage record in ~/.cache)

    before, w0 = snapshot(), written()
    model = gr.load(str(path))
    ex = model.create_executor()
    w1 = written()
    ex.execute(random_inputs(source, spec.shapes(0)))
    model.close()
    assert snapshot() == before
    if w0 is not None and w1 is not None:
        assert w1 - w0 == 0


def test_a_source_in_external_data_is_streamed_and_stays_equal(tmp_path: Path) -> None:
    source, spec = heavy_model(), gr.GearSpec.from_atc(**HEAVY)
    src = tmp_path / "src" / "heavy.onnx"
    src.parent.mkdir()
    onnx.save(heavy_model(), str(src), save_as_external_data=True, location="weights.bin",
              size_threshold=1024)  # (onnx.save moves the weights out of the proto it gets)
    out = tmp_path / "out"
    out.mkdir()
    report = compile_gears(str(src), spec, out / "h.gear.onnx", progress=False)
    # a source with external data gives a gear file with external data (auto mode)
    assert report.data_path == str(out / "h.gear.onnx.data") and report.data_bytes > 0
    shutil.rmtree(src.parent)  # the gear file does not need the source any more
    _check_every_gear(out / "h.gear.onnx", source, spec)


def test_external_data_false_keeps_one_file_and_drops_a_stale_data_file(tmp_path: Path) -> None:
    source, spec = heavy_model(), gr.GearSpec.from_atc(**HEAVY)
    path = _compile(source, spec, tmp_path / "h.gear.onnx", external_data=True)
    assert (tmp_path / "h.gear.onnx.data").exists()
    _compile(source, spec, path, external_data=False)
    assert [p.name for p in tmp_path.iterdir()] == ["h.gear.onnx"]
    assert read_gear_file(path).external == {}
    _check_every_gear(path, source, spec)


def test_auto_mode_moves_the_weights_out_from_16_mib(tmp_path: Path) -> None:
    small = _compile(heavy_model(), gr.GearSpec.from_atc(**HEAVY), tmp_path / "s.gear.onnx")
    assert not Path(str(small) + ".data").exists()
    width = int(np.sqrt(AUTO_EXTERNAL_BYTES / 4)) + 1  # one weight just over the threshold
    big = _compile(heavy_model(width=width, layers=1),
                   gr.GearSpec.from_atc(input_shape=f"x:-1,{width}", dynamic_batch_size="1,2"),
                   tmp_path / "b.gear.onnx")
    assert Path(str(big) + ".data").stat().st_size >= AUTO_EXTERNAL_BYTES


def test_compiled_files_get_the_mode_the_umask_gives(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = _compile(heavy_model(), gr.GearSpec.from_atc(**HEAVY), tmp_path / "h.gear.onnx",
                        external_data=True)
    finally:
        os.umask(old)
    for p in (path, Path(str(path) + ".data")):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.gear.onnx", "h.gear.onnx.data"]


# ---- hostile and broken external data ------------------------------------------------------------
def _retarget(path: Path, location: str, **entries: str) -> str:
    """Rewrite every external weight of ``path`` to ``location`` (other keys as given);
    return the first weight's name."""
    model = onnx.load(str(path), load_external_data=False)
    first = None
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        first = first or t.name
        for e in t.external_data:
            if e.key == "location":
                e.value = location
            elif e.key in entries:
                e.value = entries[e.key]
    path.write_bytes(reseal(model))  # so the location checks are what refuses it
    assert first is not None
    return first


@pytest.mark.parametrize("location", ["/etc/passwd", "../outside.bin", "sub/../../outside.bin",
                                      "etc/passwd", "link.bin", "nothere.bin"])
def test_a_location_outside_the_folder_or_missing_is_refused_naming_it(
        external, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    path, _, _ = external
    (tmp_path / "outside.bin").write_bytes(b"\1" * 2**20)
    os.symlink(tmp_path / "outside.bin", path.parent / "link.bin")
    name = _retarget(path, location)
    monkeypatch.chdir("/")  # where etc/passwd would resolve against the working directory
    with pytest.raises(gr.GearFileError) as info:
        gr.load(str(path))
    assert name in str(info.value) and repr(location) in str(info.value)


def test_a_span_past_the_end_or_of_the_wrong_length_is_refused(external) -> None:
    path, _, _ = external
    data = Path(str(path) + ".data")
    name = _retarget(path, data.name, offset=str(data.stat().st_size))
    with pytest.raises(gr.GearFileError, match=f"{name}.*past the end"):
        gr.load(str(path))
    name = _retarget(path, data.name, offset="0", length="4")
    with pytest.raises(gr.GearFileError, match=f"{name}.*4 bytes, the tensor's dims"):
        gr.load(str(path))


def test_a_data_file_that_is_missing_or_not_a_file_is_a_gear_file_error(external) -> None:
    path, _, _ = external
    data = Path(str(path) + ".data")
    data.unlink()
    with pytest.raises(gr.GearFileError, match="cannot be read: No such file"):
        gr.load(str(path))
    data.mkdir()
    with pytest.raises(gr.GearFileError, match="is not a regular file"):
        gr.load(str(path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_gear_file_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.gear.onnx"
    os.mkfifo(fifo)
    with pytest.raises(gr.GearFileError, match="not a regular file"):
        gr.load(str(fifo))  # would block forever on read
    if os.path.exists("/dev/zero"):
        with pytest.raises(gr.GearFileError, match="not a regular file"):
            gr.load("/dev/zero")  # would never end


def test_a_gear_file_over_the_format_limit_is_refused_before_reading(tmp_path: Path) -> None:
    huge = tmp_path / "huge.gear.onnx"
    with open(huge, "wb") as f:
        f.truncate(2**31 + 10)  # sparse: no disk used
    with pytest.raises(gr.GearFileError, match="a gear file is at most"):
        gr.load(str(huge))


def test_a_source_weight_that_cannot_be_read_names_the_source_tensor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the source's weights in (external_data=False) fails as a source problem, not
    as 'cannot write' the gear file."""
    from gear_runtime.gearfile.external_data import ExternalSpan

    src = tmp_path / "heavy.onnx"
    onnx.save(heavy_model(), str(src), save_as_external_data=True, location="w.bin",
              size_threshold=1024)

    def fail(self: ExternalSpan) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ExternalSpan, "read", fail)
    with pytest.raises(gr.CompileError, match=r"source model: tensor 'w\d'.*Input/output"):
        compile_gears(str(src), gr.GearSpec.from_atc(**HEAVY), tmp_path / "h.gear.onnx",
                      progress=False, external_data=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heavy.onnx", "w.bin"]
