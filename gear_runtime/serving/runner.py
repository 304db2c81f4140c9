"""A served model: the loaded gear model, its pool of executors, and its batcher.

Executors are bound to threads: the pool has N worker threads and each creates ONE executor
on its first task and keeps it for its whole life, so an executor is never entered by two
threads (the executor would refuse with ExecutorBusyError) and on CUDA its graphs are
captured on the thread that replays them. Requests are checked against the model before they
queue, so a request the model can check up front never spoils a batch and never reaches an
executor; one that fails only in the run (a token id past an embedding table) makes its
batch run request by request (:class:`~gear_runtime.serving.batcher.Batcher`), so it alone
fails.

A served model counts the requests using it (:meth:`ServedModel.use`): a model replaced or
unloaded through the model repository is closed only once its last request is answered.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from gear_runtime.backends import facts
from gear_runtime.errors import (
    ClosedError,
    GearMismatchError,
    InputError,
)
from gear_runtime.gearfile.format import OWN_FILE_SUFFIXES
from gear_runtime.runtime.inputs import check_names
from gear_runtime.serving.batcher import NOT_HERE, Batcher, BatchPlan, NotHere, run_batch
from gear_runtime.serving.deadline import Deadline
from gear_runtime.serving.errors import QueueFullError
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.protocol import (
    MODEL_VERSION,
    InferRequest,
    datatype_of,
    json_width,
)
from gear_runtime.serving.sequences import (
    DEFAULT_IDLE_S,
    SequenceSlots,
    sequence_control,
)
from gear_runtime.serving.stats import ModelStats, RunTiming

T = TypeVar("T")

#: Default executors (worker threads) per model: one per core, at most 4 (ONNX Runtime's
#: own intra-op threads share the same cores). One on a one-core machine, not two: a second
#: executor there adds a session's memory and a thread contending for the one core, and it
#: would stop every run on the loop (a pool of two never lends: ExecutorPool.can_run_here),
#: taking from a short model at one client what the lending gains. What one executor risks,
#: a long run on the loop stalling every other client, the lending rule already excludes: a
#: run is lent only where its own gear was timed short (ExecutorPool).
DEFAULT_EXECUTORS = max(1, min(4, os.cpu_count() or 1))


#: sequence slots of a stateful model when --max-sequences is not given
DEFAULT_SEQUENCE_SLOTS = 4


@dataclass(frozen=True)
class ServeOptions:
    """How models are served (the ``gear-runtime serve`` flags)."""

    backend: str = "onnxruntime"
    executors: int = DEFAULT_EXECUTORS
    #: how long the first request of a batch waits for others; batching is for batch-mode
    #: models only
    max_batch_delay_ms: float = 2.0
    batching: bool = True
    #: a ``gear-runtime bench --json`` result of the model, measured where it is served: its
    #: gears' latencies become the batcher's costs (how many waiting requests a batch takes)
    profile: str | None = None
    #: the profile's digest was checked against the model's files already (by the parent
    #: of ``serve --workers``, once for all workers)
    profile_checked: bool = False
    #: requests waiting for an executor beyond which a model answers 503
    max_queue: int = 256
    #: dims mode: run requests of any shape padded to the covering gear
    #: (``execute(inputs, pad=True)``)
    pad: bool = False
    #: the largest request body; None: per model, from its largest gear (see request_limit)
    max_body_bytes: int | None = None
    #: wait out the batch delay even with an executor free, as Triton does (off: what waits
    #: goes as soon as an executor is free, so a lone request never pays the delay)
    batch_wait_when_idle: bool = False
    #: onnxruntime: let the intra-op threads spin while waiting for work (a little faster
    #: under load; an idle server then burns CPU); None: ORT's own thread count
    spin: bool = False
    intra_op_threads: int | None = None
    #: more ``gr.load`` options (``--device``, ``--config``, ``--input-shape``), as pairs
    device_options: tuple[tuple[str, Any], ...] = ()
    #: resident state pairs (input, output) of a stateful model (``--state past_kv=present_kv``):
    #: the model is served over Triton's sequence protocol (serving/sequences.py)
    state: tuple[tuple[str, str], ...] = ()
    #: sequences live at once (a stateful model: one executor each, None: 4; a causal LM
    #: folder: the engine's rows, None: what its build chose, else 8) and how long an idle
    #: one keeps its slot
    max_sequences: int | None = None
    sequence_idle_s: float = DEFAULT_IDLE_S
    #: this process's index under ``serve --workers`` (its metrics are labelled with it)
    worker: int | None = None
    #: the workers of this server (``serve --workers``; sequences are routed among them)
    workers: int = 1
    #: the folder the workers share: metrics snapshots (serving/metrics.py) and each
    #: worker's socket for the requests of sequences it holds (serving/peers.py)
    worker_dir: str | None = None
    #: the model a sequence_start request runs (a prefill gear file, padded to its covering
    #: gear), its outputs named like the state outputs written into the new sequence's state
    sequence_start: str | None = None
    #: keep each state pair in ONE buffer where the graph updates it in place
    #: (``create_executor(in_place_state=True)``: onnxruntime-genai's GroupQueryAttention)
    in_place_state: bool = False
    #: one log line per answered HTTP request (serving/logs.py, ``serve --access-log``)
    access_log: bool = False

    def load_options(self) -> dict[str, Any]:
        """The options ``gr.load`` gets for these serving options."""
        known = facts(self.backend)
        options: dict[str, Any] = {}
        if known.spin_keys:
            spin = "1" if self.spin else "0"
            options["session_config"] = dict.fromkeys(known.spin_keys, spin)
        if self.intra_op_threads is not None and known.threads_option:
            options[known.threads_option] = self.intra_op_threads
        options.update(self.device_options)
        return options


#: Room in a request body beyond its tensors' data: the JSON around them, names,
#: parameters, and per input.
REQUEST_HEADROOM = 64 * 2**10
REQUEST_HEADROOM_PER_INPUT = 2**10
#: The body limit of a model whose inputs have no upper bound (a hybrid model runs any
#: shape on its dynamic-shape graph), unless --max-body-mb says otherwise.
UNBOUNDED_MODEL_BODY_BYTES = 64 * 2**20


def request_limit(model: Any) -> int:
    """The largest body a request to ``model`` can need: the inputs of its largest gear, in
    the wider of their binary and their JSON encoding (elements x the widest JSON text of a
    value of the dtype, with separators and brackets), plus headroom for the rest."""
    if model.hybrid:
        return UNBOUNDED_MODEL_BODY_BYTES
    dtypes = [np.dtype(d) for d in model.info.input_dtypes]
    widest = 0
    for gear in range(model.gear_count):
        shapes = model.spec.shapes(gear)
        size = 0
        for name, dtype in zip(model.input_names, dtypes, strict=True):
            n = math.prod(shapes[name])
            size += n * max(dtype.itemsize, json_width(dtype, len(shapes[name])))
        widest = max(widest, size)
    return widest + REQUEST_HEADROOM + REQUEST_HEADROOM_PER_INPUT * len(dtypes)


def model_name(path: str | os.PathLike[str]) -> str:
    """The served name of a model file: its file name without ``.gear.onnx`` / ``.onnx`` /
    ``.om`` / ``.mindir`` (``fake_conv.om`` is served as ``fake_conv``)."""
    name = Path(path).name
    for suffix in (".gear.onnx", ".onnx", *OWN_FILE_SUFFIXES):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


class ExecutorPool:
    """``size`` worker threads, each owning one executor of ``model`` for its whole life
    (made on the thread that runs it: a CUDA-graph session runs only there).

    A one-executor pool whose runs are short may lend its executor to the caller's thread
    instead (:meth:`run_here`): the server's event loop, when nothing else runs or waits. The
    hop to a worker thread and back (two wake-ups, two GIL hand-overs) cost the 0.3 ms
    convnet a sixth of its throughput at one client (docs/serving.md: HTTP binary 1,036-1,387
    vs 1,373-1,529 rows/s unbatched); KServe's ModelServer runs every predict on its loop.
    Only short runs: a long one would hold up everything the loop does meanwhile (reading
    the next requests, health checks).

    Short per gear: a task says which gear it runs (the caller knows it before the run: the
    batch's gear, or the dispatcher's match of the request), and only a gear timed short is
    lent. Runs of a model differ by gear far more than by anything else (a gear of 8 rows, or
    of a long sequence, can take a hundred times gear 1's time), so the pool's earlier runs
    are no judge of the next one: judged by them, one large-gear request after many small
    ones held the loop for its whole run. A gear never timed (and a task whose gear is not
    known: None) is never lent; its first run goes to the worker, which times it.

    Short by the runs made where the decision matters, on the caller's thread: a run on a
    worker is timed with the waits for the GIL while the loop is busy (a 0.2 ms convnet batch
    took 1-6 ms on the worker under 32 clients), so once a run of a gear was lent its time is
    the judge. Until then, the quickest of the gear's last worker runs is: contention only
    adds to a run's time, and a gear that is long everywhere is long on its quickest run."""

    #: :meth:`run_here` lends the executor only while the gear's :meth:`peak_seconds` is
    #: below this (seconds)
    RUN_HERE_BELOW_S = 0.001
    #: the peak of a gear's lent runs decays by this factor per run of that gear (lent or
    #: not): a 30 ms outlier keeps that gear off the caller's thread for its next ~110 runs
    PEAK_DECAY = 0.97
    #: the worker runs of a gear whose quickest judges it until one of its runs was lent
    AWAY_RUNS = 16

    def __init__(self, model: Any, size: int, name: str) -> None:
        self._model = model
        self._local = threading.local()
        self._threads = ThreadPoolExecutor(size, thread_name_prefix=f"gear-{name}")
        self.size = size
        self._waiting = 0
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # the lent executor is back
        self._running = 0
        self._executors: list[Any] = []  # every thread's, in the order made
        #: per gear, the recent peak of its lent runs' times (absent before the first): each
        #: one's time, or the last peak decayed by PEAK_DECAY a run where that is longer
        self._peak_here: dict[int, float] = {}
        #: per gear, its last AWAY_RUNS worker runs' times
        self._away: dict[int, deque[float]] = {}
        #: the thread the one executor is lent to (None: not lent)
        self._lent_to: int | None = None
        #: set past the drain deadline: tasks that have not started fail with ClosedError
        self.refusing = False

    @property
    def waiting(self) -> int:
        """Tasks submitted that have not started on an executor yet."""
        return self._waiting

    def peak_seconds(self, gear: int | None) -> float | None:
        """How long a run of gear ``gear`` lent to the caller's thread may take (seconds;
        None before the gear's first timed run, and for gear None): the recent peak of its
        lent runs once there was one, else the quickest of its last :attr:`AWAY_RUNS` worker
        runs (class docstring)."""
        if gear is None:
            return None
        with self._lock:  # a worker may be recording
            peak = self._peak_here.get(gear)
            if peak is not None:
                return peak
            away = self._away.get(gear)
            return min(away) if away else None

    def warm_up(self) -> None:
        """Create every thread's executor now (not on the first requests): N tasks meet at a
        barrier, so each runs on a thread of its own."""
        barrier = threading.Barrier(self.size)
        futures = [self._threads.submit(self._create_and_wait, barrier)
                   for _ in range(self.size)]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError | None)),
                     next((e for e in errors if e is not None), None))
        if first is not None:
            raise first

    def _create_and_wait(self, barrier: threading.Barrier) -> None:
        try:
            self._executor()
        except BaseException:
            barrier.abort()  # the other threads stop waiting: the error is reported at once
            raise
        barrier.wait(timeout=120)

    def _executor(self) -> Any:
        ex = getattr(self._local, "executor", None)
        if ex is None:
            ex = self._local.executor = self._model.create_executor()
            with self._lock:
                self._executors.append(ex)
        return ex

    def _timed(self, fn: Callable[[Any], T], ex: Any, gear: int | None) -> T:
        """``fn(ex)``, its time taken into gear ``gear``'s :meth:`peak_seconds` (None: not
        timed); the task is over after."""
        started = time.perf_counter()
        try:
            return fn(ex)
        finally:
            seconds = time.perf_counter() - started
            with self._lock:
                if gear is not None:
                    self._record_locked(seconds, gear)
                self._running -= 1

    def record(self, seconds: float, gear: int | None) -> None:
        """One run of gear ``gear`` taking ``seconds`` on this thread into its
        :meth:`peak_seconds` (None: nothing is recorded): for a task that is not one run (a
        chain of batches, each recorded by its runner)."""
        if gear is not None:
            with self._lock:
                self._record_locked(seconds, gear)

    def _record_locked(self, seconds: float, gear: int) -> None:
        old = self._peak_here.get(gear)
        if self._lent_to == threading.get_ident():
            self._peak_here[gear] = seconds if old is None else max(seconds,
                                                                    old * self.PEAK_DECAY)
            return
        away = self._away.get(gear)
        if away is None:  # at most one per gear of the model
            away = self._away[gear] = deque(maxlen=self.AWAY_RUNS)
        away.append(seconds)
        if old is not None:
            self._peak_here[gear] = old * self.PEAK_DECAY

    def can_run_here(self, gear: int | None) -> bool:
        """Whether :meth:`run_here` may lend the executor for a run of gear ``gear``, as far
        as the pool's shape and that gear's recent runs go (whether a task runs or waits is
        :meth:`run_here`'s to see): one executor, made, on a session that may run on another
        thread than its own (not a CUDA-graph session), the gear known and its recent runs
        all under :attr:`RUN_HERE_BELOW_S`, and not past the drain deadline. One executor
        only: with more, a run here would keep the loop from handing the others work."""
        if self.size != 1 or self.refusing or not self._executors:
            return False
        peak = self.peak_seconds(gear)
        if peak is None or peak >= self.RUN_HERE_BELOW_S:
            return False
        return not getattr(getattr(self._executors[0], "session", None), "thread_bound", False)

    def run_here(self, fn: Callable[[Any], T], gear: int | None, *,
                 timed: bool = True) -> T | NotHere:
        """``fn(executor)``, a run of gear ``gear``, on this thread, now, where
        :meth:`can_run_here` and no task runs or waits (the caller, the event loop, submits
        every task: nothing queues behind it); else :data:`NOT_HERE`, and nothing ran.
        ``timed``: as for :meth:`submit`."""
        if not self.can_run_here(gear):
            return NOT_HERE
        with self._lock:
            if self._running or self._waiting or self.refusing:
                return NOT_HERE
            ex = self._executors[0]
            self._running += 1
            self._lent_to = threading.get_ident()
        try:
            return self._timed(fn, ex, gear if timed else None)
        finally:
            with self._lock:
                self._lent_to = None
                self._returned.notify_all()

    async def call(self, fn: Callable[[Any], T], gear: int | None = None,
                   deadline: Deadline | None = None) -> T:
        """``fn(executor)``, a run of gear ``gear``, on a free worker thread, awaited
        (:meth:`submit`). A task still waiting at ``deadline`` is dropped and raises the
        deadline's error; one that started finishes."""
        future = self.submit(fn, gear)
        if deadline is None:
            return await asyncio.wrap_future(future)
        # Future.cancel() fails once a thread took the task: the run and the deadline
        # settle atomically which came first
        expired: list[bool] = []
        timer = deadline.arm(lambda: expired.append(future.cancel()))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if any(expired):
                raise deadline.error() from None
            raise
        finally:
            timer.cancel()

    def submit(self, fn: Callable[[Any], T], gear: int | None = None) -> Future[T]:
        """``fn(executor)`` on a free worker thread, as a future. The task counts as waiting
        until it starts or, cancelled before it started (the client hung up, a gRPC cancel
        or timeout), until the cancel: whatever ends the wait ends the count, exactly once.
        Past the drain deadline the future fails with ClosedError before ``fn`` runs.
        ``gear``: the task is one run of that gear, its time goes into the gear's
        :meth:`peak_seconds`; None: it is not timed (a gear not known, or a task whose runs
        are recorded one by one: :meth:`record`)."""
        waiting = _Waiting(self)
        try:
            future = self._threads.submit(self._run, fn, waiting, gear)
        except BaseException:
            waiting.end()
            raise
        future.add_done_callback(lambda f: waiting.end())  # a cancelled task never starts
        return future

    def _run(self, fn: Callable[[Any], T], waiting: _Waiting, gear: int | None) -> T:
        with self._lock:  # no longer waiting, and running, at once: run_here sees either
            waiting.end_locked()
            while self._lent_to is not None:  # the one executor is lent to the loop: back in < 1 ms
                self._returned.wait()
            self._running += 1
        try:
            if self.refusing:
                raise ClosedError("the server is shutting down (past its drain deadline): "
                                  "retry on another replica")
            ex = self._executor()
        except BaseException:
            with self._lock:
                self._running -= 1
            raise
        return self._timed(fn, ex, gear)

    def close(self) -> None:
        """Wait for running tasks, stop the threads (the model's close closes executors)."""
        self._threads.shutdown(wait=True, cancel_futures=True)


