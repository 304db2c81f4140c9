"""The CUDA side of the ONNX Runtime backend: provider options, the process-wide capture
gate, and the device staging an executor's gears are bound to.

Split from ``onnxruntime.py`` (which imports it, never the other way round) so that the CPU
hot path and the CUDA paths can change apart. Every ORT call here is checked against ORT's
source: docs/cuda.md has the table. Written to ORT's documented Python API; not run on a GPU
in this repository's CI.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from gear_runtime.backends.base import DeviceBuffer, DeviceStateBase
from gear_runtime.errors import BackendError
from gear_runtime.gearfile.info import ModelInfo

#: ORT run config key selecting the CUDA graph of a run (CUDA EP with enable_cuda_graph).
GRAPH_ID_KEY = "gpu_graph_id"
CUDA = "CUDAExecutionProvider"


def provider_list(providers: Sequence[Any] | None, device_id: int,
                  cuda_graph: bool, tf32: bool = False) -> list[Any]:
    """The providers with the CUDA provider's options made explicit: ``device_id`` always
    (the CUDA EP defaults to device 0, and an input bound on another device would be copied
    once at bind time and then read stale), ``enable_cuda_graph`` when asked, and
    ``use_tf32`` = ``tf32`` unless the user set it: the CUDA EP's own default is TF32 on
    (``use_tf32{true}``, cuda_execution_provider_info.h), which rounds float32 MatMul/Conv
    inputs to 10 mantissa bits on Ampere and later; float32 stays float32 unless the gear
    file's precision_mode lowers it (docs/precision.md)."""
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
            options.setdefault("use_tf32", "1" if tf32 else "0")
        out.append((name, options) if options else name)
    return out


#: What ORT says when it refuses a session with graph capture (inference_session.cc; the 1.32
#: binary says "graph capture feature", older releases "CUDA Graph feature").
CAPTURE_REFUSALS = ("cannot use the graph capture feature", "cannot use the CUDA Graph feature")


def is_capture_refusal(message: str) -> bool:
    """Whether a session-creation error is ORT refusing graph capture for the model."""
    return any(r in message for r in CAPTURE_REFUSALS)


class _CaptureGate:
    """CUDA graph capture vs everything else on the GPU: ORT's CUDA EP captures with
    ``cudaStreamCaptureModeGlobal`` (docs/cuda.md), where a CUDA call from ANY other thread
    (a cudaMalloc, a blocking copy, another session's run) breaks the capture. So device
    allocation and capture are exclusive, runs and copies (the staging's and the resident
    state's) are shared: a readers-writer lock, one for the whole process
    (:data:`CUDA_GATE`), taken only by CUDA models.

    Writer-preferring: once a capture waits, new runs wait behind it, so executors that keep
    the GPU busy cannot starve a capture (or an executor's creation) forever. Reentrant for
    the thread holding it: a run inside its own capture or run never waits (a nested run
    waiting behind a queued capture that waits for the outer run would deadlock)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._runs = 0
        self._capturing = False
        self._waiting = 0  # captures waiting for the runs in flight to drain
        self._capturer: int | None = None  # the thread holding the capture side
        self._held: dict[int, int] = {}  # thread -> runs it holds

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._capturer == me:  # exclusive already: nothing more to take
                shared = False
            else:
                shared = True
                if not self._held.get(me):
                    self._cond.wait_for(lambda: not self._capturing and not self._waiting)
                self._runs += 1
                self._held[me] = self._held.get(me, 0) + 1
        try:
            yield
        finally:
            if shared:
                self._leave_run(me)

    def _leave_run(self, me: int) -> None:
        with self._cond:
            self._runs -= 1
            self._held[me] -= 1
            if not self._held[me]:
                del self._held[me]
            self._cond.notify_all()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._capturing and self._runs == 0)
            finally:
                self._waiting -= 1
            self._capturing, self._capturer = True, threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._capturing, self._capturer = False, None
                self._cond.notify_all()


CUDA_GATE = _CaptureGate()


def cuda_exclusive(on_cuda: bool) -> contextlib.AbstractContextManager[None]:
    """Hold the GPU exclusively (allocation, capture) when ``on_cuda``; else nothing."""
    return CUDA_GATE.capture() if on_cuda else contextlib.nullcontext()


def cuda_shared(on_cuda: bool) -> contextlib.AbstractContextManager[None]:
    """Share the GPU with other runs, never with a capture, when ``on_cuda``; else nothing."""
    return CUDA_GATE.run() if on_cuda else contextlib.nullcontext()


# ---- DLPack views: an OrtValue over part of another one's memory -----------------------------
# ORT's Python API allocates whole OrtValues and copies into whole OrtValues (update_inplace
# wants equal sizes), but one arena per executor needs a copy into PART of a buffer. A DLPack
# tensor describing that part, handed to OrtValue.from_dlpack, is such a view: ORT wraps the
# pointer without copying or owning it and calls the deleter when the view dies
# (DlpackToOrtValue in onnxruntime/core/dlpack/dlpack_converter.cc). Layout of the structs:
# dlpack.h v0.x (DLTensor, DLManagedTensor), which ORT's converter reads.
_KDL_CPU, _KDL_CUDA = 1, 2
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]


#: The ctypes structs of every live view, by the address ORT hands back to the deleter. A view
#: owns its struct: ORT's DLPack deleter (DlpackToOrtValue, core/dlpack/dlpack_converter.cc)
#: reads ``dlpack->deleter`` from the struct when the OrtValue dies, so the struct must live
#: exactly as long as the view, whatever order its holders are torn down in. Keeping them in
#: the owner's list freed them before the views on teardown (a use-after-free).
_LIVE: dict[int, tuple[Any, Any]] = {}


@_DELETER
def _release(managed: Any) -> None:
    """The views' deleter, called by ORT when a view dies: frees the view's structs. ORT reads
    nothing from them after the call."""
    live = _LIVE  # None only while the interpreter tears this module down
    if live is not None:
        live.pop(ctypes.addressof(managed.contents), None)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _view(ptr: int, nbytes: int, device: tuple[str, int]) -> ort.OrtValue:
    """A uint8 OrtValue of ``nbytes`` at ``ptr`` on ``device``, owning nothing. Its ctypes
    structs stay in :data:`_LIVE` until ORT calls the deleter (when the view dies)."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data, t.ndim, t.shape, t.strides, t.byte_offset = ptr, 1, shape, None, 0
    t.device = _DLDevice(_KDL_CUDA if device[0] == "cuda" else _KDL_CPU, device[1])
    t.dtype = _DLDataType(_KDL_UINT, 8, 1)
    managed.manager_ctx, managed.deleter = None, _release
    address = ctypes.addressof(managed)
    _LIVE[address] = (managed, shape)
    try:
        return ort.OrtValue.from_dlpack(_capsule_new(address, b"dltensor", None))
    except BaseException:
        _LIVE.pop(address, None)  # ORT never took it, so it will never call the deleter
        raise


