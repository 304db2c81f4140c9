"""THE gear dispatcher: the single source of truth for "which gear" of a model.

One :class:`GearDispatcher` per loaded model (``model.dispatcher``) holds everything that
decides which gear runs, configured and checked once, up front:

* **exact match** -- the gear whose dynamic values the request has (``match``);
* **the covering choice** -- the cheapest gear at least as large in every value, for padded
  requests (``cover``, ``cover_many``), by the dispatcher's **costs**: the measured latency
  per gear when a profile is attached (``model.attach_profile``), else each gear's total
  input elements (``elements``: the same count for any request or candidate gear);
* **the batch table** -- for batch-mode models, rows -> the cheapest gear holding them
  (``batch_gear``: the covering choice on one value, a lookup in the core's precomputed key
  table, so a gear of 2**31 rows costs no table of 2**31 entries): the server's batcher
  batches to it;
* **the planner's view** of the same costs: :meth:`elements` and :meth:`cover_many` answer
  for any values and any number of requests, with the rules the runtime applies.

vLLM's ``CudagraphDispatcher`` (vllm/v1/cudagraph_dispatcher.py) is the model: the keys
(gears) and their table are precomputed, the configuration is checked at construction, and
dispatching is a lookup. The lookups themselves are the C++ core's (``_core.GearDispatch``:
GearTable, a hash table; Coverer, a key table): an executor's core is configured from this
dispatcher (its spec and :attr:`costs`) and answers the hot path in C++ with no Python work
per call; the dispatcher answers everyone else with the same C++ code. A dispatcher is
immutable: attaching a profile makes a new one, which executors created afterwards use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import GearMismatchError, InputError
from gear_runtime.runtime import core
from gear_runtime.spec import GearSpec


class GearDispatcher:
    """Which gear of ``spec`` serves a request; ``costs`` per gear (None: input elements)."""

    def __init__(self, spec: GearSpec, costs: Sequence[float] | None = None) -> None:
        """InputError for costs that are not one finite value >= 0 per gear (checked by
        the core, like every other part of the configuration)."""
        self.spec = spec
        given = None if costs is None else [float(c) for c in costs]
        self._core = core.GearDispatch(
            list(spec.input_names), [list(s) for s in spec.input_shapes],
            [list(p) for p in spec.dynamic_positions], [list(g) for g in spec.gears], given)
        #: Per gear, what choosing among covering gears minimises.
        self.costs: tuple[float, ...] = tuple(self._core.costs)
        #: ``"profile"`` (measured latencies) or ``"elements"`` (total input elements).
        self.cost_source = "elements" if costs is None else "profile"

    # ---- which gear --------------------------------------------------------------------------
    def match(self, values: Sequence[int]) -> int:
        """The gear with exactly these dynamic values: DynamicInputLengthError (145012) for
        a wrong count, GearMismatchError (145013) naming the nearest gears otherwise."""
        return self._core.match(_ints(values))

    def cover(self, values: Sequence[int]) -> int:
        """The cheapest gear covering ``values`` (an exact gear is itself); 145012 / 145013."""
        return self._core.cover(_ints(values))

    def cover_many(self, requests: Any) -> np.ndarray:
        """:meth:`cover` of every row of ``requests`` ([n, values_per_gear] integers, or n
        ints for one-value models) as an int64 array, -1 where no gear covers the row."""
        rows = np.asarray(requests)
        if rows.dtype.kind not in "iu":
            raise InputError(f"requests must hold integers, got {rows.dtype}")
        if rows.ndim == 1 and self.spec.values_per_gear == 1:
            rows = rows[:, None]
        return self._core.cover_many(np.ascontiguousarray(rows, dtype=np.int64))

    def extract(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """GetCurDynamicDims: the dynamic values from the arrays' shapes (in input order),
        with the core's checks: count (InputError), rank, static dims and agreement of
        positions sharing a value (145012). Not matched."""
        return self._core.extract(arrays)

    def nearest(self, values: Sequence[int], k: int = 5) -> list[tuple[int, ...]]:
        """Up to ``k`` gears by L1 distance to ``values``, ties to the lower index."""
        return self._core.nearest(_ints(values), k)

    def elements(self, values: Sequence[int]) -> float:
        """Total input elements of the inputs shaped by ``values`` (a gear's, a request's or a
        candidate gear's): the cost of a gear when none is measured."""
        return self._core.elements(_ints(values))

    # ---- the batch table (batch mode) ----------------------------------------------------------
    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The batch gears' sizes, in gear order; None unless the model is in batch mode."""
        return tuple(g[0] for g in self.spec.gears) if self.spec.mode == "batch" else None

    @property
    def max_batch_rows(self) -> int:
        """The most rows one batch can have: the largest batch gear (0 outside batch mode)."""
        return max(self.batch_sizes or (0,))

    def batch_gear(self, rows: int) -> int:
        """The cheapest batch gear holding ``rows`` rows (the smallest one by input elements;
        by a profile, possibly a larger one measured faster). GearMismatchError (145013)
        outside 1..max_batch_rows; InputError when the model is not in batch mode."""
        sizes = self.batch_sizes
        if sizes is None:
            raise InputError(f"a batch table needs a batch-mode model; this one's mode is "
                             f"{self.spec.mode!r}")
        if not 1 <= rows <= self.max_batch_rows:
            raise GearMismatchError(f"{rows} rows fit no batch gear: the gears are "
                                    f"{', '.join(map(str, sizes))}")
        return self._core.cover([rows])

    def batch_table(self) -> tuple[int, ...]:
        """``table[rows]``: :meth:`batch_gear` of every row count 1..max_batch_rows in one
        core call (entry 0 unused); empty outside batch mode."""
        if self.batch_sizes is None:
            return ()
        rows = np.arange(1, self.max_batch_rows + 1, dtype=np.int64)[:, None]
        return (0, *(int(g) for g in self._core.cover_many(rows)))

    def __repr__(self) -> str:
        return f"GearDispatcher(gears={list(self.spec.gears)}, costs={self.cost_source})"


def _ints(values: Sequence[int]) -> list[int]:
    """Values as a list of Python ints (numpy integers too); InputError for anything else
    (20.5 is no gear value: it is refused, never truncated)."""
    if isinstance(values, str | bytes | bytearray):
        raise InputError(f"dynamic values must be a sequence of integers, got {values!r}")
    try:
        return [v.__index__() for v in values]
    except (AttributeError, TypeError):
        raise InputError(f"dynamic values must be a sequence of integers, got {values!r}"
                         ) from None


__all__ = ["GearDispatcher"]
