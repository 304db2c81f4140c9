"""Padding to the cheapest covering gear: the core (C++ and twin), the executor, trimming."""

from __future__ import annotations

import os
import warnings
from types import ModuleType

import native_pair as pair
import numpy as np
import onnxruntime as ort
import oracle as reference
import pytest

import gear_runtime as gr
from gear_runtime.backends.null import open_model as null_model
from gear_runtime.errors import GearMismatchError, InputError
from gear_runtime.examples import prefill
from gear_runtime.runtime.model import GearModel

IMPLS = [pytest.param(pair, id="native"), pytest.param(reference, id="reference")]


def make_core(impl: ModuleType, gears: list[list[int]], shapes: list[list[int]],
              positions: list[list[int]], dtypes: list[type]) -> tuple[object, object, np.ndarray]:
    """A core over ``gears``; returns (core, layout, staging)."""
    dts = [np.dtype(d) for d in dtypes]

    def nbytes(gear: list[int]) -> list[int]:
        out = []
        for i, shape in enumerate(shapes):
            full = list(shape)
            for inp, axis, value in positions:
                if inp == i:
                    full[axis] = gear[value]
            out.append(int(np.prod(full)) * dts[i].itemsize)
        return out

    layout = impl.plan_layout([nbytes(g) for g in gears], len(gears[0]))
    staging = np.full(layout.total_bytes, 0xEE, np.uint8)
    names = [f"in{i}" for i in range(len(shapes))]
    core = impl.ExecutorCore(names, shapes, positions, gears, dts, layout, staging)
    return core, layout, staging


def slot(layout: object, staging: np.ndarray, gear: int, i: int, dtype: type,
         shape: tuple[int, ...]) -> np.ndarray:
    start = layout.offset(gear, i)
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return staging[start:start + n].view(dtype).reshape(shape)


# ---- the core: pad values reach the right bytes, C++ and twin agree -----------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_pad_values_reach_the_right_bytes(impl: ModuleType) -> None:
    # x [2, S, 3] float32 padded with -1.5 on axis 1; ids [S] int64 padded with 151643.
    core, layout, staging = make_core(impl, [[4], [8], [16]], [[2, -1, 3], [-1]],
                                      [[0, 1, 0], [1, 0, 0]], [np.float32, np.int64])
    core.set_padding([np.float32(-1.5).tobytes(), np.int64(151643).tobytes()], None)
    x = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    ids = np.arange(5, dtype=np.int64) + 10
    gear = core.stage([x, ids], None, True)
    assert gear == 1 and core.last_values == (8,) and core.last_request == (5,)
    got = slot(layout, staging, 1, 0, np.float32, (2, 8, 3))
    np.testing.assert_array_equal(got[:, :5], x)
    assert (got[:, 5:] == -1.5).all()
    got_ids = slot(layout, staging, 1, 1, np.int64, (8,))
    assert got_ids.tolist() == [10, 11, 12, 13, 14] + [151643] * 3
    dims = layout.dims_offset(1)
    assert staging[dims:dims + 4].view(np.int32).tolist() == [8]  # the gear's dims, not 5
    # an exact hit is itself and not padded; without pad a miss is still 145013
    assert core.stage([np.zeros((2, 16, 3), np.float32), np.zeros(16, np.int64)], None, True) == 2
    assert core.last_request == (16,)
    with pytest.raises(GearMismatchError):
        core.stage([x, ids])


def test_native_and_twin_stage_the_same_bytes() -> None:
    rng = np.random.default_rng(0)
    shapes, positions = [[-1, 3, -1], [-1, -1]], [[0, 0, 0], [0, 2, 1], [1, 0, 0], [1, 1, 1]]
    gears = [[2, 4], [4, 2], [4, 4], [8, 8]]
    made = [make_core(impl, gears, shapes, positions, [np.float16, np.uint8])
            for impl in (pair, reference)]
    pads = [np.float16(7.25).tobytes(), np.uint8(201).tobytes()]
    for core, _, _ in made:
        core.set_padding(pads, [1.0, 1.0, 3.0, 9.0])
    for _ in range(40):
        b, s = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        arrays = [rng.standard_normal((b, 3, s)).astype(np.float16),
                  rng.integers(0, 255, (b, s), dtype=np.uint8)]
        results = []
        for core, _, staging in made:
            staging[:] = 0xEE
            results.append((core.stage(arrays, None, True), core.last_values, staging.copy()))
        assert results[0][:2] == results[1][:2]
        np.testing.assert_array_equal(results[0][2], results[1][2])


