"""``gear-runtime plan``: read a trace, plan, evaluate the current gears; text and JSON.

The JSON (``--json PATH|-``) is one object, schema ``"gear-runtime-plan/1"``::

    {"schema": "gear-runtime-plan/1",
     "requests": 10000,                      # requests in the trace
     "cost": "elements" | "measured", "cost_unit": "elements" | "ms",
     "uncovered_cost": "...",                # how uncovered requests are counted
     "dynamic_values": ["input_ids[1]", ...],  # GE dims order: what a gear's values are
     "planned": PLAN, "current": PLAN | null,
     "atc": "--input_shape=\"...\" --dynamic_dims=\"...\"",   # pastes into a shell
     "config": ["ge.dynamicDims=...", "[ascend_context]", "input_shape=...", ...],
     "latency_curve": {"sizes": [...], "latency_ms": [...]} | null,
     "plot": "plan.png" | null}

    PLAN = {"gears": [[32, 32, 32], ...], "exact": true, "coverage": 0.953,
            "uncovered_requests": 470, "mean": 1641.2, "p99": 2048.0,
            "covered_mean": 1500.3, "padding_waste": 0.123, "served": [5000, ...]}

``mean`` and ``p99`` are over every request (uncovered ones at their own size, as the
hybrid fallback runs them); ``covered_mean`` over the covered ones; null where undefined. A
later version adds fields and bumps the number only when a field changes meaning. Since the
quoted form, "atc" holds the whole flag line (input shape and gears) rather than the gear
flag alone, and "config" a complete ``[ascend_context]`` block after the GE option.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec
from gear_runtime.tools.common import jsonout
from gear_runtime.tools.plan.costs import LatencyCurve, cost_fn, elements_cost
from gear_runtime.tools.plan.evaluate import GearPlan, evaluate
from gear_runtime.tools.plan.measure import ladder_sizes, measure_latency
from gear_runtime.tools.plan.requests import Structure, as_requests, structure_of
from gear_runtime.tools.plan.search import plan_gears
from gear_runtime.tools.plan.trace import TraceLayout, layout_of, read_trace

SCHEMA = jsonout.schema_name("plan", 1)
#: GE accepts at most this many gears (E10036; 256 on 950-series chips).
GE_MAX_GEARS = 100
UNCOVERED_COST = ("requests no gear covers are counted at the cost of their own size (what "
                  "a hybrid gear file's dynamic-shape fallback runs); a plain gear file "
                  "refuses them (145013)")


@dataclass
class PlanRun:
    """What ``gear-runtime plan`` found: the plan, the current gears' report, the curve."""

    requests: int
    cost: str
    planned: GearPlan
    current: GearPlan | None
    layout: TraceLayout
    curve: LatencyCurve | None = None
    plot: str | None = None
    #: the --input-shape planned for (the atc line and the config block repeat it)
    input_shape: str = ""

    def atc_line(self) -> str:
        """The atc flags for the plan, each quoted, so the line pastes into bash: the
        input shape and the mode's flag (``--dynamic_batch_size`` when every dynamic axis is
        axis 0 and the gears tie them, as GE's batch mode needs)."""
        return f'--input_shape="{self.input_shape}" ' + self._as_mode().to_atc()

    def config_block(self) -> list[str]:
        """A complete ``[ascend_context]`` block for MindSpore Lite's converter: the input
        shape in its bracket form and the gears as ``dynamic_dims``."""
        from gear_runtime.spec.parse import parse_input_shape

        names, shapes = parse_input_shape(self.input_shape)
        shape = ";".join(f"{n}:[{','.join(map(str, s))}]" for n, s in zip(names, shapes,
                                                                           strict=True))
        plan = self._as_mode()
        groups = ",".join("[" + ",".join(map(str, g[:1] if plan.mode == "batch" else g)) + "]"
                          for g in plan.gears)
        return ["[ascend_context]", f"input_shape={shape}", f"dynamic_dims={groups}"]

    def _as_mode(self) -> GearPlan:
        """The plan in batch mode when the input shape and the gears are GE's batch form."""
        from gear_runtime.spec.parse import parse_input_shape

        plan = self.planned
        if not self.input_shape:
            return plan
        _, shapes = parse_input_shape(self.input_shape)
        axes = [a for s in shapes for a, d in enumerate(s) if d == -1]
        if axes and all(a == 0 for a in axes) and all(len(set(g)) == 1 for g in plan.gears):
            return dataclasses.replace(plan, mode="batch")
        return plan

    def text(self) -> str:
        plan = self.planned
        lines = [f"{self.requests:,} requests; planned "
                 f"({'exact' if plan.exact else 'heuristic'}): " + plan.summary(),
                 "  atc: " + self.atc_line(),
                 "  " + self._as_mode().to_config()[0],
                 *("  " + c for c in self.config_block())]
        if len(plan.gears) > GE_MAX_GEARS:
            lines.append(f"  note: {len(plan.gears)} gears; GE accepts at most {GE_MAX_GEARS} "
                         "(E10036): ask for fewer with --max-gears")
        if self.current is not None:
            lines.append("current: " + self.current.summary())
            lines.append("  " + plan.compare(self.current))
        if any(p.uncovered_count for p in (plan, self.current) if p is not None):
            lines.append("  (" + UNCOVERED_COST + ")")
        if self.curve is not None:
            lines.append("latency curve (size: ms): " + ", ".join(
                f"{s}: {v:.3f}" for s, v in zip(self.curve.sizes, self.curve.latency_ms,
                                                strict=True)))
        if self.plot:
            lines.append(f"plot: {self.plot}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "requests": self.requests, "cost": self.cost,
                "cost_unit": self.planned.cost_unit, "uncovered_cost": UNCOVERED_COST,
                "dynamic_values": list(self.layout.labels),
                "planned": self.planned.to_json(),
                "current": None if self.current is None else self.current.to_json(),
                "atc": self.atc_line(), "config": self._as_mode().to_config()[:1]
                + self.config_block(),
                "latency_curve": None if self.curve is None else {
                    "sizes": list(self.curve.sizes), "latency_ms": list(self.curve.latency_ms)},
                "plot": self.plot}


