"""A faithful double of pyACL (``import acl``) for running the acl backend without an NPU.

What is faithful (CANN pyACL reference, "aclpythondevg" pages on hiascend.com; C prototypes in
``inc/external/acl/acl_mdl.h`` / ``acl_rt.h``):

* names and argument orders: ``acl.init()``, ``acl.rt.set_device(id)``,
  ``acl.rt.malloc(size, policy)``, ``acl.rt.malloc_host(size)``,
  ``acl.rt.memcpy(dst, dest_max, src, count, kind)``, ``acl.mdl.load_from_file(path)``,
  ``acl.mdl.set_input_dynamic_dims(model_id, dataset, index, {'name', 'dimCount', 'dims'})``,
  ``acl.mdl.get_input_dynamic_dims(desc, -1, gear_count)`` ... (see the methods below);
* return conventions: ``value, ret`` tuples where the C function has an out-parameter, a bare
  ``ret`` otherwise, a bare value (0 = null) for the handle constructors (``create_desc``,
  ``create_dataset``, ``create_data_buffer``); ret 0 is success;
* error codes: 100000 ACL_ERROR_INVALID_PARAM, 100001 ACL_ERROR_UNINITIALIZE, 100002
  ACL_ERROR_REPEAT_INITIALIZE, 100037 ACL_ERROR_REPEAT_FINALIZE (acl_base.h), 145002 model
  path invalid, 145003 model id invalid, 145006 model data size invalid, 145012 dynamic input
  length invalid, 145013 dynamic batch size invalid (ge_error_codes.h), 107002 context null,
  107004 model not in current context (rt_error_codes.h);
* contexts are per thread, as in acl_rt.h: ``set_device`` binds the device's default context
  to the calling thread, ``create_context`` binds the new context, ``set_context`` rebinds;
  malloc, memcpy and loading need a bound context (else 107002), and a model is executed and
  unloaded in the context it was loaded in ("must be performed in the same context", pyACL
  load_from_file / execute restrictions; else 107004);
* rejections the real stack makes: use before ``acl.init``, loading before a device is set,
  ``dimCount`` 0 / over 128 / not the model's total, static dims that differ, dims / batch /
  HW that are no gear, batch 0, H or W 0, memcpy beyond an allocation or with a kind that
  does not match where the pointers live, ``count > dest_max``, use after free;
* memory: pinned host memory (``malloc_host``) is real memory, 64-byte aligned as the docs
  promise, so callers can wrap it as numpy arrays; device memory lives in bytearrays behind
  fake pointers that do not point at host memory; the synchronous ``memcpy`` also takes
  pageable host memory (the aclrtMemcpy page sets no condition on it, and CANN's own aclnn
  samples copy device results into a ``std::vector``), which must be mapped in this process
  (readable as a source, writable as a destination: ``/proc/self/maps``), and each copy
  records whether its host end was pinned;
* GE's dynamic gears: the dims input ``ascend_mbatch_shape_data`` is the model's LAST input;
  ``set_*`` writes the gear's dynamic values into that input's device buffer, and ``execute``
  reads them back from device memory to choose the branch (MapIndex + Case);
  ``get_cur_output_dims`` reports the gear last set, or the largest gear when none was
  (aclmdlGetCurOutputDims' documented behaviour).

The fake ``.om`` is a JSON file (:func:`write_om`). Its outputs are checkable per gear:
``y = 2 * input0 + 1`` (input 0's gear shape, float32) and ``cat`` = every input flattened
and concatenated as float32 (shape ``(total elements of the gear,)``).
"""

from __future__ import annotations

import bisect
import ctypes
import json
import os
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---- documented constants -----------------------------------------------------------------
ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_MODEL_CONTEXT = 107004
ACL_ERROR_GE_PARAM_INVALID = 145000
ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID = 145002
ACL_ERROR_GE_EXEC_MODEL_ID_INVALID = 145003
ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID = 145006
ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013

ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEMCPY_DEFAULT = 4

ACL_MAX_DIM_CNT = 128
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"

#: aclDataType (acl_base.h) <-> numpy
ACL_DTYPE = {"float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6,
             "uint16": 7, "uint32": 8, "int64": 9, "uint64": 10, "float64": 11, "bool": 12}

#: Device pointers start here: far from where this process maps host memory, so a device
#: pointer handed to host code is caught (not silently read).
_DEVICE_BASE = 0x1000_0000_0000


