"""pyACL calls, checked: the constants the backend passes, the one place a ``ret`` becomes a
:class:`BackendError` (:func:`check`, :func:`handle`), process-wide ``acl.init``, and
:class:`Scratch`, device and host memory and datasets freed together.

Written to the documented pyACL API (CANN "pyACL API reference", aclpythondevg pages on
hiascend.com, cited at each call); see :mod:`gear_runtime.backends.acl`.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from typing import Any

import numpy as np

from gear_runtime.backends.base import import_runtime
from gear_runtime.errors import BackendError, BackendUnavailableError, GearFileError

INSTALL_HINT = ("pyACL ships with the CANN toolkit: install Ascend-cann-toolkit (and the NPU "
                "driver), then `source /usr/local/Ascend/ascend-toolkit/set_env.sh` so that "
                "`import acl` works")

#: aclrtMemMallocPolicy 0: huge pages above 1 MB, normal pages otherwise (pyACL "malloc",
#: hiascend.com/document/detail/zh/canncommercial/800/apiref/appdevgapi/aclpythondevg_01_0110.html)
ACL_MEM_MALLOC_HUGE_FIRST = 0
#: aclrtMemcpyKind (pyACL "memcpy", .../aclpythondevg_01_0120.html)
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
#: acl.init returns it when the process already initialised ACL (another library did);
#: mmdeploy's wrapper treats it as success too (mmdeploy/backend/ascend/wrapper.py).
ACL_ERROR_REPEAT_INITIALIZE = 100002

#: aclDataType (inc/external/acl/acl_base.h) -> numpy. bf16 (27) and the 4/6/8-bit types
#: have no numpy dtype: such a model is refused at load with a clear error.
ACL_DTYPES: dict[int, np.dtype] = {
    0: np.dtype(np.float32), 1: np.dtype(np.float16), 2: np.dtype(np.int8),
    3: np.dtype(np.int32), 4: np.dtype(np.uint8), 6: np.dtype(np.int16),
    7: np.dtype(np.uint16), 8: np.dtype(np.uint32), 9: np.dtype(np.int64),
    10: np.dtype(np.uint64), 11: np.dtype(np.float64), 12: np.dtype(np.bool_),
}

ALIGN = 64  # aclrtMallocHost / aclrtMalloc start addresses are 64-byte aligned
#: Sub-buffers carved from one aclrtMalloc block: each starts 64-byte aligned and owns at
#: least ALIGN_UP(len, 32) + 32 bytes (pyACL "malloc" constraints, aclpythondevg_01_0110).
PAD = 32


def import_acl() -> Any:
    """``import acl``, checked to be pyACL: PyPI has an unrelated package named ``acl``."""
    acl = import_runtime("acl", "acl", f"pyACL: {INSTALL_HINT}")
    missing = [n for n in ("init", "rt", "mdl") if not hasattr(acl, n)]
    if missing:
        where = getattr(acl, "__file__", None) or repr(acl)
        raise BackendUnavailableError(
            f"backend 'acl' needs pyACL, but `import acl` found {where}, which has no "
            f"{', '.join('acl.' + n for n in missing)}: probably PyPI's unrelated `acl` "
            f"package (`pip uninstall acl`); {INSTALL_HINT}")
    return acl


def check(ret: Any, call: str, context: str = "") -> None:
    """Raise BackendError naming ``call`` unless ``ret`` is 0 (ACL_SUCCESS)."""
    if ret != 0:
        raise BackendError(f"{call} failed with ACL error {ret}{context}", code=str(ret))


def handle(value: Any, call: str) -> int:
    """Handle constructors (create_desc, create_dataset, create_data_buffer) return 0 on
    failure and no ret (pyACL reference); turn that into a BackendError."""
    if not value:
        raise BackendError(f"{call} returned a null handle", code="")
    return int(value)


def np_dtype(acl_type: int, what: str) -> np.dtype:
    try:
        return ACL_DTYPES[int(acl_type)]
    except (KeyError, TypeError, ValueError):
        raise GearFileError(f"{what} has aclDataType {acl_type}, which has no numpy dtype "
                            f"(supported: {sorted(ACL_DTYPES)})") from None


def host_array(ptr: int, nbytes: int) -> np.ndarray:
    """A zero-copy uint8 numpy view of ``nbytes`` of host memory at ``ptr``.

    ctypes rather than ``acl.util.ptr_to_numpy``, which the pyACL reference marks as "to be
    deprecated" (aclpythondevg_01_0054.html) and whose replacement ``ptr_to_bytes`` copies.
    """
    return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))


_init_lock = threading.Lock()
#: the acl modules this process initialised (id -> module; kept alive so ids stay unique)
_initialized: dict[int, Any] = {}


def ensure_initialized(acl: Any) -> None:
    """acl.init once per process (CANN allows one aclInit / aclFinalize pair per process)."""
    with _init_lock:
        if id(acl) in _initialized:
            return
        ret = acl.init()
        if ret != ACL_ERROR_REPEAT_INITIALIZE:
            check(ret, "acl.init")
            atexit.register(acl.finalize)  # only when we were the ones to initialise
        _initialized[id(acl)] = acl


class Scratch:
    """Device buffers / data buffers / datasets that are freed together (best effort)."""

    def __init__(self, acl: Any) -> None:
        self.acl = acl
        self.device_ptrs: list[int] = []
        self.host_ptrs: list[int] = []
        self.buffers: list[int] = []
        self.datasets: list[int] = []

    def device(self, nbytes: int) -> int:
        # acl.rt.malloc(size, policy) -> (dev_ptr, ret); size must not be 0 (aclpythondevg_01_0110)
        ptr, ret = self.acl.rt.malloc(max(int(nbytes), 1), ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc", f" ({nbytes} bytes)")
        self.device_ptrs.append(ptr)
        return int(ptr)

    def host(self, nbytes: int) -> int:
        # acl.rt.malloc_host(size) -> (host_ptr, ret): pinned, 64-byte aligned
        # (aclpythondevg_01_0116)
        ptr, ret = self.acl.rt.malloc_host(max(int(nbytes), 1))
        check(ret, "acl.rt.malloc_host", f" ({nbytes} bytes)")
        self.host_ptrs.append(ptr)
        return int(ptr)

    def dataset(self) -> int:
        ds = handle(self.acl.mdl.create_dataset(), "acl.mdl.create_dataset")
        self.datasets.append(ds)
        return ds

    def add(self, dataset: int, ptr: int, nbytes: int) -> None:
        # acl.create_data_buffer(data, size) -> handle; acl.mdl.add_dataset_buffer(dataset,
        # data_buffer) -> (dataset, ret) (aclpythondevg_01_0188)
        buf = handle(self.acl.create_data_buffer(ptr, int(nbytes)), "acl.create_data_buffer")
        self.buffers.append(buf)
        _, ret = self.acl.mdl.add_dataset_buffer(dataset, buf)
        check(ret, "acl.mdl.add_dataset_buffer")

    def release(self, strict: bool) -> None:
        """Destroy datasets (which do not own their buffers), buffers, then memory."""
        acl, failures = self.acl, []
        failures += [("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset(d)) for d in self.datasets]
        failures += [("acl.destroy_data_buffer", acl.destroy_data_buffer(b)) for b in self.buffers]
        failures += [("acl.rt.free", acl.rt.free(p)) for p in self.device_ptrs]
        failures += [("acl.rt.free_host", acl.rt.free_host(p)) for p in self.host_ptrs]
        self.datasets, self.buffers, self.device_ptrs, self.host_ptrs = [], [], [], []
        if strict:
            for call, ret in failures:
                check(ret, call, " (while closing)")
