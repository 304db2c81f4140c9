"""Prometheus metrics of the server (``GET /metrics``), in a registry of its own.

A registry per server, not prometheus-client's global one: two servers in one process (tests,
a Ray replica beside a local server) never mix or collide. Labels: ``model`` (the served
name, ``""`` for a request naming no served model) and ``gear`` (the gear's dims joined by
``,``, ``"dynamic"`` for a hybrid miss run on the dynamic-shape graph).

Under ``serve --workers N`` every series also carries ``worker="i"``, and a scrape reports the
WHOLE server, as it is at the scrape, whichever worker answers it: the answering worker asks
every other worker for its own exposition over that worker's Unix socket in the folder the
parent made for them (``GET /metrics`` with :data:`OWN_HEADER`, all at once, each within
:data:`PEER_SCRAPE_S`) and merges them with its own, family by family (so ``sum
without(worker)`` of a counter is the server's count). A worker that does not answer in time
(its loop blocked by a long call holding the GIL) is reported from its latest snapshot file
in the same folder (written every :data:`SNAPSHOT_S` seconds and at each scrape, atomically),
with a log line. The supervisor removes a dead worker's snapshots; its restart counts from
zero as any restarted process does (Prometheus' ``rate()`` reads that as a counter reset).

The folder is the server's own (0700), but what is in it is read defensively: only regular
files are read (a FIFO, a folder, a link are skipped: never a hang), at most
:data:`MAX_SNAPSHOT_BYTES`, and a file or answer that does not parse is skipped; each with
one log line naming it and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from gear_runtime.serving.peers import OWN_HEADER, scrape_peer

#: Request latency buckets (seconds): sub-millisecond gears to multi-second prefills.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                   10.0)
#: Time to first token / end-to-end buckets (seconds), and inter-token ones: vLLM's
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
#: How long a made token waits before its reader has it (seconds)
DELIVERY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
#: Fill ratio buckets: real rows / gear rows of a batch.
FILL_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
#: How often a worker refreshes its snapshot for the other workers' scrapes (seconds).
SNAPSHOT_S = 1.0
#: How long a scrape waits for each other worker's fresh exposition before it takes that
#: worker's snapshot file instead (seconds; Prometheus' default scrape timeout is 10 s)
PEER_SCRAPE_S = 2.0
#: The largest snapshot file or answer read (bytes); more is skipped as not a snapshot
MAX_SNAPSHOT_BYTES = 64 * 2**20
#: The names of the workers' files in the folder: worker-<index>.<kind>
_WORKER_FILE = re.compile(r"worker-(\d+)\.(prom|sock|stats\.json)")

logger = logging.getLogger("gear_runtime.serving")
#: (path, why) already logged as skipped: a bad file is named once per process, not per scrape
_skipped: set[tuple[str, str]] = set()


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
        self._llm_families(r)
        self.refused = Counter("gear_refused_connections",
                               "Connections answered 503 at once: past --max-connections",
                               registry=r)
        # process_* (CPU seconds, resident memory, open fds, start time), as the global
        # registry has them: each worker's under serve --workers, labelled worker="i"
        ProcessCollector(registry=r)

    def _llm_families(self, r: CollectorRegistry) -> None:
        """The text routes' metrics, named as vLLM names them (``vllm:``: what dashboards
        for LLM serving read), labelled ``model_name`` as vLLM labels them."""
        m = ["model_name"]
        self.llm_running = Gauge("vllm:num_requests_running",
                                 "Sequences holding a row of the engine", m, registry=r)
        self.llm_waiting = Gauge("vllm:num_requests_waiting",
                                 "Requests waiting for a row of the engine", m, registry=r)
        self.llm_slots = Gauge("vllm:kv_cache_usage_perc",
                               "Rows of the engine's cache in use (1 = all)", m, registry=r)
        self.llm_prompt = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests",
                                  m, registry=r)
        self.llm_generated = Counter("vllm:generation_tokens",
                                     "Tokens generated for finished requests", m, registry=r)
        self.llm_success = Counter("vllm:request_success", "Finished requests by reason",
                                   ["model_name", "finished_reason"], registry=r)
        self.llm_ttft = Histogram("vllm:time_to_first_token_seconds",
                                  "Time from a request's arrival to its first token", m,
                                  buckets=TTFT_BUCKETS, registry=r)
        self.llm_itl = Histogram("vllm:inter_token_latency_seconds",
                                 "Time between two tokens of a request", m,
                                 buckets=ITL_BUCKETS, registry=r)
        self.llm_e2e = Histogram("vllm:e2e_request_latency_seconds",
                                 "Time from a request's arrival to its last token", m,
                                 buckets=LATENCY_BUCKETS + (20.0, 40.0, 80.0), registry=r)
        self.llm_delivery_s = Histogram(
            "gear_llm_token_delivery_seconds", "From the engine making a token to the "
            "server handing it to its client's stream", m, buckets=DELIVERY_BUCKETS,
            registry=r)

    def track_llm(self, model: str, running: Callable[[], float],
                  waiting: Callable[[], float], slots: Callable[[], float]) -> None:
        """Report an LLM's running and waiting sequences and the rows in use at every
        scrape."""
        self.llm_running.labels(model).set_function(running)
        self.llm_waiting.labels(model).set_function(waiting)
        self.llm_slots.labels(model).set_function(slots)

    def untrack_llm(self, model: str) -> None:
        for gauge in (self.llm_running, self.llm_waiting, self.llm_slots):
            with contextlib.suppress(KeyError):
                gauge.remove(model)

    def llm_request(self, model: str, submitted: float, first: float | None,
                    token_times: list[float], prompt_tokens: int, generated: int,
                    reason: str) -> None:
        """One finished generation: its token counts, reason, time to first token,
        inter-token latencies and end-to-end latency (perf_counter times)."""
        self.llm_prompt.labels(model).inc(prompt_tokens)
        self.llm_generated.labels(model).inc(generated)
        self.llm_success.labels(model, reason).inc()
        if first is not None:
            self.llm_ttft.labels(model).observe(first - submitted)
            itl = self.llm_itl.labels(model)
            for a, b in zip(token_times, token_times[1:], strict=False):
                itl.observe(b - a)
        self.llm_e2e.labels(model).observe(
            (token_times[-1] if token_times else time.perf_counter()) - submitted)

    def llm_delivery(self, model: str, seconds: float) -> None:
        self.llm_delivery_s.labels(model).observe(seconds)

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
        ``worker`` under ``serve --workers``, and every worker's series in it: the others'
        from their snapshot files; :meth:`scrape` asks them afresh)."""
        body = self._own()
        if not self.shared:
            return body, CONTENT_TYPE_LATEST
        self._write_snapshot(body)
        others = [(path, _read_snapshot(path))
                  for path in (self._path(i, "prom") for i in self._others())]
        return merge_expositions([body, *others]), CONTENT_TYPE_LATEST

    async def scrape(self, headers: Mapping[str, str] | None = None) -> tuple[bytes, str]:
        """(body, content type) of ``GET /metrics`` with request ``headers``: under
        ``serve --workers``, every worker's series as they are now (each other worker asked
        over its socket; its snapshot file when it does not answer in
        :data:`PEER_SCRAPE_S`); only this worker's when :data:`OWN_HEADER` says "own"."""
        body = self._own()
        if not self.shared or (headers or {}).get(OWN_HEADER) == "own":
            return body, CONTENT_TYPE_LATEST
        with contextlib.suppress(OSError):  # the others' fallback; the folder may be gone
            self._write_snapshot(body)
        others = await asyncio.gather(*(self._peer(i) for i in self._others()))
        return merge_expositions([body, *others]), CONTENT_TYPE_LATEST

    def _others(self) -> list[int]:
        """The indexes of the other workers with a socket or a snapshot in the folder."""
        assert self.shared_dir is not None
        found = set()
        with contextlib.suppress(OSError):
            for name in os.listdir(self.shared_dir):
                match = _WORKER_FILE.fullmatch(name)
                if match and match.group(2) != "stats.json":
                    found.add(int(match.group(1)))
        found.discard(int(str(self.worker)))
        return sorted(found)

    def _path(self, index: int, kind: str) -> str:
        assert self.shared_dir is not None
        return os.path.join(self.shared_dir, f"worker-{index}.{kind}")

    async def _peer(self, index: int) -> tuple[str, bytes | None]:
        """(where from, body): worker ``index``'s exposition now, else its snapshot file
        (body None: neither)."""

        path = self._path(index, "sock")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                _skip(path, "not a socket")
            else:
                try:
                    return path, await scrape_peer(path, PEER_SCRAPE_S, MAX_SNAPSHOT_BYTES)
                except (OSError, ValueError, asyncio.TimeoutError,
                        asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                    if not isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
                        logger.warning("worker %d did not answer a scrape within %g s on %s "
                                       "(%s): its snapshot file is reported", index,
                                       PEER_SCRAPE_S, path, type(exc).__name__)
        prom = self._path(index, "prom")
        return prom, _read_snapshot(prom)

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
        """Every worker's latest statistics document (this one's written fresh first); a
        file that is not one (not a regular file, not a JSON document with a
        ``model_stats`` list) is skipped with a log line."""
        self.write_stats()
        assert self.shared_dir is not None
        out = []
        for path in sorted(Path(self.shared_dir).glob("worker-*.stats.json")):
            body = _read_snapshot(str(path))
            if body is None:
                continue
            try:
                doc = json.loads(body)
            except ValueError as exc:
                _skip(str(path), f"not JSON ({exc})")
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("model_stats"), list) \
                    or not all(isinstance(m, dict) for m in doc["model_stats"]):
                _skip(str(path), 'not a statistics document ({"model_stats": [...]})')
                continue
            out.append(doc)
        return out

    def _write(self, name: str, body: bytes) -> None:
        """``name`` in the shared folder, replaced atomically (another worker never reads
        half a file)."""
        assert self.shared_dir is not None
        final = Path(self.shared_dir) / name
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(body)
        os.replace(tmp, final)


