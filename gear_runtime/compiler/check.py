"""Load the model and check the spec against it before anything is compiled.

GE checks the same things in CheckSequenceOfData (docs/ge-notes.md section 1): as many Data nodes
as inputs in input_shape, equal ranks, every static dim of input_shape equal to the model's.
We add: every -1 must sit on a dim the model leaves dynamic (a gear cannot change a dim the
model fixes), and a name that is not a model input is GE's E10016 ("Opname ... specified in
--input_shape is not found in the model").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from gear_runtime.errors import CompileError
from gear_runtime.gearfile.external_data import (
    ExternalDataError,
    ExternalSpan,
    check_external,
    is_external,
    read_inline,
)
from gear_runtime.gearfile.format import META_FORMAT, RESERVED_PREFIX
from gear_runtime.gearfile.onnx_graph import subgraphs
from gear_runtime.spec import GearSpec

#: GE: an input_shape name not found in the model.
E_UNKNOWN_INPUT = "E10016"
#: GE reports CheckSequenceOfData failures (count, rank, static dims) as E19999/PARAM_INVALID.
E_SEQUENCE = "E19999"

#: A dim as read from a model: an int, a symbolic name, or None (unknown).
Dim = int | str | None


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: name, ONNX element type, dims (None = unknown rank)."""

    name: str
    elem_type: int
    dims: tuple[Dim, ...] | None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))

    def shape_text(self) -> str:
        if self.dims is None:
            return "[unknown rank]"
        return "[" + ",".join("?" if d is None else str(d) for d in self.dims) + "]"


@dataclass(frozen=True)
class GraphInfo:
    """What the compiler needs to know about the source model."""

    inputs: tuple[TensorInfo, ...]        # non-initializer graph inputs, model order
    outputs: tuple[TensorInfo, ...]
    weights: frozenset[str]               # initializer names
    opset: int                            # ai.onnx opset version

    def input(self, name: str) -> TensorInfo | None:
        return next((t for t in self.inputs if t.name == name), None)


@dataclass
class Source:
    """The source model as the compiler holds it: the graph, and the folder its external
    data is resolved against (None for a ModelProto given in memory, which must hold its
    weights inline). Big external weights stay references: the compiler copies their bytes
    file to file and never parses them."""

    model: onnx.ModelProto
    folder: str | None

    def span(self, tensor: onnx.TensorProto) -> ExternalSpan:
        """Where an external weight of the source lives (checked: inside ``folder``)."""
        assert self.folder is not None  # load_model refuses external data without a folder
        try:
            return check_external(tensor, self.folder)
        except ExternalDataError as exc:
            raise CompileError(f"source model: {exc}") from None

    def inline(self, tensor: onnx.TensorProto, span: ExternalSpan | None = None) -> None:
        """Read an external weight of the source into the graph (at ``span``, else its own
        checked span); CompileError naming the tensor when the bytes cannot be read."""
        try:
            read_inline(tensor, span or self.span(tensor))
        except OSError as exc:
            raise CompileError(f"source model: tensor {tensor.name!r}: {exc}") from exc


#: External weights of the source up to this size are read into the graph at load: shape
#: inference needs the values of small constants (shapes, axes), and they cost nothing.
INLINE_SMALL_BYTES = 64 * 2**10


