"""Round 3's F2: a request cancelled while it waits for an executor (the client hung up, a
gRPC cancel or timeout) leaves the queue; before, each one stayed counted for good and ~600
hang-ups made every later request 503 queue_full."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gear_runtime.serving.runner import ExecutorPool


class _Model:
    def create_executor(self) -> object:
        return object()


def test_cancelled_waiters_leave_the_queue() -> None:
    pool = ExecutorPool(_Model(), 1, "m")
    release = threading.Event()

    async def main() -> None:
        busy = asyncio.ensure_future(pool.call(lambda ex: release.wait(30)))
        await asyncio.sleep(0.05)  # the one executor is taken
        waiters = [asyncio.ensure_future(pool.call(lambda ex: 1)) for _ in range(200)]
        await asyncio.sleep(0.05)
        assert pool.waiting == 200
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert pool.waiting == 0  # before the fix: 200, for good
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
