"""The C++ pair -- the model's ``GearDispatch`` and an ``ExecutorCore`` sharing it -- as one
object in the shape of tests/oracle.py's ``ExecutorCore`` (the oracle models both in one
class), so that parity and behaviour tests drive either through the same calls.

``ExecutorCore(input_names, input_shapes, dynamic_positions, gears, input_dtypes, layout,
staging)`` builds the dispatch, then the core over it (the order the executor builds them:
the model's dispatch first); ``match`` / ``cover`` / ``nearest`` / ``extract`` /
``values_from_full_dims`` are the dispatch's, everything else the core's.
``set_padding(pad_values, costs)``: costs belong to the dispatch, so other costs make a new
dispatch and a new core over the same staging (what ``attach_profile`` and a later
``create_executor`` do); nothing changes when either is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gear_runtime import _core

Layout = _core.Layout
plan_layout = _core.plan_layout
DEFAULT_ALIGNMENT = _core.DEFAULT_ALIGNMENT
DEFAULT_FUSION_SIZE = _core.DEFAULT_FUSION_SIZE
MAX_FUSION_SIZE = _core.MAX_FUSION_SIZE

_DISPATCH_CALLS = frozenset({"match", "cover", "nearest", "extract", "values_from_full_dims"})


class ExecutorCore:
    """A GearDispatch and the ExecutorCore that shares it."""

    def __init__(self, input_names: Sequence[str], input_shapes: Sequence[Sequence[int]],
                 dynamic_positions: Sequence[Sequence[int]], gears: Sequence[Sequence[int]],
                 input_dtypes: Sequence[Any], layout: Any, staging: Any) -> None:
        self._args = (list(input_names), [list(s) for s in input_shapes],
                      [list(p) for p in dynamic_positions], [list(g) for g in gears])
        self._rest = (list(input_dtypes), layout, staging)
        self.dispatch = _core.GearDispatch(*self._args)
        self.core = _core.ExecutorCore(self.dispatch, *self._rest)
        self._written: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatch if name in _DISPATCH_CALLS else self.core, name)

    @property
    def in_place_bytes(self) -> int:
        return self.core.in_place_bytes

    @in_place_bytes.setter
    def in_place_bytes(self, nbytes: int) -> None:
        self.core.in_place_bytes = nbytes

    def set_written(self, buffers: Any) -> None:
        self.core.set_written(buffers)
        self._written = buffers

    def set_padding(self, pad_values: Sequence[bytes | None] | None = None,
                    costs: Sequence[float] | None = None) -> None:
        if costs is None:
            self.core.set_padding(pad_values)
            return
        dispatch = _core.GearDispatch(*self._args, costs)
        core = _core.ExecutorCore(dispatch, *self._rest)
        core.set_padding(pad_values)
        core.in_place_bytes = self.core.in_place_bytes
        core.set_written(self._written)
        self.dispatch, self.core = dispatch, core