class _Arena:
    """One device allocation and views of parts of it (:meth:`region`).

    Where this ORT cannot make a working view (the check at creation: a view must sit at the
    arena's address and carry bytes there and back), every region is an allocation of its
    own instead: correct, only not shared (``shared`` says which)."""

    def __init__(self, nbytes: int, device: tuple[str, int]) -> None:
        self.device = device
        #: device bytes held: the arena, plus the regions of their own when views fail
        self.nbytes = max(int(nbytes), 1)
        self.value = _alloc(nbytes, device)
        self.base = int(self.value.data_ptr())
        self.shared = self._views_work()

    def _views_work(self) -> bool:
        try:
            probe = _view(self.base, 1, self.device)
            probe.update_inplace(np.array([0xA5], np.uint8))
            return int(probe.data_ptr()) == self.base and int(probe.numpy()[0]) == 0xA5
        except Exception:  # noqa: BLE001 - any failure means: no views on this ORT
            return False

    def region(self, offset: int, nbytes: int) -> ort.OrtValue:
        """An OrtValue of ``nbytes`` (at least 1) at ``offset`` of the arena, or of its own."""
        if self.shared:
            return _view(self.base + offset, max(nbytes, 1), self.device)
        self.nbytes += max(int(nbytes), 1)
        return _alloc(nbytes, self.device)


def _alloc(nbytes: int, device: tuple[str, int]) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_shape_and_type([max(int(nbytes), 1)], np.uint8, *device)


#: device buffers start at multiples of this (cudaMalloc gives 256-byte alignment)
DEVICE_ALIGN = 256


def _aligned(n: int) -> int:
    return (n + DEVICE_ALIGN - 1) // DEVICE_ALIGN * DEVICE_ALIGN


