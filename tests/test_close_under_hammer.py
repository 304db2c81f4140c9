"""Closing an executor that other threads keep calling: once close() has begun, every call
that has not yet taken the executor raises ClosedError whichever thread makes it (never
ExecutorBusyError, never a run), and close() takes the executor as soon as the call in flight
ends, however hard the others keep calling (it is never held off until they stop).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.runtime.model import GearModel

SPEC = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
#: How long the hammering threads would go on if close() never took the executor.
HAMMER_S = 8.0


class SlowSession(null.NullSession):
    """A run of 2 ms that releases the GIL, as a real backend run does: a hammering thread
    holds the executor most of the time, leaving it free only between its calls."""

    def run_gear(self, gear: int) -> list[np.ndarray]:
        time.sleep(0.002)
        return super().run_gear(gear)


class SlowModel(null.NullModel):
    def create_session(self, layout: object) -> SlowSession:
        return SlowSession(self, layout)


def _hammer(ex, calls: list[tuple[float, str]], stop: threading.Event) -> None:
    feeds = {"x": np.ones((1, 4), np.float32)}
    end = time.perf_counter() + HAMMER_S
    while not stop.is_set() and time.perf_counter() < end:
        start = time.perf_counter()
        try:
            ex.execute(feeds)
            outcome = "ran"
        except gr.ExecutorBusyError:
            outcome = "busy"
        except gr.ClosedError:
            outcome = "closed"
        calls.append((start, outcome))


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_close_under_a_hammer_takes_the_executor_and_later_calls_are_closed(
        threads: int) -> None:
    model = GearModel(SlowModel(null.open_model(None, spec=SPEC).info))
    ex = model.create_executor()
    logs: list[list[tuple[float, str]]] = [[] for _ in range(threads)]
    stop = threading.Event()
    workers = [threading.Thread(target=_hammer, args=(ex, log, stop), daemon=True)
               for log in logs]
    for w in workers:
        w.start()
    time.sleep(0.2)  # hammering in full
    begun = time.perf_counter()
    ex.close()
    returned = time.perf_counter()
    time.sleep(0.2)
    stop.set()
    for w in workers:
        w.join()

    assert ex.closed
    assert any(o == "ran" for log in logs for _, o in log) and all(logs)  # they did hammer
    # close() returned while they were still calling: it was not held off until they stopped
    assert returned - begun < HAMMER_S / 2, returned - begun
    assert any(start > returned for log in logs for start, _ in log)
    after = Counter(o for log in logs for start, o in log if start > begun)
    # Each thread may have read the executor's lock just before close() swapped it: at most
    # one call per thread that began "after" close() by the clock but before it by the lock.
    assert after["ran"] + after["busy"] <= threads, after
    assert after["closed"] > 0
    assert all(o == "closed" for log in logs for start, o in log if start > returned)
    model.close()


def test_every_entry_point_raises_closed_once_close_has_begun() -> None:
    model = GearModel(SlowModel(null.open_model(None, spec=SPEC).info))
    ex = model.create_executor()
    ex.close()
    calls = {"execute": lambda: ex.execute({"x": np.ones((1, 4), np.float32)}),
             "set_dynamic_dims": lambda: ex.set_dynamic_dims([1, 4]),
             "set_dynamic_batch_size": lambda: ex.set_dynamic_batch_size(1),
             "set_dynamic_image_size": lambda: ex.set_dynamic_image_size(1, 1),
             "clear_dynamic_dims": ex.clear_dynamic_dims}
    for name, call in calls.items():
        with pytest.raises(gr.ClosedError, match=f"{name} on a closed executor"):
            call()
    ex.close()  # idempotent
    model.close()
