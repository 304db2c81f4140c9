"""ONNX Runtime's CUDA device path, round 4 (issue 49), checked on CPU with the host-memory
device of tests/ort_device_support.py (no GPU here):

* an input a kernel reads on the CPU is copied by ORT when it is BOUND
  (``IOBinding::BindInput`` -> ``utils::CopyOneInputAcrossDevices``): the prefill -> decode
  handoff must copy the request's inputs to the device before it binds them;
* the resident state's copies (``set_state``, ``reset_state``, ``ex.state[name].numpy()``)
  go through the capture gate: ORT captures in ``cudaStreamCaptureModeGlobal``, where another
  thread's copy breaks the capture.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from ort_device_support import BindTimeCopies, on_host_device

import gear_runtime as gr
from gear_runtime.backends import onnxruntime_cuda as cuda
from gear_runtime.backends.capture_check import cpu_read_inputs


def _save(tmp_path: Path, name: str, graph: onnx.GraphProto) -> str:
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), path)
    return str(path)


def _padder(tmp_path: Path) -> str:
    """p = Pad(a, pads=[0, 0, 0, 1], constant_value=c): a [2, 2] -> p [2, 3], the new column
    c. The CUDA Pad kernel reads ``constant_value`` (input 2) on the CPU
    (``InputMemoryType<OrtMemTypeCPUInput>(2)``, core/providers/cuda/tensor/pad.cc)."""
    pads = onnx.numpy_helper.from_array(np.array([0, 0, 0, 1], np.int64), "pads")
    graph = helper.make_graph(
        [helper.make_node("Pad", ["a", "pads", "c"], ["p"], name="pad")], "padder",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 2]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 3])], initializer=[pads])
    return _save(tmp_path, "padder", graph)


def _twin(tmp_path: Path) -> str:
    """A decode step with state x [2, 3]: y = x + t (the state's next value), w = x * t."""
    x, t = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "t"))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("y", "w")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "t"], ["y"]),
                               helper.make_node("Mul", ["x", "t"], ["w"])], "twin", [x, t], outs)
    return _save(tmp_path, "twin", graph)


def _padded(a: np.ndarray, c: float) -> np.ndarray:
    return np.concatenate([a, np.full((2, 1), c, np.float32)], axis=1)


# ---- finding 1: copy to the device, THEN bind ------------------------------------------------
def test_the_host_device_copies_a_cpu_read_input_when_it_is_bound(tmp_path: Path) -> None:
    """The double is strict: the bytes of a CPU-read input at BIND time are what the run
    reads, as on a GPU; later writes to its memory are not seen until it is bound again."""
    model = on_host_device(gr.load(_padder(tmp_path)))
    session = model.backend_model.session
    assert cpu_read_inputs(onnx.load(_padder(tmp_path)).graph) == {"c"}
    a, c = np.ones((2, 2), np.float32), np.array([5.0], np.float32)
    binding = session.io_binding()
    assert isinstance(binding, BindTimeCopies)
    binding.bind_input("a", "cpu", 0, np.float32, [2, 2], a.ctypes.data)
    binding.bind_input("c", "cpu", 0, np.float32, [1], c.ctypes.data)
    binding.bind_output("p", "cpu")
    c[0] = 9.0  # after the bind: the run still reads 5
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], _padded(a, 5.0))
    a[:] = 2.0  # not CPU-read: bound where it is, read at run time
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], _padded(a, 5.0))


def test_a_handoff_reads_this_requests_value_of_a_cpu_read_input(tmp_path: Path) -> None:
    """The prefill -> decode handoff (out= the decode's state buffer) with an input a kernel
    reads on the CPU: the output is computed from THIS request's value, never the value left
    on the device by the request before (bind-before-copy read that one)."""
    dec = on_host_device(gr.load(_twin(tmp_path)))
    pre = on_host_device(gr.load(_padder(tmp_path)))
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    (p,) = pex.execute({"a": a, "c": np.array([5.0], np.float32)})  # a plain run first
    np.testing.assert_array_equal(p, _padded(a, 5.0))
    for c in (7.0, -3.0):
        pex.execute({"a": a + c, "c": np.array([c], np.float32)}, out={"p": dex.state["x"]})
        np.testing.assert_array_equal(dex.state["x"].numpy(), _padded(a + c, c))


def test_a_plain_device_run_reads_this_requests_value_of_a_cpu_read_input(
        tmp_path: Path) -> None:
    """The run path (copy in, bind again, run) on the strict double: each request's value."""
    ex = on_host_device(gr.load(_padder(tmp_path))).create_executor()
    a = np.ones((2, 2), np.float32)
    for c in (1.0, 4.0, -2.0):
        (p,) = ex.execute({"a": a, "c": np.array([c], np.float32)})
        np.testing.assert_array_equal(p, _padded(a, c))