class DeviceStaging:
    """The device side of an executor: ONE input arena and ONE output arena, each sized for
    the executor's largest gear, shared by all its gears (an executor runs one gear at a time).

    Inputs: the arena mirrors the host staging buffer byte for byte (``layout.total_bytes``,
    the largest gear's footprint), so gear g's merged span goes over in ONE copy into the same
    offsets and each input too big to merge in one copy of its own, as GE's
    CopyInputDataWithMergeH2D. Outputs: output k at a fixed offset, with room for its largest
    gear. The addresses are fixed, so every gear's CUDA graph is captured over the same two
    arenas. Device to host: ONE copy per output, of exactly the gear's bytes, into a fresh
    array (``OrtValue.numpy()`` of the value the binding reports for the run).

    ``device`` is ("cuda", id) on a GPU; ("cpu", 0) runs the same ORT calls on host memory
    (what the CPU tests check this class with). Not run on a GPU in this repository's CI.
    """

    def __init__(self, info: ModelInfo, device: tuple[str, int], layout: Any,
                 staging: np.ndarray, skip: Collection[int] = ()) -> None:
        """``skip``: outputs with no room of their own (a state output, bound to the state's
        OrtValues): neither allocated nor copied to the host."""
        self.layout, self.staging, self.device = layout, staging, device
        gears = range(info.spec.gear_count)
        self.inputs = _Arena(int(layout.total_bytes), device)
        self.merged = [self._span(g) for g in gears]
        # Empty inputs need no copy: their pointer is bound, never written.
        self.separate = [{i: self.inputs.region(layout.offset(g, i), layout.nbytes(g, i))
                          for i in range(layout.input_count)
                          if not layout.fused(i) and layout.nbytes(g, i)} for g in gears]
        room = [0 if k in skip else max(info.output_size(g, k) for g in gears)
                for k in range(len(info.output_names))]
        self.output_offsets = [sum(_aligned(max(r, 1)) for r in room[:k])
                               for k in range(len(room))]
        self.output_bytes = sum(_aligned(max(r, 1)) for r in room)
        self.outputs = _alloc(self.output_bytes, device)
        self.output_base = int(self.outputs.data_ptr())
        # per gear, per output: (shape, dtype), and whether it has any element to copy
        self._outs = [[(tuple(s), d, int(np.prod(s)) > 0) for s, d in zip(
            info.output_shapes[g], info.output_dtypes, strict=True)] for g in gears]
        self._skip = frozenset(skip)

    def _span(self, g: int) -> ort.OrtValue | None:
        start, end = self.layout.merged_span(g)
        return self.inputs.region(start, end - start) if end > start else None

    @property
    def nbytes(self) -> int:
        """Device bytes this executor holds for inputs and outputs (both arenas)."""
        return self.inputs.nbytes + self.output_bytes

    def input_ptr(self, g: int, i: int) -> tuple[str, int]:
        layout = self.layout
        if layout.fused(i):
            start, _ = layout.merged_span(g)
            value = self.merged[g]
            assert value is not None
            return self.device[0], int(value.data_ptr()) + layout.offset(g, i) - start
        sep = self.separate[g].get(i)
        if sep is None:  # an empty input: any address in the arena, never read
            return self.device[0], self.inputs.base + int(layout.offset(g, i))
        return self.device[0], int(sep.data_ptr())

    def output_ptr(self, k: int) -> int:
        return self.output_base + self.output_offsets[k]

    def to_device(self, g: int) -> None:
        start, end = self.layout.merged_span(g)
        value = self.merged[g]
        if value is not None:
            value.update_inplace(self.staging[start:end])  # the ONE merged copy
        for i, dev in self.separate[g].items():
            off = self.layout.offset(g, i)
            dev.update_inplace(self.staging[off:off + self.layout.nbytes(g, i)])

    def to_host(self, g: int, binding: Any, kept: Collection[int] = ()) -> list[Any]:
        """Gear g's outputs as fresh host arrays: one blocking device-to-host copy each; a
        skipped output (the state's) or one in ``kept`` (written into a device buffer the
        caller gave) is not copied: its place holds an empty array."""
        values = binding.get_outputs()
        return [np.empty(0, dtype) if k in self._skip or k in kept else
                v.numpy() if filled else np.empty(shape, dtype)
                for k, (v, (shape, dtype, filled)) in enumerate(zip(values, self._outs[g],
                                                                   strict=True))]


