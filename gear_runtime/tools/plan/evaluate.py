"""The plan report: what a gear set costs on a list of requests, each request on its
cheapest covering gear (:func:`evaluate`, :class:`GearPlan`).

Every request counts. A request no gear covers is refused by a plain gear file and run by a
hybrid one on its dynamic-shape graph at the request's own size; the report counts it at
that fallback cost (by default the cost function at the request's own values: what a gear
of exactly its size would cost, which on ONNX Runtime's CPU provider is what the
dynamic-shape run costs too) and says how many requests that is, so that the means of a gear
set that covers everything and of one that does not are comparable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.tools.plan.costs import CostFn, elements_cost
from gear_runtime.tools.plan.requests import as_requests, structure_of


@dataclass
class GearPlan:
    """A gear set and what it costs on the requests it was planned (or evaluated) on.

    ``gears``: value tuples as ``GearSpec.gears`` (ascending). ``mean_cost`` / ``p99_cost``:
    per request over ALL requests, uncovered ones at the fallback cost (module doc), in the
    cost's unit (``cost_unit``); ``covered_mean_cost``: over the covered requests only
    (NaN when none is). ``waste``: the share of the elements the gears process that is
    padding (over covered requests). ``uncovered``: the share of requests no gear covers
    (``uncovered_count`` of ``requests``). ``served[g]``: requests gear g serves.
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
    covered_mean_cost: float = math.nan
    uncovered_count: int = 0
    requests: int = 0

    @property
    def coverage(self) -> float:
        """The share of requests some gear covers."""
        return 1.0 - self.uncovered

    def to_atc(self) -> str:
        """The ATC flag for these gears, quoted so that it pastes into a shell as one word
        (unquoted, bash would end the command at the first ``;``), e.g.
        ``--dynamic_dims="32,32;512,512"``."""
        if self.mode == "batch":
            return '--dynamic_batch_size="' + ",".join(str(g[0]) for g in self.gears) + '"'
        flag = "dynamic_image_size" if self.mode == "image_size" else "dynamic_dims"
        return f'--{flag}="' + ";".join(",".join(map(str, g)) for g in self.gears) + '"'

    def compare(self, other: GearPlan) -> str:
        """One line saying how this plan compares with ``other`` (the current gears): mean
        and p99 cost as ratios, padding waste and coverage side by side."""
        def ratio(a: float, b: float) -> str:
            if not (math.isfinite(a) and math.isfinite(b)) or a <= 0 or b <= 0:
                return "n/a"
            return f"{b / a:.2f}x lower" if a < b else (
                "the same" if a == b else f"{a / b:.2f}x higher")
        return (f"planned vs current: mean {ratio(self.mean_cost, other.mean_cost)} "
                f"({number_text(self.mean_cost)} vs {number_text(other.mean_cost)} "
                f"{self.cost_unit}), p99 {ratio(self.p99_cost, other.p99_cost)}, padding waste "
                f"{100 * self.waste:.1f}% vs {100 * other.waste:.1f}%, coverage "
                f"{100 * self.coverage:.2f}% vs {100 * other.coverage:.2f}%")

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
        """One line: the gears, coverage, the means (all requests; covered ones), p99, waste."""
        gears = "; ".join(",".join(map(str, g)) for g in self.gears)
        text = (f"gears {gears}: coverage {100 * self.coverage:.2f}%, mean "
                f"{number_text(self.mean_cost)} {self.cost_unit}")
        if self.uncovered_count:
            text += (f" over all requests ({self.uncovered_count:,} uncovered counted at their"
                     f" own size; {number_text(self.covered_mean_cost)} over the covered ones)")
        return text + f", p99 {number_text(self.p99_cost)}, padding waste {100 * self.waste:.1f}%"

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON values (``gear-runtime plan --json``; NaN as null)."""
        return {"gears": [list(g) for g in self.gears], "exact": self.exact,
                "coverage": self.coverage, "uncovered_requests": self.uncovered_count,
                "mean": _finite(self.mean_cost), "p99": _finite(self.p99_cost),
                "covered_mean": _finite(self.covered_mean_cost),
                "padding_waste": _finite(self.waste), "served": list(self.served)}

    def without_idle_gears(self) -> GearPlan:
        """The plan without the gears that serve no request (they change no cost)."""
        keep = [g for g, n in enumerate(self.served) if n]
        if len(keep) == len(self.gears):
            return self
        remap = np.full(len(self.gears) + 1, -1, np.int64)
        remap[keep] = np.arange(len(keep))
        return dataclasses.replace(self, gears=[self.gears[g] for g in keep],
                                   served=[self.served[g] for g in keep],
                                   assignment=remap[self.assignment])


def number_text(v: float) -> str:
    """Four significant digits, trailing zeros kept, so two plans' figures line up and
    differ visibly (1,641, 0.8808 vs 0.8992, 1.990 vs 2.096)."""
    if not math.isfinite(v):
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:#.4g}"


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def evaluate(gears: Sequence[Sequence[int]], requests: Any, cost: CostFn,
             cost_unit: str = "cost", mode: str = "dims", exact: bool = True,
             element_cost: CostFn | None = None,
             uncovered_cost: CostFn | None = None) -> GearPlan:
    """What ``gears`` cost on ``requests``: each request on its cheapest covering gear, a
    request no gear covers at ``uncovered_cost`` of its own values (default ``cost``: the
    fallback at its own size, module doc)."""
    reqs = as_requests(requests)
    gear_arr = np.asarray(sorted(tuple(int(v) for v in g) for g in gears), np.int64)
    if gear_arr.ndim != 2 or gear_arr.shape[1] != reqs.shape[1]:
        raise InputError(f"gears must have {reqs.shape[1]} values each")
    costs = np.array([cost(tuple(g)) for g in gear_arr.tolist()], float)
    uniq, inverse = np.unique(reqs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    choice, chosen_cost = _cheapest_cover(gear_arr, costs, uniq)
    per_request = choice[inverse]
    ok = per_request >= 0
    served = np.bincount(per_request[ok], minlength=len(gear_arr)).tolist()
    fallback = uncovered_cost or cost
    missing = np.flatnonzero(choice < 0)
    chosen_cost[missing] = [fallback(tuple(r)) for r in uniq[missing].tolist()]
    request_cost = chosen_cost[inverse]
    size = element_cost or elements_cost(None, structure_of(reqs))
    if ok.any():
        gear_elems = np.array([size(tuple(g)) for g in gear_arr.tolist()])
        uniq_elems = np.array([size(tuple(r)) for r in uniq.tolist()])
        waste = float(1.0 - uniq_elems[inverse[ok]].sum() / gear_elems[per_request[ok]].sum())
        covered_mean = float(request_cost[ok].mean())
    else:
        waste = covered_mean = math.nan
    return GearPlan([tuple(g) for g in gear_arr.tolist()], float(request_cost.mean()),
                    float(np.percentile(request_cost, 99)), waste, float(1 - ok.mean()),
                    served, cost_unit, mode, exact, per_request, covered_mean,
                    int((~ok).sum()), len(reqs))


#: Up to this many gear x request x value cells, the cover test is one array operation.
_VECTOR_CELLS = 4_000_000


def _cheapest_cover(gears: np.ndarray, costs: np.ndarray, uniq: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct request: the index of the cheapest gear covering it (-1: none) and its
    cost (inf: none). One array operation when small, else gear by gear (bounded memory)."""
    if gears.size * len(uniq) <= _VECTOR_CELLS:
        covers = (gears[:, None, :] >= uniq[None, :, :]).all(axis=2)  # [gear, request]
        masked = np.where(covers, costs[:, None], np.inf)
        best = masked.argmin(axis=0) if len(gears) else np.zeros(len(uniq), np.int64)
        found = covers.any(axis=0)
        return (np.where(found, best, -1).astype(np.int64),
                np.where(found, masked.min(axis=0, initial=np.inf), np.inf))
    choice = np.full(len(uniq), -1, np.int64)
    chosen_cost = np.full(len(uniq), np.inf)
    for g in range(len(gears)):
        better = (gears[g] >= uniq).all(axis=1) & (costs[g] < chosen_cost)
        choice[better], chosen_cost[better] = g, costs[g]
    return choice, chosen_cost