def run_plan(model: str, input_shape: str, trace: str, max_gears: int, *,
             cost: str = "elements", current: str | None = None, max_gear: int | None = None,
             ladder: int = 8, iterations: int = 20, plot: str | None = None,
             progress: bool = False) -> PlanRun:
    """``gear-runtime plan``: plan ``max_gears`` gears for the requests of ``trace`` (the
    forms of :mod:`gear_runtime.tools.plan.trace`, tied by ``model``'s symbolic dim names),
    evaluate ``current`` ("32;128;512", one value per tied group or per dynamic value), and
    draw ``plot``. ``progress``: bars on a terminal for the long steps."""
    spec = _spec(input_shape)
    layout = layout_of(spec, model)
    requests = as_requests(read_trace(trace, layout))
    structure = structure_of(requests)
    curve = None
    if cost == "measured":
        curve = _measure(model, spec, structure, requests, max_gear, ladder, iterations,
                         progress)
    plan = plan_gears(requests, max_gears, cost, spec=spec, curve=curve, max_gear=max_gear,
                      progress=progress)
    now = None
    if current:
        gears_now = [_widen_current(layout, structure, g) for g in current.split(";")
                     if g.strip()]
        fn, unit = cost_fn(cost, spec, curve, structure)
        now = evaluate(gears_now, requests, fn, unit, spec.mode, True,
                       elements_cost(spec, structure))
    run = PlanRun(len(requests), cost, plan, now, layout, curve, input_shape=input_shape)
    if plot:
        from gear_runtime.tools.plan.plot import plot_plan

        run.plot = os.fspath(plot_plan(plot, requests, [p for p in (plan, now) if p], curve,
                                       layout))
    return run


def _spec(input_shape: str) -> GearSpec:
    """A spec of ``input_shape``'s inputs (two placeholder gears: only the inputs matter
    here, for their real sizes and the dynamic values' order)."""
    from gear_runtime.spec.parse import parse_input_shape

    _, shapes = parse_input_shape(input_shape)
    width = sum(d == -1 for shape in shapes for d in shape)
    if width == 0:
        raise InputError(f"--input-shape {input_shape!r} has no dynamic axis (-1): nothing "
                         "to plan")
    return GearSpec.from_atc(input_shape=input_shape, dynamic_dims=";".join(
        ",".join([str(v)] * width) for v in (1, 2)))


def _measure(model: str, spec: GearSpec, structure: Structure, requests: Any,
             max_gear: int | None, ladder: int, iterations: int, progress: bool
             ) -> LatencyCurve:
    if len(structure.groups) != 1:
        raise InputError("--cost measured plans one (or tied) dynamic value; these requests "
                         f"have {len(structure.groups)} independent values")
    rep = structure.groups[0][0]
    largest = max_gear or int(requests[:, rep].max())
    gears = [structure.expand([s]) for s in ladder_sizes(largest, ladder)]
    return measure_latency(model, spec, gears, rep, iterations=iterations, progress=progress)


def _widen_current(layout: TraceLayout, structure: Structure, text: str) -> tuple[int, ...]:
    """One --current gear as a full value tuple: per tied group or per dynamic value (the
    trace's forms), or per independent value of the trace (its constant values filled in)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"--current gear {text!r}: expected integers separated by ',' "
                         "(gears separated by ';')") from None
    if any(v < 1 for v in values):
        raise InputError(f"--current gear {text!r}: gear values are >= 1")
    gear = layout.widen(values)
    if gear is None and len(values) == len(structure.groups):
        gear = structure.expand(values)
    if gear is None:
        raise InputError(f"--current gear {text!r}: expected {layout.form()}")
    return gear
