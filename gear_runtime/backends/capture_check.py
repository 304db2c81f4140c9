"""What in a graph makes a CUDA graph refuse to build or replay wrong: read from the ONNX graph
alone, before any session exists (pure onnx, no ORT call; docs/cuda.md has the sources).

Two kinds of hazard, each a sentence naming the node (and the input) it is about:

* **control flow**: any node with a subgraph (If, Loop, Scan). ORT refuses to create a session
  with graph capture for such a model (``HasControlflowNodes`` in inference_session.cc tests
  ``node.ContainsSubgraph()``; the 1.32 binary carries the message "as the model has control
  flow nodes which can't be supported by CUDA Graphs").
* **an input's VALUE feeding a shape computation**: the CUDA EP reads the shape-like inputs of
  Reshape, Expand, Slice, Tile, ... on the CPU, and ORT places the small subgraph computing
  them on the CPU too. A graph input bound on the GPU reaches such a CPU node through a copy
  ORT makes at bind / feed time, outside the captured graph, so a replay reuses the value seen
  at capture: the graph computes with a frozen shape and returns wrong results, silently (ORT
  only logs "shape massaging nodes ... Use the graph capture feature with caution", which a
  session at log level 4 never shows). Nodes whose OUTPUT shape follows input values
  (NonZero, Unique, Compress, NonMaxSuppression) freeze the same way. ``Shape`` and ``Size``
  read only a tensor's shape, which is static within a gear, so a path through them is safe.

The same freeze hits com.microsoft kernels with CPU inputs (:data:`CONTRIB_CPU_INPUTS`), and
ops drawing random numbers replay the capture's draw (:data:`RANDOM_OPS`).

Memcpy nodes (compute nodes ORT put on the CPU) are known only once ORT has partitioned the
graph: ORT refuses such a session itself, and the backend treats that refusal as a hazard too.
"""

from __future__ import annotations

import onnx

#: op -> the input positions whose VALUES decide a shape (the CUDA EP takes them on the CPU:
#: InputMemoryType(OrtMemTypeCPUInput, i) in the kernels' registrations); ``None``: every
#: input (the op's output shape follows its input values).
SHAPE_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "Resize": (1, 2, 3), "Upsample": (1,),
    "Pad": (1, 2, 3), "TopK": (1,), "OneHot": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "CumSum": (1,), "Trilu": (1,), "ReduceSum": (1,), "ReduceMean": (1,),
    "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,),
    "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "NonZero": None, "Unique": None, "Compress": (1,), "NonMaxSuppression": None,
}
#: com.microsoft ops with inputs the CUDA EP takes on the CPU (the contrib kernels'
#: registrations): GroupQueryAttention's total_sequence_length (input 6,
#: contrib_ops/cuda/bert/group_query_attention.cc) decides how much of the KV cache is read.
CONTRIB_CPU_INPUTS: dict[str, tuple[int, ...]] = {"GroupQueryAttention": (6,)}
#: ops drawing random numbers: ORT's CUDA kernels take the generator's seed and offset as
#: kernel arguments set on the host per run, so a captured graph replays the capture's draw
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})
#: ops whose output depends on their input's shape only, never its values
SHAPE_ONLY = frozenset({"Shape", "Size"})


def capture_hazards(graph: onnx.GraphProto) -> list[str]:
    """Every reason a CUDA graph of ``graph`` would be refused or replay wrong (empty: none
    found). Control-flow nodes first, then each (node, input) whose value feeds a shape."""
    hazards = [f"{node.op_type} node {node.name or node.output[0]!r} has a subgraph (control "
               "flow: ORT refuses CUDA graphs for it)"
               for node in graph.node
               if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                      for a in node.attribute)]
    hazards += [f"{node.op_type} node {node.name or node.output[0]!r} draws random numbers (a "
                "CUDA graph would replay the draw made at capture)"
                for node in graph.node if node.op_type in RANDOM_OPS]
    hazards += [f"the value of input {name!r} feeds input {pos} of {node.op_type} node "
                f"{node.name or node.output[0]!r} (a shape computation ORT runs on the "
                "CPU: a CUDA graph would replay the value seen at capture)"
                for node, pos, name in _cpu_feeds(graph)]
    return hazards


def cpu_read_inputs(graph: onnx.GraphProto) -> set[str]:
    """The graph inputs whose VALUES the CUDA EP reads on the CPU (a kernel input it takes on
    the CPU, or the CPU subgraph computing one). ORT copies such an input at BIND time when it
    is bound on the GPU (``IOBinding::BindInput`` -> ``utils::CopyOneInputAcrossDevices``,
    core/session/IOBinding.cc, core/framework/utils.cc), so its bytes must be on the device
    before the bind: the device tests' host-memory double copies exactly these at bind."""
    return {name for _, _, name in _cpu_feeds(graph)}


def _cpu_feeds(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, int, str]]:
    """(node, input position, graph input) for each graph input whose value reaches an input
    the CUDA EP reads on the CPU (not through Shape / Size), in node order."""
    producers = {out: node for node in graph.node for out in node.output if out}
    inputs = {v.name for v in graph.input} - {t.name for t in graph.initializer}
    found = []
    for node in graph.node:
        slots = _cpu_inputs(node)
        for pos in range(len(node.input)) if slots is None else slots:
            if pos < len(node.input) and node.input[pos]:
                found += [(node, pos, name) for name in
                          sorted(_inputs_feeding(node.input[pos], producers, inputs))]
    return found


def _cpu_inputs(node: onnx.NodeProto) -> tuple[int, ...] | None:
    """The input positions of ``node`` the CUDA EP reads on the CPU (None: all of them)."""
    if node.domain == "com.microsoft":
        return CONTRIB_CPU_INPUTS.get(node.op_type, ())
    if node.domain not in ("", "ai.onnx"):
        return ()
    return SHAPE_INPUTS.get(node.op_type, ())


def _inputs_feeding(tensor: str, producers: dict[str, onnx.NodeProto],
                    inputs: set[str]) -> set[str]:
    """The graph inputs whose VALUES ``tensor`` depends on (not through Shape / Size)."""
    found: set[str] = set()
    seen: set[str] = set()
    stack = [tensor]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
            continue
        node = producers.get(name)
        if node is None or node.op_type in SHAPE_ONLY:
            continue  # an initializer, or a value independent of every input's values
        stack.extend(i for i in node.input if i)
    return found


__all__ = ["CONTRIB_CPU_INPUTS", "RANDOM_OPS", "SHAPE_INPUTS", "capture_hazards",
           "cpu_read_inputs"]
