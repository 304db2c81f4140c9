"""Round 3's F2: a request cancelled while it waits for an executor (the client hung up, a
gRPC cancel or timeout) leaves the queue; before, each one stayed counted for good and ~600
hang-ups made every later request 503 queue_full."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from gear_runtime.serving.batcher import NOT_HERE
from gear_runtime.serving.pool import ExecutorPool


class _Model:
    def create_executor(self) -> object:
        return object()


def test_cancelled_waiters_leave_the_queue() -> None:
    pool = ExecutorPool(_Model(), 1, "m")
    release = threading.Event()

    async def main() -> None:
        busy = asyncio.ensure_future(pool.call(lambda ex: release.wait(30)))
        await asyncio.sleep(0.05)  # the one executor is taken
        try:
            waiters = [asyncio.ensure_future(pool.call(lambda ex: 1)) for _ in range(200)]
            await asyncio.sleep(0.05)
            assert pool.waiting == 200
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            assert pool.waiting == 0  # before the fix: 200, for good
        finally:
            release.set()
        assert await busy is True
        assert await pool.call(lambda ex: 7) == 7 and pool.waiting == 0

    asyncio.run(main())
    pool.close()


def test_a_task_that_ran_is_counted_out_once() -> None:
    pool = ExecutorPool(_Model(), 2, "m")

    async def main() -> None:
        results = await asyncio.gather(*(pool.call(lambda ex, i=i: i) for i in range(100)))
        assert results == list(range(100)) and pool.waiting == 0
        with pytest.raises(ZeroDivisionError):
            await pool.call(lambda ex: 1 / 0)
        assert pool.waiting == 0

    asyncio.run(main())
    pool.close()


def test_readiness_stays_ready_while_a_queue_is_full(tmp_path) -> None:
    """Issue 48: a full queue refuses the requests past it (503 [queue_full], each alone);
    readiness (HTTP, gRPC and the ASGI app share the one rule) never reads the queue, or
    one client's backlog would make a probe take the server out for every client."""
    from serving_support import compile_models

    from gear_runtime.serving import build_server
    from gear_runtime.serving.grpc_app import Servicer
    from gear_runtime.serving.options import ServeOptions

    path = compile_models(tmp_path)["conv"]
    server = build_server([str(path)], options=ServeOptions(max_queue=3))
    model = next(iter(server.models.values()))
    service = Servicer(server)

    async def main() -> None:
        assert server.is_ready() and (await server.ready(None)).status == 200
        release = threading.Event()
        blockers = [asyncio.ensure_future(model.pool.call(lambda ex: release.wait(30)))
                    for _ in range(model.pool.size + 3)]
        await asyncio.sleep(0.1)
        assert model.saturated
        assert (await server.ready(None)).status == 200
        assert (await server.model_ready(None, model.name, "")).status == 200
        assert (await service.ServerReady(None, None)).ready
        release.set()
        await asyncio.gather(*blockers)
        assert not model.saturated and (await server.ready(None)).status == 200
        await server.close()

    asyncio.run(main())


class _Counted:
    """A model whose executors are numbered as they are made."""

    def __init__(self) -> None:
        self.made = 0

    def create_executor(self) -> int:
        self.made += 1
        return self.made


