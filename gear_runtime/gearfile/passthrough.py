"""Passthrough outputs, in one place: a graph output that no node of the graph computes (it is
an input or a weight as it stands).

Two consumers need such an output computed inside the graph, by an Identity node named
``ascend_mbatch_passthrough_<graph>_<k>``
(:data:`~gear_runtime.gearfile.format.PASSTHROUGH_PREFIX`):

* the compiler (:mod:`gear_runtime.compiler`): an If / Case subgraph must produce its outputs
  inside it, so branch graphs get these nodes (:func:`wrap`, inputs count as produced);
* the ONNX Runtime backend: ORT hands an uncomputed output back as the input's or the
  initializer's own value and never writes a pre-bound output buffer, so the session's graph
  gets them too (:func:`wrap` with ``inputs_count=False``).

The reader (:mod:`gear_runtime.gearfile.reader`) removes them (:func:`unwrap`) when it rebuilds a
standalone model, so a branch's outputs carry the model's own names again.
"""

from __future__ import annotations

import onnx
from onnx import helper

from gear_runtime.gearfile.format import PASSTHROUGH_PREFIX


def wrap(graph: onnx.GraphProto, *, inputs_count: bool = True) -> None:
    """Give every output of ``graph`` that no node of it produces an Identity of its own, in
    place; the output is renamed to the Identity's output. ``inputs_count``: an output that
    is a declared graph input counts as produced (enough for a subgraph; not for ORT's
    pre-bound outputs)."""
    local = {o for n in graph.node for o in n.output}
    if inputs_count:
        local |= {vi.name for vi in graph.input}
    for k, o in enumerate(graph.output):
        if o.name in local:
            continue
        new = f"{PASSTHROUGH_PREFIX}{graph.name}_{k}"
        graph.node.append(helper.make_node("Identity", [o.name], [new], name=new))
        o.name = new


def unwrap(graph: onnx.GraphProto) -> None:
    """Drop the passthrough Identities of ``graph`` in place, giving their outputs back the
    original names. ValueError when a node named as one is not a one-input, one-output
    Identity (a tampered file)."""
    passthrough = [n for n in graph.node if n.name.startswith(PASSTHROUGH_PREFIX)]
    for n in passthrough:
        if n.op_type != "Identity" or len(n.input) != 1 or len(n.output) != 1:
            raise ValueError(f"passthrough node {n.name!r} is not a one-input, one-output "
                             "Identity")
    rename = {n.output[0]: n.input[0] for n in passthrough}
    keep = [n for n in graph.node if not n.name.startswith(PASSTHROUGH_PREFIX)]
    del graph.node[:]
    graph.node.extend(keep)
    for o in graph.output:
        o.name = rename.get(o.name, o.name)
