"""Gear-aware dynamic batching for batch-mode models.

Requests that arrive within ``max_delay`` of the first waiting one are gathered (first come,
first served) into the batch gear the model's dispatcher picks for their rows (the smallest
that holds them; with an attached profile, the fastest that does); a batch as large as the largest
gear goes at once, and so does whatever waits as soon as an executor is free (the delay only
lets a batch grow while every executor is busy: waiting with an executor idle costs latency
and, at low load, throughput; unless ``wait_when_idle``, Triton's rule of always waiting out
the delay). The batch's rows are concatenated, padded with zero rows up to the gear, run ONCE
on one executor, and every request gets its own rows of every output back.

Why each response equals what the request alone would return: a batch-mode gear file is GE's
multi-batch clone of a model whose rows are independent (that is what dynamic batch means),
so a row's outputs do not depend on the other rows, nor on padding rows.

While every executor is busy the batcher keeps gathering, so batches fill up under load
instead of queueing small ones (Triton's dynamic batcher does the same).

How many of the waiting requests one batch takes: all that fit the largest gear, unless the
gears' costs are known, then the prefix that runs the most rows per second. Known from an
attached profile (``serve --profile``), else learned from the batches this batcher runs
(:class:`LearnedCosts`): on a CPU, where a gear of 8 rows costs 8 gears of one or more,
padding requests into large batches loses; on a device it pays.

With a :class:`WorkerRunner` (the server's executor pool), a batch's worker thread takes the
next batch itself as soon as its run ends, when requests are waiting: the executor does not
idle through a round trip of the event loop (wake the gathering task, start a dispatch,
submit) between two batches, which costs a short model a large part of its throughput
(docs/benchmarks.md, "Figures behind choices in the code"). Results go back to the loop as
they are made; the loop keeps gathering meanwhile.
Where the runner lends its executor to the loop (a one-executor pool whose runs of the batch's
gear are short: ``WorkerRunner.run_here``), a batch runs on the loop's thread instead, with no
hop at all; the requests that arrive while it runs reach the batcher together after it and
form the next batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Literal, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

from gear_runtime.errors import ClosedError
from gear_runtime.runtime.dispatch import GearDispatcher
from gear_runtime.serving.deadline import Deadline

logger = logging.getLogger("gear_runtime.serving")


@dataclass(frozen=True)
class BatchPlan:
    """How a batch-mode model batches: the model's dispatcher (its batch table: rows -> the
    cheapest batch gear holding them) and the axis of every output that follows the batch."""

    dispatcher: GearDispatcher
    output_axes: tuple[int, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """The batch gears' sizes, in gear order."""
        return self.dispatcher.batch_sizes or ()

    @property
    def max_rows(self) -> int:
        return self.dispatcher.max_batch_rows

    @property
    def table(self) -> tuple[int, ...]:
        """``table[rows]``: the gear :meth:`gear_for` gives (index 0 unused)."""
        return self.dispatcher.batch_table()

    @property
    def measured(self) -> bool:
        """Whether the gears' costs are measured latencies (an attached profile: ``serve
        --profile``), not input elements."""
        return self.dispatcher.cost_source == "profile"

    def best_count(self, rows: Sequence[int],
                   learned: LearnedCosts | None = None) -> int:
        """How many of the waiting requests (``rows``: theirs, first come first; their sum
        fits the largest gear) one batch should take: all of them, unless the gears' costs
        are measured (an attached profile, else what ``learned`` saw batches take here) and
        a shorter prefix runs more rows per second (fewer padding rows, or a gear that costs
        more per row, on a backend whose cost grows with the rows, as a CPU's). Ties: the
        longer prefix."""
        cost_of = self._cost_of(learned)
        if len(rows) < 2 or cost_of is None:
            return len(rows)
        best, best_rate, total = len(rows), -1.0, 0
        for k, n in enumerate(rows, 1):
            total += n
            cost = cost_of(self.gear_for(total))
            rate = total / cost if cost else float("inf")
            if rate >= best_rate * (1 - 1e-9):  # a tie: the longer prefix
                best, best_rate = k, rate
        return best

    def _cost_of(self, learned: LearnedCosts | None) -> Callable[[int], float | None] | None:
        """What a gear costs: the attached profile's latency, else ``learned``'s estimate
        once it may decide; None: unknown (take all that fits)."""
        if self.measured:
            return self.dispatcher.costs.__getitem__
        if learned is not None and learned.ready():
            return learned.estimate
        return None

    def gear_for(self, rows: int) -> int:
        """The dispatcher's batch gear for ``rows`` rows (1 <= rows <= max_rows): the
        smallest holding them, or by an attached profile the fastest."""
        return self.dispatcher.batch_gear(rows)

    @classmethod
    def for_model(cls, dispatcher: GearDispatcher,
                  output_shapes: Sequence[Sequence[Sequence[int]]]) -> tuple[BatchPlan | None, str]:
        """(plan, "") for a model the batcher can serve, else (None, why not).

        Needs batch mode with every input dynamic on axis 0 only (a static input would have
        to be equal across the gathered requests) and every output with one axis that is the
        gear's batch size in every gear.
        """
        spec = dispatcher.spec
        if spec.mode != "batch":
            return None, f"mode is {spec.mode!r}, not batch"
        for name, shape in zip(spec.input_names, spec.input_shapes, strict=True):
            if [a for a, d in enumerate(shape) if d == -1] != [0]:
                return None, f"input {name!r} is not dynamic on axis 0 alone"
        sizes = tuple(g[0] for g in spec.gears)
        axes = []
        for k in range(len(output_shapes[0])):
            axis = _batch_axis([gear[k] for gear in output_shapes], sizes)
            if axis is None:
                return None, f"output {k} has no axis that follows the batch size"
            axes.append(axis)
        return cls(dispatcher, tuple(axes)), ""


