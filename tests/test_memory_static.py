"""A static model whose weights are inside its .onnx loads at ONNX Runtime's memory (issue 54).

``benchmarks/bench_memory.py --section static`` measures the RSS; these tests check the causes
deterministically: after a load, an executor and a run, nothing reachable from Python holds a
serialized model (ORT's session keeps the bytes it was built from) or a parsed weight (a
TensorProto keeps its whole ModelProto alive), and the traced Python memory did not grow by a
copy of the weights. The reader's side: inline weights are never parsed, they are declared
external data in the model file itself (:mod:`gear_runtime.gearfile.inline_data`).
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import gear_runtime as gr
from gear_runtime.backends.onnxruntime import OrtModel
from gear_runtime.compiler import compile_model
from gear_runtime.errors import GearFileError
from gear_runtime.examples import causal_lm
from gear_runtime.gearfile.inline_data import split_inline
from gear_runtime.gearfile.reader import read_gear_file
from gear_runtime.tools.check.inspect import inspect_document

#: ~10 MiB of float32 weights: large enough that a copy stands out of everything else
SIZES = causal_lm.Sizes(vocab=2048, hidden=256, heads=4, layers=2, max_seq=64,
                        seq_gears=(16, 32))
WEIGHT_BYTES = SIZES.parameters() * 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """decode.onnx with its weights inside (as onnx.save writes it) and the prefill's gear
    file with its weights in a data file (as compile writes one of real size)."""
    folder = tmp_path_factory.mktemp("pair")
    prefill, decode = causal_lm.write_pair(folder, SIZES)
    gear = folder / "prefill.gear.onnx"
    spec = gr.GearSpec.from_atc(SIZES.input_shape(), dynamic_dims=SIZES.dynamic_dims())
    compile_model(str(prefill), spec, str(gear), progress=False, external_data=True)
    return gear, decode


def _run_once(model: gr.GearModel) -> gr.Executor:
    ex = model.create_executor()
    shapes = model.spec.shapes(0)
    ex.execute({n: np.zeros(shapes[n], dt)
                for n, dt in zip(model.input_names, model.info.input_dtypes, strict=True)})
    return ex


def _held_copies(min_bytes: int) -> list[str]:
    """What Python objects hold of at least ``min_bytes``: bytes-like objects and ONNX
    messages (a TensorProto's raw_data, a ModelProto) reachable from any tracked object."""
    found = []
    for holder in gc.get_objects():
        for obj in gc.get_referents(holder):
            if isinstance(obj, bytes | bytearray | memoryview) and len(obj) >= min_bytes:
                found.append(f"{type(obj).__name__} of {len(obj)} held by {type(holder)}")
            elif isinstance(obj, onnx.TensorProto | onnx.ModelProto | onnx.GraphProto) \
                    and obj.ByteSize() >= min_bytes:
                found.append(f"{type(obj).__name__} of {obj.ByteSize()} held by {type(holder)}")
    return found


def _traced_growth(load) -> tuple[int, object]:
    """(bytes of traced Python memory ``load()`` left allocated, what it returned)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = load()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


# ---- the load holds no second copy -----------------------------------------------------------
def test_a_static_model_with_weights_inside_keeps_no_copy_of_them(pair) -> None:
    def load():
        model = gr.load(str(pair[1]))
        return model, _run_once(model)

    grown, kept = _traced_growth(load)
    assert grown < WEIGHT_BYTES // 4, f"{grown} bytes of traced memory left by the load"
    assert _held_copies(WEIGHT_BYTES // 8) == []
    del kept


def test_the_shared_pair_holds_the_weights_once(pair) -> None:
    """The decode's weights become the store's arrays (traced: once); its session is rebuilt
    over them and the prefill's uses them: no serialized model, no parsed weights besides."""
    def load():
        decode = gr.load(str(pair[1]))
        prefill = gr.load(str(pair[0]), share_weights_with=decode)
        return decode, prefill, _run_once(decode), _run_once(prefill)

    grown, kept = _traced_growth(load)
    assert kept[1].shared_weights[1] > WEIGHT_BYTES * 0.9
    assert grown < WEIGHT_BYTES * 1.4, f"{grown} bytes of traced memory for one store"
    assert _held_copies(WEIGHT_BYTES // 8) == []
    del kept


def test_a_session_built_from_bytes_lets_go_of_them(pair, tmp_path) -> None:
    """A gear file with its weights inside: ORT's Python session would keep the serialized
    model (weights and all) for its whole life."""
    gear = tmp_path / "p.gear.onnx"
    spec = gr.GearSpec.from_atc(SIZES.input_shape(), dynamic_dims=SIZES.dynamic_dims())
    compile_model(str(pair[1].parent / "prefill.onnx"), spec, str(gear), progress=False,
                  external_data=False)
    model = gr.load(str(gear))
    ex = _run_once(model)
    session = model.backend_model.session
    assert getattr(session, "_model_bytes", None) is None
    assert not [h for h in _held_copies(WEIGHT_BYTES // 8) if h.startswith("bytes")]
    del ex


# ---- the reader: inline weights read in place ------------------------------------------------
def test_inline_weights_are_declared_in_the_model_file_itself(pair) -> None:
    path = pair[1]
    gf = read_gear_file(path)
    real = os.path.realpath(path)
    big = {n for n, t in gf.weights.items() if len(gf.weight_array(n).tobytes()) >= 1024}
    assert big and set(gf.external) == big
    assert {s.path for s in gf.external.values()} == {real}
    assert list(gf.data_digests) == [real] and gf.data_digests[real].size == path.stat().st_size
    assert gf.files == [str(path)] and gf.data_files == []
    weights = causal_lm.make_weights(SIZES)
    for role, want in weights.items():
        np.testing.assert_array_equal(gf.weight_array("decode." + role), want)
    facts = inspect_document(path)  # no data file: the weights are in the model file
    assert facts["weights"]["in_data_file"] == 0
    assert facts["integrity"]["data_files"] == []
    assert [f["path"] for f in facts["files"]] == [str(path)]


def test_a_model_file_changed_before_onnxruntime_reads_it_is_refused(tmp_path) -> None:
    """ORT reads the weights from the file by path: the load proves it read the bytes the
    reader checked (the file's digest as read)."""
    path = tmp_path / "decode.onnx"
    onnx.save(causal_lm.build_decode(SIZES), str(path))
    gf = read_gear_file(path)
    other = causal_lm.build_decode(SIZES, causal_lm.make_weights(SIZES, seed=1))
    onnx.save(other, str(path))  # same layout, other weights
    with pytest.raises(GearFileError, match="decode.onnx"):
        OrtModel(gf, None, False, 0, None, None)


def test_a_symlinked_model_reads_its_weights_from_the_real_file(pair, tmp_path) -> None:
    link = tmp_path / "elsewhere.onnx"
    link.symlink_to(pair[1])
    gf = read_gear_file(link)
    assert gf.data_folder == os.path.dirname(os.path.realpath(pair[1])) and gf.external
    got = _outputs(gr.load(str(link)))
    np.testing.assert_array_equal(got[0], _outputs(gr.load(str(pair[1])))[0])


def test_a_symlink_with_a_data_file_beside_it_is_parsed_whole(tmp_path) -> None:
    """ORT resolves every weight against one folder: the link's, where its data file is."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    onnx.save(causal_lm.build_decode(SIZES), str(here / "d.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="d.onnx.data", size_threshold=256 * 1024)
    (here / "d.onnx").rename(there / "d.onnx")
    (here / "d.onnx").symlink_to(there / "d.onnx")
    gf = read_gear_file(here / "d.onnx")
    assert {s.path for s in gf.external.values()} == {str((here / "d.onnx.data").resolve())}
    assert gf.data_digests == {}
    assert _outputs(gr.load(str(here / "d.onnx")))[0].shape == (1, 1, SIZES.vocab)


def test_a_file_name_no_location_may_hold_is_parsed_whole(tmp_path) -> None:
    path = tmp_path / "de:code.onnx"
    onnx.save(causal_lm.build_decode(SIZES), str(path))
    gf = read_gear_file(path)
    assert gf.external == {} and gf.data_digests == {}
    assert _outputs(gr.load(str(path)))[0].shape == (1, 1, SIZES.vocab)


def test_a_weight_whose_bytes_do_not_fit_its_dims_is_the_same_error(tmp_path) -> None:
    model = causal_lm.build_decode(SIZES)
    t = next(t for t in model.graph.initializer if len(t.raw_data) >= 4096)
    t.raw_data = t.raw_data[:-4]
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(GearFileError, match=f"weight {t.name!r} cannot be read"):
        read_gear_file(path)


def _outputs(model: gr.GearModel) -> list[np.ndarray]:
    cache = np.random.default_rng(0).standard_normal(SIZES.cache_shape).astype(np.float32)
    return model.create_executor().execute({"input_ids": np.array([[5]]),
                                            "position": np.array([3]), "past_kv": cache})


# ---- the wire-format walk --------------------------------------------------------------------
def _tensor_model(*tensors: onnx.TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info(
        tensors[0].name, tensors[0].data_type, list(tensors[0].dims))], list(tensors))
    return helper.make_model(graph)


def _weight(name: str, n: int) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.arange(n, dtype=np.float32), name)


def test_the_walk_leaves_out_exactly_the_large_raw_data() -> None:
    model = causal_lm.build_decode(SIZES)
    blob = model.SerializeToString()
    split = split_inline(blob, 1024)
    assert split is not None
    small = onnx.load_from_string(split.model)
    for span in split.spans:
        t = model.graph.initializer[span.index]
        assert blob[span.offset:span.offset + span.length] == t.raw_data
        assert not small.graph.initializer[span.index].HasField("raw_data")
        t.ClearField("raw_data")
    assert {s.index for s in split.spans} == {
        i for i, t in enumerate(onnx.load_from_string(blob).graph.initializer)
        if len(t.raw_data) >= 1024}
    assert small.SerializeToString() == model.SerializeToString()


def test_the_walk_leaves_alone_what_it_does_not_fully_read() -> None:
    assert split_inline(_tensor_model(_weight("w", 16)).SerializeToString(), 1024) is None
    blob = _tensor_model(_weight("w", 1024)).SerializeToString()
    assert split_inline(blob, 1024) is not None
    # a second graph field merges into the first (protobuf): its initializers would follow
    # the first's, so the walk's positions would be wrong; not walked
    extra = _tensor_model(_weight("v", 1024)).SerializeToString()
    assert len(onnx.load_from_string(blob + extra).graph.initializer) == 2
    assert split_inline(blob + extra, 1024) is None
    assert split_inline(blob[:-3], 1024) is None  # truncated
    assert split_inline(blob + b"\x0b", 1024) is None  # a group's start tag (field 1)
    external = _weight("w", 1024)
    external.data_location = onnx.TensorProto.EXTERNAL
    assert split_inline(_tensor_model(external).SerializeToString(), 1024) is None


def test_a_tensor_giving_its_raw_data_twice_stays_inline() -> None:
    """protobuf keeps the last raw_data: the walk leaves such a tensor to the parser."""
    t = _weight("w", 1024)
    tensor = t.SerializeToString() + _field(9, np.zeros(1024, np.float32).tobytes())
    graph = _tensor_model(t).graph
    graph.ClearField("initializer")
    model = helper.make_model(onnx.GraphProto())
    model.ClearField("graph")
    blob = model.SerializeToString() + _field(7, graph.SerializeToString() + _field(5, tensor))
    assert not onnx.numpy_helper.to_array(onnx.load_from_string(blob).graph.initializer[0]).any()
    assert split_inline(blob, 1024) is None


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, encoded."""
    out, n = bytearray([number << 3 | 2]), len(payload)
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out) + bytes([n]) + payload
