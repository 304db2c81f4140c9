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
dispatching is a lookup. The lookups themselves are the C++ core's (``_core.GearDispatch``,
csrc/dispatch.h: GearTable in csrc/gear_table.h, a hash table; Coverer in csrc/cover.h, a key
table or a cost-ordered scan): the dispatcher holds ONE such instance, and every executor's
core shares it by reference (:attr:`table`; an executor with resident state shares the one
over its staged inputs, :meth:`over`), so the hot path asks it in C++ with no Python work per
call and no executor rebuilds or copies it; the dispatcher answers everyone else with the
same C++ code. A dispatcher is immutable: attaching a profile makes a new one, which
executors created afterwards use.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import GearMismatchError, GearSpecError, InputError
from gear_runtime.runtime import core
from gear_runtime.spec import GearSpec


class GearDispatcher:
    """Which gear of ``spec`` serves a request; ``costs`` per gear (None: input elements)."""

    def __init__(self, spec: GearSpec, costs: Sequence[float] | None = None) -> None:
        """InputError for costs that are not one finite value >= 0 per gear (checked by
        the core, like every other part of the configuration)."""
        self.spec = spec
        given = None if costs is None else [float(c) for c in costs]
        #: The C++ table (``_core.GearDispatch``) every executor's core shares.
        self.table = _table(spec, range(len(spec.input_names)), given)
        #: Per gear, what choosing among covering gears minimises.
        self.costs: tuple[float, ...] = tuple(self.table.costs)
        #: ``"profile"`` (measured latencies) or ``"elements"`` (total input elements).
        self.cost_source = "elements" if costs is None else "profile"
        self._over: dict[tuple[int, ...], Any] = {}
        self._over_lock = threading.Lock()
        # asked per batched request (the server's batcher): computed once, the spec is fixed
        self._batch_sizes = (tuple(g[0] for g in spec.gears) if spec.mode == "batch"
                             else None)
        self._max_batch_rows = max(self._batch_sizes or (0,))

    def over(self, inputs: Sequence[int]) -> Any:
        """The C++ table over the model's inputs ``inputs`` alone (indices, in model order;
        every dynamic axis among them), with this dispatcher's gears and :attr:`costs`: what
        an executor whose other inputs are resident state stages. Built once per input set
        and shared, as :attr:`table` is."""
        key = tuple(inputs)
        if key == tuple(range(len(self.spec.input_names))):
            return self.table
        with self._over_lock:
            if key not in self._over:
                self._over[key] = _table(self.spec, key, list(self.costs))
            return self._over[key]

    # ---- which gear --------------------------------------------------------------------------
    def match(self, values: Sequence[int]) -> int:
        """The gear with exactly these dynamic values: DynamicInputLengthError (145012) for
        a wrong count, GearMismatchError (145013) naming the nearest gears otherwise."""
        return self.table.match(_ints(values))

    def cover(self, values: Sequence[int]) -> int:
        """The cheapest gear covering ``values`` (an exact gear is itself); 145012 / 145013."""
        return self.table.cover(_ints(values))

    def cover_many(self, requests: Any) -> np.ndarray:
        """:meth:`cover` of every row of ``requests`` ([n, values_per_gear] integers, or n
        ints for one-value models) as an int64 array, -1 where no gear covers the row."""
        rows = np.asarray(requests)
        if rows.dtype.kind not in "iu":
            raise InputError(f"requests must hold integers, got {rows.dtype}")
        if rows.ndim == 1 and self.spec.values_per_gear == 1:
            rows = rows[:, None]
        return self.table.cover_many(np.ascontiguousarray(rows, dtype=np.int64))

    def extract(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """GetCurDynamicDims: the dynamic values from the arrays' shapes (in input order),
        with the core's checks: count (InputError), rank, static dims and agreement of
        positions sharing a value (145012). Not matched."""
        return self.table.extract(arrays)

    def values_from_full_dims(self, full_dims: Sequence[int]) -> tuple[int, ...]:
        """aclmdlSetInputDynamicDims' full dims (every input's shape, flattened in input
        order) -> the gear values, with GE's 145012 checks; not matched."""
        return self.table.values_from_full_dims(_ints(full_dims))

    def nearest(self, values: Sequence[int], k: int = 5) -> list[tuple[int, ...]]:
        """Up to ``k`` gears by L1 distance to ``values``, ties to the lower index."""
        return self.table.nearest(_ints(values), k)

    def elements(self, values: Sequence[int]) -> float:
        """Total input elements of the inputs shaped by ``values`` (a gear's, a request's or a
        candidate gear's): the cost of a gear when none is measured."""
        return self.table.elements(_ints(values))

    # ---- the batch table (batch mode) ----------------------------------------------------------
    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The batch gears' sizes, in gear order; None unless the model is in batch mode."""
        return self._batch_sizes

    @property
    def max_batch_rows(self) -> int:
        """The most rows one batch can have: the largest batch gear (0 outside batch mode)."""
        return self._max_batch_rows

    def batch_gear(self, rows: int) -> int:
        """The cheapest batch gear holding ``rows`` rows (the smallest one by input elements;
        by a profile, possibly a larger one measured faster). GearMismatchError (145013)
        outside 1..max_batch_rows; InputError when the model is not in batch mode."""
        sizes = self._batch_sizes
        if sizes is None:
            raise InputError(f"a batch table needs a batch-mode model; this one's mode is "
                             f"{self.spec.mode!r}")
        if not 1 <= rows <= self._max_batch_rows:
            raise GearMismatchError(f"{rows} rows fit no batch gear: the gears are "
                                    f"{', '.join(map(str, sizes))}")
        return self.table.cover([rows])

    def batch_table(self) -> tuple[int, ...]:
        """``table[rows]``: :meth:`batch_gear` of every row count 1..max_batch_rows in one
        core call (entry 0 unused); empty outside batch mode."""
        if self.batch_sizes is None:
            return ()
        rows = np.arange(1, self.max_batch_rows + 1, dtype=np.int64)[:, None]
        return (0, *(int(g) for g in self.table.cover_many(rows)))

    def __repr__(self) -> str:
        return f"GearDispatcher(gears={list(self.spec.gears)}, costs={self.cost_source})"


def _table(spec: GearSpec, inputs: Sequence[int], costs: list[float] | None) -> Any:
    """The C++ GearDispatch over ``spec``'s inputs ``inputs`` (their dynamic positions
    renumbered). The gear values only inputs left out carry (a state's rows) are left out
    of every gear too: the other values must still tell the gears apart (GearSpecError
    naming the two gears otherwise)."""
    index = {i: j for j, i in enumerate(inputs)}
    kept = sorted({k for i, _, k in spec.dynamic_positions if i in index})
    value = {k: n for n, k in enumerate(kept)}
    positions = [[index[i], axis, value[k]] for i, axis, k in spec.dynamic_positions
                 if i in index]
    gears = [[g[k] for k in kept] for g in spec.gears]
    seen: dict[tuple[int, ...], int] = {}
    for n, g in enumerate(gears):
        first = seen.setdefault(tuple(g), n)
        if first != n:
            raise GearSpecError(f"gears {first} {spec.gears[first]} and {n} {spec.gears[n]} "
                                f"differ only in the values of the inputs left out "
                                f"(resident state): the staged inputs cannot tell them apart")
    return core.GearDispatch([spec.input_names[i] for i in inputs],
                             [list(spec.input_shapes[i]) for i in inputs], positions,
                             gears, costs)


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
