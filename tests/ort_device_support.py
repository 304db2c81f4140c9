"""Running ONNX Runtime's CUDA device path on host memory, and watching its runs: the helpers
tests/test_backend_ort_device.py and tests/test_device_state.py share.

The host-memory device keeps ORT's rule for inputs a kernel reads on the CPU: ORT copies
such an input when it is BOUND (``IOBinding::BindInput`` calls
``utils::CopyOneInputAcrossDevices``, onnxruntime/core/session/IOBinding.cc; the target is the
planned location of the consuming kernel's input, CPU for an ``OrtMemTypeCPUInput``:
core/framework/session_state_utils.cc, allocation_planner.cc ``GetLocationForNodeInput``), and
the run reads that copy. On a CPU session nothing is copied, so :class:`BindTimeCopies` makes
the copy itself: a device path that binds before it copies the new bytes in runs here with the
bytes that were there at bind, as it would on a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import gear_runtime as gr
from gear_runtime.backends.capture_check import cpu_read_inputs

#: OrtValue.numpy as ORT has it: the copies made at bind are no transfer a test counts
_ORT_NUMPY = ort.OrtValue.numpy


class BindTimeCopies(ort.IOBinding):
    """An IOBinding that copies each input in ``cpu_read`` when it is bound (what ORT does
    for an input bound on the GPU whose kernel reads it on the CPU) and binds the copy;
    every other input is bound where it is. ``copied`` counts the copies made."""

    def __init__(self, session: ort.InferenceSession, cpu_read: set[str]) -> None:
        super().__init__(session)
        self.cpu_read, self.copied = frozenset(cpu_read), 0
        self._keep: dict[str, np.ndarray] = {}  # the copies, alive while bound

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        if name in self.cpu_read:
            dtype = np.dtype(element_type)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            raw = ctypes.string_at(buffer_ptr, nbytes)
            buffer_ptr = self._hold(name, np.frombuffer(raw, dtype).reshape(shape))
            device_type, device_id = "cpu", 0
        super().bind_input(name, device_type, device_id, element_type, shape, buffer_ptr)

    def bind_ortvalue_input(self, name, ortvalue):
        if name not in self.cpu_read:
            super().bind_ortvalue_input(name, ortvalue)
            return
        copy = _ORT_NUMPY(ortvalue)
        ptr = self._hold(name, copy)
        super().bind_input(name, "cpu", 0, copy.dtype, list(copy.shape), ptr)

    def _hold(self, name: str, array: np.ndarray) -> int:
        """Keep a fresh copy of ``array`` for input ``name``; its address."""
        self._keep[name] = np.array(array, copy=True, order="C")
        self.copied += 1
        return int(self._keep[name].ctypes.data)


def _graph(backend: Any) -> onnx.GraphProto:
    """The graph the model's session runs (the source graph; a sink file's own)."""
    if backend.file.dynamic is not None:
        return backend.file.dynamic.graph
    return onnx.load_from_string(backend.file.model_bytes).graph


def on_host_device(model: gr.GearModel, graphs: bool = False) -> gr.GearModel:
    """Run ``model``'s device path on the CPU: the executor takes DeviceStaging and the public
    run API as on CUDA, with device ("cpu", 0) in every ORT call; ``graphs``: as under CUDA
    graphs (graph ids per gear). Its session's bindings copy the inputs the CUDA EP reads on
    the CPU at bind time, as ORT does (:class:`BindTimeCopies`)."""
    backend = model.backend_model
    backend.on_cuda, backend.device, backend.cuda_graph = True, ("cpu", 0), graphs
    session, cpu_read = backend.session, cpu_read_inputs(_graph(backend))
    session.io_binding = lambda: BindTimeCopies(session, cpu_read)
    return model


def graph_ids(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``gpu_graph_id`` of every ``InferenceSession.run_with_iobinding`` from now on, in
    order (the public run API the device path uses; "-1": no graph)."""
    seen: list[str] = []
    real = ort.InferenceSession.run_with_iobinding

    def spy(self, binding, run_options=None):
        seen.append(run_options.get_run_config_entry("gpu_graph_id"))
        return real(self, binding, run_options)

    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", spy)
    return seen
