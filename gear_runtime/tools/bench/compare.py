"""Compare two ``gear-runtime bench --json`` runs of the same model, gear by gear.

Per gear: the ratio of the medians of ``execute`` (after / before) with a bootstrap 95%
confidence interval over the iterations of both runs (each run's per-iteration times are
resampled with replacement, the ratio of the resampled medians taken each time). Verdict:

* ``slower``: the whole interval lies above ``1 + noise``;
* ``faster``: the whole interval lies below ``1 / (1 + noise)``;
* ``within noise`` otherwise;
* ``machine changed`` whatever execute did, when the ``bare`` column (the backend's own run,
  timed interleaved with execute) moved beyond noise by the same rule: the machine or the
  backend changed, and this comparison cannot tell the runtime's share; the normalised ratio
  (execute's over bare's) is shown as the best estimate of it.

``noise`` (default 5%) covers what the interval cannot: the bootstrap sees the spread of the
iterations inside each run, not the drift of a machine between two runs (frequency, other
processes), which on a shared machine is a few percent. Two runs of
different models or gear sets are refused (InputError); differences of machine or settings
are warnings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.tools.bench.plot import (
    draw_boxes,
    legend_below,
    log_axis,
    pyplot,
    save_figure,
)
from gear_runtime.tools.bench.result import check_result
from gear_runtime.tools.common.textfmt import format_table

#: Default half-width of the band a ratio must leave to count as a change (5%).
DEFAULT_NOISE = 0.05
#: Bootstrap resamples per gear and the confidence level of the interval.
RESAMPLES = 2000
CONFIDENCE = 0.95
#: Settings that change what is measured: a difference is warned about.
COMPARED_SETTINGS = ("backend", "providers", "threads", "warmup", "iterations", "copy",
                     "pad", "fill", "request")
#: The start load average above this fraction of the usable cores is called a busy machine.
BUSY_LOAD = 0.75


@dataclass(frozen=True)
class GearDelta:
    """One gear of a comparison: medians in ms, the ratio after / before and its interval."""

    gear: int
    dims: tuple[int, ...]
    before_ms: float
    after_ms: float
    ratio: float
    low: float
    high: float
    verdict: str  # "faster" | "slower" | "within noise" | "machine changed"
    #: the same ratio of the bare column (the backend alone) and its interval; None where
    #: either run lacks it.
    bare_ratio: float | None = None
    bare_low: float | None = None
    bare_high: float | None = None

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    @property
    def normalised_ratio(self) -> float | None:
        """execute's ratio over bare's: the runtime's share of the change, the machine's and
        the backend's taken out (None without a bare column)."""
        return None if self.bare_ratio is None else self.ratio / self.bare_ratio


@dataclass
class Comparison:
    """A whole comparison: the gears, the warnings, and what the two runs were."""

    before: str
    after: str
    noise: float
    gears: list[GearDelta] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def regressions(self, pct: float) -> list[GearDelta]:
        """Gears slower beyond noise whose median grew by more than ``pct`` percent."""
        return [d for d in self.gears if d.verdict == "slower" and d.change_pct > pct]

    def table(self) -> str:
        """The human table: one row per gear, then the notes."""
        return format_comparison(self)


# ---- comparing --------------------------------------------------------------------------------
def compare_results(before: dict[str, Any], after: dict[str, Any], *,
                    noise: float = DEFAULT_NOISE, seed: int = 0,
                    names: tuple[str, str] = ("before", "after")) -> Comparison:
    """Compare two loaded results (see the module docstring for the rule).

    InputError when they measured different models (digest, or size where the digests
    cannot be compared) or different gear sets; warnings for machines or settings that
    differ and for a busy machine at the start of a run.
    """
    if not 0 <= noise < 1:
        raise InputError(f"noise must be in [0, 1), got {noise!r}")
    for data, name in zip((before, after), names, strict=True):
        check_result(data, name)  # what a verdict is computed from: no NaN "within noise"
    _check_same_model(before, after, names)
    _check_same_gears(before, after, names)
    out = Comparison(names[0], names[1], noise)
    out.warnings = context_warnings(before, after, names)
    out.notes = _version_notes(before, after, names)
    rng = np.random.default_rng(seed)
    for b, a in zip(before["gears"], after["gears"], strict=True):
        out.gears.append(_delta(b, a, noise, rng))
    out.warnings += [f"gear {d.gear}: the bare run (the backend alone) moved x{d.bare_ratio:.3f} "
                     "beyond noise too: the machine or the backend changed, so this comparison "
                     "cannot tell the runtime's change from it (normalised "
                     f"x{d.normalised_ratio:.3f})"
                     for d in out.gears if d.verdict == "machine changed"]
    return out