def _batch_axis(shapes: Sequence[Sequence[int]], sizes: Sequence[int]) -> int | None:
    """The first axis whose size is the gear's batch size in every gear."""
    for axis in range(len(shapes[0])):
        if all(len(s) == len(shapes[0]) and s[axis] == b for s, b in zip(shapes, sizes,
                                                                         strict=True)):
            return axis
    return None


class LearnedCosts:
    """What a batch of each gear takes on this server, learned from the batches it runs:
    the gear costs :meth:`BatchPlan.best_count` weighs when no profile is attached.

    A backend whose cost grows with the rows (a CPU: BERT 4x768, batch 8 costs more than
    eight batches of 1) then stops padding requests into batches that run fewer rows per
    second than smaller ones, while one that gains from batching (an NPU, or a CPU with
    threads to spare) keeps taking all that fits. The first batch of a gear is not counted
    (a first run allocates); later ones update a moving average. A gear not measured yet is
    estimated from the nearest measured gear as if cost were proportional to rows: it ties
    with that gear, so the longer prefix is tried and measured in turn. Every ``REFRESH``-th batch
    takes all that fits whatever the estimates say, so a gear judged on a slow moment is
    measured again. Thread-safe: workers record, the loop and workers read."""

    #: weight of a new measurement in a gear's moving average
    ALPHA = 0.2
    #: every this many batches, one takes all that fits (a gear's estimate is refreshed)
    REFRESH = 64
    #: the estimates decide only where a measured gear takes at least this long (seconds):
    #: below it a batch's time is mostly the GIL and the scheduler (with many clients in the
    #: server's process a tiny convnet's batches were timed at many times its run, gear 1 as
    #: dear per row as gear 8 in some runs, which split batches that pay: docs/benchmarks.md),
    #: and the fixed cost of a batch favours taking all that fits anyway
    TRUSTED_S = 0.005

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)
        self.seconds: list[float | None] = [None] * len(self.sizes)
        self._seen = [0] * len(self.sizes)
        self._batches = 0
        self._lock = threading.Lock()

    def record(self, gear: int, seconds: float) -> None:
        """A batch of gear ``gear`` took ``seconds`` (run on an executor, inputs to outputs)."""
        with self._lock:
            self._batches += 1
            self._seen[gear] += 1
            if self._seen[gear] == 1:  # a first run: allocations, not the gear's cost
                return
            old = self.seconds[gear]
            self.seconds[gear] = seconds if old is None else old + self.ALPHA * (seconds - old)

    def ready(self) -> bool:
        """Whether the estimates should decide this batch: a gear is measured at
        ``TRUSTED_S`` or more, and this is not a refreshing batch."""
        with self._lock:
            return any(s is not None and s >= self.TRUSTED_S for s in self.seconds) and \
                self._batches % self.REFRESH != self.REFRESH - 1

    def estimate(self, gear: int) -> float | None:
        """Gear ``gear``'s measured seconds, else those of the measured gear nearest in
        rows scaled by rows (the smaller one on a tie); None when none is measured."""
        with self._lock:
            own = self.seconds[gear]
            if own is not None:
                return own
            size = self.sizes[gear]
            known = [(abs(b - size), b, s) for b, s in zip(self.sizes, self.seconds,
                                                           strict=True) if s is not None]
        if not known:
            return None
        _, b, s = min(known)
        return s * size / b


