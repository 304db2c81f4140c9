"""Resident state on a device backend handed over on the device: ``ex.state[name]`` is a
:class:`~gear_runtime.backends.base.DeviceBuffer` there, ``out=`` of another executor on the
same device writes into it (the prefill -> decode handoff of seed 004, no host copy of the
cache), ``set_state`` copies from one device to device, ``.numpy()`` copies it out.

Shown on the pyACL double (tests/doubles/fake_acl.py), which counts every memcpy by kind and
refuses buffers of another device (no peer access), as the NPU would fault on them.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from doubles import fake_acl, fake_mslite
from onnx import TensorProto, helper
from ort_device_support import graph_ids, on_host_device

import gear_runtime as gr
from gear_runtime.backends.base import DeviceBuffer
from gear_runtime.errors import ClosedError, InputError
from gear_runtime.examples import causal_lm
from gear_runtime.tools import generate

H2D, D2H = fake_acl.ACL_MEMCPY_HOST_TO_DEVICE, fake_acl.ACL_MEMCPY_DEVICE_TO_HOST
D2D = fake_acl.ACL_MEMCPY_DEVICE_TO_DEVICE

# The decode step: a static model whose state x (2, 3, 4) the double's rule y = 2x + 1 feeds.
DECODE = [("x", [2, 3, 4], "float32"), ("ids", [2, 2], "int64")]
# A prefill at batch gears whose first output y = 2 kv + 1 is (2, 3, 4) at EVERY gear (the
# seed's cache padded to max_seq): its buffer holds the model's output size, so it is bound.
PREFILL_FIXED = [("kv", [2, 3, 4], "float32"), ("ids", [-1, 2], "int64")]
# A prefill whose y follows the batch gear: at gear 2 it is the state's shape but smaller
# than the model's output size (gear 4's), which ACL checks a buffer against: copied instead.
PREFILL_GROWING = [("kv", [-1, 3, 4], "float32"), ("ids", [-1, 2], "int64")]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> fake_acl.FakeAcl:
    double = fake_acl.FakeAcl(device_count=2)
    monkeypatch.setitem(sys.modules, "acl", double.module)
    return double


@pytest.fixture
def static_cpu_model(tmp_path) -> str:
    """A static ONNX model (y = x + 1, x float32 [2, 3, 4]) for the CPU backend."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "g", [x], [y],
                              [one])
    path = tmp_path / "static.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), path)
    return str(path)


def pair(tmp_path, prefill_inputs, gears=((1,), (2,), (4,)), device_id=0):
    decode = fake_acl.write_om(tmp_path / "decode.om", DECODE, "static", [()])
    prefill = fake_acl.write_om(tmp_path / "prefill.om", prefill_inputs, "batch", list(gears))
    return (gr.load(decode, backend="acl"), gr.load(prefill, backend="acl",
                                                     device_id=device_id))


def copies_during(fake, fn):
    before = len(fake.state.memcpys)
    result = fn()
    return result, fake.state.memcpys[before:]


def test_the_state_of_a_device_executor_is_a_device_buffer(fake, tmp_path):
    dec, _ = pair(tmp_path, PREFILL_FIXED)
    dex = dec.create_executor(state={"x": "y"})
    buf = dex.state["x"]
    assert isinstance(buf, DeviceBuffer)
    assert (buf.backend, buf.device_id, buf.shape, buf.dtype) == ("acl", 0, (2, 3, 4),
                                                                   np.float32)
    x0 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    dex.set_state("x", x0)
    host, copies = copies_during(fake, buf.numpy)
    np.testing.assert_array_equal(host, x0)
    assert [c.kind for c in copies] == [D2H]  # .numpy() is one device-to-host copy
    np.testing.assert_array_equal(np.asarray(dex.state["x"]), x0)


