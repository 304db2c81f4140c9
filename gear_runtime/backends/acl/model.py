"""The ``.om`` loaded on one NPU (:class:`AclModel`): init, context, load, the description
read through pyACL and turned into a GearSpec (:mod:`.desc`), the per-gear output shapes
probed once at load, sessions and lifetime. See :mod:`gear_runtime.backends.acl`."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from gear_runtime.backends.acl import desc as describe
from gear_runtime.backends.acl.calls import (
    ACL_DTYPES,
    ALIGN,
    PAD,
    Scratch,
    check,
    ensure_initialized,
    handle,
    np_dtype,
)
from gear_runtime.backends.acl.session import AclSession
from gear_runtime.backends.base import (
    BackendModel,
    check_device_id,
    check_model_file,
)
from gear_runtime.errors import BackendError, GearFileError
from gear_runtime.gearfile.format import ACL_DYNAMIC_TENSOR_NAME
from gear_runtime.gearfile.info import ModelInfo
from gear_runtime.spec import GearSpec
from gear_runtime.spec.parse import parse_input_shape


class AclModel(BackendModel):
    """An ``.om`` loaded on one NPU: model id, description, gears and output-shape table."""

    name = "acl"
    #: The device region mirrors the staging layout and its data buffers are carved out of
    #: one aclrtMalloc block: 64-aligned starts, ALIGN_UP(len, 32) + 32 bytes each.
    layout_options: ClassVar[dict[str, int]] = {"alignment": ALIGN, "tail_padding": PAD}

    def __init__(self, acl: Any, path: str, device_id: int = 0,
                 input_shape: str | None = None) -> None:
        check_model_file(path)
        self.acl, self.path, self.device_id = acl, path, check_device_id(device_id)
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
        ensure_initialized(acl)
        check(acl.rt.set_device(self.device_id), "acl.rt.set_device",
               f" (device {self.device_id})")
        self._device_set = True
        context, ret = acl.rt.create_context(self.device_id)
        check(ret, "acl.rt.create_context")
        self.context = context
        model_id, ret = acl.mdl.load_from_file(self.path)
        check(ret, "acl.mdl.load_from_file", f" ({self.path!r})")
        self.model_id = model_id
        self.desc = handle(acl.mdl.create_desc(), "acl.mdl.create_desc")
        check(acl.mdl.get_desc(self.desc, self.model_id), "acl.mdl.get_desc")
        self._read_description()
        self._refuse_aipp()
        #: for each spec input, its position in :attr:`inputs` (the model's order)
        self.order = describe.declared_order(self.inputs, self._declared, self.path)
        #: how many inputs (the first of :attr:`order`) ACL's dims cover: a partial
        #: --input_shape lists only the dynamic ones
        self.listed = describe.listed_count(self.inputs, self._declared)
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
        #: the dims input's index; None: a static model (built without gears: a decode
        #: step at fixed shapes), which loads as it is with its one gear ()
        self.dims_index: int | None = int(index) if ret == 0 else None
        self.dims_nbytes = 0 if self.dims_index is None else self._dims_buffer_size()
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

    #: aclmdlInputAippType (aclpythondevg_01_0932) -> what it means for the input
    _AIPP = {1: "static AIPP (its data is the raw image, not a tensor of its dims)",
             2: "dynamic AIPP (its parameters come from another input, set with "
                "acl.mdl.set_input_aipp)",
             3: "the dynamic AIPP parameters input (filled by acl.mdl.set_input_aipp)"}

    def _refuse_aipp(self) -> None:
        """GearFileError for a model built with AIPP (atc --insert_op_conf): an AIPP input
        takes raw image bytes whose size need not be its dims times its itemsize, and a
        dynamic-AIPP model needs acl.mdl.set_input_aipp per run, neither of which this runtime
        does; said at load rather than run wrong. ``acl.mdl.get_aipp_type(model_id, index)
        -> (type, dynamic_attached_data_index, ret)`` (aclpythondevg_01_0157); an old pyACL
        without it is not asked."""
        get = getattr(self.acl.mdl, "get_aipp_type", None)
        if get is None:
            return
        for j in self.input_indices:
            kind, _, ret = get(self.model_id, j)
            check(ret, "acl.mdl.get_aipp_type", f" (input {j})")
            if int(kind) in self._AIPP:
                name = self.inputs.names[self.input_indices.index(j)]
                raise GearFileError(
                    f"{self.path!r}: input {name!r} has {self._AIPP[int(kind)]}; models built "
                    "with AIPP (atc --insert_op_conf) are not supported by this runtime: "
                    "convert without --insert_op_conf and preprocess on the host")

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
        dims = describe.dims_of(d, f"acl.mdl.get_input_dims({ACL_DYNAMIC_TENSOR_NAME})")
        count = int(np.prod(dims, dtype=np.int64))
        return count * dtype.itemsize if count > 0 else reported

    def _tensors(self, indices: Sequence[int], name_of: Callable[..., Any],
                 dims_of: Callable[..., Any], type_of: Callable[..., Any],
                 size_of: Callable[..., Any], kind: str) -> describe.Tensors:
        names, dims, dtypes, sizes = [], [], [], []
        for j in indices:
            name = str(name_of(self.desc, j))
            d, ret = dims_of(self.desc, j)
            check(ret, f"acl.mdl.get_{kind}_dims", f" ({kind} {j} {name!r})")
            names.append(name)
            dims.append(describe.dims_of(d, f"acl.mdl.get_{kind}_dims({kind} {j})"))
            dtypes.append(np_dtype(type_of(self.desc, j), f"{kind} {name!r}"))
            sizes.append(int(size_of(self.desc, j)))
        return describe.Tensors(tuple(names), tuple(dims), tuple(dtypes), tuple(sizes))

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
        if self.dims_index is None:
            return self._static_spec()
        batch, ret = acl.mdl.get_dynamic_batch(desc)
        check(ret, "acl.mdl.get_dynamic_batch")
        batches = list(batch.get("batch", []))[: int(batch.get("batchCount", 0))]
        if batches:
            return describe.listed_spec(self.inputs, self.order, "batch",
                                        [(int(b),) for b in batches], self.path)
        count, ret = acl.mdl.get_input_dynamic_gear_count(desc, -1)
        check(ret, "acl.mdl.get_input_dynamic_gear_count")
        if int(count) > 0:
            gears, ret = acl.mdl.get_input_dynamic_dims(desc, -1, int(count))
            check(ret, "acl.mdl.get_input_dynamic_dims")
            full = [describe.dims_of(d, "acl.mdl.get_input_dynamic_dims")
                    for d in list(gears)[: int(count)]]
            if self._declared is None:
                self.order, self.listed = describe.infer_listing(self.inputs, full, self.path)
            describe.check_dims_listing(self.inputs, self.order, self.listed, self.path)
            return describe.dims_spec(self.inputs, self.order, full, self.path, self.listed)
        hw, ret = acl.mdl.get_dynamic_hw(desc, -1)
        check(ret, "acl.mdl.get_dynamic_hw")
        pairs = describe.hw_pairs(hw)
        if pairs:
            return describe.listed_spec(self.inputs, self.order, "image_size", pairs, self.path)
        raise GearFileError(f"{self.path!r} has a {ACL_DYNAMIC_TENSOR_NAME!r} input but lists no "
                            "batch, image-size or dims gears")

    def _static_spec(self) -> GearSpec:
        """A model without the dims input: its inputs at the description's dims, one gear
        ``()``. GearFileError for a -1 there (a dynamic-shape .om, ATC
        --input_shape_range: no gears to run)."""
        names = [self.inputs.names[p] for p in self.order]
        shapes = [tuple(self.inputs.dims[p]) for p in self.order]
        dynamic = next((n for n, s in zip(names, shapes, strict=True) if any(d < 0 for d in s)),
                       None)
        if dynamic is not None:
            raise GearFileError(
                f"{self.path!r} has no {ACL_DYNAMIC_TENSOR_NAME!r} input but input {dynamic!r} "
                "is dynamic: a dynamic-shape .om (atc --input_shape_range) has no gears to run; "
                "build it with gears (--dynamic_batch_size, --dynamic_image_size, "
                "--dynamic_dims) or at static shapes")
        return GearSpec.static(names, shapes)

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
        # the listed inputs come first in the spec: their dims are ACL's, the rest is static
        full = list(spec.full_dims(gear))[:sum(len(spec.input_shapes[i])
                                               for i in range(self.listed))]
        return ("acl.mdl.set_input_dynamic_dims", mdl.set_input_dynamic_dims,
                (*head, {"name": "", "dimCount": len(full), "dims": full}))

    def _output_shapes(self, spec: GearSpec) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per gear, per output: its shape (GE's gear -> output shape map).

        aclmdlGetCurOutputDims gives the shapes of the gear last set with set_* (the largest
        gear when none was): set each gear once, here, on a scratch dataset. Without
        get_cur_output_dims (old pyACL) every gear gets the description's output dims, which
        are the largest gear's: correct for outputs whose shape does not follow the gear.
        """
        if self.dims_index is None or not hasattr(self.acl.mdl, "get_cur_output_dims"):
            return tuple(describe.checked_output_shapes(self.outputs, self.outputs.dims, g)
                         for g in range(spec.gear_count))
        scratch = Scratch(self.acl)
        try:
            dataset = scratch.dataset()
            for j in range(len(self.input_indices) + 1):
                scratch.add(dataset, scratch.device(self._model_input_size(j)),
                            self._model_input_size(j))
            shapes = []
            for g in range(spec.gear_count):
                call, fn, args = self.dims_call(spec, dataset, g)
                check(fn(*args), call, f" (gear {spec.gears[g]} while reading output shapes)")
                dims = []
                for k in range(len(self.outputs.names)):
                    d, ret = self.acl.mdl.get_cur_output_dims(self.desc, k)
                    check(ret, "acl.mdl.get_cur_output_dims", f" (output {k}, gear {g})")
                    dims.append(describe.dims_of(d, "acl.mdl.get_cur_output_dims"))
                shapes.append(describe.checked_output_shapes(self.outputs, dims, g))
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

    # ---- sessions and lifetime -----------------------------------------------------------
    def activate(self) -> None:
        """Make this model's context current on the calling thread (ACL contexts are per
        thread, and the model must run in the context it was loaded in)."""
        check(self.acl.rt.set_context(self.context), "acl.rt.set_context")

    #: Resident state in NPU memory (:class:`~gear_runtime.backends.acl.session.DeviceState`)
    supports_state: ClassVar[bool] = True

    def create_session(self, layout: Any, state: Any = None) -> AclSession:
        with self.lock:  # not while the model is being closed
            if self._closed:
                raise BackendError(f"acl model {self.path!r} is closed")
            session = AclSession(self, layout, state)
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
                check(ret, call, " (while closing)")
            if session_errors:
                raise session_errors[0]
