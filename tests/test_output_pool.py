"""Recycled output memory (backends/output_pool.py): execute() arrays are the caller's to keep;
the memory of dropped ones is reused, never that of a live one (or of a live view of one)."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gear_runtime as gr
from gear_runtime.backends import output_pool
from gear_runtime.backends.onnxruntime import FRESH_OUTPUT_MIN_BYTES
from gear_runtime.backends.output_pool import OutputPool

WIDTH = 4096  # float32: 16 KiB of output per position; gears 4 / 8 / 16 -> 64 / 128 / 256 KiB


def wide_model() -> onnx.ModelProto:
    """y = x @ w ([1, S, 16] -> [1, S, WIDTH], pooled) and s = sum(y, -1) ([1, S], copied)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, WIDTH)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0)], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", WIDTH]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, "seq"])], [w, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "wide.gear.onnx"
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1,16", dynamic_dims="4;8;16")
    gr.compile(wide_model(), spec, str(path))
    with gr.load(str(path)) as model:
        yield model.create_executor()


def feed(seq: int, seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, seq, 16)).astype(np.float32)}


def reference(seq: int, seed: int) -> np.ndarray:
    w = numpy_helper.to_array(wide_model().graph.initializer[0])
    return feed(seq, seed)["x"] @ w


def test_the_large_output_is_pooled_and_the_small_one_copied(executor) -> None:
    assert 4 * WIDTH * 4 >= FRESH_OUTPUT_MIN_BYTES  # every gear's y is pooled
    pool = executor._session._pool
    before = pool.allocated + pool.reused
    y, s = executor.execute(feed(8, 0))
    assert pool.allocated + pool.reused == before + 1
    np.testing.assert_allclose(y, reference(8, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, y.sum(-1), rtol=1e-4, atol=1e-3)


def test_a_kept_array_is_never_overwritten(executor) -> None:
    kept = [executor.execute(feed(8, seed))[0] for seed in range(4)]
    snapshots = [y.copy() for y in kept]
    for _ in range(3):  # later calls, of this gear and others
        for seq in (8, 4, 16, 8):
            executor.execute(feed(seq, 99))
    for seed, (y, snap) in enumerate(zip(kept, snapshots, strict=True)):
        np.testing.assert_array_equal(y, snap)
        np.testing.assert_allclose(y, reference(8, seed), rtol=1e-5, atol=1e-5)
    assert not any(np.shares_memory(a, b) for i, a in enumerate(kept) for b in kept[i + 1:])


def test_the_memory_of_a_dropped_array_is_reused(executor) -> None:
    y = executor.execute(feed(16, 1))[0]
    address = y.ctypes.data
    del y
    gc.collect()
    y2 = executor.execute(feed(16, 2))[0]
    assert y2.ctypes.data == address  # recycled: no fresh pages to fault in
    np.testing.assert_allclose(y2, reference(16, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep", ["slice", "reshape", "frombuffer", "trimmed"])
def test_a_live_view_keeps_its_memory_out_of_the_pool(executor, keep) -> None:
    pad = keep == "trimmed"  # seq 5 runs on gear 8; the caller gets a trimmed view
    seq = 5 if pad else 16
    y = executor.execute(feed(seq, 3), pad=pad)[0]
    want = reference(seq, 3)
    view = {"slice": lambda a: a[0, 1:3], "reshape": lambda a: a.reshape(-1),
            "frombuffer": lambda a: np.frombuffer(memoryview(a), np.float32),
            "trimmed": lambda a: a}[keep](y)
    expected = view.copy()
    del y
    gc.collect()
    for seed in range(4, 8):  # these may reuse memory, but never the view's
        out = executor.execute(feed(seq, seed), pad=pad)[0]
        assert not np.shares_memory(out, view)
        del out
    np.testing.assert_array_equal(view, expected)
    if pad:
        np.testing.assert_allclose(view, want, rtol=1e-5, atol=1e-5)


def test_copy_false_keeps_its_own_buffers(executor) -> None:
    kept = executor.execute(feed(8, 5))[0]
    snap = kept.copy()
    view = executor.execute(feed(8, 6), copy=False)[0]
    assert not np.shares_memory(kept, view)
    np.testing.assert_array_equal(kept, snap)
    np.testing.assert_allclose(view, reference(8, 6), rtol=1e-5, atol=1e-5)


def test_the_pool_keeps_its_budget_and_forgets_the_oldest() -> None:
    block = 1000 + output_pool.ALIGNMENT  # a block holds its alignment slack too
    pool = OutputPool(budget=3 * block)
    a, _ = pool.array((1000,), np.uint8)
    b, _ = pool.array((1000,), np.uint8)
    c, _ = pool.array((1000,), np.uint8)
    assert pool.held_bytes == 3 * block
    d, _ = pool.array((1000,), np.uint8)  # over budget: the oldest (a) is forgotten
    assert pool.held_bytes == 3 * block and pool.allocated == 4
    del a, b
    e, _ = pool.array((1000,), np.uint8)  # b's block came back (a's is no longer tracked)
    assert pool.reused == 1 and not any(np.shares_memory(e, x) for x in (c, d))
    big, _ = pool.array((5000,), np.uint8)  # larger than the budget: never tracked
    assert pool.held_bytes == 3 * block


def test_a_block_is_free_only_without_outside_references() -> None:
    pool = OutputPool(budget=10**6)
    arr, addr = pool.array((10, 10), np.float32)
    assert arr.ctypes.data == addr and addr % output_pool.ALIGNMENT == 0
    holder = [arr[2:4]]
    del arr
    second, _ = pool.array((10, 10), np.float32)
    assert not np.shares_memory(second, holder[0])
    holder.clear()
    del second
    third, addr3 = pool.array((10, 10), np.float32)
    assert pool.reused == 1 and addr3 == addr == third.ctypes.data


def test_no_pooling_where_reference_counts_are_not_exact(monkeypatch) -> None:
    monkeypatch.setattr(output_pool, "POOLING", False)
    pool = OutputPool(budget=10**6)
    a, _ = pool.array((100,), np.uint8)
    del a
    pool.array((100,), np.uint8)
    assert pool.reused == 0 and pool.held_bytes == 0


# ---- 64-byte alignment, proved against memory that starts 1 byte past a boundary -------------
class OddNumpy:
    """numpy, except that 1-D uint8 ``zeros`` / ``empty`` (the raw blocks aligned_buffer and
    the pool carve their arrays from) start 1 byte past a 64-byte boundary: an address an
    allocator may give, made certain, so that alignment is proved, not left to malloc."""

    def __init__(self) -> None:
        self.raw: list[np.ndarray] = []

    def __getattr__(self, name: str):
        return getattr(np, name)

    def _odd(self, make, shape, dtype, **kw) -> np.ndarray:
        if isinstance(shape, int | np.integer) and np.dtype(dtype) == np.uint8 and not kw:
            block = make(int(shape) + 128, np.uint8)
            start = (1 - block.ctypes.data) % 64
            raw = block[start:start + int(shape)]
            assert raw.ctypes.data % 64 == 1
            self.raw.append(raw)
            return raw
        return make(shape, dtype, **kw)

    def zeros(self, shape, dtype=float, **kw) -> np.ndarray:
        return self._odd(np.zeros, shape, dtype, **kw)

    def empty(self, shape, dtype=float, **kw) -> np.ndarray:
        return self._odd(np.empty, shape, dtype, **kw)


@pytest.fixture
def odd_memory(monkeypatch) -> OddNumpy:
    """Every raw block of backends/host_memory.py (aligned_buffer) and of the output pool
    starts at an odd address while the test runs."""
    from gear_runtime.backends import host_memory

    odd = OddNumpy()
    monkeypatch.setattr(host_memory, "np", odd)
    monkeypatch.setattr(output_pool, "np", odd)
    return odd


def test_aligned_buffer_and_the_pool_align_odd_memory_to_64(odd_memory) -> None:
    from gear_runtime.backends.base import aligned_buffer

    for nbytes in (0, 1, 3, 63, 64, 65, 1001):
        buf = aligned_buffer(nbytes)
        assert buf.ctypes.data % 64 == 0 and buf.nbytes == nbytes, nbytes
        assert not buf.any()
    pool = OutputPool(budget=10**6)
    for shape, dtype in [((3,), np.uint8), ((5, 7), np.float32), ((1, 9), np.float16)]:
        arr, addr = pool.array(shape, dtype)
        assert addr % 64 == 0 and arr.ctypes.data == addr and arr.shape == shape, shape
    assert len(odd_memory.raw) == 7 + 3  # every block above came from odd memory
    # output_buffers (the OpenVINO session's): one buffer per output, viewed per gear
    from gear_runtime.backends.base import output_buffers
    from gear_runtime.backends.null import open_model

    spec = gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="3;7")
    info = open_model(None, spec=spec, outputs={"a": [(1, 3), (1, 7)], "b": [(3, 3), (7, 7)],
                                                "c": [(5,), (5,)]}).info
    buffers, views, _ = output_buffers(info, FRESH_OUTPUT_MIN_BYTES)
    assert len(odd_memory.raw) == 10 + 3
    for arr in [*buffers, *(v for gear in views for v in gear)]:
        assert arr.ctypes.data % 64 == 0, arr.shape


def odd_outputs_model() -> onnx.ModelProto:
    """x [1, S, 3] float32 -> outputs of odd byte sizes at the odd gears S = 5, 7, 13: uint8,
    bool and float16 [1, S, 3] (3S / 3S / 6S bytes), float32 [1, S] (4S) and a float32
    [1, S, 4099] that execute() writes into the pool (>= 64 KiB)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 4099)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    n = helper.make_node
    graph = helper.make_graph(
        [n("Cast", ["x"], ["u8"], to=TensorProto.UINT8),
         n("Greater", ["x", "zero"], ["pos"]),
         n("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
         n("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
         n("MatMul", ["x", "w"], ["wide"])], "odd_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 3])],
        [helper.make_tensor_value_info("u8", TensorProto.UINT8, [1, "S", 3]),
         helper.make_tensor_value_info("pos", TensorProto.BOOL, [1, "S", 3]),
         helper.make_tensor_value_info("half", TensorProto.FLOAT16, [1, "S", 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, "S"]),
         helper.make_tensor_value_info("wide", TensorProto.FLOAT, [1, "S", 4099])],
        [w, zero, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_executor_outputs_are_64_byte_aligned_in_every_gear(tmp_path, odd_memory) -> None:
    """On ONNX Runtime's CPU: the staging buffer, every output buffer (views per gear, of the
    odd sizes above) and every pooled array execute() hands out start on a 64-byte boundary,
    although the memory they are carved from starts 1 byte past one."""
    path = str(tmp_path / "odd.gear.onnx")
    gr.compile(odd_outputs_model(), gr.GearSpec.from_atc(input_shape="x:1,-1,3",
                                                         dynamic_dims="5;7;13"),
               path, progress=False)
    with gr.load(path) as model:
        ex = model.create_executor()
        session = ex._session
        assert session.staging.ctypes.data % 64 == 0
        assert odd_memory.raw, "the session's buffers did not come from aligned_buffer"
        for seq in (5, 7, 13, 6):  # 6: padded to 7, trimmed views
            x = feed_odd(seq)
            views = ex.execute(x, copy=False, pad=True)
            assert [v.nbytes for v in views[:4]] == [3 * seq, 3 * seq, 6 * seq, 4 * seq]
            for name, v in zip(model.output_names, views, strict=True):
                assert v.ctypes.data % 64 == 0, (seq, name, v.ctypes.data % 64)
            kept = ex.execute(x, pad=True)
            assert kept[4].nbytes >= FRESH_OUTPUT_MIN_BYTES
            assert kept[4].ctypes.data % 64 == 0, (seq, kept[4].ctypes.data % 64)
            assert not np.shares_memory(kept[4], views[4])
            np.testing.assert_array_equal(kept[0], views[0])
        for buffers in session._outputs:
            for buf in buffers:
                assert buf.ctypes.data % 64 == 0
    assert len(odd_memory.raw) >= 1 + 5 + 1  # staging, the 5 output buffers, a pooled block


def feed_odd(seq: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seq).standard_normal((1, seq, 3)).astype(np.float32)}