def test_a_prefill_writes_its_cache_into_the_decode_state_on_the_device(fake, tmp_path):
    """The handoff: the prefill's output dataset points at the decode's state buffer, so
    its cache crosses no PCIe at all (one H2D: the prefill's merged inputs; one D2H: its
    other output), and the decode's next step reads it."""
    dec, pre = pair(tmp_path, PREFILL_FIXED)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    kv = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.full((2, 2), 3, np.int64)
    target = dex.state["x"]
    (y, cat), copies = copies_during(fake, lambda: pex.execute({"kv": kv, "ids": ids},
                                                               out={"y": target}))
    assert y is target  # returned in its place
    np.testing.assert_array_equal(cat, np.concatenate([kv.ravel(), ids.ravel()]))
    assert [c.kind for c in copies] == [H2D, D2H]  # inputs in, cat out; the cache: nothing
    assert all(c.count != kv.nbytes for c in copies)
    np.testing.assert_array_equal(dex.state["x"].numpy(), kv * 2 + 1)
    (cat,), copies = copies_during(fake, lambda: dex.execute({"ids": ids}))
    np.testing.assert_array_equal(cat[:24], (kv * 2 + 1).ravel())  # the decode read it
    assert [c.kind for c in copies] == [H2D, D2H]
    np.testing.assert_array_equal(dex.state["x"].numpy(), (kv * 2 + 1) * 2 + 1)


def test_an_output_smaller_than_the_models_size_is_copied_on_the_device(fake, tmp_path):
    """ACL checks an output buffer against the model's size (the largest gear's): a state
    that holds gear 2's output only is filled by ONE device-to-device copy after the run,
    still no host copy."""
    dec, pre = pair(tmp_path, PREFILL_GROWING)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    kv = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.ones((2, 2), np.int64)
    _, copies = copies_during(fake, lambda: pex.execute({"kv": kv, "ids": ids},
                                                        out={"y": dex.state["x"]}))
    assert [c.kind for c in copies] == [H2D, D2D, D2H]
    assert [c.count for c in copies if c.kind == D2D] == [kv.nbytes]
    np.testing.assert_array_equal(dex.state["x"].numpy(), kv * 2 + 1)
    # the other gears' outputs do not fit the state: refused before any run
    with pytest.raises(InputError, match=r"out\['y'\] is .*float32 \[2, 3, 4\].*gear 0"):
        pex.execute({"kv": kv[:1], "ids": ids[:1]}, out={"y": dex.state["x"]})


def test_set_state_from_a_device_buffer_is_one_device_copy(fake, tmp_path):
    dec, _ = pair(tmp_path, PREFILL_FIXED)
    a, b = dec.create_executor(state={"x": "y"}), dec.create_executor(state={"x": "y"})
    x0 = np.full((2, 3, 4), 5, np.float32)
    a.set_state("x", x0)
    _, copies = copies_during(fake, lambda: b.set_state("x", a.state["x"]))
    assert [(c.kind, c.count) for c in copies] == [(D2D, x0.nbytes)]
    np.testing.assert_array_equal(b.state["x"].numpy(), x0)
    with pytest.raises(InputError, match=r"set_state\('x'\)'s value is DeviceBuffer.*no "
                                         r"device buffer gear_runtime handed out"):
        a.set_state("x", DeviceBuffer(a.state["x"]._owner, "acl", 0, a.state["x"].handle,
                                      (24,), np.float32))


def test_set_state_refuses_a_device_buffer_of_another_shape(fake, tmp_path):
    """A device buffer of another shape (another model's state, of one dtype) is refused
    naming both shapes, before any copy: never a short copy leaving stale rows, nor a long
    one past the buffer."""
    dec, _ = pair(tmp_path, PREFILL_FIXED)
    small = gr.load(fake_acl.write_om(tmp_path / "small.om", [("x", [1, 3, 4], "float32"),
                                                              ("ids", [1, 2], "int64")],
                                      "static", [()]), backend="acl")
    a, b = dec.create_executor(state={"x": "y"}), small.create_executor(state={"x": "y"})
    a.set_state("x", np.full((2, 3, 4), 5, np.float32))
    for target, value, want in ((a, b.state["x"], r"float32 \[2, 3, 4\]"),
                                (b, a.state["x"], r"float32 \[1, 3, 4\]")):
        with pytest.raises(InputError, match=rf"set_state\('x'\): got .*, the state is {want}"):
            target.set_state("x", value)
    assert not [c for c in fake.state.memcpys if c.kind == D2D]  # nothing was copied
    np.testing.assert_array_equal(a.state["x"].numpy(), np.full((2, 3, 4), 5, np.float32))


