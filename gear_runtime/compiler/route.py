"""The root graph around the branches: GE's Case structure, or the sink routing.

``build_case_model``: GE's multi-batch structure (docs/ge-notes.md section 4): Data inputs
shaped to the largest gear + ``ascend_mbatch_shape_data`` -> MapIndex(dims, gear table) ->
Case(index, inputs...) with GE's attributes. Custom domain; a description of the compiled
model for backends that build their own executables per gear, not runnable by stock ORT.

``build_sink_model``: GE's GetNext-sink mode, runnable by stock ONNX Runtime: the dims are
computed from the inputs' shapes inside the graph (GetDynamicDims), matched against the gear
table into a branch index (-1 on a miss), routed through a balanced tree of ``If`` nodes (depth
ceil(log2 G) + 1) to the gear's branch, and returned as the LAST output
``ascend_mbatch_shape_data`` (int32, like the ACL dims input; GE wires GetDynamicDims as the
last input of NetOutput). A miss returns EMPTY outputs (the right dtype and rank, 0 on the
first axis and on every axis that differs between gears; a rank-0 output becomes shape [0]
since a scalar cannot be empty), so it is detectable and never runs a wrong gear; in hybrid
mode a miss runs the dynamic-shape graph instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gear_runtime.compiler.branch import dynamic_inputs, static_inputs
from gear_runtime.compiler.check import GraphInfo, TensorInfo
from gear_runtime.errors import CompileError
from gear_runtime.gearfile import passthrough
from gear_runtime.gearfile.format import (
    ACL_DYNAMIC_TENSOR_NAME,
    ATTR_BATCH_NUM,
    ATTR_BRANCHES,
    ATTR_DYNAMIC_GRAPH,
    ATTR_DYNAMIC_OUTPUT_DIMS,
    ATTR_DYNAMIC_TYPE,
    ATTR_INSERT_BY_MBATCH,
    ATTR_PRED_VALUE,
    ATTR_SHAPE_ORDER,
    BRANCH_INDEX_NAME,
    DOMAIN,
    DOMAIN_VERSION,
    DYNAMIC_TYPES,
    GEAR_TABLE_NAME,
    OP_CASE,
    OP_MAP_INDEX,
    RESERVED_PREFIX,
    case_gear_table,
    format_output_dims,
    routing_output_name,
    sink_gear_table,
)
from gear_runtime.spec import GearSpec

Shapes = Sequence[Sequence[tuple[int, ...]]]   # [gear][output] static shape

#: Lowest ai.onnx opset the sink routing is written for (int64 Less/Equal, If with outer scope).
SINK_MIN_OPSET = 11
#: First opset where the axes of ReduceSum / ReduceMin are an input instead of an attribute.
_AXES_AS_INPUT = {"ReduceSum": 13, "ReduceMin": 18}


# ---- shared -----------------------------------------------------------------------------------
def root_output_dims(info: GraphInfo, shapes: Shapes, hybrid: bool,
                     miss: Sequence[tuple[int, ...]] | None = None) -> list[list[int | str]]:
    """Declared dims of each root output: static where every gear agrees (and, hybrid, the
    original model fixes that dim too; and, given the ``miss`` shapes of a sink file, a miss
    returns that value too), symbolic otherwise (the original dim name when it had one).
    ONNX wants a shape on every root output: an output whose rank differs between gears is
    declared with gear 0's rank, all symbolic; a scalar stays rank 0 even though a sink miss
    returns shape [0] (ONNX Runtime then logs a shape warning on that miss)."""
    out: list[list[int | str]] = []
    for k, t in enumerate(info.outputs):
        ranks = {len(s[k]) for s in shapes}
        rank = len(shapes[0][k])
        if len(ranks) != 1:
            out.append([f"{t.name}_dim{axis}" for axis in range(rank)])
            continue
        dims: list[int | str] = []
        for axis in range(rank):
            values = {s[k][axis] for s in shapes}
            orig = t.dims[axis] if t.dims is not None and axis < len(t.dims) else None
            static = len(values) == 1
            value = next(iter(values))
            if (hybrid and orig != value) or (miss is not None and miss[k][axis] != value):
                static = False
            if static:
                dims.append(value)
            else:
                dims.append(orig if isinstance(orig, str) else f"{t.name}_dim{axis}")
        out.append(dims)
    return out


def _new_model(source: onnx.ModelProto, extra_domain: bool) -> onnx.ModelProto:
    """The root model's header (opsets, IR version, docs, metadata) and its graph's name and
    weights; the graph is filled IN PLACE by the caller (``helper.make_model(graph)`` would
    copy a finished graph, branches and all: hundreds of MB on a graph of 200k nodes)."""
    opsets = [o for o in source.opset_import if o.domain != DOMAIN]
    if extra_domain:
        opsets.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    model = helper.make_model(onnx.GraphProto(name=source.graph.name or "gear_model"),
                              opset_imports=opsets, producer_name="gear_runtime")
    # the weights are no longer listed as inputs (IR < 4 style): IR 4 allows that
    model.ir_version = max(int(source.ir_version), 4)
    model.doc_string = source.doc_string
    model.metadata_props.extend(source.metadata_props)
    model.graph.initializer.extend(source.graph.initializer)
    return model


def _moved_graphs(node: onnx.NodeProto, name: str, graphs: list[onnx.GraphProto]) -> None:
    """Attribute ``name`` of ``node``: ``graphs``, each copied in and dropped from the list at
    once, so that no graph is held twice for longer than its own copy (the caller keeps no
    other reference)."""
    attr = node.attribute.add()
    attr.name, attr.type = name, onnx.AttributeProto.GRAPHS
    while graphs:
        attr.graphs.add().CopyFrom(graphs.pop(0))


def routing_outputs(info: GraphInfo, spec: GearSpec) -> list[str]:
    """Names of the Case / top If outputs: the model's output names, except an output that is
    a root input or weight itself (a passthrough): a node cannot produce it again (SSA), so
    the routing node writes ``ascend_mbatch_out_<k>`` (unused) and the root output is that
    input or weight directly, whatever the gear."""
    roots = set(spec.input_names) | set(info.weights)
    return [routing_output_name(k) if t.name in roots else t.name
            for k, t in enumerate(info.outputs)]


def _declare_outputs(info: GraphInfo, dims: Sequence[list[int | str]]
                     ) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(t.name, t.elem_type, d)
            for t, d in zip(info.outputs, dims, strict=True)]


# ---- kind "case" ------------------------------------------------------------------------------
def build_case_model(source: onnx.ModelProto, info: GraphInfo, spec: GearSpec,
                     branches: list[onnx.GraphProto], shapes: Shapes,
                     dynamic: onnx.GraphProto | None) -> onnx.ModelProto:
    """The GE-structured root model (see the module docstring). ``branches`` is emptied:
    each branch moves into the Case node (:func:`_moved_graphs`)."""
    model = _new_model(source, extra_domain=True)
    g = model.graph
    g.input.extend(static_inputs(info, spec.input_names, spec.largest_shapes()))
    g.input.append(helper.make_tensor_value_info(ACL_DYNAMIC_TENSOR_NAME, TensorProto.INT32,
                                                 [spec.values_per_gear]))
    g.initializer.append(numpy_helper.from_array(case_gear_table(spec), GEAR_TABLE_NAME))
    g.node.append(helper.make_node(
        OP_MAP_INDEX, [ACL_DYNAMIC_TENSOR_NAME, GEAR_TABLE_NAME], [BRANCH_INDEX_NAME],
        name=f"{RESERVED_PREFIX}MapIndex", domain=DOMAIN))
    attrs: dict[str, object] = {
        ATTR_BATCH_NUM: spec.gear_count,
        ATTR_SHAPE_ORDER: list(spec.input_names),
        ATTR_DYNAMIC_TYPE: DYNAMIC_TYPES[spec.mode],
        ATTR_INSERT_BY_MBATCH: 1,
        ATTR_BRANCHES: branches,
        ATTR_DYNAMIC_OUTPUT_DIMS: format_output_dims(shapes),
    }
    for i, gear in enumerate(spec.gears):
        attrs[f"{ATTR_PRED_VALUE}{i}"] = list(gear)
    if dynamic is not None:
        attrs[ATTR_DYNAMIC_GRAPH] = dynamic
    case = g.node.add()
    case.CopyFrom(helper.make_node(OP_CASE, [BRANCH_INDEX_NAME, *spec.input_names],
                                   routing_outputs(info, spec), name=f"{RESERVED_PREFIX}Case",
                                   domain=DOMAIN))
    for key in sorted(attrs):  # make_node's order: by name
        if key == ATTR_BRANCHES:
            _moved_graphs(case, key, branches)
        elif key == ATTR_DYNAMIC_GRAPH:
            assert dynamic is not None  # the key is there only with that graph
            attr = case.attribute.add()
            attr.name, attr.type = key, onnx.AttributeProto.GRAPH
            attr.g.CopyFrom(dynamic)
        else:
            case.attribute.append(helper.make_attribute(key, attrs[key]))
    # The source graph is always kept (the ORT backend runs it); only a hybrid file runs it
    # on a miss, which is what makes a root output dim dynamic.
    g.output.extend(_declare_outputs(info, root_output_dims(info, shapes, spec.hybrid)))
    return model


# ---- kind "sink" ------------------------------------------------------------------------------
def miss_shapes(shapes: Shapes, output_count: int) -> list[tuple[int, ...]]:
    """The empty shape a miss returns per output: 0 on axis 0 and on every axis that differs
    between gears, the common value elsewhere; rank 0 -> (0,)."""
    out: list[tuple[int, ...]] = []
    for k in range(output_count):
        first = shapes[0][k]
        if not first:
            out.append((0,))
            continue
        dims = [0 if axis == 0 or any(len(s[k]) <= axis or s[k][axis] != d for s in shapes)
                else d for axis, d in enumerate(first)]
        out.append(tuple(dims))
    return out


class _Names:
    """Fresh reserved value names for the routing nodes."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, what: str) -> str:
        self.count += 1
        return f"{RESERVED_PREFIX}{what}_{self.count}"


