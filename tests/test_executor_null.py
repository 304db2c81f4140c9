"""Executor logic on the null backend: dims, matching, staging, errors, ACL-style queries.

No runtime is involved, so these tests pin down what the executor asks the backend for.
"""

from __future__ import annotations

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.runtime.model import ACL_DYNAMIC_TENSOR_NAME, GearModel

SEED000 = dict(input_shape="data:1,1,40,-1;label:1,-1;mask:-1,-1",
               dynamic_dims="20,20,1,1;40,40,2,2;80,60,4,4")


def null_model(spec: gr.GearSpec, **kw) -> GearModel:
    return GearModel(null.open_model(None, spec=spec, **kw))


def seed_inputs(spec: gr.GearSpec, gear: int) -> dict[str, np.ndarray]:
    return {n: np.full(s, i + 1, dtype=np.float32) for i, (n, s) in
            enumerate(spec.shapes(gear).items())}


@pytest.fixture
def seed_model() -> GearModel:
    spec = gr.GearSpec.from_atc(**SEED000)
    outs = {"y": [(1, 20), (1, 40), (1, 80)], "z": [(2,), (4,), (8,)]}
    return null_model(spec, outputs=outs)


def test_every_gear_is_matched_from_the_input_shapes(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    for g in range(seed_model.gear_count):
        outs = ex.execute(seed_inputs(seed_model.spec, g))
        assert ex.last_gear == g
        assert ex.last_dynamic_dims == seed_model.gears[g]
        assert [o.shape for o in outs] == [seed_model.output_shape(g, 0),
                                           seed_model.output_shape(g, 1)]
    assert [c for c in seed_model._backend.calls if c[0] == "run_gear"] == [
        ("run_gear", 0), ("run_gear", 1), ("run_gear", 2)]


def test_staging_holds_every_input_and_the_int32_dims(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    inputs = seed_inputs(seed_model.spec, 1)
    ex.execute(inputs)
    session, layout = ex._session, seed_model.layout
    for i, name in enumerate(seed_model.input_names):
        off, n = layout.offset(1, i), layout.nbytes(1, i)
        assert n == inputs[name].nbytes
        assert bytes(session.staging[off:off + n]) == inputs[name].tobytes()
    assert session.staged_dims(1) == (40, 40, 2, 2)


def test_a_miss_raises_145013_and_never_runs(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    bad = seed_inputs(seed_model.spec, 0)
    bad["label"] = np.zeros((1, 21), np.float32)
    with pytest.raises(gr.GearMismatchError) as info:
        ex.execute(bad)
    assert info.value.code == "145013"
    assert "(20, 21, 1, 1)" in str(info.value)
    assert "(20, 20, 1, 1)" in str(info.value)  # the nearest legal gear is named
    assert not [c for c in seed_model._backend.calls if c[0] == "run_gear"]


def test_a_static_dim_mismatch_raises_145012_naming_input_and_axis(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    bad = seed_inputs(seed_model.spec, 0)
    bad["data"] = np.zeros((1, 1, 41, 20), np.float32)
    with pytest.raises(gr.DynamicInputLengthError) as info:
        ex.execute(bad)
    assert info.value.code == "145012"
    assert "'data'" in str(info.value) and "axis 2" in str(info.value)


def test_set_dynamic_dims_takes_full_dims_or_values_and_checks_them(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    ex.set_dynamic_dims([1, 1, 40, 40, 1, 40, 2, 2])  # full shapes, flattened
    assert ex.dynamic_dims == (40, 40, 2, 2)
    ex.execute(seed_inputs(seed_model.spec, 1))
    assert ex.last_gear == 1
    ex.set_dynamic_dims([80, 60, 4, 4])  # the dynamic values alone
    assert ex.dynamic_dims == (80, 60, 4, 4)
    with pytest.raises(gr.DynamicInputLengthError, match="disagree"):
        ex.execute(seed_inputs(seed_model.spec, 1))  # inputs of gear 1, dims of gear 2
    with pytest.raises(gr.GearMismatchError):
        ex.set_dynamic_dims([1, 1, 40, 41, 1, 40, 2, 2])
    with pytest.raises(gr.DynamicInputLengthError):
        ex.set_dynamic_dims([1, 1, 40, 40, 1, 40, 2])  # one dim short
    with pytest.raises(gr.DynamicInputLengthError):
        ex.set_dynamic_dims([1, 2, 40, 40, 1, 40, 2, 2])  # static dim differs
    with pytest.raises(gr.InputError):
        ex.set_dynamic_dims([])
    with pytest.raises(gr.InputError):
        ex.set_dynamic_dims(["a"])
    with pytest.raises(gr.InputError, match="integers"):
        ex.set_dynamic_dims([80, 60.5, 4, 4])  # never truncated to a gear
    with pytest.raises(gr.InputError, match="integers"):
        ex.set_dynamic_dims(["80", "60", "4", "4"])
    with pytest.raises(gr.InputError, match="integers"):
        ex.set_dynamic_dims(7)  # type: ignore[arg-type]
    ex.set_dynamic_dims(np.array([80, 60, 4, 4], dtype=np.int64))  # numpy ints are fine
    assert ex.dynamic_dims == (80, 60, 4, 4)
    ex.clear_dynamic_dims()
    ex.execute(seed_inputs(seed_model.spec, 1))
    assert ex.last_gear == 1


def test_batch_and_image_size_setters() -> None:
    batch = null_model(gr.GearSpec.from_atc(input_shape="a:-1,3;b:-1,2",
                                            dynamic_batch_size="1,8,16"))
    ex = batch.create_executor()
    ex.set_dynamic_batch_size(8)
    ex.execute({"a": np.zeros((8, 3), np.float32), "b": np.zeros((8, 2), np.float32)})
    assert ex.last_gear == 1
    with pytest.raises(gr.GearMismatchError):
        ex.set_dynamic_batch_size(9)
    with pytest.raises(gr.InputError):
        ex.set_dynamic_batch_size(0)
    with pytest.raises(gr.InputError, match="image"):
        ex.set_dynamic_image_size(4, 4)
    ex.clear_dynamic_dims()
    with pytest.raises(gr.DynamicInputLengthError):  # both batch axes must agree
        ex.execute({"a": np.zeros((8, 3), np.float32), "b": np.zeros((1, 2), np.float32)})
    image = null_model(gr.GearSpec.from_atc(input_shape="img:1,3,-1,-1",
                                            dynamic_image_size="16,16;32,48"))
    ex = image.create_executor()
    ex.set_dynamic_image_size(32, 48)
    ex.execute([np.zeros((1, 3, 32, 48), np.float32)])
    assert ex.last_gear == 1
    with pytest.raises(gr.GearMismatchError):
        ex.set_dynamic_image_size(48, 32)
    with pytest.raises(gr.InputError, match="batch"):
        ex.set_dynamic_batch_size(1)


@pytest.mark.parametrize("bad, message", [
    ({"data": 1}, "missing"),
    ({**{n: 0 for n in ("data", "label", "mask")}, "extra": 0}, "unknown: extra"),
    ([1, 2], "got 2 inputs"),
    ("data", "must be a dict"),
    (42, "must be a dict"),
])
def test_bad_inputs_are_refused_clearly(seed_model: GearModel, bad, message) -> None:
    with pytest.raises(gr.InputError, match=message):
        seed_model.create_executor().execute(bad)


def test_wrong_dtype_is_refused_not_cast(seed_model: GearModel) -> None:
    inputs = seed_inputs(seed_model.spec, 0)
    inputs["mask"] = inputs["mask"].astype(np.float64)
    with pytest.raises(gr.InputError, match="mask"):
        seed_model.create_executor().execute(inputs)


def test_non_contiguous_inputs_are_staged_correctly(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    inputs = seed_inputs(seed_model.spec, 2)
    big = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    inputs["mask"] = big[:, ::2]  # a strided view
    ex.execute(inputs)
    off, n = seed_model.layout.offset(2, 2), seed_model.layout.nbytes(2, 2)
    assert bytes(ex._session.staging[off:off + n]) == np.ascontiguousarray(big[:, ::2]).tobytes()


def test_outputs_are_copies_unless_asked(seed_model: GearModel) -> None:
    ex = seed_model.create_executor()
    a = ex.execute(seed_inputs(seed_model.spec, 0))
    b = ex.execute(seed_inputs(seed_model.spec, 0))
    assert len(a) > 1  # every output is the caller's, not only the first
    assert not any(np.shares_memory(x, y) for x, y in zip(a, b, strict=True))
    c = ex.execute(seed_inputs(seed_model.spec, 0), copy=False)
    d = ex.execute(seed_inputs(seed_model.spec, 0), copy=False)
    assert all(np.shares_memory(x, y) for x, y in zip(c, d, strict=True))


def test_acl_style_queries(seed_model: GearModel) -> None:
    m = seed_model
    assert m.get_input_dynamic_gear_count() == 3
    assert m.get_input_dynamic_dims()[0] == (1, 1, 40, 20, 1, 20, 1, 1)
    assert m.get_dynamic_batch() == [] and m.get_dynamic_hw() == []
    assert m.get_input_index_by_name(ACL_DYNAMIC_TENSOR_NAME) == 3
    assert m.get_input_index_by_name("label") == 1
    with pytest.raises(gr.InputError, match="no input 'nope'"):
        m.get_input_index_by_name("nope")
    assert m.output_shape((40, 40, 2, 2), 0) == (1, 40)
    assert m.output_size(2, 1) == 8 * 4
    with pytest.raises(gr.GearMismatchError):
        m.output_shape((1, 2, 3, 4), 0)
    with pytest.raises(gr.InputError):
        m.output_shape((40.7, 40.2, 2.9, 2.5), 0)  # never truncated to gear 1
    with pytest.raises(gr.InputError):
        m.output_shape("0", 0)
    assert m.output_shape(np.int64(1), 0) == (1, 40)
    with pytest.raises(gr.InputError):
        m.output_shape(3, 0)
    with pytest.raises(gr.InputError):
        m.output_shape(0, 5)
    batch = null_model(gr.GearSpec.from_atc(input_shape="a:-1,3", dynamic_batch_size="2,4"))
    assert batch.get_dynamic_batch() == [2, 4]
    image = null_model(gr.GearSpec.from_atc(input_shape="img:1,3,-1,-1",
                                            dynamic_image_size="16,16;32,48"))
    assert image.get_dynamic_hw() == [(16, 16), (32, 48)]


def test_load_refuses_unknown_backend_and_bad_path() -> None:
    with pytest.raises(gr.GearRuntimeError, match="unknown"):
        gr.load("x.onnx", backend="tpu")
    with pytest.raises(gr.InputError):
        gr.load(42)  # type: ignore[arg-type]
    with pytest.raises(gr.InputError, match="providerz") as info:
        gr.load("x.onnx", providerz=["CPUExecutionProvider"])
    assert "providers" in str(info.value)  # says what it does take


def test_hybrid_miss_goes_to_the_dynamic_graph_and_is_checked_like_a_hit() -> None:
    spec = gr.GearSpec.from_ge_options({
        "ge.inputShape": "x:1,-1", "ge.dynamicDims": "4;8", "ge.dynamicNodeType": "1",
        "ge.compileHybridMode": "1"})
    model = null_model(spec, outputs={"y": [(1, 4), (1, 8)]})
    assert model.hybrid
    ex = model.create_executor()
    ex.execute([np.zeros((1, 5), np.float32)])
    assert ex.last_gear is None and ex.last_dynamic_dims == (5,)
    assert model._backend.calls[-1] == ("run_dynamic", ((1, 5),))
    ex.set_dynamic_dims([1, 6])  # any dims are legal in hybrid mode ...
    with pytest.raises(gr.DynamicInputLengthError, match="disagree"):
        ex.execute([np.zeros((1, 5), np.float32)])  # ... but inputs must agree with them
    with pytest.raises(gr.DynamicInputLengthError):  # a static dim is still checked
        ex.execute([np.zeros((2, 5), np.float32)])
    ex.clear_dynamic_dims()
    with pytest.raises(gr.InputError, match="dtype"):
        ex.execute([np.zeros((1, 5), np.float64)])
    ex.execute([np.zeros((1, 8), np.float32)])
    assert ex.last_gear == 1


def test_copy_true_owns_every_output_of_the_dynamic_graph(monkeypatch) -> None:
    """A hybrid miss, as a backend may answer it: with its own buffers, reused every run
    (valid until the next one, as run_gear's). execute() copies EVERY output for the caller
    (the sink path returns through the same copy); copy=False hands the buffers out."""
    spec = gr.GearSpec.from_ge_options({
        "ge.inputShape": "x:1,-1", "ge.dynamicDims": "4;8", "ge.dynamicNodeType": "1",
        "ge.compileHybridMode": "1"})
    ex = null_model(spec, outputs={"y": [(1, 4), (1, 8)], "z": [(2,), (4,)]}).create_executor()
    buffers = [np.zeros((1, 5), np.float32), np.zeros((3,), np.float32)]

    def run_dynamic(arrays):
        for b in buffers:
            b += 1  # the next run writes the same memory
        return buffers

    monkeypatch.setattr(ex._session, "run_dynamic", run_dynamic)
    kept = ex.execute([np.zeros((1, 5), np.float32)])
    ex.execute([np.zeros((1, 5), np.float32)])
    assert [k.tolist() for k in kept] == [[[1.0] * 5], [1.0] * 3]  # not the second run's 2s
    assert not any(np.shares_memory(k, b) for k in kept for b in buffers)
    views = ex.execute([np.zeros((1, 5), np.float32)], copy=False)
    assert all(v is b for v, b in zip(views, buffers, strict=True))


def test_a_backend_whose_module_is_missing_says_what_to_install(monkeypatch) -> None:
    from gear_runtime import backends

    monkeypatch.setitem(backends.BACKENDS, "ghost", "ghost_runtime_module_xyz")
    with pytest.raises(gr.BackendUnavailableError, match="pip install ghost_runtime_module_xyz"):
        gr.load("x.onnx", backend="ghost")


@pytest.mark.parametrize("alignment", [64, 128, 4096])
def test_aligned_buffer_is_aligned_zeroed_and_exactly_sized(alignment) -> None:
    """aligned_buffer promises what pinned allocators give: its data pointer on an
    ``alignment`` boundary (the staging layout's offsets assume it), zeros, nbytes exactly."""
    from gear_runtime.backends.base import aligned_buffer

    for nbytes in (0, 1, 63, 64, 1000, 1 << 16):
        for _ in range(8):  # numpy's allocations land at different offsets
            buf = aligned_buffer(nbytes, alignment) if alignment != 64 else aligned_buffer(nbytes)
            assert buf.ctypes.data % alignment == 0, (nbytes, buf.ctypes.data)
            assert buf.nbytes == nbytes and buf.dtype == np.uint8 and buf.flags.c_contiguous
            assert not buf.any()
