"""The staging layout for backend tests: the C++ core's when built, else a stand-in.

The stand-in follows the rules written in ``csrc/layout.h`` (GE's merged host-to-device copy,
GE-NOTES.md section 3) and has the same attributes as ``gear_runtime.core.Layout``:
``offset(g, i)``, ``nbytes(g, i)``, ``fused(i)``, ``dims_offset(g)``, ``dims_nbytes``,
``merged_span(g)``, ``separate(g)``, ``total_bytes``. It exists so the backends can be tested
while the core is being written; :func:`plan_layout` prefers the real one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DEFAULT_FUSION_SIZE = 131072
MAX_FUSION_SIZE = 32 * 1024 * 1024


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class StandInLayout:
    """csrc/layout.h's rules in Python (fused inputs, then the dims, then the others)."""

    def __init__(self, input_nbytes: Sequence[Sequence[int]], dims_count: int,
                 fusion_size: int = DEFAULT_FUSION_SIZE, alignment: int = 64) -> None:
        self._n = [list(map(int, row)) for row in input_nbytes]
        gears, inputs = len(self._n), len(self._n[0])
        self.dims_nbytes = 4 * dims_count
        limit = min(fusion_size, MAX_FUSION_SIZE)
        part = [fusion_size >= 0 and max(r[i] for r in self._n) <= limit for i in range(inputs)]
        dims_part = fusion_size >= 0 and dims_count > 0 and self.dims_nbytes <= limit
        self.merged = sum(part) + dims_part >= 2
        self._fused = [self.merged and p for p in part]
        self._off = [[0] * inputs for _ in range(gears)]
        self._dims_off = [0] * gears
        self._merged_end = [0] * gears
        self._sep: list[list[tuple[int, int]]] = [[] for _ in range(gears)]
        total = 0
        for g in range(gears):
            pos = 0
            for i in (i for i in range(inputs) if self._fused[i]):
                self._off[g][i] = _align(pos, alignment)
                pos = self._off[g][i] + self._n[g][i]
            if self.merged and not dims_part:
                self._merged_end[g] = pos
            self._dims_off[g] = _align(pos, alignment)
            pos = self._dims_off[g] + self.dims_nbytes
            if self.merged and dims_part:
                self._merged_end[g] = pos
            elif self.dims_nbytes:
                self._sep[g].append((self._dims_off[g], pos))
            for i in (i for i in range(inputs) if not self._fused[i]):
                self._off[g][i] = _align(pos, alignment)
                pos = self._off[g][i] + self._n[g][i]
                if self._n[g][i]:
                    self._sep[g].append((self._off[g][i], pos))
            self._sep[g].sort()
            total = max(total, pos)
        self.total_bytes = total

    def offset(self, g: int, i: int) -> int:
        return self._off[g][i]

    def nbytes(self, g: int, i: int) -> int:
        return self._n[g][i]

    def fused(self, i: int) -> bool:
        return self._fused[i]

    def dims_offset(self, g: int) -> int:
        return self._dims_off[g]

    def merged_span(self, g: int) -> tuple[int, int]:
        return (0, self._merged_end[g])

    def separate(self, g: int) -> list[tuple[int, int]]:
        return list(self._sep[g])


def real_core() -> Any | None:
    """``gear_runtime.core`` when the C++ core is built (has plan_layout), else None."""
    try:
        from gear_runtime import core
    except ImportError:
        return None
    return core if hasattr(core, "plan_layout") and hasattr(core, "ExecutorCore") else None


def plan_layout(input_nbytes: Sequence[Sequence[int]], dims_count: int,
                fusion_size: int = DEFAULT_FUSION_SIZE) -> Any:
    core = real_core()
    if core is not None:
        return core.plan_layout(input_nbytes, dims_count, fusion_size=fusion_size)
    return StandInLayout(input_nbytes, dims_count, fusion_size)


def stage(staging: Any, layout: Any, spec: Any, dtypes: Sequence[Any], gear: int,
          arrays: Sequence[Any]) -> None:
    """What the core's ``stage`` does for a known gear: every input at ``offset(gear, i)``,
    the int32 dynamic values at ``dims_offset(gear)`` (tests only; no checks)."""
    import numpy as np

    for i, a in enumerate(arrays):
        off, n = int(layout.offset(gear, i)), int(layout.nbytes(gear, i))
        staging[off:off + n] = np.ascontiguousarray(a, dtype=dtypes[i]).view(np.uint8).ravel()
    if int(layout.dims_nbytes):
        off = int(layout.dims_offset(gear))
        values = np.asarray(spec.gears[gear], dtype=np.int32).view(np.uint8)
        staging[off:off + values.size] = values
