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


class FakeMslite:
    """``FakeMslite().module`` is the double of ``mindspore_lite``; ``.state`` its state."""

    def __init__(self) -> None:
        self.state = FakeMsliteState()
        state = self.state

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
            def __init__(self, impl: _TensorImpl | None = None) -> None:
                self._impl = impl or _TensorImpl("", [], np.float32)

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
                if not isinstance(numpy_obj, np.ndarray):
                    raise TypeError(f"numpy_obj must be numpy.ndarray, but got "
                                    f"{type(numpy_obj)}.")
                if numpy_obj.dtype != self._impl.dtype:
                    raise RuntimeError(f"data type not equal! Numpy type: {numpy_obj.dtype}, "
                                       f"Tensor type: {self.dtype}")
                if numpy_obj.nbytes != self.data_size:
                    raise RuntimeError(f"data size not equal! Numpy size: {numpy_obj.nbytes}, "
                                       f"Tensor size: {self.data_size}")
                state.calls.append(("set_data_from_numpy", numpy_obj))
                # tensor.py makes only arrays that are neither C- nor F-contiguous contiguous
                # (`if not numpy_obj.flags['FORC']`); SetTensorNumpyData (tensor_pybind.cc)
                # then refuses a non-C-contiguous one with a log line and returns false, which
                # tensor.py ignores: a Fortran-ordered array leaves the input UNSET, silently.
                if not numpy_obj.flags.c_contiguous and numpy_obj.flags.f_contiguous:
                    state.calls.append(("set_data_from_numpy: not C contiguous", numpy_obj))
                    return
                # zero-copy: the tensor reads the caller's memory when predict runs
                self._impl.data = numpy_obj if numpy_obj.flags.c_contiguous else \
                    np.ascontiguousarray(numpy_obj)

            def get_data_to_numpy(self) -> np.ndarray:
                if any(d <= 0 for d in self._impl.shape):
                    # tensor_pybind.cc: "Tensor shape ... is invalid", returns py::array():
                    # an empty float64 array of shape (0,), whatever the tensor's dtype
                    state.calls.append(("get_data_to_numpy: invalid shape", self._impl.shape))
                    return np.array([], dtype=np.float64)
                if self._impl.data is None:
                    raise RuntimeError("get_data_to_numpy failed: tensor has no data")
                return self._impl.data.reshape(self._impl.shape)  # zero-copy view

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
                gear = self._gear()
                if gear is None and not (self._hybrid and all(
                        d > 0 for t in self._inputs for d in t.shape)):
                    raise RuntimeError("predict failed! Error is Shape Conflict: current input "
                                       "shapes are no compiled gear")
                arrays = []
                for t in inputs:
                    if t._impl.data is None:
                        raise RuntimeError(f"predict failed! Error is input {t.name} has no data")
                    arrays.append(t._impl.data.reshape(t._impl.shape))
                results = [arrays[0].astype(np.float32) * 2 + 1,
                           np.concatenate([a.astype(np.float32).ravel() for a in arrays])]
                self._update_outputs(known=True)
                for k, (t, r) in enumerate(zip(self._outputs, results, strict=True)):
                    t.data = self._output_memory(k, r.size)[:r.size]
                    t.data[:] = r.ravel()
                return [Tensor(t) for t in self._outputs]

            def _output_memory(self, k: int, n: int) -> np.ndarray:
                """Output ``k``'s memory, reused across predicts (float32, >= n elements)."""
                while len(self._out_memory) <= k:
                    self._out_memory.append(np.zeros(0, np.float32))
                if self._out_memory[k].size < n:
                    self._out_memory[k] = np.zeros(max(n, 1), np.float32)
                return self._out_memory[k]

        m = types.ModuleType("mindspore_lite")
        m.__doc__ = "fake MindSpore Lite (tests/doubles/fake_mslite.py)"
        m.Context, m.Model, m.Tensor = Context, Model, Tensor
        m.ModelType, m.DataType, m.TensorMeta = ModelType, DataType, TensorMeta
        m.AscendDeviceInfo = AscendDeviceInfo
        self.module = m
