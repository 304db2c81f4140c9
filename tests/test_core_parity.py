"""Parity: the C++ core and the test oracle (tests/oracle.py) agree.

Hypothesis draws random models (1..4 inputs, ranks 1..4, 2..100 gears, dims / batch /
image-size position mappings, random dtypes, fusion sizes, alignments and tail paddings) and
random queries (gear hits, misses, wrong ranks, wrong static dims, disagreeing positions, wrong
dtypes, non-contiguous arrays, wrong counts, presets, padding). For every query both must
return the same value, or raise the same class with the same code (and, for the domain errors
145012 and 145013, the same message), and leave byte-identical staging buffers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import native_pair as pair
import numpy as np
import oracle
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gear_runtime as gr
from gear_runtime import _core as native
from gear_runtime.spec.gearspec import GearSpec

DTYPES = [np.float32, np.int64, np.uint8, np.float16, np.bool_, np.complex64]
SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def layout_facts(lay: Any) -> tuple[Any, ...]:
    """Everything a Layout says, as plain values (the two classes differ, their facts not)."""
    return (repr(lay), lay.dims_nbytes, lay.alignment, lay.tail_padding, lay.total_bytes,
            [lay.fused(i) for i in range(lay.input_count)],
            [(lay.merged_span(g), lay.separate(g), lay.dims_offset(g),
              [(lay.offset(g, i), lay.nbytes(g, i)) for i in range(lay.input_count)])
             for g in range(lay.gear_count)])


#: The domain errors, whose messages the oracle models word for word.
DOMAIN_CODES = ("145012", "145013")


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """("ok", result) or ("error", class, code, message of a domain error else None);
    anything else escapes and fails."""
    try:
        result = fn(*args)
    except gr.GearRuntimeError as exc:
        return ("error", type(exc), exc.code,
                exc.message if exc.code in DOMAIN_CODES else None)
    if isinstance(result, native.Layout | oracle.Layout):
        return ("ok", layout_facts(result))
    return ("ok", result)


def same(fn_native: Callable[..., Any], fn_ref: Callable[..., Any], *args: Any) -> tuple:
    got, want = outcome(fn_native, *args), outcome(fn_ref, *args)
    assert got == want
    return got


# ---- random models ------------------------------------------------------------------------
@st.composite
def models(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["dims", "batch", "image_size"]))
    n = draw(st.integers(1, 4))
    shapes = [[draw(st.integers(1, 3)) for _ in range(4 if mode == "image_size"
                                                      else draw(st.integers(1, 4)))]
              for _ in range(n)]
    if mode == "dims":
        cells = [(i, a) for i in range(n) for a in range(len(shapes[i]))]
        chosen = draw(st.lists(st.sampled_from(cells), min_size=1, max_size=min(4, len(cells)),
                               unique=True))
        for i, a in chosen:
            shapes[i][a] = -1
    else:
        inputs = draw(st.lists(st.integers(0, n - 1), min_size=1, unique=True))
        for i in inputs:
            rank = len(shapes[i])
            if mode == "batch":
                shapes[i][draw(st.integers(0, rank - 1))] = -1
            else:  # image size: two axes, the first -1 is H, the second W
                for a in draw(st.lists(st.integers(0, rank - 1), min_size=2, max_size=2,
                                       unique=True)):
                    shapes[i][a] = -1
    names = [f"in{i}" for i in range(n)]
    width = GearSpec(mode=mode, input_names=names, input_shapes=shapes,
                     gears=()).values_per_gear
    hi = {1: 40, 2: 12}.get(width, 5)
    space = (hi + 1) ** width
    gears = draw(st.lists(st.tuples(*[st.integers(0, hi)] * width), min_size=2,
                          max_size=min(100, space // 2), unique=True))
    spec = GearSpec(mode=mode, input_names=names, input_shapes=shapes, gears=gears)
    return {
        "spec": spec,
        "hi": hi,
        "dtypes": [np.dtype(draw(st.sampled_from(DTYPES))) for _ in range(n)],
        "fusion": draw(st.sampled_from([-1, 0, 8, 64, 131072, 1 << 40])),
        "alignment": draw(st.sampled_from([1, 8, 64])),
        "tail_padding": draw(st.sampled_from([0, 32, 64])),
        # a backend that reads the dims buffer (pyACL), or one that does not (ONNX Runtime)
        "stages_dims": draw(st.booleans()),
    }


def build_pair(m: dict[str, Any]) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    spec: GearSpec = m["spec"]
    nbytes = [[int(np.prod(s, dtype=np.int64)) * dt.itemsize
               for s, dt in zip(spec.shapes(g).values(), m["dtypes"], strict=True)]
              for g in range(spec.gear_count)]
    cores, bufs = [], []
    for mod in (pair, oracle):
        dims = spec.values_per_gear if m.get("stages_dims", True) else 0
        layout = mod.plan_layout(nbytes, dims, m["fusion"], m["alignment"],
                                 m.get("tail_padding", 0))
        staging = np.zeros(layout.total_bytes + 16, np.uint8)
        cores.append(mod.ExecutorCore(
            list(spec.input_names), [list(s) for s in spec.input_shapes],
            list(spec.dynamic_positions), [list(g) for g in spec.gears], m["dtypes"], layout,
            staging))
        bufs.append(staging)
    return cores[0], cores[1], bufs[0], bufs[1]


def shapes_for(spec: GearSpec, values: tuple[int, ...]) -> list[list[int]]:
    shapes = [list(s) for s in spec.input_shapes]
    for i, a, v in spec.dynamic_positions:
        shapes[i][a] = values[v]
    return shapes


def filled(shape: list[int], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    raw = rng.integers(0, 256, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, np.uint8)
    return raw.view(dtype).reshape(shape) if dtype != np.bool_ else (raw > 127).reshape(shape)


# ---- layout parity ------------------------------------------------------------------------
@SETTINGS
@given(m=models())
def test_layout_parity(m: dict[str, Any]) -> None:
    a, b, _, _ = build_pair(m)
    assert layout_facts(a.layout) == layout_facts(b.layout)
    assert (a.gear_count, a.values_per_gear) == (b.gear_count, b.values_per_gear)


@SETTINGS
@given(table=st.lists(st.lists(st.integers(-2, 300), min_size=0, max_size=4), min_size=0,
                      max_size=4),
       dims=st.integers(-1, 5), fusion=st.integers(-2, 600),
       alignment=st.sampled_from([-8, 0, 1, 3, 8, 64, 4096]),
       tail_padding=st.sampled_from([-1, 0, 1, 32, 64]))
def test_plan_layout_parity(table: list[list[int]], dims: int, fusion: int,
                            alignment: int, tail_padding: int) -> None:
    same(native.plan_layout, oracle.plan_layout, table, dims, fusion, alignment,
         tail_padding)


# ---- hot path parity ----------------------------------------------------------------------
QUERIES = ["hit", "hit", "hit", "miss", "rank", "static", "disagree", "dtype", "noncontig",
           "count", "notarray", "zero_copy"]


@SETTINGS
@given(m=models(), data=st.data())
def test_hot_path_parity(m: dict[str, Any], data: st.DataObject) -> None:
    spec: GearSpec = m["spec"]
    a, b, buf_a, buf_b = build_pair(m)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kind = data.draw(st.sampled_from(QUERIES))
    if kind == "miss":
        values = tuple(data.draw(st.integers(0, m["hi"] + 2)) for _ in range(a.values_per_gear))
    else:
        values = spec.gears[data.draw(st.integers(0, spec.gear_count - 1))]
    shapes = shapes_for(spec, values)
    dtypes = list(m["dtypes"])
    i = data.draw(st.integers(0, len(shapes) - 1))
    if kind == "rank":
        shapes[i] = shapes[i] + [1] if data.draw(st.booleans()) or not shapes[i] else shapes[i][1:]
    elif kind == "static":
        static = [(j, ax) for j, s in enumerate(spec.input_shapes) for ax, d in enumerate(s)
                  if d != -1]
        if static:
            j, ax = data.draw(st.sampled_from(static))
            shapes[j][ax] += data.draw(st.sampled_from([-1, 1, 5]))
    elif kind == "disagree":
        shared = [(j, ax) for j, ax, v in spec.dynamic_positions
                  if sum(1 for *_, w in spec.dynamic_positions if w == v) > 1]
        if shared:
            j, ax = data.draw(st.sampled_from(shared))
            shapes[j][ax] += 1
    elif kind == "dtype":
        dtypes[i] = np.dtype(data.draw(st.sampled_from(DTYPES + [np.float64])))
    arrays: list[Any] = [filled(s, dt, rng) for s, dt in zip(shapes, dtypes, strict=True)]
    if kind == "noncontig":
        arrays = [np.repeat(x, 2, axis=-1)[..., ::2] if x.ndim else x for x in arrays]
    elif kind == "count":
        arrays = arrays[:-1] if data.draw(st.booleans()) else arrays + [arrays[0]]
    elif kind == "notarray":
        arrays[i] = arrays[i].tolist()
    preset = data.draw(st.sampled_from([None, "same", "other", "short"]))
    preset_values = {None: None, "same": values, "short": values[:-1],
                     "other": spec.gears[data.draw(st.integers(0, spec.gear_count - 1))]}[preset]

    same(a.extract, b.extract, arrays)
    same(a.match, b.match, values)
    same(a.cover, b.cover, values)
    same(a.nearest, b.nearest, values, data.draw(st.integers(0, 10)))
    full = [d for s in shapes for d in s]
    if data.draw(st.booleans()):
        full = full[:-1] if full and data.draw(st.booleans()) else full + [3]
    same(a.values_from_full_dims, b.values_from_full_dims, full)

    if kind == "zero_copy":
        stage_zero_copy(a, b, buf_a, buf_b, values, arrays)
    else:
        pad = data.draw(st.booleans())
        result = same(a.stage, b.stage, arrays, preset_values, pad)
        event(f"{kind}, preset {preset}, pad {pad}: "
              f"{result[1].__name__ if result[0] == 'error' else 'ok'}")
        assert (a.last_values, a.last_request) == (b.last_values, b.last_request)
        np.testing.assert_array_equal(buf_a, buf_b)
        if result[0] == "ok" and a.last_values == values:  # the bytes are where the layout says
            check_staged(a.layout, result[1], arrays, values, buf_a)


def stage_zero_copy(a: Any, b: Any, buf_a: np.ndarray, buf_b: np.ndarray,
                    values: tuple[int, ...], arrays: list[np.ndarray]) -> None:
    """Input 0 written straight into its slot (zero copy) in both staging buffers."""
    gear = a.match(values)
    views = []
    for core, buf in ((a, buf_a), (b, buf_b)):
        off = core.layout.offset(gear, 0)
        view = buf[off:off + arrays[0].nbytes].view(arrays[0].dtype).reshape(arrays[0].shape)
        view[...] = arrays[0]
        views.append([view, *arrays[1:]])
    assert outcome(a.stage, views[0]) == outcome(b.stage, views[1])
    np.testing.assert_array_equal(buf_a, buf_b)


def check_staged(layout: Any, gear: int, arrays: list[np.ndarray], values: tuple[int, ...],
                 buf: np.ndarray) -> None:
    for i, x in enumerate(arrays):
        raw = np.frombuffer(np.ascontiguousarray(x).tobytes(), np.uint8)
        np.testing.assert_array_equal(buf[layout.offset(gear, i):][:raw.size], raw)
    if layout.dims_nbytes:  # a layout without a dims buffer: nothing to find
        dims = np.frombuffer(buf[layout.dims_offset(gear):][:4 * len(values)].tobytes(), "<i4")
        assert tuple(dims) == tuple(values)


# ---- calls that do not fit, and construction ---------------------------------------------
WEIRD = [None, 5, "ab", b"ab", [1.5], [2**63], [-(2**63) - 1], {8: 1}, [[8]], [None],
         object(), (x for x in [8])]


@pytest.mark.parametrize("arg", WEIRD, ids=lambda v: type(v).__name__)
def test_calls_that_do_not_fit_are_type_errors_and_change_nothing(arg: Any) -> None:
    """The binding's conversions: a value of the wrong type is a TypeError (as for any Python
    function) or the core's error, never a crash; the core works on afterwards."""
    spec = GearSpec.from_atc(input_shape="x:-1,2;y:-1", dynamic_batch_size="1,8")
    m = {"spec": spec, "dtypes": [np.dtype(np.float32)] * 2, "fusion": 131072, "alignment": 64}
    core, _, buf, _ = build_pair(m)
    ok = [np.zeros((8, 2), np.float32), np.zeros(8, np.float32)]
    calls = [lambda: core.match(arg), lambda: core.cover(arg), lambda: core.nearest([8], arg),
             lambda: core.values_from_full_dims(arg), lambda: core.stage(ok, arg),
             lambda: native.plan_layout([[8, 8]], arg), lambda: core.layout.offset(arg, 0),
             lambda: core.set_padding(arg)]
    for call in calls:
        with contextlib.suppress(TypeError, gr.GearRuntimeError):
            call()
    assert core.stage(ok) == 1 and core.last_values == (8,) and buf.any()
    for call in (lambda: core.extract(arg), lambda: core.stage(arg)):
        with pytest.raises((TypeError, gr.InputError)):
            call()