class DeviceState(DeviceStateBase):
    """Resident state in the provider's device memory (CUDA): per pair two OrtValues of the
    state's shape and dtype; a run's binding reads the one of its parity and writes the other
    (``bind_ortvalue_input`` / ``bind_ortvalue_output``), swapped after a successful run. A
    decode step then copies its other inputs in and other outputs out, never the cache.

    ``ex.state[name]`` is a :class:`DeviceBuffer` over the OrtValue: ``out=`` of an executor
    of this provider and device binds it as its output; ``.numpy()`` is one device-to-host
    copy, ``set_state`` one host-to-device copy (``OrtValue.update_inplace``; from another
    device buffer through the host: ORT's Python API has no device-to-device copy). ``device``
    is ("cuda", id), or ("cpu", 0) in the CPU tests, as :class:`DeviceStaging`'s.

    Every copy here (``set``, ``zero``, ``to_host``) shares the GPU through :data:`CUDA_GATE`
    as a run does: a blocking ``cudaMemcpy`` from this thread during another thread's capture
    (``cudaStreamCaptureModeGlobal``) invalidates that capture. A state exists only on CUDA
    (or the tests' faked CUDA), so the gate is always taken; it is reentrant for the thread
    creating the executor, which zeroes the state holding the capture side."""

    def __init__(self, plan: Any, device: tuple[str, int]) -> None:
        self.plan, self.device, self.parity = plan, device, 0
        self.backend, self.device_id = f"onnxruntime-{device[0]}", device[1]
        self.closed = False
        self.values = [tuple(ort.OrtValue.ortvalue_from_shape_and_type(
            list(p.shape), p.dtype, *device) for _ in range(2)) for p in plan.pairs]
        self.zero()

    def value(self, pair: int, parity: int) -> ort.OrtValue:
        """The OrtValue a run at ``parity`` reads (``1 - parity``: the one it writes)."""
        return self.values[pair][parity]

    def handles(self, pair: int) -> tuple[ort.OrtValue, ...]:
        return self.values[pair]

    def alive(self) -> bool:
        return not self.closed

    def to_host(self, buf: DeviceBuffer) -> np.ndarray:
        """One device-to-host copy (``OrtValue.numpy()``), under the capture gate; a CPU
        value's ``numpy()`` is a view of it instead, copied once (the tests' host-memory
        device)."""
        with CUDA_GATE.run():
            out = buf.handle.numpy()
            return out.copy() if self.device[0] == "cpu" else out

    def set(self, pair: int, value: Any) -> None:
        """Copy ``value`` (a host array, or a :class:`DeviceBuffer` read to the host first, in
        a gate section of its own) into the buffer the next run reads: one ``update_inplace``
        under the capture gate."""
        p = self.plan.pairs[pair]
        host = value.numpy() if isinstance(value, DeviceBuffer) else np.asarray(value)
        host = np.ascontiguousarray(host, dtype=p.dtype).reshape(p.shape)
        with CUDA_GATE.run():
            self.values[pair][self.parity].update_inplace(host)

    def swap(self) -> None:
        self.parity ^= 1

    def zero(self) -> None:
        """Zero both buffers of every pair, under the capture gate (a blocking copy each)."""
        with CUDA_GATE.run():
            for p, values in zip(self.plan.pairs, self.values, strict=True):
                zeros = np.zeros(p.shape, p.dtype)
                for v in values:
                    v.update_inplace(zeros)


def pinned_staging(nbytes: int, device_id: int) -> tuple[np.ndarray, Any] | None:
    """A host staging buffer in the CUDA provider's pinned (HOST_ACCESSIBLE) memory, as a
    zero-copy numpy view, with the OrtValue owning it; None where this ORT does not offer it
    (before 1.28, no CUDA EP device, no allocator for it, a view that is not zero-copy or not
    64-byte aligned): the caller then stages in pageable memory.

    ``OrtValue.ortvalue_from_shape_and_type(..., memory_info=ep_device.memory_info(
    OrtDeviceMemoryType.HOST_ACCESSIBLE))`` (onnxruntime_inference_collection.py, 1.28+)."""
    kinds = getattr(ort, "OrtDeviceMemoryType", None)
    if kinds is None or not hasattr(ort, "get_ep_devices"):
        return None
    try:
        for ep in ort.get_ep_devices():
            if ep.ep_name != CUDA:
                continue
            default = ep.memory_info(kinds.DEFAULT)
            if default is None or int(default.device_id) != device_id:
                continue
            info = ep.memory_info(kinds.HOST_ACCESSIBLE)
            if info is None:
                return None
            value = ort.OrtValue.ortvalue_from_shape_and_type([max(nbytes, 1)], np.uint8,
                                                              memory_info=info)
            view = value.numpy()
            if view.ctypes.data != value.data_ptr() or view.ctypes.data % 64:
                return None
            return view[:nbytes], value
    except Exception:  # noqa: BLE001 - pinned memory is an optimisation, never a failure
        return None
    return None


def cuda_available() -> bool:
    """True when this ORT build has the CUDA EP (a GPU may still be missing)."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


def gpu_present() -> bool:
    """True when an NVIDIA GPU device node exists (the CUDA EP needs one to run)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


__all__ = ["CUDA", "CUDA_GATE", "GRAPH_ID_KEY", "DeviceStaging", "DeviceState", "cuda_available",
           "cuda_exclusive", "cuda_shared", "gpu_present", "is_capture_refusal", "pinned_staging",
           "provider_list"]
