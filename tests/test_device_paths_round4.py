"""Device-path findings of issue 49 (round 4), on the strict doubles:

1. MindSpore Lite state writes (set_state, reset_state) from a thread with no ACL device
   set, or another device set, land or raise; a null device tensor is a BackendError;
2. a DeviceBuffer kept from ``ex.state[name]`` across a run of its executor is stale and
   refused as ``out=`` / ``set_state`` (acl, mindspore_lite, ORT CUDA's DeviceState);
3. a handoff holds the target state's lock from the check through the run: the target's
   close waits (acl, mindspore_lite);
4. acl ``_out_bindable`` gives GE's real reason (davinci_model.cc CheckUserAndModelSize).
"""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from doubles import fake_acl, fake_mslite

import gear_runtime as gr
from gear_runtime.backends.acl.session import AclSession
from gear_runtime.errors import BackendError, InputError

DECODE = [("x", [2, 3, 4], "float32"), ("ids", [2, 2], "int64")]
PREFILL = [("kv", [2, 3, 4], "float32"), ("ids", [-1, 2], "int64")]
ACL_CONFIG = ("[acl_build_options]\ninput_shape=\"kv:2,3,4;ids:-1,2\"\n"
              "ge.dynamicDims=\"1;2;4\"\n")
FEEDS = {"kv": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
         "ids": np.full((2, 2), 3, np.int64)}
IDS = {"ids": np.zeros((2, 2), np.int64)}


@pytest.fixture
def ms(monkeypatch: pytest.MonkeyPatch) -> fake_mslite.FakeMslite:
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    return double


@pytest.fixture
def acl(monkeypatch: pytest.MonkeyPatch) -> fake_acl.FakeAcl:
    double = fake_acl.FakeAcl(device_count=2)
    monkeypatch.setitem(sys.modules, "acl", double.module)
    return double


def ms_pair(tmp_path, device_id=0):
    decode = fake_mslite.write_mindir(tmp_path / "decode.mindir", DECODE, [[[2, 3, 4], [2, 2]]])
    prefill = fake_mslite.write_mindir(tmp_path / "prefill.mindir", PREFILL,
                                       [[[2, 3, 4], [n, 2]] for n in (1, 2, 4)])
    (tmp_path / "prefill.ini").write_text(ACL_CONFIG)
    dec = gr.load(decode, backend="mindspore_lite", device_id=device_id)
    pre = gr.load(prefill, backend="mindspore_lite", config=str(tmp_path / "prefill.ini"),
                  device_id=device_id)
    return dec, pre


def acl_pair(tmp_path):
    decode = fake_acl.write_om(tmp_path / "decode.om", DECODE, "static", [()])
    prefill = fake_acl.write_om(tmp_path / "prefill.om", PREFILL, "batch", [(1,), (2,), (4,)])
    return gr.load(decode, backend="acl"), gr.load(prefill, backend="acl")


def on_new_thread(fn):
    """``fn()`` on a fresh thread (a server pool thread: no ACL device set on it yet)."""
    out: list = []

    def body() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            out.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    (got,) = out
    if isinstance(got, BaseException):
        raise got
    return got


# ---- 1. MindSpore Lite: every state write lands or raises -----------------------------------
def test_the_double_refuses_a_device_copy_on_a_thread_with_no_device(ms):
    """tensor_pybind.cc SetTensorNumpyData -> CopyHostDataToDevice -> aclrtMemcpy with no
    aclrtSetDevice (acl_allocator.cc); MemCopySync without a context fails (hicann/runtime
    api_impl.cc): the binding returns False, tensor.py ignores it (returns None)."""
    mslite = ms.module
    tensor = mslite.Tensor(None, [2, 3], mslite.DataType.FLOAT32, "ascend:0")  # sets device 0
    ones = np.ones((2, 3), np.float32)
    assert tensor._tensor.set_data_from_numpy(ones) is True
    assert on_new_thread(lambda: tensor._tensor.set_data_from_numpy(ones * 5)) is False
    assert on_new_thread(lambda: tensor.set_data_from_numpy(ones * 5)) is None
    np.testing.assert_array_equal(tensor.get_data_to_numpy(), ones)  # nothing landed


def test_the_double_returns_null_when_device_memory_runs_out(ms):
    mslite = ms.module
    ms.state.malloc_fails = True
    tensor = mslite.Tensor(None, [2, 3], mslite.DataType.FLOAT32, "ascend:0")
    assert tensor._tensor is None  # create_tensor returned nullptr; tensor.py stores it
    with pytest.raises(AttributeError):
        tensor.set_data_from_numpy(np.ones((2, 3), np.float32))


