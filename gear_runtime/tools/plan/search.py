"""The search: the gear set of at most ``max_gears`` gears minimising the total cost of a
trace's requests (:func:`plan_gears`), the largest of which must cover the largest request
(or the largest within ``max_gear`` when the user caps it: the plan then says which share
of requests stays uncovered).

* One free value (after tying): EXACT. An optimal gear set uses only request sizes as gears
  (shrinking a gear to the largest request it serves never costs more when the cost grows with
  the size), so dynamic programming over the m sorted distinct sizes finds it:
  ``best[k][j] = min_i best[k-1][i] + cost(s_j) * (requests in (s_i, s_j])``, O(K m^2),
  vectorised over ``i``.
* Several independent values: a HEURISTIC. Candidates are the grid of request values when
  it is small (it holds an optimum), else the most frequent requests and the componentwise
  maxima of pairs of them, and always the componentwise maximum (which covers everything;
  unlike with one value, it need not be a gear: (1, 6) and (6, 1) cover each other's
  requests without (6, 6)).
  When there are at most ``ENUMERATE_LIMIT`` gear sets of candidates, all are tried (exact
  over the candidates: exact when they are the grid). Beyond, a greedy search: start from
  the componentwise maximum alone, add the candidate that lowers the total most, then swap gears for
  candidates while that lowers the total (local search). Measured against brute force on
  small cases (tests): the greedy search alone lands within 1.4x of the optimum, equal in
  most cases; ``plan.exact`` is False for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec
from gear_runtime.tools.plan.costs import CostFn, LatencyCurve, cost_fn, elements_cost
from gear_runtime.tools.plan.evaluate import GearPlan, evaluate
from gear_runtime.tools.plan.requests import as_requests, structure_of


def plan_gears(requests: Any, max_gears: int, cost: str | CostFn = "elements", *,
               spec: GearSpec | None = None, curve: LatencyCurve | None = None,
               max_gear: int | None = None, mode: str | None = None) -> GearPlan:
    """The gear set of at most ``max_gears`` gears minimising the total cost of ``requests``
    (ints, or dynamic-value tuples in GE order), each run on its cheapest covering gear.

    ``cost``: "elements", "measured" (needs ``curve``, from :func:`measure_latency`) or a
    callable on a gear's value tuple. ``spec``: the model's spec (real input sizes for
    "elements", its mode for ``to_atc``). ``max_gear``: cap on the largest gear's (tied)
    value; requests above it stay uncovered. Exact for one or tied values (dynamic
    programming), a heuristic otherwise (see the module doc); ``plan.exact`` says which.
    """
    if not isinstance(max_gears, int) or max_gears < 1:
        raise InputError(f"max_gears must be an integer >= 1, got {max_gears!r}")
    reqs = as_requests(requests)
    structure = structure_of(reqs)
    fn, unit = cost_fn(cost, spec, curve, structure)
    mode = mode or (spec.mode if spec is not None else "dims")
    reps = [g[0] for g in structure.groups]
    free = reqs[:, reps]
    kept = free if max_gear is None else free[(free <= max_gear).all(axis=1)]
    if kept.shape[0] == 0:
        raise InputError(f"no request is within max_gear={max_gear}")
    if len(reps) <= 1:
        chosen = _dp(kept[:, 0] if reps else np.zeros(len(kept), np.int64), max_gears,
                     lambda v: fn(structure.expand([v] if reps else [])))
        gears = [structure.expand([v] if reps else []) for v in chosen]
        exact = True
    else:
        chosen_vecs = _heuristic(kept, max_gears, lambda vec: fn(structure.expand(vec)))
        gears = [structure.expand(v) for v in chosen_vecs]
        exact = False
    return evaluate(gears, reqs, fn, unit, mode, exact, elements_cost(spec, structure))


def _dp(sizes: np.ndarray, max_gears: int, cost: Callable[[int], float]) -> list[int]:
    """Exact optimum for one value: the gear sizes (ascending) minimising the total cost."""
    values, counts = np.unique(sizes, return_counts=True)
    m = len(values)
    c = np.array([cost(int(v)) for v in values], float)
    prefix = np.concatenate([[0], np.cumsum(counts)])  # requests in values[:j]
    k_max = min(max_gears, m)
    best = np.full((k_max + 1, m + 1), np.inf)
    back = np.zeros((k_max + 1, m + 1), np.int64)
    best[0, 0] = 0.0
    for k in range(1, k_max + 1):
        for j in range(1, m + 1):  # gear k at values[j-1] serves values[i:j]
            total = best[k - 1, :j] + c[j - 1] * (prefix[j] - prefix[:j])
            i = int(np.argmin(total))
            best[k, j], back[k, j] = total[i], i
    k = int(np.argmin(best[:, m]))
    chosen, j = [], m
    while k > 0:
        chosen.append(int(values[j - 1]))
        j, k = int(back[k, j]), k - 1
    return sorted(chosen)


#: The heuristic's candidate budget (its cost matrix is candidates x distinct requests).
MAX_CANDIDATES = 900


def _candidates(uniq: np.ndarray, counts: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Gear candidates: the whole grid of request values when it is small (it holds an
    optimum: each value of an optimal gear is some request's), else the most frequent
    requests, the componentwise maxima of pairs of the most frequent ones, and the top."""
    axes = [np.unique(uniq[:, v]) for v in range(uniq.shape[1])]
    if math.prod(len(a) for a in axes) <= MAX_CANDIDATES:
        return np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(axes), -1).T
    order = np.argsort(-counts, kind="stable")
    frequent = uniq[order[:MAX_CANDIDATES // 2]]
    few = uniq[order[:int(math.sqrt(MAX_CANDIDATES))]]
    pairs = np.maximum(few[:, None, :], few[None, :, :]).reshape(-1, uniq.shape[1])
    return np.unique(np.vstack([frequent, pairs, top[None]]), axis=0)


#: Up to this many gear sets, the several-value planner enumerates them all (exact over its
#: candidates) instead of running the greedy search.
ENUMERATE_LIMIT = 20000


def _enumerate(cands: np.ndarray, max_gears: int,
               total: Callable[[list[int]], float]) -> list[tuple[int, ...]]:
    """Every set of at most ``max_gears`` candidates; the cheapest that covers everything."""
    import itertools

    best: list[int] = []
    best_total = math.inf
    for k in range(1, min(max_gears, len(cands)) + 1):
        for chosen in itertools.combinations(range(len(cands)), k):
            t = total(list(chosen))
            if t < best_total - 1e-12:
                best, best_total = list(chosen), t
    return sorted(tuple(int(x) for x in cands[i]) for i in best)


def _heuristic(reqs: np.ndarray, max_gears: int,
               cost: Callable[[Sequence[int]], float]) -> list[tuple[int, ...]]:
    """Greedy additions from the componentwise maximum, then swaps while they help."""
    uniq, counts = np.unique(reqs, axis=0, return_counts=True)
    cands = _candidates(uniq, counts, reqs.max(axis=0))
    cand_cost = np.array([cost(tuple(int(x) for x in c)) for c in cands])
    covers = (cands[:, None, :] >= uniq[None, :, :]).all(axis=2)
    weighted = np.where(covers, cand_cost[:, None], np.inf)  # [cand, request]
    top_idx = int(np.flatnonzero((cands == reqs.max(axis=0)).all(axis=1))[0])

    def total(chosen: list[int]) -> float:
        return float((weighted[chosen].min(axis=0) * counts).sum())

    if math.comb(len(cands), min(max_gears, len(cands))) <= ENUMERATE_LIMIT:
        return _enumerate(cands, max_gears, total)
    chosen = [top_idx]
    while len(chosen) < max_gears:
        current = weighted[chosen].min(axis=0)
        gains = ((current[None, :] - np.minimum(weighted, current[None, :])) * counts).sum(1)
        gains[chosen] = 0
        best = int(np.argmax(gains))
        if gains[best] <= 0:
            break
        chosen.append(best)
    improved = True
    while improved:
        improved = False
        for pos in range(len(chosen)):  # a swap that uncovers a request costs inf: refused
            base = total(chosen)
            for cand in range(len(cands)):
                if cand in chosen:
                    continue
                trial = chosen[:pos] + [cand] + chosen[pos + 1:]
                if total(trial) < base - 1e-12:
                    chosen, base, improved = trial, total(trial), True
    return sorted(tuple(int(x) for x in cands[i]) for i in chosen)
