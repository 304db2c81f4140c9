"""The gear file: one ONNX file holding every gear of a model, and its reader.

Two kinds, both written by :func:`gear_runtime.compiler.compile_model`:

``"case"`` (default; GE's multi-batch structure, multi_batch_clone_pass.cc, NOT runnable by
stock ONNX Runtime): the root graph has the spec inputs shaped to the LARGEST gear plus the
int32 input ``ascend_mbatch_shape_data`` ([values_per_gear]); the weights as root
initializers (once) and the gear table (int32, flattened [gear_count * values_per_gear]);
``MapIndex(ascend_mbatch_shape_data, gear_table) -> branch index`` and
``Case(branch index, inputs...) -> outputs`` in the custom domain :data:`DOMAIN`. Case carries
GE's attributes (``batch_num``, ``pred_value_<i>``, ``user_designate_shape_order``,
``dynamic_type``, ``insert_by_mbatch``), the per-gear static graphs (``branches``, each named
``Batch_<i>``, GE's batch_label), ``dynamic_output_dims`` (GE's ATTR_NAME_DYNAMIC_OUTPUT_DIMS:
``"gearIdx,outIdx,dim0,dim1,..."``) and, in hybrid mode, ``dynamic_graph`` (the original
dynamic-shape graph). Branch graphs declare their inputs (static gear shapes) and read the
weights from the root graph by name (outer scope); they have no initializers of their own.

``"sink"`` (GE's GetNext-sink mode, runnable by plain ``onnxruntime.InferenceSession``): the
root inputs keep their dynamic dims; the graph computes the dims from the inputs' shapes
(Shape -> Gather -> Concat, GE's GetDynamicDims), compares them with the gear table (the
Constant ``ascend_mbatch_gear_table``, int64 [gear_count, dynamic positions]) into a branch
index (-1 on a miss) and routes through a balanced tree of ``If`` nodes whose leaves run
``Batch_<i>`` (no declared inputs: it reads the root inputs and weights from the outer scope).
A miss gives EMPTY outputs (or, hybrid, runs the ``Dynamic`` graph). The dims, int32, are the
LAST output, named ``ascend_mbatch_shape_data``. Per-gear output dims are stored in the
metadata key :data:`META_OUTPUT_DIMS` (JSON list of the same strings).

Weights: every weight is a ROOT initializer, once. Big ones may be ONNX external data in ONE
file beside the gear file (``<gear file name>.data``, see :mod:`gear_runtime.external_data`),
resolved against the gear file's folder only and checked before anything reads them.

A case file always stores the source graph as ``dynamic_graph`` (ONNX Runtime runs every gear
on one session of it); only a hybrid file (:data:`META_HYBRID`) runs it on a miss.

Both kinds carry ``metadata_props``: :data:`META_FORMAT` (= :data:`FORMAT_VERSION`),
:data:`META_SPEC` (the spec as JSON), :data:`META_KIND`, :data:`META_HYBRID`.

:func:`read_gear_file` turns either kind into a :class:`GearFile`: per gear a STANDALONE static
ONNX model without the shared weights, the source graph likewise, and the weights once as
TensorProtos (inline, or checked references to the data file): nothing reads the weights'
bytes at load but the runtime that uses them (:meth:`GearFile.runnable`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import xxhash
from onnx import helper, numpy_helper

from gear_runtime.errors import GearFileError, GearSpecError, InputError
from gear_runtime.external_data import (
    ExternalDataError,
    ExternalSpan,
    check_external,
    is_external,
)
from gear_runtime.spec import GearSpec

# ---- names shared by the writer (gear_runtime.compiler) and the reader ------------------------
_INT64_MAX = 2**63 - 1
#: Custom operator domain of MapIndex and Case.
DOMAIN = "ge.gear_runtime"
DOMAIN_VERSION = 1
#: Version of this file layout; the reader refuses any other. 2: a case file always keeps
#: the source graph (``dynamic_graph``), and big weights may live in a data file beside it.
FORMAT_VERSION = "2"
#: Largest gear file the reader takes: protobuf cannot hold a message of 2 GiB or more (the
#: weights of a bigger model are in its data file). A bigger "gear file" is refused before a
#: byte of it is read.
MAX_GEAR_FILE_BYTES = 2**31 - 1

OP_MAP_INDEX = "MapIndex"
OP_CASE = "Case"

ATTR_BATCH_NUM = "batch_num"
ATTR_PRED_VALUE = "pred_value_"          # + gear index
ATTR_SHAPE_ORDER = "user_designate_shape_order"
ATTR_DYNAMIC_TYPE = "dynamic_type"
ATTR_INSERT_BY_MBATCH = "insert_by_mbatch"
ATTR_BRANCHES = "branches"
ATTR_DYNAMIC_OUTPUT_DIMS = "dynamic_output_dims"
ATTR_DYNAMIC_GRAPH = "dynamic_graph"

META_FORMAT = "gear_runtime.format"
META_SPEC = "gear_runtime.spec"
META_KIND = "gear_runtime.kind"
META_HYBRID = "gear_runtime.hybrid"
#: sink kind only: JSON list of the dynamic_output_dims strings (no Case node to carry them).
META_OUTPUT_DIMS = "gear_runtime.dynamic_output_dims"
#: The file's integrity record (JSON, see :func:`digest_placeholder`); required.
META_DIGEST = "gear_runtime.digest"
#: Optional: JSON list, per output, of {"axis": value index} (compiler/axes.py): which dynamic
#: value each output axis follows, so a padded run's outputs can be trimmed.
META_OUTPUT_AXES = "gear_runtime.output_dynamic_axes"

KIND_CASE = "case"
KIND_SINK = "sink"
KINDS = (KIND_CASE, KIND_SINK)

#: GE's ACL_DYNAMIC_TENSOR_NAME: the dims input (case) / last output (sink), int32.
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
#: Every name the compiler adds starts with this; models using it are refused.
RESERVED_PREFIX = "ascend_mbatch_"
GEAR_TABLE_NAME = "ascend_mbatch_gear_table"
BRANCH_INDEX_NAME = "ascend_mbatch_branch_index"
#: GE's batch_label of gear i's branch, used as the branch graph's name.
BATCH_LABEL_PREFIX = "Batch_"
#: Suffix of every node and intermediate value of gear i's branch (+ str(i)), GE's naming.
BRANCH_SUFFIX = "_ascend_mbatch_batch_"
DYNAMIC_GRAPH_NAME = "Dynamic"
DYNAMIC_SUFFIX = "_ascend_mbatch_dynamic"
#: Name prefix of the Identity nodes a sink leaf adds when a model output is directly an input
#: or a weight (a subgraph output must be produced inside the subgraph); the reader drops them.
PASSTHROUGH_PREFIX = "ascend_mbatch_passthrough_"

#: spec.mode -> Case ``dynamic_type``.
DYNAMIC_TYPES = {"batch": "batch", "image_size": "image_size", "dims": "dims"}

#: The AttributeProto type of each Case attribute (``pred_value_<i>``: INTS), as written.
CASE_ATTR_TYPES = {
    ATTR_BATCH_NUM: onnx.AttributeProto.INT,
    ATTR_SHAPE_ORDER: onnx.AttributeProto.STRINGS,
    ATTR_DYNAMIC_TYPE: onnx.AttributeProto.STRING,
    ATTR_INSERT_BY_MBATCH: onnx.AttributeProto.INT,
    ATTR_BRANCHES: onnx.AttributeProto.GRAPHS,
    ATTR_DYNAMIC_OUTPUT_DIMS: onnx.AttributeProto.STRINGS,
    ATTR_DYNAMIC_GRAPH: onnx.AttributeProto.GRAPH,
}


def batch_label(gear: int) -> str:
    """GE's batch_label of gear ``gear``: ``Batch_<gear>``."""
    return f"{BATCH_LABEL_PREFIX}{gear}"