def test_reset_state_on_a_pool_thread_zeroes_the_state(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    ex = dec.create_executor(state={"x": "y"})
    ex.set_state("x", np.ones((2, 3, 4), np.float32))
    ex.execute(IDS)  # both buffers now hold data of this sequence
    on_new_thread(ex.reset_state)
    np.testing.assert_array_equal(ex.state["x"].numpy(), np.zeros((2, 3, 4), np.float32))
    ex.execute(IDS)
    np.testing.assert_array_equal(ex.state["x"].numpy(), np.ones((2, 3, 4), np.float32))


def test_set_state_on_a_pool_thread_lands(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    ex = dec.create_executor(state={"x": "y"})
    x0 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    on_new_thread(lambda: ex.set_state("x", x0))
    np.testing.assert_array_equal(ex.state["x"].numpy(), x0)


def test_set_state_lands_on_the_tensors_device_not_the_threads(ms, tmp_path):
    """Two NPUs in one process: the calling thread's current device is 0 (it built a
    model there), the state lives on device 1."""
    dec1, _ = ms_pair(tmp_path, device_id=1)
    ex = dec1.create_executor(state={"x": "y"})
    x0 = np.full((2, 3, 4), 7, np.float32)

    def on_device_0() -> None:
        mslite = ms.module
        mslite.Tensor(None, [1], mslite.DataType.UINT8, "ascend:0")  # aclrtSetDevice(0)
        ex.set_state("x", x0)

    on_new_thread(on_device_0)
    np.testing.assert_array_equal(ex.state["x"].numpy(), x0)


def test_a_failed_state_copy_is_a_backend_error(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    ex = dec.create_executor(state={"x": "y"})
    ms.state.h2d_fails = True  # aclrtMemcpy fails: SetTensorNumpyData returns false
    with pytest.raises(BackendError, match=r"set_data_from_numpy.*returned False"):
        ex.set_state("x", np.ones((2, 3, 4), np.float32))
    with pytest.raises(BackendError, match=r"set_data_from_numpy.*returned False"):
        ex.reset_state()


def test_a_null_device_tensor_is_a_backend_error(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    ms.state.malloc_fails = True
    with pytest.raises(BackendError, match=r"Tensor\(device=\).*null.*device 0"):
        dec.create_executor(state={"x": "y"})


# ---- 2. a DeviceBuffer kept across a run of its executor is stale ----------------------------
def test_a_stale_acl_buffer_is_refused_as_out_and_as_set_state(acl, tmp_path):
    dec, pre = acl_pair(tmp_path)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    other = dec.create_executor(state={"x": "y"})
    kept = dex.state["x"]
    dex.execute(IDS)  # swaps: kept is now the buffer dex's next run writes
    with pytest.raises(InputError, match=r"take ex.state\[name\] again after the run"):
        pex.execute(FEEDS, out={"y": kept})
    with pytest.raises(InputError, match=r"take ex.state\[name\] again after the run"):
        other.set_state("x", kept)
    pex.execute(FEEDS, out={"y": dex.state["x"]})  # taken fresh: accepted
    (cat,) = dex.execute({"ids": FEEDS["ids"]})
    np.testing.assert_array_equal(cat[:24], (FEEDS["kv"] * 2 + 1).ravel())


def test_a_stale_mindspore_lite_buffer_is_refused(ms, tmp_path):
    dec, pre = ms_pair(tmp_path)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    kept = dex.state["x"]
    dex.execute(IDS)
    with pytest.raises(InputError, match=r"take ex.state\[name\] again after the run"):
        pex.execute(FEEDS, out={"y": kept})
    with pytest.raises(InputError, match=r"take ex.state\[name\] again after the run"):
        dec.create_executor(state={"x": "y"}).set_state("x", kept)


def test_a_stale_ort_cuda_buffer_is_refused():
    """ORT CUDA's DeviceState (the CPU device stands in for CUDA) inherits the rule."""
    from gear_runtime.backends.onnxruntime_cuda import DeviceState
    plan = SimpleNamespace(pairs=[SimpleNamespace(shape=(2,), dtype=np.dtype(np.float32))])
    state = DeviceState(plan, ("cpu", 0))
    kept = state.read(0)
    kept.check_genuine("out['y']")
    state.swap()
    with pytest.raises(InputError, match=r"out\['y'\].*take ex.state\[name\] again"):
        kept.check_genuine("out['y']")
    state.read(0).check_genuine("out['y']")


# ---- 3. the target's close waits for a handoff in flight --------------------------------------
def _close_during(run_call_owner, name, close, run):
    """Patch ``run_call_owner.name`` (the runtime's run call) to start ``close`` on another
    thread and give it 0.3 s before running; returns whether close was still waiting."""
    waited: list[bool] = []
    original = getattr(run_call_owner, name)
    closer = threading.Thread(target=close)

    def hooked(*args, **kwargs):
        if not waited:
            closer.start()
            closer.join(0.3)
            waited.append(closer.is_alive())
        return original(*args, **kwargs)

    setattr(run_call_owner, name, hooked)
    try:
        result = run()
    finally:
        setattr(run_call_owner, name, original)
        closer.join()
    return waited == [True], result


def test_an_acl_handoff_holds_the_decode_state_until_its_run_ends(acl, tmp_path):
    dec, pre = acl_pair(tmp_path)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    waited, _ = _close_during(acl.module.mdl, "execute", dex.close,
                              lambda: pex.execute(FEEDS, out={"y": dex.state["x"]}))
    assert waited, "the decode executor's close freed its state under the handoff's run"


def test_a_mindspore_lite_handoff_holds_the_decode_state_until_its_run_ends(ms, tmp_path):
    dec, pre = ms_pair(tmp_path)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    model = pex.session._model.model
    waited, _ = _close_during(model, "predict", dex.close,
                              lambda: pex.execute(FEEDS, out={"y": dex.state["x"]}))
    assert waited, "the decode executor's close dropped its state under the handoff's run"


def test_acl_set_state_from_another_state_holds_its_lock(acl, tmp_path):
    dec, _ = acl_pair(tmp_path)
    src, dst = dec.create_executor(state={"x": "y"}), dec.create_executor(state={"x": "y"})
    src.set_state("x", np.full((2, 3, 4), 4, np.float32))
    dst.set_state("x", src.state["x"])
    np.testing.assert_array_equal(dst.state["x"].numpy(), np.full((2, 3, 4), 4, np.float32))


# ---- 4. the reason _out_bindable gives ------------------------------------------------------
def test_out_bindable_names_ges_real_check():
    doc = " ".join(AclSession._out_bindable.__doc__.split())
    assert "davinci_model.cc" in doc and "64" in doc and "skips" in doc
