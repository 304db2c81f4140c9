"""What a gear costs: ``"elements"`` (total input elements: the product of the values, or
the model's real input sizes when a spec is given), ``"measured"`` (a :class:`LatencyCurve`
from :func:`gear_runtime.tools.plan.measure.measure_latency`, latency interpolated
piecewise linearly), or any callable on a gear's value tuple."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec
from gear_runtime.tools.plan.requests import Structure

CostFn = Callable[[tuple[int, ...]], float]


def elements_cost(spec: GearSpec | None = None, structure: Structure | None = None) -> CostFn:
    """Total input elements of a gear: the spec's real input sizes; without a spec, the
    product of the values (each group of tied values counted once when ``structure`` is
    given; a 0 counts as 1 so that no gear is free)."""
    if spec is not None:
        return lambda gear: float(sum(math.prod(s) for s in spec.shapes_for(gear).values()))
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



def cost_fn(cost: str | CostFn, spec: GearSpec | None, curve: LatencyCurve | None,
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