class PoolBatches:
    """The batcher's :class:`~gear_runtime.serving.batcher.WorkerRunner` over an executor
    pool: a batch runs on a pool thread's executor, and that thread takes the next waiting
    batch itself when it is done. Each batch is one run of the pool's
    (:meth:`ExecutorPool.record`), not the chain of batches a task runs: a chain is as long
    as the load lasts, and timed as one it would keep every batch off the loop. A batch is
    timed as a run of its gear, ``gear_for(rows)`` (the batch plan's)."""

    def __init__(self, pool: ExecutorPool,
                 run: Callable[[list[list[np.ndarray]], Any], tuple[Any, Any]],
                 gear_for: Callable[[int], int]) -> None:
        self._pool, self._run, self._gear_for = pool, run, gear_for

    def submit(self, fn: Callable[[Any], T]) -> Future[T]:
        return self._pool.submit(fn)  # untimed: each batch of the chain is (run_on)

    def run_on(self, worker: Any, requests: list[list[np.ndarray]]) -> tuple[Any, Any]:
        gear = self._gear_for(sum(r[0].shape[0] for r in requests))
        started = time.perf_counter()
        try:
            return self._run(requests, worker)
        finally:
            self._pool.record(time.perf_counter() - started, gear)

    def can_run_here(self, gear: int) -> bool:
        return self._pool.can_run_here(gear)

    def run_here(self, fn: Callable[[Any], T], gear: int) -> T | NotHere:
        return self._pool.run_here(fn, gear, timed=False)


