"""Input guards: request values that a kernel turns into a memory offset, checked before the run.

ONNX Runtime's GroupQueryAttention (com.microsoft) takes ``seqlens_k`` (per batch row, the
row's total length minus one) and ``total_sequence_length``, computed in the graph from the
request (onnxruntime-genai's builder and :mod:`gear_runtime.examples.gqa_lm`:
``ReduceSum(attention_mask) - 1`` and ``Shape(attention_mask)[1]``). Its CPU kernel
(``gqa_attention_base.h``) reads ``n = seqlens_k[b] + 1`` rows of the present buffer and,
outside a first prompt (``S == total_sequence_length``), writes the step's ``S`` new rows at
``n - S``, all in unsigned arithmetic: before ONNX Runtime 1.25 nothing bounded them, so an
all-zero mask (``n = 0``) or one longer than the cache wrote outside the KV buffer. The rotary
embedding reads ``cos_cache`` / ``sin_cache`` at the positions ``n - S .. n - 1``.

:func:`find_guards` finds those kernels in the graph ONNX Runtime runs, and the small part
of the graph that computes their ``seqlens_k`` and ``total_sequence_length`` from the
request (a "cone" of at most :data:`MAX_CONE_NODES` standard nodes). :class:`KernelGuard`
runs that cone on the staged request of every run (what the kernel will see, padding
included) and refuses, with :class:`~gear_runtime.errors.InputError`, any row that is not
``1 <= n <= L`` (``L``: the cache's rows, and the rotary table's where the kernel rotates)
and, outside a first prompt, ``n >= S``. The check is the same on every path that runs an
executor (execute, ``pad=True``, ``out=``, resident state, the server), and on every ONNX
Runtime version, so the floor of the supported range is as safe as the newest release.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gear_runtime.errors import InputError

logger = logging.getLogger("gear_runtime")

#: A cone larger than this is not a mask computation: no guard is built (logged).
MAX_CONE_NODES = 64
#: Initializers a cone may copy (constants of the mask arithmetic, never weights).
MAX_CONE_CONST_BYTES = 1 << 16

_GQA = ("GroupQueryAttention", "com.microsoft")
_SEQLENS, _TOTAL, _PAST_KEY, _COS = 5, 6, 3, 7


@dataclass(frozen=True)
class _Attention:
    """One GroupQueryAttention node: its tensors and where its sizes come from."""

    name: str
    seqlens: str
    total: str
    #: the cache's rows: (graph input name, axis) or (output name, axis), or a fixed value
    rows: tuple[str, int] | int | None
    #: the step's tokens (the query's axis 1): a fixed value, (graph input, axis), or None
    tokens: tuple[str, int] | int | None
    #: rows of the rotary table where the kernel rotates (do_rotary), else None
    rotary_rows: int | None


class KernelGuard:
    """The checks of one model's attention kernels, over its staged requests.

    ``cone``: an onnxruntime InferenceSession computing every kernel's ``seqlens_k`` and
    ``total_sequence_length`` from the request inputs ``cone_inputs``; built once per model,
    run by any executor's thread (ORT sessions run concurrently)."""

    def __init__(self, attentions: Sequence[_Attention], cone: Any,
                 cone_inputs: Sequence[str]) -> None:
        self.attentions = tuple(attentions)
        self._cone = cone
        self._cone_outputs = [o.name for o in cone.get_outputs()]
        self.cone_inputs = tuple(cone_inputs)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The request inputs the kernels' offsets are computed from."""
        return self.cone_inputs

    def check(self, feeds: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]],
              outputs: Mapping[str, Sequence[int]]) -> None:
        """InputError naming the kernel, the row and the bounds unless every row of every
        kernel stays within its buffers. ``feeds``: the cone's inputs as staged for the run;
        ``shapes`` / ``outputs``: the run's static input / output shapes by name."""
        values = dict(zip(self._cone_outputs, self._cone.run(None, dict(feeds)), strict=True))
        for att in self.attentions:
            self._check_one(att, values, shapes, outputs)

    def _check_one(self, att: _Attention, values: Mapping[str, np.ndarray],
                   shapes: Mapping[str, Sequence[int]],
                   outputs: Mapping[str, Sequence[int]]) -> None:
        lengths = np.asarray(values[att.seqlens], dtype=np.int64).reshape(-1) + 1
        total = int(np.asarray(values[att.total]).reshape(-1)[0])
        rows = _size(att.rows, shapes, outputs)
        tokens = _size(att.tokens, shapes, outputs)
        limit = min(x for x in (rows, att.rotary_rows) if x is not None) \
            if rows is not None or att.rotary_rows is not None else None
        prompt = tokens is not None and tokens == total
        low = 1 if prompt or tokens is None else tokens
        for b, n in enumerate(lengths.tolist()):
            if n < low or (limit is not None and n > limit):
                raise InputError(self._refusal(att, b, n, low, limit, tokens, prompt))

    def _refusal(self, att: _Attention, row: int, n: int, low: int, limit: int | None,
                 tokens: int | None, prompt: bool) -> str:
        inputs = " / ".join(self.cone_inputs)
        bound = f"{low}..{limit}" if limit is not None else f">= {low}"
        why = ("a first prompt" if prompt else
               f"a step of {tokens} token(s) writes at n - {tokens}" if tokens else "the step")
        return (f"{inputs}: row {row} gives {att.name} (GroupQueryAttention) a length of {n} "
                f"(seqlens_k + 1); it must be {bound} ({why}; the cache holds "
                f"{limit if limit is not None else 'an unknown number of'} rows): the kernel "
                "would read or write outside its KV buffer. Check the attention mask: its "
                "row sums are the lengths")


