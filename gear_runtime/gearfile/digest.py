"""The gear file's integrity record (:data:`gear_runtime.gearfile.format.META_DIGEST`): sealed by
the writer, checked by the reader, and the data files' digests -- with the one orchestration
that checks the data files while a runtime loads them (:func:`checked_load`).

xxh3_128: a fast NON-cryptographic hash (fast enough in memory that checking a data file costs
a small fraction of its load: docs/benchmarks.md). It detects corruption and accidental edits
(a flipped byte, a truncated copy, a data file from another compile), not an attacker who
can rewrite both a file and its digest: a model file is trusted code-like input, as for ONNX
Runtime.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

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

T = TypeVar("T")


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
    """(xxh3_128 hex, size) of the regular file ``path`` as it is when opened (bytes appended
    meanwhile are not read). OSError when it cannot be read or is not a regular file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        return _hash_fd(fd, st.st_size)
    finally:
        os.close(fd)


def _hash_fd(fd: int, limit: int) -> tuple[str, int]:
    """(xxh3_128 hex, bytes read) of the open file ``fd`` from offset 0, reading at most
    ``limit`` bytes (a file that grows meanwhile cannot keep the hash going), by positional
    reads into one reusable buffer (the descriptor's own offset is not used)."""
    h = xxhash.xxh3_128()
    buf = bytearray(_HASH_CHUNK)
    view = memoryview(buf)
    size = 0
    while size < limit:
        want = min(_HASH_CHUNK, limit - size)
        if _preadv is not None:
            n = _preadv(fd, [view[:want]], size)
            chunk = view[:n]
        else:  # no preadv on this platform: pread allocates each chunk
            chunk = memoryview(os.pread(fd, want, size))
            n = len(chunk)
        if not n:
            break
        h.update(chunk)
        size += n
    return h.hexdigest(), size


_preadv = getattr(os, "preadv", None)


def _compare(path: str, want: DataDigest, digest: str, size: int) -> None:
    """GearFileError naming ``path`` unless (``digest``, ``size``) is what compile recorded."""
    if size != want.size:
        raise GearFileError(f"data file {path!r} is corrupt: {size} bytes, compile wrote "
                            f"{want.size}; recompile the model or restore the file")
    if digest != want.digest:
        raise GearFileError(f"data file {path!r} is corrupt: its content changed since compile "
                            f"({DIGEST_ALGORITHM} digest mismatch); recompile the model or "
                            "restore the file")


#: Linux's CLOCK_REALTIME_COARSE (Python names no constant for it): the clock the kernel
#: takes file times from, at its tick (1-10 ms).
_CLOCK_REALTIME_COARSE = 5
#: Retries (and the pause between them) while a just-changed data file settles: one tick.
_SETTLE_TRIES = 5
_SETTLE_PAUSE_S = 0.002
#: A change time that is a whole number of microseconds is taken to come from a file system
#: with coarse timestamps (whole seconds: FAT, some network file systems), whose granule
#: may hide a second change within it.
_COARSE_GRANULE_NS = 2 * 10**9