def run_batch(execute: Callable[[list[np.ndarray]], list[np.ndarray]], plan: BatchPlan,
              requests: Sequence[Sequence[np.ndarray]]) -> tuple[int, list[list[np.ndarray]]]:
    """Concatenate ``requests`` (each: its inputs, batch on axis 0), pad to the plan's gear
    for their rows (:meth:`BatchPlan.gear_for`), ``execute`` once, split back. Returns (gear
    index, every request's outputs). Runs on an executor's thread: the copies stay off the
    event loop."""
    rows = [r[0].shape[0] for r in requests]
    gear = plan.gear_for(sum(rows))
    pad = plan.sizes[gear] - sum(rows)
    if len(requests) == 1 and not pad:  # a lone request filling its gear: nothing to move
        return gear, [execute(list(requests[0]))]
    inputs = []
    for parts in zip(*requests, strict=True):
        pieces = list(parts)
        if pad:
            pieces.append(np.zeros((pad, *parts[0].shape[1:]), dtype=parts[0].dtype))
        inputs.append(np.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0])
    outputs = execute(inputs)
    bounds = np.cumsum([0, *rows])
    split = [[_rows(out, axis, bounds[i], bounds[i + 1])
              for out, axis in zip(outputs, plan.output_axes, strict=True)]
             for i in range(len(requests))]
    return gear, split


def _call(call: tuple[Any, ...]) -> None:
    """A call made as it is handed over (``(fn, *args)``): answers delivered on the loop's
    own thread, where the batch ran."""
    fn, *args = call
    fn(*args)


