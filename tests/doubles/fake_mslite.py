"""A faithful double of MindSpore Lite's Python API (``import mindspore_lite``), cloud-side
inference on Ascend, for running the mindspore_lite backend without an NPU.

Faithful to the 2.x API reference (mindspore.cn/lite/api/en/r2.3.1/mindspore_lite/...):

* ``Context()`` with ``target`` (a list of "cpu" / "gpu" / "ascend") and
  ``ascend.device_id``; ``ModelType.MINDIR``; ``DataType`` members by name;
* ``Model().build_from_file(model_path, model_type, context=None, config_path="")``,
  ``get_inputs()`` (fresh Tensor wrappers over the model's tensors, so shapes follow resize),
  ``get_outputs()`` -> a tuple of ``TensorMeta`` (name, dtype, shape, format, element_num,
  data_size: no data, python/api/base_model.py), ``resize(inputs, dims)`` with the documented
  type checks (TypeError / ValueError), a dim <= 0 refused as ModelImpl::Resize does
  (src/extendrt/cxx_api/model/model_impl.cc) and ``RuntimeError("resize failed! ...")``,
  ``predict(inputs, outputs=None) -> list[Tensor]``;
* ``Tensor``: ``name``, ``shape``, ``dtype``, ``data_size``, ``set_data_from_numpy`` (dtype and
  byte size must match the tensor: RuntimeError otherwise) and ``get_data_to_numpy``, both
  ZERO-COPY as in python/src/tensor_pybind.cc: the tensor keeps the caller's array and reads
  it at predict time; an output array is a view of the model's output memory, which the next
  predict of the model overwrites (the stricter reading of reused output buffers);
* the gap docs/ge-notes.md section 9 describes: an out-of-gear shape fails only deep inside
  resize / predict, with no friendly message ("Shape Conflict").

The fake MindIR is a JSON file (:func:`write_mindir`) listing the inputs (shape with -1) and
the compiled gears (each a full shape per input, what the converter config expands to). Its
outputs follow the same checkable rule as the pyACL double: ``y = 2 * input0 + 1`` and
``cat`` = all inputs flattened and concatenated, as float32.
"""

from __future__ import annotations

import enum
import json
import os
import threading
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OUTPUT_NAMES = ("y", "cat")


