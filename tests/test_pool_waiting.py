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


def test_readiness_says_not_ready_while_every_queue_is_full(tmp_path) -> None:
    """503 [queue_full] is what every request gets while a model's queue is full, so its
    readiness says so too (HTTP, gRPC and the ASGI app share the one rule), and the server's
    when no model can take a request; ready again once the queue drains."""
    from serving_support import compile_models

    from gear_runtime.serving import build_server
    from gear_runtime.serving.grpc_app import Servicer
    from gear_runtime.serving.runner import ServeOptions

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
        assert (await server.ready(None)).status == 503
        assert (await server.model_ready(None, model.name, "")).status == 503
        assert not (await service.ServerReady(None, None)).ready
        release.set()
        await asyncio.gather(*blockers)
        assert not model.saturated and (await server.ready(None)).status == 200
        await server.close()

    asyncio.run(main())