# ---- finding 2: state copies share the GPU through the capture gate --------------------------
def _copies_during_a_capture(monkeypatch: pytest.MonkeyPatch,
                             copy: Callable[[], object]) -> list[bool]:
    """Run ``copy`` on this thread while another thread holds the capture side of the gate
    for 0.3 s; per ORT copy it made (OrtValue.update_inplace / numpy): whether a capture was
    in progress then. A copy that takes the gate waits for the capture to end."""
    capturing, entered = threading.Event(), threading.Event()
    me, seen = threading.get_ident(), []
    update, numpy = ort.OrtValue.update_inplace, ort.OrtValue.numpy

    def watched(real):
        def call(value, *args):
            if threading.get_ident() == me:
                seen.append(capturing.is_set())
            return real(value, *args)
        return call

    monkeypatch.setattr(ort.OrtValue, "update_inplace", watched(update))
    monkeypatch.setattr(ort.OrtValue, "numpy", watched(numpy))

    def capture() -> None:
        with cuda.cuda_exclusive(True):
            capturing.set()
            entered.set()
            time.sleep(0.3)
            capturing.clear()

    t = threading.Thread(target=capture)
    t.start()
    entered.wait(5)
    try:
        copy()
    finally:
        t.join(5)
    return seen


@pytest.mark.parametrize("what", ["set_state", "set_state from a device buffer",
                                  "reset_state", "state numpy"])
def test_a_state_copy_never_overlaps_a_capture(tmp_path: Path, monkeypatch, what: str) -> None:
    dec = on_host_device(gr.load(_twin(tmp_path)))
    ex, other = dec.create_executor(state={"x": "y"}), dec.create_executor(state={"x": "y"})
    value = np.full((2, 3), 3.0, np.float32)
    copy = {"set_state": lambda: ex.set_state("x", value),
            "set_state from a device buffer": lambda: ex.set_state("x", other.state["x"]),
            "reset_state": ex.reset_state,
            "state numpy": lambda: ex.state["x"].numpy()}[what]
    seen = _copies_during_a_capture(monkeypatch, copy)
    assert seen and not any(seen), seen  # each copy waited for the capture to end


def test_the_gate_is_reentrant_for_the_thread_holding_it() -> None:
    """A thread holding the capture side may copy (the state is zeroed inside executor
    creation's exclusive section); a thread holding a run may take a run again while a
    capture waits (else: the capture waits for the run, the run for the capture)."""
    gate = cuda._CaptureGate()
    nested = []

    def holder() -> None:
        with gate.capture(), gate.run():
            nested.append("capture, then run")
        with gate.run():
            queued.start()
            while not gate._waiting:  # the capture queued behind this run
                time.sleep(0.001)
            with gate.run():
                nested.append("run, then run")

    def capture() -> None:
        with gate.capture():
            nested.append("capture")

    queued = threading.Thread(target=capture, daemon=True)
    worker = threading.Thread(target=holder, daemon=True)
    worker.start()
    worker.join(5)
    queued.join(5)
    assert nested == ["capture, then run", "run, then run", "capture"]


# ---- finding 3: a DeviceBuffer kept from before a run ----------------------------------------
def test_a_stale_state_buffer_is_refused_by_the_ort_handoff(tmp_path: Path) -> None:
    """``ex.state[name]`` kept across a run of its executor is the buffer that executor's
    NEXT run writes: as out= (a handoff) or a set_state source it is refused, naming what to
    do; taken again after the run it is the state the next run reads, and bound as before."""
    dec = on_host_device(gr.load(_twin(tmp_path)))
    pre = on_host_device(gr.load(_padder(tmp_path)))
    dex, pex = dec.create_executor(state={"x": "y"}), pre.create_executor()
    kept = dex.state["x"]
    dex.execute({"t": np.ones((2, 3), np.float32)})
    feeds = {"a": np.ones((2, 2), np.float32), "c": np.array([2.0], np.float32)}
    with pytest.raises(gr.InputError, match=r"take ex.state\[name\] again after the run"):
        pex.execute(feeds, out={"p": kept})
    with pytest.raises(gr.InputError, match=r"take ex.state\[name\] again after the run"):
        dec.create_executor(state={"x": "y"}).set_state("x", kept)
    pex.execute(feeds, out={"p": dex.state["x"]})
    (w,) = dex.execute({"t": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(w, _padded(np.ones((2, 2), np.float32), 2.0))
