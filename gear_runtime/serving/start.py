"""A stateful model's start requests: :class:`StartModel` (``serve --sequence-start``), and
the request checks it shares with :class:`~gear_runtime.serving.served.ServedModel`."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.backends import facts
from gear_runtime.errors import InputError
from gear_runtime.runtime.inputs import check_names
from gear_runtime.serving.options import ServeOptions
from gear_runtime.serving.protocol import InferRequest, datatype_of
from gear_runtime.serving.stats import ModelStats, RunTiming


def request_arrays(request: InferRequest, names: Sequence[str], datatypes: Sequence[str],
                   owner: str) -> list[np.ndarray]:
    """``request``'s arrays in the order of ``names``, the names (``check_names``) and each
    input's v2 datatype checked; InputError naming the input and ``owner`` otherwise."""
    check_names(request.inputs, names, owner)
    for name, datatype in zip(names, datatypes, strict=True):
        if request.datatypes[name] != datatype:
            raise InputError(f"input {name!r} has datatype {request.datatypes[name]}, "
                             f"{owner} takes {datatype}")
    return [request.inputs[n] for n in names]


class StartModel:
    """The model a sequence's start request runs (``serve --sequence-start``): the prompt at
    its covering gear (``execute(pad=True)``), each output named like a state output written
    straight into the new sequence's state (``out=``: no copy through the host), the other
    outputs answered. Its weights are shared with the step model's where they are equal
    (``load(..., share_weights_with=)``). One executor, runs one at a time: starts are few
    next to steps."""

    def __init__(self, path: str, step: Any, state: dict[str, str],
                 answered: Sequence[str], options: ServeOptions) -> None:
        import gear_runtime as gr

        shares = facts(options.backend).shares_weights and step.backend_model.weights_shareable()
        share = {"share_weights_with": step} if shares else {}
        self.model = gr.load(path, backend=options.backend, **options.load_options(), **share)
        try:
            self._check(step, state, answered, path)
            self.state = state
            self.names = list(self.model.input_names)
            self.dtypes = [np.dtype(d) for d in self.model.info.input_dtypes]
            self.datatypes = [datatype_of(d) for d in self.dtypes]
            self.executor = self.model.create_executor()
        except BaseException:
            self.model.close()
            raise
        self._lock = threading.Lock()

    def _check(self, step: Any, state: dict[str, str], answered: Sequence[str],
               path: str) -> None:
        """InputError unless the start model has each state output (the step model's shape
        and dtype) and answers the step model's other outputs, by name."""
        outputs = list(self.model.output_names)
        for inp, out in state.items():
            if out not in outputs:
                raise InputError(f"--sequence-start {path!r} has no output {out!r} to start "
                                 f"the state {inp!r} with; its outputs: {', '.join(outputs)}")
            k, j = outputs.index(out), list(step.input_names).index(inp)
            want = tuple(step.spec.input_shapes[j])
            shapes = {tuple(self.model.output_shape(g, k)) for g in range(self.model.gear_count)}
            if shapes != {want} or self.model.info.output_dtypes[k] != \
                    step.info.input_dtypes[j]:
                raise InputError(f"--sequence-start {path!r}: output {out!r} is "
                                 f"{self.model.info.output_dtypes[k]} {sorted(shapes)}, the "
                                 f"state {inp!r} is {step.info.input_dtypes[j]} {list(want)}")
        others = [n for n in outputs if n not in state.values()]
        if others != list(answered):
            raise InputError(f"--sequence-start {path!r} answers {others}, the step model "
                             f"{list(answered)}: a sequence's answers must have one set of "
                             "outputs")

    def describe(self) -> dict[str, Any]:
        """What a sequence_start request carries: the start model's inputs (-1 where its
        gears differ: padded to the covering gear) and gears."""
        spec = self.model.spec
        shapes = [spec.shapes(g) for g in range(self.model.gear_count)]
        return {"inputs": [{"name": n, "datatype": d,
                            "shape": merged_shape([s[n] for s in shapes])}
                           for n, d in zip(self.names, self.datatypes, strict=True)],
                "gears": [list(g) for g in self.model.gears]}

    def inputs(self, request: InferRequest) -> list[np.ndarray]:
        """The start request's arrays in the start model's input order, checked."""
        return request_arrays(request, self.names, self.datatypes,
                              "the sequence's start model")

    def run(self, arrays: list[np.ndarray], stats: ModelStats,
            ex: Any) -> tuple[RunTiming, list[np.ndarray]]:
        """The prompt on the start model, its state outputs written into ``ex``'s state.
        Runs inside SequenceSlots.call, on the slot's thread after its reset, in the
        sequence's order (a cut-off start still writes before the steps behind it run); if
        it fails, the half-written state belongs to no sequence (the start leaves it not
        live)."""
        started = time.perf_counter()
        out = {o: ex.state[i] for i, o in self.state.items()}
        with self._lock:
            outputs = self.executor.execute(dict(zip(self.names, arrays, strict=True)),
                                            pad=True, out=out)
            gear = self.executor.last_gear
        keep = [k for k, n in enumerate(self.model.output_names) if n not in out]
        # the gear is the START model's: labelled as such, never looked up in the step's
        label = "start:" + ("dynamic" if gear is None else
                            ",".join(map(str, self.model.gears[gear])))
        timing = RunTiming(gear, 1, started, 0.0, time.perf_counter() - started, 0.0,
                           label=label)
        stats.executed(timing)
        return timing, [outputs[k] for k in keep]

    def close(self) -> None:
        self.model.close()


def merged_shape(shapes: Sequence[Sequence[int]]) -> list[int]:
    """One shape for all gears: -1 where they differ."""
    return [d if all(len(s) == len(shapes[0]) and s[a] == d for s in shapes) else -1
            for a, d in enumerate(shapes[0])]

