"""gear_runtime.runtime.core: the C++ hot path against its contract, through the Python binding.

Expected values here are written out by hand from the rules (csrc/layout.h, csrc/dims.h,
csrc/staging.h), not computed by the code under test; tests/test_core_parity.py compares the
core with the test oracle on random models, csrc/tests/ tests the C++ classes directly.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from types import ModuleType
from typing import Any

import native_pair as pair
import numpy as np
import pytest

import gear_runtime as gr
import gear_runtime.runtime.core
from gear_runtime import _core as native
from gear_runtime.spec.gearspec import GearSpec


def build(mod: ModuleType, spec: GearSpec, dtypes: list[Any] | None = None,
          fusion_size: int = 131072, alignment: int = 64, extra: int = 0,
          ) -> tuple[Any, np.ndarray]:
    """An ExecutorCore for ``spec`` (``mod``: tests/native_pair.py for the C++ one, with the
    GearDispatch it shares) with a zeroed staging buffer ``extra`` bytes too long."""
    dtypes = [np.dtype(d) for d in (dtypes or [np.float32] * len(spec.input_names))]
    nbytes = [[int(np.prod(s, dtype=np.int64)) * dt.itemsize
               for s, dt in zip(spec.shapes(g).values(), dtypes, strict=True)]
              for g in range(spec.gear_count)]
    layout = mod.plan_layout(nbytes, spec.values_per_gear, fusion_size, alignment)
    staging = np.zeros(layout.total_bytes + extra, np.uint8)
    core = mod.ExecutorCore(list(spec.input_names), [list(s) for s in spec.input_shapes],
                            list(spec.dynamic_positions), [list(g) for g in spec.gears],
                            dtypes, layout, staging)
    return core, staging


def expected_staging(layout: Any, gear: int, arrays: list[np.ndarray], values: tuple[int, ...],
                     size: int) -> np.ndarray:
    """What the staging buffer must hold after staging ``arrays`` into a zeroed buffer."""
    out = np.zeros(size, np.uint8)
    for i, a in enumerate(arrays):
        raw = np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8)
        out[layout.offset(gear, i):layout.offset(gear, i) + raw.size] = raw
    dims = np.frombuffer(np.asarray(values, "<i4").tobytes(), np.uint8)
    out[layout.dims_offset(gear):layout.dims_offset(gear) + dims.size] = dims
    return out


BATCH = GearSpec.from_atc(input_shape="data:-1,3,4,4", dynamic_batch_size="1,8,16")
DIMS = GearSpec.from_atc(input_shape="x:1,-1;mask:-1,4", dynamic_dims="20,1;40,2")
IMAGE = GearSpec.from_atc(input_shape="img:1,3,-1,-1", dynamic_image_size="8,8;16,24")
TWO_BATCH = GearSpec.from_atc(input_shape="a:-1,3;b:-1,2", dynamic_batch_size="2,4")


# ---- import contract ------------------------------------------------------------------------
def test_the_core_is_the_extension() -> None:
    assert gear_runtime.runtime.core.ExecutorCore is native.ExecutorCore
    assert gear_runtime.runtime.core.plan_layout is native.plan_layout


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=False)


def test_no_silent_fallback() -> None:
    # _core missing (blocked in sys.modules): ImportError that says how to build it.
    done = _run_python("import sys; sys.modules['gear_runtime._core'] = None\n"
                       "import gear_runtime.runtime.core")
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "pip install ." in done.stderr


# ---- layout ---------------------------------------------------------------------------------
def test_layout_packs_fused_inputs_then_dims_then_the_rest() -> None:
    lay = native.plan_layout([[100, 10, 5000], [200, 20, 9000]], 3, 4096, 64)
    assert lay.merged and lay.gear_count == 2 and lay.input_count == 3
    assert [lay.fused(i) for i in range(3)] == [True, True, False]
    assert (lay.offset(1, 0), lay.offset(1, 1), lay.dims_offset(1)) == (0, 256, 320)
    assert lay.merged_span(1) == (0, 332)
    assert lay.offset(1, 2) == 384 and lay.nbytes(1, 2) == 9000
    assert lay.separate(1) == [(384, 9384)]
    assert lay.total_bytes == 9384 and lay.dims_nbytes == 12 and lay.alignment == 64


def test_layout_merges_only_two_or_more_buffers() -> None:
    alone = native.plan_layout([[16], [32]], 0)
    assert not alone.merged and not alone.fused(0)
    assert alone.merged_span(1) == (0, 0) and alone.separate(1) == [(0, 32)]
    with_dims = native.plan_layout([[16], [32]], 1)
    assert with_dims.merged and with_dims.merged_span(1) == (0, 68)
    off = native.plan_layout([[16, 16]], 2, -1)
    assert not off.merged
    assert off.separate(0) == [(0, 8), (64, 80), (128, 144)]  # dims first, then the inputs


def test_layout_fusion_size_is_capped_at_32_mib() -> None:
    mib = 1 << 20
    lay = native.plan_layout([[32 * mib, 32 * mib + 1]], 1, 1 << 40)
    assert lay.fused(0) and not lay.fused(1)
    limits = native.MAX_FUSION_SIZE, native.DEFAULT_FUSION_SIZE
    assert limits == (32 * mib, 131072)


@pytest.mark.parametrize(("args", "message"), [
    (([], 1), "input_nbytes has no gears"),
    (([[1, 2], [3]], 1), "input_nbytes row 1 has 1 inputs, row 0 has 2"),
    (([[1, -2]], 1), "input_nbytes[0][1] is -2, a byte count must be >= 0"),
    (([[1]], 1, 10, 48), "alignment must be a power of two >= 1, got 48"),
    (([[1]], 1, 10, 0), "alignment must be a power of two >= 1, got 0"),
    (([[1]], -1), "dims_count must be >= 0, got -1"),
    (([[2**63 - 1, 2**63 - 1, 2**63 - 1]], 1, -1), "layout size overflows"),
    (([[1]], 1, 10, 64, -1), "tail_padding must be >= 0, got -1"),
    (([[1]], 1, 10, 48, -1), "alignment must be a power of two >= 1, got 48"),  # checked first
    (([[2**63 - 1] * 2], 0, -1, 1, 32), "layout size overflows"),  # fits packed: see below
])
def test_layout_rejects_bad_arguments(args: tuple[Any, ...],
                                      message: str) -> None:
    with pytest.raises(gr.InputError) as info:
        native.plan_layout(*args)
    assert message in info.value.message and info.value.code == "145000"


@pytest.mark.parametrize("args", [([[1]], "2"), (5, 1), ([[1.5]], 1), ([[1]], 1, 10, 64, "32"),
                                  ([[1]], 1, 10, 64, 2**63)])
def test_layout_calls_that_do_not_fit_are_type_errors(args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError):
        native.plan_layout(*args)


# ---- layout: tail_padding (pyACL's ALIGN_UP(len, 32) + 32 per sub-buffer) --------------------
def test_layout_tail_padding_zero_is_the_packed_layout() -> None:
    """tail_padding=0 (the default) is byte for byte the layout without the parameter."""
    for args in [([[100, 10, 5000], [200, 20, 9000]], 3, 4096, 64), ([[16, 16]], 0),
                 ([[0, 3], [5, 3]], 1, 131072, 1), ([[16, 16]], 2, -1)]:
        packed, zero = native.plan_layout(*args), native.plan_layout(*args, tail_padding=0)
        assert zero.tail_padding == packed.tail_padding == 0
        assert repr(zero) == repr(packed) and "tail_padding" not in repr(zero)
        for g in range(packed.gear_count):
            assert zero.merged_span(g) == packed.merged_span(g)
            assert zero.separate(g) == packed.separate(g)
            assert zero.dims_offset(g) == packed.dims_offset(g)
            assert [zero.offset(g, i) for i in range(zero.input_count)] == \
                [packed.offset(g, i) for i in range(packed.input_count)]
        assert zero.total_bytes == packed.total_bytes


def test_layout_tail_padding_by_hand() -> None:
    # gear 1: input 0 (200 B) at 0 owns ALIGN_UP(200, 32) + 32 = 256; input 1 (20 B) at 256
    # owns 64; dims (12 B) at 320 own 64 -> merged end 384; input 2 (9000 B) at 384 owns
    # 9024 + 32 -> 9440.
    lay = native.plan_layout([[100, 10, 5000], [200, 20, 9000]], 3, 4096, 64, 32)
    assert lay.tail_padding == 32 and lay.alignment == 64
    assert (lay.offset(1, 0), lay.offset(1, 1), lay.dims_offset(1)) == (0, 256, 320)
    assert lay.merged_span(1) == (0, 384)  # covers the dims buffer's padding
    assert lay.offset(1, 2) == 384 and lay.nbytes(1, 2) == 9000  # sizes stay real
    assert lay.separate(1) == [(384, 9384)]  # separate spans: the data only
    assert lay.total_bytes == 9440 and lay.dims_nbytes == 12
    # gear 0: 100 B own 160 -> input 1 at 192 (aligned), dims at 256, merged end 320
    assert (lay.offset(0, 1), lay.dims_offset(0), lay.merged_span(0)) == (192, 256, (0, 320))
    assert repr(lay) == ("Layout(gears=2, inputs=3, merged=True, total_bytes=9440, "
                         "tail_padding=32)")


def test_layout_tail_padding_zero_byte_buffers_and_odd_values() -> None:
    # a 0-byte input still owns its padding; no dims buffer (dims_count 0) owns nothing
    lay = native.plan_layout([[0, 3]], 0, -1, 64, tail_padding=32)
    assert (lay.offset(0, 0), lay.offset(0, 1), lay.total_bytes) == (0, 64, 128)
    merged = native.plan_layout([[16, 16]], 0, tail_padding=32)
    assert merged.merged and merged.merged_span(0) == (0, 128) and merged.offset(0, 1) == 64
    # any padding and alignment: every footprint is ALIGN_UP(n, 32) + 1
    odd = native.plan_layout([[5, 3]], 1, alignment=1, tail_padding=1)
    assert (odd.offset(0, 1), odd.dims_offset(0), odd.merged_span(0)) == (33, 66, (0, 99))
    assert odd.total_bytes == 99
    # two inputs of 2**63 - 1 bytes fit 64 bits packed; padded, they overflow (rejected above)
    assert native.plan_layout([[2**63 - 1] * 2], 0, -1, 1).total_bytes == 2**64 - 2


@pytest.mark.parametrize("fusion", [-1, 40, 131072])
@pytest.mark.parametrize("dims", [0, 1, 8, 9])
def test_layout_tail_padding_keeps_the_acl_rule(fusion: int,
                                                dims: int) -> None:
    """alignment 64 + tail_padding 32: every buffer starts 64-aligned and has at least
    ALIGN_UP(len, 32) + 32 bytes before the next buffer (or the end of the staging)."""
    tables = [[[100, 10], [200, 20]], [[16, 1000], [32, 5000]], [[0, 3], [5, 3]],
              [[32, 64, 96], [1, 2, 31], [33, 65, 97]]]
    for table in tables:
        lay = native.plan_layout(table, dims, fusion, 64, 32)
        for g in range(lay.gear_count):
            bufs = [(lay.offset(g, i), lay.nbytes(g, i)) for i in range(lay.input_count)]
            bufs += [(lay.dims_offset(g), lay.dims_nbytes)] if dims else []
            bufs.sort()
            limits = [start for start, _ in bufs[1:]] + [lay.total_bytes]
            for (start, n), limit in zip(bufs, limits, strict=True):
                assert start % 64 == 0
                assert start + (n + 31) // 32 * 32 + 32 <= limit, (table, g, start, n)


def test_layout_index_errors_are_input_errors() -> None:
    lay = native.plan_layout([[1, 2]], 1)
    with pytest.raises(gr.InputError, match="gear index 1 out of range: the layout has 1 gears"):
        lay.offset(1, 0)
    with pytest.raises(gr.InputError, match="input index 2 out of range"):
        lay.nbytes(0, 2)
    for call in (lambda: lay.nbytes(0, -1), lambda: lay.merged_span("0")):
        with pytest.raises(TypeError):
            call()


# ---- matching ------------------------------------------------------------------------------
def test_match_every_gear_and_explain_a_miss() -> None:
    core, _ = build(pair, BATCH)
    assert (core.gear_count, core.values_per_gear) == (3, 1)
    assert [core.match([b]) for b in (1, 8, 16)] == [0, 1, 2]
    assert core.match(np.array([8])) == 1  # numpy ints are ints
    with pytest.raises(gr.GearMismatchError) as info:
        core.match((17,))
    assert info.value.code == "145013"
    assert info.value.message == (
        "dynamic dims (17,) match no gear of the model (inputs: data axis 0); legal gears, "
        "nearest first: (16,), (8,), (1,)")


def test_mismatch_lists_eight_gears_then_how_many_more() -> None:
    spec = GearSpec.from_atc(input_shape="x:-1,2", dynamic_batch_size=",".join(
        str(b) for b in range(1, 21)))
    core, _ = build(pair, spec)
    with pytest.raises(gr.GearMismatchError) as info:
        core.match([0])
    assert info.value.message.endswith(
        "(1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), ... and 12 more")
    assert core.nearest([10], 3) == [(10,), (9,), (11,)]  # ties: the lower gear index first
    assert core.nearest([10], 0) == []


def test_match_input_errors() -> None:
    core, _ = build(pair, DIMS)
    with pytest.raises(gr.DynamicInputLengthError,
                       match=r"dynamic dims have 1 values, the model's gears have 2"):
        core.match([20])
    for values in (None, [20, 1.0], ["20", 1], [2**64, 1]):
        with pytest.raises(TypeError):
            core.match(values)
    with pytest.raises(gr.InputError, match="k must be >= 0, got -1"):
        core.nearest([20, 1], -1)


# ---- dims -------------------------------------------------------------------------------------
def test_extract_dims_batch_and_image_modes() -> None:
    core, _ = build(pair, DIMS)
    assert core.extract([np.zeros((1, 40), np.float32), np.zeros((2, 4), np.float32)]) == (40, 2)
    assert core.extract([np.zeros((1, 7)), np.zeros((9, 4))]) == (7, 9)  # not matched here
    image, _ = build(pair, IMAGE)
    assert image.extract([np.zeros((1, 3, 16, 24))]) == (16, 24)
    two, _ = build(pair, TWO_BATCH)
    assert two.extract([np.zeros((4, 3)), np.zeros((4, 2))]) == (4,)


def test_extract_errors_name_input_axis_and_values() -> None:
    core, _ = build(pair, DIMS)
    x = np.zeros((1, 20), np.float32)
    cases = [
        ([x, np.zeros((1, 7))], gr.DynamicInputLengthError,
         "input 'mask' axis 1 is 7 but the model fixes it to 4"),
        ([np.zeros((1, 20, 1)), np.zeros((1, 4))], gr.DynamicInputLengthError,
         "input 'x' has 3 dims, the model's input has 2"),
        ([x], gr.InputError, "expected 2 input arrays (x, mask), got 1"),
        ([x, [[1, 2, 3, 4]]], gr.InputError, "input 'mask' must be a numpy.ndarray, got list"),
        (x, gr.InputError, "input 'x' must be a numpy.ndarray, got ndarray"),
    ]
    for arrays, cls, message in cases[:4]:
        with pytest.raises(cls) as info:
            core.extract(arrays)
        assert type(info.value) is cls and info.value.message == message
    with pytest.raises(gr.InputError):  # a 2-D array is a sequence of 1 rows, not 2 inputs
        core.extract(cases[4][0])
    two, _ = build(pair, TWO_BATCH)
    with pytest.raises(gr.DynamicInputLengthError) as info:
        two.extract([np.zeros((4, 3)), np.zeros((2, 2))])
    assert info.value.message == ("input 'b' axis 0 is 2 but input 'a' axis 0 is 4, and both "
                                  "carry gear value 0")


def test_values_from_full_dims() -> None:
    core, _ = build(pair, DIMS)
    assert core.values_from_full_dims([1, 40, 2, 4]) == (40, 2)
    with pytest.raises(gr.DynamicInputLengthError) as info:
        core.values_from_full_dims([1, 40, 2])
    assert info.value.code == "145012" and info.value.message == (
        "full dims have 3 values, the model's inputs have 4 dims in all (x:2, mask:2)")
    with pytest.raises(gr.DynamicInputLengthError,
                       match="input 'x' axis 0 is 3 but the model fixes it to 1"):
        core.values_from_full_dims([3, 40, 2, 4])
    with pytest.raises(TypeError):
        core.values_from_full_dims([1, 40, 2, 4.0])


# ---- staging ------------------------------------------------------------------------------
@pytest.mark.parametrize("fusion_size", [131072, 16, -1])
def test_stage_writes_every_input_and_the_dims(fusion_size: int) -> None:
    core, staging = build(pair, DIMS, [np.float32, np.int64], fusion_size=fusion_size, extra=64)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1, 40)).astype(np.float32),
              rng.integers(-9, 9, (2, 4)).astype(np.int64)]
    assert core.last_values == ()
    assert core.stage(arrays) == 1
    assert core.last_values == (40, 2)
    want = expected_staging(core.layout, 1, arrays, (40, 2), staging.size)
    np.testing.assert_array_equal(staging, want)


def test_stage_copies_non_contiguous_inputs() -> None:
    core, staging = build(pair, IMAGE)
    base = np.arange(3 * 24 * 16, dtype=np.float32).reshape(1, 3, 24, 16)
    arr = base.transpose(0, 1, 3, 2)  # (1, 3, 16, 24), not C-contiguous
    assert not arr.flags.c_contiguous
    assert core.stage([arr]) == 1
    np.testing.assert_array_equal(
        staging, expected_staging(core.layout, 1, [arr], (16, 24), staging.size))


def test_stage_checks_preset_gear_and_dtype() -> None:
    core, _ = build(pair, DIMS)
    ok = [np.zeros((1, 20), np.float32), np.zeros((1, 4), np.float32)]
    assert core.stage(ok, (20, 1)) == 0
    with pytest.raises(gr.DynamicInputLengthError) as info:
        core.stage(ok, [40, 2])
    assert info.value.message == ("the inputs' dynamic dims (20, 1) disagree with the dims "
                                  "set with set_dynamic_* (40, 2)")
    with pytest.raises(gr.DynamicInputLengthError, match="preset dims have 1 values"):
        core.stage(ok, [20])
    with pytest.raises(gr.GearMismatchError, match=r"dynamic dims \(21, 1\) match no gear"):
        core.stage([np.zeros((1, 21), np.float32), ok[1]])
    with pytest.raises(gr.InputError) as info:
        core.stage([ok[0], ok[1].astype(np.float64)])
    assert info.value.message == "input 'mask' has dtype float64, the model's input has float32"
    with pytest.raises(gr.InputError, match="has dtype >f4"):
        core.stage([ok[0], ok[1].astype(">f4")])
    assert core.last_values == (20, 1)  # failed stages leave it alone


def test_stage_zero_copy_from_its_own_slot_and_no_other_aliasing() -> None:
    core, staging = build(pair, DIMS)
    lay = core.layout
    x = staging[lay.offset(1, 0):lay.offset(1, 0) + 160].view(np.float32).reshape(1, 40)
    x[...] = np.arange(40)
    mask = np.ones((2, 4), np.float32)
    assert core.stage([x, mask]) == 1
    np.testing.assert_array_equal(x, np.arange(40, dtype=np.float32).reshape(1, 40))
    wrong = staging[lay.offset(1, 0):lay.offset(1, 0) + 32].view(np.float32).reshape(2, 4)
    with pytest.raises(gr.InputError, match="input 'mask' overlaps the staging buffer but is "
                                            "not its own slot in gear 1"):
        core.stage([x, wrong])


def test_zero_size_gear() -> None:
    spec = GearSpec.from_atc(input_shape="x:-1,3;y:2", dynamic_batch_size="0,2")
    core, staging = build(pair, spec)
    arrays = [np.zeros((0, 3), np.float32), np.full(2, 7, np.float32)]
    assert core.stage(arrays) == 0
    np.testing.assert_array_equal(
        staging, expected_staging(core.layout, 0, arrays, (0,), staging.size))


# ---- construction ------------------------------------------------------------------------------
def test_construction_checks_layout_and_staging() -> None:
    names, shapes = ["x", "mask"], [[1, -1], [-1, 4]]
    pos, gears = list(DIMS.dynamic_positions), [[20, 1], [40, 2]]
    dts = [np.float32, np.float32]
    good = native.plan_layout([[80, 16], [160, 32]], 2)

    def make(layout: Any = good, staging: Any = None, dtypes: Any = dts, gs: Any = gears) -> Any:
        if staging is None:
            staging = np.zeros(good.total_bytes, np.uint8)
        return pair.ExecutorCore(names, shapes, pos, gs, dtypes, layout, staging)

    cases = [
        (dict(layout=native.plan_layout([[80, 16], [159, 32]], 2)), gr.InputError,
         "layout slot of input 'x' in gear 1 has 159 bytes, its shape (1, 40) of float32 needs "
         "160"),
        (dict(layout=native.plan_layout([[80, 16]], 2)), gr.InputError,
         "layout has 1 gears, the model has 2"),
        (dict(layout=native.plan_layout([[80, 16], [160, 32]], 1)), gr.InputError,
         "layout dims buffer has 4 bytes, the model's gears have 2 values (8 bytes as int32; or "
         "0: no dims buffer)"),
        (dict(staging=np.zeros(good.total_bytes - 1, np.uint8)), gr.InputError,
         f"staging buffer has {good.total_bytes - 1} bytes, the layout needs "
         f"{good.total_bytes}"),
        (dict(staging=np.zeros(good.total_bytes, np.int8)), gr.InputError,
         "staging must have dtype uint8, got int8"),
        (dict(staging=np.zeros((good.total_bytes, 2), np.uint8)[:, 0]), gr.InputError,
         "staging must be C-contiguous and writable"),
        (dict(dtypes=[np.float32, object]), gr.InputError,
         "input 'mask' dtype object holds Python objects"),
        (dict(dtypes=[np.float32]), gr.InputError, "1 input dtypes for 2 inputs"),
        (dict(gs=[[20, 1], [20, 1]]), gr.GearSpecError, "gear 1 (20, 1) repeats gear 0"),
        (dict(gs=[[20, 1], [40]]), gr.GearSpecError, "gear 1 (40,) has 1 values"),
    ]
    for kwargs, cls, message in cases:
        with pytest.raises(cls) as info:
            make(**kwargs)
        assert message in info.value.message, (kwargs, info.value.message)
    for kwargs in (dict(layout="nope"), dict(layout=native.Layout.__new__(native.Layout)),
                   dict(staging=bytearray(good.total_bytes)), dict(staging=[0] * 64)):
        with pytest.raises(TypeError):  # not a Layout / not an array: never a wild read or copy
            make(**kwargs)
    ro = np.zeros(good.total_bytes, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(gr.InputError, match="writable"):
        make(staging=ro)


def test_construction_checks_positions() -> None:
    with pytest.raises(gr.GearSpecError, match="names input 'x' axis 0, which the model fixes"):
        pair.ExecutorCore(["x"], [[1, -1]], [(0, 0, 0)], [[1], [2]], [np.float32],
                          native.plan_layout([[4], [8]], 1), np.zeros(256, np.uint8))
    with pytest.raises(gr.GearSpecError, match="no dynamic position maps it"):
        pair.ExecutorCore(["x"], [[-1, -1]], [(0, 0, 0)], [[1], [2]], [np.float32],
                          native.plan_layout([[4], [8]], 1), np.zeros(256, np.uint8))
    with pytest.raises(gr.InputError, match=r"dynamic_positions\[0\] must have 3 values"):
        pair.ExecutorCore(["x"], [[-1]], [(0, 0)], [[1], [2]], [np.float32],
                          native.plan_layout([[4], [8]], 1), np.zeros(256, np.uint8))


def test_core_keeps_the_staging_buffer_alive() -> None:
    core, staging = build(pair, BATCH)
    alive = weakref.ref(staging)
    del staging
    assert alive() is not None  # the core holds a reference
    arr = np.ones((8, 3, 4, 4), np.float32)
    assert core.stage([arr]) == 1
    staged = alive()
    off = core.layout.offset(1, 0)
    np.testing.assert_array_equal(staged[off:off + arr.nbytes].view(np.float32), arr.ravel())
    del core, staged
    gc.collect()
    assert alive() is None  # and lets it go with itself


MISUSE = r"""
import threading, numpy as np
from gear_runtime import _core
from gear_runtime.spec import GearSpec
spec = GearSpec.from_atc(input_shape="x:-1,1048576", dynamic_batch_size="1,16")
layout = _core.plan_layout([[4 << 20], [64 << 20]], 1)
staging = np.zeros(layout.total_bytes, np.uint8)
dispatch = _core.GearDispatch(["x"], [[-1, 1 << 20]], [[0, 0, 0]], [[1], [16]])
core = _core.ExecutorCore(dispatch, [np.dtype(np.float32)], layout, staging)
big, small = np.ones((16, 1 << 20), np.float32), np.ones((1, 1 << 20), np.float32)
wrong = []
def stager(arr, gear):
    for _ in range(30):
        if core.stage([arr]) != gear:
            wrong.append(gear)
