"""The do-nothing backend (tinygrad's NULL device): no math, every call recorded.

It runs the executor's whole logic (dims, matching, staging, output shapes) without any
runtime, so tests can assert *what the executor asked for* (which gear, what was staged)
and services can dry-run their request flow. Outputs are zeros of each gear's shapes.

Open it from a gear file (``gr.load(path, backend="null")``) or from a spec directly
(``open_model(None, spec=..., outputs=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.backends.base import BackendModel, BackendSession, HostState
from gear_runtime.gearfile.info import ModelInfo
from gear_runtime.spec import GearSpec


def open_model(path: str | None, *, spec: GearSpec | None = None,
               input_dtypes: Sequence[Any] | None = None,
               outputs: dict[str, Sequence[Sequence[int]]] | None = None) -> NullModel:
    """A null model from a gear file's metadata, or from ``spec`` (+ per-gear ``outputs``).

    ``outputs`` maps an output name to its shape in each gear (default: one output ``out``
    of shape ``(1,)`` in every gear); ``input_dtypes`` default to float32.
    """
    if spec is None:
        from gear_runtime.gearfile.reader import read_gear_file

        return NullModel(read_gear_file(path).info)  # type: ignore[arg-type]
    outputs = outputs or {"out": [(1,)] * spec.gear_count}
    names = tuple(outputs)
    shapes = tuple(tuple(tuple(outputs[n][g]) for n in names) for g in range(spec.gear_count))
    dtypes = tuple(np.dtype(d) for d in (input_dtypes or [np.float32] * len(spec.input_names)))
    return NullModel(ModelInfo(spec, dtypes, names, (np.dtype(np.float32),) * len(names), shapes,
                               hybrid=spec.hybrid))


class NullModel(BackendModel):
    name = "null"
    supports_state = True

    def __init__(self, info: ModelInfo) -> None:
        self.info = info
        #: Every call of every session, in order: ("run_gear", g), ("run_dynamic", shapes), ...
        self.calls: list[tuple[str, Any]] = []

    def create_session(self, layout: Any, state: Any = None) -> NullSession:
        self.calls.append(("create_session", layout.total_bytes))
        return NullSession(self, layout, state)


class NullSession(BackendSession):
    def __init__(self, model: NullModel, layout: Any, state: Any = None) -> None:
        self.model, self.layout = model, layout
        #: The resident state (a StatePlan given): each run writes its state outputs (zeros)
        #: into the buffers the next run reads, as a real backend would.
        self.state: HostState | None = None if state is None else HostState(state)
        self.staging = np.zeros(max(int(layout.total_bytes), 1), dtype=np.uint8)
        info = model.info
        self._outputs = [[np.zeros(s, dtype=dt) for s, dt in
                          zip(info.output_shapes[g], info.output_dtypes, strict=True)]
                         for g in range(info.spec.gear_count)]

    def run_gear(self, gear: int) -> list[np.ndarray]:
        self.model.calls.append(("run_gear", gear))
        if self.state is not None:
            for p in range(len(self.state.plan.pairs)):
                self.state.write(p).fill(0)
        return self._outputs[gear]

    def commit_state(self) -> None:
        if self.state is not None:
            self.model.calls.append(("commit_state", self.state.parity))
            self.state.swap()

    def staged_dims(self, gear: int) -> tuple[int, ...]:
        """The int32 dims buffer as staged for ``gear`` (what ascend_mbatch_shape_data holds)."""
        off = self.layout.dims_offset(gear)
        n = self.model.info.spec.values_per_gear
        return tuple(int(v) for v in self.staging[off:off + 4 * n].view(np.int32))

    def run_dynamic(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.model.calls.append(("run_dynamic", tuple(a.shape for a in arrays)))
        return [np.zeros(0, dtype=dt) for dt in self.model.info.output_dtypes]
