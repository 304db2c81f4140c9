"""The state plan: which inputs an executor feeds from its own outputs, checked up front.

``model.create_executor(state={"past_kv": "present_kv"})`` pairs an input with the output
that becomes its next value (a decode step's KV cache). The executor keeps every pair in the
backend's memory, double-buffered: a run reads buffer ``p`` and writes the output into
buffer ``1 - p``; they swap only after the run succeeded, so a failed run leaves the state
as it was and a run never writes the buffer it reads (no graph has to be safe for aliasing).
``execute`` then takes and returns the NON-state inputs and outputs, in model order.

In place (``create_executor(state=..., in_place_state=True)``): a pair whose graph is
built for it keeps ONE buffer, read and written by the same run. Double buffering there would
make the kernel copy the whole cache every step: onnxruntime-genai's graphs update their KV
cache in place with GroupQueryAttention, which shares its past and present buffers when they
are one address (its CPU kernel checks ``past_key == present_key && past_value ==
present_value``). A pair runs in place only where :func:`in_place_refusal` finds the graph
safe for it: the state input read by one such kernel alone, at its past slot, and its output
that kernel's present of the same slot, the key and value slots both in place. The price: a
failed run may leave that state half written (double buffering's guarantee is gone), and a
kept ``ex.state[name]`` changes under every run.

This module is the one place the pairs are checked (:func:`plan_state`); the buffers and
their swap live in the backend session (``session.state``, the contract of
:mod:`gear_runtime.backends.state`), and the executor reaches them through
:class:`gear_runtime.runtime.state.resident.ResidentState`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.gearfile.info import ModelInfo


@dataclass(frozen=True)
class StatePair:
    """One input <- output pair: names, indices in the model's order, shape and dtype."""

    input_name: str
    input_index: int
    output_name: str
    output_index: int
    shape: tuple[int, ...]
    dtype: np.dtype
    #: one buffer, read and written by the same run (see the module docstring)
    in_place: bool = False
    #: a state with rows (its input's axis 0 dynamic, a batch): each gear's rows; the
    #: buffers have the most rows (``shape``) and gear g reads and writes its leading
    #: ``rows[g]``, so a row is one sequence of a batched decode. None: one shape at every gear
    rows: tuple[int, ...] | None = None

    @property
    def mode(self) -> str:
        """"in place" or "double-buffered"."""
        return "in place" if self.in_place else "double-buffered"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class StatePlan:
    """The pairs of one executor and what ``execute`` still takes and returns.

    ``inputs`` / ``outputs``: indices (model order) of the NON-state inputs and outputs; a
    session's staging layout is planned over ``inputs`` alone (in that order)."""

    pairs: tuple[StatePair, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def pair(self, name: str) -> StatePair:
        """The pair whose input is ``name``; InputError naming the state inputs otherwise."""
        for p in self.pairs:
            if p.input_name == name:
                return p
        raise InputError(f"{name!r} is no state input of this executor; its state inputs: "
                         f"{', '.join(p.input_name for p in self.pairs)}")


#: Kernels that read and write a state in place when its input and output are one buffer:
#: (op type, domain) -> the (input slot, output slot) pairs that must all share their buffers.
IN_PLACE_KERNELS: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    # past_key (3) <-> present_key (1), past_value (4) <-> present_value (2)
    ("GroupQueryAttention", "com.microsoft"): ((3, 1), (4, 2)),
}


def _consumers(graph: Any, name: str) -> list[tuple[Any, int]]:
    """(node, input slot) of every use of ``name`` in ``graph``; a use inside a subgraph (an
    If / Loop body) counts as a use by the node that holds it, at slot -1."""
    uses = []
    for node in graph.node:
        uses += [(node, k) for k, x in enumerate(node.input) if x == name]
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            if any(_consumers(sub, name) for sub in subs):
                uses.append((node, -1))
    return uses


def in_place_refusal(graph: Any, pair: StatePair, planned: Mapping[str, str]) -> str | None:
    """Why ``pair`` cannot run in place on ``graph`` (an onnx GraphProto), or None when it can:
    its input is read by ONE node alone, a kernel of :data:`IN_PLACE_KERNELS`, at a past slot;
    that node writes the pair's output at the matching present slot; and every other slot
    pair of that node is also in ``planned`` (the state pairs asked in place, input ->
    output): the kernel shares all of its buffers or none."""
    if any(o.name == pair.input_name for o in graph.output):
        return f"{pair.input_name!r} is also a graph output"
    uses = _consumers(graph, pair.input_name)
    if len(uses) != 1:
        return (f"{pair.input_name!r} is read by {len(uses)} nodes; in place needs one kernel "
                "that reads and writes it (another reader could see it half written)")
    node, slot = uses[0]
    slots = IN_PLACE_KERNELS.get((node.op_type, node.domain or ""))
    if slots is None:
        kernels = ", ".join(op for op, _ in IN_PLACE_KERNELS)
        return (f"{pair.input_name!r} is read by {node.op_type} {node.name!r}, which does not "
                f"update a buffer in place (those that do: {kernels})")
    out_slot = dict(slots).get(slot)
    if out_slot is None or len(node.output) <= out_slot or \
            node.output[out_slot] != pair.output_name:
        return (f"{node.op_type} {node.name!r} does not write {pair.input_name!r}'s slot to "
                f"{pair.output_name!r}")
    for i, o in slots:
        other_in = node.input[i] if i < len(node.input) else ""
        other_out = node.output[o] if o < len(node.output) else ""
        if planned.get(other_in) != other_out:
            return (f"{node.op_type} {node.name!r} shares its buffers all together or none: "
                    f"{other_in!r} <- {other_out!r} must be an in-place state pair too")
    return None