def _size(source: tuple[str, int] | int | None, shapes: Mapping[str, Sequence[int]],
          outputs: Mapping[str, Sequence[int]]) -> int | None:
    if source is None or isinstance(source, int):
        return source
    name, axis = source
    shape = shapes.get(name, outputs.get(name))
    if shape is None or len(shape) <= axis or int(shape[axis]) < 0:
        return None
    return int(shape[axis])


def find_guards(graph: Any, opset_imports: Iterable[Any],
                weights: Mapping[str, Any] | None = None,
                weight_value: Callable[[str], np.ndarray] | None = None) -> KernelGuard | None:
    """The guard of ``graph`` (an onnx GraphProto ONNX Runtime runs), or None when it has no
    GroupQueryAttention, or when their lengths are not computed from the request by a small
    cone of standard nodes (logged: such a model runs unguarded, as before). ``weights``:
    initializers kept outside the graph (a gear file's shared weights: name -> TensorProto,
    its data possibly external) and ``weight_value`` reading one's values (only the cone's
    few constants are read)."""
    found = _lengths_cone(graph, weights, weight_value)
    if found is None:
        return None
    import onnxruntime as ort
    from onnx import helper, shape_inference

    nodes, targets, (cone_nodes, cone_inputs, consts) = found
    model = helper.make_model(
        helper.make_graph(cone_nodes, "gear_guard",
                          [i for i in graph.input if i.name in cone_inputs],
                          [helper.make_tensor_value_info(t, 6, None) for t in targets], consts),
        opset_imports=[o for o in opset_imports if (o.domain or "") in ("", "ai.onnx")])
    model.ir_version = min(model.ir_version, 8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    tensors = {**(weights or {}), **{i.name: i for i in graph.initializer}}
    tokens = _query_tokens(graph, nodes, tensors, list(opset_imports), shape_inference,
                           helper)
    attentions = [_attention(graph, n, t, tensors) for n, t in zip(nodes, tokens, strict=True)]
    return KernelGuard(attentions, session, [i.name for i in graph.input
                                             if i.name in cone_inputs])


def guarded_inputs(graph: Any, weight_value: Callable[[str], np.ndarray] | None = None
                   ) -> frozenset[str]:
    """The graph inputs :func:`find_guards` would check (an attention mask), found without
    building its guard: what compile's probe run feeds valid values."""
    found = _lengths_cone(graph, None, weight_value)
    return frozenset(found[2][1]) if found is not None else frozenset()


def _lengths_cone(graph: Any, weights: Mapping[str, Any] | None,
                  weight_value: Callable[[str], np.ndarray] | None
                  ) -> tuple[list[Any], list[str], tuple[list[Any], set[str], list[Any]]] | None:
    """(the GroupQueryAttention nodes, their length tensors, the cone computing those from
    the request: :func:`_cone`), or None without such a node or such a cone (logged)."""
    nodes = [n for n in graph.node if (n.op_type, n.domain or "") == _GQA
             and len(n.input) > _TOTAL and n.input[_SEQLENS] and n.input[_TOTAL]]
    if not nodes:
        return None
    targets = sorted({t for n in nodes for t in (n.input[_SEQLENS], n.input[_TOTAL])})
    cone = _cone(graph, targets, _constants(graph, weights or {}, weight_value))
    if cone is None:
        logger.warning("GroupQueryAttention lengths are not computed from the request by a "
                       "small standard subgraph: its inputs are not checked before runs")
        return None
    return nodes, targets, cone


#: what :func:`_constants` answers for an initializer a cone may not copy
_TOO_BIG = object()


def _constants(graph: Any, outside: Mapping[str, Any],
               weight_value: Callable[[str], np.ndarray] | None) -> Callable[[str], Any]:
    """name -> that initializer as an in-memory TensorProto a cone can copy (a small one;
    read through ``weight_value`` where its data is in a file), :data:`_TOO_BIG` for one it
    may not copy (large, or in a file with no reader), None for no initializer. Reads only
    what is asked."""
    from onnx import numpy_helper

    inline = {i.name: i for i in graph.initializer}

    def resolve(name: str) -> Any:
        tensor = inline.get(name, outside.get(name))
        if tensor is None:
            return None
        if _tensor_bytes(tensor) > MAX_CONE_CONST_BYTES:
            return _TOO_BIG
        if name in inline and not tensor.external_data:
            return tensor
        if weight_value is None:
            return _TOO_BIG
        return numpy_helper.from_array(weight_value(name), name)

    return resolve


def _cone(graph: Any, targets: Sequence[str],
          constant: Callable[[str], Any]) -> tuple[list[Any], set[str], list[Any]] | None:
    """The nodes computing ``targets`` from graph inputs, the inputs they read and the
    constants (:func:`_constants`' ``constant``) they copy; None past the limits or through
    a non-standard node."""
    producer = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input}
    seen: dict[int, Any] = {}
    reached: set[str] = set()
    consts: dict[str, Any] = {}
    stack = list(targets)
    while stack:
        name = stack.pop()
        if not name or name in reached or name in consts:
            continue
        tensor = constant(name)
        if tensor is _TOO_BIG:
            return None
        if tensor is not None:
            consts[name] = tensor
        elif name in inputs:
            reached.add(name)
        elif name in producer:
            node = producer[name]
            if id(node) in seen:
                continue
            if (node.domain or "") not in ("", "ai.onnx") or \
                    any(a.HasField("g") or len(a.graphs) for a in node.attribute):
                return None
            seen[id(node)] = node
            if len(seen) > MAX_CONE_NODES:
                return None
            stack.extend(node.input)
        else:
            return None
    order = {id(n): k for k, n in enumerate(graph.node)}
    nodes = sorted(seen.values(), key=lambda n: order[id(n)])
    return nodes, reached, list(consts.values())


