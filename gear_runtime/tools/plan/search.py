"""The search: the gear set of at most ``max_gears`` gears minimising the total cost of a
trace's requests (:func:`plan_gears`), the largest of which must cover the largest request
(or the largest within ``max_gear`` when the user caps it: the plan then says which share
of requests stays uncovered).

* One free value (after tying): EXACT when the cost never falls as the size grows. An
  optimal gear set then uses only request sizes as gears (shrinking a gear to the largest
  request it serves never costs more), so dynamic programming over the m sorted distinct
  sizes finds it: ``best[k][j] = min_i best[k-1][i] + cost(s_j) * (requests in (s_i, s_j])``.
  That cost satisfies the quadrangle inequality (``(c_j' - c_j)(P_i - P_i') <= 0`` for a
  non-decreasing cost), so the best ``i`` moves right with ``j`` and each row is solved by
  divide and conquer in O(m log m) (vectorised per level): O(K m log m) in all, with K at
  most m (``max_gears >= m`` takes every size: nothing is padded). A cost that falls
  somewhere (a measured curve's noise) is planned by the plain O(K m^2) recurrence when that
  is small, else by the same divide and conquer; ``plan.exact`` is False then.
* Several independent values: a HEURISTIC. Candidates are the grid of request values when
  it is small (it holds an optimum), else the most frequent requests and the componentwise
  maxima of pairs of them, and always the componentwise maximum (which covers everything;
  unlike with one value, it need not be a gear: (1, 6) and (6, 1) cover each other's
  requests without (6, 6)).
  When there are at most ``ENUMERATE_LIMIT`` gear sets of candidates, all are tried (exact
  over the candidates: exact when they are the grid). Beyond, a greedy search: start from
  the componentwise maximum alone, add the candidate that lowers the total most, then swap
  gears for candidates while that lowers the total (local search, at most ``MAX_SWAP_TRIALS``
  trials). Measured against brute force on small cases (tests): the greedy search alone lands
  within 1.4x of the optimum, equal in most cases; ``plan.exact`` is False for both.

Bounded: the DP refuses more than ``MAX_DP_CELLS`` (K x m) cells, the heuristic keeps its
candidate x request matrix under ``MAX_MATRIX_CELLS``; long searches draw a progress bar on a
terminal (``progress=True``), nothing on a log.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.progress import progress_bar
from gear_runtime.spec import GearSpec
from gear_runtime.tools.plan.costs import CostFn, LatencyCurve, cost_fn, elements_cost
from gear_runtime.tools.plan.evaluate import GearPlan, evaluate
from gear_runtime.tools.plan.requests import as_requests, structure_of

#: The most K x m cells (gears x distinct sizes) the one-value DP keeps (its back pointers).
MAX_DP_CELLS = 25_000_000
#: Up to this many K x m^2 steps, a cost that falls somewhere is planned exactly.
MAX_EXACT_STEPS = 20_000_000


def plan_gears(requests: Any, max_gears: int, cost: str | CostFn = "elements", *,
               spec: GearSpec | None = None, curve: LatencyCurve | None = None,
               max_gear: int | None = None, mode: str | None = None,
               progress: bool = False) -> GearPlan:
    """The gear set of at most ``max_gears`` gears minimising the total cost of ``requests``
    (ints, or dynamic-value tuples in GE order), each run on its cheapest covering gear.

    ``cost``: "elements", "measured" (needs ``curve``, from :func:`measure_latency`) or a
    callable on a gear's value tuple. ``spec``: the model's spec (real input sizes for
    "elements", its mode for ``to_atc``). ``max_gear``: cap on the largest gear's (tied)
    value; requests above it stay uncovered (the plan reports them). Exact for one or tied
    values with a cost that never falls as the size grows (dynamic programming), a
    heuristic otherwise (see the module doc); ``plan.exact`` says which. ``progress``: a bar
    on stderr while a long search runs, when stderr is a terminal.
    """
    if isinstance(max_gears, bool) or not isinstance(max_gears, int) or max_gears < 1:
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
        chosen, exact = _dp(kept[:, 0] if reps else np.zeros(len(kept), np.int64), max_gears,
                            lambda v: fn(structure.expand([v] if reps else [])), progress)
        gears = [structure.expand([v] if reps else []) for v in chosen]
    else:
        chosen_vecs = _heuristic(kept, max_gears, lambda vec: fn(structure.expand(vec)),
                                 progress)
        gears = [structure.expand(v) for v in chosen_vecs]
        exact = False
    plan = evaluate(gears, reqs, fn, unit, mode, exact, elements_cost(spec, structure))
    return plan.without_idle_gears()


def _dp(sizes: np.ndarray, max_gears: int, cost: Callable[[int], float],
        progress: bool = False) -> tuple[list[int], bool]:
    """The gear sizes (ascending) minimising the total cost of ``sizes``, and whether that
    is exact (a cost that never falls as the size grows)."""
    values, counts = np.unique(sizes, return_counts=True)
    m = len(values)
    c = np.array([cost(int(v)) for v in values], float)
    monotone = bool(np.all(np.diff(c) >= 0))
    if max_gears >= m:  # a gear at every size: every request runs unpadded
        return [int(v) for v in values], monotone
    if max_gears * (m + 1) > MAX_DP_CELLS:
        raise InputError(f"planning {m:,} distinct sizes into {max_gears} gears needs "
                         f"{max_gears * (m + 1):,} DP cells (at most {MAX_DP_CELLS:,}): ask "
                         f"for at most {MAX_DP_CELLS // (m + 1)} gears, or round the trace's "
                         "sizes to fewer distinct values")
    prefix = np.concatenate([[0], np.cumsum(counts)]).astype(float)  # requests in values[:j]
    plain = not monotone and max_gears * m * m <= MAX_EXACT_STEPS
    row = np.full(m + 1, np.inf)
    row[0] = 0.0
    back = np.zeros((max_gears + 1, m + 1), np.int32)
    best_total, best_k = math.inf, 0

    with progress_bar(max_gears, "plan", progress and max_gears * m > 10**6) as bar:
        for k in range(1, max_gears + 1):
            row, back[k] = (_row_plain if plain else _row_dc)(row, c, prefix, k)
            if row[m] < best_total:
                best_total, best_k = float(row[m]), k
            bar.update(1)
    chosen, j, k = [], m, best_k
    while k > 0:
        chosen.append(int(values[j - 1]))
        j, k = int(back[k, j]), k - 1
    return sorted(chosen), monotone


def _row_plain(prev: np.ndarray, c: np.ndarray, prefix: np.ndarray, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """DP row k by the plain recurrence: gear k at values[j-1] serves values[i:j]."""
    m = len(c)
    row, back = np.full(m + 1, np.inf), np.zeros(m + 1, np.int32)
    for j in range(k, m + 1):
        total = prev[:j] + c[j - 1] * (prefix[j] - prefix[:j])
        i = int(np.argmin(total))
        row[j], back[j] = total[i], i
    return row, back


def _row_dc(prev: np.ndarray, c: np.ndarray, prefix: np.ndarray, k: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """DP row k by divide and conquer over j (the best i never moves left as j grows),
    one vectorised step per recursion level: segments (j_lo, j_hi, i_lo, i_hi)."""
    m = len(c)
    row, back = np.full(m + 1, np.inf), np.zeros(m + 1, np.int32)
    j_lo, j_hi = np.array([k]), np.array([m])
    i_lo, i_hi = np.array([k - 1]), np.array([m - 1])
    while len(j_lo):
        mid = (j_lo + j_hi) // 2
        top = np.minimum(i_hi, mid - 1)
        lengths = top - i_lo + 1
        starts = np.cumsum(lengths) - lengths
        seg = np.repeat(np.arange(len(mid)), lengths)
        offset = np.arange(int(lengths.sum())) - starts[seg]
        i = i_lo[seg] + offset
        j = mid[seg]
        total = prev[i] + c[j - 1] * (prefix[j] - prefix[i])
        low = np.minimum.reduceat(total, starts)
        first = np.minimum.reduceat(np.where(total == low[seg], offset, m + 1), starts)
        best_i = i_lo + first
        row[mid], back[mid] = low, best_i
        left, right = mid - 1 >= j_lo, mid + 1 <= j_hi
        j_lo, j_hi, i_lo, i_hi = (np.concatenate([j_lo[left], mid[right] + 1]),
                                  np.concatenate([mid[left] - 1, j_hi[right]]),
                                  np.concatenate([i_lo[left], best_i[right]]),
                                  np.concatenate([best_i[left], i_hi[right]]))
    return row, back


#: The heuristic's candidate budget (its cost matrix is candidates x distinct requests).
MAX_CANDIDATES = 900
#: The most cells of the heuristic's candidate x distinct-request matrix (160 MB of floats).
MAX_MATRIX_CELLS = 20_000_000
#: The local search stops after this many trial gear sets (each is one matrix pass).
MAX_SWAP_TRIALS = 20_000


def _candidates(uniq: np.ndarray, counts: np.ndarray, top: np.ndarray, budget: int
                ) -> np.ndarray:
    """Gear candidates (at most about ``budget``): the whole grid of request values when it
    is small (it holds an optimum: each value of an optimal gear is some request's), else
    the most frequent requests, the componentwise maxima of pairs of the most frequent ones,
    and the top."""
    axes = [np.unique(uniq[:, v]) for v in range(uniq.shape[1])]
    if math.prod(len(a) for a in axes) <= budget:
        return np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(axes), -1).T
    order = np.argsort(-counts, kind="stable")
    frequent = uniq[order[:max(budget // 2, 1)]]
    few = uniq[order[:max(int(math.sqrt(budget / 2)), 1)]]
    pairs = np.maximum(few[:, None, :], few[None, :, :]).reshape(-1, uniq.shape[1])
    return np.unique(np.vstack([frequent, pairs, top[None]]), axis=0)


#: Up to this many gear sets, the several-value planner enumerates them all (exact over its
#: candidates) instead of running the greedy search.
ENUMERATE_LIMIT = 20000


def _set_count(n: int, max_gears: int) -> int:
    """How many sets of 1..max_gears of n candidates there are (stops counting past the
    enumeration limit)."""
    total = 0
    for k in range(1, min(max_gears, n) + 1):
        total += math.comb(n, k)
        if total > ENUMERATE_LIMIT:
            break
    return total


def _enumerate(cands: np.ndarray, max_gears: int,
               total: Callable[[list[int]], float]) -> list[tuple[int, ...]]:
    """Every set of at most ``max_gears`` candidates; the cheapest that covers everything."""
    best: list[int] = []
    best_total = math.inf
    for k in range(1, min(max_gears, len(cands)) + 1):
        for chosen in itertools.combinations(range(len(cands)), k):
            t = total(list(chosen))
            if t < best_total - 1e-12:
                best, best_total = list(chosen), t
    return sorted(tuple(int(x) for x in cands[i]) for i in best)


def _heuristic(reqs: np.ndarray, max_gears: int, cost: Callable[[Sequence[int]], float],
               progress: bool = False) -> list[tuple[int, ...]]:
    """Greedy additions from the componentwise maximum, then swaps while they help."""
    uniq, counts = np.unique(reqs, axis=0, return_counts=True)
    budget = max(min(MAX_CANDIDATES, MAX_MATRIX_CELLS // len(uniq)), 2)
    cands = _candidates(uniq, counts, reqs.max(axis=0), budget)
    cand_cost = np.array([cost(tuple(int(x) for x in c)) for c in cands])
    weighted = np.full((len(cands), len(uniq)), np.inf)  # [cand, request]
    for n, cand in enumerate(cands):  # row by row: no [cand, request, value] temporary
        covers = (cand[None, :] >= uniq).all(axis=1)
        weighted[n, covers] = cand_cost[n]
    top_idx = int(np.flatnonzero((cands == reqs.max(axis=0)).all(axis=1))[0])

    def total(chosen: list[int]) -> float:
        return float((weighted[chosen].min(axis=0) * counts).sum())

    if _set_count(len(cands), max_gears) <= ENUMERATE_LIMIT:
        return _enumerate(cands, max_gears, total)
    chosen = [top_idx]
    while len(chosen) < min(max_gears, len(cands)):
        current = weighted[chosen].min(axis=0)
        gains = ((current[None, :] - np.minimum(weighted, current[None, :])) * counts).sum(1)
        gains[chosen] = 0
        best = int(np.argmax(gains))
        if gains[best] <= 0:
            break
        chosen.append(best)
    return sorted(tuple(int(x) for x in cands[i]) for i in _swap(chosen, len(cands), total,
                                                                 progress))


def _swap(chosen: list[int], n: int, total: Callable[[list[int]], float],
          progress: bool) -> list[int]:
    """Local search: replace a gear by a candidate while that lowers the total (a swap that
    uncovers a request costs inf: refused), for at most MAX_SWAP_TRIALS trials."""

    trials = 0
    improved = True
    with progress_bar(MAX_SWAP_TRIALS, "plan", progress) as bar:
        while improved and trials < MAX_SWAP_TRIALS:
            improved = False
            for pos in range(len(chosen)):
                base = total(chosen)
                for cand in range(n):
                    if cand in chosen:
                        continue
                    trials += 1
                    bar.update(1)
                    trial = chosen[:pos] + [cand] + chosen[pos + 1:]
                    t = total(trial)
                    if t < base - 1e-12:
                        chosen, base, improved = trial, t, True
                    if trials >= MAX_SWAP_TRIALS:
                        return chosen
    return chosen
