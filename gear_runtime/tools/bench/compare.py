"""Compare two ``gear-runtime bench --json`` runs of the same model, gear by gear.

Per gear: the ratio of the medians of ``execute`` (after / before) with a bootstrap 95%
confidence interval over the iterations of both runs (each run's per-iteration times are
resampled with replacement, the ratio of the resampled medians taken each time). Verdict:

* ``slower``: the whole interval lies above ``1 + noise``;
* ``faster``: the whole interval lies below ``1 / (1 + noise)``;
* ``within noise`` otherwise.

``noise`` (default 5%) covers what the interval cannot: the bootstrap sees the spread of the
iterations inside each run, not the drift of a machine between two runs (frequency, other
processes), which on a shared machine is a few percent. The same ratio of the ``bare``
column (the backend's own run, timed interleaved with execute) is shown beside it: when it
moved as much as execute, the machine or the backend changed, not the runtime. Two runs of
different models or gear sets are refused (InputError); differences of machine or settings
are warnings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.tools.bench.plot import draw_boxes, log_ms_axis, pyplot, save_figure
from gear_runtime.tools.bench.report import SCHEMA
from gear_runtime.tools.textfmt import format_table

#: Default half-width of the band a ratio must leave to count as a change (5%).
DEFAULT_NOISE = 0.05
#: Bootstrap resamples per gear and the confidence level of the interval.
RESAMPLES = 2000
CONFIDENCE = 0.95
#: Settings that change what is measured: a difference is warned about.
COMPARED_SETTINGS = ("backend", "providers", "threads", "warmup", "iterations", "copy")
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
    verdict: str  # "faster" | "slower" | "within noise"
    #: the same ratio of the bare column (the backend alone); None where either run lacks it.
    bare_ratio: float | None = None

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0


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


# ---- reading ----------------------------------------------------------------------------------
def load_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A bench JSON written by this version's ``bench --json``; InputError naming the file
    when it is missing, not JSON, or an older layout without context and raw times."""
    name = os.fspath(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--compare: cannot read {name!r}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"--compare: {name!r} is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InputError(f"--compare: {name!r} is not a {SCHEMA} result (no context and no "
                         "per-iteration times: written by an older gear-runtime or another "
                         "tool); run gear-runtime bench --json again")
    for g in data.get("gears", []):
        if not g.get("samples_ns", {}).get("execute"):
            raise InputError(f"--compare: {name!r} gear {g.get('gear')} has no per-iteration "
                             "execute times")
    return data


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
    _check_same_model(before, after, names)
    _check_same_gears(before, after, names)
    out = Comparison(names[0], names[1], noise)
    out.warnings = context_warnings(before, after, names)
    out.notes = _version_notes(before, after, names)
    rng = np.random.default_rng(seed)
    for b, a in zip(before["gears"], after["gears"], strict=True):
        out.gears.append(_delta(b, a, noise, rng))
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
    """One gear's ratio of execute medians, its bootstrap interval and verdict."""
    b = np.asarray(before["samples_ns"]["execute"], dtype=np.float64) / 1e6
    a = np.asarray(after["samples_ns"]["execute"], dtype=np.float64) / 1e6
    ratio = float(np.median(a) / np.median(b))
    low, high = bootstrap_ratio_interval(b, a, rng)
    if low > 1 + noise:
        verdict = "slower"
    elif high < 1 / (1 + noise):
        verdict = "faster"
    else:
        verdict = "within noise"
    return GearDelta(int(before["gear"]), tuple(before["dims"]), float(np.median(b)),
                     float(np.median(a)), ratio, low, high, verdict,
                     _median_ratio(before, after, "bare"))


def _median_ratio(before: dict[str, Any], after: dict[str, Any], runner: str) -> float | None:
    sb, sa = before["samples_ns"].get(runner), after["samples_ns"].get(runner)
    return float(np.median(sa) / np.median(sb)) if sb and sa else None


def bootstrap_ratio_interval(before: np.ndarray, after: np.ndarray,
                             rng: np.random.Generator, resamples: int = RESAMPLES,
                             confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval of median(after) / median(before): each run's
    samples resampled with replacement, independently."""
    mb = np.median(before[rng.integers(0, len(before), (resamples, len(before)))], axis=1)
    ma = np.median(after[rng.integers(0, len(after), (resamples, len(after)))], axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ma / mb, [tail, 100 - tail])
    return float(low), float(high)


# ---- output -------------------------------------------------------------------------------------
def format_comparison(cmp: Comparison) -> str:
    """Fixed-width table: per gear both medians, the ratio, its interval and the verdict."""
    header = ["gear", "dims", "before p50 ms", "after p50 ms", "after/before",
              f"{CONFIDENCE:.0%} CI", "change", "bare after/before", "verdict"]
    rows = [header]
    for d in cmp.gears:
        bare = "-" if d.bare_ratio is None else f"{d.bare_ratio:.3f}"
        rows.append([str(d.gear), ",".join(map(str, d.dims)), f"{d.before_ms:.3f}",
                     f"{d.after_ms:.3f}", f"{d.ratio:.3f}", f"{d.low:.3f}-{d.high:.3f}",
                     f"{d.change_pct:+.1f}%", bare, d.verdict])
    lines = format_table(rows, right=lambda c: 2 <= c <= 7, rule=True)
    lines += [
        "",
        f"before: {cmp.before}",
        f"after:  {cmp.after}",
        f"execute medians; CI: bootstrap over iterations ({RESAMPLES} resamples); slower / "
        f"faster only when the whole CI is beyond +-{cmp.noise:.0%} (run-to-run noise)",
        "bare after/before: the backend's own run, timed alongside; when it moved like "
        "execute, the machine or the backend changed, not the runtime",
        *cmp.notes,
    ]
    return "\n".join(lines)


VERDICT_COLORS = {"slower": "tab:red", "faster": "tab:green", "within noise": "tab:gray"}


def plot_comparison(cmp: Comparison, before: dict[str, Any], after: dict[str, Any],
                    path: str | os.PathLike[str]) -> Path:
    """Write a PNG of two panels: left, per gear the ratio after / before with its interval
    (coloured by verdict) against the noise band around 1; right, per gear the distribution
    of every iteration before and after (boxes on a log latency scale)."""
    plt = pyplot()
    labels = [f"{d.gear}: {','.join(map(str, d.dims))}" for d in cmp.gears]
    x = np.arange(len(labels))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11.0, 2.2 * len(labels) + 5), 4.8))
    _ratio_panel(left, cmp, x, labels)
    _before_after_panel(right, before, after, x, labels)
    fig.suptitle(f"gear-runtime bench --compare: {Path(cmp.before).name} -> "
                 f"{Path(cmp.after).name}", fontsize=10)
    fig.tight_layout()
    return save_figure(plt, fig, path)


def _ratio_panel(ax: Any, cmp: Comparison, x: np.ndarray, labels: list[str]) -> None:
    ax.axhspan(1 / (1 + cmp.noise), 1 + cmp.noise, color="0.85", label=f"+-{cmp.noise:.0%} noise")
    ax.axhline(1.0, color="black", linewidth=0.8)
    for xi, d in zip(x, cmp.gears, strict=True):
        color = VERDICT_COLORS[d.verdict]
        ax.errorbar([xi], [d.ratio], yerr=[[d.ratio - d.low], [d.high - d.ratio]], fmt="o",
                    color=color, capsize=6, markersize=8)
        ax.annotate(f"{d.change_pct:+.1f}%\n{d.verdict}", (xi, d.high), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8, color=color)
    bare = [(xi, d.bare_ratio) for xi, d in zip(x, cmp.gears, strict=True)
            if d.bare_ratio is not None]
    if bare:
        ax.plot([b[0] + 0.12 for b in bare], [b[1] for b in bare], "D", markersize=6,
                markerfacecolor="none", color="tab:green", label="bare (backend alone)")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    bares = [d.bare_ratio for d in cmp.gears if d.bare_ratio is not None]
    top = max([d.high for d in cmp.gears] + bares + [1 + cmp.noise])
    bottom = min([d.low for d in cmp.gears] + bares + [1 / (1 + cmp.noise)])
    ax.set_ylim(bottom - 0.05, top + 0.12 * (top - bottom + 0.1))
    ax.set_xlabel("gear: dynamic dims")
    ax.set_ylabel("median after / before (95% CI)")
    ax.set_title("ratio of execute medians (>1: slower)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _before_after_panel(ax: Any, before: dict[str, Any], after: dict[str, Any], x: np.ndarray,
                        labels: list[str]) -> None:
    for offset, data, color, name in ((-0.2, before, "tab:blue", "before"),
                                      (0.2, after, "tab:purple", "after")):
        samples = [np.asarray(g["samples_ns"]["execute"], dtype=np.float64) / 1e6
                   for g in data["gears"]]
        draw_boxes(ax, x + offset, samples, 0.35, color)
        ax.plot([], [], "s", color=color, alpha=0.55, label=name)
    log_ms_axis(ax)
    ax.set_xticks(x, labels)
    ax.set_xlabel("gear: dynamic dims")
    ax.set_ylabel("execute latency ms (log)")
    ax.set_title("every iteration: box p25-p75, whiskers p5-p95")
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)


__all__ = [
    "Comparison",
    "GearDelta",
    "bootstrap_ratio_interval",
    "compare_results",
    "context_warnings",
    "format_comparison",
    "load_result",
    "plot_comparison",
]
