"""Resident state in a backend: the buffers a session keeps for an executor's state pairs,
and the contract every backend's state implements.

The runtime plans the pairs (:mod:`gear_runtime.runtime.state`, the one place the concept is
described end to end) and hands a session the plan at ``create_session(layout, state=plan)``;
the session then holds a :class:`SessionState` as ``session.state`` (declared on
:class:`~gear_runtime.backends.base.BackendSession`): :class:`HostState` in a CPU backend's
own memory, a :class:`DeviceStateBase` in device memory (acl, mindspore_lite, ONNX Runtime's
CUDA provider). This module sits in the backend layer because the backends build on it; the
runtime reads it through the contract alone.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gear_runtime.backends.host_memory import aligned_buffer
from gear_runtime.errors import BackendError, ClosedError, InputError


class SessionState(ABC):
    """The contract of a session's resident state (``session.state``): what the runtime may
    ask of it, on every backend. ``plan`` is the executor's
    :class:`~gear_runtime.runtime.state.StatePlan`; a pair is named by its index in
    ``plan.pairs``. The swap after a successful run is the session's
    (:meth:`~gear_runtime.backends.base.BackendSession.commit_state`): it may need the
    backend's locks and bindings."""

    plan: Any

    @abstractmethod
    def read(self, pair: int) -> np.ndarray | DeviceBuffer:
        """The buffer the next run reads of pair ``pair``: a host array (no copy) or a
        :class:`DeviceBuffer` over device memory."""

    @abstractmethod
    def set(self, pair: int, value: np.ndarray | DeviceBuffer) -> None:
        """Copy ``value`` (the pair's shape and dtype: the runtime checked) into the buffer
        the next run reads; a :class:`DeviceBuffer` on the device where the backend can."""

    @abstractmethod
    def zero(self) -> None:
        """Zero every buffer of every pair (a new sequence)."""

    def copy_row(self, pair: int, source: int, target: int) -> None:
        """Copy row ``source`` of pair ``pair``'s read buffer onto row ``target`` (a state
        with rows: a sequence moving to another row of a batched state). Only backends with
        ``supports_state_rows`` are given states with rows."""
        raise BackendError(f"{type(self).__name__} keeps no state with rows")

    def host_buffers(self) -> list[tuple[int, int, np.ndarray]]:
        """(pair, parity, buffer) of every buffer in host memory that a run reads or writes
        (for the ``out=`` overlap check); none where the state lives on a device."""
        return []