def _const(names: _Names, what: str, value: np.ndarray) -> tuple[onnx.NodeProto, str]:
    name = names(what)
    return helper.make_node("Constant", [], [name], name=f"{name}_node",
                            value=numpy_helper.from_array(value, name)), name


def _reduce(op: str, x: str, out: str, axis: int, opset: int, names: _Names
            ) -> list[onnx.NodeProto]:
    if opset >= _AXES_AS_INPUT[op]:
        node, axes = _const(names, "axes", np.asarray([axis], np.int64))
        return [node, helper.make_node(op, [x, axes], [out], name=f"{out}_node", keepdims=0)]
    return [helper.make_node(op, [x], [out], name=f"{out}_node", axes=[axis], keepdims=0)]


def _dims_nodes(spec: GearSpec, names: _Names) -> tuple[list[onnx.NodeProto], str]:
    """GetDynamicDims: every dynamic position's dim, int64 [P], in dynamic_positions order."""
    nodes: list[onnx.NodeProto] = []
    parts = []
    for i, name in enumerate(spec.input_names):
        axes = [axis for inp, axis, _ in spec.dynamic_positions if inp == i]
        if not axes:
            continue
        shape = names("shape_of")
        nodes.append(helper.make_node("Shape", [name], [shape], name=f"{shape}_node"))
        idx_node, idx = _const(names, "axes", np.asarray(axes, np.int64))
        part = names("dims_of")
        nodes += [idx_node, helper.make_node("Gather", [shape, idx], [part],
                                             name=f"{part}_node", axis=0)]
        parts.append(part)
    dims = names("dims")
    nodes.append(helper.make_node("Concat", parts, [dims], name=f"{dims}_node", axis=0))
    return nodes, dims