def _tensor_bytes(tensor: Any) -> int:
    count = int(np.prod(list(tensor.dims), dtype=np.int64))
    return count * 8  # an upper bound of any numeric element (external data counts too)


def _attention(graph: Any, node: Any, tokens: tuple[str, int] | int | None,
               tensors: Mapping[str, Any]) -> _Attention:
    """The sizes of one kernel: the cache's rows (its past key's axis 2, a graph input or
    one of its presents as a graph output), the rotary table's rows where it rotates."""
    rows: tuple[str, int] | int | None = None
    past = node.input[_PAST_KEY] if len(node.input) > _PAST_KEY else ""
    if past and any(i.name == past for i in graph.input):
        rows = (past, 2)
    elif len(node.output) > 1 and any(o.name == node.output[1] for o in graph.output):
        rows = (node.output[1], 2)
    rotary = None
    attrs = {a.name: a for a in node.attribute}
    if "do_rotary" in attrs and attrs["do_rotary"].i == 1 and len(node.input) > _COS:
        cos = tensors.get(node.input[_COS])  # its dims alone: nothing is read
        rotary = int(cos.dims[0]) if cos is not None and len(cos.dims) else None
    return _Attention(node.name or node.output[0], node.input[_SEQLENS], node.input[_TOTAL],
                      rows, tokens, rotary)


def _query_tokens(graph: Any, nodes: Sequence[Any], weights: Mapping[str, Any],
                  opsets: list[Any], shape_inference: Any,
                  helper: Any) -> list[tuple[str, int] | int | None]:
    """Each kernel's step tokens (its query's axis 1) as a fixed value or the graph input
    axis it follows, by onnx's shape inference on the graph with its weights as typed
    inputs. ONNX cannot infer past the first contrib kernel; the kernels sharing one
    ``seqlens_k`` share their step (the same request), so the first found stands for all."""
    small = [t for t in graph.initializer if _tensor_bytes(t) <= MAX_CONE_CONST_BYTES
             and not t.external_data]
    kept = {t.name for t in small}
    typed = [helper.make_tensor_value_info(n, t.data_type, list(t.dims))
             for n, t in weights.items() if n not in kept]
    light = helper.make_graph(list(graph.node), "shapes", [*graph.input, *typed],
                              list(graph.output), small)
    try:
        inferred = shape_inference.infer_shapes(helper.make_model(light, opset_imports=opsets))
    except Exception:  # noqa: BLE001 - shape inference is best effort here
        return [None] * len(nodes)
    infos = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.input)}
    axes = {d.dim_param: (i.name, k) for i in graph.input
            for k, d in enumerate(i.type.tensor_type.shape.dim) if d.dim_param}
    by_lengths: dict[str, tuple[str, int] | int] = {}
    for node in nodes:
        info = infos.get(node.input[0])
        dims = list(info.type.tensor_type.shape.dim) if info is not None else []
        if len(dims) == 3:
            d = dims[1]
            if d.HasField("dim_value"):
                by_lengths.setdefault(node.input[_SEQLENS], int(d.dim_value))
            elif d.dim_param in axes:
                by_lengths.setdefault(node.input[_SEQLENS], axes[d.dim_param])
    return [by_lengths.get(n.input[_SEQLENS]) for n in nodes]


__all__ = ["KernelGuard", "MAX_CONE_NODES", "find_guards", "guarded_inputs"]
