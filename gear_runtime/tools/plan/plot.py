"""The plan PNG: the request-size histogram with each plan's gear boundaries."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.tools.plan.costs import LatencyCurve
from gear_runtime.tools.plan.evaluate import GearPlan
from gear_runtime.tools.plan.requests import as_requests, structure_of


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