def plan_state(info: ModelInfo, state: object, in_place: object = False,
               graph: Any = None) -> StatePlan:
    """Check ``state`` (input name -> output name) against the model; InputError naming the
    pair, the value and what was expected when: it is not a mapping of names; an input or
    output does not exist or appears twice; the input has a dynamic axis; the output's shape
    is not the input's at every gear; the dtypes differ. The model must be neither hybrid nor
    sink (their runs take every input from the caller).

    ``in_place``: False (every pair double-buffered), True (every pair in place) or the
    state input names to run in place; each checked on ``graph`` (the onnx graph the backend
    runs; None: the backend cannot show it, so in place is refused) by
    :func:`in_place_refusal`, InputError naming the pair and why otherwise."""
    spec = info.spec
    if not isinstance(state, Mapping) or not state:
        raise InputError(f"state must be a non-empty dict input name -> output name, got "
                         f"{state!r}")
    if info.hybrid or info.sink:
        raise InputError("state= needs a model that is neither hybrid nor sink (their "
                         "dynamic-shape and sink runs take every input from the caller)")
    pairs: list[StatePair] = []
    fed: dict[str, str] = {}  # output name -> the state input it feeds
    for name, out in state.items():
        if not isinstance(name, str) or not isinstance(out, str):
            raise InputError(f"state maps input names to output names (str), got "
                             f"{name!r}: {out!r}")
        pairs.append(_pair(info, name, out))
        if out in fed:  # one of the two would never advance
            raise InputError(f"state: output {out!r} feeds two state inputs, {fed[out]!r} "
                             f"and {name!r}; each output feeds one")
        fed[out] = name
    pairs = _in_place(pairs, in_place, graph)
    ins = {p.input_index for p in pairs}
    outs = {p.output_index for p in pairs}
    return StatePlan(tuple(pairs), tuple(i for i in range(len(spec.input_names)) if i not in ins),
                     tuple(k for k in range(len(info.output_names)) if k not in outs))


def _in_place(pairs: list[StatePair], in_place: object, graph: Any) -> list[StatePair]:
    """``pairs`` with the asked ones marked in place, each checked (see plan_state)."""
    if in_place is False or in_place is None:
        return pairs
    names = {p.input_name for p in pairs}
    if in_place is True:
        wanted = set(names)
    elif isinstance(in_place, str | bytes) or not isinstance(in_place, Iterable):
        raise InputError(f"in_place_state must be True, False or state input names, got "
                         f"{in_place!r}")
    else:
        asked = list(in_place)
        if not all(isinstance(n, str) for n in asked):
            raise InputError(f"in_place_state must be True, False or state input names (str), "
                             f"got {in_place!r}")
        wanted = set(asked)
        unknown = sorted(map(repr, wanted - names))
        if unknown:
            raise InputError(f"in_place_state: {unknown[0]} is no state input; the state "
                             f"inputs: {', '.join(sorted(names))}")
    if not wanted:  # an empty list: every pair double-buffered
        return pairs
    if graph is None:
        raise InputError("in_place_state needs a backend whose graph can be checked for it "
                         "(onnxruntime on the CPU); run the state double-buffered here")
    planned = {p.input_name: p.output_name for p in pairs if p.input_name in wanted}
    out = []
    for p in pairs:
        if p.input_name in wanted:
            why = in_place_refusal(graph, p, planned)
            if why is not None:
                raise InputError(f"state {p.input_name!r} <- {p.output_name!r} cannot run in "
                                 f"place: {why}")
            p = replace(p, in_place=True)
        out.append(p)
    return out


def _pair(info: ModelInfo, name: str, out: str) -> StatePair:
    spec = info.spec
    if name not in spec.input_names:
        raise InputError(f"state: the model has no input {name!r}; inputs: "
                         f"{', '.join(spec.input_names)}")
    if out not in info.output_names:
        raise InputError(f"state: the model has no output {out!r}; outputs: "
                         f"{', '.join(info.output_names)}")
    i, k = spec.input_names.index(name), info.output_names.index(out)
    declared = tuple(spec.input_shapes[i])
    if -1 in declared[1:]:
        raise InputError(f"state input {name!r} has a dynamic axis past its first (input_shape "
                         f"{list(declared)}): a state keeps one shape at every gear, or its "
                         "rows alone (axis 0, a batch) follow the gear")
    per_gear = [tuple(spec.shapes(g)[name]) for g in range(spec.gear_count)]
    for g, shapes in enumerate(info.output_shapes):
        if tuple(shapes[k]) != per_gear[g]:
            raise InputError(f"state output {out!r} has shape {list(shapes[k])} in gear {g} "
                             f"{spec.gears[g]}, its input {name!r} has {list(per_gear[g])}: a "
                             "state output must have its input's shape at every gear")
    rows = tuple(s[0] for s in per_gear) if declared[:1] == (-1,) else None
    shape = declared if rows is None else (max(rows), *declared[1:])
    dtype, odtype = np.dtype(info.input_dtypes[i]), np.dtype(info.output_dtypes[k])
    if dtype != odtype:
        raise InputError(f"state output {out!r} is {odtype}, its input {name!r} is {dtype}: "
                         "a pair needs one dtype")
    return StatePair(name, i, out, k, shape, dtype, rows=rows)