def test_a_device_buffer_made_by_hand_is_refused_before_any_run(fake, tmp_path):
    """A DeviceBuffer is only what an executor handed out: one made by hand (another address
    in the state's block, or the right address at another shape) would have the run write
    anywhere on the device; refused, nothing ran, nothing copied."""
    dec, pre = pair(tmp_path, PREFILL_FIXED)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    real = dex.state["x"]
    feeds = {"kv": np.zeros((2, 3, 4), np.float32), "ids": np.zeros((2, 2), np.int64)}
    runs, copies = len(fake.state.executions), len(fake.state.memcpys)
    for forged in (DeviceBuffer(real._owner, "acl", 0, real.handle + 64, (2, 3, 4), np.float32),
                   DeviceBuffer(object(), "acl", 0, real.handle, (2, 3, 4), np.float32)):
        with pytest.raises(InputError, match="no device buffer gear_runtime handed out"):
            pex.execute(feeds, out={"y": forged})
    assert len(fake.state.executions) == runs
    assert len(fake.state.memcpys) == copies  # refused before anything crossed


def test_an_executors_own_state_is_no_output_of_its_run(tmp_path):
    """An executor writing an output into the state its own run reads would read and write
    one buffer in one run: refused before the run (ORT's device path over host memory; a
    model whose other output has the state's shape)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("y", "w")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "t"], ["y"]),
                               helper.make_node("Mul", ["x", "t"], ["w"])], "g", [x, t], outs)
    path = tmp_path / "twin.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), path)
    ex = on_host_device(gr.load(str(path))).create_executor(state={"x": "y"})
    feeds = {"t": np.ones((2, 3), np.float32)}
    with pytest.raises(InputError, match=r"out\['w'\] is this executor's own state"):
        ex.execute(feeds, out={"w": ex.state["x"]})
    other = on_host_device(gr.load(str(path))).create_executor(state={"x": "y"})
    ex.set_state("x", np.full((2, 3), 3, np.float32))
    (w,) = ex.execute(feeds, out={"w": other.state["x"]})  # another executor's: bound there
    np.testing.assert_array_equal(other.state["x"].numpy(), np.full((2, 3), 3, np.float32))
    assert w is not None


def test_device_memory_of_another_device_or_a_host_executor_is_refused(fake, tmp_path):
    """An output lands only in memory of the device its executor runs on: another NPU's
    buffer (no peer access) or a host backend's executor is refused before the run, naming
    the buffer and what to do; nothing ran."""
    dec, pre = pair(tmp_path, PREFILL_FIXED, device_id=1)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    feeds = {"kv": np.zeros((2, 3, 4), np.float32), "ids": np.zeros((2, 2), np.int64)}
    runs = len(fake.state.executions)
    with pytest.raises(InputError, match=r"out\['y'\] is DeviceBuffer\(acl device 0.*"
                                         r"runs on acl device 1.*set_state"):
        pex.execute(feeds, out={"y": dex.state["x"]})
    assert len(fake.state.executions) == runs


def test_a_host_backend_refuses_a_device_buffer_as_out(fake, tmp_path, static_cpu_model):
    dec, _ = pair(tmp_path, PREFILL_FIXED)
    dex = dec.create_executor(state={"x": "y"})
    cpu = gr.load(static_cpu_model).create_executor()
    with pytest.raises(InputError, match=r"out\['y'\] is DeviceBuffer\(acl.*writes its "
                                         r"outputs to host memory.*set_state"):
        cpu.execute({"x": np.zeros((2, 3, 4), np.float32)}, out={"y": dex.state["x"]})


def test_a_buffer_of_a_closed_executor_is_refused(fake, tmp_path):
    dec, pre = pair(tmp_path, PREFILL_FIXED)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    buf = dex.state["x"]
    dex.close()
    assert not buf.alive and "freed" in repr(buf)
    feeds = {"kv": np.zeros((2, 3, 4), np.float32), "ids": np.zeros((2, 2), np.int64)}
    with pytest.raises(ClosedError, match="closed"):
        pex.execute(feeds, out={"y": buf})
    with pytest.raises(ClosedError):
        buf.numpy()


def test_a_failed_handoff_leaves_nothing_half_bound(fake, tmp_path):
    """The run's own datasets are untouched by a handoff: a failed one raises and the next
    plain run copies its outputs to the host as before; no dataset or buffer leaks."""
    dec, pre = pair(tmp_path, PREFILL_FIXED)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    feeds = {"kv": np.ones((2, 3, 4), np.float32), "ids": np.zeros((2, 2), np.int64)}
    loaded = fake.state.leaks()
    fake.state.fail["mdl.execute"] = 507011
    with pytest.raises(gr.GearRuntimeError, match="507011"):
        pex.execute(feeds, out={"y": dex.state["x"]})
    del fake.state.fail["mdl.execute"]
    assert fake.state.leaks() == loaded
    y, _ = pex.execute(feeds)
    np.testing.assert_array_equal(y, np.full((2, 3, 4), 3, np.float32))
    np.testing.assert_array_equal(dex.state["x"].numpy(), np.zeros((2, 3, 4), np.float32))


# ---- MindSpore Lite: device tensors on the default (ACL) provider ---------------------------
@pytest.fixture
def ms(monkeypatch: pytest.MonkeyPatch) -> fake_mslite.FakeMslite:
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    return double


GE_CONFIG = ("[ge_graph_options]\nge.inputShape=kv:2,3,4;ids:-1,2\n"
             "ge.dynamicDims=1;2;4\n")
ACL_CONFIG = ("[acl_build_options]\ninput_shape=\"kv:2,3,4;ids:-1,2\"\n"
              "ge.dynamicDims=\"1;2;4\"\n")


def ms_pair(tmp_path, prefill_config=ACL_CONFIG, device_id=0, decode_config=None):
    """A static decode MindIR (its gears: none, its inputs static) and a prefill MindIR at
    seq gears whose y (2, 3, 4) feeds the decode's state x."""
    decode = fake_mslite.write_mindir(tmp_path / "decode.mindir", DECODE,
                                      [[[2, 3, 4], [2, 2]]])
    prefill = fake_mslite.write_mindir(tmp_path / "prefill.mindir", PREFILL_FIXED,
                                       [[[2, 3, 4], [n, 2]] for n in (1, 2, 4)])
    (tmp_path / "prefill.ini").write_text(prefill_config)
    dec_opts = {} if decode_config is None else {"config": write_text(tmp_path / "decode.ini",
                                                                      decode_config)}
    dec = gr.load(decode, backend="mindspore_lite", device_id=device_id, **dec_opts)
    pre = gr.load(prefill, backend="mindspore_lite", config=str(tmp_path / "prefill.ini"),
                  device_id=device_id)
    return dec, pre


