"""The gear file reader: :func:`read_gear_file` turns a gear file of either kind into a
:class:`GearFile`.

The format (names, codecs, the two kinds) is :mod:`gear_runtime.gearfile.format`; the
integrity record :mod:`gear_runtime.gearfile.digest`; external data
:mod:`gear_runtime.gearfile.external_data`.

Per gear the reader gives a STANDALONE static ONNX model without the shared weights, the source
graph likewise, and the weights once as TensorProtos (inline, or checked references to the
data file): nothing reads the weights' bytes at load but the runtime that uses them
(:meth:`GearFile.runnable`). Every check raises GearFileError naming the path and what is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import onnx
import xxhash
from onnx import helper, numpy_helper

from gear_runtime.errors import GearFileError, GearSpecError
from gear_runtime.files import FileTooLargeError, read_regular_file, reason
from gear_runtime.gearfile import format as fmt
from gear_runtime.gearfile import passthrough
from gear_runtime.gearfile.digest import DataDigest, check_file, checked_load
from gear_runtime.gearfile.external_data import (
    EXTERNAL_MIN_BYTES,
    ExternalDataError,
    ExternalSpan,
    check_external,
    is_external,
    relocate,
    set_external,
    tensor_nbytes,
)
from gear_runtime.gearfile.info import ModelInfo, check_output_axes
from gear_runtime.gearfile.inline_data import Split, split_inline
from gear_runtime.gearfile.onnx_graph import first_bad_text, referenced_names, subgraphs
from gear_runtime.gearfile.padding import META_PADDING, PaddingVerdict, verdict_from_json
from gear_runtime.spec import GearSpec

T = TypeVar("T")

__all__ = ["GearFile", "read_gear_file"]

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
    #: builds ``branches`` on first use (each branch checked then: text, declared outputs)
    branch_builder: Callable[[], tuple[onnx.ModelProto, ...]] = field(repr=False,
                                                                      compare=False)
    weights: dict[str, onnx.TensorProto]
    external: dict[str, ExternalSpan]
    dynamic: onnx.ModelProto | None
    model_bytes: bytes | None
    #: the gear file's folder with every symlink resolved when the file was read: where a
    #: runtime resolves the external data (a symlink flipped later cannot redirect it).
    data_folder: str
    #: every data file (resolved path) -> the digest compile recorded; checked by
    #: :meth:`verify_data` (the gear file itself is checked by the reader).
    data_digests: Mapping[str, DataDigest] = field(default_factory=dict)
    #: per output ``{axis: value index}`` from :data:`fmt.META_OUTPUT_AXES`; None when the file
    #: has no such record (the loader then derives it from ``output_shapes``).
    output_dynamic_axes: tuple[dict[int, int], ...] | None = None
    #: the padding verdict check-padding recorded (:mod:`.padding`); None: none recorded
    padding: PaddingVerdict | None = None

    @functools.cached_property
    def branches(self) -> tuple[onnx.ModelProto, ...]:
        """Gear ``i`` as a STANDALONE static model (see the class docstring); built and
        checked on first use, GearFileError for a branch that does not hold up."""
        return self.branch_builder()

    @property
    def folder(self) -> str:
        """The gear file's folder: where its external data is resolved, and only there."""
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def files(self) -> list[str]:
        """The files that make up this gear model: the gear file, then its data file (when
        any weight is external)."""
        return [self.path, *self.data_files]

    @property
    def data_files(self) -> list[str]:
        """The data files (resolved paths) external weights are in, sorted; not the model file
        itself, where a static model's inline weights are (:mod:`.inline_data`)."""
        own = os.path.realpath(self.path)
        return sorted({s.path for s in self.external.values()} - {own})

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (inline and external)."""
        return sum(int(s.length) for s in self.external.values()) + sum(
            len(t.raw_data) if t.HasField("raw_data") else self.weight_array(n).nbytes
            for n, t in self.weights.items() if n not in self.external)

    def verify_data(self) -> None:
        """Hash every data file and compare with the digest compile recorded; GearFileError
        naming the file that changed. Reads the files in chunks (no mapping, no copy kept)."""
        self.checked_load(lambda: None)

    def checked_load(self, build: Callable[[], T]) -> T:
        """Run ``build`` -- a runtime reading this file's data files BY PATH, as ONNX Runtime
        does when it creates a session -- and return what it returned only when what it could
        have read is what compile recorded.

        The orchestration (every data file held open and hashed in a thread while ``build``
        runs, then the verdict) is :func:`gear_runtime.gearfile.digest.checked_load`'s."""
        return checked_load(self.data_digests, build)

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
        its own initializers, external ones pointing to the data file as checked (relative to
        :attr:`data_folder`, the resolved path the digest is checked on): run it with that
        folder as ONNX Runtime's external-data folder
        (``session.model_external_initializers_file_folder_path`` = :attr:`data_folder`)."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        declared = {t.name for t in out.graph.initializer}
        added = [n for n in self.weight_names_of(model) if n not in declared]
        out.graph.initializer.extend(self.weights[n] for n in added)
        for t in out.graph.initializer[len(out.graph.initializer) - len(added):]:
            if t.name in self.external:
                relocate(t, os.path.relpath(self.external[t.name].path, self.data_folder))
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

    @property
    def info(self) -> ModelInfo:
        """The model as backends describe it: the gear maps (``info.output_shape(g, k)``,
        ``info.output_size(g, k)``, checked), dtypes, kind and the recorded output axes."""
        return ModelInfo(
            spec=self.spec, input_dtypes=tuple(self.input_dtypes),
            output_names=tuple(self.output_names), output_dtypes=tuple(self.output_dtypes),
            output_shapes=tuple(self.output_shapes), hybrid=self.spec.hybrid,
            sink=self.kind == fmt.KIND_SINK, output_dynamic_axes=self.output_dynamic_axes,
            padding=self.padding)

    def weight_names_of(self, model: onnx.ModelProto) -> tuple[str, ...]:
        """The shared weights ``model`` (a branch or the dynamic model) reads, sorted."""
        return tuple(sorted(referenced_names(model.graph) & self.weights.keys()))