@pytest.mark.parametrize("impl", IMPLS)
def test_cheapest_covering_gear_and_messages(impl: ModuleType) -> None:
    core, _, _ = make_core(impl, [[4], [8], [16]], [[-1]], [[0, 0, 0]], [np.float32])
    assert [core.cover([v]) for v in (0, 1, 4, 5, 8, 9, 16)] == [0, 0, 0, 1, 1, 2, 2]
    core.set_padding(None, [5.0, 1.0, 2.0])  # measured: gear 8 is cheaper than gear 4
    assert [core.cover([v]) for v in (1, 4, 5, 9)] == [1, 0, 1, 2]  # exact 4 stays itself
    with pytest.raises(GearMismatchError) as err:
        core.cover([17])
    assert err.value.code == "145013"
    assert "the largest gear is (16,)" in str(err.value)
    with pytest.raises(InputError, match="3 gear costs for 3 gears|cost must be finite"):
        core.set_padding(None, [1.0, float("nan"), 1.0])
    with pytest.raises(InputError, match="pad value of input 'in0' must be 4 bytes"):
        core.set_padding([b"\x00"], None)


@pytest.mark.parametrize("impl", IMPLS)
def test_covering_with_independent_values_and_tied_values(impl: ModuleType) -> None:
    # two independent values (x [A, B]): a sorted candidate list
    core, _, _ = make_core(impl, [[2, 8], [8, 2], [8, 8]], [[-1, -1]], [[0, 0, 0], [0, 1, 1]],
                           [np.float32])
    assert core.cover([2, 3]) == 0 and core.cover([3, 2]) == 1 and core.cover([3, 3]) == 2
    # tied values (x [S], m [S]) with a constant third (t [4]): the keyed table
    core, _, _ = make_core(impl, [[4, 4, 4], [9, 9, 4]], [[-1], [-1], [-1]],
                           [[0, 0, 0], [1, 0, 1], [2, 0, 2]], [np.float32] * 3)
    assert core.cover([3, 3, 4]) == 0 and core.cover([5, 5, 4]) == 1
    with pytest.raises(GearMismatchError):
        core.cover([3, 3, 5])  # the constant value cannot be padded beyond its gears


@pytest.mark.parametrize("impl", IMPLS)
def test_keyed_table_beyond_the_dense_limit(impl: ModuleType) -> None:
    core, _, _ = make_core(impl, [[10], [70000], [200000]], [[-1]], [[0, 0, 0]], [np.uint8])
    assert [core.cover([v]) for v in (1, 11, 70000, 70001, 200000)] == [0, 1, 1, 2, 2]


# ---- the executor on the null backend ------------------------------------------------------------
def null_executor(pad_values: dict | None = None, hybrid: bool = False) -> tuple[GearModel, object]:
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1;m:1,-1", dynamic_dims="4,4;8,8")
    if hybrid:
        spec = gr.GearSpec.from_atc(input_shape="x:1,-1;m:1,-1", dynamic_dims="4,4;8,8")
        import dataclasses

        spec = dataclasses.replace(spec, hybrid=True)
    model = GearModel(null_model(None, spec=spec, input_dtypes=[np.int64, np.int64],
                                 outputs={"y": [(1, 4, 3), (1, 8, 3)], "z": [(2,), (2,)]}))
    return model, model.create_executor(pad_values=pad_values)


