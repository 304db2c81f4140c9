"""Race helpers shared by the backend tests (thread-safety of close against a run)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gear_runtime.errors import BackendError


def close_during_run(model: Any, run: Callable[[], Any],
                     still_loaded: Callable[[], bool]) -> Any:
    """Start ``run`` and ``model.close`` in two threads while a run holds ``model.lock``.

    Asserts that close waits for the lock (``still_loaded()`` stays true meanwhile) and
    returns what ``run`` gave: its outputs, or the BackendError it raised when the close went
    first. Anything else (an AttributeError on a dropped handle, say) propagates as a failure.
    """
    outcome: list[Any] = []

    def runner() -> None:
        try:
            outcome.append(run())
        except BackendError as exc:
            outcome.append(exc)

    worker, closer = threading.Thread(target=runner), threading.Thread(target=model.close)
    with model.lock:  # a run of the model is in flight
        worker.start()
        closer.start()
        closer.join(0.2)
        assert closer.is_alive(), "close did not wait for the run"
        assert still_loaded()
    worker.join()
    closer.join()
    (result,) = outcome
    return result
