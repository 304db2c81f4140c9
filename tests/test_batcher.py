"""The dynamic batcher's boundaries (gear_runtime/serving/batcher.py), on a recording runner.

* the largest gear: requests that fill it EXACTLY are one batch (``_take``: rows + next <=
  max_rows), and a batch that reaches it goes at once, without waiting out the delay
  (``_gather_one``: pending rows < max_rows);
* the queue delay: requests that arrive within it of the first waiting one are gathered, and a
  batch below the largest gear waits it out (not less).

A broken boundary must FAIL here, quickly, never hang: every test runs under
``asyncio.wait_for`` and a watchdog (SIGALRM) that also frees an event loop blocked by a
gathering task spinning without ever awaiting (what a ``<`` in ``_take`` does with a request
as large as the largest gear: nothing is taken, and the task retries at once, forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.runtime.dispatch import GearDispatcher
from gear_runtime.serving.batcher import NOT_HERE, Batcher, BatchPlan, LearnedCosts, _Item

GEARS = (1, 2, 4, 8)
#: A delay no test may wait out: a batch that waits for it fails the test's timeout instead.
FOREVER_S = 60.0


class Hung(Exception):
    """What the watchdog fails a blocked batcher's requests with."""


@contextlib.contextmanager
def watchdog(seconds: float, batcher: Batcher) -> Iterator[None]:
    """After ``seconds``, fail every request still waiting in ``batcher`` with :class:`Hung`
    (SIGALRM: its handler runs in the main thread, even in the middle of a gathering task that
    spins without ever awaiting): with nothing left to take the task awaits again, and the
    loop, free again, ends the test. Nothing is raised from the handler itself (an exception
    raised into arbitrary code can leave the interpreter inconsistent); only if the loop is
    still blocked 2 s later is :class:`Hung` raised there, as a last resort."""
    def fire(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(True)
            batcher.fail_waiting(Hung(f"not answered after {seconds} s: the batcher is stuck"))
            signal.setitimer(signal.ITIMER_REAL, 2.0)
            return
        raise Hung(f"the event loop is still blocked {seconds + 2} s on")

    fired: list[bool] = []
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(main: Callable[[], Awaitable[Any]], batcher: Batcher, timeout: float = 2.0) -> Any:
    """``main()`` on a fresh event loop: TimeoutError past ``timeout``, Hung shortly after
    when the loop itself is blocked by ``batcher``."""
    with watchdog(timeout + 1.0, batcher):
        return asyncio.run(asyncio.wait_for(main(), timeout))


def plan() -> BatchPlan:
    spec = gr.GearSpec.from_atc("x:-1,3", dynamic_batch_size=",".join(map(str, GEARS)))
    made, why = BatchPlan.for_model(GearDispatcher(spec), [((b, 3),) for b in GEARS])
    assert why == "" and made.max_rows == 8
    return made


def recorder() -> tuple[Callable[..., Awaitable[Any]], list[list[int]]]:
    """A batch runner that records each batch (the rows of each of its requests) and answers
    every request with its own rows times 2."""
    batches: list[list[int]] = []

    async def runner(requests: list[list[np.ndarray]]) -> tuple[int, list[list[np.ndarray]]]:
        batches.append([r[0].shape[0] for r in requests])
        await asyncio.sleep(0)
        return len(batches) - 1, [[r[0] * 2] for r in requests]

    return runner, batches


def rows(n: int, value: float = 0.0) -> list[np.ndarray]:
    return [np.full((n, 3), value, np.float32)]


# ---- the largest gear -------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(8,), (4, 4), (2, 2, 4), (1, 7)])
def test_requests_filling_the_largest_gear_go_at_once_as_one_batch(sizes) -> None:
    """Rows summing to exactly the largest gear (8) are ONE batch, run at once although the
    delay is a minute and the batcher waits even when idle."""
    runner, batches = recorder()
    batcher = Batcher(plan(), runner, max_delay_s=FOREVER_S, slots=1, wait_when_idle=True)

    async def main() -> list[Any]:
        arrays = [rows(n, i) for i, n in enumerate(sizes)]
        got = await asyncio.gather(*(batcher.submit(a) for a in arrays))
        await batcher.close()
        return [(g, a) for g, a in zip(got, arrays, strict=True)]

    for (ran, (out,)), (x,) in run(main, batcher):
        assert ran == 0
        np.testing.assert_array_equal(out, x * 2)
    assert batches == [list(sizes)]


def test_a_request_that_does_not_fit_the_rest_of_the_gear_waits_for_the_next_batch() -> None:
    """5 rows then 4: 9 > 8, so the first batch is the 5 rows alone; the 4 rows run next (on
    their own delay: short here)."""
    runner, batches = recorder()
    batcher = Batcher(plan(), runner, max_delay_s=0.05, slots=1, wait_when_idle=True)

    async def main() -> None:
        await asyncio.gather(batcher.submit(rows(5)), batcher.submit(rows(4)))
        await batcher.close()

    run(main, batcher)
    assert batches == [[5], [4]]


def waiting(batcher: Batcher, sizes: tuple[int, ...], loop: asyncio.AbstractEventLoop) -> None:
    """Requests of ``sizes`` rows put in ``batcher``'s queue directly (no loop running)."""
    for n in sizes:
        batcher._pending.append(_Item(rows(n), n, 0.0, loop.create_future()))
        batcher._pending_rows += n


def test_take_takes_up_to_the_largest_gear_inclusive() -> None:
    """``_take`` itself (no event loop running, so a wrong bound fails at once rather than
    spinning): the first waiting requests whose rows fit in max_rows, equal included."""
    loop = asyncio.new_event_loop()
    try:
        for sizes, taken in [((8,), [8]), ((8, 1), [8]), ((4, 4, 1), [4, 4]),
                             ((5, 4), [5]), ((1, 2, 4, 1), [1, 2, 4, 1]), ((3, 6), [3])]:
            batcher = Batcher(plan(), recorder()[0], max_delay_s=0.0, slots=1)
            waiting(batcher, sizes, loop)
            assert [it.rows for it in batcher._take()] == taken, sizes
            left = list(sizes[len(taken):])
            assert [it.rows for it in batcher._pending] == left
            assert batcher._pending_rows == sum(left)
    finally:
        loop.close()


@pytest.mark.parametrize("costs, sizes, batches", [
    (None, (4, 2, 1), [[4, 2, 1]]),  # input elements: all that fit, as before
    ((1.0, 2.0, 4.0, 8.0), (4, 2, 1), [[4], [2], [1]]),  # linear (a CPU): no padding rows
    ((1.0, 2.0, 4.0, 8.0), (1, 7), [[1, 7]]),  # fills the gear: all at once
    ((1.0, 1.1, 1.2, 1.3), (4, 2, 1), [[4, 2, 1]]),  # flat (a device): one run of 8
    ((1.0, 2.0, 4.0, 8.0), (3,), [[3]]),  # a lone request goes whatever it costs
])
def test_measured_costs_choose_how_many_waiting_requests_one_batch_takes(
        costs, sizes, batches) -> None:
    """With a profile, ``_take`` keeps the prefix of the waiting requests that runs the most
    rows per second (BatchPlan.best_count); the rest go next, first in line, each request
    answered with its own rows."""
    spec = gr.GearSpec.from_atc("x:-1,3", dynamic_batch_size=",".join(map(str, GEARS)))
    made, _ = BatchPlan.for_model(GearDispatcher(spec, costs), [((b, 3),) for b in GEARS])
    assert made.measured is (costs is not None)
    runner, seen = recorder()
    batcher = Batcher(made, runner, max_delay_s=0.05, slots=1, wait_when_idle=True)

    async def main() -> list[Any]:
        arrays = [rows(n, i) for i, n in enumerate(sizes)]
        got = await asyncio.gather(*(batcher.submit(a) for a in arrays))
        await batcher.close()
        return list(zip(got, arrays, strict=True))

    for (_, (out,)), (x,) in run(main, batcher):
        np.testing.assert_array_equal(out, x * 2)
    assert seen == batches


def test_learned_costs_count_a_gear_from_its_second_batch_and_scale_the_unmeasured():
    """The first batch of a gear is not counted (allocations); later ones move an average.
    A gear not measured yet is estimated from the nearest measured one as if cost were
    proportional to rows; every REFRESH-th batch the estimates stand aside."""
    costs = LearnedCosts(GEARS)
    assert not costs.ready() and costs.estimate(0) is None
    costs.record(0, 9.0)  # gear 1's first batch
    assert not costs.ready()
    costs.record(0, 1.0)
    assert costs.ready() and costs.estimate(0) == 1.0
    assert costs.estimate(3) == 8.0  # gear 8 from gear 1, by rows
    costs.record(3, 99.0)
    costs.record(3, 16.0)
    assert costs.estimate(2) == 4.0  # gear 4: gear 1 is nearer (3 rows) than gear 8 (4)
    assert costs.estimate(1) == 2.0
    costs.record(3, 26.0)
    assert costs.estimate(3) == pytest.approx(16.0 + LearnedCosts.ALPHA * 10.0)
    costs.REFRESH = 3  # batches so far: 5; the 6th of every 3 takes all that fits
    assert not costs.ready()
    costs.record(0, 1.0)
    assert costs.ready()


def take_all(batcher: Batcher, sizes: tuple[int, ...]) -> list[list[int]]:
    """``_take`` until nothing waits (no loop running): the batches it forms."""
    loop = asyncio.new_event_loop()
    try:
        waiting(batcher, sizes, loop)
        taken = []
        while batcher._pending:
            taken.append([it.rows for it in batcher._take()])
        return taken
    finally:
        loop.close()


@pytest.mark.parametrize("seconds, batches", [
    # a CPU: gear 8 costs more per row than gear 1; gears 2 and 4 unmeasured tie with gear
    # 1 (by rows), so the longest of them is tried: 4 of the 8 waiting requests
    ({0: 1.0, 3: 12.0}, [[1, 1, 1, 1], [1, 1, 1, 1]]),
    # gear 4 then measured at 1.5 per row: the unmeasured gear 2 ties with gear 1
    ({0: 1.0, 2: 6.0, 3: 12.0}, [[1, 1], [1, 1], [1, 1], [1, 1]]),
    ({0: 1.0, 1: 2.5, 2: 6.0, 3: 12.0}, [[1]] * 8),  # every gear measured: one at a time
    ({0: 1.0, 3: 1.3}, [[1] * 8]),  # a device: gear 8 costs what gear 1 does, all at once
    ({}, [[1] * 8]),  # nothing measured yet: all that fits, as with no profile
    # CPU-like, but under 5 ms a batch: too short to tell the gear from the GIL, all fit
    ({0: 1e-4, 3: 4e-3}, [[1] * 8]),
])
def test_without_a_profile_the_batch_follows_what_the_gears_took_here(seconds, batches):
    """No profile: ``_take`` weighs the gears by what batches of them took on this server
    (LearnedCosts), so a backend whose cost grows faster than its rows stops padding
    requests into slower batches, and one that gains from batching keeps all that fits."""
    batcher = Batcher(plan(), recorder()[0], max_delay_s=0.0, slots=1)
    for gear, value in seconds.items():
        batcher.learned.record(gear, value)  # the first: not counted
        batcher.learned.record(gear, value)
    assert take_all(batcher, (1,) * 8) == batches


def test_the_batcher_times_every_batch_it_runs_unless_a_profile_decides():
    """Each batch run is recorded under its gear (the rows it ran: 3 rows are gear 4); with
    a profile attached there is nothing to learn."""
    runner, _ = recorder()
    batcher = Batcher(plan(), runner, max_delay_s=0.05, slots=1, wait_when_idle=True)

    async def main() -> None:
        for n in (1, 1, 3, 3, 8):
            await batcher.submit(rows(n))
        await batcher.close()

    run(main, batcher)
    assert batcher.learned._seen == [2, 0, 2, 1]
    assert batcher.learned.seconds[0] is not None and batcher.learned.seconds[3] is None
    spec = gr.GearSpec.from_atc("x:-1,3", dynamic_batch_size=",".join(map(str, GEARS)))
    measured, _ = BatchPlan.for_model(GearDispatcher(spec, (1.0, 2.0, 4.0, 8.0)),
                                      [((b, 3),) for b in GEARS])
    assert Batcher(measured, runner, max_delay_s=0.0, slots=1).learned is None


# ---- the queue delay --------------------------------------------------------------------------
def test_requests_within_the_delay_are_gathered_and_the_batch_waits_it_out() -> None:
    """Delay 0.5 s, waiting even when idle: a request, another 0.05 s later -> ONE batch that
    runs once the first has waited the delay (not before); a lone request afterwards waits its
    own delay too and runs alone."""
    delay = 0.5
    runner, batches = recorder()
    batcher = Batcher(plan(), runner, max_delay_s=delay, slots=1, wait_when_idle=True)

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def later() -> Any:
            await asyncio.sleep(0.05)
            return await batcher.submit(rows(1, 2.0))

        await asyncio.gather(batcher.submit(rows(1, 1.0)), later())
        first = loop.time() - start
        start = loop.time()
        await batcher.submit(rows(1, 3.0))
        second = loop.time() - start
        await batcher.close()
        return first, second

    first, second = run(main, batcher, timeout=4.0)
    assert batches == [[1, 1], [1]]
    # the loop's timers may fire up to its clock resolution early; a busy machine is late
    assert delay - 0.01 <= first < delay + 1.5, first
    assert delay - 0.01 <= second < delay + 1.5, second


def test_an_idle_batcher_runs_a_lone_request_at_once_and_gathers_while_busy() -> None:
    """Without wait_when_idle, a request to an idle batcher never pays the (minute-long) delay;
    requests arriving while its batch runs gather, and go as soon as they fill the largest
    gear."""
    batches: list[list[int]] = []
    gate: dict[str, asyncio.Event] = {}

    async def runner(requests: list[list[np.ndarray]]) -> tuple[int, list[list[np.ndarray]]]:
        batches.append([r[0].shape[0] for r in requests])
        if len(batches) == 1:
            await gate["first"].wait()  # the first batch runs until the others are queued
        return len(batches) - 1, [[r[0] * 2] for r in requests]

    batcher = Batcher(plan(), runner, max_delay_s=FOREVER_S, slots=1)

    async def main() -> None:
        gate["first"] = asyncio.Event()
        first = asyncio.ensure_future(batcher.submit(rows(1)))
        while not batches:
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(batcher.submit(rows(n))) for n in (3, 5)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(batcher) == 2 and len(batches) == 1  # gathered while the batch runs
        gate["first"].set()
        await asyncio.gather(first, *rest)
        await batcher.close()

    run(main, batcher)
    assert batches == [[1], [3, 5]]


@pytest.mark.parametrize("wait_when_idle", [False, True])
def test_what_waits_goes_as_soon_as_an_executor_is_free(wait_when_idle: bool) -> None:
    """Requests gathered while the one executor is busy (5 rows: the largest gear not full)
    go as ONE batch the moment its batch ends, although the delay is long: waiting with an
    executor idle only costs (the convnet at 2 clients: 872-884 rows/s waiting, 1,883-1,889
    without batching). With wait_when_idle the batcher waits the delay out, as Triton's."""
    delay = FOREVER_S if not wait_when_idle else 0.3
    batches: list[list[int]] = []
    gate: dict[str, asyncio.Event] = {}

    async def runner(requests: list[list[np.ndarray]]) -> tuple[int, list[list[np.ndarray]]]:
        batches.append([r[0].shape[0] for r in requests])
        if len(batches) == 1:
            await gate["first"].wait()
        return len(batches) - 1, [[r[0] * 2] for r in requests]

    batcher = Batcher(plan(), runner, max_delay_s=delay, slots=1, wait_when_idle=wait_when_idle)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        gate["first"] = asyncio.Event()
        first = asyncio.ensure_future(batcher.submit(rows(1)))
        while not batches:
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(batcher.submit(rows(n))) for n in (2, 3)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(batcher) == 2 and len(batches) == 1
        freed = loop.time()
        gate["first"].set()
        await asyncio.gather(first, *rest)
        took = loop.time() - freed
        await batcher.close()
        return took

    took = run(main, batcher)
    assert batches == [[1], [2, 3]]
    if wait_when_idle:
        assert took >= 0.25  # the delay (from the first waiting request's arrival) waited out
    else:
        assert took < 5.0  # not the minute-long delay (a loaded machine is slower)


# ---- a worker runner: the worker takes the next batch itself ----------------------------------
class Workers:
    """A WorkerRunner on one real thread: counts the hand-overs through the loop (``calls``)
    and the batches run (``batches``: each request's first value). Batch ``i`` (from 0)
    blocks until ``gates[i]`` is set, when there is one, so requests can pile up behind it;
    ``started[i]`` says it began. A request whose value is in ``bad`` fails (its batch, then
    itself alone). ``refuse``: every hand-over fails with ClosedError, as the pool past its
    drain deadline. ``here``: batches may run on the caller's thread (``run_here``), as a
    one-executor pool of short runs lends its executor (True: of every gear; a set: of those
    gears); ``decline``: run_here says it may (``can_run_here``) but then declines (a task
    got in first), NOT_HERE. ``threads``: the thread each batch ran on; ``asked``: the gear
    of each run_here."""

    def __init__(self, gates: int = 0, refuse: bool = False,
                 here: bool | frozenset[int] = False, decline: bool = False) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(1)
        self.gates = [threading.Event() for _ in range(gates)]
        self.started = [threading.Event() for _ in range(gates)]
        self.calls = 0
        self.batches: list[list[float]] = []
        self.bad: set[float] = set()
        self.refuse = refuse
        self.here, self.decline = here, decline
        self.threads: list[threading.Thread] = []
        self.asked: list[int] = []

    def can_run_here(self, gear: int) -> bool:
        return self.here is True or (isinstance(self.here, frozenset) and gear in self.here)

    def run_here(self, fn, gear: int):
        self.asked.append(gear)
        if not self.can_run_here(gear) or self.decline:
            return NOT_HERE
        return fn("the worker's executor")

    def submit(self, fn):
        from concurrent.futures import Future

        self.calls += 1
        if self.refuse:
            refused: Future = Future()
            refused.set_exception(gr.ClosedError("the pool refuses: past its drain deadline"))
            return refused
        return self.pool.submit(fn, "the worker's executor")

    def run_on(self, worker, requests):
        assert worker == "the worker's executor"
        self.threads.append(threading.current_thread())
        values = [float(r[0][0, 0]) for r in requests]
        i = len(self.batches)
        self.batches.append(values)
        if i < len(self.gates):
            self.started[i].set()
            self.gates[i].wait(5)
        if self.bad & set(values):
            raise ValueError(f"bad request among {values}")
        return len(self.batches), [[r[0] * 2] for r in requests]

    async def wait_started(self, i: int) -> None:
        await asyncio.to_thread(self.started[i].wait, 5)


async def pile_up(batcher: Batcher, workers: Workers, later: tuple[float, ...]) -> list[Any]:
    """Request 1.0 runs alone (the batcher idle) and holds; ``later`` arrive meanwhile; then
    its gate opens. The futures, in order."""
    first = asyncio.ensure_future(batcher.submit(rows(1, 1.0)))
    await workers.wait_started(0)
    rest = [asyncio.ensure_future(batcher.submit(rows(1, v))) for v in later]
    await asyncio.sleep(0.05)  # all waiting behind the running batch
    workers.gates[0].set()
    return [first, *rest]


def test_a_worker_takes_the_waiting_batch_itself_when_its_run_ends() -> None:
    """Requests that arrive while a batch runs go as the next batch from the worker's own
    thread: two batches, ONE hand-over through the loop, every answer right."""
    workers = Workers(gates=1)
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)

    async def main() -> list[Any]:
        return await asyncio.gather(*await pile_up(batcher, workers, (2.0, 3.0)))

    answers = run(main, batcher)
    assert workers.batches == [[1.0], [2.0, 3.0]] and workers.calls == 1
    assert batcher.learned._seen == [1, 1, 0, 0]  # each batch timed on the worker
    for (_, (out,)), value in zip(answers, (1.0, 2.0, 3.0), strict=True):
        np.testing.assert_array_equal(out, np.full((1, 3), 2 * value, np.float32))


