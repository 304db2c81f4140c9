"""Prometheus metrics of the server (``GET /metrics``), in a registry of its own.

A registry per server, not prometheus-client's global one: two servers in one process (tests,
a Ray replica beside a local server) never mix or collide. Labels: ``model`` (the served
name, ``""`` for a request naming no served model) and ``gear`` (the gear's dims joined by
``,``, ``"dynamic"`` for a hybrid miss run on the dynamic-shape graph).

Under ``serve --workers N`` every series also carries ``worker="i"``, and a scrape reports the
WHOLE server whichever worker answers it: each worker keeps a snapshot of its own exposition
in the folder the parent made for them (written every :data:`SNAPSHOT_S` seconds and on each
of its own scrapes, atomically), and the answering worker merges every worker's latest
snapshot with its own fresh one, family by family (so ``sum without(worker)`` of a counter is
the server's count, at most :data:`SNAPSHOT_S` behind for the other workers). A worker that
died keeps its last snapshot until its restart overwrites it, starting its counts from zero as
any restarted process does (Prometheus' ``rate()`` reads that as a counter reset).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

#: Request latency buckets (seconds): sub-millisecond gears to multi-second prefills.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                   10.0)
#: Fill ratio buckets: real rows / gear rows of a batch.
FILL_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
#: How often a worker refreshes its snapshot for the other workers' scrapes (seconds).
SNAPSHOT_S = 1.0


class Metrics:
    """The server's metrics; every method is thread-safe (prometheus-client's are)."""

    def __init__(self, worker: str | None = None, shared_dir: str | None = None) -> None:
        #: this process's index under ``serve --workers``: every series gets ``worker="i"``
        self.worker = worker
        #: (kind, model, gear) -> the labelled series it updates (see _children)
        self._series: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        #: the workers' snapshot folder (``serve --workers``): scrapes merge every worker's
        self.shared_dir = shared_dir
        self._snapshots: threading.Thread | None = None
        #: what else a snapshot writes (the statistics document, ``worker-<i>.stats.json``)
        self._stats: Callable[[], dict] | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("gear_requests", "Inference requests answered, per gear run",
                                ["model", "gear"], registry=r)
        self.latency = Histogram("gear_request_latency_seconds",
                                 "Time from a request's arrival to its response, per gear",
                                 ["model", "gear"], buckets=LATENCY_BUCKETS, registry=r)
        self.batches = Counter("gear_batches", "Batches run by the dynamic batcher, per gear",
                               ["model", "gear"], registry=r)
        self.fill = Histogram("gear_batch_fill_ratio",
                              "Real rows / gear rows of each batch", ["model", "gear"],
                              buckets=FILL_BUCKETS, registry=r)
        self.rows = Counter("gear_batch_rows", "Real (request) rows run in batches",
                            ["model", "gear"], registry=r)
        self.padding = Counter("gear_padding_rows",
                               "Padding rows run in batches (work wasted to fill a gear)",
                               ["model", "gear"], registry=r)
        self.pad_fill = Histogram("gear_pad_fill_ratio",
                                  "--pad: request dims / gear dims (product of the dynamic "
                                  "values) of every padded request", ["model", "gear"],
                                  buckets=FILL_BUCKETS, registry=r)
        self.queue = Gauge("gear_queue_depth",
                           "Requests admitted and waiting for an executor", ["model"],
                           registry=r)
        self.errors = Counter("gear_errors", "Requests answered with an error, by GE code",
                              ["model", "code", "status"], registry=r)
        self.disconnects = Counter("gear_client_disconnects",
                                   "Clients that hung up before their request was answered "
                                   "(not errors of the server)", ["model"], registry=r)
        self.connections = Gauge("gear_open_connections", "Open HTTP connections",
                                 registry=r)
        self.sequences_live = Gauge("gear_sequences_live",
                                    "Sequences of a stateful model holding a slot", ["model"],
                                    registry=r)
        self.sequences = Counter("gear_sequences",
                                 "Sequences of a stateful model by what happened: started, "
                                 "ended (sequence_end), expired (idle past "
                                 "--sequence-idle-seconds)", ["model", "event"], registry=r)
        self.refused = Counter("gear_refused_connections",
                               "Connections answered 503 at once: past --max-connections",
                               registry=r)

    def track_queue(self, model: str, depth: Callable[[], float]) -> None:
        """Report ``depth()`` as the model's queue depth at every scrape."""
        self.queue.labels(model).set_function(depth)

    def track_sequences(self, model: str, live: Callable[[], float]) -> None:
        """Report ``live()`` as the model's live sequences at every scrape."""
        self.sequences_live.labels(model).set_function(live)

    def sequence(self, model: str, event: str) -> None:
        """Count a sequence ``event``: "started", "ended" or "expired"."""
        self.sequences.labels(model, event).inc()

    def untrack_queue(self, model: str) -> None:
        """Stop reporting the queue of a model no longer served."""
        with contextlib.suppress(KeyError):
            self.queue.remove(model)

    def track_connections(self, count: Callable[[], float]) -> None:
        """Report ``count()`` as the open connections at every scrape."""
        self.connections.set_function(count)

    def request(self, model: str, gear: str, seconds: float) -> None:
        requests, latency = self._children("request", model, gear)
        requests.inc()
        latency.observe(seconds)

    def batch(self, model: str, gear: str, rows: int, gear_rows: int) -> None:
        """One batch of ``rows`` real rows run on a gear of ``gear_rows`` rows."""
        batches, fill, rows_total, padding = self._children("batch", model, gear)
        batches.inc()
        fill.observe(rows / gear_rows)
        rows_total.inc(rows)
        padding.inc(gear_rows - rows)

    def _children(self, kind: str, model: str, gear: str) -> tuple[Any, ...]:
        """The labelled series one request (or batch) updates, looked up once per
        (model, gear): prometheus_client's ``labels()`` takes a lock and builds a key at
        every call (six calls per batched request). The series are never removed, so a
        cached child stays the exported one."""
        key = (kind, model, gear)
        found = self._series.get(key)
        if found is None:
            families = ((self.requests, self.latency) if kind == "request" else
                        (self.batches, self.fill, self.rows, self.padding))
            found = self._series[key] = tuple(f.labels(model, gear) for f in families)
        return found

    def padded(self, model: str, gear: str, fill: float) -> None:
        """One request padded (``--pad``) to a gear it fills to ``fill`` (1.0: exact)."""
        self.pad_fill.labels(model, gear).observe(fill)

    def error(self, model: str, code: str, status: int) -> None:
        self.errors.labels(model, code, str(status)).inc()

    def disconnect(self, model: str) -> None:
        self.disconnects.labels(model).inc()

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text format (every sample labelled
        ``worker`` under ``serve --workers``, and every worker's series in it)."""
        body = self._own()
        if self.shared_dir is None or self.worker is None:
            return body, CONTENT_TYPE_LATEST
        self._write_snapshot(body)
        return merge_expositions(_snapshots(self.shared_dir)), CONTENT_TYPE_LATEST

    def _own(self) -> bytes:
        body = generate_latest(self.registry)
        if self.worker is not None:
            body = _with_label(body, "worker", self.worker)
        return body

    @property
    def shared(self) -> bool:
        """Whether scrapes and statistics merge the workers' snapshots (serve --workers)."""
        return self.shared_dir is not None and self.worker is not None

    def start_snapshots(self, stats: Callable[[], dict] | None = None) -> None:
        """Refresh this worker's snapshots every :data:`SNAPSHOT_S` seconds (a daemon
        thread: it ends with the process): its exposition and, with ``stats``, the
        statistics document ``stats()`` gives; nothing without a shared folder."""
        if not self.shared or self._snapshots is not None:
            return
        self._stats = stats

        def loop() -> None:
            while True:
                time.sleep(SNAPSHOT_S)
                with contextlib.suppress(OSError):  # the folder went with the parent
                    self._write_snapshot(self._own())
                    self.write_stats()

        self._write_snapshot(self._own())
        self.write_stats()
        self._snapshots = threading.Thread(target=loop, name="gear-metrics-snapshot",
                                           daemon=True)
        self._snapshots.start()

    def _write_snapshot(self, body: bytes) -> None:
        """This worker's exposition as ``worker-<i>.prom`` in the shared folder."""
        self._write(snapshot_names(self.worker)[0], body)

    def write_stats(self) -> None:
        """This worker's statistics document as ``worker-<i>.stats.json`` (when it has one)."""
        if self._stats is not None:
            self._write(snapshot_names(self.worker)[1], json.dumps(self._stats()).encode())

    def shared_stats(self) -> list[dict]:
        """Every worker's latest statistics document (this one's written fresh first)."""
        self.write_stats()
        assert self.shared_dir is not None
        out = []
        for path in sorted(Path(self.shared_dir).glob("worker-*.stats.json")):
            with contextlib.suppress(OSError, ValueError):  # replaced under us: next time
                out.append(json.loads(path.read_bytes()))
        return out

    def _write(self, name: str, body: bytes) -> None:
        """``name`` in the shared folder, replaced atomically (another worker never reads
        half a file)."""
        assert self.shared_dir is not None
        final = Path(self.shared_dir) / name
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(body)
        os.replace(tmp, final)


def snapshot_names(worker: int | None) -> tuple[str, str]:
    """The files worker ``worker`` keeps in the shared folder: its metrics exposition and
    its statistics document (the supervisor removes both when the worker dies)."""
    return f"worker-{worker}.prom", f"worker-{worker}.stats.json"


def _snapshots(folder: str) -> Iterator[bytes]:
    """Every worker's latest snapshot in ``folder`` (by worker file name)."""
    for path in sorted(Path(folder).glob("worker-*.prom")):
        with contextlib.suppress(OSError):  # a worker's file replaced under us: next time
            yield path.read_bytes()


def merge_expositions(bodies: Iterator[bytes] | list[bytes]) -> bytes:
    """One exposition of several (each worker's, labelled apart by ``worker``): the samples
    of each metric family together under one HELP / TYPE, as the text format requires."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, object] = {}
    for body in bodies:
        for family in text_string_to_metric_families(body.decode()):
            known = families.setdefault(family.name, family)
            if known is not family:
                known.samples.extend(family.samples)  # type: ignore[attr-defined]

    class _Merged:
        def collect(self) -> list[object]:
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())  # type: ignore[arg-type]
    return generate_latest(registry)


def _with_label(body: bytes, name: str, value: str) -> bytes:
    """The exposition ``body`` with ``name="value"`` added to every sample line."""
    label = f'{name}="{value}"'.encode()
    out = []
    for line in body.split(b"\n"):
        if line and not line.startswith(b"#"):
            brace = line.find(b"{")
            space = line.find(b" ")
            if brace != -1 and (space == -1 or brace < space):
                line = line[:brace + 1] + label + (b"," if line[brace + 1:brace + 2] != b"}"
                                                   else b"") + line[brace + 1:]
            else:
                line = line[:space] + b"{" + label + b"}" + line[space:]
        out.append(line)
    return b"\n".join(out)