def snapshot_names(worker: int | str | None) -> tuple[str, str]:
    """The files worker ``worker`` keeps in the shared folder: its metrics exposition and
    its statistics document (the supervisor removes both when the worker dies)."""
    return f"worker-{worker}.prom", f"worker-{worker}.stats.json"


def _skip(path: str, why: str) -> None:
    """Log, once per process, that ``path`` in the workers' folder was skipped and why."""
    if (path, why) not in _skipped:
        _skipped.add((path, why))
        logger.warning("scrape: skipped %s in the workers' folder: %s (expected a worker's "
                       "snapshot or socket)", path, why)


def _read_snapshot(path: str) -> bytes | None:
    """The bytes of the regular file ``path`` (None: missing, as a worker not yet started;
    or not a regular file, or over :data:`MAX_SNAPSHOT_BYTES`: skipped, logged). Opened
    non-blocking and not following links, so a FIFO or a device never blocks the scrape."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a link
        _skip(path, f"cannot be opened ({exc.strerror or exc})")
        return None
    try:
        mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
        if not stat.S_ISREG(mode):
            _skip(path, f"not a regular file (mode {stat.filemode(mode)})")
            return None
        if size > MAX_SNAPSHOT_BYTES:
            _skip(path, f"{size} bytes, more than {MAX_SNAPSHOT_BYTES}")
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        _skip(path, f"cannot be read ({exc.strerror or exc})")
        return None
    finally:
        os.close(fd)


def _families(body: bytes, where: str) -> list[Any]:
    """The metric families of one exposition; [] (logged) for one that does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(body.decode()))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        _skip(where, f"not a Prometheus exposition ({type(exc).__name__}: {str(exc)[:100]})")
        return []


def merge_expositions(bodies: Iterable[bytes | tuple[str, bytes | None]]) -> bytes:
    """One exposition of several (each worker's, labelled apart by ``worker``): the samples
    of each metric family together under one HELP / TYPE, as the text format requires. An
    item is a body or (where it came from, body or None); a None is skipped, as is (with a
    log line naming where) a body that does not parse, or a family whose type differs from
    the first body's."""
    families: dict[str, Any] = {}
    for item in bodies:
        where, body = item if isinstance(item, tuple) else ("this worker's exposition", item)
        if body is None:
            continue
        for family in _families(body, where):
            known = families.setdefault(family.name, family)
            if known is family:
                continue
            if known.type != family.type:
                _skip(where, f"family {family.name} of type {family.type}, expected "
                      f"{known.type}")
                continue
            known.samples.extend(family.samples)

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