threads = [threading.Thread(target=stager, args=a) for a in ((big, 1), (small, 0))]
for t in threads: t.start()
for t in threads: t.join()
print("wrong", len(wrong))
"""


def test_stage_keeps_its_scratch_per_call_under_concurrent_misuse() -> None:
    """Two threads staging into ONE core (which the executor's ownership lock prevents) can
    only mix the staged bytes: every call returns its own gear and nothing overflows (a
    shared scratch would copy one call's 64 MiB into the other's 4 MiB slot). In a
    subprocess: an overflow fails this test instead of killing pytest."""
    run = subprocess.run([sys.executable, "-c", MISUSE], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["wrong", "0"]


# ---- calling conventions ------------------------------------------------------------------------
def test_keyword_arguments_and_call_errors() -> None:
    core, _ = build(pair, DIMS)
    arrays = [np.zeros((1, 40), np.float32), np.zeros((2, 4), np.float32)]
    assert core.match(values=(40, 2)) == 1
    assert core.extract(arrays=arrays) == (40, 2)
    assert core.stage(arrays=arrays, preset=(40, 2)) == 1
    assert core.stage(arrays, preset=None) == 1
    assert core.nearest(values=(40, 2), k=1) == [(40, 2)]
    assert core.values_from_full_dims(full_dims=[1, 40, 2, 4]) == (40, 2)
    lay = native.plan_layout(input_nbytes=[[8, 8]], dims_count=1, fusion_size=64, alignment=64,
                           tail_padding=32)
    assert (lay.tail_padding, lay.offset(0, 1)) == (32, 64)
    other = native.ExecutorCore(dispatch=core.dispatch, input_dtypes=[np.float32] * 2,
                                layout=core.layout, staging=np.zeros(4096, np.uint8))
    assert other.dispatch is core.dispatch is core.core.dispatch  # shared, not copied
    for bad in (None, "nope", core.layout):
        with pytest.raises(TypeError):  # a dispatch is required, and only a GearDispatch
            native.ExecutorCore(bad, [np.float32] * 2, core.layout, np.zeros(4096, np.uint8))
    for call in (lambda: core.match(), lambda: core.match((40, 2), 1),
                 lambda: core.stage(arrays, None, False, 1), lambda: core.stage(arrays, bad=1),
                 lambda: core.extract(arrays, arrays=arrays),
                 lambda: core.execute(arrays, None, False), lambda: core.execute(arrays),
                 lambda: core.execute(arrays, None, 0, False),
                 lambda: core.execute(arrays, None, False, copy=True),
                 lambda: native.ExecutorCore.execute(arrays, None, False, False)):
        with pytest.raises(TypeError):  # a wrong call, as for any Python function
            call()


def test_uninitialised_native_objects_raise_instead_of_crashing() -> None:
    core = native.ExecutorCore.__new__(native.ExecutorCore)
    dispatch = native.GearDispatch.__new__(native.GearDispatch)
    layout = native.Layout.__new__(native.Layout)
    calls = [lambda: dispatch.match((1,)), lambda: core.stage([]), lambda: dispatch.extract([]),
             lambda: dispatch.nearest((1,)), lambda: core.last_values, lambda: core.layout,
             lambda: dispatch.values_from_full_dims([1]), lambda: core.set_runs(None),
             lambda: core.dispatch, lambda: dispatch.costs,
             lambda: native.ExecutorCore(dispatch, [np.float32], native.plan_layout([[4]], 1),
                                         np.zeros(64, np.uint8)),
             lambda: core.execute({}, None, False, False), lambda: layout.offset(0, 0),
             lambda: layout.total_bytes, lambda: repr(layout)]
    for call in calls:
        with pytest.raises(TypeError):
            call()
