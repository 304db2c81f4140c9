"""Per-gear output shapes, known at compile time (GE's ATTR_NAME_DYNAMIC_OUTPUT_DIMS).

First from static shape inference of the gear's branch; where inference leaves a dim unknown,
from a real run of the model with the gear's input shapes on ONNX Runtime (CPU; one session
for all gears) with zero-filled inputs (zeros, not ones: a 1 can index past a small table in
a Gather), run a second time with the float and bool inputs set to 1 / True: an output whose
shape changes depends on the input VALUES (NonZero, Unique, Compress, ...), has no static
shape per gear, and is refused. An output whose shape still cannot be known is a
CompileError: a gear file never holds an empty or guessed shape (GE's silent empty shape is
the weakness we do not copy). Limit: a shape that depends only on the values of integer
inputs (kept 0 in both runs) is not caught.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from gear_runtime.compiler.branch import make_skeleton
from gear_runtime.compiler.check import GraphInfo, Source
from gear_runtime.errors import CompileError


def inferred_shapes(inferred: onnx.GraphProto,
                    names: Sequence[str]) -> list[tuple[int, ...] | None]:
    """Static shape of each output in ``names`` from an inferred graph (an output that is
    itself an input or initializer of that graph takes its declared shape); None when any dim
    (or the rank) is unknown."""
    by_name = {vi.name: vi for vi in inferred.input}
    by_name.update((o.name, o) for o in inferred.output if o.name not in by_name)
    consts = {t.name: tuple(int(d) for d in t.dims) for t in inferred.initializer}
    out: list[tuple[int, ...] | None] = []
    for n in names:
        if n in consts:
            out.append(consts[n])
            continue
        tt = by_name[n].type.tensor_type if n in by_name else None
        if tt is None or not tt.HasField("shape") or not all(
                d.HasField("dim_value") for d in tt.shape.dim):
            out.append(None)
        else:
            out.append(tuple(int(d.dim_value) for d in tt.shape.dim))
    return out


class ShapeRunner:
    """Runs the source model on ONNX Runtime (CPU) for the gears whose output shapes
    inference leaves unknown: ONE session (one copy of the weights), built on first use and
    reused for every such gear (a gear's branch is the source graph with the gear's static
    inputs, so its outputs have the shapes the source gives for those inputs)."""

    def __init__(self, source: Source, info: GraphInfo) -> None:
        self._source = source
        self._info = info
        self._session: Any = None
        self._guarded: frozenset[str] | None = None

    def _valid(self, zeros: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``zeros`` with every input an attention kernel takes its lengths from (an
        attention mask: :mod:`gear_runtime.gearfile.kernel_guards`) set to ones: a mask of zeros
        makes ONNX Runtime's GroupQueryAttention write outside its cache on releases
        before 1.25, and is refused by the newer ones."""
        if self._guarded is None:
            from onnx import numpy_helper

            from gear_runtime.gearfile.kernel_guards import guarded_inputs

            graph, folder = self._source.model.graph, self._source.folder
            by_name = {t.name: t for t in graph.initializer}
            self._guarded = guarded_inputs(graph, lambda n: numpy_helper.to_array(
                by_name[n], base_dir=folder or ""))
        return {n: np.ones_like(a) if n in self._guarded else a for n, a in zeros.items()}

    def _get_session(self) -> Any:
        if self._session is None:
            import onnxruntime as ort

            model = onnx.ModelProto()
            model.CopyFrom(self._source.model)  # big weights stay external references
            model.graph.ClearField("value_info")  # stale exporter shapes must not get in the way
            opts = ort.SessionOptions()
            opts.log_severity_level = 4  # a failing run comes back as our error, not a log line
            if self._source.folder is not None:  # external data beside the source file
                opts.add_session_config_entry(
                    "session.model_external_initializers_file_folder_path", self._source.folder)
            self._session = ort.InferenceSession(model.SerializeToString(), opts,
                                                 providers=["CPUExecutionProvider"])
        return self._session

    def loaded_session(self, why: str) -> Any:
        """The session; CompileError saying ONNX Runtime cannot load the source (an invalid
        graph, an op it lacks: not a gear's fault) and ``why`` it was needed."""
        try:
            return self._get_session()
        except Exception as exc:  # ORT's InvalidGraph / Fail / InvalidArgument
            raise CompileError(f"{why}, but ONNX Runtime cannot load the source model: "
                               f"{ort_failure(exc)}") from None

    def close(self) -> None:
        """Drop the session (and its copy of the weights)."""
        self._session = None

    def run(self, shapes: Mapping[str, Sequence[int]], gear: int) -> list[tuple[int, ...]]:
        """The real output shapes for inputs of ``shapes``, from zero inputs. CompileError
        (naming the gear and the failure) when the model cannot run, or (naming the output
        and both shapes) when a second run with float/bool inputs set to one gives another
        shape. A model that cannot run on zeros (an attention mask of zeros: GQA's
        ``seqlens_k`` of -1) runs on ones instead, its second run with floats of two."""
        info = self._info
        zeros = self._valid({t.name: np.zeros(tuple(shapes[t.name]), dtype=t.dtype)
                             for t in info.inputs})
        ones = {n: np.ones_like(a) if a.dtype.kind in "fcb" else a for n, a in zeros.items()}
        all_ones = {n: np.ones_like(a) for n, a in zeros.items()}
        twos = {n: a + 1 if a.dtype.kind in "fc" else a for n, a in all_ones.items()}
        names = [t.name for t in info.outputs]
        session = self.loaded_session(f"gear {gear} {dict(shapes)}: shape inference left "
                                      "output shape(s) unknown, so the model must run on ONNX "
                                      "Runtime to find them")
        try:
            runs = [[tuple(int(d) for d in np.shape(r)) for r in session.run(names, feeds)]
                    for feeds in (zeros, ones)]
        except Exception as exc:  # ORT raises its own Fail / InvalidArgument / RuntimeException
            try:
                runs = [[tuple(int(d) for d in np.shape(r)) for r in session.run(names, feeds)]
                        for feeds in (all_ones, twos)]
            except Exception:
                raise CompileError(
                    f"gear {gear} {dict(shapes)}: shape inference left output shape(s) unknown "
                    f"and the model could not run on ONNX Runtime to find them (on inputs of "
                    f"zeros, nor of ones): {exc}") from exc
        for t, a, b in zip(info.outputs, *runs, strict=True):
            if a != b:
                raise CompileError(
                    f"gear {gear} {dict(shapes)}: output {t.name!r} is {a} with zero inputs but "
                    f"{b} with float inputs of one: its shape depends on the input values "
                    f"(NonZero, Unique, ...), so no gear can give it a static shape")
        return runs[0]


    def check(self, shapes: Mapping[str, Sequence[int]], gear: int, values: Sequence[int],
              want: Sequence[tuple[int, ...]]) -> None:
        """Run the model once at the gear's shapes (zero inputs) and compare the outputs'
        shapes with ``want`` (the gear's static shapes): CompileError naming the gear, the
        node ORT failed in and ORT's own reason, so a gear that cannot run (a shape the
        export baked into a Reshape) is refused at compile time, as atc refuses it."""
        info = self._info
        zeros = self._valid({t.name: np.zeros(tuple(shapes[t.name]), dtype=t.dtype)
                             for t in info.inputs})
        session = self.loaded_session(f"gear {gear} {list(values)} is run once to check it "
                                      "(--verify no skips this)")
        try:
            got = [tuple(int(d) for d in np.shape(r)) for r in session.run(
                [t.name for t in info.outputs], zeros)]
        except Exception as exc:  # ORT raises its own Fail / InvalidArgument / RuntimeException
            raise CompileError(f"gear {gear} {list(values)} cannot run: {ort_failure(exc)}; "
                               "a shape the export baked into the graph (torch.onnx traces "
                               "sizes as constants unless they are marked dynamic) fails this "
                               "way; --verify no skips this check") from None
        for t, a, b in zip(info.outputs, got, want, strict=True):
            if a != tuple(b):
                raise CompileError(f"gear {gear} {list(values)}: output {t.name!r} is {a} when "
                                   f"run but {tuple(b)} by shape inference")


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_ORT_NODE = re.compile(r"running (\S+) node\. Name:'([^']*)' Status Message: (.*)", re.S)
#: ORT's source location and function before its reason ("reshape_helper.h:47
#: onnxruntime::ReshapeHelper::ReshapeHelper(...) input_shape_size == size was false. ")
_ORT_SOURCE = re.compile(r"^\S+\.(?:h|cc|cpp):\d+ (?:.*? was false\. |[^(\n]*\(.*?\) )",
                         re.S)


