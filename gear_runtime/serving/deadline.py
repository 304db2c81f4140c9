"""Request deadlines, as Triton honours them: the request parameter ``timeout`` (microseconds,
Triton's name; tritonclient's ``infer(..., timeout=)``, HTTP and gRPC) and a gRPC call's
own deadline (tritonclient.grpc's ``client_timeout``).

A request still waiting in its model's queue when its deadline passes is dropped there and
answered at once as Triton answers it: 503 / UNAVAILABLE ``Request timeout expired``
(Triton's dynamic batcher's status and text for a request rejected past its timeout); a
gRPC deadline that passes is DEADLINE_EXCEEDED, what the client's own deadline says. A
request that has begun running finishes and is answered with its outputs.

Each queue (the executor pool's, the batcher's, a sequence slot's) arms a timer at the
deadline (:meth:`Deadline.arm`); the timer and the run's start settle atomically which came
first, so a request is either dropped before it runs or runs to its end, never both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.serving.errors import DeadlineExceededError, RequestExpiredError

#: The request parameter Triton reads a request's timeout from (microseconds; 0: none).
TIMEOUT_PARAMETER = "timeout"
#: The largest timeout accepted (microseconds): Triton's uint64, held to what a float keeps.
MAX_TIMEOUT_US = 2**53


@dataclass(frozen=True)
class Deadline:
    """When a request must have begun running (``time.perf_counter()`` seconds), and what
    set it (named in the error)."""

    at: float
    #: what set the deadline, as the error names it
    what: str
    #: set by the gRPC call's deadline (answered DEADLINE_EXCEEDED), not by ``timeout``
    grpc: bool = False

    def remaining(self) -> float:
        """Seconds until the deadline (negative once past)."""
        return self.at - time.perf_counter()

    def passed(self) -> bool:
        return self.remaining() <= 0

    def error(self) -> RequestExpiredError:
        """The answer of a request dropped at its deadline (Triton's text first)."""
        kind = DeadlineExceededError if self.grpc else RequestExpiredError
        return kind(f"Request timeout expired: the request was still waiting in the queue "
                    f"at {self.what}; it was dropped without running")

    def arm(self, fn: Callable[[], Any]) -> asyncio.TimerHandle:
        """Call ``fn()`` on the running loop at the deadline (at once if it passed); the
        caller cancels the handle once the request has its answer."""
        return asyncio.get_running_loop().call_later(max(0.0, self.remaining()), fn)


def request_deadline(parameters: Mapping[str, Any], arrived: float,
                     grpc_remaining: float | None = None) -> Deadline | None:
    """The deadline of a request that arrived at ``arrived`` (perf_counter): the earlier of
    its ``timeout`` parameter (microseconds from arrival; absent or 0: none) and a gRPC
    call's deadline (``grpc_remaining``: seconds it had left when it arrived; None: none).
    InputError naming the value when ``timeout`` is not a whole number of microseconds in
    0..2**53."""
    found: list[Deadline] = []
    timeout = parameters.get(TIMEOUT_PARAMETER)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int) or \
                not 0 <= timeout <= MAX_TIMEOUT_US:
            raise InputError(f'parameter "{TIMEOUT_PARAMETER}" must be a whole number of '
                             f"microseconds in 0..{MAX_TIMEOUT_US} (0: no timeout), got "
                             f"{timeout!r:.80}")
        if timeout:
            found.append(Deadline(arrived + timeout / 1e6,
                                  f'its "timeout" of {timeout} microseconds'))
    if grpc_remaining is not None:
        found.append(Deadline(arrived + grpc_remaining,
                              f"its gRPC deadline ({grpc_remaining:.3f} s after it arrived)",
                              grpc=True))
    return min(found, key=lambda d: d.at) if found else None


__all__ = ["Deadline", "TIMEOUT_PARAMETER", "request_deadline"]