def test_a_request_is_answered_when_its_batch_is_done_not_when_the_chain_ends() -> None:
    """The lone request is answered while the worker runs the batch it chained after it:
    its client waits for its own rows only."""
    workers = Workers(gates=2)
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)

    async def main() -> bool:
        first, second = await pile_up(batcher, workers, (2.0,))
        await workers.wait_started(1)  # the chained batch holds
        await asyncio.wait_for(asyncio.shield(first), 1.0)
        held = not second.done()
        workers.gates[1].set()
        await second
        return held

    assert run(main, batcher) is True
    assert workers.batches == [[1.0], [2.0]] and workers.calls == 1


def test_a_chained_batch_that_fails_runs_each_request_alone() -> None:
    workers = Workers(gates=1)
    workers.bad.add(3.0)
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)

    async def main() -> list[Any]:
        futures = await pile_up(batcher, workers, (2.0, 3.0))
        return await asyncio.gather(*futures, return_exceptions=True)

    first, good, bad = run(main, batcher)
    assert workers.batches == [[1.0], [2.0, 3.0], [2.0], [3.0]]
    assert batcher.learned._seen == [2, 0, 0, 0]  # failed runs are no measure of a gear
    np.testing.assert_array_equal(good[1][0], np.full((1, 3), 4.0, np.float32))
    assert isinstance(bad, ValueError) and not isinstance(first, Exception)


