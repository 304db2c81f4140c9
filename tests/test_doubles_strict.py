"""The doubles are at least as strict as the real APIs, one test per rule;
tests/doubles/README.md cites the real source of each."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from doubles import fake_acl, fake_mslite

from gear_runtime.backends import acl as acl_backend
from gear_runtime.backends import mindspore_lite as ms_backend

BATCH_INPUTS = [("x", [-1, 3, 4], "float32"), ("ids", [-1, 2], "int64")]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> fake_acl.FakeAcl:
    double = fake_acl.FakeAcl()
    monkeypatch.setitem(sys.modules, "acl", double.module)
    return double


def _loaded(fake: fake_acl.FakeAcl, tmp_path, dims_dtype: str = "int32"):
    """A batch model loaded in the double, a dataset for it with buffers of ``sizes``."""
    acl = fake.module
    path = fake_acl.write_om(tmp_path / "b.om", BATCH_INPUTS, "batch", [(1,), (4,)], dims_dtype)
    acl.init()
    acl.rt.set_device(0)
    model_id, ret = acl.mdl.load_from_file(path)
    assert ret == 0
    return acl, model_id


def _dataset(acl, sizes: list[int]) -> int:
    ds = acl.mdl.create_dataset()
    for size in sizes:
        ptr, ret = acl.rt.malloc(size, 0)
        assert ret == 0
        acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptr, size))
    return ds


def _outputs(acl) -> int:
    return _dataset(acl, [4 * 3 * 4 * 4, 4 * (4 * 12 + 4 * 2)])


@pytest.mark.parametrize("call, args", [
    ("rt.malloc", (np.int64(16), 0)),
    ("rt.malloc_host", (np.uint64(16),)),
    ("rt.memcpy", (1, np.int64(4), 2, 4, 1)),
    ("create_data_buffer", (np.int64(1), 4)),
])
def test_pyacl_refuses_numpy_ints_where_it_parses_k(fake, call, args) -> None:
    """PyArg_ParseTuple "k"/"K" takes Python ints only: a TypeError before any ACL call."""
    fake.module.init()
    space, _, name = call.rpartition(".")
    fn = getattr(getattr(fake.module, space) if space else fake.module, name)
    with pytest.raises(TypeError, match="args parse failed"):
        fn(*args)
    assert all(c[0] != call for c in fake.state.calls)


def test_pyacl_refuses_a_numpy_batch_value(fake, tmp_path) -> None:
    acl, model_id = _loaded(fake, tmp_path)
    ds = _dataset(acl, [48 * 4, 16 * 4, 8])
    with pytest.raises(TypeError, match="args parse failed"):
        acl.mdl.set_dynamic_batch_size(model_id, ds, 2, np.int64(4))
    assert acl.mdl.set_dynamic_batch_size(model_id, ds, 2, 4) == 0


def test_batch_checks_the_buffer_length_before_the_gear(fake, tmp_path) -> None:
    acl, model_id = _loaded(fake, tmp_path)
    ds = _dataset(acl, [48 * 4, 16 * 4, 2])  # a dims buffer under 4 bytes
    assert acl.mdl.set_dynamic_batch_size(model_id, ds, 2, 3) == \
        fake_acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID  # not 145013 for the bad batch 3


def test_a_dataset_without_set_is_static_and_checked_against_the_largest_size(
        fake, tmp_path) -> None:
    """Without set_*, GE runs the dataset as static: each buffer may be at most 64 bytes
    under the model's (largest-gear) size (CheckUserAndModelSize)."""
    acl, model_id = _loaded(fake, tmp_path)
    small = _dataset(acl, [1 * 12 * 4, 1 * 2 * 8, 4])  # gear-1 sizes, no set_*
    ret = acl.mdl.execute(model_id, small, _outputs(acl))
    assert ret == fake_acl.ACL_ERROR_GE_PARAM_INVALID
    acl.mdl.set_dynamic_batch_size(model_id, small, 2, 1)
    assert acl.mdl.execute(model_id, small, _outputs(acl)) == 0  # with set_*: dynamic, fine


def test_a_value_that_matches_no_gear_silently_runs_gear_0(fake, tmp_path) -> None:
    acl, model_id = _loaded(fake, tmp_path)
    full = _dataset(acl, [4 * 12 * 4, 4 * 2 * 8, 4])  # largest sizes, dims buffer zeroed
    assert acl.mdl.execute(model_id, full, _outputs(acl)) == 0  # no error, as GE
    assert fake.state.executions[-1] == (model_id, 0)


def test_the_acl_backend_passes_python_ints_and_sets_every_dataset(fake, tmp_path) -> None:
    """The backend through the stricter double: every gear right (the rules above hold)."""
    from doubles.layout import plan_layout, stage

    path = fake_acl.write_om(tmp_path / "b.om", BATCH_INPUTS, "batch", [(1,), (4,)])
    model = acl_backend.open_model(path)
    info = model.info
    layout = plan_layout(info.input_nbytes(), info.spec.values_per_gear, 131072,
                         **model.layout_options)
    session = model.create_session(layout)
    for g in (1, 0, 1):
        arrays = [np.full(s, g + 1, dt) for s, dt in zip(info.spec.shapes(g).values(),
                                                         info.input_dtypes, strict=True)]
        stage(session.staging, layout, info.spec, info.input_dtypes, g, arrays)
        y, _ = session.run_gear(g)
        np.testing.assert_array_equal(y, arrays[0] * 2 + 1)
        assert fake.state.executions[-1][1] == g
    model.close()


# ---- MindSpore Lite ----------------------------------------------------------------------------
@pytest.fixture
def mslite(monkeypatch: pytest.MonkeyPatch) -> fake_mslite.FakeMslite:
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    return double


def _tensor(mslite: fake_mslite.FakeMslite, shape: list[int]):
    return mslite.module.Tensor(fake_mslite._TensorImpl("t", shape, np.float32))


def test_mslite_get_data_of_an_empty_tensor_is_an_empty_float64_array(mslite) -> None:
    got = _tensor(mslite, [0, 4]).get_data_to_numpy()
    assert got.dtype == np.float64 and got.shape == (0,)  # tensor_pybind.cc: py::array()


def test_the_mslite_backend_makes_empty_outputs_itself(mslite) -> None:
    got = ms_backend._tensor_data(_tensor(mslite, [0, 4]))
    assert got.dtype == np.float32 and got.shape == (0, 4)


def test_mslite_leaves_a_fortran_ordered_input_unset(mslite) -> None:
    tensor = _tensor(mslite, [2, 3])
    tensor.set_data_from_numpy(np.ones((2, 3), np.float32))
    tensor.set_data_from_numpy(np.asfortranarray(np.full((2, 3), 7, np.float32)))
    np.testing.assert_array_equal(tensor.get_data_to_numpy(), np.ones((2, 3)))  # still the old
    strided = np.full((2, 6), 5, np.float32)[:, ::2]  # neither C nor F: made contiguous
    tensor.set_data_from_numpy(strided)
    np.testing.assert_array_equal(tensor.get_data_to_numpy(), np.full((2, 3), 5))
