"""Resident state: which inputs an executor feeds from its own outputs, checked up front.

``model.create_executor(state={"past_kv": "present_kv"})`` pairs an input with the output
that becomes its next value (a decode step's KV cache). The executor keeps every pair in the
backend's memory, double-buffered: a run reads buffer ``p`` and writes the output into
buffer ``1 - p``; they swap only after the run succeeded, so a failed run leaves the state
as it was and a run never writes the buffer it reads (no graph has to be safe for aliasing).
``execute`` then takes and returns the NON-state inputs and outputs, in model order.

This module is the one place the pairs are checked (:func:`plan_state`); the buffers and
their swap live in the backend session (:class:`gear_runtime.backends.base.HostState`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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


def plan_state(info: ModelInfo, state: object) -> StatePlan:
    """Check ``state`` (input name -> output name) against the model; InputError naming the
    pair, the value and what was expected when: it is not a mapping of names; an input or
    output does not exist or appears twice; the input has a dynamic axis; the output's shape
    is not the input's at every gear; the dtypes differ. The model must be neither hybrid nor
    sink (their runs take every input from the caller)."""
    spec = info.spec
    if not isinstance(state, Mapping) or not state:
        raise InputError(f"state must be a non-empty dict input name -> output name, got "
                         f"{state!r}")
    if info.hybrid or info.sink:
        raise InputError("state= needs a model that is neither hybrid nor sink (their "
                         "dynamic-shape and sink runs take every input from the caller)")
    pairs, seen_out = [], set()
    for name, out in state.items():
        if not isinstance(name, str) or not isinstance(out, str):
            raise InputError(f"state maps input names to output names (str), got "
                             f"{name!r}: {out!r}")
        pairs.append(_pair(info, name, out))
        if out in seen_out:
            raise InputError(f"state: output {out!r} feeds two inputs; each output feeds one")
        seen_out.add(out)
    ins = {p.input_index for p in pairs}
    outs = {p.output_index for p in pairs}
    return StatePlan(tuple(pairs), tuple(i for i in range(len(spec.input_names)) if i not in ins),
                     tuple(k for k in range(len(info.output_names)) if k not in outs))


def _pair(info: ModelInfo, name: str, out: str) -> StatePair:
    spec = info.spec
    if name not in spec.input_names:
        raise InputError(f"state: the model has no input {name!r}; inputs: "
                         f"{', '.join(spec.input_names)}")
    if out not in info.output_names:
        raise InputError(f"state: the model has no output {out!r}; outputs: "
                         f"{', '.join(info.output_names)}")
    i, k = spec.input_names.index(name), info.output_names.index(out)
    shape = tuple(spec.input_shapes[i])
    if -1 in shape:
        raise InputError(f"state input {name!r} has a dynamic axis (input_shape "
                         f"{list(shape)}): a state keeps one shape at every gear")
    for g, shapes in enumerate(info.output_shapes):
        if tuple(shapes[k]) != shape:
            raise InputError(f"state output {out!r} has shape {list(shapes[k])} in gear {g} "
                             f"{spec.gears[g]}, its input {name!r} has {list(shape)}: a state "
                             "output must have its input's shape at every gear")
    dtype, odtype = np.dtype(info.input_dtypes[i]), np.dtype(info.output_dtypes[k])
    if dtype != odtype:
        raise InputError(f"state output {out!r} is {odtype}, its input {name!r} is {dtype}: "
                         "a pair needs one dtype")
    return StatePair(name, i, out, k, shape, dtype)
