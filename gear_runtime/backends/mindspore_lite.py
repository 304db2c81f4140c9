"""Ascend backend through MindSpore Lite (cloud-side inference, MindIR models).

Written to the documented MindSpore Lite 2.x Python API (mindspore.cn/lite/api/en/r2.3.1/
mindspore_lite/mindspore_lite.Model.html, .Context.html, .Tensor.html) and the flow of a Qwen
prefill service on Ascend (build_from_file, get_inputs, ``resize`` only when the shapes change,
predict); tested against the double in ``tests/doubles/fake_mslite.py``, NOT run on Ascend
hardware here (docs/ascend.md).

A MindIR converted with ``ge.dynamicDims`` (or ``[ascend_context] dynamic_dims``) does not
describe its gears through the Python API, so the spec comes from the converter config file
(``config=``, read by :meth:`GearSpec.from_config`) or is given (``spec=``). That closes the
gap that service hits (docs/ge-notes.md section 9): the executor matches the gear BEFORE any
MindSpore Lite call and raises GearMismatchError listing the gears, instead of a "Shape
Conflict" deep inside resize/predict.

Output shapes per gear are read at load: ``resize`` to each gear, then the shapes of
``get_outputs()``; where those still hold -1 (the backend only knows them after a run), one
``predict`` on zeros gives them (it doubles as that gear's warm-up).

``Tensor.set_data_from_numpy`` and ``get_data_to_numpy`` are zero-copy (python/src/
tensor_pybind.cc): a run hands each input over as a numpy view of the session's staging buffer
at the layout's offsets (read when predict runs; there is no device copy for us to merge), and
the outputs are views of the Model's output memory, which the next predict of ANY session may
overwrite: a run copies them, under the model's lock, into buffers the session owns.
``resize`` changes the one Model object, so every session
of a model shares its current gear under the model's lock: runs of one model are serialised
(load the model once per NPU stream to run in parallel).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

import numpy as np

from gear_runtime.backends.base import (
    BackendModel,
    BackendSession,
    DeviceBuffer,
    DeviceStateBase,
    aligned_buffer,
    check_device_id,
    check_layout_fits,
    check_model_file,
    import_runtime,
    locks_in_order,
)
from gear_runtime.errors import (
    BackendError,
    CompileError,
    GearFileError,
    GearSpecError,
    InputError,
)
from gear_runtime.gearfile.info import ModelInfo
from gear_runtime.spec import GearSpec
from gear_runtime.spec.config import config_sections, config_without_gears

INSTALL_HINT = ("install the MindSpore Lite cloud-inference wheel for Ascend "
                "(mindspore_lite-*-linux_*.whl from mindspore.cn, built with the Ascend backend) "
                "on a machine with the CANN toolkit")

#: mindspore_lite.DataType member name -> numpy dtype
MSLITE_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64), "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16), "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64), "FLOAT16": np.dtype(np.float16),
    "FLOAT32": np.dtype(np.float32), "FLOAT64": np.dtype(np.float64),
}

_CODE = re.compile(r"\b(\d{6}|E[A-Z0-9]\d{4})\b")

T = TypeVar("T")


def open_model(path: str, *, config: str | os.PathLike[str] | None = None,
               spec: GearSpec | None = None, device_id: int = 0,
               share_weights_with: MsliteModel | None = None) -> MsliteModel:
    """Build the MindIR at ``path`` on Ascend device ``device_id``.

    The gears come from ``config`` (the converter config file: ``[acl_build_options]``,
    ``[ascend_context]`` or ``[ge_graph_options]``) or from ``spec``, at most one of them; or,
    with neither, from what the model records: the converter keeps ``[acl_build_options]``
    input_shape and ge.dynamicDims in the MindIR, which ``Model.get_model_info`` returns
    (MindSpore Lite releases that have it). Given gears are checked against recorded ones
    (CompileError naming both when they differ).
    ``share_weights_with``: a model loaded before whose weights this one shares through
    ``ModelGroup(ModelGroupFlag.SHARE_WEIGHT)`` (its documented example is a seq-1024 prefill
    and a seq-1 decode): both are built AFTER joining the group (the group id only reaches a
    model through its build), so that model is built once more, in the group, and MindSpore
    Lite's GE provider must run both (the group id is the GE session id; other providers
    never read it): :func:`sharing_refusal` says why not otherwise.
    Raises BackendUnavailableError when mindspore_lite is missing, GearSpecError for a bad or
    missing spec, GearFileError for a missing model file, CompileError when the model's inputs
    do not fit the spec, BackendError when a MindSpore Lite call fails, InputError when the
    weights cannot be shared.
    """
    mslite = _import_mslite()
    if config is not None and spec is not None:
        raise GearSpecError("mindspore_lite takes the model's gears once: pass config= (the "
                            "converter config file with input_shape and dynamic dims) or spec=, "
                            "not both")
    precision = None
    if config is not None:
        static, precision = config_without_gears(os.fspath(config))
        if spec is None and not static:  # gears in the config; else the model's own shapes
            spec = GearSpec.from_config(os.fspath(config))
    elif spec is not None and not isinstance(spec, GearSpec):
        raise GearSpecError(f"spec must be a GearSpec, got {type(spec).__name__}")
    config_path = None if config is None else os.fspath(config)
    model = None
    if share_weights_with is not None:
        provider = build_config(config_path, spec)[2]
        why = sharing_refusal(share_weights_with, provider, os.fspath(path))
        if why is not None:
            raise InputError(f"share_weights_with on mindspore_lite: {why}")
        group = _call("ModelGroup()", mslite.ModelGroup, mslite.ModelGroupFlag.SHARE_WEIGHT)
        first, model = mslite.Model(), mslite.Model()
        _call("ModelGroup.add_model", group.add_model, [first, model])
        share_weights_with.rebuild_in(group, first)
    return MsliteModel(mslite, os.fspath(path), spec, device_id, config_path=config_path,
                       model=model, precision_mode=precision)


def sharing_refusal(other: Any, provider: str, path: str) -> str | None:
    """Why a model built with ``provider`` at ``path`` cannot share ``other``'s weights, or
    None: ModelGroup(SHARE_WEIGHT) works through MindSpore Lite's GE provider alone (its
    docstring: "only supported in cloud side Ascend inference and the provider is GE";
    model_group_impl.cc hands the group id to the GE executor as its session id), and a
    model shares through one group, joined once (AddModel refuses a model in a group)."""
    if not isinstance(other, MsliteModel):
        return f"the other model is no mindspore_lite model ({type(other).__name__})"
    for what, prov in ((repr(other.path), other.provider), (repr(path), provider)):
        if prov != "ge":
            return (f"{what} is built with the {prov or 'default (ACL)'} provider; weights "
                    "are shared by ModelGroup(SHARE_WEIGHT) through the GE provider alone: "
                    "load both with a config= that has a [ge_graph_options] section")
    if other.group is not None:
        return (f"{other.path!r} shares its weights with another model already (a model joins "
                "one ModelGroup, once)")
    return None


def _import_mslite() -> Any:
    return import_runtime("mindspore_lite", "mindspore_lite", INSTALL_HINT)


def _call(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run a MindSpore Lite call; its exceptions become BackendError naming the call.

    The API raises RuntimeError("<call> failed! Error is <status>") (and TypeError /
    ValueError for bad arguments); ``.code`` is the first ACL / GE code in the text, if any.
    """
    try:
        return fn(*args)
    except (RuntimeError, ValueError, TypeError) as exc:
        found = _CODE.search(str(exc))
        raise BackendError(f"mindspore_lite {name} failed: {exc}",
                           code=found.group(1) if found else "") from exc