def spec_to_json(spec: GearSpec) -> str:
    """The spec as the JSON stored under :data:`META_SPEC`."""
    return json.dumps({
        "mode": spec.mode,
        "input_names": list(spec.input_names),
        "input_shapes": [list(s) for s in spec.input_shapes],
        "gears": [list(g) for g in spec.gears],
        "hybrid": bool(spec.hybrid),
        "input_format": spec.input_format,
    }, separators=(",", ":"))


def spec_from_json(text: str) -> GearSpec:
    """Inverse of :func:`spec_to_json`; GearSpecError / ValueError / KeyError / TypeError on
    bad text. The JSON values go to GearSpec as they are: its own checks refuse what is not
    a spec (converting first would turn the string ``"ab"`` into the names ``("a", "b")``)."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError(f"a JSON object expected, got {type(d).__name__}")
    if not isinstance(d["hybrid"], bool):
        raise ValueError(f"'hybrid' must be true or false, got {d['hybrid']!r}")
    return GearSpec(mode=d["mode"], input_names=d["input_names"],
                    input_shapes=d["input_shapes"], gears=d["gears"], hybrid=d["hybrid"],
                    input_format=d.get("input_format"))


def case_gear_table(spec: GearSpec) -> np.ndarray:
    """Kind ``"case"``'s gear table (GE's MapIndex Const): the gears flattened, int32
    [gear_count * values_per_gear]."""
    return np.asarray(spec.gears, dtype=np.int32).reshape(-1)


def sink_gear_table(spec: GearSpec) -> np.ndarray:
    """Kind ``"sink"``'s gear table, compared with GetDynamicDims' output: per gear, the
    value at every dynamic position (``spec.dynamic_positions`` order), int64
    [gear_count, len(dynamic_positions)]."""
    return np.asarray([[g[v] for _, _, v in spec.dynamic_positions] for g in spec.gears],
                      dtype=np.int64)


def format_output_dims(shapes: Sequence[Sequence[Sequence[int]]]) -> list[str]:
    """``shapes[gear][output]`` -> GE's ``"gearIdx,outIdx,dim0,dim1,..."`` strings."""
    return [",".join(str(v) for v in (g, k, *shape))
            for g, outs in enumerate(shapes) for k, shape in enumerate(outs)]


