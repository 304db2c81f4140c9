"""What a benchmark run produced: per-runner statistics, one :class:`GearBench` per gear and
the whole :class:`BenchReport`, and their JSON form (:data:`SCHEMA`, read back by
:mod:`gear_runtime.tools.bench.compare`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gear_runtime.tools.bench.table import format_table

#: The JSON layout written by :meth:`BenchReport.to_dict` (read back by bench_compare).
SCHEMA = "gear-runtime-bench/2"
#: The runners in the order tables, JSON and plots show them.
RUNNERS = ("execute", "bare", "naive", "dynamic")
#: The most timed iterations per gear a run records (and a comparison reads back): the
#: comparison's bootstrap resamples every one of them.
MAX_ITERATIONS = 100_000


# ---- statistics -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stats:
    """Latency statistics of one runner on one gear, in milliseconds."""

    p50: float
    p90: float
    p99: float
    mean: float
    min: float

    @classmethod
    def of_ns(cls, samples_ns: Sequence[int]) -> Stats:
        """Stats of per-call durations in nanoseconds (at least one sample)."""
        ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(float(p50), float(p90), float(p99), float(ms.mean()), float(ms.min()))

    def to_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean,
                "min": self.min}


@dataclass(frozen=True)
class GearBench:
    """One gear's results. Times in ms; ``overhead_us`` in microseconds; bytes for memory."""

    gear: int
    dims: tuple[int, ...]
    shapes: dict[str, tuple[int, ...]]
    #: items per run (the batch) in dynamic batch mode; None where no batch dim exists.
    items: int | None
    execute: Stats
    bare: Stats | None
    overhead_us: float | None
    naive: Stats | None
    dynamic: Stats | None
    #: bytes this gear stages (its inputs + the dims buffer) and returns (its outputs).
    input_bytes: int
    output_bytes: int
    #: per runner, every timed iteration's duration in ns, in the order they ran.
    samples_ns: dict[str, list[int]] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Items/s in batch mode, else runs/s (from the mean latency of ``execute``)."""
        return (self.items or 1) * 1e3 / self.execute.mean

    @property
    def throughput_unit(self) -> str:
        return "items/s" if self.items is not None else "runs/s"

    @property
    def speedup_vs_dynamic(self) -> float | None:
        """p50 of the original dynamic model / p50 of execute (> 1: the gear is faster)."""
        return self.dynamic.p50 / self.execute.p50 if self.dynamic is not None else None

    @property
    def speedup_vs_naive(self) -> float | None:
        """p50 of the naive per-input session.run / p50 of execute."""
        return self.naive.p50 / self.execute.p50 if self.naive is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Each figure once: ``<runner>_ms`` statistics (None where the runner did not run)
        and ``samples_ns``, the raw per-iteration times of every runner that ran."""
        def opt(s: Stats | None) -> dict[str, float] | None:
            return s.to_dict() if s is not None else None

        return {
            "gear": self.gear,
            "dims": list(self.dims),
            "shapes": {n: list(s) for n, s in self.shapes.items()},
            "items": self.items,
            "execute_ms": self.execute.to_dict(),
            "throughput": {"value": self.throughput, "unit": self.throughput_unit},
            "bare_ms": opt(self.bare),
            "overhead_us": self.overhead_us,
            "naive_ms": opt(self.naive),
            "dynamic_ms": opt(self.dynamic),
            "speedup_vs_dynamic": self.speedup_vs_dynamic,
            "speedup_vs_naive": self.speedup_vs_naive,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "samples_ns": {k: list(map(int, v)) for k, v in self.samples_ns.items()},
        }


@dataclass
class BenchReport:
    """A whole benchmark run: the setup, memory, and one :class:`GearBench` per gear."""

    model: str
    backend: str
    mode: str
    iterations: int
    warmup: int
    threads: int | None
    #: where the dynamic column came from: a file path, "proto", or None.
    reference: str | None
    rss_after_load_bytes: int | None
    staging_bytes: int
    output_buffer_bytes: int
    gears: list[GearBench] = field(default_factory=list)
    #: execute(copy=...): True returns outputs the caller keeps, False views (no copy).
    copy: bool = True
    #: machine, settings, versions and model of the run (see :func:`run_context`).
    context: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``schema``, ``context`` (the setup lives there only), ``memory``
        and ``gears``."""
        return {
            "schema": SCHEMA,
            "context": self.context,
            "memory": {"rss_after_load_bytes": self.rss_after_load_bytes,
                       "executor_staging_bytes": self.staging_bytes,
                       "executor_output_bytes": self.output_buffer_bytes},
            "gears": [g.to_dict() for g in self.gears],
        }

    def table(self) -> str:
        """The human table: one row per gear, then the memory and setup lines."""
        return format_table(self)


__all__ = ["MAX_ITERATIONS", "RUNNERS", "SCHEMA", "BenchReport", "GearBench", "Stats"]
