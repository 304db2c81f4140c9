"""The gear planner: choose the gears from the requests a service sees (``gr.plan_gears``).

Every request runs on the cheapest gear that covers it (``execute(pad=True)``), so a gear
set costs, per request, the cost of the gear it lands on. The planner minimises the total
over a trace of requests with at most ``max_gears`` gears, the largest of which must cover
the largest request (or the largest request within ``max_gear`` when the user caps it: the
plan then says which share of requests stays uncovered).

Structure of the requests, found in the trace itself: values that are equal in every
request (seed-style ``seq,seq,seq``) are *tied* and planned as one; values that are the same
in every request stay constant.

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

Cost of a gear: ``"elements"`` (total input elements: the product of the values, or the
model's real input sizes when a spec is given), ``"measured"`` (a ladder of gears of the
user's model compiled and benchmarked, latency interpolated piecewise linearly:
:func:`measure_latency`), or any callable on a gear's value tuple.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec

CostFn = Callable[[tuple[int, ...]], float]


# ---- the plan ---------------------------------------------------------------------------------
@dataclass
class GearPlan:
    """A gear set and what it costs on the requests it was planned (or evaluated) on.

    ``gears``: value tuples as ``GearSpec.gears`` (ascending); ``mean_cost`` / ``p99_cost``
    per covered request in the cost's unit (``cost_unit``); ``waste``: the share of the
    elements the gears process that is padding (over covered requests); ``uncovered``: share
    of requests no gear covers; ``served[g]``: requests gear g serves.
    """

    gears: list[tuple[int, ...]]
    mean_cost: float
    p99_cost: float
    waste: float
    uncovered: float
    served: list[int]
    cost_unit: str = "elements"
    mode: str = "dims"
    exact: bool = True
    #: per request (trace order): the gear index it runs on, -1 when uncovered.
    assignment: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    def to_atc(self) -> str:
        """The ATC flag for these gears, e.g. ``--dynamic_dims=32,32;512,512``."""
        if self.mode == "batch":
            return "--dynamic_batch_size=" + ",".join(str(g[0]) for g in self.gears)
        flag = "dynamic_image_size" if self.mode == "image_size" else "dynamic_dims"
        return f"--{flag}=" + ";".join(",".join(map(str, g)) for g in self.gears)

    def to_config(self) -> list[str]:
        """Config lines: GE's option and MindSpore Lite's ``[ascend_context]`` form."""
        values = ";".join(",".join(map(str, g)) for g in self.gears)
        key = {"batch": "ge.dynamicBatchSize", "image_size": "ge.dynamicImageSize"}.get(
            self.mode, "ge.dynamicDims")
        if self.mode == "batch":
            values = ",".join(str(g[0]) for g in self.gears)
        groups = ",".join("[" + ",".join(map(str, g)) + "]" for g in self.gears)
        return [f'{key}="{values}"', "[ascend_context]", f"dynamic_dims={groups}"]

    def summary(self) -> str:
        gears = "; ".join(",".join(map(str, g)) for g in self.gears)
        return (f"gears {gears}: mean {self.mean_cost:.4g} {self.cost_unit}, p99 "
                f"{self.p99_cost:.4g}, padding waste {100 * self.waste:.1f}%"
                + (f", uncovered {100 * self.uncovered:.2f}%" if self.uncovered else ""))


# ---- requests and their structure -------------------------------------------------------------
def as_requests(requests: Any) -> np.ndarray:
    """Requests as an int64 array [n, values]: ints (one value) or value tuples."""
    arr = np.asarray(requests)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.dtype.kind not in "iu":
        raise InputError("requests must be a non-empty list of ints or of equal-length integer "
                         f"tuples, got an array of shape {arr.shape} and dtype {arr.dtype}")
    if (arr < 0).any():
        raise InputError("request values must be >= 0")
    return arr.astype(np.int64)


@dataclass(frozen=True)
class Structure:
    """Which values are constant, and which move together (tied groups), in every request."""

    width: int
    constant: dict[int, int]
    groups: list[list[int]]  # each group's first index is its representative

    def expand(self, free: Sequence[int]) -> tuple[int, ...]:
        """A full value tuple from one value per group."""
        out = [0] * self.width
        for v, c in self.constant.items():
            out[v] = c
        for group, value in zip(self.groups, free, strict=True):
            for v in group:
                out[v] = int(value)
        return tuple(out)


def structure_of(reqs: np.ndarray) -> Structure:
    width = reqs.shape[1]
    constant = {v: int(reqs[0, v]) for v in range(width) if (reqs[:, v] == reqs[0, v]).all()}
    groups: list[list[int]] = []
    for v in range(width):
        if v in constant:
            continue
        for g in groups:
            if (reqs[:, g[0]] == reqs[:, v]).all():
                g.append(v)
                break
        else:
            groups.append([v])
    return Structure(width, constant, groups)


# ---- costs --------------------------------------------------------------------------------------
def elements_cost(spec: GearSpec | None = None, structure: Structure | None = None) -> CostFn:
    """Total input elements of a gear: the spec's real input sizes; without a spec, the
    product of the values (each group of tied values counted once when ``structure`` is
    given; a 0 counts as 1 so that no gear is free)."""
    if spec is not None:
        from gear_runtime.tools.padding import shapes_for

        return lambda gear: float(sum(math.prod(s) for s in shapes_for(spec, gear).values()))
    keep = None if structure is None else [g[0] for g in structure.groups]
    return lambda gear: float(math.prod(max(int(gear[v]), 1) for v in
                                        (range(len(gear)) if keep is None else keep)))


@dataclass(frozen=True)
class LatencyCurve:
    """Latency (ms) as a piecewise linear function of a gear's size (its key value),
    extrapolated linearly beyond the measured ladder, never below the smallest measure."""

    sizes: tuple[int, ...]
    latency_ms: tuple[float, ...]

    def __call__(self, size: float) -> float:
        x, y = np.asarray(self.sizes, float), np.asarray(self.latency_ms, float)
        if size > x[-1] and len(x) > 1:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            return float(y[-1] + slope * (size - x[-1]))
        return float(max(np.interp(size, x, y), 0.0))

    def scaled(self, factor: float) -> LatencyCurve:
        """The curve with sizes multiplied by ``factor`` (a small model's curve stretched
        to a larger model's sizes)."""
        return LatencyCurve(tuple(int(round(s * factor)) for s in self.sizes), self.latency_ms)


def measure_latency(model: str | os.PathLike[str], spec: GearSpec,
                    ladder: Sequence[Sequence[int]], key: int = 0, *, iterations: int = 20,
                    warmup: int = 3, threads: int | None = 1, inputs: Any = None,
                    workdir: str | None = None) -> LatencyCurve:
    """Compile ``model`` (a dynamic ONNX model) under ``spec``'s inputs with the ``ladder``
    gears, benchmark every gear with the bench engine (``execute`` p50) and return latency
    as a function of value ``key``. ``inputs(model, gear)`` as for ``bench_model``."""
    import dataclasses
    import tempfile

    from gear_runtime.compiler import compile_model
    from gear_runtime.tools.bench.engine import bench_model

    gears = tuple(sorted({tuple(int(v) for v in g) for g in ladder}))
    ladder_spec = dataclasses.replace(spec, gears=gears, hybrid=False)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = os.path.join(tmp, "ladder.gear.onnx")
        compile_model(os.fspath(model), ladder_spec, path, progress=False)
        report = bench_model(path, iterations=iterations, warmup=warmup, threads=threads,
                             inputs=inputs, progress=False)
    return LatencyCurve(tuple(g[key] for g in gears), tuple(b.execute.p50 for b in report.gears))


def ladder_sizes(largest: int, count: int) -> list[int]:
    """``count`` sizes from 1 to ``largest``, geometric (latency curves bend at small sizes)."""
    sizes = np.unique(np.round(np.geomspace(1, largest, count)).astype(np.int64))
    return [int(v) for v in sizes]


def run_plan(model: str, input_shape: str, trace: str, max_gears: int, *,
             cost: str = "elements", current: str | None = None, max_gear: int | None = None,
             ladder: int = 8, iterations: int = 20, plot: str | None = None) -> str:
    """``gear-runtime plan``: the plan (and the current gears) as text."""
    requests = as_requests(read_trace(trace))
    structure = structure_of(requests)
    top = tuple(int(v) for v in requests.max(axis=0))
    # A spec needs two gears; only its inputs matter here (real sizes for "elements").
    above = ",".join(str(v + 1) for v in top)
    spec = GearSpec.from_atc(input_shape=input_shape,
                             dynamic_dims=",".join(map(str, top)) + ";" + above)
    if spec.values_per_gear != requests.shape[1]:
        raise InputError(f"the trace's requests have {requests.shape[1]} values, "
                         f"--input-shape has {spec.values_per_gear} dynamic dims")
    curve = None
    if cost == "measured":
        if len(structure.groups) != 1:
            raise InputError("--cost measured plans one (or tied) dynamic value")
        rep = structure.groups[0][0]
        largest = max_gear or top[rep]
        gears = [structure.expand([s]) for s in ladder_sizes(largest, ladder)]
        curve = measure_latency(model, spec, gears, rep, iterations=iterations)
    plan = plan_gears(requests, max_gears, cost, spec=spec, curve=curve, max_gear=max_gear)
    lines = [f"{len(requests)} requests; planned ({'exact' if plan.exact else 'heuristic'}): "
             + plan.summary(), "  " + plan.to_atc(), *("  " + c for c in plan.to_config())]
    plans = [plan]
    if current:
        gears_now = [_widen_current(structure, g) for g in current.split(";") if g.strip()]
        fn, unit = _cost_fn(cost, spec, curve, structure)
        now = evaluate(gears_now, requests, fn, unit, spec.mode, True,
                       elements_cost(spec, structure))
        lines.append("current: " + now.summary())
        plans.append(now)
    if curve is not None:
        lines.append("latency curve (size: ms): " + ", ".join(
            f"{s}: {v:.3f}" for s, v in zip(curve.sizes, curve.latency_ms, strict=True)))
    if plot:
        lines.append(f"plot: {plot_plan(plot, requests, plans, curve)}")
    return "\n".join(lines)


def _widen_current(structure: Structure, text: str) -> tuple[int, ...]:
    values = [int(v) for v in text.split(",")]
    if len(values) == structure.width:
        return tuple(values)
    if len(values) == len(structure.groups):
        return structure.expand(values)
    raise InputError(f"--current gear {text!r}: give {structure.width} values, or one per "
                     f"independent value ({len(structure.groups)})")


def _cost_fn(cost: str | CostFn, spec: GearSpec | None, curve: LatencyCurve | None,
             structure: Structure) -> tuple[CostFn, str]:
    if callable(cost):
        return cost, "cost"
    if cost == "elements":
        return elements_cost(spec, structure), "elements"
    if cost == "measured":
        if curve is None:
            raise InputError('cost="measured" needs a latency curve (measure_latency, or the '
                             "CLI's MODEL.onnx)")
        if len(structure.groups) > 1:
            raise InputError('cost="measured" plans one (or tied) dynamic value; these '
                             "requests have several independent values")
        rep = structure.groups[0][0] if structure.groups else 0
        return (lambda gear: curve(gear[rep])), "ms"
    raise InputError(f'cost must be "elements", "measured" or a callable, got {cost!r}')


# ---- evaluation ---------------------------------------------------------------------------------
def evaluate(gears: Sequence[Sequence[int]], requests: Any, cost: CostFn,
             cost_unit: str = "cost", mode: str = "dims", exact: bool = True,
             element_cost: CostFn | None = None) -> GearPlan:
    """What ``gears`` cost on ``requests``: each request on its cheapest covering gear."""
    reqs = as_requests(requests)
    gear_arr = np.asarray(sorted(tuple(int(v) for v in g) for g in gears), np.int64)
    if gear_arr.ndim != 2 or gear_arr.shape[1] != reqs.shape[1]:
        raise InputError(f"gears must have {reqs.shape[1]} values each")
    costs = np.array([cost(tuple(g)) for g in gear_arr.tolist()], float)
    uniq, inverse = np.unique(reqs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    covers = (gear_arr[:, None, :] >= uniq[None, :, :]).all(axis=2)  # [gear, request]
    masked = np.where(covers, costs[:, None], np.inf)
    choice = np.where(covers.any(axis=0), masked.argmin(axis=0), -1)
    per_request = choice[inverse]
    ok = per_request >= 0
    served = [int((per_request == g).sum()) for g in range(len(gear_arr))]
    if not ok.any():
        return GearPlan([tuple(g) for g in gear_arr.tolist()], math.nan, math.nan, math.nan,
                        1.0, served, cost_unit, mode, exact, per_request)
    request_cost = costs[per_request[ok]]
    size = element_cost or elements_cost(None, structure_of(reqs))
    gear_elems = np.array([size(tuple(g)) for g in gear_arr.tolist()])
    uniq_elems = np.array([size(tuple(r)) for r in uniq.tolist()])
    waste = 1.0 - uniq_elems[inverse[ok]].sum() / gear_elems[per_request[ok]].sum()
    return GearPlan([tuple(g) for g in gear_arr.tolist()], float(request_cost.mean()),
                    float(np.percentile(request_cost, 99)), float(waste),
                    float(1 - ok.mean()), served, cost_unit, mode, exact, per_request)


# ---- planning ---------------------------------------------------------------------------------
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
    fn, unit = _cost_fn(cost, spec, curve, structure)
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


# ---- traces -----------------------------------------------------------------------------------
def read_trace(path: str | os.PathLike[str]) -> list[tuple[int, ...]]:
    """Requests from a trace file: CSV (one request per line, its values comma-separated;
    a header line is skipped) or JSON lines (an int, a list, or an object with "dims")."""
    import json

    out: list[tuple[int, ...]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                if line[0] in "[{":
                    item = json.loads(line)
                    item = item["dims"] if isinstance(item, dict) else item
                    out.append(tuple(int(v) for v in item))
                else:
                    out.append(tuple(int(v) for v in line.split(",")))
            except (ValueError, KeyError, TypeError) as exc:
                if n == 1 and not line[0].isdigit():
                    continue  # a CSV header
                raise InputError(f"{os.fspath(path)} line {n}: not a request ({exc})") from None
    if not out:
        raise InputError(f"{os.fspath(path)} holds no requests")
    return out


def plot_plan(path: str | os.PathLike[str], requests: Any, plans: Sequence[GearPlan],
              curve: LatencyCurve | None = None) -> str:
    """The request-size histogram (first free value) with each plan's gear boundaries, and
    the latency curve when given; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    reqs = as_requests(requests)
    structure = structure_of(reqs)
    rep = structure.groups[0][0] if structure.groups else 0
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.hist(reqs[:, rep], bins=80, color="0.7", label="requests")
    ax.set_xlabel(f"dynamic value {rep}")
    ax.set_ylabel("requests")
    styles = ["-", "--", ":", "-."]
    for n, plan in enumerate(plans):
        for k, g in enumerate(plan.gears):
            ax.axvline(g[rep], color=f"C{n}", ls=styles[n % 4],
                       label=f"{plan.summary()[:60]}" if k == 0 else None)
    if curve is not None:
        ax2 = ax.twinx()
        xs = np.linspace(0, max(reqs[:, rep].max(), curve.sizes[-1]), 200)
        ax2.plot(xs, [curve(x) for x in xs], color="k", lw=1, label="latency (ms)")
        ax2.set_ylabel("latency (ms)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
    plt.close(fig)
    return os.fspath(path)
