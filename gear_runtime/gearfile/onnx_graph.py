"""General ONNX graph helpers (no gear-file names): what the compiler and the reader both
walk graphs with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import onnx


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
        plan = _TEXT_PLANS[desc] = (tuple(kinds[0]), tuple(kinds[1]), tuple(kinds[2]),
                                    tuple(kinds[3]))
    return plan


def first_bad_text(message: Any,
                   skip_graph: Callable[[onnx.GraphProto], bool] | None = None) -> str | None:
    """``"Type.field"`` of the first string field in ``message`` or below it that is not
    valid UTF-8, else None. ONNX's protobuf is proto2: some protobuf builds hand such a field
    back as ``bytes`` instead of refusing the file, and every name would then fail later with a
    TypeError. Bytes fields (weights' data) are never touched. Graphs for which
    ``skip_graph(graph)`` is true are not walked (the caller checks them when it uses them)."""
    stack = [message]
    graph_type = onnx.GraphProto.DESCRIPTOR
    while stack:
        m = stack.pop()
        desc = m.DESCRIPTOR
        if skip_graph is not None and desc is graph_type and skip_graph(m):
            continue
        one, many, sub, subs = _text_plan(desc)
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

