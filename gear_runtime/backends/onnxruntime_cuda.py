"""The CUDA side of the ONNX Runtime backend: provider options, the process-wide capture
gate, and the device staging an executor's gears are bound to.

Split from ``onnxruntime.py`` (which imports it, never the other way round) so that the CPU
hot path and the CUDA paths can change apart. Every ORT call here is checked against ORT's
source: docs/cuda.md has the table. Written to ORT's documented Python API; not run on a GPU
in this repository's CI.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from gear_runtime.errors import BackendError
from gear_runtime.gearfile.info import ModelInfo

#: ORT run config key selecting the CUDA graph of a run (CUDA EP with enable_cuda_graph).
GRAPH_ID_KEY = "gpu_graph_id"
CUDA = "CUDAExecutionProvider"


def provider_list(providers: Sequence[Any] | None, device_id: int,
                  cuda_graph: bool) -> list[Any]:
    """The providers with the CUDA provider's options made explicit: ``device_id`` always
    (the CUDA EP defaults to device 0, and an input bound on another device would be copied
    once at bind time and then read stale), ``enable_cuda_graph`` when asked."""
    out: list[Any] = []
    for p in providers or ["CPUExecutionProvider"]:
        name, options = (p[0], dict(p[1])) if isinstance(p, tuple) else (str(p), {})
        if name == CUDA:
            given = options.get("device_id")
            if given is not None and int(given) != device_id:
                raise BackendError(f"CUDAExecutionProvider options say device_id={given}, "
                                   f"the model is opened with device_id={device_id}")
            options["device_id"] = str(device_id)
            if cuda_graph:
                options["enable_cuda_graph"] = "1"
        out.append((name, options) if options else name)
    return out


class _CaptureGate:
    """CUDA graph capture vs everything else on the GPU: ORT's CUDA EP captures with
    ``cudaStreamCaptureModeGlobal`` (cuda_graph.cc), where a CUDA call from ANY other thread
    (a cudaMalloc, a blocking copy, another session's run) breaks the capture. So device
    allocation and capture are exclusive, runs and copies are shared: a readers-writer lock,
    one for the whole process (:data:`CUDA_GATE`), taken only by CUDA models."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._runs = 0
        self._capturing = False

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._capturing)
            self._runs += 1
        try:
            yield
        finally:
            with self._cond:
                self._runs -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._capturing and self._runs == 0)
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()


CUDA_GATE = _CaptureGate()


def cuda_exclusive(on_cuda: bool) -> contextlib.AbstractContextManager[None]:
    """Hold the GPU exclusively (allocation, capture) when ``on_cuda``; else nothing."""
    return CUDA_GATE.capture() if on_cuda else contextlib.nullcontext()


def cuda_shared(on_cuda: bool) -> contextlib.AbstractContextManager[None]:
    """Share the GPU with other runs, never with a capture, when ``on_cuda``; else nothing."""
    return CUDA_GATE.run() if on_cuda else contextlib.nullcontext()


class DeviceStaging:
    """CUDA side of the staging buffer: where gear g's merged span and big inputs live.

    Per gear, one device buffer holds the merged span (ONE host-to-device copy per run) and
    each input too big to merge has its own (one copy each), as GE's merged H2D copy does.
    Outputs are bound to device buffers and copied back after the run.
    Written to ORT's documented Python API; not run on a GPU in this repository's CI.
    """

    def __init__(self, info: ModelInfo, device_id: int, layout: Any,
                 staging: np.ndarray) -> None:
        self.layout, self.staging, self.device_id = layout, staging, device_id
        self.merged: list[ort.OrtValue | None] = []
        self.separate: list[dict[int, ort.OrtValue]] = []
        self.outputs: list[list[ort.OrtValue]] = []
        for g in range(info.spec.gear_count):
            start, end = layout.merged_span(g)
            self.merged.append(self._alloc(end - start) if end > start else None)
            # Empty inputs need no copy (update_inplace wants equal sizes): bound to a 1-byte
            # buffer that is never written.
            self.separate.append({i: self._alloc(layout.nbytes(g, i))
                                  for i in range(layout.input_count) if not layout.fused(i)})
            # An empty output gets a 1-byte buffer: ORT gives a 0-element value no address.
            self.outputs.append([
                ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dt, "cuda", self.device_id)
                if int(np.prod(shape)) else self._alloc(1)
                for shape, dt in zip(info.output_shapes[g], info.output_dtypes, strict=True)])

    def _alloc(self, nbytes: int) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type([max(nbytes, 1)], np.uint8, "cuda",
                                                         self.device_id)

    def input_ptr(self, g: int, i: int) -> tuple[str, int]:
        if self.layout.fused(i):
            start, _ = self.layout.merged_span(g)
            value = self.merged[g]
            assert value is not None
            return "cuda", value.data_ptr() + self.layout.offset(g, i) - start
        return "cuda", self.separate[g][i].data_ptr()

    def output_ptr(self, g: int, k: int) -> int:
        return self.outputs[g][k].data_ptr()

    def to_device(self, g: int) -> None:
        start, end = self.layout.merged_span(g)
        value = self.merged[g]
        if value is not None:
            value.update_inplace(self.staging[start:end])  # the ONE merged copy
        for i, dev in self.separate[g].items():
            off, n = self.layout.offset(g, i), self.layout.nbytes(g, i)
            if n:
                dev.update_inplace(self.staging[off:off + n])

    def to_host(self, g: int, host: list[np.ndarray]) -> None:
        for dev, out in zip(self.outputs[g], host, strict=True):
            if out.size:  # .numpy() is a blocking device-to-host cudaMemcpy
                np.copyto(out, dev.numpy())


def cuda_available() -> bool:
    """True when this ORT build has the CUDA EP (a GPU may still be missing)."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


def gpu_present() -> bool:
    """True when an NVIDIA GPU device node exists (the CUDA EP needs one to run)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


__all__ = ["CUDA", "CUDA_GATE", "GRAPH_ID_KEY", "DeviceStaging", "cuda_available",
           "cuda_exclusive", "cuda_shared", "gpu_present", "provider_list"]