def write_text(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def ms_copies(ms, fn):
    before = len(ms.state.copies)
    result = fn()
    return result, ms.state.copies[before:]


def test_a_static_mindir_loads_as_it_is(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    assert dec.mode == "static" and dec.gears == [()]


def test_mindspore_lite_state_lives_in_device_tensors(ms, tmp_path):
    """A decode step passes the state's device tensors to predict(inputs, outputs): only
    its other input crosses to the device and its other output back; the state never."""
    dec, _ = ms_pair(tmp_path, device_id=1)
    ex = dec.create_executor(state={"x": "y"})
    buf = ex.state["x"]
    assert (buf.backend, buf.device_id, buf.handle.device) == ("mindspore_lite", 1, "ascend:1")
    x0 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.full((2, 2), 7, np.int64)
    ex.set_state("x", x0)
    want = x0
    for _ in range(3):
        (cat,), copies = ms_copies(ms, lambda: ex.execute({"ids": ids}))
        np.testing.assert_array_equal(cat, np.concatenate([want.ravel(), ids.ravel()]))
        assert copies == [("h2d", ids.nbytes), ("d2h", cat.nbytes)]
        want = want * 2 + 1
    np.testing.assert_array_equal(ex.state["x"].numpy(), want)
    mine, own = np.zeros(28, np.float32), ex.session._outputs[0][1]
    own.fill(-1)  # out= a host array: the step's one d2h lands there, not in the session's
    (cat,), copies = ms_copies(ms, lambda: ex.execute({"ids": ids}, out={"cat": mine}))
    assert cat is mine and copies == [("h2d", ids.nbytes), ("d2h", cat.nbytes)]
    np.testing.assert_array_equal(mine, np.concatenate([want.ravel(), ids.ravel()]))
    assert (own == -1).all()
    want = want * 2 + 1
    ex.reset_state()
    np.testing.assert_array_equal(np.asarray(ex.state["x"]), np.zeros_like(x0))


def test_a_failed_mindspore_lite_step_leaves_the_state(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    ex = dec.create_executor(state={"x": "y"})
    x0 = np.ones((2, 3, 4), np.float32)
    ex.set_state("x", x0)
    ms.state.fail["predict"] = "507011"
    with pytest.raises(gr.GearRuntimeError, match="507011"):
        ex.execute({"ids": np.zeros((2, 2), np.int64)})
    del ms.state.fail["predict"]
    np.testing.assert_array_equal(ex.state["x"].numpy(), x0)
    ex.execute({"ids": np.zeros((2, 2), np.int64)})
    np.testing.assert_array_equal(ex.state["x"].numpy(), x0 * 2 + 1)


def test_a_mindspore_lite_prefill_writes_into_the_decode_state_on_the_device(ms, tmp_path):
    dec, pre = ms_pair(tmp_path)
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    kv = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.full((2, 2), 3, np.int64)
    (y, cat), copies = ms_copies(ms, lambda: pex.execute({"kv": kv, "ids": ids},
                                                         out={"y": dex.state["x"]}))
    assert isinstance(y, DeviceBuffer)
    np.testing.assert_array_equal(cat, np.concatenate([kv.ravel(), ids.ravel()]))
    assert copies == [("h2d", kv.nbytes), ("h2d", ids.nbytes), ("d2h", cat.nbytes)]
    (cat,) = dex.execute({"ids": ids})
    np.testing.assert_array_equal(cat[:24], (kv * 2 + 1).ravel())


def test_the_ge_provider_refuses_device_state_and_device_outputs(ms, tmp_path):
    """MindSpore Lite's GE provider copies every input from the host and every output to it
    (ge_graph_executor.cc): state= and out= into a device tensor are refused there."""
    dec, pre = ms_pair(tmp_path, prefill_config=GE_CONFIG)
    with pytest.raises(gr.GearRuntimeError, match="state= on mindspore_lite needs the "
                                                  "default \\(ACL\\) provider"):
        pre.create_executor(state={"kv": "y"})
    dex = dec.create_executor(state={"x": "y"})
    feeds = {"kv": np.zeros((2, 3, 4), np.float32), "ids": np.zeros((2, 2), np.int64)}
    with pytest.raises(InputError, match="GE provider.*set_state"):
        pre.create_executor().execute(feeds, out={"y": dex.state["x"]})


def test_weights_are_shared_through_a_model_group_on_the_ge_provider(ms, tmp_path):
    """share_weights_with on mindspore_lite: ModelGroup(SHARE_WEIGHT), both models built
    after joining it (the first built again), the GE provider on both; refused otherwise."""
    (tmp_path / "dec.ini").write_text("[ge_graph_options]\nge.exec.precision_mode=force_fp32\n")
    decode = fake_mslite.write_mindir(tmp_path / "decode.mindir", DECODE, [[[2, 3, 4], [2, 2]]])
    prefill = fake_mslite.write_mindir(tmp_path / "prefill.mindir", PREFILL_FIXED,
                                       [[[2, 3, 4], [n, 2]] for n in (1, 2, 4)])
    (tmp_path / "pre.ini").write_text(GE_CONFIG)
    dec = gr.load(decode, backend="mindspore_lite", config=str(tmp_path / "dec.ini"))
    pre = gr.load(prefill, backend="mindspore_lite", config=str(tmp_path / "pre.ini"),
                  share_weights_with=dec)
    assert ms.state.weight_groups == [[decode, prefill]]
    ex = dec.create_executor()  # the rebuilt decode runs
    (y, _) = ex.execute({"x": np.ones((2, 3, 4), np.float32), "ids": np.zeros((2, 2),
                                                                             np.int64)})
    np.testing.assert_array_equal(y, np.full((2, 3, 4), 3, np.float32))
    with pytest.raises(InputError, match="shares its weights with another model already"):
        gr.load(prefill, backend="mindspore_lite", config=str(tmp_path / "pre.ini"),
                share_weights_with=dec)
    assert pre.gear_count == 3


def test_weight_sharing_on_the_default_provider_is_refused_naming_it(ms, tmp_path):
    dec, _ = ms_pair(tmp_path)
    prefill = str(tmp_path / "prefill.mindir")
    with pytest.raises(InputError, match=r"decode.mindir' is built with the default \(ACL\) "
                                         r"provider.*\[ge_graph_options\]"):
        gr.load(prefill, backend="mindspore_lite", config=str(tmp_path / "prefill.ini"),
                share_weights_with=dec)
    assert ms.state.weight_groups == []


# ---- ONNX Runtime's CUDA provider: state in OrtValues ----------------------------------------
# Run on host memory: the device path's real ORT calls with device ("cpu", 0) (the way
# tests/test_backend_ort_device.py checks the CUDA staging), so OrtValues, ortvalue bindings
# and the copies are ORT's own; `python -m pytest -m cuda` runs the same flow on a GPU.
@pytest.fixture(scope="module")
def lm_pair(tmp_path_factory: pytest.TempPathFactory):
    return generate.build_pair(tmp_path_factory.mktemp("lm"), causal_lm.SMALL)


class CopyCounter:
    """Bytes through OrtValue.update_inplace (host to device) and OrtValue.numpy (device to
    host): the device path's every transfer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.h2d: list[int] = []
        self.d2h: list[int] = []
        update, numpy = ort.OrtValue.update_inplace, ort.OrtValue.numpy

        def counted_update(value, array):
            self.h2d.append(int(np.asarray(array).nbytes))
            return update(value, array)

        def counted_numpy(value):
            out = numpy(value)
            self.d2h.append(int(out.nbytes))
            return out

        monkeypatch.setattr(ort.OrtValue, "update_inplace", counted_update)
        monkeypatch.setattr(ort.OrtValue, "numpy", counted_numpy)

    def clear(self) -> None:
        self.h2d.clear()
        self.d2h.clear()


def test_cuda_state_lives_in_ortvalues_and_tokens_equal_plain_ort(lm_pair, monkeypatch):
    """The seed's pair on the device path: the decode's cache in two OrtValues bound by
    bind_ortvalue_input / output, the prefill's cache bound straight into it (out=), greedy
    tokens equal to plain ORT's, and per step only the token and position go in and the
    logits come out: the cache never crosses."""
    prefill_path, gear_path, decode_path = lm_pair
    dec = on_host_device(gr.load(str(decode_path)))
    pre = on_host_device(gr.load(str(gear_path)))
    dex = dec.create_executor(state=causal_lm.STATE)
    pex = pre.create_executor()
    buf = dex.state["past_kv"]
    assert isinstance(buf, DeviceBuffer) and buf.backend == "onnxruntime-cpu"
    counter = CopyCounter(monkeypatch)
    cache_bytes = int(np.prod(causal_lm.SMALL.cache_shape)) * 4
    ids = np.arange(3, 3 + 11, dtype=np.int64)[None]
    gear = generate.covering_gear(ids.shape[1], causal_lm.SMALL.seq_gears)
    logits = pex.execute({"input_ids": ids, "attention_mask": np.ones_like(ids)}, pad=True,
                         out={"present_kv": buf})[0]
    assert cache_bytes not in counter.h2d + counter.d2h  # the handoff: bound, not copied
    tokens = [int(logits.argmax())]
    for t in range(5):
        counter.clear()
        (logits,) = dex.execute({"input_ids": np.array([[tokens[-1]]], np.int64),
                                 "position": np.array([ids.shape[1] + t], np.int64)})
        assert len(counter.h2d) == 1 and sum(counter.h2d) <= 256  # ONE merged copy
        assert counter.d2h == [logits.nbytes]
        tokens.append(int(logits.argmax()))
    want = generate.reference_tokens(*generate.ort_sessions(prefill_path, decode_path), ids,
                                     gear, 6)
    assert tokens == want


def test_cuda_state_double_buffers_and_a_failed_step_leaves_it(lm_pair, monkeypatch):
    dec = on_host_device(gr.load(str(lm_pair[2])))
    dex = dec.create_executor(state=causal_lm.STATE)
    cache = np.random.default_rng(0).standard_normal(causal_lm.SMALL.cache_shape).astype(
        np.float32)
    dex.set_state("past_kv", cache)
    first = dex.state["past_kv"]
    dex.execute({"input_ids": np.array([[5]], np.int64), "position": np.array([3], np.int64)})
    np.testing.assert_array_equal(first.numpy(), cache)  # the run wrote the other buffer
    after = dex.state["past_kv"].numpy()
    assert not np.array_equal(after, cache)
    with pytest.raises(gr.GearRuntimeError):  # a token past the embedding table
        dex.execute({"input_ids": np.array([[10**6]], np.int64),
                     "position": np.array([4], np.int64)})
    np.testing.assert_array_equal(dex.state["past_kv"].numpy(), after)
    dex.reset_state()
    assert not dex.state["past_kv"].numpy().any()
    dex.close()
    with pytest.raises(ClosedError):
        first.numpy()


def test_cuda_state_refuses_another_devices_buffer(lm_pair):
    dec = on_host_device(gr.load(str(lm_pair[2])))
    pre = gr.load(str(lm_pair[1]))  # on the CPU provider: host outputs only
    dex = dec.create_executor(state=causal_lm.STATE)
    ids = np.arange(3, 9, dtype=np.int64)[None]
    with pytest.raises(InputError, match=r"DeviceBuffer\(onnxruntime-cpu.*host memory"):
        pre.create_executor().execute({"input_ids": ids, "attention_mask": np.ones_like(ids)},
                                      pad=True, out={"present_kv": dex.state["past_kv"]})


def test_cuda_graphs_with_state_capture_each_parity_apart(lm_pair, monkeypatch):
    """Under CUDA graphs a graph replays the addresses it was captured with: the two
    parities' bindings are two graphs per gear (ids of their own, both captured at
    creation, the state zeroed after), steps alternate between them, and the handoff runs
    with no graph id (-1: not this executor's addresses)."""
    ids_seen = graph_ids(monkeypatch)
    dec = gr.load(str(lm_pair[2]))
    backend = dec.backend_model
    backend.on_cuda, backend.device, backend.cuda_graph = True, ("cpu", 0), True
    pre = on_host_device(gr.load(str(lm_pair[1])))
    dex = dec.create_executor(state=causal_lm.STATE)
    captured = list(ids_seen)
    assert len(set(captured)) == 2 and "-1" not in captured  # parity 0 and 1, one gear
    assert not dex.state["past_kv"].numpy().any()  # zeroed after the captures
    ids_seen.clear()
    prompt = np.arange(3, 9, dtype=np.int64)[None]
    pre.create_executor().execute({"input_ids": prompt, "attention_mask": np.ones_like(prompt)},
                                  pad=True, out={"present_kv": dex.state["past_kv"]})
    assert ids_seen == ["-1"]
    ids_seen.clear()
    for t in range(4):
        dex.execute({"input_ids": np.array([[7]], np.int64),
                     "position": np.array([6 + t], np.int64)})
    assert ids_seen == [captured[0], captured[1]] * 2