class _Waiting:
    """One task's place in :attr:`ExecutorPool.waiting`: taken when made, given back once."""

    __slots__ = ("_ended", "_pool")

    def __init__(self, pool: ExecutorPool) -> None:
        self._pool, self._ended = pool, False
        with pool._lock:
            pool._waiting += 1

    def end(self) -> None:
        with self._pool._lock:
            self.end_locked()

    def end_locked(self) -> None:
        """:meth:`end` with the pool's lock held."""
        if not self._ended:
            self._ended = True
            self._pool._waiting -= 1


class ServedModel:
    """One model behind the server: metadata, request checks, execution (batched or not)."""

    def __init__(self, name: str, model: Any, options: ServeOptions, metrics: Metrics,
                 path: str | None = None, version: str = MODEL_VERSION) -> None:
        self.name, self.model, self.options, self.metrics = name, model, options, metrics
        self.path, self.version = path, version
        #: set by a model repository's Triton layout (serving/triton_config.py): every
        #: version served under the name (metadata), the version policy (configuration),
        #: and False where config.pbtxt says max_batch_size 0 (axis 0 is then no batch
        #: axis to clients, and the configuration's dims keep it)
        self.versions: tuple[str, ...] = (version,)
        self.version_policy: dict[str, Any] = {"latest": {"num_versions": 1}}
        self.batch_axis = True
        spec = model.spec
        state = dict(options.state)
        #: the state pairs' names: neither a request nor an answer carries them
        self.state_names = set(state) | set(state.values())
        keep = [i for i, n in enumerate(spec.input_names) if n not in state]
        self._names = [spec.input_names[i] for i in keep]
        self._dtypes = [np.dtype(model.info.input_dtypes[i]) for i in keep]
        self._datatypes = [datatype_of(d) for d in self._dtypes]
        self._shapes = [tuple(spec.input_shapes[i]) for i in keep]
        #: every input's rank, summed: a dynamic_dims of this length is full dims
        self._ranks = sum(len(s) for s in spec.input_shapes)
        #: the outputs a request is answered with (model order, state outputs left out)
        self.output_names = [n for n in model.output_names if n not in self.state_names]
        self.max_request_bytes = options.max_body_bytes or request_limit(model)
        self.stats = ModelStats(name, version)
        #: the sequence slots of a stateful model (None: stateless, served by the pool)
        self.sequences: SequenceSlots | None = None
        #: the start model (None: a start runs the step model like any step)
        self.start: StartModel | None = None
        if state:
            self.sequences = sequences = SequenceSlots(
                model, state, options.max_sequences or DEFAULT_SEQUENCE_SLOTS, name,
                options.sequence_idle_s, on_event=partial(metrics.sequence, name),
                in_place=options.in_place_state, max_waiting=options.max_queue)
            metrics.track_sequences(name, lambda: sequences.live)
            if options.sequence_start is not None:
                self.start = StartModel(options.sequence_start, model, state,
                                        self.output_names, options)
        # a stateful model's requests run on their sequences' executors: its pool has one
        # thread and never makes an executor
        self.pool = ExecutorPool(model, 1 if state else options.executors, name)
        self.plan, why = BatchPlan.for_model(model.dispatcher, model.info.output_shapes)
        self.batcher: Batcher | None = None
        self.no_batching_reason = "batching is off" if self.plan else why
        if options.batching and self.plan is not None and not state:
            batches = PoolBatches(self.pool, self._timed_batch, self.plan.gear_for)
            self.batcher = Batcher(self.plan, batches,
                                   max_delay_s=options.max_batch_delay_ms / 1000,
                                   slots=options.executors, on_batch=self._count_batch,
                                   wait_when_idle=options.batch_wait_when_idle)
        self._users = 0
        self._unused: asyncio.Event | None = None
        metrics.track_queue(name, self.queue_depth)
        if not state:
            self.pool.warm_up()

    def queue_depth(self) -> int:
        """Requests admitted and not yet running."""
        return (self.pool.waiting + (len(self.batcher) if self.batcher else 0)
                + (self.sequences.waiting if self.sequences else 0))

    def gear_label(self, gear: int | None) -> str:
        """The metrics label of gear index ``gear``: its dims, or "dynamic" (hybrid miss)."""
        return "dynamic" if gear is None else ",".join(map(str, self.model.gears[gear]))

    @contextmanager
    def use(self) -> Iterator[ServedModel]:
        """Count one request using this model for the time of the ``with``."""
        self._users += 1
        try:
            yield self
        finally:
            self._users -= 1
            if not self._users and self._unused is not None:
                self._unused.set()

    async def retire(self) -> None:
        """Close once the requests using the model now are answered (a hot swap or an
        unload: the model is already out of the server's table, so no new request comes)."""
        if self._users:
            self._unused = asyncio.Event()
            await self._unused.wait()
        await self.close()

    def refuse_waiting(self) -> None:
        """Past the drain deadline: requests not started yet fail with ClosedError (503);
        those running finish."""
        self.pool.refusing = True
        if self.sequences is not None:
            self.sequences.refusing = True
        if self.batcher is not None:
            self.batcher.fail_waiting(ClosedError(
                "the server is shutting down (past its drain deadline): retry on another "
                "replica"))

    # ---- what the model is ---------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """v2 model metadata, with the gears (and whether requests are batched) as
        parameters; -1 marks an axis that differs between gears."""
        info = self.model.info
        outputs = [{"name": n, "datatype": datatype_of(dt), "shape": shape}
                   for n, dt, shape in zip(info.output_names, info.output_dtypes,
                                           self._output_shapes(), strict=True)
                   if n not in self.state_names]
        inputs = [{"name": n, "datatype": d, "shape": list(s)}
                  for n, d, s in zip(self._names, self._datatypes, self._shapes, strict=True)]
        params: dict[str, Any] = {"mode": self.model.mode,
                                  "gears": [list(g) for g in self.model.gears],
                                  "batching": self.batcher is not None,
                                  "pad": self.options.pad and self.batcher is None}
        if self.batcher is not None:
            params["max_batch_delay_ms"] = self.options.max_batch_delay_ms
        if self.sequences is not None:
            params["sequences"] = {"max": self.sequences.size,
                                   "idle_seconds": self.sequences.idle_s,
                                   "state": dict(self.options.state)}
            if self.start is not None:  # what a sequence_start request carries
                params["sequences"]["start"] = self.start.describe()
        return {"name": self.name, "versions": list(self.versions),
                "platform": f"gear_runtime_{self.model.backend}", "inputs": inputs,
                "outputs": outputs, "parameters": params}

    def _output_shapes(self) -> list[list[int]]:
        info = self.model.info
        return [_merged_shape([g[k] for g in info.output_shapes])
                for k in range(len(info.output_names))]

    def config(self) -> dict[str, Any]:
        """The model configuration in Triton's schema (ModelConfig of model_config.proto, as
        Triton's HTTP API writes it). ``max_batch_size`` is the largest batch gear when the
        model batches on axis 0 of every input and output (then ``dims`` leave the batch
        out, as Triton's do), else 0; the batch gears are the dynamic batcher's preferred
        sizes; the gears and the mode are parameters."""
        plan = self.plan
        batched = self.batch_axis and plan is not None and all(a == 0 for a in
                                                               plan.output_axes)
        skip = 1 if batched else 0
        info = self.model.info
        inputs = [{"name": n, "data_type": f"TYPE_{d}", "dims": list(s[skip:])}
                  for n, d, s in zip(self._names, self._datatypes, self._shapes, strict=True)]
        outputs = [{"name": n, "data_type": f"TYPE_{datatype_of(dt)}", "dims": shape[skip:]}
                   for n, dt, shape in zip(info.output_names, info.output_dtypes,
                                           self._output_shapes(), strict=True)
                   if n not in self.state_names]
        config: dict[str, Any] = {
            "name": self.name, "platform": f"gear_runtime_{self.model.backend}",
            "backend": "gear_runtime", "version_policy": self.version_policy,
            "max_batch_size": plan.max_rows if batched and plan is not None else 0,
            "input": inputs, "output": outputs,
            "instance_group": [{"name": self.name,
                                "kind": facts(self.model.backend).instance_kind,
                                "count": self.options.executors}],
            "parameters": {"mode": {"string_value": self.model.mode},
                           "gears": {"string_value": ";".join(
                               ",".join(map(str, g)) for g in self.model.gears)},
                           "pad": {"string_value": str(self.options.pad and
                                                       self.batcher is None).lower()}},
        }
        if self.sequences is not None:
            config["sequence_batching"] = self._sequence_config()
            if self.start is not None:
                config["parameters"]["sequence_start"] = {
                    "string_value": json.dumps(self.start.describe())}
        if self.batcher is not None:
            config["dynamic_batching"] = {
                "preferred_batch_size": list(self.batcher.plan.sizes),
                "max_queue_delay_microseconds": round(self.options.max_batch_delay_ms * 1000)}
        return config

    def _sequence_config(self) -> dict[str, Any]:
        """Triton's ``sequence_batching`` with implicit state (model_config.proto): the
        direct strategy (one slot per live sequence), the idle limit, each state pair."""
        info, spec = self.model.info, self.model.spec
        index = {n: i for i, n in enumerate(spec.input_names)}
        assert self.sequences is not None
        return {"direct": {}, "max_sequence_idle_microseconds":
                round(self.sequences.idle_s * 1e6),
                "state": [{"input_name": i, "output_name": o,
                           "data_type": f"TYPE_{datatype_of(info.input_dtypes[index[i]])}",
                           "dims": list(spec.input_shapes[index[i]]),
                           "initial_state": [{"name": f"{i}_zeros", "zero_data": True,
                                              "data_type": "TYPE_"
                                              + datatype_of(info.input_dtypes[index[i]]),
                                              "dims": list(spec.input_shapes[index[i]])}]}
                          for i, o in self.options.state]}

    # ---- running -------------------------------------------------------------------------
    def rows(self, request: InferRequest) -> int:
        """The rows a request holds (Triton's inference count): its batch in batch mode."""
        if self.model.mode == "batch":
            first = request.inputs.get(self._names[0])
            if first is not None and first.ndim:
                return int(first.shape[0])
        return 1

    @property
    def saturated(self) -> bool:
        """Its queue is full: a request now would get 503 [queue_full]. Readiness does not
        read it (one client's backlog must not take the server out for everyone); a
        sequence's requests obey the same bound in SequenceSlots."""
        return self.queue_depth() >= self.options.max_queue

    async def infer(self, request: InferRequest, deadline: Deadline | None = None
                    ) -> tuple[RunTiming, list[np.ndarray]]:
        """Run ``request``: (how it ran, outputs in model order). InputError (400) for a
        request that does not fit the model, QueueFullError (503) when the queue is full,
        the deadline's error (serving/deadline.py) when ``deadline`` passes while it waits
        in a queue (or passed before it reached one)."""
        if deadline is not None and deadline.passed():
            raise deadline.error()
        control = None
        if self.sequences is not None:
            control = sequence_control(request.parameters)
            if control.start and self.start is not None:  # the prompt, on the start model
                self.check_outputs(request)
                arrays = self.start.inputs(request)
                return await self.sequences.call(control, partial(self.start.run, arrays,
                                                                  self.stats), deadline)
        arrays = self._inputs(request)
        self.check_outputs(request)
        dims = self._dims(request)
        if self.sequences is not None:
            if dims is not None:
                raise InputError(f"model {self.name!r} is static: its one gear takes no "
                                 '"dynamic_dims"')
            assert control is not None  # read above, with the sequences
            return await self.sequences.call(control, partial(self._run_one, arrays, None),
                                             deadline)
        if self.saturated:
            raise QueueFullError(f"model {self.name!r} has {self.queue_depth()} requests "
                                 f"waiting (--max-queue {self.options.max_queue}); retry later")
        if self.batcher is not None and dims is None:
            self._check_batch(arrays)
            return await self.batcher.submit(arrays, deadline)
        run, gear = partial(self._run_one, arrays, dims), self._gear_of(arrays, dims)
        done = self.pool.run_here(run, gear)  # a short gear, the pool idle: no thread hop
        return await self.pool.call(run, gear, deadline) if done is NOT_HERE else done

    def _gear_of(self, arrays: list[np.ndarray], dims: list[int] | None) -> int | None:
        """The gear the executor will run ``arrays`` on (``dims`` set, if any: that gear,
        padded or not; else the exact match, or padded the covering gear), as the
        executor's rules pick it: what lending the run to the loop is judged by. None where
        no gear is known beforehand (none fits: the run fails, or a hybrid model runs its
        dynamic-shape graph), and such a run is never lent."""
        dispatcher = self.model.dispatcher
        try:
            if dims is not None:
                if len(dims) == dispatcher.spec.values_per_gear and len(dims) != self._ranks:
                    return dispatcher.match(dims)  # the dynamic values alone
                return dispatcher.match(dispatcher.values_from_full_dims(dims))
            values = dispatcher.extract(arrays)
            return dispatcher.cover(values) if self.options.pad else dispatcher.match(values)
        except Exception:  # the run itself reports what is wrong, with its own error
            return None

    def _inputs(self, request: InferRequest) -> list[np.ndarray]:
        """The request's arrays in model input order, names and datatypes checked."""
        return request_arrays(request, self._names, self._datatypes, f"model {self.name!r}")

    def check_outputs(self, request: InferRequest) -> None:
        """InputError for a requested output the model does not answer."""
        if request.outputs is None:
            return
        unknown = [n for n in request.outputs if n not in self.output_names]
        if unknown:
            raise InputError(f"model {self.name!r} has no output {unknown[0]!r}; its outputs "
                             f"are {', '.join(self.output_names)}")

    @staticmethod
    def _dims(request: InferRequest) -> list[int] | None:
        """The request parameter ``dynamic_dims`` (as set_dynamic_dims takes), if any."""
        dims = request.parameters.get("dynamic_dims")
        if dims is None:
            return None
        if not isinstance(dims, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63
                for d in dims):
            shown = repr(dims) if len(repr(dims)) <= 200 else repr(dims)[:200] + "..."
            raise InputError('parameter "dynamic_dims" must be a list of integers in '
                             f"0..2**63-1, got {shown}")
        return dims

    def _check_batch(self, arrays: Sequence[np.ndarray]) -> None:
        """The executor's checks, made before the request joins a batch (a bad request
        never spoils one): the dispatcher's GetCurDynamicDims (ranks, static dims, one batch
        size for all inputs: 145012, the core's rule), then rows the batch table serves
        (145013)."""
        (n,) = self.model.dispatcher.extract(arrays)
        assert self.batcher is not None  # only requests that join a batch are checked here
        plan = self.batcher.plan
        if not 1 <= n <= plan.max_rows:
            raise GearMismatchError(
                f"batch size {n} fits no gear of model {self.name!r}: requests are batched "
                f"into the gears {', '.join(map(str, plan.sizes))}, so 1..{plan.max_rows} "
                "rows are served")

    def _run_one(self, arrays: list[np.ndarray], dims: list[int] | None,
                 ex: Any) -> tuple[RunTiming, list[np.ndarray]]:
        """One request on executor ``ex`` (its thread): the set dims are cleared after, so
        the executor's next request starts clean."""
        started = time.perf_counter()
        if dims is None:
            outputs = self._execute(ex, arrays)
        else:
            ex.set_dynamic_dims(dims)
            try:
                outputs = self._execute(ex, arrays)
            finally:
                ex.clear_dynamic_dims()
        gear = ex.last_gear
        rows = self.model.gears[gear][0] if self.model.mode == "batch" and gear is not None \
            else 1
        timing = RunTiming(gear, rows, started, 0.0, time.perf_counter() - started, 0.0)
        self.stats.executed(timing)
        return timing, outputs

    def _execute(self, ex: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if not self.options.pad:
            return ex.execute(arrays)
        outputs = ex.execute(arrays, pad=True)
        request, gear = getattr(ex, "last_request_dims", None), ex.last_dynamic_dims
        if request is not None and gear is not None and ex.last_gear is not None:
            self.metrics.padded(self.name, self.gear_label(ex.last_gear),
                                math.prod(request) / max(1, math.prod(gear)))
        return outputs

    def _timed_batch(self, requests: list[list[np.ndarray]],
                     ex: Any) -> tuple[RunTiming, list[list[np.ndarray]]]:
        """run_batch on executor ``ex``, timed: gathering, execute, splitting."""
        started = time.perf_counter()
        marks: list[float] = []

        def execute(inputs: list[np.ndarray]) -> list[np.ndarray]:
            marks.append(time.perf_counter())
            outputs = ex.execute(inputs)
            marks.append(time.perf_counter())
            return outputs

        assert self.batcher is not None  # runs the batcher's batches only
        plan = self.batcher.plan
        gear, split = run_batch(execute, plan, requests)
        done = time.perf_counter()
        return RunTiming(gear, plan.sizes[gear], started, marks[0] - started,
                         marks[1] - marks[0], done - marks[1]), split

    def _count_batch(self, timing: RunTiming, rows: int) -> None:
        self.metrics.batch(self.name, self.gear_label(timing.gear), rows, timing.gear_rows)
        self.stats.executed(timing)

    async def close(self) -> None:
        """Stop batching, wait for running work, close the executors and the model(s)."""
        if self.batcher is not None:
            await self.batcher.close()
        await asyncio.to_thread(self.pool.close)
        if self.sequences is not None:
            await asyncio.to_thread(self.sequences.close)
        if self.start is not None:
            self.start.close()
        self.model.close()


def request_arrays(request: InferRequest, names: Sequence[str], datatypes: Sequence[str],
                   owner: str) -> list[np.ndarray]:
    """``request``'s arrays in the order of ``names``, the names (``check_names``) and each
    input's v2 datatype checked; InputError naming the input and ``owner`` otherwise."""
    check_names(request.inputs, names, owner)
    for name, datatype in zip(names, datatypes, strict=True):
        if request.datatypes[name] != datatype:
            raise InputError(f"input {name!r} has datatype {request.datatypes[name]}, "
                             f"{owner} takes {datatype}")
    return [request.inputs[n] for n in names]


class StartModel:
    """The model a sequence's start request runs (``serve --sequence-start``): the prompt at
    its covering gear (``execute(pad=True)``), each output named like a state output written
    straight into the new sequence's state (``out=``: no copy through the host), the other
    outputs answered. Its weights are shared with the step model's where they are equal
    (``load(..., share_weights_with=)``). One executor, runs one at a time: starts are few
    next to steps."""

    def __init__(self, path: str, step: Any, state: dict[str, str],
                 answered: Sequence[str], options: ServeOptions) -> None:
        import gear_runtime as gr

        shares = facts(options.backend).shares_weights and step.backend_model.weights_shareable()
        share = {"share_weights_with": step} if shares else {}
        self.model = gr.load(path, backend=options.backend, **options.load_options(), **share)
        try:
            self._check(step, state, answered, path)
            self.state = state
            self.names = list(self.model.input_names)
            self.dtypes = [np.dtype(d) for d in self.model.info.input_dtypes]
            self.datatypes = [datatype_of(d) for d in self.dtypes]
            self.executor = self.model.create_executor()
        except BaseException:
            self.model.close()
            raise
        self._lock = threading.Lock()

    def _check(self, step: Any, state: dict[str, str], answered: Sequence[str],
               path: str) -> None:
        """InputError unless the start model has each state output (the step model's shape
        and dtype) and answers the step model's other outputs, by name."""
        outputs = list(self.model.output_names)
        for inp, out in state.items():
            if out not in outputs:
                raise InputError(f"--sequence-start {path!r} has no output {out!r} to start "
                                 f"the state {inp!r} with; its outputs: {', '.join(outputs)}")
            k, j = outputs.index(out), list(step.input_names).index(inp)
            want = tuple(step.spec.input_shapes[j])
            shapes = {tuple(self.model.output_shape(g, k)) for g in range(self.model.gear_count)}
            if shapes != {want} or self.model.info.output_dtypes[k] != \
                    step.info.input_dtypes[j]:
                raise InputError(f"--sequence-start {path!r}: output {out!r} is "
                                 f"{self.model.info.output_dtypes[k]} {sorted(shapes)}, the "
                                 f"state {inp!r} is {step.info.input_dtypes[j]} {list(want)}")
        others = [n for n in outputs if n not in state.values()]
        if others != list(answered):
            raise InputError(f"--sequence-start {path!r} answers {others}, the step model "
                             f"{list(answered)}: a sequence's answers must have one set of "
                             "outputs")

    def describe(self) -> dict[str, Any]:
        """What a sequence_start request carries: the start model's inputs (-1 where its
        gears differ: padded to the covering gear) and gears."""
        spec = self.model.spec
        shapes = [spec.shapes(g) for g in range(self.model.gear_count)]
        return {"inputs": [{"name": n, "datatype": d,
                            "shape": _merged_shape([s[n] for s in shapes])}
                           for n, d in zip(self.names, self.datatypes, strict=True)],
                "gears": [list(g) for g in self.model.gears]}

    def inputs(self, request: InferRequest) -> list[np.ndarray]:
        """The start request's arrays in the start model's input order, checked."""
        return request_arrays(request, self.names, self.datatypes,
                              "the sequence's start model")

    def run(self, arrays: list[np.ndarray], stats: ModelStats,
            ex: Any) -> tuple[RunTiming, list[np.ndarray]]:
        """The prompt on the start model, its state outputs written into ``ex``'s state.
        Runs inside SequenceSlots.call, on the slot's thread after its reset, in the
        sequence's order (a cut-off start still writes before the steps behind it run); if
        it fails, the half-written state belongs to no sequence (the start leaves it not
        live)."""
        started = time.perf_counter()
        out = {o: ex.state[i] for i, o in self.state.items()}
        with self._lock:
            outputs = self.executor.execute(dict(zip(self.names, arrays, strict=True)),
                                            pad=True, out=out)
            gear = self.executor.last_gear
        keep = [k for k, n in enumerate(self.model.output_names) if n not in out]
        # the gear is the START model's: labelled as such, never looked up in the step's
        label = "start:" + ("dynamic" if gear is None else
                            ",".join(map(str, self.model.gears[gear])))
        timing = RunTiming(gear, 1, started, 0.0, time.perf_counter() - started, 0.0,
                           label=label)
        stats.executed(timing)
        return timing, [outputs[k] for k in keep]

    def close(self) -> None:
        self.model.close()


def _merged_shape(shapes: Sequence[Sequence[int]]) -> list[int]:
    """One shape for all gears: -1 where they differ."""
    return [d if all(len(s) == len(shapes[0]) and s[a] == d for s in shapes) else -1
            for a, d in enumerate(shapes[0])]


def load_models(files: Sequence[str], names: Sequence[str] | None, options: ServeOptions,
                metrics: Metrics) -> dict[str, ServedModel]:
    """Load every gear file and start its executors; names from ``names`` or the files.
    GearRuntimeError for duplicate names or a bad file."""
    names = list(names) if names else [model_name(f) for f in files]
    if len(names) != len(files):
        raise InputError(f"{len(names)} names for {len(files)} files: give one --name per file")
    if len(set(names)) != len(names):
        raise InputError(f"two models would be served as the same name: {names}; use --name")
    served: dict[str, ServedModel] = {}
    try:
        for name, path in zip(names, files, strict=True):
            served[name] = load_one(name, path, options, metrics)
        _check_pad(served, options)
    except BaseException:
        close_loaded(served.values())
        raise
    return served


def close_loaded(models: Iterable[ServedModel]) -> None:
    """Close models loaded but never served (a later load failed): their threads, sequence
    slots and files, at once (no request can be using them)."""
    for m in models:
        m.pool.close()
        if m.sequences is not None:
            m.sequences.close()
        if m.start is not None:
            m.start.close()
        m.model.close()


def _check_pad(served: dict[str, ServedModel], options: ServeOptions) -> None:
    """``--pad`` must pad something: a batched batch-mode model runs its requests in the
    covering batch gear already (a request of 3 rows joins a batch run as gear 4)."""
    if options.pad and served and all(m.batcher is not None for m in served.values()):
        raise InputError(
            f"--pad does nothing here: {', '.join(sorted(served))} "
            f"{'is a batch-mode model' if len(served) == 1 else 'are batch-mode models'} "
            "whose requests are batched and padded into the batch gears already; drop --pad "
            "(or add --no-batching to pad each request to its covering gear alone)")


def check_profile(path: str, model_path: str, backend: str) -> dict[str, Any]:
    """``serve --profile``'s file check: the bench result at ``path``, read; InputError naming
    it when it cannot be read or was measured on another model than the gear file
    ``model_path`` (its files' digest, as ``bench --compare`` checks). Hashes every file of
    the model: ``serve --workers`` makes this check once, in the parent."""
    from gear_runtime.tools.bench.context import files_digest, model_files
    from gear_runtime.tools.bench.result import load_result

    result = load_result(path, flag="--profile")
    measured = result.get("context", {}).get("model", {}).get("digest")
    if measured is not None and measured != files_digest(model_files(model_path, backend)):
        raise InputError(f"--profile: {path!r} was measured on another model (its files' "
                         f"digest differs from {model_path!r}'s): run gear-runtime bench "
                         "--json on this gear file")
    return result


def attach_profile(model: Any, path: str, model_path: str, backend: str,
                   checked: bool = False) -> None:
    """``serve --profile``: the bench result at ``path`` gives every gear of ``model`` (the
    file ``model_path``) its measured latency (model.attach_profile); InputError naming the
    file when :func:`check_profile` refuses it (skipped when ``checked``: the parent of
    ``serve --workers`` made it) or it was measured on other gears."""
    from gear_runtime.tools.bench.result import gear_latencies, load_result

    result = (load_result(path, flag="--profile") if checked
              else check_profile(path, model_path, backend))
    latencies = gear_latencies(result)
    try:  # the model's own rule: a latency for each of its gears, no other gear
        model.attach_profile(latencies)
    except InputError as exc:
        raise InputError(f"--profile: {path!r} was measured on the gears "
                         f"{sorted(latencies)}, the model has "
                         f"{[tuple(g) for g in model.gears]} ({exc}): run gear-runtime "
                         "bench --json on this gear file") from exc


def load_one(name: str, path: str, options: ServeOptions, metrics: Metrics,
             version: str = MODEL_VERSION) -> ServedModel:
    """Load the gear file ``path`` and start its executors, served as ``name`` (version
    ``version``)."""
    import gear_runtime as gr

    # a missing or unreadable file is the loader's GearFileError (its one file rule)
    model = gr.load(path, backend=options.backend, **options.load_options())
    try:
        if options.profile is not None:
            attach_profile(model, options.profile, path, options.backend,
                           checked=options.profile_checked)
        return ServedModel(name, model, options, metrics, path=path, version=version)
    except BaseException:
        model.close()
        raise