def test_a_short_run_of_an_idle_one_executor_pool_runs_on_the_callers_thread() -> None:
    """run_here: not before a run of the gear was timed; then, while the gear's recent runs
    are short, on the calling thread with the pool's one executor (no second one made);
    never while a task runs or waits, past the drain deadline, on a pool of two, nor for
    ~110 runs of the gear after a slow run of it on the caller's thread (the peak decays).
    A slow run on the worker does not count once a run was lent: its time holds the waits
    for the GIL of a busy loop. (Per gear: tests/test_lend_per_gear.py.)"""
    model = _Counted()
    pool = ExecutorPool(model, 1, "m")
    pool.lending.RUN_HERE_BELOW_S = 0.02  # far above a no-op's time, even on a loaded machine
    here = threading.current_thread()
    where = lambda ex: (threading.current_thread() is here, ex)  # noqa: E731
    assert pool.run_here(where, 0) is NOT_HERE  # nothing timed yet

    async def main() -> None:
        assert await pool.call(where, 0) == (False, 1)  # on the worker
        assert pool.run_here(where, 0) == (True, 1)  # here, the same executor
        release = threading.Event()
        busy = asyncio.ensure_future(pool.call(lambda ex: release.wait(30), 0))
        await asyncio.sleep(0.05)
        assert pool.run_here(where, 0) is NOT_HERE  # a task runs
        waiting = asyncio.ensure_future(pool.call(lambda ex: 1, 0))
        await asyncio.sleep(0.05)
        assert pool.run_here(where, 0) is NOT_HERE  # a task runs and one waits
        release.set()
        await asyncio.gather(busy, waiting)
        assert pool.run_here(where, 0) == (True, 1)  # the 0.05+ s worker run is no judge
        pool.run_here(lambda ex: time.sleep(0.1), 0)  # a slow run here: the peak now
        assert pool.peak_seconds(0) >= 0.1 and pool.run_here(where, 0) is NOT_HERE
        for _ in range(500):  # worker runs decay it: ~55 runs from 0.1 s
            if pool.peak_seconds(0) < pool.lending.RUN_HERE_BELOW_S:
                break
            await pool.call(lambda ex: None, 0)
        assert pool.run_here(where, 0) == (True, 1)
        pool.refusing = True
        assert pool.run_here(where, 0) is NOT_HERE

    asyncio.run(main())
    assert model.made == 1
    pool.close()
    two = ExecutorPool(_Counted(), 2, "m")
    asyncio.run(two.call(lambda ex: None, 0))
    assert two.run_here(where, 0) is NOT_HERE  # a run here would keep the loop off the other
    two.close()


def test_the_executor_is_not_lent_while_a_task_waits_for_it() -> None:
    """A task submitted and waiting for the pool's worker (none running yet) goes first: the
    executor is not lent to the caller's thread meanwhile, so nothing overtakes it."""
    pool = ExecutorPool(_Counted(), 1, "m")
    pool.lending.RUN_HERE_BELOW_S = 60.0
    asyncio.run(pool.call(lambda ex: None, 0))  # gear 0 timed: lent when nothing waits
    assert pool.run_here(lambda ex: "here", 0) == "here"
    hold = threading.Event()
    pool._threads.submit(hold.wait, 30)  # the one worker thread busy: not a task of ours
    try:
        queued = pool.submit(lambda ex: "queued", 0)
        assert pool.waiting == 1
        assert pool.run_here(lambda ex: "overtook", 0) is NOT_HERE
    finally:
        hold.set()
    assert queued.result(30) == "queued" and pool.waiting == 0
    assert pool.run_here(lambda ex: "here", 0) == "here"
    pool.close()


def test_a_worker_waits_for_the_lent_executor_to_come_back() -> None:
    """While the one executor is lent to the caller's thread, a task that reaches the worker
    waits for it to come back: the executor never runs on two threads at once."""
    pool = ExecutorPool(_Counted(), 1, "m")
    pool.lending.RUN_HERE_BELOW_S = 60.0
    asyncio.run(pool.call(lambda ex: None, 0))
    ran = threading.Event()
    seen: list[bool] = []

    def lent(ex: int) -> None:
        pool.submit(lambda ex: ran.set(), 0)
        seen.append(ran.wait(0.5))  # the worker must not run it while this run holds it

    pool.run_here(lent, 0)
    assert seen == [False]
    assert ran.wait(30)  # it runs once the executor is back
    pool.close()


