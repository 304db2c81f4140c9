"""What a benchmark run produced: per-runner statistics, ais_bench's Performance Summary of
them (:class:`AisBenchSummary`, ``run`` prints it too), one :class:`GearBench` per gear and
the whole :class:`BenchReport`, and their JSON form (:data:`SCHEMA`, read back by
:mod:`gear_runtime.tools.bench.compare`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gear_runtime.tools.bench.table import format_ais_bench, format_table

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
class AisBenchSummary:
    """ais_bench's "Performance Summary" of timed runs: its NPU_compute_time figures (min, max,
    mean, median, 99th percentile, in ms) and its throughput, ``1000 * batchsize / mean``.
    ``batchsize`` is ais_bench's --batchsize: the items the throughput counts per run (a mean
    where runs of several sizes are summed up); it changes nothing that runs. The times are
    those of the runs given (``execute``, which stages the inputs and returns the outputs:
    ais_bench's NPU_compute_time is the device run alone)."""

    batchsize: float
    count: int
    min: float
    max: float
    mean: float
    median: float
    p99: float
    #: the runner whose times these are (the text names it: table.ais_bench_lines).
    runner: str = "execute"

    @classmethod
    def of_ns(cls, samples_ns: Sequence[int], batchsize: float,
              runner: str = "execute") -> AisBenchSummary:
        """The summary of per-run durations in nanoseconds (at least one sample); ais_bench's
        percentile is numpy's default (linear) too."""
        ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
        median, p99 = np.percentile(ms, [50, 99])
        return cls(batchsize, len(ms), float(ms.min()), float(ms.max()), float(ms.mean()),
                   float(median), float(p99), runner)

    @property
    def throughput(self) -> float:
        """ais_bench's throughput: ``1000 * batchsize / mean`` (items per second)."""
        return 1e3 * self.batchsize / self.mean

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (docs/json.md): ``compute_time_ms`` holds ais_bench's NPU_compute_time
        figures."""
        return {"runner": self.runner, "batchsize": self.batchsize, "count": self.count,
                "compute_time_ms": {"min": self.min, "max": self.max, "mean": self.mean,
                                    "median": self.median, "percentile_99": self.p99},
                "throughput": self.throughput}


def first_dim(shapes: Mapping[str, Sequence[int]], names: Sequence[str]) -> int:
    """ais_bench's batchsize when --batchsize is not given: the first dim of the first input
    (1 for a scalar)."""
    shape = shapes[names[0]] if names else ()
    return int(shape[0]) if len(shape) else 1


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
    #: ais_bench's batchsize of this gear: --batchsize, else the first dim of its first input.
    batchsize: int = 1

    @property
    def throughput(self) -> float:
        """Items/s in batch mode, else runs/s (from the mean latency of ``execute``)."""
        return (self.items or 1) * 1e3 / self.execute.mean

    @property
    def throughput_unit(self) -> str:
        return "items/s" if self.items is not None else "runs/s"

    @property
    def ais_bench(self) -> AisBenchSummary:
        """ais_bench's Performance Summary of this gear's execute times."""
        return AisBenchSummary.of_ns(self.samples_ns["execute"], self.batchsize)

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
            "ais_bench": self.ais_bench.to_dict(),
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
    #: the executor's resident state pairs: per pair ``input``, ``output``, ``mode`` and
    #: ``bytes`` (empty without ``state=``)
    state: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``schema``, ``context`` (the setup lives there only), ``memory``
        and ``gears``."""
        return {
            "schema": SCHEMA,
            "context": self.context,
            "memory": {"rss_after_load_bytes": self.rss_after_load_bytes,
                       "executor_staging_bytes": self.staging_bytes,
                       "executor_output_bytes": self.output_buffer_bytes,
                       "executor_state_bytes": sum(p["bytes"] for p in self.state)},
            "gears": [g.to_dict() for g in self.gears],
        }

    def table(self) -> str:
        """The human table: one row per gear, then the memory and setup lines."""
        return format_table(self)

    def ais_bench_summary(self) -> str:
        """ais_bench's Performance Summary, one block per gear (ais_bench runs one gear)."""
        return format_ais_bench(self)


__all__ = ["MAX_ITERATIONS", "RUNNERS", "SCHEMA", "AisBenchSummary", "BenchReport",
           "GearBench", "Stats", "first_dim"]