def parse_output_dims(items: Sequence[str], gear_count: int,
                      output_count: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Inverse of :func:`format_output_dims`; ValueError unless every (gear, output) appears
    exactly once with non-negative dims."""
    table: dict[tuple[int, int], tuple[int, ...]] = {}
    for item in items:
        vals = [int(v) for v in item.split(",")] if item else []
        if len(vals) < 2:
            raise ValueError(f"output dims entry {item!r} has no gear and output index")
        g, k, dims = vals[0], vals[1], tuple(vals[2:])
        if not (0 <= g < gear_count and 0 <= k < output_count):
            raise ValueError(f"output dims entry {item!r}: gear or output index out of range "
                             f"({gear_count} gears, {output_count} outputs)")
        if (g, k) in table:
            raise ValueError(f"output dims entry {item!r}: gear {g} output {k} given twice")
        if any(d < 0 for d in dims):
            raise ValueError(f"output dims entry {item!r} has a negative dim")
        if math.prod(dims) > _INT64_MAX:  # sizes are int64 everywhere after this
            raise ValueError(f"output dims entry {item!r}: {math.prod(dims)} elements do not "
                             "fit in int64")
        table[(g, k)] = dims
    missing = [(g, k) for g in range(gear_count) for k in range(output_count)
               if (g, k) not in table]
    if missing:
        raise ValueError(f"output dims missing for (gear, output) {missing[:5]}")
    return tuple(tuple(table[(g, k)] for k in range(output_count)) for g in range(gear_count))


# ---- integrity -------------------------------------------------------------------------------
# xxh3_128: a fast NON-cryptographic hash (tens of GB/s in memory, so checking a 400 MB data
# file costs a small fraction of a load). It detects corruption and accidental edits (a flipped
# byte, a truncated copy, a data file from another compile), not an attacker who can rewrite
# both a file and its digest: a model file is trusted code-like input, as for ONNX Runtime.
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
    _, _, data = _parse_digest(meta[META_DIGEST]) if META_DIGEST in meta else ("", "", None)
    if data is None:
        raise ValueError(f"no {META_DIGEST!r} record to reseal")
    placeholder = digest_placeholder(graph_digest(model), data)
    for p in model.metadata_props:
        if p.key == META_DIGEST:
            p.value = placeholder
    return seal_digest(model.SerializeToString(), placeholder)


def _parse_digest(text: str) -> tuple[str, str, dict[str, DataDigest]]:
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


# ---- the reader ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GearFile:
    """Everything a backend needs from a gear file.

    Attributes:
        path: the file read.
        spec: the gears (``spec.hybrid`` tells hybrid mode).
        kind: ``"case"`` or ``"sink"``.
        input_dtypes: numpy dtype of every input, in ``spec.input_names`` order.
        output_names / output_dtypes: the model's outputs (without the sink's dims output).
        output_shapes: ``[gear][output]`` static shape.
        branches: gear ``i`` as a STANDALONE static model: inputs ``spec.input_names`` with
            exactly ``spec.shapes(i)``, outputs ``output_names``; the shared weights are NOT
            in it (see :meth:`weight_names_of`; attach them as initializers, or declare them
            and share them with ``SessionOptions.add_initializer``).
        weights: every root weight, once (not the gear table), as the file's TensorProto:
            inline, or an external reference relative to ``folder`` (checked at read time,
            see ``external``). Read values with :meth:`weight_array`.
        external: the checked span of every external weight (resolved path, offset, length).
        dynamic: the source (dynamic-shape) model, same convention (dynamic input dims):
            always in a case file; in a sink file only when hybrid; else None.
        model_bytes: kind ``"sink"``: the whole file as-is (runnable by stock ONNX Runtime);
            kind ``"case"``: None.
    """

    path: str
    spec: GearSpec
    kind: str
    input_dtypes: tuple[np.dtype, ...]
    output_names: tuple[str, ...]
    output_dtypes: tuple[np.dtype, ...]
    output_shapes: tuple[tuple[tuple[int, ...], ...], ...]
    branches: tuple[onnx.ModelProto, ...]
    weights: dict[str, onnx.TensorProto]
    external: dict[str, ExternalSpan]
    dynamic: onnx.ModelProto | None
    model_bytes: bytes | None
    #: every data file (resolved path) -> the digest compile recorded; checked by
    #: :meth:`verify_data` (the gear file itself is checked by the reader).
    data_digests: Mapping[str, DataDigest] = field(default_factory=dict)
    #: per output ``{axis: value index}`` from :data:`META_OUTPUT_AXES`; None when the file
    #: has no such record (the loader then derives it from ``output_shapes``).
    output_dynamic_axes: tuple[dict[int, int], ...] | None = None

    @property
    def folder(self) -> str:
        """The gear file's folder: where its external data is resolved, and only there."""
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def files(self) -> list[str]:
        """The files that make up this gear model: the gear file, then its data file (when
        any weight is external)."""
        return [self.path, *sorted({s.path for s in self.external.values()})]

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (inline and external)."""
        return sum(int(s.length) for s in self.external.values()) + sum(
            len(t.raw_data) if t.HasField("raw_data") else self.weight_array(n).nbytes
            for n, t in self.weights.items() if n not in self.external)

    def verify_data(self) -> None:
        """Hash every data file and compare with the digest compile recorded; GearFileError
        naming the file that changed. Reads the files in chunks (no mapping, no copy kept)."""
        for path, want in sorted(self.data_digests.items()):
            verify_data_file(path, want)

    def verify_data_in_background(self) -> Callable[[], None]:
        """Start :meth:`verify_data` in a thread (the hash releases the GIL, so it runs beside
        a runtime that loads the model meanwhile); the returned callable waits for it and
        raises what it raised."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self.verify_data()
            except BaseException as exc:  # handed to the waiting thread
                errors.append(exc)

        if not self.data_digests:
            return lambda: None
        thread = threading.Thread(target=run, name="gear-data-digest", daemon=True)
        thread.start()

        def wait() -> None:
            thread.join()
            if errors:
                raise errors[0]
        return wait

    def weight_array(self, name: str) -> np.ndarray:
        """Weight ``name``'s values (read from the data file for an external one)."""
        t = self.weights[name]
        if name not in self.external:
            return numpy_helper.to_array(t)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
        data = np.frombuffer(self.external[name].read(), dtype=dtype)
        return data.reshape(tuple(t.dims)).astype(dtype.newbyteorder("="))

    def runnable(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` (a branch, or the dynamic model) with the weights it reads as
        its own initializers, external ones still pointing to the data file: run it with the
        data file's folder as ONNX Runtime's external-data folder
        (``session.model_external_initializers_file_folder_path`` = :attr:`folder`)."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        declared = {t.name for t in out.graph.initializer}
        out.graph.initializer.extend(self.weights[n] for n in self.weight_names_of(model)
                                     if n not in declared)
        return out

    @property
    def gear_count(self) -> int:
        return self.spec.gear_count

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.spec.input_names

    @property
    def hybrid(self) -> bool:
        return self.spec.hybrid

    def output_shape(self, gear: int, index: int) -> tuple[int, ...]:
        """Static shape of output ``index`` in gear ``gear``; InputError when out of range."""
        self._check_index(gear, index)
        return self.output_shapes[gear][index]

    def output_size(self, gear: int, index: int) -> int:
        """Bytes of output ``index`` in gear ``gear`` (GE's GetGearAndRealOutSizeInfo)."""
        shape = self.output_shape(gear, index)
        return int(np.prod(shape, dtype=np.int64)) * self.output_dtypes[index].itemsize

    def weight_names_of(self, model: onnx.ModelProto) -> tuple[str, ...]:
        """The shared weights ``model`` (a branch or the dynamic model) reads, sorted."""
        return tuple(sorted(referenced_names(model.graph) & self.weights.keys()))

    def _check_index(self, gear: int, index: int) -> None:
        if not (isinstance(gear, int | np.integer) and 0 <= gear < self.gear_count):
            raise InputError(f"gear {gear!r} is out of range: the model has {self.gear_count} "
                             f"gears (0..{self.gear_count - 1})")
        if not (isinstance(index, int | np.integer) and 0 <= index < len(self.output_names)):
            raise InputError(f"output index {index!r} is out of range: the model has "
                             f"{len(self.output_names)} outputs {list(self.output_names)}")


def referenced_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name a node of ``graph`` or of its subgraphs reads, plus graph outputs."""
    names: set[str] = {o.name for o in graph.output}
    for node in graph.node:
        names.update(n for n in node.input if n)
        for sub in subgraphs(node):
            names |= referenced_names(sub)
    return names


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held by ``node``'s GRAPH / GRAPHS attributes."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def read_gear_file(path: str | os.PathLike[str]) -> GearFile:
    """Read and check a gear file written by :func:`gear_runtime.compiler.compile_model`.

    Walks the Case branches (or the If tree of a sink file) by their ``Batch_<i>`` labels and
    checks that every gear 0..G-1 appears exactly once and agrees with ``pred_value_<i>`` /
    the gear table. Any problem (missing file, not ONNX, not a gear file, another format
    version, inconsistent attributes) raises GearFileError naming the path and what is wrong.
    """
    p = os.fspath(path)
    data = _read_regular_file(p)
    try:
        model = onnx.load_from_string(data)  # external data stays a reference
    except Exception as exc:  # protobuf DecodeError and friends
        raise GearFileError(f"{p!r} is not an ONNX model: {exc}") from exc
    return _Reader(p, model, data).read()


def _read_regular_file(path: str) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most
    :data:`MAX_GEAR_FILE_BYTES` (a FIFO, a device or a huge file is refused before any read:
    /dev/zero would never end, a FIFO would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise GearFileError(f"gear file {path!r} cannot be read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise GearFileError(f"gear file {path!r} cannot be read: it is {what}")
        if st.st_size > MAX_GEAR_FILE_BYTES:
            raise GearFileError(f"gear file {path!r} is {st.st_size} bytes; a gear file is at "
                                f"most {MAX_GEAR_FILE_BYTES} bytes (its weights beyond that "
                                f"are in its data file)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_GEAR_FILE_BYTES + 1)
    except OSError as exc:
        raise GearFileError(f"gear file {path!r} cannot be read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_GEAR_FILE_BYTES:  # grew while read
        raise GearFileError(f"gear file {path!r} is larger than {MAX_GEAR_FILE_BYTES} bytes")
    return data


class _Reader:
    """One read of one file; every check raises GearFileError naming the path."""

    def __init__(self, path: str, model: onnx.ModelProto, data: bytes) -> None:
        self.path = path
        self.model = model
        self.data = data

    def fail(self, what: str) -> GearFileError:
        return GearFileError(f"{self.path!r} is not a valid gear file: {what}")

    def read(self) -> GearFile:
        meta = self._metadata()
        if META_FORMAT not in meta:
            raise GearFileError(
                f"{self.path!r} is not a gear file: it has no {META_FORMAT!r} metadata "
                f"(compile the model with gear_runtime.compile first)")
        if meta[META_FORMAT] != FORMAT_VERSION:
            raise self.fail(f"format version {meta[META_FORMAT]!r}, this reader reads "
                            f"version {FORMAT_VERSION!r}")
        recorded = self._check_digest(meta)
        bad = first_bad_text(self.model)
        if bad is not None:
            raise self.fail(f"a {bad} field is not valid UTF-8")
        try:
            spec = spec_from_json(meta.get(META_SPEC, ""))
        except (GearSpecError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise self.fail(f"metadata {META_SPEC!r} is not a valid spec ({exc})") from exc
        kind = meta.get(META_KIND)
        if kind not in KINDS:
            raise self.fail(f"metadata {META_KIND!r} is {kind!r}, expected one of {KINDS}")
        hybrid = meta.get(META_HYBRID)
        if hybrid not in ("0", "1") or (hybrid == "1") != spec.hybrid:
            raise self.fail(f"metadata {META_HYBRID!r} is {hybrid!r} but the spec says "
                            f"hybrid={spec.hybrid}")
        self.spec = spec
        self.opsets = [o for o in self.model.opset_import if o.domain != DOMAIN]
        self.weights, self.external = self._weights()
        self.data_digests = self._data_digests(recorded)
        read = self._read_case() if kind == KIND_CASE else self._read_sink(meta)
        return dataclasses.replace(read, output_dynamic_axes=self._output_axes(meta, read))

    def _output_axes(self, meta: dict[str, str], read: GearFile
                     ) -> tuple[dict[int, int], ...] | None:
        if META_OUTPUT_AXES not in meta:
            return None
        from gear_runtime.compiler.axes import axes_from_json

        try:
            return axes_from_json(json.loads(meta[META_OUTPUT_AXES]), len(read.output_names),
                                  self.spec.values_per_gear)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise self.fail(f"metadata {META_OUTPUT_AXES!r}: {exc}") from exc

    # ---- shared pieces ----------------------------------------------------------------------
    def _metadata(self) -> dict[str, str]:
        meta: dict[str, str] = {}
        for m in self.model.metadata_props:
            if type(m.key) is not str or type(m.value) is not str:  # bytes: not UTF-8
                raise self.fail(f"metadata key {m.key!r} or its value is not valid UTF-8")
            meta[m.key] = m.value
        return meta

    def _check_digest(self, meta: dict[str, str]) -> dict[str, DataDigest]:
        """Check the whole file against its :data:`META_DIGEST` (the record's own file digest
        blanked, as compile hashed it); return the data files' recorded digests.
        GearFileError naming the part that changed: the graph or the metadata."""
        text = meta.get(META_DIGEST)
        if text is None:
            raise GearFileError(f"{self.path!r} has no integrity digest ({META_DIGEST!r} "
                                "metadata): it was written by an older gear_runtime; "
                                "recompile the model")
        try:
            file_digest, graph, data = _parse_digest(text)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise self.fail(f"metadata {META_DIGEST!r} is malformed ({exc})") from None
        raw = text.encode()
        at = self.data.find(raw)
        h = xxhash.xxh3_128()
        if at >= 0:
            view = memoryview(self.data)
            h.update(view[:at])
            h.update(_digest_text(_ZERO_DIGEST, graph, data).encode())
            h.update(view[at + len(raw):])
        if at < 0 or h.hexdigest() != file_digest:
            part = ("its graph" if graph_digest(self.model) != graph
                    else "its metadata (outside the graph)")
            raise GearFileError(f"{self.path!r} is corrupt: {part} changed since compile "
                                f"({DIGEST_ALGORITHM} digest mismatch); recompile the model or "
                                "restore the file")
        return data

    def _data_digests(self, recorded: dict[str, DataDigest]) -> dict[str, DataDigest]:
        """The recorded data-file digests by resolved path. Every external weight must be in
        a recorded file, every recorded file read by a weight and of the recorded size (a
        cheap check here; the content is hashed by :meth:`GearFile.verify_data`)."""
        root = os.path.realpath(os.path.dirname(os.path.abspath(self.path)))
        out = {os.path.realpath(os.path.join(root, n)): d for n, d in recorded.items()}
        for name, span in self.external.items():
            if span.path not in out:
                raise self.fail(f"weight {name!r} is in {span.path!r}, a data file without a "
                                "recorded digest")
        read = {s.path for s in self.external.values()}
        for path, want in out.items():
            if path not in read:
                raise self.fail(f"the digest records data file {path!r}, which no weight reads")
            size = os.stat(path).st_size  # check_external stat'ed it a moment ago
            if size != want.size:
                raise GearFileError(f"data file {path!r} is corrupt: {size} bytes, compile "
                                    f"wrote {want.size}; recompile the model or restore the "
                                    "file")
        return out

    def _weights(self) -> tuple[dict[str, onnx.TensorProto], dict[str, ExternalSpan]]:
        """The root weights, and the checked span of each external one. Inline weights are
        decoded once to check them, then dropped; external ones are checked, not read."""
        folder = os.path.dirname(os.path.abspath(self.path))
        weights: dict[str, onnx.TensorProto] = {}
        external: dict[str, ExternalSpan] = {}
        for t in self.model.graph.initializer:
            if t.name.startswith(RESERVED_PREFIX):
                continue
            if is_external(t):
                try:
                    external[t.name] = check_external(t, folder)
                except ExternalDataError as exc:
                    raise self.fail(str(exc)) from None
            else:
                self._array(t, f"weight {t.name!r}")
            weights[t.name] = t
        return weights, external

    def _array(self, tensor: onnx.TensorProto, what: str) -> np.ndarray:
        try:
            return numpy_helper.to_array(tensor)
        except Exception as exc:  # bad raw_data length, unknown data type, ...
            raise self.fail(f"{what} cannot be read ({exc})") from exc

    def _root_inputs(self) -> dict[str, onnx.ValueInfoProto]:
        inputs = {vi.name: vi for vi in self.model.graph.input}
        for name in self.spec.input_names:
            if name not in inputs:
                raise self.fail(f"spec input {name!r} is not an input of the root graph")
        return inputs

    def _dtype(self, vi: onnx.ValueInfoProto) -> np.dtype:
        if not vi.type.HasField("tensor_type"):
            raise self.fail(f"{vi.name!r} is not a tensor")
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        except Exception as exc:
            raise self.fail(f"{vi.name!r} has an unsupported element type ({exc})") from exc

    def _standalone(self, graph: onnx.GraphProto, name: str,
                    inputs: Sequence[onnx.ValueInfoProto],
                    output_names: Sequence[str]) -> onnx.ModelProto:
        """A model of ``graph`` with exactly ``inputs`` declared and the passthrough Identity
        nodes of a sink leaf dropped (their outputs renamed back to the original names)."""
        g = onnx.GraphProto()
        g.CopyFrom(graph)
        g.name = name
        passthrough = [n for n in g.node if n.name.startswith(PASSTHROUGH_PREFIX)]
        for n in passthrough:
            if n.op_type != "Identity" or len(n.input) != 1 or len(n.output) != 1:
                raise self.fail(f"graph {name!r}: passthrough node {n.name!r} is not a "
                                f"one-input, one-output Identity")
        rename = {n.output[0]: n.input[0] for n in passthrough}
        keep = [n for n in g.node if not n.name.startswith(PASSTHROUGH_PREFIX)]
        del g.node[:]
        g.node.extend(keep)
        for o in g.output:
            o.name = rename.get(o.name, o.name)
        del g.input[:]
        g.input.extend(inputs)
        got = tuple(o.name for o in g.output)
        if got != tuple(output_names):
            raise self.fail(f"graph {name!r} has outputs {list(got)}, expected "
                            f"{list(output_names)}")
        m = helper.make_model(g, opset_imports=self.opsets, producer_name="gear_runtime")
        m.ir_version = self.model.ir_version
        return m

    def _gear_inputs(self, gear: int, root: dict[str, onnx.ValueInfoProto]
                     ) -> list[onnx.ValueInfoProto]:
        shapes = self.spec.shapes(gear)
        return [helper.make_tensor_value_info(n, root[n].type.tensor_type.elem_type,
                                              list(shapes[n]))
                for n in self.spec.input_names]

    def _check_branch_outputs(self, model: onnx.ModelProto,
                              shapes: tuple[tuple[int, ...], ...], gear: int) -> None:
        """A branch output that declares a fully static shape must agree with the dims table."""
        for k, o in enumerate(model.graph.output):
            tt = o.type.tensor_type
            if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
                continue
            declared = tuple(d.dim_value for d in tt.shape.dim)
            if declared != shapes[k]:
                raise self.fail(f"gear {gear} output {o.name!r}: the branch declares shape "
                                f"{declared} but dynamic_output_dims says {shapes[k]}")

    def _finish(self, kind: str, input_dtypes: tuple[np.dtype, ...], output_names: tuple[str, ...],
                output_dtypes: tuple[np.dtype, ...], dims_items: Sequence[str],
                branches: list[onnx.ModelProto], dynamic: onnx.ModelProto | None,
                model_bytes: bytes | None) -> GearFile:
        try:
            shapes = parse_output_dims(dims_items, self.spec.gear_count, len(output_names))
        except ValueError as exc:
            raise self.fail(f"dynamic_output_dims: {exc}") from exc
        for g, b in enumerate(branches):
            self._check_branch_outputs(b, shapes[g], g)
        if self.spec.hybrid and dynamic is None:
            raise self.fail("the spec is hybrid but the file has no dynamic-shape graph")
        if kind == KIND_CASE and dynamic is None:
            raise self.fail(f"the {OP_CASE} node has no {ATTR_DYNAMIC_GRAPH!r} (the source "
                            "graph every case file keeps)")
        return GearFile(path=self.path, spec=self.spec, kind=kind, input_dtypes=input_dtypes,
                        output_names=output_names, output_dtypes=output_dtypes,
                        output_shapes=shapes, branches=tuple(branches), weights=self.weights,
                        external=self.external, dynamic=dynamic, model_bytes=model_bytes,
                        data_digests=self.data_digests)

    def _by_label(self, graphs: Sequence[onnx.GraphProto]) -> list[onnx.GraphProto]:
        """Order branch graphs by their Batch_<i> labels; each gear exactly once."""
        found: dict[int, onnx.GraphProto] = {}
        for g in graphs:
            if not g.name.startswith(BATCH_LABEL_PREFIX):
                raise self.fail(f"branch graph {g.name!r} has no {BATCH_LABEL_PREFIX}<i> label")
            try:
                idx = int(g.name[len(BATCH_LABEL_PREFIX):])
            except ValueError:
                raise self.fail(f"branch graph label {g.name!r} is not "
                                f"{BATCH_LABEL_PREFIX}<integer>") from None
            if idx in found:
                raise self.fail(f"gear {idx} ({g.name}) appears twice")
            if not 0 <= idx < self.spec.gear_count:
                raise self.fail(f"branch {g.name} but the spec has {self.spec.gear_count} gears")
            found[idx] = g
        missing = [i for i in range(self.spec.gear_count) if i not in found]
        if missing:
            raise self.fail(f"no branch for gear(s) {missing}")
        return [found[i] for i in range(self.spec.gear_count)]

    # ---- kind "case" ---------------------------------------------------------------------------
    def _read_case(self) -> GearFile:
        spec = self.spec
        graph = self.model.graph
        custom = [n for n in graph.node if n.domain == DOMAIN]
        cases = [n for n in custom if n.op_type == OP_CASE]
        maps = [n for n in custom if n.op_type == OP_MAP_INDEX]
        if len(cases) != 1 or len(maps) != 1:
            raise self.fail(f"expected one {OP_MAP_INDEX} and one {OP_CASE} node in domain "
                            f"{DOMAIN!r}, found {len(maps)} and {len(cases)}")
        case, mapi = cases[0], maps[0]
        if list(mapi.input) != [ACL_DYNAMIC_TENSOR_NAME, GEAR_TABLE_NAME]:
            raise self.fail(f"{OP_MAP_INDEX} reads {list(mapi.input)}, expected "
                            f"{[ACL_DYNAMIC_TENSOR_NAME, GEAR_TABLE_NAME]}")
        if list(mapi.output) != [BRANCH_INDEX_NAME]:
            raise self.fail(f"{OP_MAP_INDEX} writes {list(mapi.output)}, expected "
                            f"{[BRANCH_INDEX_NAME]}")
        if list(case.input) != [BRANCH_INDEX_NAME, *spec.input_names]:
            raise self.fail(f"{OP_CASE} reads {list(case.input)}, expected the branch index "
                            f"then {list(spec.input_names)}")
        attrs = self._case_attrs(case)
        self._check_case_attrs(attrs)
        tables = [t for t in graph.initializer if t.name == GEAR_TABLE_NAME]
        if len(tables) != 1:
            raise self.fail(f"expected one initializer {GEAR_TABLE_NAME!r}, found {len(tables)}")
        self._check_table(self._array(tables[0], f"gear table {GEAR_TABLE_NAME!r}"),
                          case_gear_table(spec))
        root = self._root_inputs()
        if ACL_DYNAMIC_TENSOR_NAME not in root:
            raise self.fail(f"no {ACL_DYNAMIC_TENSOR_NAME!r} input")
        outs = {o.name: o for o in graph.output}
        output_names = tuple(outs)
        self._check_routing_outputs(list(case.output), output_names, root)
        branches = []
        for i, g in enumerate(self._by_label(attrs.get(ATTR_BRANCHES, []))):
            declared = [(vi.name, tuple(d.dim_value if d.HasField("dim_value") else -1
                                        for d in vi.type.tensor_type.shape.dim))
                        for vi in g.input]
            expected = list(spec.shapes(i).items())
            if declared != expected:
                raise self.fail(f"branch {g.name} declares inputs {declared}, the spec's gear "
                                f"{i} is {expected}")
            branches.append(self._standalone(g, g.name, list(g.input), output_names))
        dynamic = None
        if ATTR_DYNAMIC_GRAPH in attrs:
            dg = attrs[ATTR_DYNAMIC_GRAPH]
            dynamic = self._standalone(dg, DYNAMIC_GRAPH_NAME, list(dg.input), output_names)
        dims = [_text(s) for s in attrs.get(ATTR_DYNAMIC_OUTPUT_DIMS, [])]
        return self._finish(
            KIND_CASE, tuple(self._dtype(root[n]) for n in spec.input_names), output_names,
            tuple(self._dtype(outs[n]) for n in output_names), dims, branches, dynamic, None)

    def _check_routing_outputs(self, produced: Sequence[str], output_names: Sequence[str],
                               root: dict[str, onnx.ValueInfoProto]) -> None:
        """The routing node writes output k under its name, or, for an output that is a root
        input or weight itself (a passthrough), under ``ascend_mbatch_out_<k>``."""
        if len(produced) != len(output_names):
            raise self.fail(f"the routing node has {len(produced)} outputs, the root graph "
                            f"{len(output_names)}")
        roots = set(root) | set(self.weights)
        for k, (p, n) in enumerate(zip(produced, output_names, strict=True)):
            if p != n and not (p == f"{RESERVED_PREFIX}out_{k}" and n in roots):
                raise self.fail(f"root output {k} is {n!r} but the routing node writes {p!r}")

    def _case_attrs(self, case: onnx.NodeProto) -> dict[str, Any]:
        """Case's attributes by name, each of the type the compiler writes (so a tampered
        attribute is a GearFileError, never a TypeError further on)."""
        out: dict[str, Any] = {}
        for a in case.attribute:
            want = (onnx.AttributeProto.INTS if a.name.startswith(ATTR_PRED_VALUE)
                    else CASE_ATTR_TYPES.get(a.name))
            if want is not None and a.type != want:
                names = onnx.AttributeProto.AttributeType.Name
                raise self.fail(f"{OP_CASE} attribute {a.name!r} is of type {names(a.type)}, "
                                f"expected {names(want)}")
            out[a.name] = helper.get_attribute_value(a)
        return out

    def _check_case_attrs(self, attrs: dict[str, Any]) -> None:
        spec = self.spec
        if attrs.get(ATTR_BATCH_NUM) != spec.gear_count:
            raise self.fail(f"{ATTR_BATCH_NUM} is {attrs.get(ATTR_BATCH_NUM)!r}, the spec has "
                            f"{spec.gear_count} gears")
        for i, gear in enumerate(spec.gears):
            got = attrs.get(f"{ATTR_PRED_VALUE}{i}")
            if got is None or tuple(got) != gear:
                raise self.fail(f"{ATTR_PRED_VALUE}{i} is {got!r}, the spec's gear {i} is {gear}")
        order = tuple(_text(s) for s in attrs.get(ATTR_SHAPE_ORDER, []))
        if order != spec.input_names:
            raise self.fail(f"{ATTR_SHAPE_ORDER} is {list(order)}, the spec's inputs are "
                            f"{list(spec.input_names)}")
        dtype = _text(attrs.get(ATTR_DYNAMIC_TYPE, b""))
        if dtype != DYNAMIC_TYPES[spec.mode]:
            raise self.fail(f"{ATTR_DYNAMIC_TYPE} is {dtype!r}, the spec's mode is {spec.mode!r}")
        if len(attrs.get(ATTR_BRANCHES, [])) != spec.gear_count:
            raise self.fail(f"{len(attrs.get(ATTR_BRANCHES, []))} branches for "
                            f"{spec.gear_count} gears")

    def _check_table(self, table: np.ndarray, expected: np.ndarray) -> None:
        """The stored gear table equals the one the spec gives (shape and values)."""
        if table.shape != expected.shape or not np.array_equal(table, expected):
            raise self.fail(f"gear table {GEAR_TABLE_NAME!r} is {table.tolist()}, the spec "
                            f"gives {expected.tolist()}")

    # ---- kind "sink" ---------------------------------------------------------------------------
    def _read_sink(self, meta: dict[str, str]) -> GearFile:
        spec = self.spec
        graph = self.model.graph
        outs = list(graph.output)
        if not outs or outs[-1].name != ACL_DYNAMIC_TENSOR_NAME:
            raise self.fail(f"the last output is not {ACL_DYNAMIC_TENSOR_NAME!r}")
        self._check_table(self._sink_table(graph), sink_gear_table(spec))
        gears: list[onnx.GraphProto] = []
        dynamic_graphs: list[onnx.GraphProto] = []
        for sub in _walk_if_tree(graph):
            if sub.name.startswith(BATCH_LABEL_PREFIX):
                gears.append(sub)
            elif sub.name == DYNAMIC_GRAPH_NAME:
                dynamic_graphs.append(sub)
        root = self._root_inputs()
        output_names = tuple(o.name for o in outs[:-1])
        tops = [n for n in graph.node if n.op_type == "If"]
        if len(tops) != 1:
            raise self.fail(f"expected one routing If node in the root graph, found {len(tops)}")
        self._check_routing_outputs(list(tops[0].output), output_names, root)
        branches = [self._standalone(g, g.name, self._gear_inputs(i, root), output_names)
                    for i, g in enumerate(self._by_label(gears))]
        dynamic = None
        if dynamic_graphs:
            if len(dynamic_graphs) != 1:
                raise self.fail(f"{len(dynamic_graphs)} dynamic-shape graphs, expected one")
            dyn_inputs = [root[n] for n in spec.input_names]
            dynamic = self._standalone(dynamic_graphs[0], DYNAMIC_GRAPH_NAME, dyn_inputs,
                                       output_names)
        try:
            dims = json.loads(meta.get(META_OUTPUT_DIMS, "null"))
            if not isinstance(dims, list):
                raise ValueError("not a list")
        except (ValueError, RecursionError) as exc:
            raise self.fail(f"metadata {META_OUTPUT_DIMS!r} is not a JSON list ({exc})") from exc
        return self._finish(
            KIND_SINK, tuple(self._dtype(root[n]) for n in spec.input_names), output_names,
            tuple(self._dtype(o) for o in outs[:-1]), [str(s) for s in dims], branches,
            dynamic, self.data)

    def _sink_table(self, graph: onnx.GraphProto) -> np.ndarray:
        for node in graph.node:
            if node.op_type == "Constant" and list(node.output) == [GEAR_TABLE_NAME]:
                for a in node.attribute:
                    if a.name == "value":
                        return self._array(a.t, f"gear table {GEAR_TABLE_NAME!r}")
        raise self.fail(f"no Constant {GEAR_TABLE_NAME!r} in the root graph")


_TextPlan = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]
_TEXT_PLANS: dict[Any, _TextPlan] = {}


def _text_plan(desc: Any) -> _TextPlan:
    """A message type's (string, repeated string, message, repeated message) field names."""
    plan = _TEXT_PLANS.get(desc)
    if plan is None:
        kinds: tuple[list[str], list[str], list[str], list[str]] = ([], [], [], [])
        for f in desc.fields:
            if f.type == f.TYPE_STRING:
                kinds[1 if f.is_repeated else 0].append(f.name)
            elif f.type == f.TYPE_MESSAGE:
                kinds[3 if f.is_repeated else 2].append(f.name)
        plan = _TEXT_PLANS[desc] = tuple(tuple(k) for k in kinds)  # type: ignore[assignment]
    return plan


def first_bad_text(message: Any) -> str | None:
    """``"Type.field"`` of the first string field in ``message`` or below it that is not
    valid UTF-8, else None. ONNX's protobuf is proto2: some protobuf builds hand such a field
    back as ``bytes`` instead of refusing the file, and every name would then fail later with a
    TypeError. Bytes fields (weights' data) are never touched."""
    stack = [message]
    while stack:
        m = stack.pop()
        one, many, sub, subs = _text_plan(m.DESCRIPTOR)
        for name in one:
            if type(getattr(m, name)) is not str:
                return f"{m.DESCRIPTOR.name}.{name}"
        for name in many:
            if any(type(v) is not str for v in getattr(m, name)):
                return f"{m.DESCRIPTOR.name}.{name}"
        stack.extend(getattr(m, name) for name in sub if m.HasField(name))
        for name in subs:
            stack.extend(getattr(m, name))
    return None


def _text(value: bytes) -> str:
    """A STRING(S) attribute value as text; bytes that are not UTF-8 become U+FFFD, so they
    fail the comparison they are read for instead of raising UnicodeDecodeError."""
    return value.decode("utf-8", "replace")


def _walk_if_tree(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Every branch graph of every ``If`` node reachable through If branches (sink routing),
    without descending into the gear or dynamic graphs themselves (their own control flow is
    the model's)."""
    for node in graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        for sub in subgraphs(node):
            if sub.name.startswith(BATCH_LABEL_PREFIX) or sub.name == DYNAMIC_GRAPH_NAME:
                yield sub
            else:
                yield from _walk_if_tree(sub)