class DeviceBuffer:
    """One buffer of a backend's device memory that gear_runtime hands out: a device
    backend's resident state (``ex.state[name]`` on acl, mindspore_lite and ONNX Runtime's
    CUDA provider). What a user does with it:

    - ``out={name: buf}`` of an executor on the same backend and device: the output is
      written straight into it on the device (no host copy): the prefill -> decode handoff;
    - ``set_state(name, buf)``: one device-to-device copy on acl, through the host where
      the runtime's Python API has no device copy;
    - ``buf.numpy()`` / ``np.asarray(buf)``: a host COPY (one device-to-host copy).

    ``owner`` is the session state whose memory it is: ``owner.alive()`` says whether the
    memory is still allocated (an executor closed since frees it: every use then raises
    ClosedError) and ``owner.to_host(buf)`` copies it out. The memory never moves, but its
    role does: a run of the owning executor swaps its state's buffers, so a buffer kept from
    before that run is STALE (the one the next run writes) and ``out=`` / ``set_state``
    refuse it (:meth:`check_current`): take ``ex.state[name]`` again after each run."""

    def __init__(self, owner: Any, backend: str, device_id: int, handle: Any,
                 shape: Sequence[int], dtype: Any, generation: int | None = None) -> None:
        self._owner = owner
        self.backend, self.device_id, self._handle = backend, int(device_id), handle
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        #: the owner's :attr:`DeviceStateBase.generation` when this was handed out (None:
        #: a buffer no state hands out, never stale)
        self.generation = generation

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def alive(self) -> bool:
        """Whether the memory is still allocated (its executor not closed)."""
        alive = getattr(self._owner, "alive", None)
        return bool(alive()) if callable(alive) else False

    def owned_by(self, state: Any) -> bool:
        """Whether this is memory of ``state`` (a session's resident state)."""
        return state is not None and self._owner is state

    def check_genuine(self, what: str) -> None:
        """InputError unless this is a buffer gear_runtime handed out, as it was handed out
        (its owner holds that memory at this shape and dtype): a buffer made by hand could
        point anywhere on the device, and a run would write there. ClosedError once freed."""
        holds = getattr(self._owner, "holds", None)
        if holds is not None:
            self.handle  # noqa: B018 - ClosedError once freed
        if holds is None or not holds(self._handle, self.shape, self.dtype):
            raise InputError(f"{what} is {self!r}, which is no device buffer gear_runtime "
                             "handed out (ex.state[name] of a device executor) at that shape "
                             "and dtype")
        self.check_current(what)

    def check_current(self, what: str) -> None:
        """InputError when this buffer is stale: its executor ran (and swapped its state's
        buffers) since ``ex.state[name]`` handed it out, so this memory is now the buffer that
        executor's NEXT run writes, not the one it reads: a handoff into it would be
        overwritten by the next step. Call with the owner's lock held where a run or a close
        may race (:meth:`DeviceStateBase.lock`)."""
        now = getattr(self._owner, "generation", None)
        if self.generation is None or now is None or now == self.generation:
            return
        raise InputError(f"{what} is {self!r}, taken from ex.state at state generation "
                         f"{self.generation}; its executor has run since (generation {now}) and "
                         "swapped its buffers, so this one is what its next run overwrites: "
                         "take ex.state[name] again after the run")

    @property
    def lock(self) -> Any:
        """The lock the owning state's runs, writes and close hold (:meth:`DeviceStateBase.lock`),
        or None where the owner has none."""
        return getattr(self._owner, "lock", None)

    @property
    def handle(self) -> Any:
        """What the backend knows the memory by: a device address (acl), the runtime's
        device tensor (mindspore_lite); ClosedError once the owning executor freed it."""
        if not self.alive:
            raise ClosedError(f"this {self.backend} device buffer belonged to an executor "
                              "that is closed: its memory is freed")
        return self._handle

    def numpy(self) -> np.ndarray:
        """A host copy (one device-to-host copy), the buffer's shape and dtype."""
        self.handle  # noqa: B018 - ClosedError once freed
        return self._owner.to_host(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        state = "" if self.alive else ", freed"
        return (f"DeviceBuffer({self.backend} device {self.device_id}, {self.dtype} "
                f"{list(self.shape)}{state})")


class DeviceStateBase(SessionState):
    """What the device backends' resident states share: per pair two device buffers (the
    backend's handles: addresses on acl, runtime objects elsewhere), the parity the next run
    reads, and the :class:`DeviceBuffer` each hands out (:meth:`read`) and recognises
    (:meth:`holds`). A subclass sets ``plan``, ``parity``, ``backend`` and ``device_id``.

    Every assignment to ``parity`` (the swap after a run, ``parity ^= 1``) bumps
    :attr:`generation`: a :class:`DeviceBuffer` handed out before is stale and refused as
    ``out=`` / ``set_state`` (:meth:`DeviceBuffer.check_current`)."""

    plan: Any
    backend: str
    device_id: int
    #: bumped on every swap (every assignment to ``parity``)
    generation: int = 0

    @property
    def parity(self) -> int:
        """The parity the next run reads (0 or 1)."""
        return self._parity

    @parity.setter
    def parity(self, value: int) -> None:
        self._parity = int(value)
        self.generation = self.generation + 1

    @property
    def lock(self) -> Any:
        """The lock this state's runs, writes and close hold (a ``threading.Lock``), or None.
        A run writing into ANOTHER state's buffer holds that lock too from the buffer's check
        through the run (:func:`locks_in_order`), so that state's close cannot free it."""
        return None

    @abstractmethod
    def handles(self, pair: int) -> Sequence[Any]:
        """Pair ``pair``'s two buffers, by parity."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether the buffers are still allocated (the session not closed)."""

    @abstractmethod
    def to_host(self, buf: DeviceBuffer) -> np.ndarray:
        """A host copy of ``buf`` (one of these buffers): one device-to-host copy."""

    @abstractmethod
    def set(self, pair: int, value: np.ndarray | DeviceBuffer) -> None: ...

    def read(self, pair: int) -> DeviceBuffer:
        """The buffer the next run reads, as a :class:`DeviceBuffer` (no copy)."""
        p = self.plan.pairs[pair]
        return DeviceBuffer(self, self.backend, self.device_id,
                            self.handles(pair)[self.parity], p.shape, p.dtype, self.generation)

    def find(self, handle: Any) -> tuple[int, int] | None:
        """(pair, parity) of the buffer ``handle``; None when it is none of these."""
        for pair in range(len(self.plan.pairs)):
            for parity, own in enumerate(self.handles(pair)):
                if own is handle or (isinstance(own, int) and own == handle):  # an address
                    return pair, parity
        return None

    def holds(self, handle: Any, shape: tuple[int, ...], dtype: np.dtype) -> bool:
        """Whether ``handle`` is one of these buffers, at its pair's shape and dtype."""
        found = self.find(handle)
        if found is None:
            return False
        p = self.plan.pairs[found[0]]
        return p.shape == tuple(shape) and p.dtype == dtype


@contextlib.contextmanager
def locks_in_order(*locks: Any) -> Iterator[None]:
    """Hold every distinct lock of ``locks`` (None skipped, a lock given twice taken once),
    always acquired in one order (by ``id``) whatever order they are given in: two runs each
    writing into the other's state take them in the same order and cannot deadlock."""
    distinct = sorted({id(lk): lk for lk in locks if lk is not None}.values(), key=id)
    with contextlib.ExitStack() as stack:
        for lk in distinct:
            stack.enter_context(lk)
        yield


class HostState(SessionState):
    """Double-buffered resident state in host memory (a CPU backend's own memory): per pair
    two aligned buffers; a run reads ``read(pair)`` and writes ``write(pair)``; ``swap``
    after a successful run. Both start zeroed. An in-place pair (``pair.in_place``) has ONE
    buffer, which both return: its run reads and writes it. The executor reaches them through
    ``session.state``."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.parity = 0
        self._buffers = []
        for p in plan.pairs:  # an in-place pair: one buffer at both parities
            bufs = [aligned_buffer(max(p.nbytes, 1))[:p.nbytes].view(p.dtype).reshape(p.shape)
                    for _ in range(1 if p.in_place else 2)]
            self._buffers.append((bufs[0], bufs[-1]))

    def read(self, pair: int) -> np.ndarray:
        """The buffer the next run reads of pair ``pair`` (index in ``plan.pairs``)."""
        return self._buffers[pair][self.parity]

    def write(self, pair: int, parity: int | None = None) -> np.ndarray:
        """The buffer a run at ``parity`` (default: the current one) writes."""
        return self._buffers[pair][1 - (self.parity if parity is None else parity)]

    def buffer(self, pair: int, parity: int) -> np.ndarray:
        """Buffer ``parity`` (0 or 1) of pair ``pair``: what a run at that parity reads."""
        return self._buffers[pair][parity]

    def set(self, pair: int, value: np.ndarray | DeviceBuffer) -> None:
        """Copy ``value`` (the pair's shape and dtype) into the buffer the next run reads."""
        np.copyto(self.read(pair), value)  # a DeviceBuffer: through its __array__ (a host copy)

    def copy_row(self, pair: int, source: int, target: int) -> None:
        buf = self.read(pair)
        buf[target] = buf[source]

    def host_buffers(self) -> list[tuple[int, int, np.ndarray]]:
        return [(j, parity, self.buffer(j, parity))
                for j in range(len(self.plan.pairs)) for parity in (0, 1)]

    def swap(self) -> None:
        self.parity ^= 1

    def zero(self) -> None:
        for pair in self._buffers:
            for buf in pair:
                buf.fill(0)
