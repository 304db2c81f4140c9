"""Triton's statistics extension: per-model counts and cumulative durations, in its schema.

``GET /v2/models/{name}/stats`` (and ``/v2/models/stats``, every model) answers
``{"model_stats": [ModelStatistics...]}`` with the field names of Triton's
``ModelStatistics`` message (grpc_service.proto), which is also what the gRPC
``ModelStatistics`` call answers. Meaning, as Triton defines it:

- ``inference_count``: rows inferred (a request of batch 3 counts 3); ``execution_count``:
  model executions (a batch of 5 requests run as one gear counts 1).
- ``inference_stats``: per request, cumulative ``{count, ns}``: ``success`` (arrival to
  answer), ``fail``, ``queue`` (admitted to started on an executor), ``compute_input``
  (gathering and padding the batch's inputs), ``compute_infer`` (``execute``),
  ``compute_output`` (splitting the outputs back). Every request of a batch is charged the
  batch's compute durations, as Triton does.
- ``batch_stats``: per executed batch size (the gear's rows: what really ran, padding
  included), the executions' compute durations.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunTiming:
    """How one execution went (measured on the executor's thread, time.perf_counter)."""

    #: the gear index run (None: the dynamic-shape graph of a hybrid model)
    gear: int | None
    #: rows the gear runs (what ran; 0 when unknown)
    gear_rows: int
    started: float
    input_s: float
    infer_s: float
    output_s: float
    #: the metrics label of what ran, when it is not one of the served model's gears (a
    #: sequence's start on its start model: "start:<dims>")
    label: str | None = None


def _duration() -> dict[str, int]:
    return {"count": 0, "ns": 0}


class ModelStats:
    """The statistics of one served model (thread-safe)."""

    KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")

    def __init__(self, name: str, version: str) -> None:
        self.name, self.version = name, version
        self._lock = threading.Lock()
        self._infer = {k: _duration() for k in self.KINDS}
        self._batches: dict[int, dict[str, dict[str, int]]] = {}
        self._rows = 0
        self._executions = 0
        self._last_ms = 0

    def executed(self, timing: RunTiming) -> None:
        """One execution (a batch, or one request run alone)."""
        with self._lock:
            self._executions += 1
            batch = self._batches.setdefault(timing.gear_rows, {
                k: _duration() for k in ("compute_input", "compute_infer", "compute_output")})
            for kind, seconds in (("compute_input", timing.input_s),
                                  ("compute_infer", timing.infer_s),
                                  ("compute_output", timing.output_s)):
                _add(batch[kind], seconds)

    def succeeded(self, rows: int, admitted: float, answered: float, arrived: float,
                  timing: RunTiming) -> None:
        """One request answered: ``rows`` rows, ``arrived`` (its headers complete),
        ``admitted`` (queued for an executor), ``answered`` (its reply ready); all
        time.perf_counter()."""
        with self._lock:
            self._rows += rows
            self._last_ms = int(time.time() * 1000)
            _add(self._infer["success"], answered - arrived)
            _add(self._infer["queue"], max(0.0, timing.started - admitted))
            _add(self._infer["compute_input"], timing.input_s)
            _add(self._infer["compute_infer"], timing.infer_s)
            _add(self._infer["compute_output"], timing.output_s)

    def failed(self, seconds: float) -> None:
        """One request of this model answered with an error."""
        with self._lock:
            _add(self._infer["fail"], seconds)

    def snapshot(self) -> dict[str, Any]:
        """This model's ``ModelStatistics`` (Triton's field names)."""
        with self._lock:
            return {
                "name": self.name, "version": self.version, "last_inference": self._last_ms,
                "inference_count": self._rows, "execution_count": self._executions,
                "inference_stats": {k: dict(v) for k, v in self._infer.items()},
                "batch_stats": [{"batch_size": size, **{k: dict(v) for k, v in b.items()}}
                                for size, b in sorted(self._batches.items())],
            }


def _add(duration: dict[str, int], seconds: float) -> None:
    duration["count"] += 1
    duration["ns"] += max(0, int(seconds * 1e9))


def merge_statistics(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Several workers' ``{"model_stats": [...]}`` as one (``serve --workers``): per model
    (name, version) the counts and durations summed, batch_stats summed per batch size,
    ``last_inference`` the latest; models in the order first seen."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in documents:
        for m in doc.get("model_stats", []):
            key = (m["name"], m["version"])
            into = merged.get(key)
            if into is None:
                merged[key] = copy.deepcopy(m)
                continue
            into["last_inference"] = max(into["last_inference"], m["last_inference"])
            into["inference_count"] += m["inference_count"]
            into["execution_count"] += m["execution_count"]
            for kind, d in m["inference_stats"].items():
                _sum(into["inference_stats"].setdefault(kind, _duration()), d)
            sizes = {b["batch_size"]: b for b in into["batch_stats"]}
            for b in m["batch_stats"]:
                if b["batch_size"] not in sizes:
                    sizes[b["batch_size"]] = copy.deepcopy(b)
                    continue
                for kind, d in b.items():
                    if kind != "batch_size":
                        _sum(sizes[b["batch_size"]][kind], d)
            into["batch_stats"] = [sizes[k] for k in sorted(sizes)]
    return {"model_stats": list(merged.values())}


def _sum(into: dict[str, int], add: dict[str, int]) -> None:
    into["count"] += add["count"]
    into["ns"] += add["ns"]