def _index_nodes(spec: GearSpec, dims: str, opset: int, names: _Names
                 ) -> list[onnx.NodeProto]:
    """dims -> BRANCH_INDEX_NAME (int64 scalar): the gear whose table row equals dims, -1 if
    none. Gears are unique, so at most one row matches: index = sum(match * (g + 1)) - 1."""
    nodes = [helper.make_node("Constant", [], [GEAR_TABLE_NAME], name=f"{GEAR_TABLE_NAME}_node",
                              value=numpy_helper.from_array(sink_gear_table(spec),
                                                            GEAR_TABLE_NAME))]
    eq, eq_i, match, ranked, total = (names(w) for w in
                                      ("eq", "eq_i64", "match", "ranked", "ranked_sum"))
    nodes += [helper.make_node("Equal", [GEAR_TABLE_NAME, dims], [eq], name=f"{eq}_node"),
              helper.make_node("Cast", [eq], [eq_i], name=f"{eq_i}_node", to=TensorProto.INT64)]
    nodes += _reduce("ReduceMin", eq_i, match, 1, opset, names)
    rank_node, ranks = _const(names, "gear_rank", np.arange(1, spec.gear_count + 1,
                                                             dtype=np.int64))
    one_node, one = _const(names, "one", np.asarray(1, np.int64))
    nodes += [rank_node, helper.make_node("Mul", [match, ranks], [ranked], name=f"{ranked}_node")]
    nodes += _reduce("ReduceSum", ranked, total, 0, opset, names)
    nodes += [one_node, helper.make_node("Sub", [total, one], [BRANCH_INDEX_NAME],
                                         name=f"{BRANCH_INDEX_NAME}_node")]
    return nodes