def ort_failure(exc: BaseException) -> str:
    """ORT's error as one readable line: "OpType node 'name': reason" without ORT's source
    location and exception prefix; the whole text when it names no node."""
    text = str(exc).strip()
    found = _ORT_NODE.search(text)
    if found is None:
        text = _ORT_SOURCE.sub("", _ORT_PREFIX.sub("", text)).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    op, name, reason = found.groups()
    reason = _ORT_SOURCE.sub("", reason.strip()).strip().splitlines()[0]
    return f"{op} node {name!r}: {reason}"


def gear_output_shapes(inferred: onnx.GraphProto, runner: ShapeRunner, info: GraphInfo,
                       shapes: Mapping[str, Sequence[int]],
                       gear: int) -> tuple[list[tuple[int, ...]], bool]:
    """Every output's static shape in this gear, and whether ORT had to be run for it."""
    names = [o.name for o in info.outputs]
    static = inferred_shapes(inferred, names)
    if all(s is not None for s in static):
        return [s for s in static if s is not None], False
    real = runner.run(shapes, gear)
    for k, (s, r) in enumerate(zip(static, real, strict=True)):
        if s is not None and s != r:
            raise CompileError(f"gear {gear}: output {names[k]!r} is {r} when run but shape "
                               f"inference says {s}")
    return real, True


