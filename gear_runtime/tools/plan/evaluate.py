"""The plan report: what a gear set costs on a list of requests, each request on its
cheapest covering gear (:func:`evaluate`, :class:`GearPlan`)."""

from __future__ import annotations

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