def load_model(model: str | os.PathLike[str] | onnx.ModelProto) -> Source:
    """A private copy of ``model`` (a path, or a ModelProto holding its weights inline).

    From a path, external data is resolved against the model file's folder (never the
    working directory) and checked; small external tensors are read in, big ones stay
    references (see :class:`Source`)."""
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        folder = None
    else:
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise CompileError(f"model file {path!r} " + ("is not a regular file"
                               if os.path.exists(path) else "does not exist"))
        try:
            out = onnx.load(path, load_external_data=False)
        except Exception as exc:
            raise CompileError(f"model file {path!r} is not a readable ONNX model: {exc}") from exc
        folder = os.path.dirname(os.path.abspath(path))
    source = Source(out, folder)
    # Big initializers stay references; constants held by node attributes are read in.
    weights = [(t, True) for t in out.graph.initializer]
    weights += [(t, False) for t in _attribute_tensors(out.graph)]
    for t, is_weight in weights:
        if not is_external(t):
            continue
        if folder is None:
            raise CompileError(f"weight {t.name!r} still points to external data: pass the "
                               f"model path, or load the ModelProto with its external data")
        span = source.span(t)
        if span.length <= INLINE_SMALL_BYTES or not is_weight:
            source.inline(t, span)
    if len(out.graph.sparse_initializer):
        raise CompileError("sparse initializers are not supported: densify them first "
                           "(onnx.numpy_helper / onnxruntime's tools)")
    return source


def _attribute_tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """Every tensor held by a node attribute of ``graph`` and of its subgraphs (Constant
    values), and the initializers of its subgraphs."""
    out: list[onnx.TensorProto] = []
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                out.append(a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                out.extend(a.tensors)
        for sub in subgraphs(node):
            out.extend(sub.initializer)
            out.extend(_attribute_tensors(sub))
    return out


def _tensor_info(vi: onnx.ValueInfoProto, what: str) -> TensorInfo:
    if not vi.type.HasField("tensor_type"):
        raise CompileError(f"{what} {vi.name!r} is not a tensor (sequences, maps and optionals "
                           f"cannot be gear inputs or outputs)")
    tt = vi.type.tensor_type
    try:  # once here, so TensorInfo.dtype cannot fail later (zero feeds, empty miss outputs)
        helper.tensor_dtype_to_np_dtype(tt.elem_type)
    except KeyError:
        raise CompileError(f"{what} {vi.name!r} has no supported element type (elem_type "
                           f"{tt.elem_type}); declare its type in the model") from None
    dims: tuple[Dim, ...] | None = None
    if tt.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value")
                     else (d.dim_param if d.HasField("dim_param") else None)
                     for d in tt.shape.dim)
    return TensorInfo(vi.name, tt.elem_type, dims)