def _model(data: dict[str, Any]) -> dict[str, Any]:
    return data.get("context", {}).get("model", {}) or {}


def _check_same_model(before: dict[str, Any], after: dict[str, Any],
                      names: tuple[str, str]) -> None:
    """InputError unless both runs measured the same model files."""
    mb, ma = _model(before), _model(after)
    db, da = mb.get("digest"), ma.get("digest")
    same_algo = db and da and db.split(":", 1)[0] == da.split(":", 1)[0]
    if same_algo and db != da:
        raise InputError(
            f"--compare: {names[0]} and {names[1]} measured different models: "
            f"{mb.get('path')} ({db}, {mb.get('bytes')} bytes) vs {ma.get('path')} ({da}, "
            f"{ma.get('bytes')} bytes); compare two runs of the same gear file")
    if not same_algo and mb.get("bytes") != ma.get("bytes"):
        raise InputError(
            f"--compare: {names[0]} and {names[1]} measured different models: "
            f"{mb.get('path')} ({mb.get('bytes')} bytes) vs {ma.get('path')} "
            f"({ma.get('bytes')} bytes)")


def _check_same_gears(before: dict[str, Any], after: dict[str, Any],
                      names: tuple[str, str]) -> None:
    """InputError unless both runs timed the same gears (same indices, same dims)."""
    def gears(data: dict[str, Any]) -> list[tuple[int, tuple[int, ...]]]:
        return [(int(g["gear"]), tuple(g["dims"])) for g in data.get("gears", [])]

    gb, ga = gears(before), gears(after)
    if not gb or gb != ga:
        raise InputError(
            f"--compare: {names[0]} and {names[1]} timed different gear sets: "
            f"{_gear_text(gb)} vs {_gear_text(ga)}; run both with the same --gears")


def _gear_text(gears: Sequence[tuple[int, tuple[int, ...]]]) -> str:
    return "[" + "; ".join(f"{g}: {','.join(map(str, d))}" for g, d in gears) + "]"


def context_warnings(before: dict[str, Any], after: dict[str, Any],
                     names: tuple[str, str] = ("before", "after")) -> list[str]:
    """One line per difference that can move the timings: the machine (CPU model, cores),
    the settings (:data:`COMPARED_SETTINGS`) and a busy machine at the start of a run."""
    cb, ca = before.get("context", {}), after.get("context", {})
    warnings = []
    for key in ("cpu", "cores", "usable_cores"):
        vb, va = cb.get("machine", {}).get(key), ca.get("machine", {}).get(key)
        if vb != va:
            warnings.append(f"different machines: {key} {vb!r} vs {va!r}")
    for key in COMPARED_SETTINGS:
        vb, va = cb.get("settings", {}).get(key), ca.get("settings", {}).get(key)
        if vb != va:
            warnings.append(f"different settings: {key} {vb!r} vs {va!r}")
    for name, ctx in zip(names, (cb, ca), strict=True):
        machine = ctx.get("machine", {})
        load, cores = machine.get("load_average"), machine.get("usable_cores")
        if load and cores and load[0] > BUSY_LOAD * cores:
            warnings.append(f"{name} started on a busy machine: load average {load[0]:.2f} on "
                            f"{cores} cores")
    return warnings


def _version_notes(before: dict[str, Any], after: dict[str, Any],
                   names: tuple[str, str]) -> list[str]:
    vb = before.get("context", {}).get("versions", {})
    va = after.get("context", {}).get("versions", {})
    return [f"versions differ: {k} {vb.get(k)} ({names[0]}) vs {va.get(k)} ({names[1]})"
            for k in sorted(set(vb) | set(va)) if vb.get(k) != va.get(k)]


def _delta(before: dict[str, Any], after: dict[str, Any], noise: float,
           rng: np.random.Generator) -> GearDelta:
    """One gear's ratio of execute medians, its bootstrap interval and verdict: "machine
    changed" when the bare run (the backend alone, timed alongside) moved beyond noise too,
    since then this comparison cannot tell the runtime's change from the machine's."""
    b, a = _ms(before, "execute"), _ms(after, "execute")
    ratio = float(np.median(a) / np.median(b))
    low, high = bootstrap_ratio_interval(b, a, rng)
    verdict = _verdict(low, high, noise)
    bare: tuple[float | None, ...] = (None, None, None)
    if before["samples_ns"].get("bare") and after["samples_ns"].get("bare"):
        bb, ba = _ms(before, "bare"), _ms(after, "bare")
        bare = (float(np.median(ba) / np.median(bb)), *bootstrap_ratio_interval(bb, ba, rng))
        if _verdict(bare[1], bare[2], noise) != "within noise":
            verdict = "machine changed"
    return GearDelta(int(before["gear"]), tuple(before["dims"]), float(np.median(b)),
                     float(np.median(a)), ratio, low, high, verdict, *bare)


