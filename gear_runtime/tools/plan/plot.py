"""The plan PNG (``gear-runtime plan --plot``): the request-size histogram with each plan's
gear boundaries and the latency curve above, and below it the planned vs current figures
(coverage, mean, p99, padding waste) as a table, so the comparison reads at a glance."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gear_runtime.tools.plan.costs import LatencyCurve
from gear_runtime.tools.plan.evaluate import GearPlan, number_text
from gear_runtime.tools.plan.requests import as_requests, structure_of
from gear_runtime.tools.plan.trace import TraceLayout

_NAMES = ("planned", "current")
_STYLES = ("-", "--", ":", "-.")


def plot_plan(path: str | os.PathLike[str], requests: Any, plans: Sequence[GearPlan],
              curve: LatencyCurve | None = None, layout: TraceLayout | None = None) -> Path:
    """Write the plan PNG to ``path``: ``plans[0]`` is the plan, ``plans[1]`` (if any) the
    current gears. The x axis is the first value that varies (its symbolic name and inputs
    from ``layout``). BackendUnavailableError without matplotlib; InputError when the file
    cannot be written."""
    from gear_runtime.tools.bench.plot import pyplot, save_figure

    plt = pyplot()
    reqs = as_requests(requests)
    structure = structure_of(reqs)
    rep = structure.groups[0][0] if structure.groups else 0
    fig, (ax, table_ax) = plt.subplots(2, 1, figsize=(10, 6.4),
                                       gridspec_kw={"height_ratios": [3.2, 1]})
    ax.hist(reqs[:, rep], bins=min(80, max(10, len(np.unique(reqs[:, rep])))), color="0.75",
            label=f"requests ({len(reqs):,})")
    ax.set_xlabel(_axis_label(layout, rep))
    ax.set_ylabel("requests")
    for n, plan in enumerate(plans):
        for k, g in enumerate(plan.gears):
            ax.axvline(g[rep], color=f"C{n}", ls=_STYLES[n % 4], lw=1.6,
                       label=f"{_NAMES[n] if n < 2 else f'set {n}'} gears ({len(plan.gears)})"
                       if k == 0 else None)
    handles, labels = ax.get_legend_handles_labels()
    if curve is not None:
        ax2 = ax.twinx()
        xs = np.linspace(1, max(float(reqs[:, rep].max()), float(curve.sizes[-1])), 200)
        line, = ax2.plot(xs, [curve(x) for x in xs], color="k", lw=1.2,
                         label="latency (ms, measured ladder)")
        ax2.plot(curve.sizes, curve.latency_ms, "k.", ms=5)
        ax2.set_ylabel("latency ms")
        ax2.set_ylim(bottom=0)
        handles, labels = handles + [line], labels + [line.get_label()]
    ax.legend(handles, labels, fontsize=8, loc="upper right", framealpha=0.9)
    unit = plans[0].cost_unit if plans else ""
    ax.set_title(f"gear plan: {len(reqs):,} requests, cost in {unit}", fontsize=11)
    _table(table_ax, plans, unit)
    fig.tight_layout()
    return save_figure(plt, fig, path)


def _axis_label(layout: TraceLayout | None, rep: int) -> str:
    if layout is None:
        return f"dynamic value {rep}"
    for g, group in enumerate(layout.groups):
        if rep in group:
            inputs = " = ".join(layout.labels[v] for v in group)
            name = layout.names[g]
            return f"{name} ({inputs})" if name else inputs
    return layout.labels[rep]


def _table(ax: Any, plans: Sequence[GearPlan], unit: str) -> None:
    """The figures of every plan as a table (mean and p99 with enough digits to differ)."""
    ax.axis("off")
    if not plans:
        return
    columns = ["", "gears", "coverage", "uncovered", f"mean ({unit})", "p99", "padding waste"]
    rows = []
    for n, p in enumerate(plans):
        gears = "; ".join(",".join(map(str, dict.fromkeys(g))) for g in p.gears)
        rows.append([_NAMES[n] if n < 2 else f"set {n}",
                     gears if len(gears) <= 48 else gears[:45] + "...",
                     f"{100 * p.coverage:.2f}%", f"{p.uncovered_count:,}",
                     number_text(p.mean_cost),
                     number_text(p.p99_cost), f"{100 * p.waste:.1f}%"])
    table = ax.table(cellText=rows, colLabels=columns, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.5)
    for (r, c), cell in table.get_celld().items():
        if r > 0 and c == 0:
            cell.get_text().set_color(f"C{r - 1}")
    if any(p.uncovered_count for p in plans):
        ax.text(0.5, 0.0, "uncovered requests are counted at their own size (hybrid "
                "fallback); a plain gear file refuses them", ha="center", va="bottom",
                fontsize=8, transform=ax.transAxes)
