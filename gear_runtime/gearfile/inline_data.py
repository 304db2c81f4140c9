"""A plain ONNX model's inline weights, found in place: spans of the model file itself.

A static model saved as one file (``onnx.save(model, path)``) holds its weights in the graph,
as each initializer's ``raw_data``. Parsing that file whole puts every weight in the loader's
memory (protobuf's arena) beside the copy ONNX Runtime makes from the same bytes; the arena's
blocks stay in the process's heap after they are freed, and any TensorProto kept (a reader's
weight table) keeps the whole arena alive. So the reader does not parse those bytes:
:func:`split_inline` walks the protobuf wire format (``ModelProto.graph`` ->
``GraphProto.initializer`` -> ``TensorProto.raw_data``) and returns the model WITHOUT the
``raw_data`` of its large initializers, and where each one's bytes lie in the file. The reader
then declares them external data located in the model file itself, and from there on they are
what a data file's weights are: checked spans, read by ONNX Runtime by path while the file is
hashed (:func:`gear_runtime.gearfile.digest.checked_load`), read by gear_runtime only where it
needs values (shared weights, a guard's constants).

Only the plain layout is walked. A file where protobuf would merge fields (the graph given
twice), a group (a wire type proto3 and ONNX never write), or a field running past its
message gives None: the caller then parses the file whole, as before. A tensor whose raw_data
is given twice, or that also says it is external, is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx

_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_LOCATION = onnx.TensorProto.DESCRIPTOR.fields_by_name["data_location"].number
_EXTERNAL_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["external_data"].number
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
#: protobuf's longest varint (a 64-bit value)
_MAX_VARINT_BYTES = 10


@dataclass(frozen=True)
class InlineSpan:
    """Where initializer ``index`` (its position in ``graph.initializer``) has its bytes in
    the file: ``length`` bytes from ``offset``."""

    index: int
    offset: int
    length: int


@dataclass(frozen=True)
class Split:
    """The model without the split initializers' raw_data (``model``: serialized) and where
    their bytes are (``spans``, in initializer order)."""

    model: bytes
    spans: tuple[InlineSpan, ...]


class _Unwalkable(Exception):
    """Not the plain layout :func:`split_inline` walks."""


def split_inline(blob: bytes | memoryview, min_bytes: int) -> Split | None:
    """``blob`` (a serialized ModelProto) with the ``raw_data`` of every graph initializer of
    at least ``min_bytes`` left out, and where those bytes are; None when there is none, or
    the layout is not the plain one (see the module doc): parse ``blob`` whole then. The
    bytes are never copied: only the fields around them are."""
    view = memoryview(blob)
    try:
        model, spans = _split_model(view, min_bytes)
    except _Unwalkable:
        return None
    return Split(model, tuple(spans)) if spans else None


def _split_model(view: memoryview, min_bytes: int) -> tuple[bytes, list[InlineSpan]]:
    out: list[bytes | memoryview] = []
    spans: list[InlineSpan] = []
    graphs = 0
    for number, wire, start, value, end in _fields(view, 0, len(view)):
        if number != _GRAPH:
            out.append(view[start:end])
            continue
        graphs += 1
        if wire != _BYTES or graphs > 1:  # a second graph field merges into the first
            raise _Unwalkable
        graph, spans = _split_graph(view, value, end, min_bytes)
        out.append(_message(number, graph))
    return b"".join(out), spans


def _split_graph(view: memoryview, begin: int, stop: int, min_bytes: int
                 ) -> tuple[bytes, list[InlineSpan]]:
    out: list[bytes | memoryview] = []
    spans: list[InlineSpan] = []
    index = 0
    for number, wire, start, value, end in _fields(view, begin, stop):
        if number != _INITIALIZER:
            out.append(view[start:end])
            continue
        if wire != _BYTES:
            raise _Unwalkable
        found = _raw_data(view, value, end, min_bytes)
        if found is None:
            out.append(view[start:end])
        else:
            at, length, rest = found
            spans.append(InlineSpan(index, at, length))
            out.append(_message(number, rest))
        index += 1
    return b"".join(out), spans


def _raw_data(view: memoryview, begin: int, stop: int, min_bytes: int
              ) -> tuple[int, int, bytes] | None:
    """(offset, length, the tensor without it) of the tensor's one raw_data field when it has
    at least ``min_bytes`` and the tensor does not also say it is external; else None."""
    fields = list(_fields(view, begin, stop))
    raw = [f for f in fields if f[0] == _RAW_DATA and f[1] == _BYTES]
    if len(raw) != 1 or raw[0][4] - raw[0][3] < min_bytes:
        return None
    for number, wire, _, value, _end in fields:
        external = number == _EXTERNAL_DATA or (
            number == _LOCATION and (wire != _VARINT or _varint(view, value, stop)[0] != 0))
        if external:
            return None
    rest = b"".join(view[f[2]:f[4]] for f in fields if f is not raw[0])
    return raw[0][3], raw[0][4] - raw[0][3], rest


def _fields(view: memoryview, begin: int, stop: int
            ) -> Iterator[tuple[int, int, int, int, int]]:
    """Each field of the message in ``view[begin:stop]``: (number, wire type, where the field
    starts, where its value starts -- a length-delimited one's payload --, where it ends)."""
    pos = begin
    while pos < stop:
        tag, value = _varint(view, pos, stop)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            end = _varint(view, value, stop)[1]
        elif wire == _FIXED64:
            end = value + 8
        elif wire == _FIXED32:
            end = value + 4
        elif wire == _BYTES:
            length, value = _varint(view, value, stop)
            end = value + length
        else:  # groups (3, 4) and invalid wire types
            raise _Unwalkable
        if number == 0 or end > stop:
            raise _Unwalkable
        yield number, wire, pos, value, end
        pos = end


def _varint(view: memoryview, pos: int, stop: int) -> tuple[int, int]:
    """(the varint at ``pos``, where it ends); _Unwalkable when it runs past ``stop``."""
    value = 0
    for k in range(_MAX_VARINT_BYTES):
        if pos + k >= stop:
            break
        byte = view[pos + k]
        value |= (byte & 0x7F) << (7 * k)
        if byte < 0x80:
            return value, pos + k + 1
    raise _Unwalkable


def _message(number: int, payload: bytes) -> bytes:
    """Length-delimited field ``number`` holding ``payload``, encoded."""
    return _encode_varint(number << 3 | _BYTES) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


__all__ = ["InlineSpan", "Split", "split_inline"]
