"""A served model's executors: :class:`ExecutorPool` (worker threads, each owning one
executor), the rule that lends a short run to the event loop (:class:`LendPolicy`), and
:class:`PoolBatches`, the batcher's runner over a pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from gear_runtime.errors import ClosedError
from gear_runtime.serving.batcher import NOT_HERE, NotHere
from gear_runtime.serving.deadline import Deadline

T = TypeVar("T")


class LendPolicy:
    """Which runs a one-executor pool may lend to the caller's thread: the times of each
    gear's runs, and the rule that judges them. Guarded by its pool's lock (not thread-safe
    alone).

    A one-executor pool whose runs are short may lend its executor to the caller's thread
    instead of a worker (:meth:`ExecutorPool.run_here`): the server's event loop, when
    nothing else runs or waits. The
    hop to a worker thread and back (two wake-ups, two GIL hand-overs) costs a short model a
    large part of its throughput at one client (docs/benchmarks.md, "Figures behind choices
    in the code"); KServe's ModelServer runs every predict on its loop.
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
    worker is timed with the waits for the GIL while the loop is busy (a short batch takes
    many times its run on the worker under many clients), so once a run of a gear was lent
    its time is the judge. Until then, the quickest of the gear's last worker runs is:
    contention only adds to a run's time, and a gear that is long everywhere is long on its
    quickest run."""

    #: a gear is lent only while its :meth:`peak_seconds` is below this (seconds)
    RUN_HERE_BELOW_S = 0.001
    #: the peak of a gear's lent runs decays by this factor per run of that gear (lent or
    #: not): an outlier keeps that gear off the caller's thread for its next hundred or so runs
    #: (0.97 ** n brings a 30-fold outlier below the threshold after about 110 runs)
    PEAK_DECAY = 0.97
    #: the worker runs of a gear whose quickest judges it until one of its runs was lent
    AWAY_RUNS = 16

    def __init__(self) -> None:
        #: per gear, the recent peak of its lent runs' times (absent before the first): each
        #: one's time, or the last peak decayed by PEAK_DECAY a run where that is longer
        self._peak_here: dict[int, float] = {}
        #: per gear, its last AWAY_RUNS worker runs' times
        self._away: dict[int, deque[float]] = {}

    def peak_seconds(self, gear: int) -> float | None:
        """How long a run of gear ``gear`` lent to the caller's thread may take (seconds;
        None before the gear's first timed run): the recent peak of its lent runs once there
        was one, else the quickest of its last :attr:`AWAY_RUNS` worker runs."""
        peak = self._peak_here.get(gear)
        if peak is not None:
            return peak
        away = self._away.get(gear)
        return min(away) if away else None

    def short(self, peak: float | None) -> bool:
        """Whether a gear whose :meth:`peak_seconds` is ``peak`` may be lent."""
        return peak is not None and peak < self.RUN_HERE_BELOW_S

    def record(self, seconds: float, gear: int, lent: bool) -> None:
        """One run of gear ``gear`` that took ``seconds``, ``lent`` to the caller's thread or
        on a worker."""
        old = self._peak_here.get(gear)
        if lent:
            self._peak_here[gear] = seconds if old is None else max(seconds,
                                                                    old * self.PEAK_DECAY)
            return
        away = self._away.get(gear)
        if away is None:  # at most one per gear of the model
            away = self._away[gear] = deque(maxlen=self.AWAY_RUNS)
        away.append(seconds)
        if old is not None:
            self._peak_here[gear] = old * self.PEAK_DECAY


class ExecutorPool:
    """``size`` worker threads, each owning one executor of ``model`` for its whole life
    (made on the thread that runs it: a CUDA-graph session runs only there). A one-executor
    pool lends its executor to the caller's thread for a run of a gear its
    :class:`LendPolicy` (:attr:`lending`) judges short (:meth:`run_here`)."""

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
        #: which gears' runs are lent to the caller's thread (guarded by the pool's lock)
        self.lending = LendPolicy()
        #: the thread the one executor is lent to (None: not lent)
        self._lent_to: int | None = None
        #: set past the drain deadline: tasks that have not started fail with ClosedError
        self.refusing = False

    @property
    def waiting(self) -> int:
        """Tasks submitted that have not started on an executor yet."""
        return self._waiting

    def peak_seconds(self, gear: int | None) -> float | None:
        """How long a run of gear ``gear`` lent to the caller's thread may take
        (:meth:`LendPolicy.peak_seconds`; None for gear None)."""
        if gear is None:
            return None
        with self._lock:  # a worker may be recording
            return self.lending.peak_seconds(gear)

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
        self.lending.record(seconds, gear, lent=self._lent_to == threading.get_ident())

    def can_run_here(self, gear: int | None) -> bool:
        """Whether :meth:`run_here` may lend the executor for a run of gear ``gear``, as far
        as the pool's shape and that gear's recent runs go (whether a task runs or waits is
        :meth:`run_here`'s to see): one executor, made, on a session that may run on another
        thread than its own (not a CUDA-graph session), the gear known and its recent runs
        short (:meth:`LendPolicy.short`), and not past the drain deadline. One executor
        only: with more, a run here would keep the loop from handing the others work."""
        if self.size != 1 or self.refusing or not self._executors:
            return False
        if not self.lending.short(self.peak_seconds(gear)):
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
            while self._lent_to is not None:  # lent to the loop: back after one short run
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

