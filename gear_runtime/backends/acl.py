"""Ascend backend through pyACL: run ``.om`` models that ATC compiled with dynamic gears.

Written to the documented pyACL API (CANN "pyACL API reference", aclpythondevg pages on
hiascend.com, cited at each call) and tested against the double in
``tests/doubles/fake_acl.py``; it has NOT been run on Ascend hardware here (docs/ascend.md).

Load (:func:`open_model`): ``acl.init`` once per process, ``acl.rt.set_device``, a context,
``acl.mdl.load_from_file``, the model description, and the gears read back from it:
``get_dynamic_batch`` / ``get_input_dynamic_gear_count`` + ``get_input_dynamic_dims`` /
``get_dynamic_hw`` (mmdeploy's Ascend wrapper checks them in this order on hardware). They
become a :class:`GearSpec`, so the executor applies the same O(1) gear table and the same
errors as on every backend: an out-of-gear request fails before any ACL call. Per-gear output
shapes come from ``get_cur_output_dims`` after setting each gear once at load (a table, so
runs never query the model-global "current gear", which two executors would race on).

Memory, one session per executor (:class:`AclSession`)::

    pinned host staging (malloc_host, layout.total_bytes)    <- the C++ core stages here
        | ONE acl.rt.memcpy H2D of layout.merged_span(g)     (+ one per layout.separate(g))
        v
    device region (malloc, layout.total_bytes), same offsets <- gear g's dataset points into it
        set_* writes the dims into ascend_mbatch_shape_data, acl.mdl.execute
    device outputs (malloc, largest gear) --one D2H memcpy per output--> pinned host outputs

The device region mirrors the staging byte for byte, so the merged span is a single copy, as
in GE's CopyInputDataWithMergeH2D. Its data buffers are carved out of one aclrtMalloc block,
so each must start 64-byte aligned and own ALIGN_UP(len, 32) + 32 bytes (pyACL "malloc"
constraints): :attr:`AclModel.layout_options` asks the layout for exactly that (alignment 64,
tail_padding 32; GearModel plans with it), and a session refuses a layout that breaks it.
Datasets (one per gear: the offsets differ per gear) are built once per session; a run is
memcpy(s), one ``set_*``, ``execute``, output memcpys.
Every non-zero ``ret`` raises :class:`BackendError` naming the call, with ``.code = str(ret)``.

Threads: sessions are per executor, but ACL forbids concurrent use of one model id ("lock
memcpy -> execute as one sequence"), so runs of one model are serialised by the model's lock.
ACL contexts are per thread and a model runs in the context it was loaded in, so every run
makes the model's context current (``acl.rt.set_context``: binding a thread-local, cheap):
an executor may move between threads, and one thread may drive several models.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gear_runtime.backends.base import (
    BackendModel,
    BackendSession,
    ModelInfo,
    import_runtime,
)
from gear_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    GearFileError,
    GearSpecError,
    InputError,
)
from gear_runtime.spec import GearSpec
from gear_runtime.spec.parse import parse_input_shape

INSTALL_HINT = ("pyACL ships with the CANN toolkit: install Ascend-cann-toolkit (and the NPU "
                "driver), then `source /usr/local/Ascend/ascend-toolkit/set_env.sh` so that "
                "`import acl` works")

#: ACL_DYNAMIC_TENSOR_NAME (acl_mdl.h): GE's extra input carrying the current gear's dims.
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
#: aclrtMemMallocPolicy 0: huge pages above 1 MB, normal pages otherwise (pyACL "malloc",
#: hiascend.com/document/detail/zh/canncommercial/800/apiref/appdevgapi/aclpythondevg_01_0110.html)
ACL_MEM_MALLOC_HUGE_FIRST = 0
#: aclrtMemcpyKind (pyACL "memcpy", .../aclpythondevg_01_0120.html)
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
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

_ALIGN = 64  # aclrtMallocHost / aclrtMalloc start addresses are 64-byte aligned
#: Sub-buffers carved from one aclrtMalloc block: each starts 64-byte aligned and owns at
#: least ALIGN_UP(len, 32) + 32 bytes (pyACL "malloc" constraints, aclpythondevg_01_0110).
_PAD = 32


def open_model(path: str, *, device_id: int = 0, input_shape: str | None = None) -> AclModel:
    """Load the ``.om`` at ``path`` on NPU ``device_id`` and read its gears.

    ``input_shape`` is the ``--input_shape`` ATC compiled the model with. In dims mode ACL
    orders the flattened dims by it (GE's user_designate_shape_order), and no ACL query
    returns that order: without it the order is inferred from the gears' dims, and a model
    whose dims fit several orders is refused (GearFileError saying to pass it). The spec's
    input order is this order.

    Raises BackendUnavailableError (what to install) when pyACL is missing or ``import acl``
    finds another module, GearFileError when the file is missing or not a dynamic-gear model,
    GearSpecError when ``input_shape`` does not describe the model's inputs, BackendError when
    an ACL call fails.
    """
    return AclModel(_import_acl(), path, device_id, input_shape)


def _import_acl() -> Any:
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


# ---- small helpers ---------------------------------------------------------------------------
def _check(ret: Any, call: str, context: str = "") -> None:
    """Raise BackendError naming ``call`` unless ``ret`` is 0 (ACL_SUCCESS)."""
    if ret != 0:
        raise BackendError(f"{call} failed with ACL error {ret}{context}", code=str(ret))


def _handle(value: Any, call: str) -> int:
    """Handle constructors (create_desc, create_dataset, create_data_buffer) return 0 on
    failure and no ret (pyACL reference); turn that into a BackendError."""
    if not value:
        raise BackendError(f"{call} returned a null handle", code="")
    return int(value)


def _np_dtype(acl_type: int, what: str) -> np.dtype:
    try:
        return ACL_DTYPES[int(acl_type)]
    except (KeyError, TypeError, ValueError):
        raise GearFileError(f"{what} has aclDataType {acl_type}, which has no numpy dtype "
                            f"(supported: {sorted(ACL_DTYPES)})") from None


def _host_array(ptr: int, nbytes: int) -> np.ndarray:
    """A zero-copy uint8 numpy view of ``nbytes`` of host memory at ``ptr``.

    ctypes rather than ``acl.util.ptr_to_numpy``, which the pyACL reference marks as "to be
    deprecated" (aclpythondevg_01_0054.html) and whose replacement ``ptr_to_bytes`` copies.
    """
    return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))


def _span(value: Any) -> tuple[int, int]:
    """A layout span ``(start, end)`` (both cores return a pair) as ints."""
    start, end = value
    return int(start), int(end)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _dims_of(d: Any, what: str) -> tuple[int, ...]:
    """The dims of an aclmdlIODims dict ({'name', 'dimCount', 'dims'})."""
    try:
        return tuple(int(x) for x in list(d["dims"])[: int(d["dimCount"])])
    except (KeyError, TypeError, ValueError):
        raise BackendError(f"{what}: pyACL returned {d!r}, not an aclmdlIODims dict") from None


#: Orders of the inputs tried when inferring ACL's dims order, before giving up
_MAX_ORDER_STEPS = 100_000


def _fitting_orders(dims: Sequence[tuple[int, ...]], full: Sequence[tuple[int, ...]],
                    ) -> list[tuple[tuple[int, ...], tuple[Any, ...]]]:
    """Orders of the inputs (described ``dims``, -1 where dynamic) that every gear's ``full``
    dims fit, as (order, shapes per gear) with distinct shapes: at most two (enough to call
    the order ambiguous). Depth-first in model order, so model order comes first if it fits.
    GearFileError when the search grows past a bound (many interchangeable inputs)."""
    found: list[tuple[tuple[int, ...], tuple[Any, ...]]] = []
    steps = 0

    def fits(p: int, at: int) -> bool:
        return all(at + len(dims[p]) <= len(f) and all(
            d < 0 or f[at + a] == d for a, d in enumerate(dims[p])) for f in full)

    def walk(order: list[int], at: int) -> None:
        nonlocal steps
        steps += 1
        if steps > _MAX_ORDER_STEPS:
            raise GearFileError("the order of the dims could not be inferred (too many "
                                "possible orders): pass input_shape= to gr.load")
        if len(order) == len(dims):
            shapes = _shapes_in(order, dims, full)
            if at == len(full[0]) and all(s != shapes for _, s in found):
                found.append((tuple(order), shapes))
            return
        for p in range(len(dims)):
            if len(found) < 2 and p not in order and fits(p, at):
                walk([*order, p], at + len(dims[p]))

    walk([], 0)
    return found


def _shapes_in(order: Sequence[int], dims: Sequence[tuple[int, ...]],
               full: Sequence[tuple[int, ...]]) -> tuple[Any, ...]:
    """Per gear, each input's shape (by model position) when ``full`` follows ``order``."""
    out = []
    for f in full:
        shapes: dict[int, tuple[int, ...]] = {}
        at = 0
        for p in order:
            shapes[p] = tuple(f[at:at + len(dims[p])])
            at += len(dims[p])
        out.append(tuple(shapes[p] for p in range(len(dims))))
    return tuple(out)


_init_lock = threading.Lock()
#: the acl modules this process initialised (id -> module; kept alive so ids stay unique)
_initialized: dict[int, Any] = {}


def _ensure_initialized(acl: Any) -> None:
    """acl.init once per process (CANN allows one aclInit / aclFinalize pair per process)."""
    with _init_lock:
        if id(acl) in _initialized:
            return
        ret = acl.init()
        if ret != ACL_ERROR_REPEAT_INITIALIZE:
            _check(ret, "acl.init")
            atexit.register(acl.finalize)  # only when we were the ones to initialise
        _initialized[id(acl)] = acl


@dataclass(frozen=True)
class _Tensors:
    """What the description says about the user inputs or the outputs, in model order."""

    names: tuple[str, ...]
    dims: tuple[tuple[int, ...], ...]  # -1 on dynamic axes (inputs), largest gear (outputs)
    dtypes: tuple[np.dtype, ...]
    sizes: tuple[int, ...]  # bytes; for inputs and outputs: the largest gear


# ---- the model -------------------------------------------------------------------------------
class AclModel(BackendModel):
    """An ``.om`` loaded on one NPU: model id, description, gears and output-shape table."""

    name = "acl"
    #: The device region mirrors the staging layout and its data buffers are carved out of
    #: one aclrtMalloc block: 64-aligned starts, ALIGN_UP(len, 32) + 32 bytes each.
    layout_options: ClassVar[dict[str, int]] = {"alignment": _ALIGN, "tail_padding": _PAD}

    def __init__(self, acl: Any, path: str, device_id: int = 0,
                 input_shape: str | None = None) -> None:
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
            raise InputError(f"device_id must be a non-negative int, got {device_id!r}")
        if not os.path.isfile(path):
            raise GearFileError(f"model file {path!r} does not exist or is not a file")
        self.acl, self.path, self.device_id = acl, path, device_id
        #: ATC's --input_shape as (names, shapes), the order ACL's dims follow; None: infer
        self._declared = None if input_shape is None else parse_input_shape(input_shape)
        self.context: int | None = None
        self.model_id: int | None = None
        self.desc: int | None = None
        self._device_set = False
        self._closed = False
        self._sessions: weakref.WeakSet[AclSession] = weakref.WeakSet()
        #: aclmdlExecute: threads sharing one model id must lock "memcpy inputs -> execute"
        #: (-> outputs) as one sequence (pyACL "execute" constraints, canncommercial 62RC1
        #: aclpythondevg_01_0127). Held by every session's run_gear, and by closing (a
        #: session's, the model's: so nothing is freed under a run in flight). Reentrant:
        #: the model's close closes its sessions.
        self.lock = threading.RLock()
        try:
            self._open()
        except BaseException:
            self._release(strict=False)
            raise

    def _open(self) -> None:
        acl = self.acl
        _ensure_initialized(acl)
        _check(acl.rt.set_device(self.device_id), "acl.rt.set_device",
               f" (device {self.device_id})")
        self._device_set = True
        context, ret = acl.rt.create_context(self.device_id)
        _check(ret, "acl.rt.create_context")
        self.context = context
        model_id, ret = acl.mdl.load_from_file(self.path)
        _check(ret, "acl.mdl.load_from_file", f" ({self.path!r})")
        self.model_id = model_id
        self.desc = _handle(acl.mdl.create_desc(), "acl.mdl.create_desc")
        _check(acl.mdl.get_desc(self.desc, self.model_id), "acl.mdl.get_desc")
        self._read_description()
        #: for each spec input, its position in :attr:`inputs` (the model's order)
        self.order = self._declared_order()
        spec = self._discover_spec()
        dtypes = tuple(self.inputs.dtypes[p] for p in self.order)
        self.info = ModelInfo(spec, dtypes, self.outputs.names, self.outputs.dtypes,
                              self._output_shapes(spec))

    # ---- reading the description ---------------------------------------------------------
    def _read_description(self) -> None:
        """Inputs (without the dims input), outputs and the dims input's index and size."""
        acl, desc = self.acl, self.desc
        n = int(acl.mdl.get_num_inputs(desc))
        index, ret = acl.mdl.get_input_index_by_name(desc, ACL_DYNAMIC_TENSOR_NAME)
        if ret != 0:
            raise GearFileError(
                f"{self.path!r} has no {ACL_DYNAMIC_TENSOR_NAME!r} input (ret {ret}): it was "
                "not compiled with dynamic gears (ATC --dynamic_batch_size, "
                "--dynamic_image_size or --dynamic_dims)", code=str(ret))
        self.dims_index = int(index)
        self.dims_nbytes = self._dims_buffer_size()
        #: model input index of each user input, in model order (see :attr:`order`)
        self.input_indices = tuple(j for j in range(n) if j != self.dims_index)
        self.inputs = self._tensors(
            self.input_indices, acl.mdl.get_input_name_by_index, acl.mdl.get_input_dims,
            acl.mdl.get_input_data_type, acl.mdl.get_input_size_by_index, "input")
        m = int(acl.mdl.get_num_outputs(desc))
        self.outputs = self._tensors(
            range(m), acl.mdl.get_output_name_by_index, acl.mdl.get_output_dims,
            acl.mdl.get_output_data_type, acl.mdl.get_output_size_by_index, "output")
        if not self.inputs.names or not self.outputs.names:
            raise GearFileError(f"{self.path!r} reports {len(self.inputs.names)} inputs and "
                                f"{len(self.outputs.names)} outputs besides the dims input")

    def _dims_buffer_size(self) -> int:
        """Bytes of the dims input's data buffer: count * itemsize of its own dtype.

        GE writes each dim as a uint64 when the data buffer holds 8 bytes per value, else as
        a uint32 (GeExecutor::SetDynamicDims / SetDynamicBatchSize / SetDynamicImageSize), so
        the buffer's length, not the model's dtype, decides the width. Sized exactly, an int32
        input gets int32 values even if the description reports a padded size; the reported
        size is the fallback when the dims input's shape or dtype cannot be read.
        """
        acl, desc, j = self.acl, self.desc, self.dims_index
        reported = int(acl.mdl.get_input_size_by_index(desc, j))
        d, ret = acl.mdl.get_input_dims(desc, j)
        dtype = ACL_DTYPES.get(int(acl.mdl.get_input_data_type(desc, j)))
        if ret != 0 or dtype is None:
            return reported
        dims = _dims_of(d, f"acl.mdl.get_input_dims({ACL_DYNAMIC_TENSOR_NAME})")
        count = int(np.prod(dims, dtype=np.int64))
        return count * dtype.itemsize if count > 0 else reported

    def _declared_order(self) -> tuple[int, ...]:
        """Positions in :attr:`inputs` in ``input_shape`` order (model order without it),
        after checking that ``input_shape`` names exactly the model's inputs with their ranks
        and static dims (GearSpecError otherwise)."""
        names, dims = self.inputs.names, self.inputs.dims
        if self._declared is None:
            return tuple(range(len(names)))
        declared, shapes = self._declared
        if sorted(declared) != sorted(names):
            raise GearSpecError(f"input_shape names {list(declared)}, but {self.path!r} has the "
                                f"inputs {list(names)}")
        for name, shape in zip(declared, shapes, strict=True):
            model = dims[names.index(name)]
            if len(shape) != len(model) or any(
                    a >= 0 and b >= 0 and a != b for a, b in zip(shape, model, strict=True)):
                raise GearSpecError(f"input_shape gives {name!r} the shape {list(shape)}, but "
                                    f"{self.path!r} describes it as {list(model)}")
        return tuple(names.index(n) for n in declared)

    def _tensors(self, indices: Sequence[int], name_of: Callable[..., Any],
                 dims_of: Callable[..., Any], type_of: Callable[..., Any],
                 size_of: Callable[..., Any], kind: str) -> _Tensors:
        names, dims, dtypes, sizes = [], [], [], []
        for j in indices:
            name = str(name_of(self.desc, j))
            d, ret = dims_of(self.desc, j)
            _check(ret, f"acl.mdl.get_{kind}_dims", f" ({kind} {j} {name!r})")
            names.append(name)
            dims.append(_dims_of(d, f"acl.mdl.get_{kind}_dims({kind} {j})"))
            dtypes.append(_np_dtype(type_of(self.desc, j), f"{kind} {name!r}"))
            sizes.append(int(size_of(self.desc, j)))
        return _Tensors(tuple(names), tuple(dims), tuple(dtypes), tuple(sizes))

    # ---- gears -----------------------------------------------------------------------------
    def _discover_spec(self) -> GearSpec:
        """The gears the description lists, as a GearSpec (mode from which list is filled).

        ``get_dynamic_batch`` -> {'batchCount', 'batch'} (aclpythondevg_01_0212),
        ``get_input_dynamic_gear_count(desc, -1)`` -> count (aclpythondevg_01_0216),
        ``get_input_dynamic_dims(desc, -1, count)`` -> one aclmdlIODims dict per gear with the
        FULL flattened dims of all inputs (aclpythondevg_01_0217),
        ``get_dynamic_hw(desc, -1)`` -> {'hwCount', 'hw'}, index 0 = H, 1 = W
        (aclpythondevg_01_0213). The gear order is the model's: never sorted.
        """
        acl, desc = self.acl, self.desc
        batch, ret = acl.mdl.get_dynamic_batch(desc)
        _check(ret, "acl.mdl.get_dynamic_batch")
        batches = list(batch.get("batch", []))[: int(batch.get("batchCount", 0))]
        if batches:
            return self._spec("batch", [(int(b),) for b in batches])
        count, ret = acl.mdl.get_input_dynamic_gear_count(desc, -1)
        _check(ret, "acl.mdl.get_input_dynamic_gear_count")
        if int(count) > 0:
            gears, ret = acl.mdl.get_input_dynamic_dims(desc, -1, int(count))
            _check(ret, "acl.mdl.get_input_dynamic_dims")
            return self._dims_spec([_dims_of(d, "acl.mdl.get_input_dynamic_dims")
                                    for d in list(gears)[: int(count)]])
        hw, ret = acl.mdl.get_dynamic_hw(desc, -1)
        _check(ret, "acl.mdl.get_dynamic_hw")
        pairs = self._hw_pairs(hw)
        if pairs:
            return self._spec("image_size", pairs)
        raise GearFileError(f"{self.path!r} has a {ACL_DYNAMIC_TENSOR_NAME!r} input but lists no "
                            "batch, image-size or dims gears")

    def _hw_pairs(self, hw: dict[str, Any]) -> list[tuple[int, int]]:
        """aclmdlHW's ``hw[128][2]``: pyACL gives a list of [h, w] (a flat list is accepted)."""
        count, raw = int(hw.get("hwCount", 0)), list(hw.get("hw", []))
        if count and raw and isinstance(raw[0], list | tuple):
            return [(int(p[0]), int(p[1])) for p in raw[:count]]
        if len(raw) < 2 * count:
            raise GearFileError(f"acl.mdl.get_dynamic_hw reports {count} gears but gives {raw!r}")
        return [(int(raw[2 * i]), int(raw[2 * i + 1])) for i in range(count)]

    def _spec(self, mode: str, gears: Sequence[tuple[int, ...]]) -> GearSpec:
        """Batch / image-size spec: the -1 dims of get_input_dims mark the dynamic axes."""
        dims = [self.inputs.dims[p] for p in self.order]
        if not any(-1 in d for d in dims):
            raise GearFileError(f"{self.path!r} lists {mode} gears {list(gears)} but no input "
                                f"has a -1 dim: {self._described()}")
        if mode == "batch" and any(-1 in d[1:] for d in dims):
            raise GearFileError(f"dynamic batch model {self.path!r} has -1 beyond dim 0: "
                                f"{self._described()}")
        return self._make_spec(mode, dims, gears)

    def _described(self) -> dict[str, tuple[int, ...]]:
        """Every input's described dims, in model order (for messages)."""
        return dict(zip(self.inputs.names, self.inputs.dims, strict=True))

    def _dims_spec(self, full: list[tuple[int, ...]]) -> GearSpec:
        """Dims spec from each gear's full flattened dims, which follow ATC's --input_shape
        order (dataNameOrder in GE's model_om2.cpp), not the input index: that order is
        ``input_shape``'s when given, else the one order the dims fit (:meth:`_infer_order`).
        A position is dynamic when the description says -1 there or the gears disagree."""
        if self._declared is None:
            self.order = self._infer_order(full)
        dims = [self.inputs.dims[p] for p in self.order]
        flat = [d for s in dims for d in s]
        for g, f in enumerate(full):
            if len(f) != len(flat):
                raise GearFileError(f"gear {g} of {self.path!r} has {len(f)} dims {list(f)}, "
                                    f"but its inputs have {len(flat)} ({self._described()})")
        dynamic = [p for p in range(len(flat))
                   if flat[p] == -1 or len({f[p] for f in full}) > 1]
        for p in range(len(flat)):
            if p not in dynamic and flat[p] != full[0][p]:
                raise GearFileError(f"static dim {p} of {self.path!r} is {flat[p]} in the "
                                    f"description but {full[0][p]} in its gears")
        marked = [-1 if p in dynamic else d for p, d in enumerate(flat)]
        shapes, at = [], 0
        for d in dims:
            shapes.append(tuple(marked[at:at + len(d)]))
            at += len(d)
        return self._make_spec("dims", shapes, [tuple(f[p] for p in dynamic) for f in full])

    def _infer_order(self, full: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The order of the inputs that the gears' full dims follow, when the dims tell it.

        An order fits when, cut into the inputs' ranks, every gear's dims equal each input's
        static described dims. Orders that give every input the same shapes in every gear are
        the same to ACL (the flattened dims are equal), so the first such (model order when it
        fits) is taken. Several fits with different shapes, or none: GearFileError.
        """
        fits = _fitting_orders(self.inputs.dims, full)
        if not fits:
            raise GearFileError(
                f"the gears of {self.path!r} ({[list(f) for f in full]}) fit no order of its "
                f"inputs {self._described()}")
        if len(fits) > 1:
            (one, _), (two, _) = fits[:2]
            raise GearFileError(
                f"{self.path!r}: ACL orders the dims by ATC's --input_shape, which the model "
                f"does not report, and its gears fit several orders of its inputs, e.g. "
                f"{self._names(one)} and {self._names(two)}: pass input_shape= (the "
                f"--input_shape it was compiled with) to gr.load")
        return fits[0][0]

    def _names(self, order: Sequence[int]) -> list[str]:
        return [self.inputs.names[p] for p in order]

    def _make_spec(self, mode: str, shapes: Sequence[Sequence[int]],
                   gears: Sequence[tuple[int, ...]]) -> GearSpec:
        try:
            return GearSpec(mode, tuple(self._names(self.order)),
                            tuple(tuple(s) for s in shapes),  # type: ignore[arg-type]
                            tuple(gears))
        except GearSpecError as exc:
            raise GearFileError(f"{self.path!r}: the gears it lists do not form a valid spec: "
                                f"{exc.message}", code=exc.code) from exc

    def dims_call(self, spec: GearSpec, dataset: int,
                  gear: int) -> tuple[str, Callable[..., Any], tuple[Any, ...]]:
        """The ACL call that selects ``gear`` on ``dataset``: (name, function, arguments).

        dims mode: ``set_input_dynamic_dims(model_id, dataset, index, {'name': '', 'dimCount':
        n, 'dims': full dims of all inputs})`` (aclpythondevg_01_0159, "name" unused);
        batch: ``set_dynamic_batch_size(model_id, dataset, index, batch)``;
        image size: ``set_dynamic_hw_size(model_id, dataset, index, h, w)``.
        ``index`` is get_input_index_by_name(desc, "ascend_mbatch_shape_data").
        """
        mdl, values = self.acl.mdl, spec.gears[gear]
        head = (self.model_id, dataset, self.dims_index)
        if spec.mode == "batch":
            return "acl.mdl.set_dynamic_batch_size", mdl.set_dynamic_batch_size, (*head, values[0])
        if spec.mode == "image_size":
            return "acl.mdl.set_dynamic_hw_size", mdl.set_dynamic_hw_size, (*head, *values)
        full = list(spec.full_dims(gear))
        return ("acl.mdl.set_input_dynamic_dims", mdl.set_input_dynamic_dims,
                (*head, {"name": "", "dimCount": len(full), "dims": full}))

    def _output_shapes(self, spec: GearSpec) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per gear, per output: its shape (GE's gear -> output shape map).

        aclmdlGetCurOutputDims gives the shapes of the gear last set with set_* (the largest
        gear when none was): set each gear once, here, on a scratch dataset. Without
        get_cur_output_dims (old pyACL) every gear gets the description's output dims, which
        are the largest gear's: correct for outputs whose shape does not follow the gear.
        """
        if not hasattr(self.acl.mdl, "get_cur_output_dims"):
            return tuple(self._checked_shapes(self.outputs.dims, g)
                         for g in range(spec.gear_count))
        scratch = _Scratch(self.acl)
        try:
            dataset = scratch.dataset()
            for j in range(len(self.input_indices) + 1):
                scratch.add(dataset, scratch.device(self._model_input_size(j)),
                            self._model_input_size(j))
            shapes = []
            for g in range(spec.gear_count):
                call, fn, args = self.dims_call(spec, dataset, g)
                _check(fn(*args), call, f" (gear {spec.gears[g]} while reading output shapes)")
                dims = []
                for k in range(len(self.outputs.names)):
                    d, ret = self.acl.mdl.get_cur_output_dims(self.desc, k)
                    _check(ret, "acl.mdl.get_cur_output_dims", f" (output {k}, gear {g})")
                    dims.append(_dims_of(d, "acl.mdl.get_cur_output_dims"))
                shapes.append(self._checked_shapes(dims, g))
            return tuple(shapes)
        finally:
            scratch.release(strict=False)

    def spec_index(self, j: int) -> int:
        """The spec index of model input ``j`` (a user input, not the dims input)."""
        return self.order.index(self.input_indices.index(j))

    def _model_input_size(self, j: int) -> int:
        """Bytes of model input ``j`` (model order, dims input included), at least 1."""
        size = self.dims_nbytes if j == self.dims_index else \
            self.inputs.sizes[self.input_indices.index(j)]
        return max(int(size), 1)

    def _checked_shapes(self, dims: Sequence[tuple[int, ...]],
                        gear: int) -> tuple[tuple[int, ...], ...]:
        for k, shape in enumerate(dims):
            nbytes = int(np.prod(shape, dtype=np.int64)) * self.outputs.dtypes[k].itemsize
            if any(d < 0 for d in shape) or nbytes > self.outputs.sizes[k]:
                raise GearFileError(
                    f"output {self.outputs.names[k]!r} of gear {gear} has shape {shape} "
                    f"({nbytes} bytes); the model's output buffer is {self.outputs.sizes[k]} "
                    "bytes")
        return tuple(tuple(s) for s in dims)

    # ---- sessions and lifetime -----------------------------------------------------------
    def activate(self) -> None:
        """Make this model's context current on the calling thread (ACL contexts are per
        thread, and the model must run in the context it was loaded in)."""
        _check(self.acl.rt.set_context(self.context), "acl.rt.set_context")

    def create_session(self, layout: Any) -> AclSession:
        with self.lock:  # not while the model is being closed
            if self._closed:
                raise BackendError(f"acl model {self.path!r} is closed")
            session = AclSession(self, layout)
            self._sessions.add(session)
            return session

    def close(self) -> None:
        """Close the sessions, unload, destroy the description and the context; idempotent.
        Waits for a run in flight; every resource is released even when one release fails
        (the first failure is raised afterwards)."""
        with self.lock:
            self._release(strict=True)

    def _release(self, strict: bool) -> None:
        if self._closed:
            return
        self._closed = True
        session_errors = []
        for session in list(self._sessions):
            try:
                session.close()
            except BackendError as exc:  # still unload the model and free the rest
                session_errors.append(exc)
        acl, failures = self.acl, []
        if self.context is not None:
            failures.append(("acl.rt.set_context", acl.rt.set_context(self.context)))
        if self.desc is not None:
            failures.append(("acl.mdl.destroy_desc", acl.mdl.destroy_desc(self.desc)))
        if self.model_id is not None:
            failures.append(("acl.mdl.unload", acl.mdl.unload(self.model_id)))
        if self.context is not None:
            failures.append(("acl.rt.destroy_context", acl.rt.destroy_context(self.context)))
        if self._device_set:
            failures.append(("acl.rt.reset_device", acl.rt.reset_device(self.device_id)))
        if strict:
            for call, ret in failures:
                _check(ret, call, " (while closing)")
            if session_errors:
                raise session_errors[0]


class _Scratch:
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
        _check(ret, "acl.rt.malloc", f" ({nbytes} bytes)")
        self.device_ptrs.append(ptr)
        return int(ptr)

    def host(self, nbytes: int) -> int:
        # acl.rt.malloc_host(size) -> (host_ptr, ret): pinned, 64-byte aligned
        # (aclpythondevg_01_0116)
        ptr, ret = self.acl.rt.malloc_host(max(int(nbytes), 1))
        _check(ret, "acl.rt.malloc_host", f" ({nbytes} bytes)")
        self.host_ptrs.append(ptr)
        return int(ptr)

    def dataset(self) -> int:
        ds = _handle(self.acl.mdl.create_dataset(), "acl.mdl.create_dataset")
        self.datasets.append(ds)
        return ds

    def add(self, dataset: int, ptr: int, nbytes: int) -> None:
        # acl.create_data_buffer(data, size) -> handle; acl.mdl.add_dataset_buffer(dataset,
        # data_buffer) -> (dataset, ret) (aclpythondevg_01_0188)
        buf = _handle(self.acl.create_data_buffer(ptr, int(nbytes)), "acl.create_data_buffer")
        self.buffers.append(buf)
        _, ret = self.acl.mdl.add_dataset_buffer(dataset, buf)
        _check(ret, "acl.mdl.add_dataset_buffer")

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
                _check(ret, call, " (while closing)")


# ---- a session -------------------------------------------------------------------------------
class AclSession(BackendSession):
    """One executor's buffers and datasets on the NPU (see the module docstring's picture)."""

    def __init__(self, model: AclModel, layout: Any) -> None:
        self._model, self._acl, self._layout = model, model.acl, layout
        self._mem = _Scratch(model.acl)
        self._closed = False
        self.staging = np.empty(0, dtype=np.uint8)
        try:
            self._build()
        except BaseException:
            self._mem.release(strict=False)
            self._closed = True
            raise
        # An executor dropped without close() still frees its NPU memory when collected
        # (not at interpreter exit: ACL may be finalised by then, and exit frees it anyway).
        self._finalizer = weakref.finalize(self, self._mem.release, False)
        self._finalizer.atexit = False

    def _build(self) -> None:
        model, layout, mem = self._model, self._layout, self._mem
        info = model.info
        spec = info.spec
        model.activate()  # the allocations below belong to the model's context
        self._check_layout()
        self._check_padding()
        self._total = int(layout.total_bytes)
        self._host = mem.host(self._total)
        self.staging = _host_array(self._host, max(self._total, 1))[: self._total]
        # the layout's footprints include every buffer's padding, the last one's too
        self._device = mem.device(self._total)
        # The dims input gets its own data buffer (ACL writes the dims into it in set_*). It
        # points at the layout's dims slot when that slot is large enough for the model's
        # dims input; else (an int64 dims input) at a session buffer of the model's size.
        if int(layout.dims_nbytes) >= model.dims_nbytes:
            dims_at = [self._device + int(layout.dims_offset(g)) for g in range(spec.gear_count)]
        else:
            dims_at = [mem.device(model.dims_nbytes)] * spec.gear_count
        self._build_outputs()
        self._in_datasets, self._set_dims = [], []
        for g in range(spec.gear_count):
            ds = mem.dataset()
            for j in range(len(model.input_indices) + 1):  # model input order
                if j == model.dims_index:
                    mem.add(ds, dims_at[g], model.dims_nbytes)
                else:
                    i = model.spec_index(j)
                    mem.add(ds, self._device + int(layout.offset(g, i)), int(layout.nbytes(g, i)))
            self._in_datasets.append(ds)
            self._set_dims.append(model.dims_call(spec, ds, g))
        # error-message suffixes, formatted here rather than on every run
        self._labels = [f" (gear {g}: {values})" for g, values in enumerate(spec.gears)]
        self._merged = [_span(layout.merged_span(g)) for g in range(spec.gear_count)]
        self._separate = [[_span(s) for s in layout.separate(g)] for g in range(spec.gear_count)]

    def _check_layout(self) -> None:
        """The layout must place exactly each input's bytes (it was planned from info)."""
        layout, info = self._layout, self._model.info
        expected = info.input_nbytes()
        names = info.spec.input_names
        for g, row in enumerate(expected):
            for i, nbytes in enumerate(row):
                got = int(layout.nbytes(g, i))
                end = int(layout.offset(g, i)) + got
                if got != nbytes or end > int(layout.total_bytes):
                    raise BackendError(
                        f"staging layout does not fit the model: input {names[i]!r} of gear {g} "
                        f"gets {got} bytes ending at {end} of {layout.total_bytes}, it needs "
                        f"{nbytes}")

    def _check_padding(self) -> None:
        """Every sub-buffer of the device region (each input, and the dims slot) must start
        64-aligned and have ALIGN_UP(len, 32) + 32 bytes before the next one or the region's
        end: what ACL asks of buffers carved from one aclrtMalloc block. A layout planned with
        :attr:`AclModel.layout_options` always does; any other is refused (BackendError)."""
        layout, spec = self._layout, self._model.info.spec
        total = int(layout.total_bytes)
        for g in range(spec.gear_count):
            bufs = [(int(layout.offset(g, i)), int(layout.nbytes(g, i)), repr(name))
                    for i, name in enumerate(spec.input_names)]
            if int(layout.dims_nbytes):
                bufs.append((int(layout.dims_offset(g)), int(layout.dims_nbytes), "the dims"))
            bufs.sort()
            limits = [start for start, _, _ in bufs[1:]] + [total]
            for (start, n, what), limit in zip(bufs, limits, strict=True):
                room = (n + 31) // 32 * 32 + _PAD
                if start % _ALIGN or start + room > limit:
                    raise BackendError(
                        f"staging layout breaks ACL's rule for buffers carved from one "
                        f"aclrtMalloc block: {what} of gear {g} at offset {start} ({n} bytes) "
                        f"needs a 64-aligned start and {room} bytes (ALIGN_UP(len,32)+32) "
                        f"before offset {limit}; plan it with gear_runtime.core.plan_layout(..., "
                        f"**AclModel.layout_options) = {self._model.layout_options}")

    def _build_outputs(self) -> None:
        """Device output buffers sized for the largest gear (the model's output sizes), one
        output dataset shared by every gear, and pinned host buffers the results land in."""
        model, mem = self._model, self._mem
        info = model.info
        sizes = [max(int(s), 1) for s in model.outputs.sizes]
        offsets = np.cumsum([0] + [_aligned(s) for s in sizes]).tolist()
        host = mem.host(offsets[-1])
        host_bytes = _host_array(host, offsets[-1])
        self._out_dataset = mem.dataset()
        devices = []
        for size in sizes:
            devices.append(mem.device(size))
            mem.add(self._out_dataset, devices[-1], size)
        self._out_copies: list[list[tuple[int, int, int, int]]] = []
        self._out_views: list[list[np.ndarray]] = []
        for g in range(info.spec.gear_count):
            copies, views = [], []
            for k, (dev, size) in enumerate(zip(devices, sizes, strict=True)):
                nbytes = info.output_size(g, k)
                copies.append((host + offsets[k], size, dev, nbytes))
                view = host_bytes[offsets[k]:offsets[k] + nbytes].view(info.output_dtypes[k])
                views.append(view.reshape(info.output_shapes[g][k]))
            self._out_copies.append(copies)
            self._out_views.append(views)

    def _memcpy(self, dst: int, dest_max: int, src: int, count: int, kind: int,
                what: str) -> None:
        # acl.rt.memcpy(dst, dest_max, src, count, kind) -> ret (aclpythondevg_01_0120)
        ret = self._acl.rt.memcpy(dst, dest_max, src, count, kind)
        if ret != 0:  # the message is formatted only on failure: this is the hot path
            _check(ret, "acl.rt.memcpy", f" ({what}, {count} bytes)")

    def run_gear(self, gear: int) -> list[np.ndarray]:
        """Copy gear ``gear``'s staged inputs to the device (ONE memcpy for the merged span,
        one per separate span), select the gear, execute, copy the outputs back."""
        if not 0 <= gear < len(self._in_datasets):
            raise InputError(f"gear index {gear} is out of range: the model has "
                             f"{len(self._in_datasets)} gears")
        with self._model.lock:
            if self._closed:  # checked under the lock: the model may close meanwhile
                raise BackendError("this acl session is closed")
            # Every run, not once per thread: another model driven from this thread may have
            # bound its own context since (and a thread id can be reused by a new thread).
            self._model.activate()
            return self._run_locked(gear)

    def _run_locked(self, gear: int) -> list[np.ndarray]:
        h2d, d2h = ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST
        start, end = self._merged[gear]
        if end > start:
            self._memcpy(self._device + start, self._total - start, self._host + start,
                         end - start, h2d, "merged inputs, host to device")
        for start, end in self._separate[gear]:
            if end > start:
                self._memcpy(self._device + start, self._total - start, self._host + start,
                             end - start, h2d, "separate input, host to device")
        # After the copies: set_* writes the dims into ascend_mbatch_shape_data in the
        # model's own width, overwriting the int32 dims the merged copy may have carried.
        call, fn, args = self._set_dims[gear]
        _check(fn(*args), call, self._labels[gear])
        _check(self._acl.mdl.execute(self._model.model_id, self._in_datasets[gear],
                                     self._out_dataset),
               "acl.mdl.execute", self._labels[gear])
        for host, cap, dev, nbytes in self._out_copies[gear]:
            if nbytes:
                self._memcpy(host, cap, dev, nbytes, d2h, "output, device to host")
        return list(self._out_views[gear])

    def close(self) -> None:
        """Destroy the datasets and free the buffers; idempotent. Takes the model's lock, so a
        close from another thread (the model's close) never frees memory under a run."""
        with self._model.lock:
            if self._closed:
                return
            self._closed = True
            self.staging = np.empty(0, dtype=np.uint8)
            self._out_views = []
            self._finalizer.detach()
            if self._model.context is not None:
                self._acl.rt.set_context(self._model.context)
            self._mem.release(strict=True)
