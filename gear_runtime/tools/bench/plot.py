"""Plots of benchmark runs (``bench --plot``) and the matplotlib helpers the comparison's plot
shares (:mod:`gear_runtime.tools.bench.compare`): one colour per runner, boxes of every
iteration, a log latency axis labelled at 1-2-5 steps, saving as PNG."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_runtime.errors import BackendUnavailableError, InputError
from gear_runtime.tools.bench.report import RUNNERS

if TYPE_CHECKING:
    from gear_runtime.tools.bench.report import BenchReport, Stats


#: One colour per runner, the same in every plot.
RUNNER_COLORS = {"execute": "tab:blue", "bare": "tab:green", "naive": "tab:orange",
                 "dynamic": "tab:red"}


def plot_report(report: BenchReport, path: str | os.PathLike[str]) -> Path:
    """Write a PNG of two panels, both on a log latency scale so that slow outliers do not
    flatten fast gears: left, per gear and runner the median (dot) with its p90 (bar) and p99
    (cross) markers; right, the distribution of every iteration per gear and runner (box:
    quartiles; whiskers: p5-p95; beyond them each iteration as a dot).

    Raises BackendUnavailableError naming the package when matplotlib is not installed, and
    InputError when the file cannot be written.
    """
    plt = pyplot()
    runners = [n for n in RUNNERS if all(getattr(r, n) is not None for r in report.gears)]
    labels = [f"{r.gear}: {','.join(map(str, r.dims))}" for r in report.gears]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11.0, 2.4 * len(labels) + 4), 4.8))
    x = np.arange(len(labels))
    width = 0.8 / len(runners)
    for k, name in enumerate(runners):
        pos = x + (k - (len(runners) - 1) / 2) * width
        _percentile_markers(left, pos, [getattr(r, name) for r in report.gears], name)
        samples = [np.asarray(r.samples_ns.get(name, []), dtype=np.float64) / 1e6
                   for r in report.gears]
        if all(len(v) for v in samples):
            draw_boxes(right, pos, samples, width * 0.85, RUNNER_COLORS[name])
    for ax in (left, right):
        log_ms_axis(ax)
        ax.set_xticks(x, labels, rotation=20 if len(labels) > 4 else 0)
        ax.set_xlabel("gear: dynamic dims")
        ax.grid(axis="y", which="both", alpha=0.3)
    left.set_ylabel("latency ms (log)")
    left.set_title("median (dot), p90 (bar), p99 (cross)")
    right.set_title("every iteration: box p25-p75, whiskers p5-p95")
    _runner_legend(left, runners)
    fig.suptitle(_report_title(report), fontsize=10)
    fig.tight_layout()
    return save_figure(plt, fig, path)


def _percentile_markers(ax: Any, pos: np.ndarray, stats: Sequence[Stats], name: str) -> None:
    """Median, p90 and p99 of one runner per gear, joined by a thin line (median to p99)."""
    color = RUNNER_COLORS[name]
    p50, p90, p99 = (np.array([getattr(s, q) for s in stats]) for q in ("p50", "p90", "p99"))
    ax.vlines(pos, p50, p99, colors=color, linewidth=1, alpha=0.6)
    ax.plot(pos, p50, "o", color=color, markersize=7, label=name)
    ax.plot(pos, p90, "_", color=color, markersize=14, markeredgewidth=2)
    ax.plot(pos, p99, "x", color=color, markersize=7)


def draw_boxes(ax: Any, pos: np.ndarray, samples: Sequence[np.ndarray], width: float,
           color: str) -> None:
    """One box per gear of every iteration's latency (whiskers p5-p95, outliers as dots)."""
    parts = ax.boxplot(samples, positions=pos, widths=width, whis=(5, 95), patch_artist=True,
                       manage_ticks=False, flierprops={"marker": ".", "markersize": 3,
                                                       "markerfacecolor": color,
                                                       "markeredgecolor": color, "alpha": 0.5},
                       medianprops={"color": "black", "linewidth": 1.5})
    for box in parts["boxes"]:
        box.set_facecolor(color)
        box.set_alpha(0.55)
    for line in parts["medians"]:
        line.set_gid("median")


def log_ms_axis(ax: Any) -> None:
    """A log latency axis labelled in plain numbers at 1-2-5 steps (0.1, 0.2, 0.5, 1 ...):
    matplotlib's default labels only the powers of ten, often one or none in range."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _runner_legend(ax: Any, runners: Sequence[str]) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=RUNNER_COLORS[n], marker="o", linestyle="", label=n)
               for n in runners]
    handles += [Line2D([], [], color="gray", marker=m, linestyle="", markersize=s, label=q,
                       markeredgewidth=2 if m == "_" else 1)
                for m, s, q in (("o", 7, "p50"), ("_", 14, "p90"), ("x", 7, "p99"))]
    ax.legend(handles=handles, fontsize=8, ncol=2)


def _report_title(report: BenchReport) -> str:
    machine = report.context.get("machine", {})
    threads = report.threads if report.threads is not None else "ORT default"
    return (f"gear-runtime bench: {Path(report.model).name} ({report.backend}), "
            f"{report.iterations} iterations, threads {threads}, copy={report.copy}"
            + (f"\n{machine.get('cpu')}, {machine.get('usable_cores')} cores"
               if machine else ""))


def save_figure(plt: Any, fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as a PNG at ``path`` and close it; InputError when it cannot be written."""
    out = Path(path)
    try:
        fig.savefig(out, format="png", dpi=100)
    except OSError as exc:
        raise InputError(f"cannot write the plot to {os.fspath(out)!r}: {exc}") from None
    finally:
        plt.close(fig)
    return out


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a clear error naming what to install."""
    try:
        import matplotlib
    except ImportError:
        raise BackendUnavailableError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or pip install 'gear_runtime[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_plotting() -> None:
    """Raise the missing-matplotlib error now (before a long benchmark), else nothing."""
    pyplot()


__all__ = ["RUNNER_COLORS", "check_plotting", "draw_boxes", "log_ms_axis", "plot_report",
           "pyplot", "save_figure"]