def _ms(gear: dict[str, Any], runner: str) -> np.ndarray:
    return np.asarray(gear["samples_ns"][runner], dtype=np.float64) / 1e6


def _verdict(low: float, high: float, noise: float) -> str:
    """The rule of the module docstring: the whole interval beyond the noise band."""
    if low > 1 + noise:
        return "slower"
    if high < 1 / (1 + noise):
        return "faster"
    return "within noise"


def bootstrap_ratio_interval(before: np.ndarray, after: np.ndarray,
                             rng: np.random.Generator, resamples: int = RESAMPLES,
                             confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval of median(after) / median(before): each run's
    samples resampled with replacement, independently. Resampled in blocks of rows, so the
    memory stays near :data:`BOOTSTRAP_BLOCK` values whatever the sample counts."""
    mb = _resampled_medians(before, rng, resamples)
    ma = _resampled_medians(after, rng, resamples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ma / mb, [tail, 100 - tail])
    return float(low), float(high)


#: Values drawn at once by the bootstrap (8 MiB of indices, 8 MiB of samples).
BOOTSTRAP_BLOCK = 2**20


def _resampled_medians(samples: np.ndarray, rng: np.random.Generator,
                       resamples: int) -> np.ndarray:
    """The medians of ``resamples`` resamples (with replacement) of ``samples``."""
    n = len(samples)
    rows = max(1, BOOTSTRAP_BLOCK // n)
    out = np.empty(resamples)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        out[start:stop] = np.median(samples[rng.integers(0, n, (stop - start, n))], axis=1)
    return out


# ---- output -------------------------------------------------------------------------------------
def format_comparison(cmp: Comparison) -> str:
    """Fixed-width table: per gear both medians, the ratio, its interval and the verdict."""
    header = ["gear", "dims", "before p50 ms", "after p50 ms", "after/before",
              f"{CONFIDENCE:.0%} CI", "change", "bare after/before", "normalised", "verdict"]
    rows = [header]
    for d in cmp.gears:
        bare = "-" if d.bare_ratio is None else f"{d.bare_ratio:.3f}"
        norm = "-" if d.normalised_ratio is None else f"{d.normalised_ratio:.3f}"
        rows.append([str(d.gear), ",".join(map(str, d.dims)), f"{d.before_ms:.3f}",
                     f"{d.after_ms:.3f}", f"{d.ratio:.3f}", f"{d.low:.3f}-{d.high:.3f}",
                     f"{d.change_pct:+.1f}%", bare, norm, d.verdict])
    lines = format_table(rows, right=lambda c: 2 <= c <= 8, rule=True)
    lines += [
        "",
        f"before: {cmp.before}",
        f"after:  {cmp.after}",
        f"execute medians; CI: bootstrap over iterations ({RESAMPLES} resamples); slower / "
        f"faster only when the whole CI is beyond +-{cmp.noise:.0%} (run-to-run noise)",
        "bare after/before: the backend's own run, timed alongside; when its CI is beyond "
        "the band too, the verdict is 'machine changed' (the machine or the backend moved, "
        "not only the runtime); normalised = after/before over bare after/before, the "
        "runtime's share",
        *cmp.notes,
    ]
    return "\n".join(lines)


VERDICT_COLORS = {"slower": "tab:red", "faster": "tab:green", "within noise": "tab:gray",
                  "machine changed": "tab:orange"}
#: The colours of the two runs in the distribution panel.
RUN_COLORS = {"before": "tab:blue", "after": "tab:purple"}


def plot_comparison(cmp: Comparison, before: dict[str, Any], after: dict[str, Any],
                    path: str | os.PathLike[str]) -> Path:
    """Write a PNG of two panels: left, per gear the ratio after / before with its interval
    (coloured by verdict) against the noise band around 1, beside it the bare run's ratio
    (the backend alone: when it moved, the machine did) and the normalised ratio (execute's
    over bare's, the runtime's share); right, per gear the distribution of every iteration
    before and after (boxes on a log latency scale). One legend below both panels."""
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = pyplot()
    labels = [f"{d.gear}: {','.join(map(str, d.dims))}" for d in cmp.gears]
    x = np.arange(len(labels))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11.0, 2.2 * len(labels) + 5), 5.2))
    _ratio_panel(left, cmp, x, labels)
    _before_after_panel(right, before, after, x, labels)
    fig.suptitle(f"gear-runtime bench --compare: {Path(cmp.before).name} -> "
                 f"{Path(cmp.after).name}", fontsize=10)
    verdicts = sorted({d.verdict for d in cmp.gears}, key=list(VERDICT_COLORS).index)
    handles: list[Artist] = [Patch(color="0.85", label=f"+-{cmp.noise:.0%} noise")]
    handles += [Line2D([], [], color=VERDICT_COLORS[v], marker="o", linestyle="", label=v)
                for v in verdicts]
    if any(d.bare_ratio is not None for d in cmp.gears):
        handles += [Line2D([], [], color="tab:green", marker="D", markerfacecolor="none",
                           linestyle="", label="bare (backend alone)"),
                    Line2D([], [], color="black", marker="s", markerfacecolor="none",
                           linestyle="", label="normalised (execute / bare)")]
    handles += [Patch(color=c, alpha=0.55, label=f"{n} (right)") for n, c in RUN_COLORS.items()]
    legend_below(fig, handles)
    return save_figure(plt, fig, path)


def _ratio_panel(ax: Any, cmp: Comparison, x: np.ndarray, labels: list[str]) -> None:
    """Per gear: execute's ratio and CI at x, bare's ratio at x + 0.18, the normalised ratio at
    x - 0.18, and the change and verdict written above the highest of the three."""
    ax.axhspan(1 / (1 + cmp.noise), 1 + cmp.noise, color="0.85")
    ax.axhline(1.0, color="black", linewidth=0.8)
    tops = []
    for xi, d in zip(x, cmp.gears, strict=True):
        color = VERDICT_COLORS[d.verdict]
        ax.errorbar([xi], [d.ratio], yerr=[[d.ratio - d.low], [d.high - d.ratio]], fmt="o",
                    color=color, capsize=6, markersize=8)
        top = d.high
        if d.bare_ratio is not None and d.normalised_ratio is not None:
            ax.plot([xi + 0.18], [d.bare_ratio], "D", markersize=6, markerfacecolor="none",
                    color="tab:green")
            ax.plot([xi - 0.18], [d.normalised_ratio], "s", markersize=6,
                    markerfacecolor="none", color="black")
            top = max(top, d.bare_ratio, d.normalised_ratio)
        text = f"{d.change_pct:+.1f}%\n{d.verdict}"
        if d.verdict == "machine changed":
            text += f"\n(bare x{d.bare_ratio:.2f})"
        ax.annotate(text, (xi, top), textcoords="offset points", xytext=(0, 8), ha="center",
                    va="bottom", fontsize=8, color=color)
        tops.append(top)
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    lows = [d.low for d in cmp.gears] + [v for d in cmp.gears for v in
                                         (d.bare_ratio, d.normalised_ratio) if v is not None]
    top = max(tops + [1 + cmp.noise])
    bottom = min(lows + [1 / (1 + cmp.noise)])
    # log: x0.5 and x2 equally far from 1; room above for the labels
    ax.set_ylim(bottom / 1.1, top * 1.1 * (top / bottom) ** 0.3)
    log_axis(ax)
    ax.set_xlabel("gear: dynamic dims")
    ax.set_ylabel("median after / before (95% CI, log)")
    ax.set_title("ratio of execute medians (>1: slower)")
    ax.grid(axis="y", alpha=0.3)


def _before_after_panel(ax: Any, before: dict[str, Any], after: dict[str, Any], x: np.ndarray,
                        labels: list[str]) -> None:
    for offset, data, name in ((-0.2, before, "before"), (0.2, after, "after")):
        samples = [np.asarray(g["samples_ns"]["execute"], dtype=np.float64) / 1e6
                   for g in data["gears"]]
        draw_boxes(ax, x + offset, samples, 0.35, RUN_COLORS[name])
    log_axis(ax)
    ax.set_xticks(x, labels)
    ax.set_xlabel("gear: dynamic dims")
    ax.set_ylabel("execute latency ms (log)")
    ax.set_title("every iteration: box p25-p75, whiskers p5-p95")
    ax.grid(axis="y", which="both", alpha=0.3)


__all__ = [
    "Comparison",
    "GearDelta",
    "bootstrap_ratio_interval",
    "compare_results",
    "context_warnings",
    "format_comparison",
    "plot_comparison",
]