def test_executor_pads_trims_and_reports_dims() -> None:
    model, ex = null_executor({"x": 151643})
    assert model.output_dynamic_axes == [{1: 0}, {}]
    out = ex.execute({"x": np.arange(5)[None], "m": np.ones((1, 5), np.int64)}, pad=True)
    assert [o.shape for o in out] == [(1, 5, 3), (2,)]
    assert (ex.last_gear, ex.last_dynamic_dims, ex.last_request_dims) == (1, (8, 8), (5, 5))
    session = ex._session
    x = session.staging[model.layout.offset(1, 0):][:64].view(np.int64)
    assert x.tolist() == [0, 1, 2, 3, 4, 151643, 151643, 151643]
    assert session.staged_dims(1) == (8, 8)
    views = ex.execute({"x": np.zeros((1, 3), np.int64), "m": np.zeros((1, 3), np.int64)},
                       pad=True, copy=False)
    assert views[0].shape == (1, 3, 3) and np.shares_memory(views[0], session._outputs[0][0])
    exact = ex.execute({"x": np.zeros((1, 8), np.int64), "m": np.zeros((1, 8), np.int64)},
                       pad=True)
    assert exact[0].shape == (1, 8, 3) and ex.last_request_dims == (8, 8)
    with pytest.raises(GearMismatchError, match="largest gear is"):
        ex.execute({"x": np.zeros((1, 9), np.int64), "m": np.zeros((1, 9), np.int64)}, pad=True)
    with pytest.raises(GearMismatchError):  # pad is opt-in
        ex.execute({"x": np.zeros((1, 5), np.int64), "m": np.zeros((1, 5), np.int64)})


def test_pad_values_are_checked() -> None:
    with pytest.raises(InputError, match="unknown inputs: nope"):
        null_executor({"nope": 1})
    with pytest.raises(InputError, match="float"):
        null_executor({"x": 0.5})
    with pytest.raises(InputError, match="out of range"):
        null_executor({"x": 2**64})
    _, ex = null_executor({"m": 3})
    assert ex.pad_values == {"x": 0, "m": 3}


def test_hybrid_pads_covered_requests_and_runs_uncovered_ones_dynamic() -> None:
    model, ex = null_executor(hybrid=True)
    ex.execute({"x": np.zeros((1, 5), np.int64), "m": np.zeros((1, 5), np.int64)}, pad=True)
    assert model._backend.calls[-1] == ("run_gear", 1)
    ex.execute({"x": np.zeros((1, 9), np.int64), "m": np.zeros((1, 9), np.int64)}, pad=True)
    assert model._backend.calls[-1][0] == "run_dynamic" and ex.last_gear is None
    assert ex.last_request_dims == (9, 9)


def test_set_dims_pick_the_gear_a_padded_request_runs_on() -> None:
    _, ex = null_executor()
    ex.set_dynamic_dims([8, 8])
    ex.execute({"x": np.zeros((1, 3), np.int64), "m": np.zeros((1, 3), np.int64)}, pad=True)
    assert ex.last_gear == 1  # not the cheaper gear 4: the caller chose 8
    ex.set_dynamic_dims([4, 4])
    with pytest.raises(gr.DynamicInputLengthError):
        ex.execute({"x": np.zeros((1, 5), np.int64), "m": np.zeros((1, 5), np.int64)}, pad=True)


def test_attached_profile_changes_the_chosen_gear() -> None:
    model, _ = null_executor()
    model.attach_profile([3.0, 1.0])  # gear 8 measured faster than gear 4
    ex = model.create_executor()
    ex.execute({"x": np.zeros((1, 3), np.int64), "m": np.zeros((1, 3), np.int64)}, pad=True)
    assert ex.last_gear == 1
    with pytest.raises(InputError):
        model.attach_profile({(4, 4): 1.0})  # gear (8, 8) has no latency


# ---- trimming along every dynamic axis of an output ---------------------------------------------
def conv_keep_hw_model():
    """Conv(3x3, pad 1, 3 -> 3 channels) + Relu: ``data`` [1, 3, H, W] -> ``y`` [1, 3, H, W],
    so the output follows BOTH image-size values. Zero right/bottom padding is what the
    conv's own zero pad reads anyway: a padded run trimmed back equals the exact run."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((3, 3, 3, 3)) * 0.3).astype(np.float32),
                                "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "w"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         helper.make_node("Relu", ["c"], ["y"])], "conv_keep_hw",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "H", "W"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def keep_hw_executor(tmp_path, gears: str):
    """The conv_keep_hw_model compiled for image-size ``gears`` and loaded (ORT, CPU)."""
    path = str(tmp_path / "keep_hw.gear.onnx")
    gr.compile(conv_keep_hw_model(), gr.GearSpec.from_atc(input_shape="data:1,3,-1,-1",
                                                          dynamic_image_size=gears),
               path, progress=False)
    return gr.load(path)


def exact_run(x: np.ndarray) -> np.ndarray:
    """The source model run at exactly ``x``'s shape."""
    session = ort.InferenceSession(conv_keep_hw_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"data": x})[0]


