"""Open Inference Protocol (KServe v2 REST) codecs, with Triton's binary tensor extension.

A request body is a JSON object, optionally followed by raw tensor bytes: then the header
``Inference-Header-Content-Length`` gives the JSON's length and every binary input carries
``"parameters": {"binary_data_size": N}``; the binary inputs' bytes follow in input order,
row-major, native little-endian. An output is answered in binary when the request asks for it
(``outputs[i].parameters.binary_data``, or the request parameter ``binary_data_output`` for
every output not listed otherwise), with the same header and parameter in the response.

This module knows the wire format only, not the models: every check here is one a request
fails whatever model it is sent to. A failure is an :class:`InputError` (HTTP 400, code 145000)
whose message names the tensor and what was wrong; no body, however malformed, raises
anything else.

JSON is read and written by orjson: numeric tensors are encoded from the numpy array in C
(float32 values in their shortest float32 form, NaN and infinities as ``null``, which JSON
has instead) and parsed without Python code per value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gear_runtime.errors import InputError
from gear_runtime.runtime.inputs import list_to_array

#: The one model version served (v2 paths and replies name it): one home for every module.
MODEL_VERSION = "1"

#: The header Triton's binary extension uses for the JSON part's length.
HEADER_LENGTH = "Inference-Header-Content-Length"

#: v2 datatype -> numpy dtype (little-endian, as the binary extension sends them). BYTES is
#: not here: gear models take numeric tensors, and a BYTES tensor is refused by name.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_BY_DTYPE = {dt: name for name, dt in DATATYPES.items()}

#: The most axes a tensor may have (numpy's limit is 64; no model input has more than a few).
MAX_RANK = 32
#: Characters of the widest JSON text of one value, per numpy kind (integers: computed from
#: the dtype's range): ``false``, and ``-2.2250738585072014e-308`` (a float's shortest
#: round-trip form is at most that long).
_WIDEST_VALUE = {"b": 5, "f": 24}

def json_width(dtype: np.dtype | type, rank: int) -> int:
    """The most bytes one value of ``dtype`` takes in a JSON request for a tensor of
    ``rank`` axes: the widest value, a separator with a space, and per axis a bracket pair
    with some indentation (nested data, pretty-printed)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        value = len(str(info.min if dt.kind == "i" else info.max))
    else:
        value = _WIDEST_VALUE.get(dt.kind, 24)
    return value + 4 + 4 * rank


