"""Stateful models over Triton's sequence protocol: each live sequence owns an executor whose
resident state (the KV cache of a decode step, ``create_executor(state=...)``) carries over
from one request of the sequence to the next.

A request carries the parameters ``sequence_id`` (a non-zero integer or a non-empty string;
0 and "" mean "no sequence", as in Triton), ``sequence_start`` and ``sequence_end``
(booleans), which ``tritonclient``'s ``infer(..., sequence_id=, sequence_start=,
sequence_end=)`` sends over HTTP and gRPC alike. What happens, as Triton's sequence batcher
with implicit state does it (``sequence_batching { state [...] }``, one candidate sequence
per slot, the "direct" strategy):

* ``sequence_start``: the sequence takes a free slot and its state is reset (zeros: the
  model's initial state); a start for a live id starts that sequence over on its slot. No
  free slot: 503 ``[sequences_full]`` (retry later), after freeing the sequences idle past
  ``idle_s``.
* a request of a live sequence runs on its slot, in arrival order (one at a time per
  sequence; different sequences run in parallel, one thread per slot).
* a request without a start for an id that is not live (never started, ended, or freed
  when idle): 400, naming the id.
* ``sequence_end``: the slot is freed after the answer.

The slots' executors are made when the model loads, so the memory a sequence needs is held
from the start, never allocated while serving.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gear_runtime.errors import ClosedError, InputError
from gear_runtime.serving.errors import UnavailableError

T = TypeVar("T")

#: Triton's default max_sequence_idle_microseconds is 1 s; generation waits on clients
#: between tokens, so the default here is longer (``serve --sequence-idle-seconds``).
DEFAULT_IDLE_S = 60.0


class SequencesFullError(UnavailableError):
    """Every sequence slot is held by a live sequence."""

    default_code = "sequences_full"


@dataclass(frozen=True)
class SequenceControl:
    """A request's sequence parameters."""

    id: int | str
    start: bool
    end: bool


def sequence_control(parameters: Mapping[str, Any]) -> SequenceControl:
    """The request parameters ``sequence_id`` / ``sequence_start`` / ``sequence_end``.
    InputError naming the parameter when one has the wrong kind, or when the id is missing
    (a stateful model serves sequences only)."""
    seq = parameters.get("sequence_id")
    if seq is None or seq == 0 or seq == "":
        raise InputError("this model keeps state between requests: send the parameters "
                         "sequence_id (non-zero), sequence_start on the first request and "
                         "sequence_end on the last (tritonclient: infer(..., sequence_id=, "
                         "sequence_start=, sequence_end=))")
    if isinstance(seq, bool) or not isinstance(seq, int | str):
        raise InputError(f'parameter "sequence_id" must be an integer or a string, got '
                         f"{seq!r}")
    if isinstance(seq, int) and not 0 < seq < 2**64:
        raise InputError(f'parameter "sequence_id" {seq} is out of range (1..2**64-1)')
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = parameters.get(key, False)
        if not isinstance(value, bool):
            raise InputError(f'parameter "{key}" must be true or false, got {value!r}')
        flags.append(value)
    return SequenceControl(seq, flags[0], flags[1])


@dataclass
class _Slot:
    executor: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    owner: int | str | None = None
    last_used: float = 0.0
    #: requests of this slot's sequence admitted and not finished
    pending: int = 0


class SequenceSlots:
    """``size`` slots, each one executor with resident ``state`` and a thread to run it."""

    def __init__(self, model: Any, state: Mapping[str, str], size: int, name: str,
                 idle_s: float = DEFAULT_IDLE_S,
                 on_event: Callable[[str], None] | None = None, in_place: bool = False) -> None:
        self.name, self.idle_s = name, idle_s
        #: called with "started", "ended" or "expired" (the server's metrics)
        self._on_event = on_event or (lambda event: None)
        # in_place: each pair one buffer, where the graph updates it in place (checked by
        # create_executor; a failed step may then leave its sequence's state half written)
        self._slots = [_Slot(model.create_executor(state=dict(state), in_place_state=in_place))
                       for _ in range(size)]
        self._threads = ThreadPoolExecutor(size, thread_name_prefix=f"gear-{name}-seq")
        self._live: dict[int | str, _Slot] = {}
        self._lock = threading.Lock()
        #: set past the drain deadline: requests not started fail with ClosedError
        self.refusing = False

    @property
    def size(self) -> int:
        return len(self._slots)

    @property
    def live(self) -> int:
        """Sequences holding a slot."""
        return len(self._live)

    @property
    def waiting(self) -> int:
        """Requests admitted that have not finished, beyond one per live sequence."""
        return sum(max(0, s.pending - 1) for s in self._slots)

    def _slot_for(self, control: SequenceControl) -> _Slot:
        slot = self._live.get(control.id)
        if control.start:
            if slot is None:
                slot = self._free_slot()
                slot.owner = control.id
                self._live[control.id] = slot
            self._on_event("started")
            return slot
        if slot is None:
            raise InputError(f"sequence {control.id!r} of model {self.name!r} is not live "
                             "(never started, ended, or freed after "
                             f"{self.idle_s:g} s idle): its first request must set "
                             "sequence_start")
        return slot

    def _free_slot(self) -> _Slot:
        now = time.monotonic()
        for seq, slot in list(self._live.items()):  # sequences idle too long give way
            if slot.pending == 0 and now - slot.last_used > self.idle_s:
                self._release(seq)
                self._on_event("expired")
        free = next((s for s in self._slots if s.owner is None), None)
        if free is None:
            raise SequencesFullError(
                f"model {self.name!r} has {self.size} live sequences, its --max-sequences; "
                "end one (sequence_end) or retry later")
        return free

    def _release(self, seq: int | str) -> None:
        slot = self._live.pop(seq, None)
        if slot is not None:
            slot.owner = None

    async def call(self, control: SequenceControl, fn: Callable[[Any], T]) -> T:
        """``fn(executor)`` on the sequence's slot, after a reset of its state when the
        request starts the sequence; the slot is freed after an end. One request at a time
        per sequence, in arrival order."""
        slot = self._slot_for(control)
        slot.pending += 1
        try:
            async with slot.lock:
                if self.refusing:
                    raise ClosedError("the server is shutting down (past its drain "
                                      "deadline): retry on another replica")
                if slot.owner != control.id:  # freed (idle or ended) while this one waited
                    raise InputError(f"sequence {control.id!r} of model {self.name!r} ended "
                                     "while this request waited")

                def run(ex: Any) -> T:
                    if control.start:
                        ex.reset_state()
                    return fn(ex)

                future = self._threads.submit(run, slot.executor)
                result = await asyncio.wrap_future(future)
                slot.last_used = time.monotonic()
                return result
        finally:
            slot.pending -= 1
            if control.end and slot.owner == control.id:
                self._release(control.id)
                self._on_event("ended")

    def close(self) -> None:
        """Wait for running requests, stop the threads, close the executors."""
        self._threads.shutdown(wait=True, cancel_futures=True)
        for slot in self._slots:
            slot.executor.close()


__all__ = ["DEFAULT_IDLE_S", "SequenceControl", "SequenceSlots", "SequencesFullError",
           "sequence_control"]
