"""Issue 48's F1: the run lent to the event loop was judged by the pool's earlier runs, not by
the request's gear: after 200 fast requests a large-gear request (0.13-0.3 s) ran on the loop,
and every other client of the server (other models, health probes) stalled for the whole
run. A run is lent only where ITS gear was timed short; a gear never timed is not lent.

The slow gear is faked (its run sleeps), and each test asserts where a run happened, not how
long anything took: the threshold is raised far above the fast runs' times and far below
the slow one's, so scheduling noise on a loaded machine decides nothing."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest.mock

import numpy as np
import pytest
from serving_support import compile_models, conv_input

from gear_runtime.serving.batcher import NOT_HERE
from gear_runtime.serving.pool import ExecutorPool

#: the lending threshold in these tests (seconds): the fast runs take < 1 ms, the slow 0.3 s
BELOW_S = 0.1
SLOW_S = 0.3


class _Model:
    def create_executor(self) -> object:
        return object()


def test_a_gear_is_lent_only_once_it_was_timed_short() -> None:
    """Gear 0 timed short lends; gear 1 is not lent before it was timed, nor after it was
    timed long; gear 0 still lends meanwhile; an unknown gear (None) is never lent."""
    pool = ExecutorPool(_Model(), 1, "m")
    pool.lending.RUN_HERE_BELOW_S = BELOW_S
    here = threading.current_thread()
    on_loop = lambda ex: threading.current_thread() is here  # noqa: E731

    async def main() -> None:
        assert await pool.call(on_loop, 0) is False  # timed on the worker
        assert pool.run_here(on_loop, 0) is True
        assert pool.run_here(on_loop, 1) is NOT_HERE  # never timed
        assert await pool.call(lambda ex: time.sleep(SLOW_S), 1) is None
        assert pool.peak_seconds(1) >= SLOW_S and pool.peak_seconds(0) < BELOW_S
        assert pool.run_here(on_loop, 1) is NOT_HERE  # timed long
        assert pool.run_here(on_loop, 0) is True
        assert pool.run_here(on_loop, None) is NOT_HERE

    asyncio.run(main())
    pool.close()


def test_a_slow_lent_run_keeps_only_its_own_gear_off_the_loop() -> None:
    """A lent run that took long (an outlier) judges its own gear, not the others."""
    pool = ExecutorPool(_Model(), 1, "m")
    pool.lending.RUN_HERE_BELOW_S = BELOW_S

    async def main() -> None:
        for gear in (0, 1):
            await pool.call(lambda ex: None, gear)
        pool.run_here(lambda ex: time.sleep(SLOW_S), 1)
        assert pool.run_here(lambda ex: 1, 1) is NOT_HERE
        assert pool.run_here(lambda ex: 1, 0) == 1

    asyncio.run(main())
    pool.close()


def _served(tmp_path, batching: bool):
    """The conv model (batch gears 1, 2, 4, 8) served with one executor whose 8-row runs
    sleep SLOW_S; ``ran`` gets (rows, on the loop's thread) per run."""
    from gear_runtime.serving import build_server
    from gear_runtime.serving.options import ServeOptions

    path = compile_models(tmp_path)["conv"]
    server = build_server([str(path)], options=ServeOptions(executors=1, batching=batching))
    model = next(iter(server.models.values()))
    model.pool.lending.RUN_HERE_BELOW_S = BELOW_S
    ran: list[tuple[int, bool]] = []
    loop_thread = threading.current_thread()
    execute = type(model.pool._executors[0]).execute

    def spy(ex, inputs, *args, **kw):
        rows = inputs[0].shape[0]
        ran.append((rows, threading.current_thread() is loop_thread))
        if rows == 8:
            time.sleep(SLOW_S)
        return execute(ex, inputs, *args, **kw)

    patch = unittest.mock.patch.object(type(model.pool._executors[0]), "execute", spy)
    return server, model, ran, patch


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_a_large_gear_after_many_fast_runs_does_not_run_on_the_loop(tmp_path, batching):
    """The hostile load: many fast one-row requests (lent to the loop once timed), then an
    8-row one, repeated: the 8-row runs never run on the loop's thread, the one-row ones
    still do, and every answer is right."""
    from gear_runtime.serving.protocol import InferRequest

    server, model, ran, patch = _served(tmp_path, batching)
    name = model._names[0]

    async def ask(rows: int) -> np.ndarray:
        x = conv_input(rows, rows)
        _, outputs = await model.infer(InferRequest({name: x}, {name: "FP32"}))
        return outputs[0]

    async def main() -> None:
        one, eight = await ask(1), await ask(8)
        for _ in range(3):
            for _ in range(20):
                np.testing.assert_array_equal(await ask(1), one)
            np.testing.assert_array_equal(await ask(8), eight)
        await server.close()

    with patch:
        asyncio.run(main())
    assert [here for rows, here in ran if rows == 8] == [False] * 4
    small = [here for rows, here in ran if rows == 1]
    assert small[0] is False and all(small[1:]), small  # timed on the worker once, then lent


def test_the_predicted_gear_is_the_one_the_executor_runs(tmp_path) -> None:
    """The gear a request is judged by (ServedModel._gear_of) is the one its run uses: by
    its shapes, by its dynamic_dims, padded (the covering gear); None where no gear fits."""
    from gear_runtime.serving import build_server
    from gear_runtime.serving.options import ServeOptions

    path = compile_models(tmp_path)["conv"]
    for pad in (False, True):
        server = build_server([str(path)], options=ServeOptions(executors=1, batching=False,
                                                                pad=pad))
        model = next(iter(server.models.values()))
        ex = model.pool._executors[0]
        for rows in (1, 2, 3, 8) if pad else (1, 2, 4, 8):
            arrays = [conv_input(rows, 0)]
            model._run_one(arrays, None, ex)
            assert model._gear_of(arrays, None) == ex.last_gear
        gear = 2 if pad else None  # 3 rows: padded to 4, else no gear
        assert model._gear_of([conv_input(3, 0)], None) == gear
        assert model._gear_of([conv_input(9, 0)], None) is None
        model._run_one([conv_input(4, 0)], [4, 3, 8, 8], ex)
        assert model._gear_of([conv_input(4, 0)], [4, 3, 8, 8]) == ex.last_gear == 2
        assert model._gear_of([conv_input(4, 0)], [4]) == 2  # the dynamic value alone
        asyncio.run(server.close())