def _rows(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(int(start), int(stop))
    return array[tuple(index)]


@dataclass
class _Item:
    inputs: list[np.ndarray]
    rows: int
    arrived: float
    future: asyncio.Future = field(repr=False)


#: Runs one batch on a free executor: (requests' inputs) -> (how it ran: the gear and whatever
#: the runner reports, passed through as it is; each request's outputs).
BatchRunner = Callable[[list[list[np.ndarray]]], Awaitable[tuple[Any, list[list[np.ndarray]]]]]

T = TypeVar("T")


class _NotHere(enum.Enum):
    """The type of :data:`NOT_HERE`: an enum's one member, so that ``is NOT_HERE`` tells a
    type checker which of a ``T | NotHere`` it has."""

    NOT_HERE = "NOT_HERE"


#: What :meth:`WorkerRunner.run_here` returns when it did not run the task.
NOT_HERE: Final = _NotHere.NOT_HERE
NotHere = Literal[_NotHere.NOT_HERE]


@runtime_checkable
class WorkerRunner(Protocol):
    """Runs batches on worker threads that may take the next batch themselves.

    ``submit(fn)``: ``fn(worker)`` on a free worker thread (its executor), as a
    ``concurrent.futures.Future``; one that fails with
    :class:`~gear_runtime.errors.ClosedError` before ``fn`` starts never ran it.
    ``run_on(worker, requests)``: one batch, on that worker's thread, as a
    :data:`BatchRunner` would return it.
    ``run_here(fn, gear)``: ``fn(worker)``, a batch of gear ``gear``, on the caller's thread
    (the loop's), a worker's executor lent for it, where the runner allows it now (its runs
    of that gear are short, nothing else runs or waits); else :data:`NOT_HERE`, and nothing
    ran. ``can_run_here(gear)``: whether it would, as far as the runner's shape and its
    recent runs of that gear go."""

    def submit(self, fn: Callable[[Any], T]) -> concurrent.futures.Future[T]: ...

    def run_on(self, worker: Any, requests: list[list[np.ndarray]]
               ) -> tuple[Any, list[list[np.ndarray]]]: ...

    def run_here(self, fn: Callable[[Any], T], gear: int) -> T | NotHere: ...

    def can_run_here(self, gear: int) -> bool: ...


class Batcher:
    """Gathers requests for one model and runs them as gear-sized batches.

    ``run`` executes one batch on a free executor; at most ``slots`` batches run at once (one
    per executor). ``on_batch(run, rows)`` is told of every batch run (metrics; ``run``: what
    the runner reported). Lives on the event loop of its first request.
    """

    def __init__(self, plan: BatchPlan, run: BatchRunner | WorkerRunner, *, max_delay_s: float,
                 slots: int, on_batch: Callable[[Any, int], None] = lambda run, rows: None,
                 wait_when_idle: bool = False) -> None:
        self.plan = plan
        #: a WorkerRunner: each batch's worker takes the next one itself (module docstring)
        self._worker = run if isinstance(run, WorkerRunner) else None
        self._run = cast(BatchRunner, run)  # called only without a worker runner
        #: guards the waiting requests: the loop adds them, a worker may take them
        self._lock = threading.Lock()
        self._delay = max_delay_s
        self._wait_when_idle = wait_when_idle
        self._on_batch = on_batch
        self._pending: deque[_Item] = deque()
        self._pending_rows = 0
        self._arrived: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._slot_count = slots
        self._loop_task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        #: batches running now (dispatched ones and lone requests run at once)
        self._busy = 0
        #: the gears' costs as this server's batches take them (none with a profile)
        self.learned = None if plan.measured else LearnedCosts(plan.sizes)

    def __len__(self) -> int:
        """Requests waiting to be batched."""
        return len(self._pending)

    async def submit(self, inputs: list[np.ndarray], deadline: Deadline | None = None
                     ) -> tuple[Any, list[np.ndarray]]:
        """Queue one request (its inputs, batch on axis 0, 1..max_rows rows, already checked
        against the model) and wait for (how its batch ran, its outputs). Still waiting at
        ``deadline`` (not taken into a batch): dropped, the deadline's error raised."""
        loop = asyncio.get_running_loop()
        self._start(loop)
        rows = inputs[0].shape[0]
        if not (self._busy or self._pending or self._wait_when_idle or self._may_run_here(rows)):
            return await self._run_alone(inputs)
        item = _Item(inputs, rows, loop.time(), loop.create_future())
        with self._lock:
            self._pending.append(item)
            self._pending_rows += item.rows
        assert self._arrived is not None  # made by _start
        self._arrived.set()
        if deadline is None:
            return await item.future
        timer = deadline.arm(partial(self._expire, item, deadline))
        try:
            return await item.future
        finally:
            timer.cancel()

    def _expire(self, item: _Item, deadline: Deadline) -> None:
        """``item``'s deadline: failed with its error if it still waits; a batch that took
        it already (under the same lock) runs it and answers it."""
        with self._lock:
            # by identity: _Item's == would compare the arrays
            index = next((i for i, it in enumerate(self._pending) if it is item), None)
            if index is None:
                return
            del self._pending[index]
            self._pending_rows -= item.rows
        if not item.future.done():
            item.future.set_exception(deadline.error())

    async def _run_alone(self, inputs: list[np.ndarray]) -> tuple[Any, list[np.ndarray]]:
        """An idle batcher runs a request at once, in the caller's task: no hop through the
        gathering task (requests arriving meanwhile gather as usual; with a worker runner,
        its worker takes them when this run ends)."""
        assert self._slots is not None  # made by _start (submit)
        await self._slots.acquire()  # free: nothing runs
        self._busy += 1
        if self._worker is not None:
            return await self._alone_on_worker(inputs)
        try:
            started = time.perf_counter()
            run, outputs = await self._run([inputs])
            self._timed(inputs[0].shape[0], started)
            self._on_batch(run, inputs[0].shape[0])
            return run, outputs[0]
        finally:
            self._ran()

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the gathering task on the first request's loop (where the server runs)."""
        if self._loop_task is None:
            self._arrived = asyncio.Event()
            self._slots = asyncio.Semaphore(self._slot_count)
            self._loop_task = loop.create_task(self._gather_forever())

    async def _gather_forever(self) -> None:
        while True:
            try:
                await self._gather_one()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one batch's trouble
                logger.exception("batcher: unexpected error while gathering")

    async def _gather_one(self) -> None:
        # this runs in the task _start creates, after it made both
        assert self._arrived is not None and self._slots is not None
        while True:  # the first waiting request, read under the lock: a worker may take it
            with self._lock:
                first = self._pending[0] if self._pending else None
            if first is not None:
                break
            self._arrived.clear()  # no await since the check: no arrival is missed
            await self._arrived.wait()
        deadline = first.arrived + self._delay
        loop = asyncio.get_running_loop()
        # an executor free: send what waits now (a run ending wakes this loop up)
        while self._pending_rows < self.plan.max_rows and loop.time() < deadline \
                and not self._executor_free():
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11
                break
        await self._slots.acquire()  # requests keep arriving while every executor is busy
        items = self._take()
        if not items:
            self._slots.release()
            return
        self._busy += 1  # from now: a batch is on its way, later arrivals gather
        if self._worker is not None:
            if not self._ran_here(items):
                self._hand_over(items, loop)
            return
        task = loop.create_task(self._dispatch(items))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _timed(self, rows: int, started: float) -> None:
        """A batch of ``rows`` rows ran from ``started`` (perf_counter) until now."""
        if self.learned is not None:
            self.learned.record(self.plan.gear_for(rows), time.perf_counter() - started)

    def _executor_free(self) -> bool:
        """Whether a batch sent now would run at once (and the batcher may send it)."""
        return not self._wait_when_idle and self._busy < self._slot_count

    def _ran(self) -> None:
        """A batch ended: its executor is free, so the gathering loop looks again."""
        self._busy -= 1
        assert self._slots is not None  # made by _start, before any batch ran
        self._slots.release()
        if self._arrived is not None:
            self._arrived.set()

    def _take(self) -> list[_Item]:
        """The first waiting requests that fit in the largest gear (first come first served;
        requests whose client went away are dropped), or with measured gear costs the
        prefix of them that runs the most rows per second (:meth:`BatchPlan.best_count`):
        the rest wait for the next batch, first in line."""
        items, rows = [], 0
        with self._lock:  # a worker thread may take them too
            while self._pending and rows + self._pending[0].rows <= self.plan.max_rows:
                item = self._pending.popleft()
                self._pending_rows -= item.rows
                if item.future.done():  # read across threads: at worst a gone client runs
                    continue
                items.append(item)
                rows += item.rows
            keep = self.plan.best_count([it.rows for it in items], self.learned)
            for item in reversed(items[keep:]):
                self._pending.appendleft(item)
                self._pending_rows += item.rows
        return items[:keep]

    async def _dispatch(self, items: list[_Item]) -> None:
        try:
            started = time.perf_counter()
            run, outputs = await self._run([it.inputs for it in items])
            self._timed(sum(it.rows for it in items), started)
            self._on_batch(run, sum(it.rows for it in items))
            for item, out in zip(items, outputs, strict=True):
                if not item.future.done():
                    item.future.set_result((run, out))
        except Exception as exc:
            if len(items) == 1 or isinstance(exc, ClosedError):
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(exc)
            else:  # one bad request must not fail the others: each runs alone, once
                await self._run_each(items)
        finally:
            self._ran()

    # ---- a worker runner: the worker takes the next batch itself ---------------------------
    def _may_run_here(self, rows: int) -> bool:
        """Whether a batch of ``rows`` rows would run on the loop's thread (:meth:`_ran_here`):
        then an idle batcher's request goes through the gathering task, not to a worker at
        once, so the requests that arrive with it join its batch."""
        return self._worker is not None and self._worker.can_run_here(self.plan.gear_for(rows))

    def _ran_here(self, items: list[_Item]) -> bool:
        """Run ``items`` on the loop's thread with the runner's executor lent
        (``WorkerRunner.run_here``), where it allows that now; True when they ran (answered,
        the slot freed), False when nothing ran.

        Why on the loop: a short batch pays for the hop to a worker thread and back (two
        wake-ups, two GIL hand-overs) with a large part of its throughput (docs/benchmarks.md);
        KServe's ModelServer runs every predict on its loop. Batches still form where
        requests pile up: those that arrive while this one runs reach the batcher together
        after it, and the gathering task, woken by the first, runs after the others have
        queued. Where the loop keeps up, each request runs as it comes, at once."""
        assert self._worker is not None
        gear = self.plan.gear_for(sum(it.rows for it in items))  # judged by ITS gear's runs
        try:
            if self._worker.run_here(partial(self._run_items, items, deliver=_call), gear) \
                    is NOT_HERE:
                return False
        except BaseException as exc:  # never leave a taken request unanswered
            self._fail(items, exc)
            self._ran()
            raise
        self._ran()
        return True

    async def _alone_on_worker(self, inputs: list[np.ndarray]) -> tuple[Any, list[np.ndarray]]:
        """A lone request handed to a worker (:meth:`_hand_over`), answered when ITS batch
        is done, not when the worker's chain ends. No task of its own: a lone request costs
        what an unbatched one does (one wake-up of the loop)."""
        loop = asyncio.get_running_loop()
        item = _Item(inputs, inputs[0].shape[0], 0.0, loop.create_future())
        self._hand_over([item], loop)
        return await item.future  # (run, this request's outputs): _settle's answer

    def _hand_over(self, items: list[_Item], loop: asyncio.AbstractEventLoop) -> None:
        """Run ``items`` on a free worker, which goes on with whatever waits when they are
        done (:meth:`_chain`); the slot they hold is freed when the chain ends
        (:meth:`_chain_ended`). Every request taken is answered, a refused hand-over (the
        pool past its drain deadline) with its error."""
        assert self._worker is not None
        try:
            future = self._worker.submit(partial(self._chain, items, loop))
        except Exception as exc:
            self._fail(items, exc)
            self._ran()
            return
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._chain_ended, items, f))

    def _chain_ended(self, items: list[_Item], future: concurrent.futures.Future) -> None:
        """On the loop, when a chain is over: its first batch's answers if nothing followed
        it (they ride on this wake-up), its failure if the worker never ran it; the slot
        freed."""
        try:
            exc = None if future.cancelled() else future.exception()
            if future.cancelled() or exc is not None:
                self._fail(items, exc or ClosedError("the run was cancelled"))
                return
            for fn, *args in future.result():
                fn(*args)
        finally:
            self._ran()

    def _chain(self, items: list[_Item], loop: asyncio.AbstractEventLoop,
               worker: Any) -> list[tuple[Any, ...]]:
        """On the worker's thread: run ``items``, then take the next batch of waiting
        requests (unless the delay must be waited out) and run it, until none waits. Each
        batch's answers go to the loop as soon as it is done; the first batch's are returned
        instead when nothing followed it (no second wake-up of the loop for a lone batch)."""
        held: list[tuple[Any, ...]] = []
        deliver = held.append
        while items:
            try:
                self._run_items(items, worker, deliver)
            except BaseException as exc:  # never leave a taken request unanswered
                deliver((self._fail, items, exc))
                raise
            following = [] if self._wait_when_idle else self._take()
            if following and held:  # answer the first batch now, not after the chain
                for call in held:
                    loop.call_soon_threadsafe(*call)
                held = []
            if following:
                def deliver(call: tuple[Any, ...]) -> None:
                    loop.call_soon_threadsafe(*call)
            items = following
        return held

    def _run_items(self, items: list[_Item], worker: Any,
                   deliver: Callable[[tuple[Any, ...]], None]) -> None:
        """One batch on this worker; each request's answer handed to ``deliver`` as a call
        for the loop. A failed batch of several runs each request alone (only the ones at
        fault fail, with their own error), as :meth:`_run_each`; a ClosedError fails all."""
        assert self._worker is not None
        try:
            started = time.perf_counter()
            run, outputs = self._worker.run_on(worker, [it.inputs for it in items])
            self._timed(sum(it.rows for it in items), started)
        except Exception as exc:
            if len(items) == 1 or isinstance(exc, ClosedError):
                deliver((self._fail, items, exc))
                return
            for item in items:
                self._run_items([item], worker, deliver)
            return
        deliver((self._settle, items, run, outputs))

    def _settle(self, items: list[_Item], run: Any, outputs: list[list[np.ndarray]]) -> None:
        """On the loop: a batch's results to its requests (those still waiting)."""
        self._on_batch(run, sum(it.rows for it in items))
        for item, out in zip(items, outputs, strict=True):
            if not item.future.done():
                item.future.set_result((run, out))

    @staticmethod
    def _fail(items: list[_Item], exc: BaseException) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(exc)

    async def _run_each(self, items: list[_Item]) -> None:
        """A failed batch's requests, each run alone: only the ones at fault fail (with
        their own error), the others are answered as if the batch had run."""
        for item in items:
            if item.future.done():  # the client went away meanwhile
                continue
            try:
                run, outputs = await self._run([item.inputs])
                self._on_batch(run, item.rows)
            except Exception as exc:
                if not item.future.done():
                    item.future.set_exception(exc)
                continue
            if not item.future.done():
                item.future.set_result((run, outputs[0]))

    def fail_waiting(self, exc: Exception) -> None:
        """Every request waiting (not in a running batch) fails with ``exc`` now."""
        with self._lock:
            waiting, self._pending, self._pending_rows = list(self._pending), deque(), 0
        self._fail(waiting, exc)

    async def close(self) -> None:
        """Stop gathering; batches already running finish (those handed to a worker on the
        pool's threads, whose close waits for them); requests still waiting (none after a
        graceful drain) are cancelled."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        with self._lock:
            waiting, self._pending, self._pending_rows = list(self._pending), deque(), 0
        for item in waiting:
            item.future.cancel()