def _clock_ns() -> int:
    """A time no later than what the kernel would stamp a file change with right now."""
    if sys.platform.startswith("linux"):
        return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
    return time.time_ns() - 10**7  # elsewhere: the wall clock, less a margin for its tick


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What any change to a file alters: which file it is, its size, its modification time
    and its change time (a write, a truncation, a rename, a link, an unlink or a chmod all set
    the change time, and nobody can set it back)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class HeldDataFile:
    """One data file, opened ONCE for a load, so that what a runtime reads BY PATH (ONNX
    Runtime opens the data file itself) can be proven to be what was hashed.

    Opening records the file's identity (:func:`_identity`) once its change time is older
    than the clock's current tick ("settled"): every later change then stamps a different
    change time. :meth:`verify` hashes the held file through its descriptor (a concurrent
    rename cannot swap what it reads); :meth:`check_unchanged`, after the runtime has read
    the file, requires the held file to be unchanged and the path to still name it. A file
    that did not settle (changed again within one tick of the open, or on a file system with
    coarse timestamps) is hashed a second time at the end.

    Not covered: a process that already holds a writable shared mapping of the file (its
    writes may not stamp times), a file system whose times do not follow these rules
    (some network file systems cache them), and anything after the load (ONNX Runtime maps
    the data file and reads some weights from it later).
    """

    def __init__(self, path: str, want: DataDigest) -> None:
        self.path = path
        self.want = want
        try:
            self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise GearFileError(f"data file {path!r} cannot be read: "
                                f"{exc.strerror or exc}") from None
        try:
            self.stat, self.settled = self._settle()
            if not stat.S_ISREG(self.stat.st_mode):
                raise GearFileError(f"data file {path!r} is not a regular file")
        except BaseException:
            self.close()
            raise

    def _settle(self) -> tuple[os.stat_result, bool]:
        for _ in range(_SETTLE_TRIES):
            now = _clock_ns()  # read BEFORE the stat: a change after the stat is stamped >= now
            st = os.fstat(self.fd)
            coarse = st.st_ctime_ns % 1000 == 0
            if st.st_ctime_ns + (_COARSE_GRANULE_NS if coarse else 0) < now:
                return st, True
            if coarse:
                break  # waiting a tick would not help; the end check hashes again
            time.sleep(_SETTLE_PAUSE_S)
        return st, False

    def verify(self) -> None:
        """Hash the held file; GearFileError naming it unless it is what compile recorded."""
        try:
            digest, size = _hash_fd(self.fd, self.want.size + 1)
            if size > self.want.size:
                size = os.fstat(self.fd).st_size
        except OSError as exc:
            raise GearFileError(f"data file {self.path!r} cannot be read: "
                                f"{exc.strerror or exc}") from None
        _compare(self.path, self.want, digest, size)

    def check_unchanged(self, rehash: bool = True) -> None:
        """GearFileError unless, since the open, the held file is unchanged and the path still
        names it (so whatever opened the path meanwhile read the bytes :meth:`verify`
        hashed); a file that did not settle is hashed again (unless not ``rehash``)."""
        try:
            now = os.stat(self.path)
        except OSError:
            now = None
        held = os.fstat(self.fd)
        if (_identity(held) != _identity(self.stat) or now is None
                or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)):
            raise GearFileError(
                f"data file {self.path!r} changed while the model was loading (replaced, "
                "moved, linked or written meanwhile): nothing read from it is used; load "
                "the model again once the file is in place")
        if rehash and not self.settled:
            self.verify()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


# ---- checking the data files while a runtime loads them --------------------------------------
def checked_load(data_digests: Mapping[str, DataDigest], build: Callable[[], T]) -> T:
    """Run ``build`` -- a runtime reading data files BY PATH (``data_digests``: resolved path
    -> what compile recorded), as ONNX Runtime does when it creates a session -- and return
    what it returned only when what it could have read is what compile recorded.

    Every data file is opened once before ``build`` starts and hashed through that
    descriptor in a thread while ``build`` runs (the hash releases the GIL); afterwards each
    must be unchanged and still be the file its path names (:class:`HeldDataFile`). So a data
    file replaced, moved, linked, truncated or written during the load ends in a
    GearFileError, never in other weights. When ``build`` fails, a corrupt or changed data
    file is the error raised (the cause, not the runtime's symptom); else ``build``'s own
    error."""
    held: list[HeldDataFile] = []
    try:
        for path, want in sorted(data_digests.items()):
            held.append(HeldDataFile(path, want))
        wait = _in_thread([h.verify for h in held])
        try:
            result = build()
        except BaseException:
            _verdict(held, wait)
            raise
        _verdict(held, wait)
        return result
    finally:
        for h in held:
            h.close()


def _verdict(held: Sequence[HeldDataFile], wait: Callable[[], None]) -> None:
    """The held data files' verdict once a runtime has read them: a file that changed while
    loading says so (a hash that failed because the file changed under it would only say
    "corrupt"); else the hash's mismatch, if any; else each file's end check."""
    try:
        wait()
    except GearFileError:
        for h in held:
            h.check_unchanged(rehash=False)
        raise
    for h in held:
        h.check_unchanged()


def _in_thread(calls: Sequence[Callable[[], None]]) -> Callable[[], None]:
    """Start ``calls`` one after the other in a thread; the returned callable waits for them
    and raises the first error one raised (nothing to do: no thread)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for call in calls:
                call()
        except BaseException as exc:  # handed to the waiting thread
            errors.append(exc)

    if not calls:
        return lambda: None
    thread = threading.Thread(target=run, name="gear-data-digest", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if errors:
            raise errors[0]
    return wait