def _backend_hint(path: str) -> str:
    """For an .om / a MindIR: which backend opens it (they are not ONNX)."""
    backend = fmt.OWN_FILE_SUFFIXES.get(os.path.splitext(path)[1].lower())
    if backend is None:
        return ""
    return (f"; a {os.path.splitext(path)[1]} file is opened by the {backend} backend "
            f"(--backend {backend}, gr.load(..., backend={backend!r}))")


def read_gear_file(path: str | os.PathLike[str]) -> GearFile:
    """Read and check a gear file written by :func:`gear_runtime.compiler.compile_model`, or
    a plain ONNX model whose inputs and outputs are all static (a model with one gear ``()``,
    mode ``"static"``: its source graph is its only branch).

    Walks the Case branches (or the If tree of a sink file) by their ``Batch_<i>`` labels and
    checks that every gear 0..G-1 appears exactly once and agrees with ``pred_value_<i>`` /
    the gear table. Any problem (missing file, not ONNX, not a gear file, another format
    version, inconsistent attributes) raises GearFileError naming the path and what is wrong.
    """
    p = os.fspath(path)
    data = _read_regular_file(p)
    split = split_inline(data, EXTERNAL_MIN_BYTES)  # a static model's weights stay unparsed
    model = _parse(split.model) if split is not None else None
    if model is None or _has_format(model):  # a gear file is read whole (its digest covers it)
        split = None
        try:
            model = onnx.load_from_string(data)  # external data stays a reference
        except Exception as exc:  # protobuf DecodeError and friends
            raise GearFileError(f"{p!r} is not an ONNX model: {exc}{_backend_hint(p)}") from exc
    reader = _Reader(p, model, data, split)
    try:
        return reader.read()
    finally:  # a gear file's lazy branch builder keeps the reader: not the file's bytes
        reader.data = b""


def _parse(blob: bytes) -> onnx.ModelProto | None:
    """``blob`` parsed, or None where it does not parse (the caller parses the whole file,
    and says why it is no model)."""
    try:
        return onnx.load_from_string(blob)
    except Exception:  # noqa: BLE001 - protobuf DecodeError and friends: parsed whole next
        return None


def _has_format(model: onnx.ModelProto) -> bool:
    """Whether ``model`` says it is a gear file (its format metadata)."""
    return any(m.key == fmt.META_FORMAT for m in model.metadata_props)


