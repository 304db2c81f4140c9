"""Weights beside the gear file: ONNX external data, written once by compile, checked at load.

ONNX's convention: a tensor whose ``data_location`` is ``EXTERNAL`` carries ``external_data``
entries ``location`` (a file name relative to the folder of the model file that holds the
tensor), ``offset`` and ``length``. A gear file keeps its big weights in ONE file beside it,
``<gear file name>.data`` (:func:`data_file_name`; a few characters escaped), every tensor
at a page-aligned offset so a runtime can map it in place. Every branch, the source graph and
the sink graph read the same root initializers, so the weights are on disk once whatever the
number of gears, and a gear file has no size limit (protobuf's 2 GiB applies to the graph only).

Writing (:class:`DataWriter`) streams: a tensor that the source model keeps in external data
is copied file to file in chunks, never parsed. Reading (:func:`check_external`) resolves a
location against the model file's folder ONLY, never the working directory, and refuses an
absolute location, one with ``..``, one that resolves (after symlinks) outside that folder, a
file that is not a regular file, and a span past the end of the file, whatever ONNX version
is installed (its own checks differ between versions).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import onnx
import xxhash
from onnx import helper, numpy_helper

#: Offsets in a data file are multiples of this (the page size: ORT maps aligned data in place).
DATA_ALIGNMENT = 4096
#: Tensors smaller than this stay inside the graph (shapes, axes, small constants: shape
#: inference needs their values and moving them out saves nothing). ONNX's own default.
EXTERNAL_MIN_BYTES = 1024
#: ``compile(..., external_data=None)`` writes a data file when the weights that would go to
#: it add up to at least this; smaller models stay one file.
AUTO_EXTERNAL_BYTES = 16 * 2**20
#: Copy chunk of the file-to-file weight copy (bounds the compiler's memory).
_CHUNK = 16 * 2**20

#: The ``external_data`` keys ONNX defines; any other key is refused.
_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})


#: Characters a data file's name (its external-data location) may not hold as they are, and
#: their escapes: ``:`` reads as a drive (``C:x``) and ``\\`` as a folder on Windows, and
#: onnx.checker refuses any location containing ``..``; ``%`` is escaped so that the escape
#: is reversible (two gear file names never share a data file name).
_NAME_ESCAPES = {"%": "%25", ":": "%3A", "\\": "%5C"}


def data_file_name(gear_file: str) -> str:
    """Name (no folder) of the data file of ``gear_file``: its file name + ``.data``,
    escaped (:func:`escape_file_name`: ``a..b.onnx`` -> ``a.%2Eb.onnx.data``), so that any
    name a user gives the gear file yields a location that every reader (this one, ONNX
    Runtime, onnx.checker) takes as a plain file name in the gear file's folder."""
    return escape_file_name(os.path.basename(gear_file) + ".data")


def escape_file_name(name: str) -> str:
    """``name`` with ``%``, ``:``, ``\\`` and the second dot of every ``..`` percent-escaped
    (reversibly: two names never escape alike)."""
    out = "".join(_NAME_ESCAPES.get(c, c) for c in name)
    while ".." in out:
        out = out.replace("..", ".%2E")
    return out


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def tensor_nbytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of ``tensor``'s data from its dims and type; None for types without a fixed
    size (strings) or unknown types, and for negative dims."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    count = 1
    for d in tensor.dims:
        if d < 0:
            return None
        count *= int(d)
    return count * itemsize


@dataclass(frozen=True)
class ExternalSpan:
    """Where an external tensor's bytes are: a resolved file path, offset and length."""

    path: str
    offset: int
    length: int

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.length)
        if len(data) != self.length:
            raise OSError(f"{self.path}: {len(data)} bytes at offset {self.offset}, "
                          f"expected {self.length}")
        return data


class ExternalDataError(ValueError):
    """An external-data entry that must not be followed; the caller maps it to its own
    error type (GearFileError at load, CompileError at compile) with the file's name."""


def external_entries(tensor: onnx.TensorProto) -> dict[str, str]:
    """``tensor``'s external_data as a dict; ExternalDataError on a key ONNX does not define
    or one given twice."""
    out: dict[str, str] = {}
    for e in tensor.external_data:
        if e.key not in _KEYS or e.key in out:
            raise ExternalDataError(f"tensor {tensor.name!r}: external_data key {e.key!r} is "
                                    "unknown or given twice")
        out[e.key] = e.value
    return out