def test_a_refused_hand_over_fails_its_requests_and_wait_when_idle_chains_nothing() -> None:
    refused = Batcher(plan(), Workers(refuse=True), max_delay_s=FOREVER_S, slots=1)
    with pytest.raises(gr.ClosedError, match="drain deadline"):  # a lone request
        run(lambda: refused.submit(rows(1)), refused)
    gathered = Batcher(plan(), Workers(refuse=True), max_delay_s=0.0, slots=1,
                       wait_when_idle=True)
    with pytest.raises(gr.ClosedError, match="drain deadline"):  # a gathered batch
        run(lambda: gathered.submit(rows(1)), gathered)
    workers = Workers()
    waiting = Batcher(plan(), workers, max_delay_s=0.01, slots=1, wait_when_idle=True)

    async def main() -> list[Any]:
        return [await waiting.submit(rows(1, v)) for v in (1.0, 2.0)]

    run(main, waiting)
    assert workers.calls == 2  # Triton's rule: every batch waits out its delay, via the loop


# ---- short batches on the loop's thread (WorkerRunner.run_here) --------------------------------
def test_requests_arriving_together_run_as_one_batch_on_the_loops_thread() -> None:
    """Where the runner lends its executor (a one-executor pool of short runs), a batch runs
    on the loop's thread, with no hand-over to a worker; an idle batcher's first request
    goes through the gathering task, so the requests arriving with it join its batch (run
    at once, they would each be a batch of one)."""
    workers = Workers(here=True)
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)
    loop_thread = threading.current_thread()

    async def main() -> list[Any]:
        alone = await batcher.submit(rows(1, 1.0))
        together = await asyncio.gather(*(batcher.submit(rows(1, v)) for v in (2.0, 3.0, 4.0)))
        return [alone, *together]

    answers = run(main, batcher)
    assert workers.batches == [[1.0], [2.0, 3.0, 4.0]] and workers.calls == 0
    assert workers.threads == [loop_thread, loop_thread]
    assert batcher.learned._seen == [1, 0, 1, 0]  # each batch timed, as on a worker
    for (_, (out,)), value in zip(answers, (1.0, 2.0, 3.0, 4.0), strict=True):
        np.testing.assert_array_equal(out, np.full((1, 3), 2 * value, np.float32))