def _short(value: Any, limit: int = 120) -> str:
    """repr of a client's value, cut: an error message never echoes a huge one."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def datatype_of(dtype: np.dtype | type) -> str:
    """The v2 datatype name of a numpy dtype; InputError for one the protocol cannot carry."""
    dt = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    try:
        return _BY_DTYPE[dt]
    except KeyError:
        raise InputError(f"dtype {np.dtype(dtype)} has no v2 protocol datatype") from None


@dataclass
class InferRequest:
    """A decoded infer request: the tensors as numpy arrays, what to answer and how."""

    inputs: dict[str, np.ndarray]
    #: the input datatypes as sent (the model checks them against its own)
    datatypes: dict[str, str]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    #: requested outputs, name -> binary; None: every output
    outputs: dict[str, bool] | None = None
    #: binary for outputs not listed (the request parameter ``binary_data_output``)
    binary_default: bool = False

    def binary(self, name: str) -> bool:
        """Whether output ``name`` is answered in binary."""
        if self.outputs is not None and name in self.outputs:
            return self.outputs[name]
        return self.binary_default


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """(JSON part, binary part) of a request body, per ``Inference-Header-Content-Length``."""
    if header_length is None:
        return body, memoryview(b"")
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:  # int() takes "1_0", "+5"
        raise InputError(f"{HEADER_LENGTH} {header_length!r} is not a non-negative integer "
                         "(decimal digits)")
    n = int(text)
    if not 0 <= n <= len(body):
        raise InputError(f"{HEADER_LENGTH} {n} is outside the body of {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


def decode_request(body: bytes, header_length: str | None = None) -> InferRequest:
    """Decode an infer request body (JSON, or JSON + binary tensors); InputError on anything
    malformed: bad JSON, missing fields, unknown datatypes, data that does not fill the
    shape, binary data truncated or left over."""
    text, binary = split_body(body, header_length)
    doc = _json_object(text)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InputError('the request needs "inputs": a non-empty list of tensors')
    params = _parameters(doc, "the request")
    request = InferRequest(inputs={}, datatypes={}, parameters=params,
                           id=_optional_str(doc, "id"),
                           binary_default=params.get("binary_data_output") is True)
    offset = 0
    for i, tensor in enumerate(raw_inputs):
        name, shape, datatype, array, used = _decode_tensor(tensor, i, binary[offset:])
        if name in request.inputs:
            raise InputError(f"input {name!r} is given twice")
        request.inputs[name], request.datatypes[name] = array, datatype
        offset += used
    if offset != len(binary):
        raise InputError(f"{len(binary) - offset} bytes of binary data follow the inputs "
                         "and belong to none of them")
    request.outputs = _requested_outputs(doc.get("outputs"), request.binary_default)
    return request


def _json_object(text: bytes | memoryview) -> dict[str, Any]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # also: nested too deeply, a number out of range
        raise InputError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InputError(f"the request must be a JSON object, got {type(doc).__name__}")
    return doc


def _optional_str(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise InputError(f'"{key}" must be a string')
    return value


def _parameters(doc: Mapping[str, Any], what: str) -> dict[str, Any]:
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InputError(f'"parameters" of {what} must be a JSON object')
    return params


def _decode_tensor(tensor: Any, index: int,
                   binary: memoryview) -> tuple[str, tuple[int, ...], str, np.ndarray, int]:
    """One input: (name, shape, datatype, array, binary bytes used)."""
    if not isinstance(tensor, dict):
        raise InputError(f"inputs[{index}] must be a JSON object")
    name = tensor.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f'inputs[{index}] needs a "name" (a non-empty string)')
    shape = check_shape(name, tensor.get("shape"))
    datatype = check_datatype(name, tensor.get("datatype"))
    dtype = DATATYPES[datatype]
    size = _parameters(tensor, f"input {name!r}").get("binary_data_size")
    if size is not None and "data" in tensor:
        raise InputError(f'input {name!r} has both "data" and a binary_data_size; give one')
    if size is not None:
        array, used = binary_tensor(name, shape, dtype, size, binary), size
    elif "data" in tensor:
        array, used = list_tensor(name, shape, dtype, tensor["data"]), 0
    else:
        raise InputError(f'input {name!r} has neither "data" nor a binary_data_size')
    return name, shape, datatype, array, used


def check_datatype(name: str, datatype: Any) -> str:
    """``datatype`` if it is a v2 datatype gear models take, else InputError."""
    if datatype == "BYTES":
        raise InputError(f"input {name!r}: BYTES tensors are not supported (gear models take "
                         f"numeric tensors: {', '.join(DATATYPES)})")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InputError(f'input {name!r}: "datatype" must be one of {", ".join(DATATYPES)}; '
                         f"got {_short(datatype)}")
    return datatype


def check_shape(name: str, value: Any) -> tuple[int, ...]:
    """A shape the protocol allows: at most MAX_RANK int64 dims >= 0 whose elements an
    array of 8-byte values could hold (a dim of 0 makes a tensor empty, not any size)."""
    if not isinstance(value, list) or len(value) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in value):
        raise InputError(f'input {name!r}: "shape" must be a list of at most {MAX_RANK} '
                         f"integers in 0..2**63-1, got {_short(value)}")
    if math.prod(max(d, 1) for d in value) * 8 >= 2**63:
        raise InputError(f"input {name!r}: shape {_short(value)} has more elements than a "
                         "tensor can hold")
    return tuple(value)


def binary_tensor(name: str, shape: tuple[int, ...], dtype: np.dtype, size: Any,
                  binary: memoryview) -> np.ndarray:
    """``size`` bytes at the start of ``binary`` as a tensor; InputError unless ``size`` is
    what the shape and dtype take and the bytes are there."""
    expected = math.prod(shape) * dtype.itemsize
    if not isinstance(size, int) or isinstance(size, bool) or size != expected:
        raise InputError(f"input {name!r}: binary_data_size {size!r} does not match shape "
                         f"{list(shape)} of {dtype} ({expected} bytes)")
    if size > len(binary):
        raise InputError(f"input {name!r}: binary data truncated: {size} bytes expected, "
                         f"{len(binary)} left in the body")
    # a copy: the array outlives the request body and must be writable and aligned
    return np.frombuffer(binary[:size], dtype=dtype).reshape(shape).copy()


def list_tensor(name: str, shape: tuple[int, ...], dtype: np.dtype, data: Any) -> np.ndarray:
    """JSON ``data`` (flat or nested lists, row-major; also gRPC's typed contents) as an
    array of ``dtype`` and ``shape``: values under the runtime's list rule
    (:func:`gear_runtime.runtime.inputs.list_to_array`, the executor's rule for Python
    lists), exactly ``prod(shape)`` of them."""
    array = list_to_array(name, data, dtype)
    if array.size != math.prod(shape):
        raise InputError(f"input {name!r}: {array.size} values for shape {list(shape)} "
                         f"({math.prod(shape)} values)")
    return array.reshape(shape)


def _requested_outputs(value: Any, default: bool) -> dict[str, bool] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputError('"outputs" must be a list of {"name": ...} objects')
    out: dict[str, bool] = {}
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InputError(f'outputs[{i}] needs a "name" (a string)')
        params = _parameters(item, f"output {item['name']!r}")
        if params.get("classification"):
            raise InputError(f"output {item['name']!r}: the classification extension is not "
                             "supported")
        binary = params.get("binary_data", default)
        out[item["name"]] = binary is True
    return out


def encode_response(model_name: str, request: InferRequest, names: Sequence[str],
                    arrays: Sequence[np.ndarray], version: str = MODEL_VERSION
                    ) -> tuple[list[bytes | memoryview], int | None]:
    """The response body for ``arrays`` (named ``names``) of model ``model_name``'s version
    ``version``, as buffers to send one after the other (binary outputs are views of the
    arrays, not copies), and, when any output is binary, the JSON part's length (for
    ``Inference-Header-Content-Length``); else None."""
    outputs, chunks = [], []
    for name, array in zip(names, arrays, strict=True):
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype),
                                 "shape": list(array.shape)}
        if request.binary(name):
            raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
            entry["parameters"] = {"binary_data_size": raw.nbytes}
            chunks.append(raw.data.cast("B") if raw.nbytes else b"")
        else:
            entry["data"] = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))\
                .ravel()
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": version,
                           "outputs": outputs}
    if request.id is not None:
        doc["id"] = request.id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return [head, *chunks], (len(head) if chunks else None)


def error_body(exc: BaseException) -> bytes:
    """``{"error": "[code] message", "code": code}``: the v2 error object, with the GE code
    both in the text (what tritonclient shows) and on its own (what a service branches on)."""
    code = getattr(exc, "code", "") or ""
    return json.dumps({"error": str(exc), "code": code}).encode()