def inspect_model(model: onnx.ModelProto) -> GraphInfo:
    """Inputs (initializers that are also listed as inputs count as weights), outputs,
    weights and opset of ``model``; CompileError for what a gear file cannot hold (no
    outputs, a non-tensor or untyped input/output, an output listed twice, no ai.onnx opset)."""
    g = model.graph
    weights = frozenset(t.name for t in g.initializer)
    inputs = tuple(_tensor_info(vi, "model input") for vi in g.input if vi.name not in weights)
    outputs = tuple(_tensor_info(vi, "model output") for vi in g.output)
    if not outputs:
        raise CompileError("the model has no outputs: there is nothing for a gear to compute")
    names = [o.name for o in outputs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CompileError(f"model output(s) {dup} are listed more than once")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise CompileError("the model imports no ai.onnx opset")
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= int(opset) <= newest:  # else it compiles and then fails at load
        raise CompileError(f"the model imports ai.onnx opset {opset}; this onnx "
                           f"({onnx.__version__}) knows opsets 1..{newest}: re-export it at "
                           "a real opset")
    return GraphInfo(inputs, outputs, weights, int(opset))


def check_reserved(model: onnx.ModelProto) -> None:
    """Names the compiler adds contain ``ascend_mbatch_``: the model's names must not. A gear
    file (its format key in the metadata) is named as one: compile its source model."""
    meta = {p.key: p.value for p in model.metadata_props}
    if META_FORMAT in meta:
        raise CompileError(f"the model is already a gear file (format {meta[META_FORMAT]}, "
                           "written by gear-runtime compile); compile the source model it "
                           "was compiled from, or run this file as it is")
    for name in sorted(_all_names(model.graph)):
        if RESERVED_PREFIX in name:
            raise CompileError(f"the model uses the name {name!r}; names containing "
                               f"{RESERVED_PREFIX!r} are reserved for the gear compiler")


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(node.output)
        for sub in subgraphs(node):
            names |= _all_names(sub)
    names.discard("")
    return names


def check_spec(info: GraphInfo, spec: GearSpec) -> None:
    """Raise CompileError unless ``spec`` fits the model (see the module docstring).

    A model dim that is symbolic or unknown accepts any static value and any -1.
    """
    _check_gears(spec)
    model_inputs = [t.name for t in info.inputs]
    for name, shape in zip(spec.input_names, spec.input_shapes, strict=True):
        t = info.input(name)
        if t is None:
            what = ("is a weight (initializer), not an input" if name in info.weights
                    else "is not an input of the model")
            raise CompileError(f"input_shape names {name!r}, which {what}; model inputs: "
                               f"{', '.join(model_inputs)}", code=E_UNKNOWN_INPUT)
        _check_dims(t, shape)
    _check_tied(info, spec)
    missing = [n for n in model_inputs if n not in spec.input_names]
    if missing:
        t = info.input(missing[0])
        assert t is not None
        raise CompileError(
            f"model input {t.name!r} {t.shape_text()} is not in input_shape; like GE "
            f"(CheckSequenceOfData: as many Data nodes as input_shape entries) every model "
            f"input must be listed, static ones with their static shape; missing: "
            f"{', '.join(missing)}", code=E_SEQUENCE)


def _check_tied(info: GraphInfo, spec: GearSpec) -> None:
    """Dims the model names alike (one ``dim_param``, e.g. ``seq`` on input_ids and
    attention_mask) must take one value in every gear: the exporter declared them equal, and
    a gear that sets them apart fails inside the graph (a broadcast, a Reshape) with an error
    that names neither input. CompileError naming both inputs, the axes, the name and the
    gear."""
    for g in range(spec.gear_count):
        seen: dict[str, tuple[str, int, int]] = {}
        for name, shape in spec.shapes(g).items():
            t = info.input(name)
            if t is None or t.dims is None:
                continue
            for axis, (dim, value) in enumerate(zip(t.dims, shape, strict=False)):
                if not isinstance(dim, str) or not dim:
                    continue
                first = seen.setdefault(dim, (name, axis, value))
                if first[2] != value:
                    raise CompileError(
                        f"gear {g} {list(spec.gears[g])}: input {first[0]!r} axis {first[1]} "
                        f"is {first[2]} but input {name!r} axis {axis} is {value}, and the "
                        f"model names both dims {dim!r} (they must be equal); give them the "
                        "same value in every gear", code="E10001")


def _check_gears(spec: GearSpec) -> None:
    """What the spec parsers enforce but ``GearSpec.__post_init__`` does not (it refuses
    duplicate gears and input names itself), re-checked for hand-built GearSpecs: the routing
    relies on at least one dynamic dim and at least one gear."""
    if not spec.dynamic_positions:
        raise CompileError("input_shape has no -1: there is nothing for gears to set",
                           code="E10001")
    if not spec.gears:
        raise CompileError("the spec has no gears", code="E10035")


def _check_dims(t: TensorInfo, shape: tuple[int, ...]) -> None:
    if t.dims is None:
        return
    if len(t.dims) != len(shape):
        raise CompileError(
            f"input {t.name!r}: input_shape gives {len(shape)} dims {list(shape)}, the model's "
            f"input has {len(t.dims)} dims {t.shape_text()}", code=E_SEQUENCE)
    for axis, (want, have) in enumerate(zip(shape, t.dims, strict=True)):
        if not isinstance(have, int):
            continue  # symbolic / unknown in the model: any value or -1 is fine
        if want == -1:
            raise CompileError(
                f"input {t.name!r} axis {axis}: input_shape marks it dynamic (-1) but the "
                f"model fixes it to {have}; only dims the model leaves dynamic can take gears",
                code=E_SEQUENCE)
        if want != have:
            raise CompileError(
                f"input {t.name!r} axis {axis}: input_shape says {want}, the model fixes it "
                f"to {have}", code=E_SEQUENCE)