def test_a_padded_image_is_trimmed_along_both_of_its_axes(tmp_path) -> None:
    """Image-size gears (4,6), (8,10): a (3, 7) request runs on (8, 10) and its output comes
    back (1, 3, 3, 7), every dynamic axis trimmed (not only the first: (1, 3, 3, 10)), equal
    to the source model run at exactly (3, 7); with copy=True, copy=False and out=."""
    x = np.random.default_rng(0).standard_normal((1, 3, 3, 7)).astype(np.float32)
    want = exact_run(x)
    with keep_hw_executor(tmp_path, "4,6;8,10") as model:
        assert model.output_dynamic_axes == [{2: 0, 3: 1}]
        ex = model.create_executor()
        for copy in (True, False):
            (got,) = ex.execute({"data": x}, pad=True, copy=copy)
            assert (ex.last_gear, ex.last_dynamic_dims, ex.last_request_dims) == (
                1, (8, 10), (3, 7))
            assert got.shape == (1, 3, 3, 7)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # out=: the trimmed view of the caller's gear-sized array
        buf = np.empty((1, 3, 8, 10), np.float32)
        (got,) = ex.execute({"data": x}, pad=True, out={"y": buf})
        assert got.shape == (1, 3, 3, 7) and np.shares_memory(got, buf)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_square_image_gears_trim_the_width_by_the_width(tmp_path) -> None:
    """Gears (4,4), (8,8) tie H and W and ONNX inference names no axis of a Conv's output:
    the compiler's probe run (at H 4, W 5) tells which value each axis follows, so a (3, 5)
    request comes back (1, 3, 3, 5), not (1, 3, 3, 3) (the width trimmed by the height)."""
    x = np.random.default_rng(1).standard_normal((1, 3, 3, 5)).astype(np.float32)
    with keep_hw_executor(tmp_path, "4,4;8,8") as model:
        assert model.output_dynamic_axes == [{2: 0, 3: 1}]
        (got,) = model.create_executor().execute({"data": x}, pad=True)
        assert got.shape == (1, 3, 3, 5)
        np.testing.assert_allclose(got, exact_run(x), rtol=1e-5, atol=1e-6)