def test_a_pool_never_lent_is_judged_by_its_quickest_recent_worker_run() -> None:
    """Before any lent run of a gear, the quickest of its last worker runs decides: runs
    that are all slow keep the executor on its worker; one quick run among slow ones (the
    others slowed by a busy loop) lends it."""
    pool = ExecutorPool(_Counted(), 1, "m")
    pool.lending.RUN_HERE_BELOW_S = 0.02  # far above a no-op's time, even on a loaded machine

    async def main() -> None:
        for _ in range(3):
            await pool.call(lambda ex: time.sleep(0.05), 0)
        assert pool.peak_seconds(0) >= 0.05 and pool.run_here(lambda ex: 1, 0) is NOT_HERE
        await pool.call(lambda ex: None, 0)
        assert pool.peak_seconds(0) < pool.lending.RUN_HERE_BELOW_S
        assert pool.run_here(lambda ex: 1, 0) == 1

    asyncio.run(main())
    pool.close()


def test_an_executor_bound_to_its_thread_is_never_lent() -> None:
    """A session that runs only on the thread that made it (ORT with CUDA graphs:
    thread_bound) stays on its worker: run_here declines."""
    class Bound:
        session = type("S", (), {"thread_bound": True})()

    class Model:
        def create_executor(self) -> Bound:
            return Bound()

    pool = ExecutorPool(Model(), 1, "m")
    pool.lending.RUN_HERE_BELOW_S = 60.0
    asyncio.run(pool.call(lambda ex: None, 0))
    assert pool.peak_seconds(0) < pool.lending.RUN_HERE_BELOW_S
    assert pool.run_here(lambda ex: 1, 0) is NOT_HERE
    pool.close()


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_a_served_short_model_runs_on_the_loop_once_its_runs_are_timed(tmp_path, batching):
    """A short model's requests go through the pool's run_here, unbatched or in the
    batcher's batches: after the first run is timed on the worker, requests run on the
    event loop's thread with the pool's one executor, and the answers are right."""
    from serving_support import compile_models, conv_input

    from gear_runtime.serving import build_server
    from gear_runtime.serving.options import ServeOptions
    from gear_runtime.serving.protocol import InferRequest

    path = compile_models(tmp_path)["conv"]
    server = build_server([str(path)], options=ServeOptions(executors=1, batching=batching))
    assert (model := next(iter(server.models.values()))).batcher is not None or not batching
    model.pool.lending.RUN_HERE_BELOW_S = 60.0  # the wiring is tested here, not the threshold
    threads: list[bool] = []
    loop_thread = threading.current_thread()
    execute = type(model.pool._executors[0]).execute

    def spy(ex, *args, **kw):
        threads.append(threading.current_thread() is loop_thread)
        return execute(ex, *args, **kw)

    async def main() -> None:
        x = conv_input(1, 0)
        want = None
        for _ in range(5):
            request = InferRequest({model._names[0]: x}, {model._names[0]: "FP32"})
            _, outputs = await model.infer(request)
            want = outputs[0] if want is None else want
            np.testing.assert_array_equal(outputs[0], want)
        await server.close()

    import unittest.mock
    with unittest.mock.patch.object(type(model.pool._executors[0]), "execute", spy):
        asyncio.run(main())
    assert threads == [False, True, True, True, True]


def test_a_chain_of_batches_is_timed_batch_by_batch() -> None:
    """A worker's chain of batches is one pool task as long as the load lasts: the pool
    times each batch (PoolBatches.run_on), never the chain, whose time is no run's."""
    from gear_runtime.serving.pool import PoolBatches

    pool = ExecutorPool(_Model(), 1, "m")
    batches = PoolBatches(pool, lambda requests, ex: (time.sleep(0.02), requests),
                          gear_for=lambda rows: rows // 2)  # 2 rows: gear 1
    two_rows = [[np.zeros((2, 3), np.float32)]]
    chain = batches.submit(lambda ex: [batches.run_on(ex, two_rows) for _ in range(5)])
    chain.result(30)
    assert list(pool.lending._away) == [1]  # each batch timed as a run of its gear
    times = pool.lending._away[1]
    assert len(times) == 5 and 0.02 <= min(times) <= max(times) < 1.0  # a run's, not 5
    pool.close()