CONSTRUCTOR_CASES: list[dict[str, Any]] = [
    {"input_shapes": [[-1, 2]]},
    {"input_shapes": [[-1, 2], [-3]]},
    {"input_shapes": [[-1, 2], [-1, -1]]},
    {"dynamic_positions": [(0, 0, 0), (1, 0, 0), (1, 0, 1)]},
    {"dynamic_positions": [(0, 0, 0), (2, 0, 0)]},
    {"dynamic_positions": [(0, 0, 0), (1, 5, 0)]},
    {"dynamic_positions": [(0, 1, 0), (1, 0, 0)]},
    {"dynamic_positions": [(0, 0, 0), (1, 0, 2)]},
    {"dynamic_positions": [(0, 0, 0), (1, 0, 200)]},
    {"dynamic_positions": [(0, 0, -1), (1, 0, 0)]},
    {"dynamic_positions": [(0, 0), (1, 0, 0)]},
    {"gears": []},
    {"gears": [[1], [8], [1]]},
    {"gears": [[1], [-8]]},
    {"gears": [[1], [2**31]]},
    {"gears": [[1], [8, 8]]},
    {"input_dtypes": ["float32", "O"]},
    {"input_dtypes": ["float32"]},
    {"input_dtypes": ["float32", "float64"]},  # slots too small for float64
    {"staging": np.zeros(10, np.uint8)},
    {"staging": np.zeros(4096, np.uint8)[::2]},
]


@pytest.mark.parametrize("change", CONSTRUCTOR_CASES, ids=lambda c: "-".join(c))
def test_constructor_errors_parity(change: dict[str, Any]) -> None:
    outcomes = []
    for mod in (pair, oracle):
        args: dict[str, Any] = {
            "input_names": ["x", "y"], "input_shapes": [[-1, 2], [-1]],
            "dynamic_positions": [(0, 0, 0), (1, 0, 0)], "gears": [[1], [8]],
            "input_dtypes": ["float32", "float32"],
            "layout": mod.plan_layout([[8, 4], [64, 32]], 1), "staging": np.zeros(4096, np.uint8),
        }
        args.update(change)
        outcomes.append(outcome(lambda a=args, m=mod: m.ExecutorCore(**a) and None))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == "error", outcomes[0]