def write_mindir(path: str | os.PathLike[str], inputs: Sequence[tuple[str, Sequence[int], str]],
                 gears: Sequence[Sequence[Sequence[int]]],
                 output_shapes_after_resize: bool = True, hybrid: bool = False,
                 recorded: tuple[str, str] | None = None) -> str:
    """Write a fake MindIR: ``inputs`` = (name, shape with -1, numpy dtype name); ``gears`` =
    per gear, every input's full shape. With ``output_shapes_after_resize=False`` the output
    tensors report -1 dims until a predict has run (some backends only know them then).
    ``hybrid=True``: converted with the dynamic-shape graph too, so resize takes any shape of
    the right rank (GE's hybrid mode). ``recorded``: the (input_shape, ge.dynamicDims) texts
    the converter records in the MindIR from ``[acl_build_options]``
    (tools/converter/converter.cc RecordSupportedDynamicDims), which
    ``Model.get_model_info("input_shape" / "dynamic_dims")`` returns."""
    doc = {"format": "fake-mindir",
           "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in inputs],
           "gears": [[list(s) for s in g] for g in gears],
           "output_shapes_after_resize": output_shapes_after_resize, "hybrid": hybrid,
           "model_info": {} if recorded is None else {"input_shape": recorded[0],
                                                       "dynamic_dims": recorded[1]}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return str(path)


class ModelType(enum.Enum):
    MINDIR = 0
    MINDIR_LITE = 4


class DataType(enum.Enum):
    """mindspore_lite.DataType (names as in the API; values are not relied upon)."""

    UNKNOWN = 0
    BOOL = 30
    INT8 = 32
    INT16 = 33
    INT32 = 34
    INT64 = 35
    UINT8 = 37
    UINT16 = 38
    UINT32 = 39
    UINT64 = 40
    FLOAT16 = 42
    FLOAT32 = 43
    FLOAT64 = 44


_TO_DATATYPE = {np.dtype(n.lower()): m for n, m in DataType.__members__.items() if n != "UNKNOWN"}


@dataclass
class FakeMsliteState:
    """What the double holds; tests read it to assert what the backend did."""

    #: every call in order: ("build_from_file", path), ("resize", shapes), ("predict",
    #: shapes), ("get_inputs", None), ("get_outputs", None), ("set_data_from_numpy", array)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    contexts: list[Any] = field(default_factory=list)  # the context of each build
    #: (config_path, config_dict, context.ascend.provider) of each build
    builds: list[tuple[str, Any, str]] = field(default_factory=list)
    #: call name -> error text: that call raises RuntimeError instead of running
    fail: dict[str, str] = field(default_factory=dict)
    #: every copy between host and device memory, in order: ("h2d" | "d2h" | "d2d", bytes):
    #: set_data_from_numpy / get_data_to_numpy on a device tensor, a host input or output
    #: crossing at predict (model_process.cc copies those), a device tensor of another device
    copies: list[tuple[str, int]] = field(default_factory=list)
    #: device tensors created
    device_tensors: int = 0
    #: per ModelGroup(SHARE_WEIGHT): the model paths built in it, in order
    weight_groups: list[list[str]] = field(default_factory=list)
    #: aclrtMalloc fails: ``create_tensor`` / ``create_tensor_by_numpy`` return nullptr
    #: (tensor_pybind.cc), which tensor.py stores as ``Tensor._tensor = None``
    malloc_fails: bool = False
    #: aclrtMemcpy host-to-device fails: SetTensorNumpyData returns false
    h2d_fails: bool = False
    #: host-to-device copies that ran on the calling thread's current device while the
    #: tensor lives on another (bytes, current device, the tensor's): they never reach it
    misdirected: list[tuple[int, int, int]] = field(default_factory=list)

    def calls_named(self, name: str) -> list[Any]:
        return [a for n, a in self.calls if n == name]


class TensorMeta:
    """mindspore_lite.TensorMeta (python/api/tensor.py): what get_outputs returns."""

    def __init__(self) -> None:
        self.name = ""
        self.dtype = DataType.UNKNOWN
        self.shape: list[int] = []
        self.format = 0
        self.element_num = 0
        self.data_size = 0


class _TensorImpl:
    def __init__(self, name: str, shape: Sequence[int], dtype: np.dtype) -> None:
        self.name, self.shape, self.dtype = name, list(shape), np.dtype(dtype)
        self.data: np.ndarray | None = None
        #: a device tensor's memory (uint8, its data_size) and device; host tensors: None / ""
        self.device_data: np.ndarray | None = None
        self.device, self.device_id = "", -1

    @property
    def nbytes(self) -> int:
        return max(int(np.prod(self.shape, dtype=np.int64)), 0) * self.dtype.itemsize


class _Devices:
    """ACL's per-thread current device (hicann/runtime: a thread's context is thread-local;
    ``Runtime::CurrentContext`` (core/src/runtime.cc) sets no device implicitly unless a
    default device id was configured): None until something on the thread calls
    aclrtSetDevice (mindspore-lite acl_allocator.cc Malloc / CopyDeviceDataToHost,
    model_infer.cc Init, a predict's context left current on a thread that had none)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def current(self) -> int | None:
        return getattr(self._local, "device", None)

    def set(self, device_id: int) -> None:  # aclrtSetDevice
        self._local.device = int(device_id)


class _TensorBind:
    """The pybind object ``Tensor._tensor`` (python/src/tensor_pybind.cc ``TensorBind``):
    ``set_data_from_numpy`` is SetTensorNumpyData, which RETURNS a bool (false on failure,
    never raises); tensor.py's wrapper ignores it."""

    def __init__(self, impl: _TensorImpl, state: FakeMsliteState, devices: _Devices) -> None:
        self._impl, self._state, self._devices = impl, state, devices

    def is_null(self) -> bool:
        return False

    def set_data_from_numpy(self, numpy_obj: np.ndarray) -> bool:
        """SetTensorNumpyData: false for a non-C-contiguous array, another dtype or byte
        size; a device tensor's data is copied with CopyHostDataToDevice (acl_allocator.cc:
        aclrtMemcpy with NO aclrtSetDevice): false on a thread with no current device
        (MemCopySync: RT_ERROR_CONTEXT_NULL, hicann/runtime api_impl.cc) or a failed copy;
        on a thread whose current device is another one the copy goes there (the stricter
        reading, not verified: reported true, the tensor keeps its old data)."""
        impl, state = self._impl, self._state
        if not numpy_obj.flags.c_contiguous:
            state.calls.append(("set_data_from_numpy: not C contiguous", numpy_obj))
            return False
        if numpy_obj.dtype != impl.dtype or numpy_obj.nbytes != impl.nbytes:
            return False
        state.calls.append(("set_data_from_numpy", numpy_obj))
        if impl.device_data is None:
            impl.data = numpy_obj  # zero-copy: read when predict runs
            return True
        current = self._devices.current
        if current is None or state.h2d_fails:
            return False
        if current != impl.device_id:
            state.misdirected.append((numpy_obj.nbytes, current, impl.device_id))
            return True
        impl.device_data[:] = np.frombuffer(numpy_obj.tobytes(), np.uint8)
        state.copies.append(("h2d", numpy_obj.nbytes))
        return True


def _check_device(device: Any) -> None:
    """python/api/_checkparam.py check_tensor_input_param: None, "ascend" or "ascend:N"."""
    if device is None:
        return
    if not isinstance(device, str):
        raise TypeError(f"device must be str, but got {type(device)}.")
    split = device.split(":")
    if len(split) > 2:
        raise TypeError("device must be 'ascend:index', eg: 'ascend:0'")
    if split[0] != "ascend":
        raise TypeError("now only support ascend device.")
    if len(split) == 2 and not split[1].isdigit():
        raise TypeError("device id should >= 0.")


class FakeMslite:
    """``FakeMslite().module`` is the double of ``mindspore_lite``; ``.state`` its state."""

    def __init__(self) -> None:
        self.state = FakeMsliteState()
        state = self.state
        #: the calling thread's current ACL device (aclrtSetDevice), per thread
        self.devices = devices = _Devices()

        class AscendDeviceInfo:
            def __init__(self) -> None:
                self._device_id = 0
                self.provider = ""

            @property
            def device_id(self) -> int:
                return self._device_id

            @device_id.setter
            def device_id(self, value: int) -> None:
                if not isinstance(value, int):
                    raise TypeError(f"device_id must be int, but got {type(value)}.")
                if value < 0:
                    raise ValueError(f"device_id must be a non-negative int, but got {value}.")
                self._device_id = value

        class Context:
            def __init__(self) -> None:
                self._target = ["cpu"]
                self.ascend = AscendDeviceInfo()

            @property
            def target(self) -> list[str]:
                return list(self._target)

            @target.setter
            def target(self, value: list[str]) -> None:
                if not isinstance(value, list):
                    raise TypeError(f"target must be list, but got {type(value)}.")
                for t in value:
                    if t.lower() not in ("cpu", "gpu", "ascend"):
                        raise ValueError(f"target elements must be in ['cpu', 'gpu', 'ascend'], "
                                         f"but got {t}.")
                self._target = [t.lower() for t in value]

        class Tensor:
            def __init__(self, tensor: Any = None, shape: Any = None, dtype: Any = None,
                         device: str | None = None) -> None:
                """python/api/tensor.py Tensor(tensor=None, shape=None, dtype=None,
                device=None). A device is honoured only with shape AND dtype (create_tensor)
                or a numpy array (create_tensor_by_numpy, which keeps the device id -1 when
                none is given: tensor_pybind.cc sets it before resolving it). Either returns
                nullptr when aclrtMalloc fails (``state.malloc_fails``): ``_tensor`` is then
                None, as tensor.py stores it unchecked. The double's own wrappers
                (get_inputs, predict) pass a _TensorImpl."""
                if isinstance(tensor, _TensorImpl):
                    self._tensor: _TensorBind | None = _TensorBind(tensor, state, devices)
                    return
                _check_device(device)
                kind, dev_id = "", -1
                if device is not None:
                    parts = device.split(":")
                    kind, dev_id = parts[0], int(parts[1]) if len(parts) == 2 else -1
                if tensor is None:
                    if shape is None or dtype is None:
                        self._tensor = _TensorBind(_TensorImpl("", [], np.float32), state,
                                                   devices)
                        return
                    if not isinstance(dtype, DataType):
                        raise TypeError(f"dtype must be DataType, but got {type(dtype)}.")
                    impl = _TensorImpl("", [int(d) for d in shape],
                                       np.dtype(dtype.name.lower()))
                    if kind:  # create_tensor resolves -1 to the current device (types.cc)
                        if not self._to_device(impl, "ascend", dev_id, keep_given=False):
                            self._tensor = None
                            return
                    else:
                        impl.data = np.zeros(impl.shape, impl.dtype)
                elif isinstance(tensor, np.ndarray):
                    impl = _TensorImpl("", tensor.shape, tensor.dtype)
                    impl.data = tensor
                    if kind:  # -1 kept on the tensor: the pitfall
                        if not self._to_device(impl, "ascend", dev_id, keep_given=True):
                            self._tensor = None
                            return
                        impl.device_data[:] = np.frombuffer(
                            np.ascontiguousarray(tensor).tobytes(), np.uint8)
                        state.copies.append(("h2d", impl.nbytes))
                else:
                    raise TypeError(f"tensor must be numpy.ndarray or Tensor, but got "
                                    f"{type(tensor)}.")
                self._tensor = _TensorBind(impl, state, devices)

            @property
            def _impl(self) -> _TensorImpl:
                # a null tensor (``_tensor`` None) fails here as tensor.py's does: an
                # AttributeError on the first use
                return self._tensor._impl  # type: ignore[union-attr]

            @staticmethod
            def _to_device(impl: _TensorImpl, kind: str, dev_id: int, keep_given: bool) -> bool:
                """AscendAllocatorPlugin::Malloc (acl_allocator.cc): the current device (set
                to 0 when none), then aclrtSetDevice(device) and aclrtMalloc; False when it
                fails. The memory is NOT zeroed (types.cc: no memset): garbage until written.
                ``keep_given``: the tensor records ``dev_id`` as given (-1 kept:
                create_tensor_by_numpy), else the resolved one (create_tensor)."""
                if devices.current is None:
                    devices.set(0)  # GetCurrentDeviceId: aclrtSetDevice(0)
                resolved = devices.current if dev_id < 0 else dev_id
                devices.set(resolved)
                if state.malloc_fails:
                    return False
                impl.device_data = np.full(max(impl.nbytes, 1), 0xAB, np.uint8)[:impl.nbytes]
                impl.device, impl.device_id = kind, dev_id if keep_given else resolved
                state.device_tensors += 1
                return True

            @property
            def device(self) -> str:
                """tensor_pybind.cc: device + ":" + id; "None:-1" for a host tensor."""
                return f"{self._impl.device or 'None'}:{self._impl.device_id}"

            @property
            def name(self) -> str:
                return self._impl.name

            @property
            def shape(self) -> list[int]:
                return list(self._impl.shape)

            @property
            def dtype(self) -> DataType:
                return _TO_DATATYPE[self._impl.dtype]

            @property
            def data_size(self) -> int:
                n = int(np.prod(self._impl.shape, dtype=np.int64))
                return max(n, 0) * self._impl.dtype.itemsize

            def set_data_from_numpy(self, numpy_obj: np.ndarray) -> None:
                """tensor.py: the type, dtype and size checks raise; then the binding's
                SetTensorNumpyData (:class:`_TensorBind`), whose bool tensor.py IGNORES:
                a Fortran-ordered array (``flags['FORC']`` passes it through), a device copy
                on a thread with no device or a failed copy leave the tensor as it was,
                silently. Arrays neither C- nor F-contiguous are made contiguous first."""
                if not isinstance(numpy_obj, np.ndarray):
                    raise TypeError(f"numpy_obj must be numpy.ndarray, but got "
                                    f"{type(numpy_obj)}.")
                if not (numpy_obj.flags.c_contiguous or numpy_obj.flags.f_contiguous):
                    numpy_obj = np.ascontiguousarray(numpy_obj)
                if numpy_obj.dtype != self._impl.dtype:
                    raise RuntimeError(f"data type not equal! Numpy type: {numpy_obj.dtype}, "
                                       f"Tensor type: {self.dtype}")
                if numpy_obj.nbytes != self.data_size:
                    raise RuntimeError(f"data size not equal! Numpy size: {numpy_obj.nbytes}, "
                                       f"Tensor size: {self.data_size}")
                self._tensor.set_data_from_numpy(numpy_obj)  # type: ignore[union-attr]

            def get_data_to_numpy(self) -> np.ndarray:
                if any(d <= 0 for d in self._impl.shape):
                    # tensor_pybind.cc: "Tensor shape ... is invalid", returns py::array():
                    # an empty float64 array of shape (0,), whatever the tensor's dtype
                    state.calls.append(("get_data_to_numpy: invalid shape", self._impl.shape))
                    return np.array([], dtype=np.float64)
                impl = self._impl
                if impl.device_data is not None:
                    # GetPyBufferInfo: a device-to-host copy into the tensor's host mirror,
                    # returned as a VIEW of it (the next call overwrites it);
                    # CopyDeviceDataToHost calls aclrtSetDevice(its device id) first
                    # (acl_allocator.cc): this thread's current device from now on
                    if impl.device_id >= 0:
                        devices.set(impl.device_id)
                    if impl.data is None or impl.data.nbytes != impl.nbytes:
                        impl.data = np.empty(impl.shape, impl.dtype)
                    impl.data.reshape(-1).view(np.uint8)[:] = impl.device_data
                    state.copies.append(("d2h", impl.nbytes))
                if impl.data is None:
                    raise RuntimeError("get_data_to_numpy failed: tensor has no data")
                return impl.data.reshape(impl.shape)  # zero-copy view

        class Model:
            def __init__(self) -> None:
                self._inputs: list[_TensorImpl] = []
                self._outputs: list[_TensorImpl] = []
                #: the model's output memory, reused by every predict (grown when too small)
                self._out_memory: list[np.ndarray] = []
                self._gears: list[tuple[tuple[int, ...], ...]] = []
                self._outputs_known = True
                self._hybrid = False
                self._model_info: dict[str, str] = {}
                self.model_path_ = ""
                self._device_id, self._provider = 0, ""
                self._group: Any = None  # the ModelGroup it was added to

            def _record(self, name: str, args: Any) -> None:
                state.calls.append((name, args))
                if name in state.fail:
                    raise RuntimeError(f"{name} failed! Error is {state.fail[name]}")

            def build_from_file(self, model_path: str, model_type: ModelType,
                                context: Context | None = None, config_path: str = "",
                                config_dict: dict | None = None) -> None:
                if not isinstance(model_path, str):
                    raise TypeError(f"model_path must be str, but got {type(model_path)}.")
                if not isinstance(model_type, ModelType):
                    raise TypeError(f"model_type must be ModelType, but got {type(model_type)}.")
                if context is not None and not isinstance(context, Context):
                    raise TypeError(f"context must be Context, but got {type(context)}.")
                # model.py: check_isinstance("config_path", config_path, str), a config_path
                # that does not exist refused, config_dict a dict of str -> dict of str -> str
                if not isinstance(config_path, str):
                    raise TypeError(f"config_path must be str, but got {type(config_path)}.")
                if config_path and not os.path.exists(config_path):
                    raise RuntimeError("build_from_file failed, config_path does not exist!")
                if config_dict is not None and not (isinstance(config_dict, dict) and all(
                        isinstance(k, str) and isinstance(v, dict)
                        and all(isinstance(a, str) and isinstance(b, str) for a, b in v.items())
                        for k, v in config_dict.items())):
                    raise TypeError("config_dict must be dict{str: dict{str: str}}, but got "
                                    f"{config_dict!r}.")
                self._record("build_from_file", model_path)
                if not os.path.exists(model_path):
                    raise RuntimeError("build_from_file failed, model_path does not exist!")
                try:
                    with open(model_path, encoding="utf-8") as f:
                        doc = json.load(f)
                    assert doc["format"] == "fake-mindir"
                    self._inputs = [_TensorImpl(i["name"], i["shape"], i["dtype"])
                                    for i in doc["inputs"]]
                    self._gears = [tuple(tuple(s) for s in g) for g in doc["gears"]]
                    self._outputs_known = bool(doc.get("output_shapes_after_resize", True))
                    self._hybrid = bool(doc.get("hybrid", False))
                    self._model_info = {str(k): str(v)
                                        for k, v in doc.get("model_info", {}).items()}
                except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
                    raise RuntimeError(f"build_from_file failed! Error is Load model failed: "
                                       f"{exc!r}") from None
                self._outputs = [_TensorImpl(n, [-1], np.float32) for n in OUTPUT_NAMES]
                self._update_outputs(known=self._outputs_known)
                state.contexts.append(context)
                if context is not None:
                    self._device_id = context.ascend.device_id
                    self._provider = context.ascend.provider
                # model_infer.cc ModelInfer::Init: aclrtSetDevice(device_id) on this thread
                devices.set(self._device_id)
                # model_group_impl.cc writes group_id into the model's config, which only the
                # GE executor reads (as its session id): other providers ignore it
                if self._group is not None and self._provider == "ge":
                    self._group.built.append(model_path)
                state.builds.append((config_path, config_dict,
                                     "" if context is None else context.ascend.provider))
                self.model_path_ = model_path

            def _gear(self) -> int | None:
                shapes = tuple(tuple(t.shape) for t in self._inputs)
                return self._gears.index(shapes) if shapes in self._gears else None

            def _update_outputs(self, known: bool) -> None:
                shapes = [tuple(t.shape) for t in self._inputs]
                if not known or any(d < 0 for s in shapes for d in s):
                    for t in self._outputs:
                        t.shape = [-1] * (len(self._inputs[0].shape) if t.name == "y" else 1)
                    return
                total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
                self._outputs[0].shape, self._outputs[1].shape = list(shapes[0]), [total]

            def get_model_info(self, key: str) -> str:
                # base_model.py: a str key, else TypeError; Model::GetModelInfo (extendrt
                # model.cc): an unsupported key or one the MindIR does not record is ""
                if not isinstance(key, str):
                    raise TypeError(f"key must be str, but got {type(key)}.")
                self._record("get_model_info", key)
                if key not in ("user_info", "input_shape", "dynamic_dims", "current_pid",
                               "sharable_weight_mem_handle"):
                    return ""
                return self._model_info.get(key, "")

            def get_inputs(self) -> list[Tensor]:
                self._record("get_inputs", None)
                return [Tensor(t) for t in self._inputs]

            def get_outputs(self) -> tuple[TensorMeta, ...]:
                self._record("get_outputs", None)
                metas = []
                for t in self._outputs:
                    meta = TensorMeta()
                    meta.name, meta.dtype, meta.shape = t.name, _TO_DATATYPE[t.dtype], list(t.shape)
                    meta.element_num = int(np.prod(t.shape, dtype=np.int64))
                    meta.data_size = max(meta.element_num, 0) * t.dtype.itemsize
                    metas.append(meta)
                return tuple(metas)

            def resize(self, inputs: list[Tensor], dims: list[list[int]]) -> None:
                if not isinstance(inputs, list):
                    raise TypeError(f"inputs must be list, but got {type(inputs)}.")
                if not isinstance(dims, list):
                    raise TypeError(f"dims must be list, but got {type(dims)}.")
                for i, d in enumerate(dims):
                    if not isinstance(d, list) or not all(isinstance(v, int) for v in d):
                        raise TypeError(f"dims element must be list of int, at index {i}.")
                if len(inputs) != len(dims):
                    raise ValueError(f"inputs' size does not match dims' size, but got inputs: "
                                     f"{len(inputs)} and dims: {len(dims)}.")
                self._record("resize", [list(d) for d in dims])
                self._enter_context()
                bad = [v for d in dims for v in d if v <= 0 or v > 2**31 - 1]
                if bad:  # ModelImpl::Resize, before anything else
                    raise RuntimeError(f"resize failed! Error is Invalid shape! dim: {bad[0]}")
                impls = [t._impl for t in inputs]
                if impls != self._inputs[:len(impls)] or len(impls) != len(self._inputs):
                    raise RuntimeError("resize failed! Error is inputs are not the model's")
                if self._hybrid:
                    if [len(d) for d in dims] != [len(t.shape) for t in self._inputs] or \
                            any(v <= 0 for d in dims for v in d):
                        raise RuntimeError("resize failed! Error is Shape Conflict: rank or "
                                           "non-positive dim")
                elif tuple(tuple(d) for d in dims) not in self._gears:
                    # GE's dynamic-dims graph: "Shape Conflict" deep inside, no gear list
                    raise RuntimeError("resize failed! Error is Common error code. Shape "
                                       "Conflict: input shape is not in the dynamic dims")
                for t, d in zip(self._inputs, dims, strict=True):
                    t.shape, t.data = list(d), None
                self._update_outputs(known=self._outputs_known)

            def predict(self, inputs: list[Tensor], outputs: list[Tensor] | None = None,
                        ) -> list[Tensor]:
                if not isinstance(inputs, (list, tuple)):
                    raise TypeError(f"inputs must be list or tuple, but got {type(inputs)}.")
                if len(inputs) != len(self._inputs):
                    raise RuntimeError(f"model input len:{len(self._inputs)} not equal input "
                                       f"len:{len(inputs)}!")
                self._record("predict", [t.shape for t in inputs])
                self._enter_context()
                gear = self._gear()
                if gear is None and not (self._hybrid and all(
                        d > 0 for t in self._inputs for d in t.shape)):
                    raise RuntimeError("predict failed! Error is Shape Conflict: current input "
                                       "shapes are no compiled gear")
                arrays = [self._input_array(i, t) for i, t in enumerate(inputs)]
                results = [arrays[0].astype(np.float32) * 2 + 1,
                           np.concatenate([a.astype(np.float32).ravel() for a in arrays])]
                self._update_outputs(known=True)
                if outputs is not None:
                    return self._into(outputs, results)
                for k, (t, r) in enumerate(zip(self._outputs, results, strict=True)):
                    t.data = self._output_memory(k, r.size)[:r.size]
                    t.data[:] = r.ravel()
                    state.copies.append(("d2h", r.nbytes))  # GetOutputs: host outputs
                return [Tensor(t) for t in self._outputs]

            def _enter_context(self) -> None:
                """model_infer.cc Inference / Resize: ModelInferContextGuard restores the
                thread's context only when it had one (aclrtGetCurrentContext succeeded):
                on a thread with none, the model's context stays current afterwards."""
                if devices.current is None:
                    devices.set(self._device_id)

            def _device_check(self, what: str, impl: _TensorImpl) -> None:
                """A device tensor at predict: the GE provider never reads a device address
                (ge_graph_executor.cc copies from the host data: the double refuses rather
                than read garbage); the ACL path takes one of the model's device as it is,
                copies one of another device (d2d) and refuses id -1 (acl_allocator.cc)."""
                if self._provider == "ge":
                    raise RuntimeError(f"predict failed! Error is {what} is a device tensor: "
                                       "the GE provider reads host data only")
                if impl.device_id < 0:
                    raise RuntimeError(f"predict failed! Error is {what}: need set src device "
                                       "id and dst device id")
                if impl.device_id != self._device_id:
                    state.copies.append(("d2d", impl.nbytes))

            def _input_array(self, i: int, t: Any) -> np.ndarray:
                impl = t._impl
                if impl.device_data is not None:
                    self._device_check(f"input {i}", impl)
                    if impl.nbytes != self._inputs[i].nbytes or \
                            list(impl.shape) != list(self._inputs[i].shape):
                        raise RuntimeError(f"predict failed! Error is input {i} size "
                                           f"{impl.nbytes} != model input size "
                                           f"{self._inputs[i].nbytes}")
                    return impl.device_data.view(impl.dtype).reshape(impl.shape).copy()
                if impl.data is None:
                    raise RuntimeError(f"predict failed! Error is input {impl.name} has no data")
                state.copies.append(("h2d", impl.data.nbytes))  # model_process.cc: H2D
                return impl.data.reshape(impl.shape)

            def _into(self, outputs: Any, results: list[np.ndarray]) -> list[Any]:
                """predict(inputs, outputs): one tensor per model output, each of the
                model's dtype and EXACTLY its byte size after this run's resize
                (single_op_session.cc InitInputOutputData, model_process.cc
                CheckOutputTensors); a device tensor is written where it is, a host one
                gets a device-to-host copy; the very tensors given are returned."""
                if not isinstance(outputs, (list, tuple)) or len(outputs) != len(self._outputs):
                    raise RuntimeError(f"predict failed! Error is outputs {outputs!r} are not "
                                       f"one tensor per model output ({len(self._outputs)})")
                for k, (t, r, meta) in enumerate(zip(outputs, results, self._outputs,
                                                     strict=True)):
                    impl = t._impl
                    if impl.dtype != meta.dtype or impl.nbytes != r.nbytes:
                        raise RuntimeError(f"predict failed! Error is output {k} is "
                                           f"{impl.dtype} of {impl.nbytes} bytes, the model's "
                                           f"is {meta.dtype} of {r.nbytes}")
                    if impl.device_data is not None:
                        self._device_check(f"output {k}", impl)
                        impl.device_data[:] = np.frombuffer(r.tobytes(), np.uint8)
                    else:
                        impl.data = r.reshape(impl.shape).copy()
                        state.copies.append(("d2h", r.nbytes))
                return list(outputs)

            def _output_memory(self, k: int, n: int) -> np.ndarray:
                """Output ``k``'s memory, reused across predicts (float32, >= n elements)."""
                while len(self._out_memory) <= k:
                    self._out_memory.append(np.zeros(0, np.float32))
                if self._out_memory[k].size < n:
                    self._out_memory[k] = np.zeros(max(n, 1), np.float32)
                return self._out_memory[k]

        class ModelGroupFlag(enum.Enum):
            SHARE_WEIGHT = 1
            SHARE_WORKSPACE = 2
            SHARE_WEIGHT_WORKSPACE = 3

        class ModelGroup:
            """python/api/model.py ModelGroup(flags=SHARE_WORKSPACE): add_model takes paths
            (workspace sharing) or Model objects, the latter only with SHARE_WEIGHT
            (model_group_impl.cc AddModel); a model in a group already is refused. Weights
            are shared by models built AFTER add_model with the GE provider (the group id
            is the GE session id): the double refuses a model already built (its config
            would be read by nothing) and records the GE builds in state.weight_groups."""

            def __init__(self, flags: ModelGroupFlag = ModelGroupFlag.SHARE_WORKSPACE) -> None:
                if not isinstance(flags, ModelGroupFlag):
                    raise TypeError(f"flags must be ModelGroupFlag, but got {type(flags)}.")
                self.flags = flags
                self.built: list[str] = []
                if flags == ModelGroupFlag.SHARE_WEIGHT:
                    state.weight_groups.append(self.built)

            def add_model(self, models: Any) -> None:
                if not isinstance(models, (list, tuple)) or not models:
                    raise TypeError(f"models must be list/tuple, but got {type(models)}.")
                if all(isinstance(m, str) for m in models):
                    return  # workspace sharing by path: nothing the double models
                if not all(isinstance(m, Model) for m in models):
                    raise TypeError("models element must be all str or all Model.")
                if self.flags != ModelGroupFlag.SHARE_WEIGHT:
                    raise RuntimeError("add model failed! Only SHARE_WEIGHT takes Model objects")
                for model in models:
                    if model._group is not None or model.model_path_:
                        raise RuntimeError("add model failed! model is in a group already or "
                                           "built already")
                for model in models:
                    model._group = self

        m = types.ModuleType("mindspore_lite")
        m.__doc__ = "fake MindSpore Lite (tests/doubles/fake_mslite.py)"
        m.Context, m.Model, m.Tensor = Context, Model, Tensor
        m.ModelType, m.DataType, m.TensorMeta = ModelType, DataType, TensorMeta
        m.AscendDeviceInfo = AscendDeviceInfo
        m.ModelGroup, m.ModelGroupFlag = ModelGroup, ModelGroupFlag
        self.module = m