def _dims_output_nodes(spec: GearSpec, dims: str, names: _Names) -> list[onnx.NodeProto]:
    """The gear values (first position of each value index) as int32: the last output."""
    first = []
    for v in range(spec.values_per_gear):
        first.append(next(p for p, (_, _, val) in enumerate(spec.dynamic_positions) if val == v))
    idx_node, idx = _const(names, "value_pos", np.asarray(first, np.int64))
    values = names("values")
    return [idx_node,
            helper.make_node("Gather", [dims, idx], [values], name=f"{values}_node", axis=0),
            helper.make_node("Cast", [values], [ACL_DYNAMIC_TENSOR_NAME],
                             name=f"{ACL_DYNAMIC_TENSOR_NAME}_node", to=TensorProto.INT32)]


def as_if_branch(graph: onnx.GraphProto) -> onnx.GraphProto:
    """A branch graph as an If subgraph: no declared inputs (it reads the root inputs and
    weights from the outer scope); outputs that were its inputs get passthrough Identities."""
    g = onnx.GraphProto()
    g.CopyFrom(graph)
    del g.input[:]
    passthrough.wrap(g)
    return g


def _untyped_outputs(info: GraphInfo, names: Sequence[str]) -> list[onnx.ValueInfoProto]:
    # no shapes on routing outputs: branches produce different shapes (ORT merges them)
    return [helper.make_tensor_value_info(n, t.elem_type, None)
            for n, t in zip(names, info.outputs, strict=True)]


def _miss_graph(info: GraphInfo, empty: Sequence[tuple[int, ...]], tag: str) -> onnx.GraphProto:
    nodes, outs = [], []
    for t, shape in zip(info.outputs, empty, strict=True):
        name = f"{RESERVED_PREFIX}miss_{tag}_{t.name}"
        nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_node",
                                      value=_empty_tensor(t, shape, name)))
        outs.append(name)
    return helper.make_graph(nodes, f"{RESERVED_PREFIX}miss_{tag}", [],
                             _untyped_outputs(info, outs))


def _empty_tensor(t: TensorInfo, shape: tuple[int, ...], name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros(shape, dtype=t.dtype), name)


