"""The gear file's integrity record (:data:`gear_runtime.gearfile.format.META_DIGEST`): sealed by
the writer, checked by the reader, and the data files' digests.

xxh3_128: a fast NON-cryptographic hash (tens of GB/s in memory, so checking a 400 MB data
file costs a small fraction of a load). It detects corruption and accidental edits (a flipped
byte, a truncated copy, a data file from another compile), not an attacker who can rewrite
both a file and its digest: a model file is trusted code-like input, as for ONNX Runtime.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

import onnx
import xxhash

from gear_runtime.errors import GearFileError
from gear_runtime.gearfile.format import META_DIGEST

DIGEST_ALGORITHM = "xxh3_128"
_ZERO_DIGEST = "0" * 32
#: Chunk of the data-file hash: read into one reusable buffer (never the whole file mapped:
#: file-backed pages would count in the process's RSS during the load). xxhash releases the
#: GIL on buffers above 64 KiB, so a hash thread runs beside ONNX Runtime's session build.
_HASH_CHUNK = 4 * 2**20


@dataclass(frozen=True)
class DataDigest:
    """The recorded digest (hex) and size of one data file."""

    digest: str
    size: int


def digest_placeholder(graph_digest: str, data: Mapping[str, DataDigest]) -> str:
    """The :data:`META_DIGEST` text compile writes before sealing: the whole file's digest
    zeroed. ``data``: data file name (relative to the gear file's folder) -> digest.

    The sealed text is the same with ``"file"`` set to the xxh3_128 of the serialized file as
    written with this placeholder; ``"graph"`` (the xxh3_128 of the serialized graph) only
    tells, on a mismatch, whether the graph or the rest (metadata) changed."""
    return _digest_text(_ZERO_DIGEST, graph_digest, data)


def _digest_text(file_digest: str, graph_digest: str, data: Mapping[str, DataDigest]) -> str:
    return json.dumps({"algorithm": DIGEST_ALGORITHM, "file": file_digest, "graph": graph_digest,
                       "data": {n: {"digest": d.digest, "size": d.size}
                                for n, d in sorted(data.items())}}, separators=(",", ":"))


def graph_digest(model: onnx.ModelProto) -> str:
    """xxh3_128 (hex) of ``model``'s serialized graph."""
    return xxhash.xxh3_128_hexdigest(model.graph.SerializeToString())


def seal_digest(blob: bytes, placeholder: str) -> bytes:
    """``blob`` (a serialized gear file holding ``placeholder`` as its :data:`META_DIGEST`
    value, exactly once) with the file digest filled in; same length, so the reader can blank
    it again. ValueError when the placeholder is not found exactly once."""
    raw = placeholder.encode()
    at = blob.find(raw)
    if at < 0 or blob.find(raw, at + 1) >= 0:
        raise ValueError("the digest placeholder is not in the serialized file exactly once")
    d = json.loads(placeholder)
    d["file"] = xxhash.xxh3_128_hexdigest(blob)
    sealed = _digest_text(d["file"], d["graph"], {
        n: DataDigest(v["digest"], v["size"]) for n, v in d["data"].items()}).encode()
    return blob[:at] + sealed + blob[at + len(raw):]


def reseal(model: onnx.ModelProto) -> bytes:
    """``model`` (a gear file, edited on purpose) serialized with its :data:`META_DIGEST`
    recomputed for its current graph and metadata; the recorded data-file digests are kept.
    ValueError when it has no valid record."""
    meta = {p.key: p.value for p in model.metadata_props}
    _, _, data = parse_digest(meta[META_DIGEST]) if META_DIGEST in meta else ("", "", None)
    if data is None:
        raise ValueError(f"no {META_DIGEST!r} record to reseal")
    placeholder = digest_placeholder(graph_digest(model), data)
    for p in model.metadata_props:
        if p.key == META_DIGEST:
            p.value = placeholder
    return seal_digest(model.SerializeToString(), placeholder)


def parse_digest(text: str) -> tuple[str, str, dict[str, DataDigest]]:
    """(file digest, graph digest, data digests) of a :data:`META_DIGEST` text; ValueError
    unless it is exactly what compile writes (so blanking it gives the placeholder back)."""
    d = json.loads(text)
    if not isinstance(d, dict) or set(d) != {"algorithm", "file", "graph", "data"}:
        raise ValueError("not the digest record compile writes")
    if d["algorithm"] != DIGEST_ALGORITHM:
        raise ValueError(f"algorithm {d['algorithm']!r}, this reader checks {DIGEST_ALGORITHM}")
    if not isinstance(d["data"], dict):
        raise ValueError("'data' is not an object")
    data = {}
    for name, v in d["data"].items():
        if not (isinstance(v, dict) and set(v) == {"digest", "size"}
                and type(v["size"]) is int and 0 <= v["size"] <= 2**63 - 1):
            raise ValueError(f"data file entry {name!r} is not a digest and a size")
        if os.path.basename(name) != name or name in ("", ".", "..") or "\0" in name:
            raise ValueError(f"data file name {name!r} is not a file name")
        data[name] = DataDigest(v["digest"], v["size"])
    if _digest_text(d["file"], d["graph"], data) != text:
        raise ValueError("not in the form compile writes")
    if not all(isinstance(h, str) and len(h) == 32
               for h in (d["file"], d["graph"], *(x.digest for x in data.values()))):
        raise ValueError("a digest is not 32 hex digits")
    return d["file"], d["graph"], data


def hash_file(path: str) -> tuple[str, int]:
    """(xxh3_128 hex, size) of the regular file ``path``, read in chunks into one buffer.
    OSError when it cannot be read or is not a regular file."""
    h = xxhash.xxh3_128()
    buf = bytearray(_HASH_CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        while n := f.readinto(view):
            h.update(view[:n])
            size += n
    return h.hexdigest(), size


def verify_data_file(path: str, want: DataDigest) -> None:
    """Hash ``path`` and compare with ``want``; GearFileError naming the file on a mismatch
    or when it cannot be read."""
    try:
        digest, size = hash_file(path)
    except OSError as exc:
        raise GearFileError(f"data file {path!r} cannot be read: {exc.strerror or exc}") from None
    if size != want.size:
        raise GearFileError(f"data file {path!r} is corrupt: {size} bytes, compile wrote "
                            f"{want.size}; recompile the model or restore the file")
    if digest != want.digest:
        raise GearFileError(f"data file {path!r} is corrupt: its content changed since compile "
                            f"({DIGEST_ALGORITHM} digest mismatch); recompile the model or "
                            "restore the file")


def check_file(path: str, blob: bytes, model: onnx.ModelProto,
               text: str | None) -> dict[str, DataDigest]:
    """Check ``blob`` (the gear file ``path`` as read; ``model`` parsed from it) against its
    :data:`META_DIGEST` record ``text`` (the record's own file digest blanked, as compile
    hashed it); return the data files' recorded digests (by name). GearFileError when the
    record is missing or malformed, or naming the part that changed: the graph or the
    metadata."""
    if text is None:
        raise GearFileError(f"{path!r} has no integrity digest ({META_DIGEST!r} metadata): it "
                            "was written by an older gear_runtime; recompile the model")
    try:
        file_digest, graph, data = parse_digest(text)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise GearFileError(f"{path!r} is not a valid gear file: metadata {META_DIGEST!r} is "
                            f"malformed ({exc})") from None
    raw = text.encode()
    at = blob.find(raw)
    h = xxhash.xxh3_128()
    if at >= 0:
        view = memoryview(blob)
        h.update(view[:at])
        h.update(_digest_text(_ZERO_DIGEST, graph, data).encode())
        h.update(view[at + len(raw):])
    if at < 0 or h.hexdigest() != file_digest:
        part = ("its graph" if graph_digest(model) != graph
                else "its metadata (outside the graph)")
        raise GearFileError(f"{path!r} is corrupt: {part} changed since compile "
                            f"({DIGEST_ALGORITHM} digest mismatch); recompile the model or "
                            "restore the file")
    return data
