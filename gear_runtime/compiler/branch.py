"""One static branch per gear: the original graph with every input fixed to the gear's shape.

GE's multi_batch_clone_pass clones the graph once per gear, renames every node with the
suffix ``_ascend_mbatch_batch_<i>`` and labels it ``Batch_<i>``; the weights stay shared. We do
the same on ONNX: a branch is the original nodes with static inputs, shapes re-inferred with
data propagation (so Shape -> Gather -> Reshape chains become static), every node and every
intermediate value renamed with the suffix (branches never clash when they sit side by side),
graph inputs/outputs and weight names unchanged (a branch is a drop-in static model for its
gear), and NO initializers: branches read the weights from the root graph by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableSequence, Sequence

import onnx
from onnx import helper

from gear_runtime.compiler.check import GraphInfo
from gear_runtime.errors import CompileError
from gear_runtime.gearfile import passthrough
from gear_runtime.gearfile.format import (
    BRANCH_SUFFIX,
    DYNAMIC_GRAPH_NAME,
    DYNAMIC_SUFFIX,
    batch_label,
)
from gear_runtime.gearfile.onnx_graph import subgraphs

#: Initializers with at most this many elements keep their data for shape inference (shape
#: tensors, axes, Resize scales drive output shapes); bigger ones become typed graph inputs of
#: the inference skeleton, so inferring 100 gears never copies the weights 100 times.
SMALL_WEIGHT_ELEMS = 4096


def make_skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model for shape inference: big weights replaced by typed inputs, the model's
    value_info and output shapes dropped (stale symbolic shapes must not win over the shapes
    inferred for a gear)."""
    src = model.graph
    g = onnx.GraphProto(name=src.name)
    g.node.extend(src.node)
    weights = {t.name for t in src.initializer}
    g.input.extend(vi for vi in src.input if vi.name not in weights)
    for t in src.initializer:
        count = 1
        for d in t.dims:
            count *= d
        if count <= SMALL_WEIGHT_ELEMS:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for o in src.output:
        g.output.append(helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None))
    sk = helper.make_model(g, opset_imports=list(model.opset_import))
    sk.ir_version = model.ir_version
    return sk


def infer_gear(skeleton: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
               gear: int) -> onnx.GraphProto:
    """The skeleton's graph with the inputs fixed to ``shapes`` and shapes re-inferred."""
    m = onnx.ModelProto()
    m.CopyFrom(skeleton)
    for vi in m.graph.input:
        if vi.name in shapes:
            _set_dims(vi, shapes[vi.name])
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError / ValidationError / RuntimeError
        raise CompileError(f"gear {gear} {dict(shapes)}: shape inference failed: {exc}") from exc
    return inferred.graph


def _set_dims(vi: onnx.ValueInfoProto, dims: Sequence[int]) -> None:
    tt = vi.type.tensor_type
    tt.ClearField("shape")
    shape = tt.shape
    shape.SetInParent()  # rank 0 still needs an (empty) shape message
    for d in dims:
        shape.dim.add().dim_value = int(d)


def static_inputs(info: GraphInfo, names: Sequence[str],
                  shapes: Mapping[str, Sequence[int]]) -> list[onnx.ValueInfoProto]:
    """Input declarations of ``names`` (in that order) with the static ``shapes``."""
    out = []
    for n in names:
        t = info.input(n)
        assert t is not None  # check_spec ran
        out.append(helper.make_tensor_value_info(n, t.elem_type, list(shapes[n])))
    return out


def dynamic_inputs(info: GraphInfo, names: Sequence[str],
                   shapes: Sequence[Sequence[int]]) -> list[onnx.ValueInfoProto]:
    """Input declarations of ``names`` with the spec's ``shapes``: static dims as the spec
    gives them, each -1 symbolic (the model's dim name there, else ``<input>_dim<axis>``)."""
    out = []
    for name, shape in zip(names, shapes, strict=True):
        t = info.input(name)
        assert t is not None  # check_spec ran
        dims: list[int | str] = []
        for axis, d in enumerate(shape):
            orig = t.dims[axis] if t.dims is not None else None
            if d != -1:
                dims.append(d)
            else:
                dims.append(orig if isinstance(orig, str) else f"{name}_dim{axis}")
        out.append(helper.make_tensor_value_info(name, t.elem_type, dims))
    return out


def build_branch(inferred: onnx.GraphProto, gear: int, inputs: Sequence[onnx.ValueInfoProto],
                 outputs: Sequence[onnx.ValueInfoProto],
                 weights: Iterable[str]) -> onnx.GraphProto:
    """Gear ``gear``'s branch graph ``Batch_<gear>``: the inferred nodes and value_info,
    ``inputs`` and ``outputs`` declared as given, every node and intermediate value renamed
    with ``_ascend_mbatch_batch_<gear>``; no initializers."""
    return _assemble(batch_label(gear), inferred.node, inferred.value_info, inputs, outputs,
                     weights, f"{BRANCH_SUFFIX}{gear}")


def build_dynamic(model: onnx.ModelProto, inputs: Sequence[onnx.ValueInfoProto],
                  weights: Iterable[str]) -> onnx.GraphProto:
    """Hybrid mode: the original dynamic-shape graph, named ``Dynamic``, renamed the same way
    with ``_ascend_mbatch_dynamic``, reading the root weights."""
    src = model.graph
    return _assemble(DYNAMIC_GRAPH_NAME, src.node, src.value_info, inputs, src.output, weights,
                     DYNAMIC_SUFFIX)


def _assemble(name: str, nodes: Iterable[onnx.NodeProto],
              value_info: Iterable[onnx.ValueInfoProto], inputs: Sequence[onnx.ValueInfoProto],
              outputs: Sequence[onnx.ValueInfoProto], weights: Iterable[str],
              suffix: str) -> onnx.GraphProto:
    keep = {vi.name for vi in inputs} | {vi.name for vi in outputs} | set(weights)
    g = onnx.GraphProto(name=name)
    g.node.extend(nodes)
    g.value_info.extend(vi for vi in value_info if vi.name not in keep)
    g.input.extend(inputs)
    g.output.extend(outputs)
    rename_values(g, suffix, keep)
    passthrough.wrap(g)  # a subgraph output must be produced inside it
    return g


def rename_values(graph: onnx.GraphProto, suffix: str, keep: set[str] | frozenset[str],
                  outer: Mapping[str, str] | None = None) -> None:
    """Append ``suffix`` in place to every node name and to every value name defined in
    ``graph`` and its subgraphs, except the names in ``keep``; references follow (including
    references from subgraphs to outer values). Nameless nodes get ``<op_type>_<k>``."""
    mapping = dict(outer or {})
    defined = [vi.name for vi in graph.input] + [t.name for t in graph.initializer]
    defined += [o for node in graph.node for o in node.output]
    for n in defined:
        if n and n not in keep:
            mapping[n] = n + suffix
    for k, node in enumerate(graph.node):
        node.name = (node.name or f"{node.op_type}_{k}") + suffix
        _remap(node.input, mapping)
        _remap(node.output, mapping)
        for sub in subgraphs(node):
            rename_values(sub, suffix, frozenset(), mapping)
    for vi in (*graph.input, *graph.output, *graph.value_info):
        vi.name = mapping.get(vi.name, vi.name)
    for t in graph.initializer:
        t.name = mapping.get(t.name, t.name)


def _remap(field: MutableSequence[str], mapping: Mapping[str, str]) -> None:
    names = [mapping.get(n, n) if n else n for n in field]
    del field[:]
    field.extend(names)
