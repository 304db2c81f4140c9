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
  sequence; different sequences run in parallel, one thread per slot). A request whose
  client goes away (a hang-up, a client timeout, a gRPC deadline) holds its place: a run
  under way finishes and one not begun is skipped in its turn, so the requests behind it
  never run beside it nor before it; the slot is held until then. One whose deadline
  passes before it begins (serving/deadline.py) is answered at once and skipped alike.
* past ``--max-queue`` requests waiting, a request that would wait is refused alone with
  503 ``[queue_full]`` (readiness never reads the queue: a probe would take the server
  out for one client's backlog).
* a start that fails (a prompt no gear of the start model covers) leaves the sequence not
  live; so does a start skipped because its client went away.
* a request without a start for an id that is not live (never started, its start failed,
  ended, or freed when idle): 400, naming the id.
* ``sequence_end``: the slot is freed once its run is over; a start of the same id sent
  right after waits for it on the same slot, then starts the sequence over.

The slots' executors are made when the model loads, so the memory a sequence needs is held
from the start, never allocated while serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from gear_runtime.errors import ClosedError, InputError
from gear_runtime.serving.deadline import Deadline
from gear_runtime.serving.errors import QueueFullError, UnavailableError

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


class _Abandoned(Exception):
    """A request whose client went away before its run began: it is skipped (in its turn,
    so an end still ends and a start still replaces the state it would have reset)."""


@dataclass
class _Request:
    """One admitted request; ``abandoned`` is set (on the loop) when its caller is
    cancelled, read on the slot's thread. ``began`` (set on the slot's thread as its run
    begins) and ``expired`` (set on the loop at its deadline) are settled under the slot's
    ``claim`` lock: whichever comes first wins."""

    control: SequenceControl
    epoch: int
    abandoned: bool = False
    began: bool = False
    expired: bool = False


@dataclass
class _Slot:
    executor: Any
    #: one thread: the slot's requests run on it one at a time, in the order admitted
    thread: ThreadPoolExecutor
    # ---- the loop's side: who holds the slot, what is admitted ----
    owner: int | str | None = None
    #: bumped by each start admitted: a request belongs to the start before it
    epoch: int = 0
    last_used: float = 0.0
    #: requests admitted whose run has not finished (or been skipped): the slot is held
    #: while this is non-zero, whatever happened to the requests' callers
    pending: int = 0
    # ---- the slot thread's side ----
    #: the epoch whose sequence the executor's state holds (None: no live sequence's)
    running: int | None = None
    #: settles a request's run beginning against its deadline (_Request.began / expired)
    claim: threading.Lock = field(default_factory=threading.Lock)


class SequenceSlots:
    """``size`` slots, each one executor with resident ``state`` and a thread to run it."""

    def __init__(self, model: Any, state: Mapping[str, str], size: int, name: str,
                 idle_s: float = DEFAULT_IDLE_S,
                 on_event: Callable[[str], None] | None = None, in_place: bool = False,
                 max_waiting: int | None = None) -> None:
        self.name, self.idle_s, self.max_waiting = name, idle_s, max_waiting
        #: called with "started", "ended" or "expired" (the server's metrics)
        self._on_event = on_event or (lambda event: None)
        # in_place: each pair one buffer, where the graph updates it in place (checked by
        # create_executor; a failed step may then leave its sequence's state half written)
        self._slots = [
            _Slot(model.create_executor(state=dict(state), in_place_state=in_place),
                  ThreadPoolExecutor(1, thread_name_prefix=f"gear-{name}-seq{i}"))
            for i in range(size)]
        self._live: dict[int | str, _Slot] = {}
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
        """Requests admitted that have not finished, beyond one per slot."""
        return sum(max(0, s.pending - 1) for s in self._slots)

    # ---- admission (on the loop) ---------------------------------------------------------
    def _admit(self, control: SequenceControl) -> tuple[_Slot, _Request]:
        """The slot ``control`` runs on, claimed for a start; the request counted there.
        ClosedError past the drain deadline, InputError for a sequence not live,
        SequencesFullError / QueueFullError (503) when it cannot be taken now."""
        if self.refusing:
            raise ClosedError(_REFUSING)
        slot = self._live.get(control.id)
        if slot is None:
            if not control.start:
                raise InputError(f"sequence {control.id!r} of model {self.name!r} is not "
                                 "live (never started, its start failed, ended, or freed "
                                 f"after {self.idle_s:g} s idle): its first request must "
                                 "set sequence_start")
            slot = self._free_slot()
        self._check_bound(slot)
        if control.start:  # a new sequence, or a live one started over on its slot
            slot.owner, slot.epoch = control.id, slot.epoch + 1
            self._live[control.id] = slot
        slot.pending += 1
        return slot, _Request(control, slot.epoch)

    def _check_bound(self, slot: _Slot) -> None:
        """QueueFullError when a request would wait on ``slot`` (busy) while ``max_waiting``
        requests wait already: the request is refused alone; one that runs at once is
        never refused (readiness does not read this: serving/dataplane.py)."""
        if slot.pending and self.max_waiting is not None and \
                self.waiting >= self.max_waiting:
            raise QueueFullError(f"model {self.name!r} has {self.waiting} requests waiting "
                                 f"(--max-queue {self.max_waiting}); retry later")

    def _free_slot(self) -> _Slot:
        """A slot no sequence holds, idle ones first; sequences idle past ``idle_s`` with
        nothing admitted give way. SequencesFullError when none is free."""
        now = time.monotonic()
        for seq, slot in list(self._live.items()):
            if slot.pending == 0 and now - slot.last_used > self.idle_s:
                self._release(seq)
                self._on_event("expired")
        free = [s for s in self._slots if s.owner is None]
        if not free:
            raise SequencesFullError(
                f"model {self.name!r} has {self.size} live sequences, its --max-sequences; "
                "end one (sequence_end) or retry later")
        return min(free, key=lambda s: s.pending)

    def _release(self, seq: int | str) -> None:
        slot = self._live.pop(seq, None)
        if slot is not None:
            slot.owner = None

    # ---- running (on the slot's thread) --------------------------------------------------
    def _run(self, slot: _Slot, req: _Request, fn: Callable[[Any], T]) -> T:
        """``req`` in its turn: a start resets the state then runs (the sequence is live
        once it succeeds); a step runs only on its own sequence's state; an end leaves the
        state to no sequence, whether it ran or not."""
        control = req.control
        try:
            if self.refusing:
                raise ClosedError(_REFUSING)
            if control.start:
                slot.running = None  # the state is the new sequence's, or no one's
                if self._skipped(slot, req):
                    raise _Abandoned
                slot.executor.reset_state()
                result = fn(slot.executor)
                slot.running = req.epoch
                return result
            if slot.running != req.epoch:
                raise InputError(f"sequence {control.id!r} of model {self.name!r} is not "
                                 "live: it ended, or its start failed, while this request "
                                 "waited")
            if self._skipped(slot, req):
                raise _Abandoned
            return fn(slot.executor)
        finally:
            if control.end and slot.running == req.epoch:
                slot.running = None

    @staticmethod
    def _skipped(slot: _Slot, req: _Request) -> bool:
        """Whether ``req`` is skipped in its turn (its caller gone, or its deadline passed);
        if not, it begins now and its deadline can no longer drop it."""
        with slot.claim:
            req.began = not (req.abandoned or req.expired)
            return not req.began

    # ---- the caller ----------------------------------------------------------------------
    async def call(self, control: SequenceControl, fn: Callable[[Any], T],
                   deadline: Deadline | None = None) -> T:
        """``fn(executor)`` on the sequence's slot, after a reset of its state when the
        request starts the sequence; the slot is freed after an end. One request at a time
        per slot, in arrival order. A caller cancelled (hang-up, timeout) does not free the
        slot: a run under way finishes, a run not begun is skipped in its turn; the slot
        is held until then. A start that fails leaves the sequence not live. A request not
        begun at ``deadline`` is answered the deadline's error at once and skipped in its
        turn as a cancelled one is."""
        slot, req = self._admit(control)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        try:
            future = slot.thread.submit(self._run, slot, req, fn)
        except RuntimeError:  # the threads are shut down (the model closes)
            self._finished(slot, req, False)
            raise ClosedError(_REFUSING) from None
        future.add_done_callback(partial(self._done, loop, slot, req, waiter))
        timer = None if deadline is None else \
            deadline.arm(partial(self._expire, slot, req, waiter, deadline))
        try:
            return await waiter
        except asyncio.CancelledError:
            req.abandoned = True
            raise
        finally:
            if timer is not None:
                timer.cancel()

    @staticmethod
    def _expire(slot: _Slot, req: _Request, waiter: asyncio.Future[T],
                deadline: Deadline) -> None:
        """On the loop at ``req``'s deadline: answered its error unless its run began."""
        with slot.claim:
            if req.began:
                return
            req.expired = True
        if not waiter.done():
            waiter.set_exception(deadline.error())

    def _done(self, loop: asyncio.AbstractEventLoop, slot: _Slot, req: _Request,
              waiter: asyncio.Future[T], future: Future[T]) -> None:
        """The run's end (any thread): the bookkeeping, then the answer, on the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits
            loop.call_soon_threadsafe(self._answer, slot, req, waiter, future)

    def _answer(self, slot: _Slot, req: _Request, waiter: asyncio.Future[T],
                future: Future[T]) -> None:
        error = None if future.cancelled() else future.exception()
        self._finished(slot, req, not future.cancelled() and error is None)
        if waiter.done():
            return
        if future.cancelled():
            waiter.set_exception(ClosedError(_REFUSING))
        elif error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(future.result())

    def _finished(self, slot: _Slot, req: _Request, ok: bool) -> None:
        """A request's run is over (``ok``: it succeeded): the slot's count, and the
        sequence freed after its end or its failed start, unless a later start of the id
        was admitted meanwhile."""
        slot.pending -= 1
        slot.last_used = time.monotonic()  # idle from now: a failed request was a use too
        control = req.control
        owns = slot.owner == control.id and slot.epoch == req.epoch
        if control.start and ok:
            self._on_event("started")
        if control.end and (ok or owns):
            self._on_event("ended")
        if owns and (control.end or (control.start and not ok)):
            self._release(control.id)

    def close(self) -> None:
        """Wait for running requests, stop the threads, close the executors."""
        for slot in self._slots:
            slot.thread.shutdown(wait=True, cancel_futures=True)
        for slot in self._slots:
            slot.executor.close()


_REFUSING = "the server is shutting down (past its drain deadline): retry on another replica"


__all__ = ["DEFAULT_IDLE_S", "SequenceControl", "SequenceSlots", "SequencesFullError",
           "sequence_control"]