def _np_dtype(dtype: Any, what: str) -> np.dtype:
    name = getattr(dtype, "name", str(dtype)).rsplit(".", 1)[-1].upper()
    try:
        return MSLITE_DTYPES[name]
    except KeyError:
        raise GearFileError(f"{what} has MindSpore Lite dtype {dtype}, which has no numpy dtype "
                            f"(supported: {', '.join(MSLITE_DTYPES)})") from None


def _check_positive_gears(spec: GearSpec) -> None:
    """GearSpecError for a gear giving an input a dim <= 0: ModelImpl::Resize rejects any
    (src/extendrt/cxx_api/model/model_impl.cc), so that gear could never run."""
    for g in range(spec.gear_count):
        for name, shape in spec.shapes(g).items():
            if any(d <= 0 for d in shape):
                raise GearSpecError(
                    f"gear {g} {spec.gears[g]} gives input {name!r} the shape {shape}: "
                    "MindSpore Lite's resize rejects a dim <= 0, so this gear can never run")


def _check_positive_shapes(names: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
    """InputError for an input with a dim <= 0 (resize would reject it)."""
    for name, a in zip(names, arrays, strict=True):
        if any(d <= 0 for d in a.shape):
            raise InputError(f"input {name!r} has the shape {tuple(a.shape)}: MindSpore Lite's "
                             "resize rejects a dim <= 0")


def _tensor_data(tensor: Any) -> np.ndarray:
    """``tensor.get_data_to_numpy()``, except for an empty tensor (a 0 dim): there the real
    call logs and returns an empty float64 array of shape (0,) (python/src/tensor_pybind.cc,
    get_data_to_numpy: "Tensor shape ... is invalid" -> py::array()), so the empty array is
    made here with the tensor's own shape and dtype. A dim < 0 after predict: BackendError."""
    shape = [int(d) for d in tensor.shape]
    if any(d < 0 for d in shape):
        raise BackendError(f"mindspore_lite output {getattr(tensor, 'name', '')!r} has the "
                           f"shape {shape} after predict")
    if 0 in shape:
        return np.empty(shape, _np_dtype(tensor.dtype, f"output {tensor.name!r}"))
    return _call("Tensor.get_data_to_numpy", tensor.get_data_to_numpy)


def _copy_out(outputs: Sequence[Any]) -> list[np.ndarray]:
    """Each output tensor's data as an array of its own (get_data_to_numpy is a view of the
    Model's output memory)."""
    return [np.array(_tensor_data(o)) for o in outputs]


def _checked_tensor(tensor: Any, what: str) -> Any:
    """``tensor`` unless it is null: ``create_tensor`` returns nullptr when the device
    allocation fails (python/src/tensor_pybind.cc create_tensor, MSTensor::CreateTensor in
    src/litert/cxx_api/types.cc: "malloc device data failed."), which python/api/tensor.py
    stores as ``Tensor._tensor`` unchecked: every later use would be an AttributeError."""
    if getattr(tensor, "_tensor", None) is None:
        raise BackendError(f"mindspore_lite Tensor(device=) returned a null tensor for {what}: "
                           "MindSpore Lite could not allocate its device memory (aclrtMalloc "
                           "failed, or the device id is out of range)")
    return tensor


def _write_device(tensor: Any, host: np.ndarray, what: str) -> None:
    """Copy ``host`` (C-contiguous, the tensor's dtype and byte size) into the device tensor
    ``tensor``, or raise BackendError. Through the binding ``tensor._tensor``, whose
    ``set_data_from_numpy`` returns SetTensorNumpyData's bool (python/src/tensor_pybind.cc):
    tensor.py's wrapper drops it, and the C++ side returns false without raising when the
    copy fails (CopyHostDataToDevice: aclrtMemcpy, acl_allocator.cc). The caller has set the
    tensor's device on this thread (:meth:`MsliteModel.bind_device`)."""
    bind = _checked_tensor(tensor, what)._tensor
    done = _call("Tensor.set_data_from_numpy", bind.set_data_from_numpy, host)
    if done is not True:
        raise BackendError(f"mindspore_lite Tensor.set_data_from_numpy of {what} returned "
                           f"{done!r}, expected True: the host-to-device copy did not happen "
                           "(SetTensorNumpyData: aclrtMemcpy failed, or the array's dtype, "
                           "size or layout differs from the tensor's)")


#: Config sections MindSpore Lite hands to its GE delegate, which only runs with
#: ``context.ascend.provider = "ge"``: without it ge.inputShape / ge.dynamicDims there would
#: be read by nothing and the gears never compiled.
GE_SECTIONS = ("ge_graph_options", "ge_session_options")


def build_config(config_path: str | None, spec: GearSpec | None,
                 ) -> tuple[str | None, dict[str, dict[str, str]] | None, str]:
    """What ``build_from_file`` gets: the converter config itself as ``config_path`` (its
    runtime options, the precision among them, are MindSpore Lite's to read), with provider
    "ge" when it has a GE section; with ``spec=`` alone, the spec's precision_mode as
    ``config_dict`` ``[ascend_context] precision_mode``. Returns (config_path, config_dict,
    provider)."""
    if config_path is not None:
        ge = any(s in GE_SECTIONS for s in config_sections(config_path))
        return config_path, None, "ge" if ge else ""
    if spec is not None and spec.precision_mode is not None:
        return None, {"ascend_context": {"precision_mode": spec.precision_mode}}, ""
    return None, None, ""


def recorded_spec(model: Any, path: str) -> GearSpec | None:
    """The gears the converter recorded in the MindIR (``get_model_info("input_shape")`` and
    ``("dynamic_dims")``: ``[acl_build_options]`` input_shape and ge.dynamicDims, atc's
    syntax); None when the release has no get_model_info or the model records no dims.
    CompileError when what it records does not parse."""
    get = getattr(model, "get_model_info", None)
    if get is None:
        return None
    shape = str(_call("Model.get_model_info", get, "input_shape") or "")
    dims = str(_call("Model.get_model_info", get, "dynamic_dims") or "")
    if not dims.strip() or not shape.strip():
        return None
    try:
        return GearSpec.from_atc(input_shape=shape, dynamic_dims=dims)
    except GearSpecError as exc:
        raise CompileError(f"{path!r} records gears that do not parse (input_shape {shape!r}, "
                           f"dynamic_dims {dims!r}): {exc}") from None


def checked_against_recorded(given: GearSpec | None, recorded: GearSpec | None,
                             path: str, static: GearSpec | None = None) -> GearSpec:
    """The spec to serve ``path`` with: the given one, which must have the recorded gears
    where the model records some (CompileError naming both otherwise), or the recorded one,
    or ``static`` (the model's own inputs when none has a dynamic axis: a static MindIR, the
    seed's decode step, served as it is); GearSpecError when there is none of them."""
    if given is None:
        if recorded is None and static is not None:
            return static
        if recorded is None:
            raise GearSpecError(
                f"mindspore_lite needs the gears of {path!r}: pass config= (the converter "
                "config file with input_shape and dynamic dims) or spec=; the model records "
                "none (converted without [acl_build_options] ge.dynamicDims, or a MindSpore "
                "Lite without Model.get_model_info)")
        return recorded
    if recorded is not None and sorted(recorded.gears) != sorted(given.gears):
        raise CompileError(f"{path!r} was converted with the gears {sorted(recorded.gears)} "
                           f"(its recorded input_shape / dynamic_dims), the config / spec "
                           f"gives {sorted(given.gears)}: give the converter's config")
    return given


class MsliteModel(BackendModel):
    """A MindIR built for Ascend, its gears (from the spec) and per-gear output shapes."""

    name = "mindspore_lite"
    #: predict() takes the inputs alone (MindSpore Lite selects the gear from their shapes
    #: after resize): no dims buffer is staged.
    stages_dims = False

    def __init__(self, mslite: Any, path: str, spec: GearSpec | None, device_id: int = 0,
                 config_path: str | None = None, model: Any = None,
                 precision_mode: str | None = None) -> None:
        """``model``: the ``mindspore_lite.Model`` to build (one that joined a ModelGroup);
        default a new one. ``precision_mode``: what a config without gears sets (a static
        model's), recorded in the spec made from the model's own shapes."""
        check_model_file(path)
        self.mslite, self.path, self.device_id = mslite, path, check_device_id(device_id)
        #: guards the Model object: resize + set data + predict are one critical section
        self.lock = threading.Lock()
        #: the gear the Model's inputs are resized to (None: unknown / not a gear)
        self.current_gear: int | None = None
        self._closed = False
        context = _call("Context()", mslite.Context)
        # MindSpore Lite appends a CPU device after the Ascend one (context.py's target
        # setter): ops without an Ascend kernel run on the host, which it does not report
        context.target = ["ascend"]
        context.ascend.device_id = device_id
        config_path, config_dict, provider = build_config(config_path, spec)
        if provider:
            context.ascend.provider = provider
        #: what the build was given: the converter config (None: none) and the options
        self.config_path, self.config_dict = config_path, config_dict
        #: MindSpore Lite's provider: "ge" (GE graph executor) or "" (the default, ACL)
        self.provider = provider
        #: the ModelGroup sharing this model's weights (None: none)
        self.group: Any = None
        self._build_args = (path, mslite.ModelType.MINDIR, context, config_path or "",
                            config_dict)
        self.model = mslite.Model() if model is None else model
        _call("Model.build_from_file", self.model.build_from_file, *self._build_args)
        self.inputs = list(_call("Model.get_inputs", self.model.get_inputs))
        spec = self.spec = checked_against_recorded(spec, recorded_spec(self.model, path), path,
                                                    self._static_spec(precision_mode))
        _check_positive_gears(spec)
        #: model input index of each spec input (spec order -> model order)
        self.order = self._match_inputs(spec)
        dtypes = tuple(_np_dtype(self.inputs[j].dtype, f"input {spec.input_names[i]!r}")
                       for i, j in enumerate(self.order))
        with self.lock:
            names, out_dtypes, shapes = self._output_table(spec, dtypes)
        self.info = ModelInfo(spec, dtypes, names, out_dtypes, shapes, hybrid=spec.hybrid)

    def _static_spec(self, precision_mode: str | None) -> GearSpec | None:
        """The model's inputs as a static spec (one gear ``()``), or None when one has a
        dynamic axis (then its gears must be given or recorded)."""
        shapes = [[int(d) for d in t.shape] for t in self.inputs]
        if not shapes or any(d < 0 for s in shapes for d in s):
            return None
        spec = GearSpec.static([str(getattr(t, "name", "")) for t in self.inputs], shapes)
        return replace(spec, precision_mode=precision_mode) if precision_mode else spec

    def _match_inputs(self, spec: GearSpec) -> tuple[int, ...]:
        """By name when every spec input is a model input; else by position when the counts
        agree (the prefill service's preferred_order fallback: converters may rename inputs)."""
        names = [str(getattr(t, "name", "")) for t in self.inputs]
        if len(names) != len(spec.input_names):
            raise CompileError(f"{self.path!r} has {len(names)} inputs {names}, the spec has "
                               f"{len(spec.input_names)} {list(spec.input_names)}")
        if set(spec.input_names) == set(names):
            order = tuple(names.index(n) for n in spec.input_names)
        else:
            order = tuple(range(len(names)))
        for i, j in enumerate(order):
            model_shape, spec_shape = list(self.inputs[j].shape), spec.input_shapes[i]
            if len(model_shape) != len(spec_shape) or any(
                    m >= 0 and s >= 0 and m != s for m, s in zip(model_shape, spec_shape,
                                                                 strict=True)):
                raise CompileError(f"input {spec.input_names[i]!r}: the model's shape "
                                   f"{model_shape} does not fit the spec's {list(spec_shape)}")
        return order

    def to_model_order(self, items: Sequence[T]) -> list[T]:
        """``items`` given in spec order (one per input), in MODEL order: what resize and
        predict take."""
        out = list(items)
        for i, j in enumerate(self.order):
            out[j] = items[i]
        return out

    def model_shapes(self, gear: int) -> list[list[int]]:
        """Every model input's shape in ``gear``, in MODEL order (what resize takes)."""
        return self.to_model_order([[int(d) for d in s] for s in self.spec.shapes(gear).values()])

    def select(self, gear: int) -> None:
        """Resize the Model's inputs to ``gear`` unless they already are (as the prefill
        service does: resize only when the shapes change). Call with :attr:`lock` held."""
        if self.current_gear == gear:
            return
        self.resize(self.model_shapes(gear))
        self.current_gear = gear

    def resize(self, shapes: list[list[int]]) -> None:
        """``Model.resize(inputs, shapes)`` (model order), then fresh input tensors."""
        self.current_gear = None  # unknown until the resize succeeded
        _call("Model.resize", self.model.resize, self.inputs, shapes)
        self.inputs = list(_call("Model.get_inputs", self.model.get_inputs))

    def _output_table(self, spec: GearSpec, dtypes: tuple[np.dtype, ...],
                      ) -> tuple[tuple[str, ...], tuple[np.dtype, ...],
                                 tuple[tuple[tuple[int, ...], ...], ...]]:
        """Output names, dtypes and per-gear shapes: resize to each gear, read get_outputs();
        predict on zeros when the shapes are not known before a run."""
        shapes, outputs = [], []
        for g in range(spec.gear_count):
            self.select(g)
            outputs = list(_call("Model.get_outputs", self.model.get_outputs))
            got = [tuple(int(d) for d in o.shape) for o in outputs]
            if not got or any(d < 0 for s in got for d in s):
                zeros = [np.zeros(s, dtype=dt) for s, dt in
                         zip(spec.shapes(g).values(), dtypes, strict=True)]
                outputs = self.predict(self.to_model_order(zeros))
                got = [tuple(int(d) for d in o.shape) for o in outputs]
            shapes.append(tuple(got))
        names = tuple(str(getattr(o, "name", f"output_{k}")) for k, o in enumerate(outputs))
        out_dtypes = tuple(_np_dtype(o.dtype, f"output {n!r}") for o, n in
                           zip(outputs, names, strict=True))
        return names, out_dtypes, tuple(shapes)

    def predict(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """Set every input (model order) from numpy and predict; returns output tensors.
        Call with :attr:`lock` held, after :meth:`select` / :meth:`resize`."""
        for tensor, array in zip(self.inputs, arrays, strict=True):
            _call("Tensor.set_data_from_numpy", tensor.set_data_from_numpy, array)
        outputs = _call("Model.predict", self.model.predict, self.inputs)
        if outputs is None:
            raise BackendError("mindspore_lite Model.predict returned no outputs: MindSpore "
                               "Lite >= 2.0 (predict(inputs) -> outputs) is required")
        return list(outputs)

    def rebuild_in(self, group: Any, model: Any) -> None:
        """Build this model again as ``model`` (a Model that joined ``group``) and run on it
        from now on: a ModelGroup shares weights between models built after they joined.
        Sessions made before go on, on the new build (they reach it through this object)."""
        _call("Model.build_from_file", model.build_from_file, *self._build_args)
        with self.lock:
            if self._closed:
                raise BackendError(f"mindspore_lite model {self.path!r} is closed")
            self.model, self.group, self.current_gear = model, group, None
            self.inputs = list(_call("Model.get_inputs", self.model.get_inputs))

    def weights_shareable(self) -> bool:
        """Whether :func:`sharing_refusal` lets a model on this one's provider share it."""
        return sharing_refusal(self, self.provider, self.path) is None

    @property
    def supports_state(self) -> bool:  # type: ignore[override]
        """Resident state in device tensors: on the default (ACL) provider, which reads and
        writes a tensor's device memory where it is; the GE provider copies every input from
        the host (ge_graph_executor.cc) and never reads a device address."""
        return self.provider != "ge"

    def device_tensor(self, shape: Sequence[int], dtype: np.dtype) -> Any:
        """A new tensor in this model's device memory (``Tensor(shape=, dtype=,
        device="ascend:<id>")``: the id given, since create_tensor_by_numpy keeps -1 when
        none is, which the runtime then refuses). Not zeroed."""
        mslite = self.mslite
        name = next(n for n, d in MSLITE_DTYPES.items() if d == np.dtype(dtype))
        device = f"ascend:{self.device_id}"
        tensor = _call("Tensor(device=)", mslite.Tensor, None, [int(d) for d in shape],
                       getattr(mslite.DataType, name), device)
        return _checked_tensor(tensor, f"{np.dtype(dtype)} {list(shape)} on device "
                                       f"{self.device_id} ({device})")

    def bind_device(self) -> None:
        """Make this model's device the calling thread's current ACL device before a
        host-to-device copy into one of its tensors: CopyHostDataToDevice calls aclrtMemcpy
        with NO aclrtSetDevice (acl_allocator.cc), which fails on a thread with no context
        (hicann/runtime api_impl.cc MemCopySync: RT_ERROR_CONTEXT_NULL; a server pool
        thread) and goes to the thread's current device, not the tensor's, on another.
        The Python API has no aclrtSetDevice; creating a device tensor calls it
        (AscendAllocatorPlugin::Malloc -> aclrtSetDevice(id), acl_allocator.cc): a 1-byte
        one, dropped at once. Rare (set_state, reset_state), so its malloc/free is cheap."""
        self.device_tensor((1,), np.dtype(np.uint8))

    def create_session(self, layout: Any, state: Any = None) -> MsliteSession:
        if self._closed:
            raise BackendError(f"mindspore_lite model {self.path!r} is closed")
        if state is not None and not self.supports_state:
            raise BackendError(str(self.state_refusal()))
        return MsliteSession(self, layout, state)

    def state_refusal(self) -> str | None:
        if self.supports_state:
            return None
        return (f"state= on mindspore_lite needs the default (ACL) provider: {self.path!r} is "
                "built with the GE provider (its config has [ge_graph_options]), which copies "
                "every input from the host, so the state would cross to the device every run")

    def close(self) -> None:
        """Drop the Model (MindSpore Lite frees it when collected); idempotent. Waits for a
        run in flight (the model's lock): the Model is never dropped under a predict."""
        with self.lock:
            self._closed = True
            self.model = None
            self.inputs = []


class MsliteSession(BackendSession):
    """One executor's staging buffer and its per-gear input views; with resident state (or
    an output given as another executor's device state) the run passes device tensors to
    ``predict(inputs, outputs)``, which MindSpore Lite reads and writes where they are."""

    def __init__(self, model: MsliteModel, layout: Any, state: Any = None) -> None:
        """``state``: a :class:`~gear_runtime.runtime.state.StatePlan`; its pairs then live
        in device tensors (:class:`MsliteState`) and ``layout`` covers its other inputs."""
        self._model = model
        info = model.info
        spec = info.spec
        staged = list(range(len(spec.input_names))) if state is None else list(state.inputs)
        check_layout_fits(layout, info, staged)
        expected = info.input_nbytes()
        self.staging = aligned_buffer(int(layout.total_bytes))  # 64-aligned, like pinned memory
        # Per gear, every input as a view of the staging, in MODEL order (what predict
        # takes); a state input has none (its device tensor is passed instead).
        self._views: list[list[np.ndarray | None]] = []
        for g in range(spec.gear_count):
            views: list[np.ndarray | None] = [None] * len(spec.input_names)
            for j, (i, shape) in enumerate((i, spec.shapes(g)[spec.input_names[i]])
                                           for i in staged):
                off = int(layout.offset(g, j))
                view = self.staging[off:off + expected[g][i]].view(info.input_dtypes[i])
                views[i] = view.reshape(shape)
            self._views.append(model.to_model_order(views))
        self._closed = False
        self._state_in = {} if state is None else {model.order[p.input_index]: j
                                                   for j, p in enumerate(state.pairs)}
        self._state_out = {} if state is None else {p.output_index: j
                                                    for j, p in enumerate(state.pairs)}
        self._outputs = self._output_buffers()
        #: per gear, per output: the device tensor a device run writes it to (made on first
        #: use; None for a state output, whose tensor is the state's)
        self._device_outputs: list[list[Any] | None] = [None] * spec.gear_count
        self.state: MsliteState | None = None if state is None else MsliteState(self, state)

    def _output_buffers(self) -> list[list[np.ndarray]]:
        """Per gear, per output: a view of one session buffer per output (sized for the
        largest gear) that a run copies the Model's output into."""
        info = self._model.info
        per_gear: list[list[np.ndarray]] = [[] for _ in range(info.spec.gear_count)]
        for k, dtype in enumerate(info.output_dtypes):
            sizes = [info.output_size(g, k) for g in range(info.spec.gear_count)]
            raw = aligned_buffer(max(max(sizes), 1))
            for g, nbytes in enumerate(sizes):
                view = raw[:nbytes].view(dtype).reshape(info.output_shapes[g][k])
                per_gear[g].append(view)
        return per_gear

    def _check_open(self) -> None:
        """Call with the model's lock held: the model may be closed by another thread."""
        if self._closed or self._model.model is None:
            raise BackendError("this mindspore_lite session (or its model) is closed")

    def run_gear(self, gear: int) -> list[np.ndarray]:
        """Resize if the model is on another gear, hand the staged inputs over (zero-copy),
        predict, copy the outputs into this session's buffers (valid until its next run)."""
        return self._run(gear, {}, {})

    def run_gear_owned(self, gear: int) -> list[np.ndarray]:
        """Large outputs are copied from the Model's output memory straight into pooled
        arrays the caller keeps (one copy each, base :meth:`run_owned_into`)."""
        return self.run_owned_into(gear, self._model.info, self._state_out)

    def _run(self, gear: int, bound: dict[int, DeviceBuffer], host: dict[int, np.ndarray]
             ) -> list[Any]:
        """One run: on the device (:meth:`_run_on_device`) with resident state or outputs
        ``bound`` to other executors' device states, else predict(inputs); output ``k``
        copied into ``host[k]`` where given, else into this session's buffer."""
        model = self._model
        model.info.spec.gear_number(gear, "model")
        if self.state is not None or bound:
            # the other executors' states too, from the check of their buffers through the
            # run: their close (which drops the tensors) waits; one order: no deadlock
            with locks_in_order(model.lock, *(b.lock for b in bound.values())):
                self._check_open()
                tensors = {k: self._bound_tensor(k, b) for k, b in bound.items()}
                return self._run_on_device(gear, tensors, host)
        with model.lock:
            self._check_open()
            model.select(gear)
            # no resident state: every input has its view (None marks a state input)
            outputs = model.predict(cast(list[np.ndarray], self._views[gear]))
            # copied before the lock is released: the next predict reuses that memory
            return self._copy_outputs(gear, outputs, host)

    def _copy_outputs(self, gear: int, outputs: Sequence[Any],
                      host: dict[int, np.ndarray]) -> list[np.ndarray]:
        """Copy gear ``gear``'s output tensors into ``host[k]`` or this session's buffers,
        after checking them against the gear map (BackendError naming the output)."""
        info = self._model.info
        targets = [host.get(k, t) for k, t in enumerate(self._outputs[gear])]
        if len(outputs) != len(targets):
            raise BackendError(f"gear {gear} gave {len(outputs)} outputs, the model has "
                               f"{len(targets)}")
        for k, (tensor, target) in enumerate(zip(outputs, targets, strict=True)):
            array = _tensor_data(tensor)
            if array.shape != target.shape or array.dtype != target.dtype:
                raise BackendError(
                    f"output {info.output_names[k]!r} of gear {gear} is {array.dtype} "
                    f"{tuple(array.shape)}, the gear map says {target.dtype} {target.shape}")
            np.copyto(target, array)
        return targets

    def device_out_refusal(self, buf: DeviceBuffer) -> str | None:
        """An output is written into a device tensor of this model's device, on the default
        (ACL) provider: ``predict(inputs, outputs)`` then writes it where it is
        (model_process.cc CheckAndInitOutput); the GE provider copies outputs to the host."""
        model = self._model
        if buf.backend != "mindspore_lite" or buf.device_id != model.device_id:
            return (f"this executor runs on mindspore_lite device {model.device_id}: it "
                    f"writes an output into a mindspore_lite device tensor of device "
                    f"{model.device_id} only; hand it over with set_state(name, output)")
        if not model.supports_state:
            return ("this model runs on MindSpore Lite's GE provider, which copies its "
                    "outputs to the host; hand it over with set_state(name, output)")
        return None

    def run_gear_into(self, gear: int, out: dict[int, Any]) -> list[Any]:
        """Outputs given as :class:`DeviceBuffer` are written into their device tensors by
        predict itself (no host copy); a numpy buffer receives the output's one copy out of
        MindSpore Lite's memory (not this session's buffer and then again the caller's)."""
        bound = {k: b for k, b in out.items() if isinstance(b, DeviceBuffer)}
        host = {k: b for k, b in out.items() if not isinstance(b, DeviceBuffer)}
        outputs = self._run(gear, bound, host)
        for k, buf in out.items():
            outputs[k] = buf
        return outputs

    def _bound_tensor(self, k: int, buf: DeviceBuffer) -> Any:
        """The device tensor of ``buf`` (output ``k``'s target), checked with its state's
        lock held (:meth:`_run`): still allocated (ClosedError), handed out by gear_runtime
        and not stale (InputError: its executor ran since)."""
        buf.check_genuine(f"out[{self._model.info.output_names[k]!r}]")
        return buf.handle

    def _run_on_device(self, gear: int, bound: dict[int, Any],
                       host: dict[int, np.ndarray]) -> list[Any]:
        """predict(inputs, outputs) with every output a device tensor: the state's (the
        buffer its parity's run does not read), ``bound[k]`` (another executor's state), or
        this session's own for the gear, copied after the run into ``host[k]`` or this
        session's buffer (one copy each, as predict's own host outputs). State inputs are
        the state's device tensors. Call with the model's lock (and ``bound``'s owners')
        held."""
        model = self._model
        parity = 0 if self.state is None else self.state.parity
        tensors = [] if self.state is None else self.state.tensors
        model.select(gear)
        inputs = []
        for j, (tensor, view) in enumerate(zip(model.inputs, self._views[gear],
                                               strict=True)):
            if view is None:
                inputs.append(tensors[self._state_in[j]][parity])
                continue
            _call("Tensor.set_data_from_numpy", tensor.set_data_from_numpy, view)
            inputs.append(tensor)
        outs = list(self._gear_outputs(gear))
        for k, pair in self._state_out.items():
            outs[k] = tensors[pair][1 - parity]
        for k, tensor in bound.items():
            outs[k] = tensor
        got = _call("Model.predict", model.model.predict, inputs, outs)
        if got is None or len(got) != len(outs):
            raise BackendError("mindspore_lite Model.predict(inputs, outputs) returned "
                               f"{got!r}: MindSpore Lite >= 2.0 is required")
        targets = [host.get(k, t) for k, t in enumerate(self._outputs[gear])]
        for k, tensor in enumerate(outs):
            if k not in bound and k not in self._state_out:
                np.copyto(targets[k], _tensor_data(tensor))
        return targets

    def _gear_outputs(self, gear: int) -> list[Any]:
        """This session's device tensors of gear ``gear``'s outputs (exactly the gear's
        byte size, which predict checks), made on first use."""
        made = self._device_outputs[gear]
        if made is None:
            info = self._model.info
            made = [None if k in self._state_out else
                    self._model.device_tensor(info.output_shapes[gear][k], dtype)
                    for k, dtype in enumerate(info.output_dtypes)]
            self._device_outputs[gear] = made
        return made

    def commit_state(self) -> None:
        """After a successful run: the tensors it wrote are what the next run reads (a new
        generation: buffers handed out before are stale). Under the model's lock: a handoff
        into this state checks the buffer's generation under it."""
        if self.state is not None:
            with self._model.lock:
                self.state.parity ^= 1

    def run_dynamic(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Hybrid mode after a miss: resize to the inputs' own shapes (the model was converted
        with the dynamic-shape graph as well) and predict."""
        model = self._model
        if not model.info.hybrid:
            return super().run_dynamic(arrays)
        _check_positive_shapes(model.info.spec.input_names, arrays)
        ordered = model.to_model_order([np.ascontiguousarray(a) for a in arrays])
        with model.lock:
            self._check_open()
            model.resize([[int(d) for d in a.shape] for a in ordered])
            return _copy_out(model.predict(ordered))

    def close(self) -> None:
        """Drop the buffers and device tensors (MindSpore Lite frees a tensor's device memory
        when its last holder goes); under the model's lock: never under a predict."""
        with self._model.lock:
            self._closed = True
            self.staging = np.empty(0, dtype=np.uint8)
            self._views, self._outputs = [], []
            self._device_outputs = []
            if self.state is not None:
                self.state.tensors = []


class MsliteState(DeviceStateBase):
    """Resident state in device tensors: per pair two (a run reads the one of its parity
    and writes the other, :meth:`MsliteSession.commit_state` swaps). The Python API has no
    device-to-device copy and no raw address: ``ex.state[name]`` is a
    :class:`DeviceBuffer` over the tensor itself, ``.numpy()`` one device-to-host copy,
    ``set_state`` one host-to-device copy (from another device tensor: through the host)."""

    def __init__(self, session: MsliteSession, plan: Any) -> None:
        self._session, self.plan, self.parity = session, plan, 0
        model = session._model
        self.backend, self.device_id = "mindspore_lite", model.device_id
        self.tensors = [(model.device_tensor(p.shape, p.dtype),
                         model.device_tensor(p.shape, p.dtype)) for p in plan.pairs]
        self.zero()

    def handles(self, pair: int) -> tuple[Any, Any]:
        return self.tensors[pair]

    def alive(self) -> bool:
        return not self._session._closed

    @property
    def lock(self) -> threading.Lock:
        """The model's lock: runs, state writes and the session's close hold it."""
        return self._session._model.lock

    def to_host(self, buf: DeviceBuffer) -> np.ndarray:
        """A host copy of ``buf`` (get_data_to_numpy: one device-to-host copy, into the
        tensor's host mirror, which the next call overwrites: copied out)."""
        with self._session._model.lock:
            return np.array(_tensor_data(buf.handle))

    def set(self, pair: int, value: Any) -> None:
        """``value`` into the tensor the next run reads: one host-to-device copy, from any
        thread (:meth:`MsliteModel.bind_device`); BackendError when it did not happen."""
        p = self.plan.pairs[pair]
        host = np.ascontiguousarray(value.numpy() if isinstance(value, DeviceBuffer)
                                    else np.asarray(value), dtype=p.dtype).reshape(p.shape)
        with self.lock:
            self._session._check_open()
            self._session._model.bind_device()
            _write_device(self.tensors[pair][self.parity], host, f"state {p.input_name!r}")

    def zero(self) -> None:
        """Both tensors of every pair zeroed (a new device tensor is not; a new sequence),
        from any thread; BackendError when a copy did not happen."""
        with self.lock:
            self._session._check_open()
            self._session._model.bind_device()
            for p, tensors in zip(self.plan.pairs, self.tensors, strict=True):
                zeros = np.zeros(p.shape, p.dtype)
                for tensor in tensors:
                    _write_device(tensor, zeros, f"state {p.input_name!r}")