def _read_regular_file(path: str) -> bytes:
    """The bytes of ``path``, a regular file of at most :data:`fmt.MAX_GEAR_FILE_BYTES`
    (:func:`gear_runtime.files.read_regular_file`: a FIFO, a device or a huge file is refused
    before any read; its weights beyond the limit belong in its data file)."""
    try:
        return read_regular_file(path, fmt.MAX_GEAR_FILE_BYTES)
    except FileTooLargeError as exc:
        raise GearFileError(f"gear file {path!r} is {exc.size} bytes; a gear file is at most "
                            f"{fmt.MAX_GEAR_FILE_BYTES} bytes (its weights beyond that are in "
                            "its data file)") from None
    except OSError as exc:
        raise GearFileError(f"gear file {path!r} cannot be read: {reason(exc)}") from None


class _Reader:
    """One read of one file; every check raises GearFileError naming the path."""

    def __init__(self, path: str, model: onnx.ModelProto, data: bytes,
                 split: Split | None = None) -> None:
        self.path = path
        self.model = model
        self.data = data
        #: the initializers whose raw_data ``model`` left in the file (:mod:`.inline_data`)
        self.split = split

    def fail(self, what: str) -> GearFileError:
        return GearFileError(f"{self.path!r} is not a valid gear file: {what}")

    def read(self) -> GearFile:
        meta = self._metadata()
        if fmt.META_FORMAT not in meta:
            return self._read_static()
        if meta[fmt.META_FORMAT] != fmt.FORMAT_VERSION:
            raise self.fail(f"format version {meta[fmt.META_FORMAT]!r}, this reader reads "
                            f"version {fmt.FORMAT_VERSION!r}")
        recorded = self._check_digest(meta)
        # The per-gear branches are checked when first used (GearFile.branches): a backend
        # that runs the source graph never reads them, and they are most of the file's text.
        bad = first_bad_text(self.model, skip_graph=_is_branch)
        if bad is not None:
            raise self.fail(f"a {bad} field is not valid UTF-8")
        try:
            spec = fmt.spec_from_json(meta.get(fmt.META_SPEC, ""))
        except (GearSpecError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise self.fail(f"metadata {fmt.META_SPEC!r} is not a valid spec ({exc})") from exc
        kind = meta.get(fmt.META_KIND)
        if kind not in fmt.KINDS:
            raise self.fail(f"metadata {fmt.META_KIND!r} is {kind!r}, expected one of {fmt.KINDS}")
        hybrid = meta.get(fmt.META_HYBRID)
        if hybrid not in ("0", "1") or (hybrid == "1") != spec.hybrid:
            raise self.fail(f"metadata {fmt.META_HYBRID!r} is {hybrid!r} but the spec says "
                            f"hybrid={spec.hybrid}")
        self.spec = spec
        self.folder = os.path.realpath(os.path.dirname(os.path.abspath(self.path)))
        self.opsets = [o for o in self.model.opset_import if o.domain != fmt.DOMAIN]
        self.weights, self.external = self._weights()
        self.data_digests = self._data_digests(recorded)
        read = self._read_case() if kind == fmt.KIND_CASE else self._read_sink(meta)
        return dataclasses.replace(read, output_dynamic_axes=self._output_axes(meta, read),
                                   padding=self._padding(meta))

    def _padding(self, meta: dict[str, str]) -> PaddingVerdict | None:
        if META_PADDING not in meta:
            return None
        try:
            return verdict_from_json(meta[META_PADDING])
        except (ValueError, TypeError) as exc:
            raise self.fail(f"metadata {META_PADDING!r}: {exc}") from exc

    def _output_axes(self, meta: dict[str, str], read: GearFile
                     ) -> tuple[dict[int, int], ...] | None:
        if fmt.META_OUTPUT_AXES not in meta:
            return None
        try:
            axes = fmt.axes_from_json(json.loads(meta[fmt.META_OUTPUT_AXES]),
                                      len(read.output_names), self.spec.values_per_gear)
            # a (resealed) record that contradicts the gear shapes would trim outputs wrongly
            check_output_axes(self.spec.gears, read.output_shapes, read.output_names, axes)
            return axes
        except (ValueError, TypeError, RecursionError) as exc:  # bad JSON, bad shapes of it
            raise self.fail(f"metadata {fmt.META_OUTPUT_AXES!r}: {exc}") from exc

    # ---- a plain ONNX model with no dynamic axis ------------------------------------------
    def _read_static(self) -> GearFile:
        """A model that is no gear file, as the one-gear model it is when every input and
        output has a static shape (a decode step at fixed shapes): its gear ``()`` runs the
        graph as it is. A model with a dynamic input needs gears: GearFileError saying to
        compile it. The weights are checked as a gear file's; a plain file records no digest
        of its data files, so none is checked. Its large inline weights are never parsed: they
        are declared external data in the file itself (:meth:`_declare_inline`)."""
        self.folder = os.path.realpath(os.path.dirname(os.path.abspath(self.path)))
        digests = self._declare_inline()
        graph = self.model.graph
        if not graph.output:  # an empty file parses as an empty ModelProto
            raise GearFileError(f"{self.path!r} is empty or no ONNX model: it has no gear "
                                f"metadata and its graph has no outputs")
        self.opsets = [o for o in self.model.opset_import if o.domain != fmt.DOMAIN]
        self.weights, self.external = self._weights()
        weights = {t.name for t in graph.initializer}
        inputs = [vi for vi in graph.input if vi.name not in weights]
        dynamic = [(vi.name, _declared(vi)) for vi in inputs if -1 in _declared(vi)]
        if dynamic:
            shown = ", ".join(f"{n} {list(s)}" for n, s in dynamic)
            raise GearFileError(
                f"{self.path!r} is not a gear file (no {fmt.META_FORMAT!r} metadata) and not "
                f"a static model: input(s) {shown} have dynamic dims (-1: unnamed or symbolic);"
                f" compile it with gear_runtime.compile (gear-runtime compile) to give them "
                f"gears, or export it at fixed shapes")
        bad = first_bad_text(self.model)
        if bad is not None:
            raise self.fail(f"a {bad} field is not valid UTF-8")
        _check_static_graph(graph, inputs, self.path)
        self.spec = GearSpec.static([vi.name for vi in inputs],
                                    [_declared(vi) for vi in inputs])
        outputs = _static_outputs(self.model, self.path)
        output_names = tuple(o.name for o in outputs)
        source = onnx.ModelProto()
        source.CopyFrom(self.model)
        del source.graph.initializer[:]  # the weights are attached by GearFile.runnable
        source = self._standalone(source.graph, source.graph.name or "static", inputs,
                                  output_names)
        return GearFile(
            path=self.path, spec=self.spec, kind=fmt.KIND_CASE,
            input_dtypes=tuple(self._dtype(vi) for vi in inputs), output_names=output_names,
            output_dtypes=tuple(self._dtype(o) for o in outputs),
            output_shapes=((tuple(_declared(o) for o in outputs)),),
            branch_builder=lambda: (source,), weights=self.weights, external=self.external,
            dynamic=source, model_bytes=None, data_folder=self.folder, data_digests=digests,
            output_dynamic_axes=tuple({} for _ in outputs))

    def _declare_inline(self) -> dict[str, DataDigest]:
        """Declare the initializers whose raw_data the parse left in the file
        (:mod:`.inline_data`) external data located in this very file, so that they are
        checked and read as a data file's weights (ONNX Runtime reads them by path, nobody
        holds them parsed); return this file's digest as read, which the load then proves
        ONNX Runtime read (:meth:`GearFile.checked_load`); {} when nothing was left out.

        The data folder becomes the file's own (resolved) folder. Where that cannot be --
        a symlinked file whose other weights are in a data file beside the link (ONNX Runtime
        resolves every weight against one folder), a file name no location may hold, a
        weight whose bytes do not fit its dims and type (the whole parse's check names it) --
        the file is parsed whole instead."""
        if self.split is None:
            return {}
        split, self.split = self.split, None
        real = os.path.realpath(self.path)
        folder, name = os.path.split(real)
        tensors = self.model.graph.initializer
        elsewhere = folder != self.folder and any(is_external(t) for t in tensors)
        unfit = any(tensor_nbytes(tensors[s.index]) != s.length for s in split.spans)
        if elsewhere or unfit or ":" in name or "\\" in name:
            self.model = onnx.load_from_string(self.data)
            return {}
        self.folder = folder
        for span in split.spans:
            set_external(self.model.graph.initializer[span.index], name, span.offset,
                         span.length)
        return {real: DataDigest(xxhash.xxh3_128_hexdigest(self.data), len(self.data))}

    # ---- shared pieces ----------------------------------------------------------------------
    def _metadata(self) -> dict[str, str]:
        meta: dict[str, str] = {}
        for m in self.model.metadata_props:
            if type(m.key) is not str or type(m.value) is not str:  # bytes: not UTF-8
                raise self.fail(f"metadata key {m.key!r} or its value is not valid UTF-8")
            meta[m.key] = m.value
        return meta

    def _check_digest(self, meta: dict[str, str]) -> dict[str, DataDigest]:
        """The whole file checked against its integrity record; the data files' recorded
        digests (:func:`gear_runtime.gearfile.digest.check_file`)."""
        return check_file(self.path, self.data, self.model, meta.get(fmt.META_DIGEST))

    def _data_digests(self, recorded: dict[str, DataDigest]) -> dict[str, DataDigest]:
        """The recorded data-file digests by resolved path. Every external weight must be in
        a recorded file, every recorded file read by a weight and of the recorded size (a
        cheap check here; the content is hashed by :meth:`GearFile.verify_data`)."""
        out = {os.path.realpath(os.path.join(self.folder, n)): d for n, d in recorded.items()}
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
        weights: dict[str, onnx.TensorProto] = {}
        external: dict[str, ExternalSpan] = {}
        for t in self.model.graph.initializer:
            if t.name.startswith(fmt.RESERVED_PREFIX):
                continue
            if is_external(t):
                try:
                    external[t.name] = check_external(t, self.folder)
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
        try:
            passthrough.unwrap(g)
        except ValueError as exc:
            raise self.fail(f"graph {name!r}: {exc}") from None
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
                branches: list[tuple[onnx.GraphProto, list[onnx.ValueInfoProto]]],
                dynamic: onnx.ModelProto | None, model_bytes: bytes | None) -> GearFile:
        try:
            shapes = fmt.parse_output_dims(dims_items, self.spec.gear_count, len(output_names))
        except ValueError as exc:
            raise self.fail(f"dynamic_output_dims: {exc}") from exc

        def build() -> tuple[onnx.ModelProto, ...]:
            out = []
            for g, (graph, inputs) in enumerate(branches):
                bad = first_bad_text(graph)
                if bad is not None:
                    raise self.fail(f"branch {g}: a {bad} field is not valid UTF-8")
                model = self._standalone(graph, graph.name, inputs, output_names)
                self._check_branch_outputs(model, shapes[g], g)
                out.append(model)
            return tuple(out)

        if self.spec.hybrid and dynamic is None:
            raise self.fail("the spec is hybrid but the file has no dynamic-shape graph")
        if kind == fmt.KIND_CASE and dynamic is None:
            raise self.fail(f"the {fmt.OP_CASE} node has no {fmt.ATTR_DYNAMIC_GRAPH!r} (the source "
                            "graph every case file keeps)")
        return GearFile(path=self.path, spec=self.spec, kind=kind, input_dtypes=input_dtypes,
                        output_names=output_names, output_dtypes=output_dtypes,
                        output_shapes=shapes, branch_builder=build, weights=self.weights,
                        external=self.external, dynamic=dynamic, model_bytes=model_bytes,
                        data_digests=self.data_digests, data_folder=self.folder)

    def _by_label(self, graphs: Sequence[onnx.GraphProto]) -> list[onnx.GraphProto]:
        """Order branch graphs by their Batch_<i> labels; each gear exactly once."""
        found: dict[int, onnx.GraphProto] = {}
        for g in graphs:
            if not g.name.startswith(fmt.BATCH_LABEL_PREFIX):
                raise self.fail(f"branch graph {g.name!r} has no {fmt.BATCH_LABEL_PREFIX}<i> label")
            try:
                idx = int(g.name[len(fmt.BATCH_LABEL_PREFIX):])
            except ValueError:
                raise self.fail(f"branch graph label {g.name!r} is not "
                                f"{fmt.BATCH_LABEL_PREFIX}<integer>") from None
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
        custom = [n for n in graph.node if n.domain == fmt.DOMAIN]
        cases = [n for n in custom if n.op_type == fmt.OP_CASE]
        maps = [n for n in custom if n.op_type == fmt.OP_MAP_INDEX]
        if len(cases) != 1 or len(maps) != 1:
            raise self.fail(f"expected one {fmt.OP_MAP_INDEX} and one {fmt.OP_CASE} node in domain "
                            f"{fmt.DOMAIN!r}, found {len(maps)} and {len(cases)}")
        case, mapi = cases[0], maps[0]
        if list(mapi.input) != [fmt.ACL_DYNAMIC_TENSOR_NAME, fmt.GEAR_TABLE_NAME]:
            raise self.fail(f"{fmt.OP_MAP_INDEX} reads {list(mapi.input)}, expected "
                            f"{[fmt.ACL_DYNAMIC_TENSOR_NAME, fmt.GEAR_TABLE_NAME]}")
        if list(mapi.output) != [fmt.BRANCH_INDEX_NAME]:
            raise self.fail(f"{fmt.OP_MAP_INDEX} writes {list(mapi.output)}, expected "
                            f"{[fmt.BRANCH_INDEX_NAME]}")
        if list(case.input) != [fmt.BRANCH_INDEX_NAME, *spec.input_names]:
            raise self.fail(f"{fmt.OP_CASE} reads {list(case.input)}, expected the branch index "
                            f"then {list(spec.input_names)}")
        attrs = self._case_attrs(case)
        self._check_case_attrs(attrs)
        tables = [t for t in graph.initializer if t.name == fmt.GEAR_TABLE_NAME]
        if len(tables) != 1:
            raise self.fail(f"expected one initializer {fmt.GEAR_TABLE_NAME!r}, found "
                            f"{len(tables)}")
        self._check_table(self._array(tables[0], f"gear table {fmt.GEAR_TABLE_NAME!r}"),
                          fmt.case_gear_table(spec))
        root = self._root_inputs()
        if fmt.ACL_DYNAMIC_TENSOR_NAME not in root:
            raise self.fail(f"no {fmt.ACL_DYNAMIC_TENSOR_NAME!r} input")
        outs = {o.name: o for o in graph.output}
        output_names = tuple(outs)
        self._check_routing_outputs(list(case.output), output_names, root)
        branches = []
        for i, g in enumerate(self._by_label(attrs.get(fmt.ATTR_BRANCHES, []))):
            declared = [(vi.name, tuple(d.dim_value if d.HasField("dim_value") else -1
                                        for d in vi.type.tensor_type.shape.dim))
                        for vi in g.input]
            expected = list(spec.shapes(i).items())
            if declared != expected:
                raise self.fail(f"branch {g.name} declares inputs {declared}, the spec's gear "
                                f"{i} is {expected}")
            branches.append((g, list(g.input)))
        dynamic = None
        if fmt.ATTR_DYNAMIC_GRAPH in attrs:
            dg = attrs[fmt.ATTR_DYNAMIC_GRAPH]
            dynamic = self._standalone(dg, fmt.DYNAMIC_GRAPH_NAME, list(dg.input), output_names)
        dims = [_text(s) for s in attrs.get(fmt.ATTR_DYNAMIC_OUTPUT_DIMS, [])]
        return self._finish(
            fmt.KIND_CASE, tuple(self._dtype(root[n]) for n in spec.input_names), output_names,
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
            if p != n and not (p == fmt.routing_output_name(k) and n in roots):
                raise self.fail(f"root output {k} is {n!r} but the routing node writes {p!r}")

    def _case_attrs(self, case: onnx.NodeProto) -> dict[str, Any]:
        """Case's attributes by name, each of the type the compiler writes (so a tampered
        attribute is a GearFileError, never a TypeError further on)."""
        out: dict[str, Any] = {}
        for a in case.attribute:
            want = (onnx.AttributeProto.INTS if a.name.startswith(fmt.ATTR_PRED_VALUE)
                    else fmt.CASE_ATTR_TYPES.get(a.name))
            if want is not None and a.type != want:
                names = onnx.AttributeProto.AttributeType.Name
                raise self.fail(f"{fmt.OP_CASE} attribute {a.name!r} is of type {names(a.type)}, "
                                f"expected {names(want)}")
            out[a.name] = helper.get_attribute_value(a)
        return out

    def _check_case_attrs(self, attrs: dict[str, Any]) -> None:
        spec = self.spec
        if attrs.get(fmt.ATTR_BATCH_NUM) != spec.gear_count:
            raise self.fail(f"{fmt.ATTR_BATCH_NUM} is {attrs.get(fmt.ATTR_BATCH_NUM)!r}, the "
                            f"spec has {spec.gear_count} gears")
        for i, gear in enumerate(spec.gears):
            got = attrs.get(f"{fmt.ATTR_PRED_VALUE}{i}")
            if got is None or tuple(got) != gear:
                raise self.fail(f"{fmt.ATTR_PRED_VALUE}{i} is {got!r}, the spec's gear {i} is "
                                f"{gear}")
        order = tuple(_text(s) for s in attrs.get(fmt.ATTR_SHAPE_ORDER, []))
        if order != spec.input_names:
            raise self.fail(f"{fmt.ATTR_SHAPE_ORDER} is {list(order)}, the spec's inputs are "
                            f"{list(spec.input_names)}")
        dtype = _text(attrs.get(fmt.ATTR_DYNAMIC_TYPE, b""))
        if dtype != fmt.DYNAMIC_TYPES[spec.mode]:
            raise self.fail(f"{fmt.ATTR_DYNAMIC_TYPE} is {dtype!r}, the spec's mode is "
                            f"{spec.mode!r}")
        if len(attrs.get(fmt.ATTR_BRANCHES, [])) != spec.gear_count:
            raise self.fail(f"{len(attrs.get(fmt.ATTR_BRANCHES, []))} branches for "
                            f"{spec.gear_count} gears")

    def _check_table(self, table: np.ndarray, expected: np.ndarray) -> None:
        """The stored gear table equals the one the spec gives (shape and values)."""
        if table.shape != expected.shape or not np.array_equal(table, expected):
            raise self.fail(f"gear table {fmt.GEAR_TABLE_NAME!r} is {table.tolist()}, the spec "
                            f"gives {expected.tolist()}")

    # ---- kind "sink" ---------------------------------------------------------------------------
    def _read_sink(self, meta: dict[str, str]) -> GearFile:
        spec = self.spec
        graph = self.model.graph
        outs = list(graph.output)
        if not outs or outs[-1].name != fmt.ACL_DYNAMIC_TENSOR_NAME:
            raise self.fail(f"the last output is not {fmt.ACL_DYNAMIC_TENSOR_NAME!r}")
        self._check_table(self._sink_table(graph), fmt.sink_gear_table(spec))
        gears: list[onnx.GraphProto] = []
        dynamic_graphs: list[onnx.GraphProto] = []
        for sub in _walk_if_tree(graph):
            if sub.name.startswith(fmt.BATCH_LABEL_PREFIX):
                gears.append(sub)
            elif sub.name == fmt.DYNAMIC_GRAPH_NAME:
                dynamic_graphs.append(sub)
        root = self._root_inputs()
        output_names = tuple(o.name for o in outs[:-1])
        tops = [n for n in graph.node if n.op_type == "If"]
        if len(tops) != 1:
            raise self.fail(f"expected one routing If node in the root graph, found {len(tops)}")
        self._check_routing_outputs(list(tops[0].output), output_names, root)
        branches = [(g, self._gear_inputs(i, root)) for i, g in enumerate(self._by_label(gears))]
        dynamic = None
        if dynamic_graphs:
            if len(dynamic_graphs) != 1:
                raise self.fail(f"{len(dynamic_graphs)} dynamic-shape graphs, expected one")
            dyn_inputs = [root[n] for n in spec.input_names]
            dynamic = self._standalone(dynamic_graphs[0], fmt.DYNAMIC_GRAPH_NAME, dyn_inputs,
                                       output_names)
        try:
            dims = json.loads(meta.get(fmt.META_OUTPUT_DIMS, "null"))
            if not isinstance(dims, list):
                raise ValueError("not a list")
        except (ValueError, RecursionError) as exc:
            raise self.fail(f"metadata {fmt.META_OUTPUT_DIMS!r} is not a JSON list "
                            f"({exc})") from exc
        return self._finish(
            fmt.KIND_SINK, tuple(self._dtype(root[n]) for n in spec.input_names), output_names,
            tuple(self._dtype(o) for o in outs[:-1]), [str(s) for s in dims], branches,
            dynamic, self.data)

    def _sink_table(self, graph: onnx.GraphProto) -> np.ndarray:
        for node in graph.node:
            if node.op_type == "Constant" and list(node.output) == [fmt.GEAR_TABLE_NAME]:
                for a in node.attribute:
                    if a.name == "value":
                        return self._array(a.t, f"gear table {fmt.GEAR_TABLE_NAME!r}")
        raise self.fail(f"no Constant {fmt.GEAR_TABLE_NAME!r} in the root graph")



def _declared(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    """A value's declared shape, -1 for every dim without a fixed positive size."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return (-1,)  # no shape at all: not static
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else -1
                 for d in vi.type.tensor_type.shape.dim)


#: The element types gear-runtime stages, binds and hands back as numpy arrays (ONNX Runtime's
#: numpy bindings take these; bfloat16, float8, int4, complex and strings have no such path).
RUNNABLE_TYPES = frozenset({
    onnx.TensorProto.BOOL, onnx.TensorProto.INT8, onnx.TensorProto.INT16,
    onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
    onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})


def _type_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"elem_type {elem_type}"


def _check_static_graph(graph: onnx.GraphProto, inputs: Sequence[onnx.ValueInfoProto],
                        path: str) -> None:
    """What ``compile`` checks of a graph (compiler/check.py), for a static model that skips
    it: no output listed twice (ORT fills one buffer, the other stays zeros), and every input
    and output of an element type the runtime runs (:data:`RUNNABLE_TYPES`); else
    GearFileError naming the value, its type and what is supported."""
    names = [o.name for o in graph.output]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GearFileError(f"{path!r}: output(s) {', '.join(map(repr, dup))} are listed more "
                            "than once in the graph's outputs; list each once")
    supported = ", ".join(sorted(_type_name(t) for t in RUNNABLE_TYPES))
    for what, values in (("input", inputs), ("output", graph.output)):
        for vi in values:
            if not vi.type.HasField("tensor_type"):
                raise GearFileError(f"{path!r}: {what} {vi.name!r} is not a tensor (sequences, "
                                    "maps and optionals cannot be gear inputs or outputs)")
            elem = vi.type.tensor_type.elem_type
            if elem not in RUNNABLE_TYPES:
                raise GearFileError(
                    f"{path!r}: {what} {vi.name!r} is {_type_name(elem)}, which gear-runtime "
                    f"cannot run; supported: {supported} (cast it in the model)")


def _static_outputs(model: onnx.ModelProto, path: str) -> list[onnx.ValueInfoProto]:
    """The outputs of a static model with their shapes: as declared, else as ONNX shape
    inference gives them from the static inputs; GearFileError naming an output whose shape
    stays unknown (the executor preallocates every output, and never returns a shape it did
    not expect)."""
    outputs = list(model.graph.output)
    if all(-1 not in _declared(o) for o in outputs):
        return outputs
    try:  # reads the weights' dims, never their external bytes
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # inference errors on odd graphs: say which file
        raise GearFileError(f"{path!r}: the outputs of this static model declare no static "
                            f"shape and ONNX shape inference failed on it ({exc})") from exc
    found = {o.name: o for o in inferred.graph.output}
    out = []
    for o in outputs:
        typed = found.get(o.name, o)
        shape = _declared(typed)
        if -1 in shape:
            raise GearFileError(
                f"{path!r}: output {o.name!r} of this static model has no static shape "
                f"(declared {list(_declared(o))}, inferred {list(shape)}); export it with "
                "static output shapes")
        out.append(typed)
    return out


def _is_branch(graph: onnx.GraphProto) -> bool:
    """A per-gear branch graph (``Batch_<i>``), whose text is checked when it is used."""
    name = graph.name
    return type(name) is str and name.startswith(fmt.BATCH_LABEL_PREFIX)


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
            if sub.name.startswith(fmt.BATCH_LABEL_PREFIX) or sub.name == fmt.DYNAMIC_GRAPH_NAME:
                yield sub
            else:
                yield from _walk_if_tree(sub)