def set_output_shapes(branch: onnx.GraphProto, info: GraphInfo,
                      shapes: Sequence[tuple[int, ...]]) -> None:
    """Declare the branch's outputs (in place, names kept) with one gear's static shapes."""
    decls = [helper.make_tensor_value_info(o.name, t.elem_type, list(s))
             for o, t, s in zip(branch.output, info.outputs, shapes, strict=True)]
    del branch.output[:]
    branch.output.extend(decls)


def select_outputs(model: onnx.ModelProto, out_nodes: str) -> None:
    """atc's ``--out_nodes`` on the source graph, in place: its outputs become the named
    tensors, in the given order. Two forms, not mixed (atc's rule): ``"node:0;node:1"`` (a
    node's k-th output, intermediate ones included) or, for ONNX, ``"out1;out2"`` (names of
    graph outputs: a subset, or another order). Nodes no output needs any more are left to
    ONNX Runtime, which drops them. CompileError naming the entry that is no node output or
    graph output, an index out of range, a name given twice, or a tensor whose type shape
    inference cannot tell (a graph output needs one)."""
    entries = [e.strip() for e in out_nodes.split(";") if e.strip()]
    if not entries:
        raise CompileError(f"--out_nodes {out_nodes!r} names no output")
    graph = model.graph
    nodes = {n.name: n for n in graph.node if n.name}
    outputs = {o.name: o for o in graph.output}
    as_node = [_node_output(e, nodes) for e in entries]
    if any(t is not None for t in as_node) and not all(t is not None for t in as_node):
        bad = entries[as_node.index(None)]
        raise CompileError(f"--out_nodes {out_nodes!r}: {bad!r} is not NODE:INDEX while others "
                           "are; give node outputs (node_name:0) or graph output names, not "
                           "both (atc's rule)")
    names = [t for t in as_node if t is not None] if as_node[0] is not None else entries
    if as_node[0] is None:
        unknown = [n for n in names if n not in outputs]
        if unknown:
            raise CompileError(f"--out_nodes {out_nodes!r}: {unknown[0]!r} is neither a graph "
                               f"output ({', '.join(outputs)}) nor NODE:INDEX of a node")
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise CompileError(f"--out_nodes {out_nodes!r} names the tensor {twice[0]!r} twice")
    typed = _typed_values(model, [n for n in names if n not in outputs])
    chosen = [outputs[n] if n in outputs else typed[n] for n in names]
    del graph.output[:]
    graph.output.extend(chosen)


def _node_output(entry: str, nodes: Mapping[str, onnx.NodeProto]) -> str | None:
    """The tensor ``node:k`` names (None when ``entry`` is not that form); CompileError for
    an index past the node's outputs."""
    name, sep, index = entry.rpartition(":")
    if not sep or not index.isdigit() or name not in nodes:
        return None
    node, k = nodes[name], int(index)
    if k >= len(node.output) or not node.output[k]:
        raise CompileError(f"--out_nodes {entry!r}: node {name!r} ({node.op_type}) has "
                           f"{len(node.output)} output(s), 0..{len(node.output) - 1}")
    return node.output[k]


def _typed_values(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, onnx.ValueInfoProto]:
    """ValueInfos (with their element types) of intermediate tensors, by shape inference of
    the source's skeleton (compiler/branch.make_skeleton); CompileError for one whose type it
    cannot tell."""
    if not names:
        return {}
    try:  # the compiler's weightless model for inference (big weights as typed inputs)
        inferred = onnx.shape_inference.infer_shapes(make_skeleton(model), strict_mode=False)
    except Exception:  # noqa: BLE001 -- no types: refused below, naming the tensor
        inferred = onnx.ModelProto()  # knows no type: every name is refused below
    known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    out = {}
    for name in names:
        value = known.get(name)
        if value is None or not value.type.tensor_type.elem_type:
            raise CompileError(f"--out_nodes: the type of tensor {name!r} is unknown to ONNX "
                               "shape inference; a graph output needs one")
        out[name] = helper.make_tensor_value_info(name, value.type.tensor_type.elem_type, None)
    return out
