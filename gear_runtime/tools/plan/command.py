"""``gear-runtime plan``: read a trace, plan, evaluate the current gears, print."""

from __future__ import annotations

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec
from gear_runtime.tools.plan.costs import cost_fn, elements_cost
from gear_runtime.tools.plan.evaluate import evaluate
from gear_runtime.tools.plan.measure import ladder_sizes, measure_latency
from gear_runtime.tools.plan.plot import plot_plan
from gear_runtime.tools.plan.requests import Structure, as_requests, structure_of
from gear_runtime.tools.plan.search import plan_gears
from gear_runtime.tools.plan.trace import read_trace


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
        fn, unit = cost_fn(cost, spec, curve, structure)
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