# ---- the fake .om ----------------------------------------------------------------------------
def write_om(path: str | os.PathLike[str], inputs: Sequence[tuple[str, Sequence[int], str]],
             mode: str, gears: Sequence[Sequence[int]], dims_dtype: str = "int32",
             input_shape_order: Sequence[str] | None = None,
             dims_size: int | None = None, aipp: dict[int, int] | None = None) -> str:
    """Write a fake ``.om``: ``inputs`` = (name, shape with -1, numpy dtype name), in MODEL
    input order.

    ``mode`` is "batch" (gears ``[(n,), ...]``), "image_size" (``[(h, w), ...]``) or "dims"
    (one value per -1, in ``--input_shape`` then axis order, like ATC's ``--dynamic_dims``).
    ``input_shape_order``: the input names in the order ATC's ``--input_shape`` listed them
    (GE's user_designate_shape_order; default: model order). It may leave out static inputs,
    as ATC allows (multi_batch_clone_pass.cc, CheckAndParseDynamicData, walks the listed
    entries only): the dims then cover the listed inputs alone. ``dims_dtype`` is the width of
    ``ascend_mbatch_shape_data`` ("int32" or "int64"); ``dims_size`` the byte size
    ``get_input_size_by_index`` reports for it (default: exactly count * itemsize).
    ``aipp``: model input index -> aclmdlInputAippType (1 static, 2 with a dynamic AIPP input,
    3 the dynamic AIPP input itself) for a model built with atc --insert_op_conf.
    """
    names = [n for n, _, _ in inputs]
    order = list(input_shape_order) if input_shape_order is not None else names
    left_out = [(n, s) for n, s, _ in inputs if n not in order]
    if len(set(order)) != len(order) or not set(order) <= set(names) or \
            any(-1 in s for _, s in left_out):
        raise ValueError(f"input_shape_order {order} must name the inputs {names}, every "
                         "dynamic one among them")
    doc = {"format": "fake-om", "inputs": [{"name": n, "shape": list(s), "dtype": d}
                                           for n, s, d in inputs],
           "mode": mode, "gears": [list(g) for g in gears], "dims_dtype": dims_dtype,
           "order": order, "dims_size": dims_size,
           "aipp": {str(k): int(v) for k, v in (aipp or {}).items()}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return str(path)


@dataclass
class FakeOm:
    """A loaded fake model: its gears resolved to shapes (independently of gear_runtime)."""

    names: list[str]
    shapes: list[list[int]]  # with -1
    dtypes: list[np.dtype]
    mode: str
    gears: list[tuple[int, ...]]
    dims_dtype: np.dtype
    #: user_designate_shape_order: the --input_shape order the dims follow (model indices)
    order: list[int] = field(default_factory=list)
    dims_size: int | None = None
    current_gear: int | None = None
    aipp: dict[int, int] = field(default_factory=dict)  # input index -> AIPP type

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> FakeOm:
        if doc.get("format") != "fake-om":
            raise ValueError("not a fake om")
        names = [i["name"] for i in doc["inputs"]]
        order = [names.index(n) for n in doc.get("order") or names]
        return cls(names, [list(i["shape"]) for i in doc["inputs"]],
                   [np.dtype(i["dtype"]) for i in doc["inputs"]], doc["mode"],
                   [tuple(g) for g in doc["gears"]], np.dtype(doc.get("dims_dtype", "int32")),
                   order, doc.get("dims_size"),
                   aipp={int(k): int(v) for k, v in (doc.get("aipp") or {}).items()})

    def gear_shapes(self, g: int) -> list[tuple[int, ...]]:
        """Every input's static shape in gear ``g``, in model order (ATC's rules for the
        three modes; dims mode hands the values out in --input_shape order)."""
        values = list(self.gears[g])
        out = [tuple(s) for s in self.shapes]  # unlisted inputs are static
        if not self.has_dims:  # static (a -1 left there: a dynamic-shape model, no gears)
            return out
        k = 0
        for i in self.order:
            s, seen = list(self.shapes[i]), 0
            for axis, d in enumerate(s):
                if d != -1:
                    continue
                if self.mode == "batch":
                    s[axis] = values[0]
                elif self.mode == "image_size":
                    s[axis] = values[min(seen, 1)]
                else:
                    s[axis] = values[k]
                    k += 1
                seen += 1
            out[i] = tuple(s)
        return out

    @property
    def has_dims(self) -> bool:
        """Whether the model has the dims input ``ascend_mbatch_shape_data`` (last): every
        model atc built with gears; a static one (mode "static") has none."""
        return self.mode != "static"

    def template(self) -> list[int]:
        """The inputs' dims (-1 where dynamic) flattened in --input_shape order (GE's
        GetCurDynamicDims / aclmdlGetInputDynamicDims walk dataNameOrder)."""
        return [d for i in self.order for d in self.shapes[i]]

    def full_dims(self, g: int) -> list[int]:
        """Gear ``g``'s full dims, flattened in --input_shape order (not model order)."""
        shapes = self.gear_shapes(g)
        return [d for i in self.order for d in shapes[i]]

    @property
    def values_count(self) -> int:
        return len(self.gears[0])

    def input_nbytes(self, g: int, i: int) -> int:
        n = int(np.prod(self.gear_shapes(g)[i], dtype=np.int64))
        return max(n, 0) * self.dtypes[i].itemsize

    def max_input_nbytes(self, i: int) -> int:
        return max(self.input_nbytes(g, i) for g in range(len(self.gears)))

    def output_shapes(self, g: int) -> list[tuple[int, ...]]:
        shapes = self.gear_shapes(g)
        total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        return [shapes[0], (total,)]

    def largest_gear(self) -> int:
        sizes = [sum(self.input_nbytes(g, i) for i in range(len(self.names)))
                 for g in range(len(self.gears))]
        return int(np.argmax(sizes))

    def max_output_nbytes(self, k: int) -> int:
        return max(int(np.prod(self.output_shapes(g)[k], dtype=np.int64)) * 4
                   for g in range(len(self.gears)))

    def compute(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        y = arrays[0].astype(np.float32) * 2 + 1
        cat = np.concatenate([a.astype(np.float32).ravel() for a in arrays])
        return [y, cat]


OUTPUT_NAMES = ("y", "cat")


# ---- the double ------------------------------------------------------------------------------
def _mapped(ptr: int, count: int, perm: str) -> bool:
    """Whether ``[ptr, ptr + count)`` is mapped in this process with permission ``perm``
    ("r" or "w") throughout (adjacent mappings joined), from ``/proc/self/maps``."""
    if ptr <= 0 or count < 0:
        return False
    end, reached = ptr + max(count, 1), ptr
    with open("/proc/self/maps", encoding="ascii") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if hi <= reached or perm not in perms:
                continue
            if lo > reached:
                return False  # maps are sorted: a gap before the range's next byte
            reached = hi
            if reached >= end:
                return True
    return False


@dataclass
class Memcpy:
    dst: int
    dest_max: int
    src: int
    count: int
    kind: int
    #: whether the host end (source of a H2D, destination of a D2H) was ``malloc_host``
    #: memory; None for a copy with no host end or two
    pinned: bool | None = None


@dataclass
class _Host:
    raw: Any  # the ctypes array owning the memory (kept alive after free: see free_host)
    addr: int
    size: int


@dataclass
class FakeAclState:
    """Everything the double holds; tests read it to assert what the backend did."""

    initialized: bool = False
    finalized: bool = False
    #: device -> reference count: set_device adds one, reset_device takes one away
    #: (aclrtResetDevice "involves the implementation of reference counting")
    devices: dict[int, int] = field(default_factory=dict)
    contexts: dict[int, int] = field(default_factory=dict)  # ctx -> device
    host: dict[int, _Host] = field(default_factory=dict)
    freed_host: list[_Host] = field(default_factory=list)
    device: dict[int, bytearray] = field(default_factory=dict)
    #: device block -> the device it was allocated on (the current context's device)
    device_of: dict[int, int] = field(default_factory=dict)
    models: dict[int, FakeOm] = field(default_factory=dict)
    descs: dict[int, int | None] = field(default_factory=dict)  # desc -> model id
    buffers: dict[int, tuple[int, int]] = field(default_factory=dict)  # handle -> (addr, size)
    datasets: dict[int, list[int]] = field(default_factory=dict)
    #: every call, in order: ("rt.memcpy", args), ("mdl.execute", args), ...
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    memcpys: list[Memcpy] = field(default_factory=list)
    #: (model id, gear index) of every successful execute
    executions: list[tuple[int, int]] = field(default_factory=list)
    #: dataset -> the dynamic values its last successful set_* gave it (aclmdlDataset's
    #: dynamicBatchSize / dynamicResolutionHeight+Width / dynamicDims, acl model.cpp)
    dataset_dims: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: call name -> ret to return instead of running it (failure injection), e.g.
    #: seconds each execute and memcpy holds the GIL, as pyACL's wraps do (mdl_wrap.cpp
    #: WrapAclMdlExecute and rt_memory.cpp WrapAclRtMemcpy have no Py_BEGIN_ALLOW_THREADS):
    #: while the NPU runs, no other Python thread of the process runs
    device_seconds: float = 0.0
    #: ``state.fail["mdl.execute"] = 507011``
    fail: dict[str, int] = field(default_factory=dict)
    next_handle: int = 0x10

    def calls_named(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]

    def leaks(self) -> dict[str, int]:
        """Live resources (all zero once everything was closed)."""
        return {"host": len(self.host), "device": len(self.device), "models": len(self.models),
                "descs": len(self.descs), "buffers": len(self.buffers),
                "datasets": len(self.datasets), "contexts": len(self.contexts),
                "devices": len(self.devices)}


class FakeAcl:
    """``FakeAcl().module`` is the double of the ``acl`` module; ``.state`` is its state."""

    def __init__(self, device_count: int = 1) -> None:
        self.state = FakeAclState()
        self.device_count = device_count
        self._lock = threading.RLock()
        self._device_next = _DEVICE_BASE
        self._device_starts: list[int] = []
        self._model_next = 0
        self._bound = threading.local()  # .context: the context bound to the calling thread
        self._default_contexts: dict[int, int] = {}  # device -> its default context
        self._load_contexts: dict[int, int] = {}  # model id -> the context it was loaded in
        m = types.ModuleType("acl")
        m.__doc__ = "fake pyACL (tests/doubles/fake_acl.py)"
        m.rt = types.SimpleNamespace()
        m.mdl = types.SimpleNamespace()
        m.util = types.SimpleNamespace()
        for name, (space, conv) in _API.items():
            fn = self._wrap(name, conv, getattr(self, "_" + name.replace(".", "_")))
            target = m if space == "" else getattr(m, space)
            setattr(target, name.rsplit(".", 1)[-1], fn)
        self.module = m

    # ---- plumbing --------------------------------------------------------------------------
    def _wrap(self, name: str, conv: str, impl: Callable[..., Any]) -> Callable[..., Any]:
        """Record the call; apply injected failures in the function's return convention."""

        unsigned = _UNSIGNED_ARGS.get(name, ())

        def call(*args: Any) -> Any:
            for pos in unsigned:  # PyArg_ParseTuple "k" / "K": PyLong_Check, before any call
                if pos < len(args) and not isinstance(args[pos], int):
                    raise TypeError(f"acl.{name} args parse failed! (argument {pos + 1} is "
                                    f"{type(args[pos]).__name__}, not int)")
            with self._lock:
                self.state.calls.append((name, args))
                if name in self.state.fail:
                    ret = self.state.fail[name]
                    return {"pair": (0, ret), "ret": ret, "value": 0, "triple": (0, 0, ret)}[conv]
                if name != "init" and not self.state.initialized and conv != "value":
                    return {"pair": (0, ACL_ERROR_UNINITIALIZE),
                            "triple": (0, 0, ACL_ERROR_UNINITIALIZE)}.get(
                        conv, ACL_ERROR_UNINITIALIZE)
                result = impl(*args)
            if name in _HOLDS_GIL:  # outside the double's lock: only the GIL is held
                _hold_gil(self.state.device_seconds)
            return result

        call.__name__ = name.rsplit(".", 1)[-1]
        return call

    def _handle(self) -> int:
        self.state.next_handle += 0x10
        return self.state.next_handle

    def current_context(self) -> int | None:
        """The context bound to the calling thread (None: none yet)."""
        return getattr(self._bound, "context", None)

    # ---- acl -------------------------------------------------------------------------------
    def _init(self, config_path: str | None = None) -> int:
        if self.state.initialized:
            return ACL_ERROR_REPEAT_INITIALIZE
        self.state.initialized = True
        return ACL_SUCCESS

    def _finalize(self) -> int:
        if self.state.finalized:
            return ACL_ERROR_REPEAT_FINALIZE
        self.state.finalized = True
        self.state.initialized = False
        return ACL_SUCCESS

    def _create_data_buffer(self, data: int, size: int) -> int:
        if not self.state.initialized or size < 0 or (data == 0 and size != 0):
            return 0
        h = self._handle()
        self.state.buffers[h] = (int(data), int(size))
        return h

    def _destroy_data_buffer(self, buf: int) -> int:
        if self.state.buffers.pop(buf, None) is None:
            return ACL_ERROR_INVALID_PARAM
        return ACL_SUCCESS

    def _get_data_buffer_addr(self, buf: int) -> int:
        return self.state.buffers.get(buf, (0, 0))[0]

    def _get_data_buffer_size_v2(self, buf: int) -> int:
        return self.state.buffers.get(buf, (0, 0))[1]

    # ---- acl.rt ----------------------------------------------------------------------------
    def _rt_set_device(self, device_id: int) -> int:
        if not 0 <= device_id < self.device_count:
            return ACL_ERROR_INVALID_PARAM
        self.state.devices[device_id] = self.state.devices.get(device_id, 0) + 1
        # the device's default context (never in state.contexts: it cannot be destroyed)
        if device_id not in self._default_contexts:
            self._default_contexts[device_id] = self._handle()
        self._bound.context = self._default_contexts[device_id]
        return ACL_SUCCESS

    def _rt_reset_device(self, device_id: int) -> int:
        if device_id not in self.state.devices:
            return ACL_ERROR_INVALID_PARAM
        self.state.devices[device_id] -= 1
        if not self.state.devices[device_id]:
            del self.state.devices[device_id]
        return ACL_SUCCESS

    def _rt_create_context(self, device_id: int) -> tuple[int, int]:
        if device_id not in self.state.devices:
            return 0, ACL_ERROR_INVALID_PARAM
        ctx = self._handle()
        self.state.contexts[ctx] = device_id
        self._bound.context = ctx  # "ctx1 is bound to thread1 by default"
        return ctx, ACL_SUCCESS

    def _rt_set_context(self, ctx: int) -> int:
        if ctx not in self.state.contexts:
            return ACL_ERROR_INVALID_PARAM
        self._bound.context = ctx
        return ACL_SUCCESS

    def _rt_destroy_context(self, ctx: int) -> int:
        if self.state.contexts.pop(ctx, None) is None:
            return ACL_ERROR_INVALID_PARAM
        if self.current_context() == ctx:
            self._bound.context = None
        return ACL_SUCCESS

    def _rt_malloc(self, size: int, policy: int) -> tuple[int, int]:
        if size <= 0 or policy not in range(6):
            return 0, ACL_ERROR_INVALID_PARAM
        if self.current_context() is None:
            return 0, ACL_ERROR_RT_CONTEXT_NULL
        ptr = self._device_next
        self.state.device_of[ptr] = self._current_device()
        # aclrtMalloc rounds the size up to 32 and adds 32 (pyACL malloc page); the next block
        # starts 64-aligned after that, so a pointer past a block is never another block.
        self._device_next += ((size + 31) // 32 * 32 + 32 + 63) // 64 * 64 + 64
        self.state.device[ptr] = bytearray(size)
        bisect.insort(self._device_starts, ptr)
        return ptr, ACL_SUCCESS

    def _current_device(self) -> int:
        """The device of the context bound to the calling thread (a default one included)."""
        ctx = self.current_context()
        if ctx in self.state.contexts:
            return self.state.contexts[ctx]
        return next(d for d, c in self._default_contexts.items() if c == ctx)

    def _on_device(self, ptr: int, device: int) -> bool:
        """Whether device address ``ptr`` lies in a block allocated on ``device``: no peer
        access is enabled here (aclrtDeviceEnablePeerAccess), so memory of another device is
        neither a dataset buffer a model can use nor a device-to-device copy's end."""
        i = bisect.bisect_right(self._device_starts, ptr) - 1
        return i >= 0 and self.state.device_of.get(self._device_starts[i]) == device

    def _rt_free(self, ptr: int) -> int:
        if self.state.device.pop(ptr, None) is None:
            return ACL_ERROR_INVALID_PARAM
        self._device_starts.remove(ptr)
        del self.state.device_of[ptr]
        return ACL_SUCCESS

    def _rt_malloc_host(self, size: int) -> tuple[int, int]:
        if size <= 0:
            return 0, ACL_ERROR_INVALID_PARAM
        raw = (ctypes.c_ubyte * (size + 64))()
        addr = (ctypes.addressof(raw) + 63) // 64 * 64  # "首地址64字节对齐"
        self.state.host[addr] = _Host(raw, addr, size)
        return addr, ACL_SUCCESS

    def _rt_free_host(self, ptr: int) -> int:
        block = self.state.host.pop(ptr, None)
        if block is None:
            return ACL_ERROR_INVALID_PARAM
        # Keep the memory alive: a numpy view the caller forgot would read stale bytes, not
        # crash the test process; memcpy on it is rejected since it is no longer registered.
        self.state.freed_host.append(block)
        return ACL_SUCCESS

    def _find_device(self, ptr: int, count: int) -> tuple[bytearray, int] | None:
        i = bisect.bisect_right(self._device_starts, ptr) - 1
        if i < 0:
            return None
        base = self._device_starts[i]
        mem = self.state.device[base]
        off = ptr - base
        return (mem, off) if off >= 0 and off + count <= len(mem) else None

    def _pinned(self, ptr: int, count: int) -> bool:
        """Whether ``[ptr, ptr + count)`` lies in one live ``malloc_host`` block."""
        for block in self.state.host.values():
            if block.addr <= ptr and ptr + count <= block.addr + block.size:
                return True
        return False

    def _find_host(self, ptr: int, count: int, write: bool) -> bool:
        """Host memory a synchronous copy may use: pinned, or pageable memory mapped in this
        process with the access the copy needs (anything else would fault in the driver)."""
        return self._pinned(ptr, count) or _mapped(ptr, count, "w" if write else "r")

    def _rt_memcpy(self, dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
        if count > dest_max or count < 0 or kind not in range(5):
            return ACL_ERROR_INVALID_PARAM
        if self.current_context() is None:
            return ACL_ERROR_RT_CONTEXT_NULL
        src_dev, dst_dev = self._find_device(src, count), self._find_device(dst, count)
        src_host = src_dev is None and self._find_host(src, count, write=False)
        dst_host = dst_dev is None and self._find_host(dst, count, write=True)
        where = {ACL_MEMCPY_HOST_TO_HOST: (src_host, dst_host),
                 ACL_MEMCPY_HOST_TO_DEVICE: (src_host, dst_dev is not None),
                 ACL_MEMCPY_DEVICE_TO_HOST: (src_dev is not None, dst_host),
                 ACL_MEMCPY_DEVICE_TO_DEVICE: (src_dev is not None, dst_dev is not None),
                 ACL_MEMCPY_DEFAULT: (src_host or src_dev is not None,
                                      dst_host or dst_dev is not None)}[kind]
        if not all(where):
            return ACL_ERROR_INVALID_PARAM
        here = self._current_device()
        if (src_dev and not self._on_device(src, here)) or \
                (dst_dev and not self._on_device(dst, here)):
            return ACL_ERROR_INVALID_PARAM  # another device's memory, no peer access
        data = bytes(src_dev[0][src_dev[1]:src_dev[1] + count]) if src_dev else \
            ctypes.string_at(src, count)
        if dst_dev:
            dst_dev[0][dst_dev[1]:dst_dev[1] + count] = data
        else:
            ctypes.memmove(dst, data, count)
        host = [p for p, on_host in ((src, src_host), (dst, dst_host)) if on_host]
        pinned = self._pinned(host[0], count) if len(host) == 1 else None
        self.state.memcpys.append(Memcpy(dst, dest_max, src, count, kind, pinned))
        return ACL_SUCCESS

    # ---- acl.mdl: model and description ------------------------------------------------------
    def _mdl_load_from_file(self, path: str) -> tuple[int, int]:
        if self.current_context() is None:
            return 0, ACL_ERROR_RT_CONTEXT_NULL
        if not os.path.isfile(path):
            return 0, ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
        try:
            with open(path, encoding="utf-8") as f:
                om = FakeOm.parse(json.load(f))
        except (ValueError, KeyError, TypeError):
            return 0, ACL_ERROR_INVALID_FILE
        self._model_next += 1  # model ids are small integers, from 1
        model_id = self._model_next
        self.state.models[model_id] = om
        self._load_contexts[model_id] = self.current_context()
        return model_id, ACL_SUCCESS

    def _model_context_error(self, model_id: int) -> int:
        """Load, execute and unload must happen in the same context: 0 when they do."""
        if model_id not in self.state.models:
            return ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        ctx = self.current_context()
        if ctx is None:
            return ACL_ERROR_RT_CONTEXT_NULL
        return ACL_SUCCESS if ctx == self._load_contexts[model_id] else ACL_ERROR_RT_MODEL_CONTEXT

    def _mdl_unload(self, model_id: int) -> int:
        ret = self._model_context_error(model_id)
        if ret == ACL_SUCCESS:
            del self.state.models[model_id], self._load_contexts[model_id]
        return ret

    def _mdl_create_desc(self) -> int:
        if not self.state.initialized:
            return 0
        h = self._handle()
        self.state.descs[h] = None
        return h

    def _mdl_get_desc(self, desc: int, model_id: int) -> int:
        if desc not in self.state.descs:
            return ACL_ERROR_INVALID_PARAM
        if model_id not in self.state.models:
            return ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        self.state.descs[desc] = model_id
        return ACL_SUCCESS

    def _mdl_destroy_desc(self, desc: int) -> int:
        if self.state.descs.pop(desc, "missing") == "missing":
            return ACL_ERROR_INVALID_PARAM
        return ACL_SUCCESS

    def _om(self, desc: int) -> FakeOm | None:
        model_id = self.state.descs.get(desc)
        return None if model_id is None else self.state.models.get(model_id)

    def _input_entry(self, desc: int, index: int) -> tuple[str, list[int], np.dtype, int] | None:
        """(name, dims with -1, dtype, max bytes) of model input ``index`` of the model that
        ``desc`` describes (the dims input last); None for a bad desc or index."""
        om = self._om(desc)
        if om is None:
            return None
        n = len(om.names)
        if 0 <= index < n:
            return om.names[index], list(om.shapes[index]), om.dtypes[index], \
                om.max_input_nbytes(index)
        if index == n and om.has_dims:
            exact = om.values_count * om.dims_dtype.itemsize
            return (ACL_DYNAMIC_TENSOR_NAME, [om.values_count], om.dims_dtype,
                    exact if om.dims_size is None else om.dims_size)
        return None

    def _mdl_get_num_inputs(self, desc: int) -> int:
        om = self._om(desc)
        return 0 if om is None else len(om.names) + om.has_dims

    def _mdl_get_num_outputs(self, desc: int) -> int:
        return 0 if self._om(desc) is None else len(OUTPUT_NAMES)

    def _mdl_get_input_name_by_index(self, desc: int, index: int) -> str:
        entry = self._input_entry(desc, index)
        return "" if entry is None else entry[0]

    def _output_om(self, desc: int, index: int) -> FakeOm | None:
        """The model ``desc`` describes when ``index`` is one of its outputs, else None."""
        om = self._om(desc)
        return om if om is not None and 0 <= index < len(OUTPUT_NAMES) else None

    def _mdl_get_output_name_by_index(self, desc: int, index: int) -> str:
        return "" if self._output_om(desc, index) is None else OUTPUT_NAMES[index]

    def _mdl_get_input_dims(self, desc: int, index: int) -> tuple[dict[str, Any], int]:
        entry = self._input_entry(desc, index)
        if entry is None:
            return {}, ACL_ERROR_INVALID_PARAM
        return {"name": entry[0], "dimCount": len(entry[1]), "dims": entry[1]}, ACL_SUCCESS

    def _mdl_get_input_data_type(self, desc: int, index: int) -> int:
        entry = self._input_entry(desc, index)
        return -1 if entry is None else ACL_DTYPE[entry[2].name]

    def _mdl_get_input_size_by_index(self, desc: int, index: int) -> int:
        entry = self._input_entry(desc, index)
        return 0 if entry is None else entry[3]

    def _mdl_get_input_index_by_name(self, desc: int, name: str) -> tuple[int, int]:
        om = self._om(desc)
        if om is None:
            return 0, ACL_ERROR_INVALID_PARAM
        names = [*om.names, *([ACL_DYNAMIC_TENSOR_NAME] if om.has_dims else [])]
        return (names.index(name), ACL_SUCCESS) if name in names else (0, ACL_ERROR_INVALID_PARAM)

    def _mdl_get_aipp_type(self, model_id: int, index: int) -> tuple[int, int, int]:
        """aclmdlGetAippType: (type, dynamic_attached_data_index, ret); the index is
        0xFFFFFFFF unless type is ACL_DATA_WITH_DYNAMIC_AIPP (aclpythondevg_01_0157)."""
        om = self.state.models.get(model_id)
        if om is None:
            return 0, 0xFFFFFFFF, ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        if not 0 <= index <= len(om.names):
            return 0, 0xFFFFFFFF, ACL_ERROR_INVALID_PARAM
        kind = om.aipp.get(index, 0)
        attached = next((j for j, t in om.aipp.items() if t == 3), 0xFFFFFFFF) if kind == 2 \
            else 0xFFFFFFFF
        return kind, attached, ACL_SUCCESS

    def _out_dims(self, om: FakeOm, gear: int, index: int) -> dict[str, Any]:
        dims = list(om.output_shapes(gear)[index])
        return {"name": OUTPUT_NAMES[index], "dimCount": len(dims), "dims": dims}

    def _mdl_get_output_dims(self, desc: int, index: int) -> tuple[dict[str, Any], int]:
        om = self._output_om(desc, index)
        if om is None:
            return {}, ACL_ERROR_INVALID_PARAM
        return self._out_dims(om, om.largest_gear(), index), ACL_SUCCESS

    def _mdl_get_cur_output_dims(self, desc: int, index: int) -> tuple[dict[str, Any], int]:
        om = self._output_om(desc, index)
        if om is None:
            return {}, ACL_ERROR_INVALID_PARAM
        gear = om.largest_gear() if om.current_gear is None else om.current_gear
        return self._out_dims(om, gear, index), ACL_SUCCESS

    def _mdl_get_output_data_type(self, desc: int, index: int) -> int:
        return -1 if self._output_om(desc, index) is None else ACL_DTYPE["float32"]

    def _mdl_get_output_size_by_index(self, desc: int, index: int) -> int:
        om = self._output_om(desc, index)
        return 0 if om is None else om.max_output_nbytes(index)

    def _mdl_get_dynamic_batch(self, desc: int) -> tuple[dict[str, Any], int]:
        om = self._om(desc)
        if om is None:
            return {}, ACL_ERROR_INVALID_PARAM
        batch = [g[0] for g in om.gears] if om.mode == "batch" else []
        return {"batchCount": len(batch), "batch": batch}, ACL_SUCCESS

    def _mdl_get_dynamic_hw(self, desc: int, index: int) -> tuple[dict[str, Any], int]:
        om = self._om(desc)
        if om is None or index != -1:
            return {}, ACL_ERROR_INVALID_PARAM
        hw = [[g[0], g[1]] for g in om.gears] if om.mode == "image_size" else []
        return {"hwCount": len(hw), "hw": hw}, ACL_SUCCESS

    def _mdl_get_input_dynamic_gear_count(self, desc: int, index: int) -> tuple[int, int]:
        om = self._om(desc)
        if om is None or index != -1:
            return 0, ACL_ERROR_INVALID_PARAM
        return (len(om.gears) if om.mode == "dims" else 0), ACL_SUCCESS

    def _mdl_get_input_dynamic_dims(self, desc: int, index: int,
                                    gear_count: int) -> tuple[list[dict[str, Any]], int]:
        om = self._om(desc)
        if om is None or index != -1 or om.mode != "dims" or gear_count < len(om.gears):
            return [], ACL_ERROR_INVALID_PARAM  # "gearCount must be >= the model's count"
        out = []
        for g in range(len(om.gears)):
            dims = om.full_dims(g)
            out.append({"name": "", "dimCount": len(dims), "dims": dims})
        return out, ACL_SUCCESS

    # ---- acl.mdl: datasets -----------------------------------------------------------------
    def _mdl_create_dataset(self) -> int:
        if not self.state.initialized:
            return 0
        h = self._handle()
        self.state.datasets[h] = []
        return h

    def _mdl_add_dataset_buffer(self, dataset: int, buf: int) -> tuple[int, int]:
        if dataset not in self.state.datasets or buf not in self.state.buffers:
            return dataset, ACL_ERROR_INVALID_PARAM
        self.state.datasets[dataset].append(buf)
        return dataset, ACL_SUCCESS

    def _mdl_get_dataset_num_buffers(self, dataset: int) -> int:
        return len(self.state.datasets.get(dataset, []))

    def _mdl_get_dataset_buffer(self, dataset: int, index: int) -> int:
        bufs = self.state.datasets.get(dataset, [])
        return bufs[index] if 0 <= index < len(bufs) else 0

    def _mdl_destroy_dataset(self, dataset: int) -> int:
        # aclmdlDestroyDataset does not destroy the data buffers: the caller does.
        if self.state.datasets.pop(dataset, None) is None:
            return ACL_ERROR_INVALID_PARAM
        return ACL_SUCCESS

    # ---- acl.mdl: dynamic gears and execution -----------------------------------------------
    def _dims_buffer(self, model_id: int, dataset: int, index: int,
                     ) -> tuple[FakeOm, bytearray, int, int] | int:
        """The model and the device bytes (memory, offset, the data buffer's length) of its
        dims input in ``dataset``, or an error."""
        om = self.state.models.get(model_id)
        if om is None:
            return ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        bufs = self.state.datasets.get(dataset)
        if bufs is None or index != len(om.names) or not 0 <= index < len(bufs):
            return ACL_ERROR_INVALID_PARAM
        addr, size = self.state.buffers.get(bufs[index], (0, 0))
        found = self._find_device(addr, size)
        if found is None or size == 0:
            return ACL_ERROR_INVALID_PARAM  # GE: ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID
        return om, found[0], found[1], size

    def _write_dims(self, model_id: int, dataset: int, index: int, mode: str,
                    values: Sequence[int]) -> int:
        """GeExecutor::SetDynamicBatchSize / SetDynamicImageSize / SetDynamicDims: the gear
        is checked, then each value is written as a uint64 when the data buffer holds 8 bytes
        per value, else as a uint32 (fewer than 4 bytes per value: 145012), whatever the
        model's own dims dtype is (ge_executor.cc)."""
        target = self._dims_buffer(model_id, dataset, index)
        if isinstance(target, int):
            return target
        om, mem, off, size = target
        if om.mode != mode:
            return ACL_ERROR_INVALID_PARAM
        values = tuple(int(v) for v in values)
        # SetDynamicBatchSize / SetDynamicImageSize check the buffer length first, then the
        # gear; SetDynamicDims is reached after GetCurDynamicDims checked the dims (ge_executor.cc)
        short = size < 4 * len(values)
        if short and mode != "dims":
            return ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
        if values not in om.gears:
            return ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        if short:
            return ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
        width = "<u8" if size >= 8 * len(values) else "<u4"
        raw = np.asarray(values, dtype=width).tobytes()
        mem[off:off + len(raw)] = raw
        om.current_gear = om.gears.index(values)
        self.state.dataset_dims[dataset] = values
        return ACL_SUCCESS

    def _mdl_set_dynamic_batch_size(self, model_id: int, dataset: int, index: int,
                                    batch: int) -> int:
        if batch <= 0:  # aclmdlSetDynamicBatchSize rejects 0
            return ACL_ERROR_INVALID_PARAM
        return self._write_dims(model_id, dataset, index, "batch", [batch])

    def _mdl_set_dynamic_hw_size(self, model_id: int, dataset: int, index: int,
                                 height: int, width: int) -> int:
        if height <= 0 or width <= 0:
            return ACL_ERROR_INVALID_PARAM
        return self._write_dims(model_id, dataset, index, "image_size", [height, width])

    def _mdl_set_input_dynamic_dims(self, model_id: int, dataset: int, index: int,
                                    dims: Any) -> int:
        count, values = _parse_io_dims(dims)
        if not 0 < count <= ACL_MAX_DIM_CNT:
            return ACL_ERROR_INVALID_PARAM  # dimCount 0 is rejected
        om = self.state.models.get(model_id)
        if om is None:
            return ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        if om.mode != "dims":
            return ACL_ERROR_INVALID_PARAM
        # GeExecutor::GetCurDynamicDims: the dims follow user_designate_shape_order; length,
        # static dims, then the gear
        template = om.template()
        if len(values) != len(template):
            return ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
        if any(t != -1 and t != v for t, v in zip(template, values, strict=True)):
            return ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID  # "Static dims should be same"
        dynamic = [v for t, v in zip(template, values, strict=True) if t == -1]
        return self._write_dims(model_id, dataset, index, "dims", dynamic)

    def _mdl_execute(self, model_id: int, dataset_in: int, dataset_out: int) -> int:
        ret = self._model_context_error(model_id)
        if ret != ACL_SUCCESS:
            return ret
        om = self.state.models[model_id]
        ins, outs = self.state.datasets.get(dataset_in), self.state.datasets.get(dataset_out)
        if ins is None or outs is None or len(ins) != len(om.names) + om.has_dims \
                or len(outs) != len(OUTPUT_NAMES):
            return ACL_ERROR_INVALID_PARAM
        if not om.has_dims:  # a static model: its one gear, every buffer its full size
            for i in range(len(om.names)):
                _, got = self.state.buffers.get(ins[i], (0, 0))
                if got + 64 < om.max_input_nbytes(i):
                    return ACL_ERROR_GE_PARAM_INVALID
            return self._run(model_id, om, 0, ins, outs, dynamic=None)
        target = self._dims_buffer(model_id, dataset_in, len(om.names))
        if isinstance(target, int):
            return target
        _, mem, off, size = target
        need = om.values_count * om.dims_dtype.itemsize  # the model reads its own dtype
        if size < need:
            return ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
        dynamic = self.state.dataset_dims.get(dataset_in)
        if dynamic is None:
            # No set_* on this dataset: GE runs it as static (is_dynamic_ false) and checks
            # every buffer against the model's size, 64 bytes of slack (davinci_model.cc
            # CheckUserAndModelSize, kDataMemAlignSizeCompare)
            for i in range(len(om.names)):
                _, got = self.state.buffers.get(ins[i], (0, 0))
                if got + 64 < om.max_input_nbytes(i):
                    return ACL_ERROR_GE_PARAM_INVALID
            values = tuple(int(v) for v in np.frombuffer(bytes(mem[off:off + need]),
                                                         dtype=om.dims_dtype))
        else:
            values = dynamic
            # The graph's Case reads the dims from the device buffer; the dataset's recorded
            # dims are what set_* wrote there. Bytes that differ (the buffer overwritten after
            # set_*, or shared with another gear's dataset) would run another gear on the
            # NPU: the double refuses them rather than trust the recorded dims.
            held = tuple(int(v) for v in np.frombuffer(bytes(mem[off:off + need]),
                                                       dtype=om.dims_dtype))
            if held[:len(values)] != values:
                return ACL_ERROR_GE_PARAM_INVALID
        # SetDynamicInputDataFlag (ge_executor.cc): match_idx starts at 0 and stays 0 when no
        # gear matches: GE SILENTLY runs gear 0, never an error
        gear = om.gears.index(values) if values in om.gears else 0
        return self._run(model_id, om, gear, ins, outs, dynamic)

    def _run(self, model_id: int, om: FakeOm, gear: int, ins: list[int], outs: list[int],
             dynamic: Any) -> int:
        """Read gear ``gear``'s inputs from the device, compute, write the outputs."""
        here = self._current_device()
        for buf in ins + outs:  # every buffer on the model's device (no peer access)
            addr, size = self.state.buffers.get(buf, (0, 0))
            if size and not self._on_device(addr, here):
                return ACL_ERROR_INVALID_PARAM
        arrays = []
        for i, shape in enumerate(om.gear_shapes(gear)):
            addr, size = self.state.buffers.get(ins[i], (0, 0))
            need = om.input_nbytes(gear, i)
            found = self._find_device(addr, need)
            if found is None or size < need or (dynamic is not None
                                                and size > om.max_input_nbytes(i)):
                return ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
            raw = bytes(found[0][found[1]:found[1] + need])
            arrays.append(np.frombuffer(raw, dtype=om.dtypes[i]).reshape(shape))
        results = om.compute(arrays)
        for k, result in enumerate(results):
            addr, size = self.state.buffers.get(outs[k], (0, 0))
            raw = result.astype(np.float32).tobytes()
            found = self._find_device(addr, len(raw))
            if found is None or size < om.max_output_nbytes(k):
                return ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
            found[0][found[1]:found[1] + len(raw)] = raw
        self.state.executions.append((model_id, gear))
        return ACL_SUCCESS


def _parse_io_dims(dims: Any) -> tuple[int, list[int]]:
    """pyACL's own argument parsing of an aclmdlIODims dict (WrapAclMdlSetInputDynamicDims in
    pyACL's C extension): a dict; ``dimCount`` a Python int (PyLong_AsSize_t); ``name``, if
    present, a str; ``dims`` a list (PyList_Check: no tuple, no numpy array) whose first
    ``dimCount`` items are Python ints (PyLong type check: no numpy integers, no floats).
    Anything else raises, as the C extension does, before any ACL call."""
    if not isinstance(dims, dict):
        raise TypeError("argument 4 is not dict")
    count = dims.get("dimCount")
    if not isinstance(count, int):
        raise TypeError(f"dimCount must be an int, got {type(count).__name__}")
    if count < 0:
        raise OverflowError("can't convert negative value to size_t")
    if "name" in dims and not isinstance(dims["name"], str):
        raise RuntimeError("PyUnicode_AsUTF8String failed")
    items = dims.get("dims")
    if not isinstance(items, list):
        raise TypeError("The dims of parameter 4 is not a list.")
    if len(items) < min(count, ACL_MAX_DIM_CNT + 1) or \
            not all(isinstance(v, int) for v in items[:count]):
        raise TypeError("the dims of fourth parameter is not list of int")
    return count, [int(v) for v in items[:count]]


#: Arguments pyACL parses with "k" / "K" (pointers, sizes, the batch and H/W values):
#: PyArg_ParseTuple accepts only Python ints there (PyLong_Check: a numpy.int64 is a
#: TypeError). hicann/runtime python/pyACL: rt/rt_memory.cpp WrapAclRtMalloc "ki",
#: WrapAclRtMallocHost "k", WrapAclRtMemcpy "kkkki", WrapAclRtFree / FreeHost "k";
#: WrapAclCreateDataBuffer / WrapAclDestroyDataBuffer "kk" / "k"; mdl/mdl_wrap.cpp
#: WrapAclMdlSetDynamicBatchSize "IkkK", WrapAclMdlSetDynamicHWSize "IkkKK",
#: WrapAclMdlExecute "Ikk", WrapAclMdlAddDatasetBuffer "kk", WrapAclMdlDestroyDataset "k".
_UNSIGNED_ARGS: dict[str, tuple[int, ...]] = {
    "rt.malloc": (0,), "rt.malloc_host": (0,), "rt.memcpy": (0, 1, 2, 3),
    "rt.free": (0,), "rt.free_host": (0,), "create_data_buffer": (0, 1),
    "destroy_data_buffer": (0,), "mdl.add_dataset_buffer": (0, 1),
    "mdl.destroy_dataset": (0,), "mdl.execute": (1, 2),
    "mdl.set_dynamic_batch_size": (1, 2, 3), "mdl.set_dynamic_hw_size": (1, 2, 3, 4),
    "mdl.set_input_dynamic_dims": (1, 2),
}

#: The calls pyACL makes without releasing the GIL for the device's time.
_HOLDS_GIL = frozenset({"mdl.execute", "rt.memcpy"})
# PyDLL: ctypes keeps the GIL held for the call, as a C extension that never releases it does
_LIBC = ctypes.PyDLL(None)


def _hold_gil(seconds: float) -> None:
    """Block the calling thread for ``seconds`` WITH the GIL held (no other Python thread
    runs meanwhile), as pyACL's execute does while the NPU computes."""
    if seconds > 0:
        _LIBC.usleep(int(seconds * 1e6))


#: public name -> (namespace, return convention): "pair" = (value, ret), "ret" = ret only,
#: "value" = a handle or value only (0 / "" on failure, no ret), "triple" = (value, value, ret).
_API: dict[str, tuple[str, str]] = {
    "init": ("", "ret"), "finalize": ("", "ret"),
    "create_data_buffer": ("", "value"), "destroy_data_buffer": ("", "ret"),
    "get_data_buffer_addr": ("", "value"), "get_data_buffer_size_v2": ("", "value"),
    "rt.set_device": ("rt", "ret"), "rt.reset_device": ("rt", "ret"),
    "rt.create_context": ("rt", "pair"), "rt.set_context": ("rt", "ret"),
    "rt.destroy_context": ("rt", "ret"),
    "rt.malloc": ("rt", "pair"), "rt.free": ("rt", "ret"),
    "rt.malloc_host": ("rt", "pair"), "rt.free_host": ("rt", "ret"),
    "rt.memcpy": ("rt", "ret"),
    "mdl.load_from_file": ("mdl", "pair"), "mdl.unload": ("mdl", "ret"),
    "mdl.create_desc": ("mdl", "value"), "mdl.get_desc": ("mdl", "ret"),
    "mdl.destroy_desc": ("mdl", "ret"),
    "mdl.get_num_inputs": ("mdl", "value"), "mdl.get_num_outputs": ("mdl", "value"),
    "mdl.get_input_name_by_index": ("mdl", "value"),
    "mdl.get_output_name_by_index": ("mdl", "value"),
    "mdl.get_input_dims": ("mdl", "pair"), "mdl.get_output_dims": ("mdl", "pair"),
    "mdl.get_cur_output_dims": ("mdl", "pair"),
    "mdl.get_input_data_type": ("mdl", "value"), "mdl.get_output_data_type": ("mdl", "value"),
    "mdl.get_input_size_by_index": ("mdl", "value"),
    "mdl.get_output_size_by_index": ("mdl", "value"),
    "mdl.get_input_index_by_name": ("mdl", "pair"),
    "mdl.get_dynamic_batch": ("mdl", "pair"), "mdl.get_dynamic_hw": ("mdl", "pair"),
    "mdl.get_input_dynamic_gear_count": ("mdl", "pair"),
    "mdl.get_input_dynamic_dims": ("mdl", "pair"),
    "mdl.create_dataset": ("mdl", "value"), "mdl.add_dataset_buffer": ("mdl", "pair"),
    "mdl.get_dataset_num_buffers": ("mdl", "value"), "mdl.get_dataset_buffer": ("mdl", "value"),
    "mdl.destroy_dataset": ("mdl", "ret"),
    "mdl.set_dynamic_batch_size": ("mdl", "ret"), "mdl.set_dynamic_hw_size": ("mdl", "ret"),
    "mdl.set_input_dynamic_dims": ("mdl", "ret"),
    "mdl.execute": ("mdl", "ret"),
    "mdl.get_aipp_type": ("mdl", "triple"),
}
