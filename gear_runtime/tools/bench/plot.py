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
        log_axis(ax)
        ax.set_xticks(x, labels, rotation=20 if len(labels) > 4 else 0)
        ax.set_xlabel("gear: dynamic dims")
        ax.grid(axis="y", which="both", alpha=0.3)
    left.set_ylabel("latency ms (log)")
    left.set_title("median (dot), p90 (bar), p99 (cross)")
    right.set_title("every iteration: box p25-p75, whiskers p5-p95")
    fig.suptitle(_report_title(report), fontsize=10)
    _runner_legend(fig, runners)
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


def log_axis(ax: Any) -> None:
    """A log y axis (latencies, ratios) labelled in plain numbers (matplotlib's default
    labels only the powers of ten, often one or none in range), as densely as the range
    allows: at 1-2-5
    steps over two decades or more, at 1-1.5-2-3-5-7 steps over less (so a range such as
    0.004-0.03 ms reads 0.005, 0.007, 0.01, 0.015, 0.02, 0.03, not three labels). Call it
    after the data is drawn: it reads the axis's range."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    decades = np.log10(high / low) if low > 0 and high > low else 3.0
    subs = (1.0, 2.0, 5.0) if decades >= 2 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _runner_legend(fig: Any, runners: Sequence[str]) -> None:
    """One legend for both panels, below them: a legend inside an axis hides data."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=RUNNER_COLORS[n], marker="s", linestyle="", markersize=8,
                      label=n) for n in runners]
    handles += [Line2D([], [], color="gray", marker=m, linestyle="", markersize=s, label=q,
                       markeredgewidth=2 if m == "_" else 1)
                for m, s, q in (("o", 7, "p50"), ("_", 14, "p90"), ("x", 7, "p99"))]
    legend_below(fig, handles)


def legend_below(fig: Any, handles: Sequence[Any]) -> None:
    """A figure legend in one row under the panels, and room made for it (never over data)."""
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))


def _report_title(report: BenchReport) -> str:
    machine = report.context.get("machine", {})
    threads = report.threads if report.threads is not None else "ORT default"
    return (f"gear-runtime bench: {Path(report.model).name} ({report.backend}), "
            f"{report.iterations} iterations, threads {threads}, copy={report.copy}"
            + (f"\n{machine.get('cpu')}, {machine.get('usable_cores')} cores"
               if machine else ""))


def check_png_name(path: str | os.PathLike[str], flag: str = "plot") -> Path:
    """``path`` as a Path when its name ends in ``.png`` (any case); InputError naming ``flag``
    otherwise: the plots are PNGs, and a PNG named .jpg or .pdf misleads whoever opens it."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise InputError(f"{flag} {os.fspath(path)!r}: the plot is written as PNG; give a file "
                         "name ending in .png")
    return out


def save_figure(plt: Any, fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as a PNG at ``path`` and close it; InputError when the name does not end
    in .png or the file cannot be written."""
    try:
        out = check_png_name(path)
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


__all__ = ["RUNNER_COLORS", "check_plotting", "check_png_name", "draw_boxes", "legend_below",
           "log_axis", "plot_report", "pyplot", "save_figure"]