def _route(lo: int, hi: int, out_names: Sequence[str], leaves: Sequence[onnx.GraphProto],
           miss: onnx.GraphProto, empty: Sequence[tuple[int, ...]], info: GraphInfo,
           names: _Names) -> list[onnx.NodeProto]:
    """Nodes that set ``out_names`` to the outputs of gear ``BRANCH_INDEX_NAME`` when it lies
    in [lo, hi); a leaf compares index == lo. A miss (-1) always reaches leaf 0, whose else
    branch is ``miss``; the other leaves' else branches are unreachable and get small empty
    constants (``empty`` shapes) so that the dynamic graph is stored once."""
    if hi - lo == 1:
        c_node, c = _const(names, f"gear_{lo}", np.asarray(lo, np.int64))
        cond = names(f"is_gear_{lo}")
        else_branch = miss if lo == 0 else _miss_graph(info, empty, str(lo))
        return [c_node,
                helper.make_node("Equal", [BRANCH_INDEX_NAME, c], [cond], name=f"{cond}_node"),
                helper.make_node("If", [cond], list(out_names), name=f"{RESERVED_PREFIX}leaf_{lo}",
                                 then_branch=leaves[lo], else_branch=else_branch)]
    mid = (lo + hi) // 2
    c_node, c = _const(names, f"below_{mid}", np.asarray(mid, np.int64))
    cond = names(f"is_below_{mid}")
    sides = []
    for a, b in ((lo, mid), (mid, hi)):
        sub_out = [f"{RESERVED_PREFIX}route_{a}_{b}_{k}" for k in range(len(out_names))]
        sub_nodes = _route(a, b, sub_out, leaves, miss, empty, info, names)
        sides.append(helper.make_graph(sub_nodes, f"{RESERVED_PREFIX}route_{a}_{b}", [],
                                       _untyped_outputs(info, sub_out)))
    return [c_node,
            helper.make_node("Less", [BRANCH_INDEX_NAME, c], [cond], name=f"{cond}_node"),
            helper.make_node("If", [cond], list(out_names),
                             name=f"{RESERVED_PREFIX}route_{lo}_{hi}",
                             then_branch=sides[0], else_branch=sides[1])]


def check_sink_opset(info: GraphInfo) -> None:
    """CompileError unless the model's ai.onnx opset is one the sink routing is written for
    (checked before any gear is compiled)."""
    if info.opset < SINK_MIN_OPSET:
        raise CompileError(f"sink mode needs ai.onnx opset >= {SINK_MIN_OPSET}, the model has "
                           f"{info.opset}; convert it with onnx.version_converter first")


def build_sink_model(source: onnx.ModelProto, info: GraphInfo, spec: GearSpec,
                     branches: Sequence[onnx.GraphProto], shapes: Shapes,
                     dynamic: onnx.GraphProto | None) -> onnx.ModelProto:
    """The stock-ORT-runnable root model (see the module docstring); the model passed
    :func:`check_sink_opset`."""
    names = _Names()
    model = _new_model(source, extra_domain=False)
    g = model.graph
    g.input.extend(dynamic_inputs(info, spec.input_names, spec.input_shapes))
    dim_nodes, dims = _dims_nodes(spec, names)
    g.node.extend(dim_nodes)
    g.node.extend(_index_nodes(spec, dims, info.opset, names))
    g.node.extend(_dims_output_nodes(spec, dims, names))
    empty = miss_shapes(shapes, len(info.outputs))
    miss = (as_if_branch(dynamic) if dynamic is not None
            else _miss_graph(info, empty, "0"))
    leaves = [as_if_branch(b) for b in branches]
    g.node.extend(_route(0, spec.gear_count, routing_outputs(info, spec), leaves, miss, empty,
                         info, names))
    hybrid = dynamic is not None  # a hybrid miss runs the dynamic graph: nothing is emptied
    g.output.extend(_declare_outputs(
        info, root_output_dims(info, shapes, hybrid, miss=None if hybrid else empty)))
    g.output.append(helper.make_tensor_value_info(ACL_DYNAMIC_TENSOR_NAME, TensorProto.INT32,
                                                  [spec.values_per_gear]))
    return model