def check_external(tensor: onnx.TensorProto, folder: str) -> ExternalSpan:
    """Resolve and check ``tensor``'s external data against ``folder`` (the folder of the
    model file that declares it). Raises ExternalDataError naming the tensor and the
    location for anything that must not be read (see the module docstring), or a span
    whose length is not the tensor's size."""
    entries = external_entries(tensor)
    location = entries.get("location", "")
    where = f"tensor {tensor.name!r}: external data location {location!r}"
    if not location or "\0" in location:
        raise ExternalDataError(f"{where} is empty or not a file name")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise ExternalDataError(f"{where} is absolute; it must be relative to the model's "
                                "folder")
    if ".." in location.replace("\\", "/").split("/"):
        raise ExternalDataError(f"{where} contains '..'; it must stay inside the model's "
                                "folder")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        raise ExternalDataError(f"{where} resolves to {path!r}, outside the model's folder "
                                f"{root!r}")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ExternalDataError(f"{where} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ExternalDataError(f"{where} is not a regular file")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else st.st_size - offset
    except ValueError:
        raise ExternalDataError(f"{where}: offset {entries.get('offset')!r} / length "
                                f"{entries.get('length')!r} are not integers") from None
    expected = tensor_nbytes(tensor)
    if offset < 0 or length < 0 or offset + length > st.st_size:
        raise ExternalDataError(f"{where}: bytes {offset}..{offset + length} are past the end "
                                f"of the file ({st.st_size} bytes)")
    if expected is None or length != expected:
        raise ExternalDataError(f"{where}: {length} bytes, the tensor's dims and type need "
                                f"{expected}")
    return ExternalSpan(path, offset, length)


def set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Turn ``tensor`` into a reference to ``location`` (its data fields cleared)."""
    for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                 "uint64_data", "string_data", "external_data"):
        tensor.ClearField(name)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


class DataWriter:
    """Appends tensors to one data file, each at a :data:`DATA_ALIGNMENT` offset.

    ``location`` is the name the tensors will point to (the final file name, relative to the
    gear file's folder); the bytes go to ``stream`` (a temporary file renamed in place by the
    caller once everything is written). :meth:`digest` is the xxh3_128 of everything written
    (the gear file records it; hashed on the way, so compile never reads the file back).
    """

    def __init__(self, stream: BinaryIO, location: str) -> None:
        self.stream = stream
        self.location = location
        self.bytes = 0
        self._hash = xxhash.xxh3_128()

    def digest(self) -> str:
        """xxh3_128 (hex) of the bytes written so far."""
        return self._hash.hexdigest()

    def _write(self, data: bytes) -> None:
        self.stream.write(data)
        self._hash.update(data)

    def move(self, tensor: onnx.TensorProto, source: Callable[[onnx.TensorProto], ExternalSpan]
             ) -> None:
        """Write ``tensor``'s bytes and make it point here. An inline tensor's bytes come from
        the proto; an external one's are copied from ``source(tensor)`` in chunks."""
        pad = -self.bytes % DATA_ALIGNMENT
        if pad:
            self._write(b"\0" * pad)
            self.bytes += pad
        offset = self.bytes
        if is_external(tensor):
            length = self._copy(source(tensor))
        else:
            data = (tensor.raw_data if tensor.HasField("raw_data")
                    else numpy_helper.to_array(tensor).astype(
                        np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
                        .newbyteorder("<")).tobytes())
            self._write(data)
            length = len(data)
        self.bytes += length
        set_external(tensor, self.location, offset, length)

    def _copy(self, span: ExternalSpan) -> int:
        with open(span.path, "rb") as f:
            f.seek(span.offset)
            left = span.length
            while left:
                chunk = f.read(min(left, _CHUNK))
                if not chunk:
                    raise OSError(f"{span.path} ends before offset {span.offset + span.length}")
                self._write(chunk)
                left -= len(chunk)
        return span.length


def relocate(tensor: onnx.TensorProto, location: str) -> None:
    """Point an external ``tensor`` at ``location`` (same offset and length)."""
    for e in tensor.external_data:
        if e.key == "location":
            e.value = location


def read_inline(tensor: onnx.TensorProto, span: ExternalSpan) -> None:
    """Make an external ``tensor`` inline with the bytes at ``span`` (OSError on a short
    read)."""
    data = span.read()
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = data


def movable(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` belongs in a data file: fixed-size type, at least
    :data:`EXTERNAL_MIN_BYTES`."""
    n = tensor_nbytes(tensor)
    return n is not None and n >= EXTERNAL_MIN_BYTES


__all__ = ["AUTO_EXTERNAL_BYTES", "DATA_ALIGNMENT", "DataWriter", "EXTERNAL_MIN_BYTES",
           "ExternalDataError", "ExternalSpan", "check_external", "data_file_name",
           "escape_file_name",
           "external_entries", "is_external", "movable", "read_inline", "relocate",
           "set_external", "tensor_nbytes"]