def test_a_failed_batch_on_the_loop_runs_each_request_alone_and_frees_its_slot() -> None:
    workers = Workers(here=True)
    workers.bad.add(3.0)
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)

    async def main() -> list[Any]:
        got = await asyncio.gather(*(batcher.submit(rows(1, v)) for v in (2.0, 3.0)),
                                   return_exceptions=True)
        return [*got, await batcher.submit(rows(1, 5.0))]  # the slot is free again

    good, bad, after = run(main, batcher)
    assert workers.batches == [[2.0, 3.0], [2.0], [3.0], [5.0]] and workers.calls == 0
    assert isinstance(bad, ValueError)
    np.testing.assert_array_equal(good[1][0], np.full((1, 3), 4.0, np.float32))
    np.testing.assert_array_equal(after[1][0], np.full((1, 3), 10.0, np.float32))


def test_a_batch_the_runner_declines_to_run_here_goes_to_a_worker() -> None:
    """can_run_here said yes, run_here found a task in first (NOT_HERE): nothing ran on the
    loop, the batch is handed over as usual."""
    workers = Workers(here=True, decline=True)
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)

    async def main() -> list[Any]:
        return await asyncio.gather(*(batcher.submit(rows(1, v)) for v in (2.0, 3.0)))

    run(main, batcher)
    assert workers.batches == [[2.0, 3.0]] and workers.calls == 1
    assert workers.threads != [threading.current_thread()]


def test_a_batch_runs_on_the_loop_only_where_its_own_gear_is_lent() -> None:
    """Issue 48's F1: the runner is asked about the batch's OWN gear (the plan's gear for
    its rows), not about its runs in general: with only gear 0 (1 row) lent, one-row
    requests run on the loop, a three-row request (gear 2, 4 rows) goes to a worker, alone
    and after one-row batches alike."""
    workers = Workers(here=frozenset({0}))
    batcher = Batcher(plan(), workers, max_delay_s=FOREVER_S, slots=1)
    loop_thread = threading.current_thread()

    async def main() -> None:
        for n in (1, 3, 1, 1, 3):
            _, (out,) = await batcher.submit(rows(n, float(n)))
            np.testing.assert_array_equal(out, np.full((n, 3), 2.0 * n, np.float32))

    run(main, batcher)
    assert [b[0] for b in workers.batches] == [1.0, 3.0, 1.0, 1.0, 3.0]
    on_loop = [t is loop_thread for t in workers.threads]
    assert on_loop == [True, False, True, True, False] and workers.calls == 2
    assert workers.asked == [0, 0, 0]  # a gear-2 request is not even offered to the loop