def test_a_tie_the_model_needs_is_kept_and_an_unchecked_one_is_said(tmp_path) -> None:
    """The same conv behind a Reshape that bakes H == W: the probe cannot run there, so the
    model needs H == W itself and trimming by either value is the same (the first is kept,
    no warning). With --verify off nothing runs at all: the first is kept and compile says
    which axes it could not check."""
    from onnx import TensorProto, helper

    from gear_runtime.compiler.build import compile_gears

    model = conv_keep_hw_model()
    g = model.graph
    # y = Relu(Conv(x)) + 0 * Reshape(x, [1, 3, H, H]) with H = Shape(x)[2]: runs only if H == W
    g.node.extend([
        helper.make_node("Shape", ["data"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["h"], axis=0),
        helper.make_node("Concat", ["one_three", "h", "h"], ["square"], axis=0),
        helper.make_node("Reshape", ["data", "square"], ["same"]),
        helper.make_node("Mul", ["same", "zero"], ["nothing"]),
        helper.make_node("Add", ["y_conv", "nothing"], ["y"])])
    g.node[1].output[0] = "y_conv"
    g.initializer.extend([helper.make_tensor("two", TensorProto.INT64, [1], [2]),
                          helper.make_tensor("one_three", TensorProto.INT64, [2], [1, 3]),
                          helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    spec = gr.GearSpec.from_atc(input_shape="data:1,3,-1,-1", dynamic_image_size="4,4;8,8")
    x = np.random.default_rng(2).standard_normal((1, 3, 3, 3)).astype(np.float32)
    for verify in (None, False):
        path = str(tmp_path / f"baked_{verify}.gear.onnx")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = compile_gears(model, spec, path, progress=False, verify=verify)
        told = [str(w.message) for w in caught if "follows value" in str(w.message)]
        if verify is None:
            assert report.unchecked_ties == [] and told == []
        else:
            assert report.unchecked_ties == told == [
                f"y axis {a} follows value 0 or 1 (equal in every gear; no run at compile "
                "time told which): padded requests trim it by value 0" for a in (2, 3)]
        with gr.load(path) as loaded:
            assert loaded.output_dynamic_axes == [{2: 0, 3: 0}]
            (got,) = loaded.create_executor().execute({"data": x}, pad=True)
            assert got.shape == (1, 3, 3, 3)


def test_ties_are_told_apart_by_inference_or_the_probe() -> None:
    """gearfile/info.py's rule on its own: an axis following one of two values equal in
    every gear follows the one inference names, else the one the probe shows, else (no
    evidence) the first; a probe size neither value has means it follows none."""
    from gear_runtime.gearfile.info import ambiguous_axes, axes_from_shapes

    gears = [(4, 4), (8, 8)]
    shapes = [[(1, 3, 4, 4)], [(1, 3, 8, 8)]]
    assert axes_from_shapes(gears, shapes) == ({2: 0, 3: 0},)  # no evidence: the first
    assert axes_from_shapes(gears, shapes, [{3: 1}]) == ({2: 0, 3: 1},)
    assert axes_from_shapes(gears, shapes, None, ((4, 5), [(1, 3, 4, 5)])) == ({2: 0, 3: 1},)
    assert axes_from_shapes(gears, shapes, None, ((4, 5), [(1, 3, 5, 4)])) == ({2: 1, 3: 0},)
    # the probe shows a size neither value has (9 = 4 + 5): it follows no single value
    assert axes_from_shapes(gears, shapes, None, ((4, 5), [(1, 3, 9, 4)])) == ({3: 0},)
    assert ambiguous_axes(gears, shapes, ({2: 0, 3: 1},), [{3: 1}]) == [(0, 2, [0, 1])]
    # untied values need neither: (4, 6), (8, 10)
    assert axes_from_shapes([(4, 6), (8, 10)], [[(1, 4, 6)], [(1, 8, 10)]]) == ({1: 0, 2: 1},)


# ---- the built-in prefill model: every length equals the source at its exact length ------------
@pytest.fixture(scope="module")
def prefill_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("prefill")
    source, config = prefill.write_example(folder)
    gear = str(folder / "prefill.gear.onnx")
    gr.compile(str(source), gr.GearSpec.from_config(str(config)), gear, progress=False)
    return str(source), gear


def test_prefill_every_length_padded_equals_the_source(prefill_files: tuple[str, str]) -> None:
    source, gear = prefill_files
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    with gr.load(gear) as model:
        assert model.output_dynamic_axes == [{1: 0}, {1: 0}]
        ex = model.create_executor(pad_values={"input_ids": 0, "attention_mask": 0})
        largest = max(g[0] for g in model.gears)
        step = 1 if os.environ.get("GEAR_RUNTIME_PURE_PYTHON") != "1" else 7
        for seq in range(1, largest + 1, step):
            feeds = prefill.inputs_for_shapes(prefill.example_shapes(seq), seed=seq)
            got = ex.execute(feeds, pad=True)
            want = session.run(None, feeds)
            assert ex.last_request_dims == (seq, seq, seq, 16)
            assert ex.last_dynamic_dims[0] == min(g[0] for g in model.gears if g[0] >= seq)
            for g, w in zip(got, want, strict=True):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        feeds = prefill.inputs_for_shapes(prefill.example_shapes(largest + 1))
        with pytest.raises(GearMismatchError) as err:
            ex.execute(feeds, pad=True)
        assert err.value.code == "145013" and f"({largest}, {largest}, {largest}, 16)" in str(
            err.value)
