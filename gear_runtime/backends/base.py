"""The small interface every backend implements (one file per backend beside this one).

A backend turns a model file into a :class:`BackendModel` (what the model is: its gears, its
inputs and outputs, per-gear output shapes) that can create :class:`BackendSession` objects,
one per executor. The executor owns the flow (dims, matching, staging through the C++ core);
a session only owns device-side state and runs what was staged:

    session.staging           # host buffer the core stages every input (and the dims) into
    session.run_gear(g)       # move the merged region to the device in ONE copy, run gear g
    session.run_dynamic(xs)   # hybrid mode: a miss runs the dynamic-shape graph
    session.run_sink(xs)      # GetNext-sink mode: the device computes the dims, read back
    session.direct_runs()     # optional: each gear's run as one call the core makes itself

Every backend call that fails raises :class:`gear_runtime.errors.BackendError` naming the call.
What benchmarks compare with (a bare run, a naive run) is no part of this interface: a backend
that offers it implements the optional protocols of :mod:`gear_runtime.backends.bench_hooks`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from gear_runtime.backends.output_pool import (
    FRESH_OUTPUT_MIN_BYTES,
    POOL_BUDGET_FACTOR,
    OutputPool,
)
from gear_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    ClosedError,
    GearFileError,
    InputError,
)
from gear_runtime.gearfile.info import ModelInfo

#: One gear's direct run (:meth:`BackendSession.direct_runs`): ``(call, args, outputs,
#: copyable)``, or None where the gear runs through the session's methods.
DirectRun = tuple[Callable[..., Any], tuple[Any, ...], list[np.ndarray], bool] | None


class BackendSession(ABC):
    """Per-executor backend state: bindings, device buffers, preallocated outputs.

    Not thread-safe on its own: one session belongs to one executor (one thread / stream).
    """

    #: Host staging buffer (uint8, C-contiguous, at least ``layout.total_bytes``); pinned where
    #: the backend offers pinned memory. The C++ core writes inputs and dims into it.
    staging: np.ndarray

    #: Whether the session runs only on the thread that created it (ORT's CUDA EP keeps a
    #: session's CUDA graphs per thread): the server then never lends its executor to
    #: another thread.
    thread_bound: bool = False

    #: Inputs of at least this many bytes that a request does not pad are read where the
    #: caller has them instead of being staged (:meth:`run_gear_in_place`); 0: every input is
    #: staged (the merged copy is the point on a device).
    in_place_input_bytes: int = 0

    def written_buffers(self) -> list[np.ndarray]:
        """The memory this session's runs write that a caller may hold as an input (its
        copy=False output buffers; C-contiguous): an input sharing memory with one is staged,
        never bound in place (the run would write what it reads). Read once, by the executor
        that owns the session; only where ``in_place_input_bytes`` > 0."""
        return []

    def run_gear_in_place(self, gear: int, placed: dict[int, np.ndarray],
                          copy: bool) -> list[np.ndarray]:
        """Run gear ``gear`` with the staged inputs ``placed`` (staged index -> the caller's
        C-contiguous array of the gear's shape and dtype, alive until this returns) read
        from those arrays, the others from staging; outputs as :meth:`run_gear_owned` (copy)
        or :meth:`run_gear` give them. Only on a session whose ``in_place_input_bytes`` > 0."""
        raise NotImplementedError(f"{type(self).__name__} stages every input")

    @abstractmethod
    def run_gear(self, gear: int) -> list[np.ndarray]:
        """Run gear ``gear`` on what was staged for it; return its outputs.

        The arrays have gear ``gear``'s output shapes and may be views of buffers the session
        reuses: they are valid until the next run on this session.
        """

    def run_gear_owned(self, gear: int) -> list[np.ndarray]:
        """:meth:`run_gear`, but the arrays are the caller's to keep (``execute(copy=True)``).
        This default copies each output; a large one (``FRESH_OUTPUT_MIN_BYTES`` or more)
        into memory recycled from this session's :class:`OutputPool` once the caller drops
        it, not a fresh ``np.empty`` whose every page faults and is zeroed by the kernel on
        the run's path (311 MB: ~0.8 s, output_pool.py). Backends that can run straight
        into the caller's arrays override this to save the copy (:meth:`run_owned_into`)."""
        outputs = self.run_gear(gear)
        big = sum(o.nbytes for o in outputs if o.nbytes >= FRESH_OUTPUT_MIN_BYTES)
        if not big:
            return [o.copy() for o in outputs]
        pool = self._owned_pool_for(big)
        owned = []
        for o in outputs:
            if o.nbytes < FRESH_OUTPUT_MIN_BYTES:
                owned.append(o.copy())
                continue
            target = pool.array(o.shape, o.dtype, o.nbytes)[0]
            np.copyto(target, o)
            owned.append(target)
        return owned

    def run_owned_into(self, gear: int, info: ModelInfo,
                       skip: Collection[int] = ()) -> list[np.ndarray]:
        """:meth:`run_gear_owned` for a backend whose :meth:`run_gear_into` writes a numpy
        buffer with the ONE copy out of the runtime's memory (ACL: the device-to-host memcpy
        lands in it; MindSpore Lite: the output tensor's data is copied into it): each large
        output is a pooled array given as ``out=``, so it is copied once, not into the
        session's buffer and again into the caller's. ``skip``: outputs the run hands back
        empty (a state output)."""
        sizes = [0 if k in skip else info.output_size(gear, k)
                 for k in range(len(info.output_dtypes))]
        big = sum(n for n in sizes if n >= FRESH_OUTPUT_MIN_BYTES)
        if not big:
            return [o.copy() for o in self.run_gear(gear)]
        pool = self._owned_pool_for(big)
        targets = {k: pool.array(info.output_shapes[gear][k], info.output_dtypes[k], n)[0]
                   for k, n in enumerate(sizes) if n >= FRESH_OUTPUT_MIN_BYTES}
        outputs = self.run_gear_into(gear, targets)
        return [o if k in targets else o.copy() for k, o in enumerate(outputs)]

    def _owned_pool_for(self, big: int) -> OutputPool:
        """This session's pool of kept outputs, room for twice ``big`` bytes (a call's large
        outputs): made on first use, made anew when a larger gear needs more."""
        pool = getattr(self, "_owned_pool", None)
        if pool is None or pool.budget < POOL_BUDGET_FACTOR * big:  # sized by what it held
            pool = self._owned_pool = OutputPool(POOL_BUDGET_FACTOR * big)
        return pool

    def direct_runs(self) -> list[DirectRun] | None:
        """Optional: per gear, the run as ONE call the C++ core makes itself right after
        staging (no Python frame between the two), or None for a gear that runs through
        :meth:`run_gear` / :meth:`run_gear_owned`. None (the default): every gear does.

        An entry ``(call, args, outputs, copyable)``: ``call(*args)`` runs the gear on what
        was staged and leaves its outputs in ``outputs``, the same C-contiguous arrays on
        every run (what :meth:`run_gear` returns); ``copyable``: whether copies of them are
        what :meth:`run_gear_owned` would return (False where it has a better way, e.g.
        memory recycled for large outputs: then copy=True runs go through it). Read once, when
        the executor is created: the entries must stay valid for the session's life. An
        exception of ``call`` becomes :meth:`run_failed`'s error."""
        return None

    def run_gear_into(self, gear: int, out: dict[int, np.ndarray]) -> list[np.ndarray]:
        """:meth:`run_gear`, with output ``k`` written into ``out[k]`` (C-contiguous, writable,
        the gear's shape and dtype: the executor checked) and returned in its place; the
        other outputs as :meth:`run_gear`'s. This default copies each one once after the
        run; backends that can bind an output to the caller's memory override it."""
        outputs = list(self.run_gear(gear))
        for k, buf in out.items():
            np.copyto(buf, outputs[k])
            outputs[k] = buf
        return outputs

    def device_out_refusal(self, buf: DeviceBuffer) -> str | None:
        """Why this session cannot write an output into ``buf`` (another session's device
        memory), or None when its :meth:`run_gear_into` takes it as ``out[k]`` (written on
        the device, no host copy). Default: this session writes its outputs to host memory."""
        return (f"this executor writes its outputs to host memory, not into {buf.backend} "
                f"device memory; hand it over with set_state(name, output) (one "
                "host-to-device copy)")

    # ---- resident state (sessions created with a StatePlan: HostState below) ---------------
    def bind_rows(self, gear: int, first_row: int) -> None:
        """Gear ``gear``'s runs use the rows of every state with rows from ``first_row`` on
        (a backend with :attr:`BackendModel.supports_state_rows`); the others are never
        given a state with rows (create_executor refuses it), so only row 0 is theirs."""
        if first_row:
            raise BackendError("this backend binds state rows from row 0 only")

    def commit_state(self) -> None:
        """After a successful run: the buffers just written become the ones the next run
        reads. Sessions without state have nothing to swap."""
        return None

    def run_failed(self, gear: int, exc: Exception) -> BackendError:
        """The error a direct run's exception ``exc`` on gear ``gear`` is raised as."""
        return BackendError(f"{type(self).__name__} run of gear {gear} failed: {exc}")

    def run_dynamic(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the dynamic-shape graph on ``arrays`` (hybrid mode, after a miss). The arrays
        may be the session's own, valid until its next run (as :meth:`run_gear`'s):
        ``execute(copy=True)`` copies every one."""
        raise BackendError(f"backend {type(self).__name__} has no dynamic-shape graph")

    def run_sink(self, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...]]:
        """GetNext-sink mode: run with the dims computed on the device; return the outputs
        (as :meth:`run_dynamic`'s: copied by ``execute(copy=True)``) and the dims read back."""
        raise BackendError(f"backend {type(self).__name__} does not support GetNext-sink mode")

    def close(self) -> None:
        """Free device resources; idempotent. Backends with nothing to free keep this."""
        return None


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


class DeviceStateBase(ABC):
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


class HostState:
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

    def set(self, pair: int, value: np.ndarray) -> None:
        """Copy ``value`` (the pair's shape and dtype) into the buffer the next run reads."""
        np.copyto(self.read(pair), value)

    def swap(self) -> None:
        self.parity ^= 1

    def zero(self) -> None:
        for pair in self._buffers:
            for buf in pair:
                buf.fill(0)


def split_sink_outputs(
        outputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """A sink graph's outputs as :meth:`BackendSession.run_sink` returns them: the model's
    outputs, and the dims the graph computed (GE wires GetDynamicDims as the LAST output of
    NetOutput), read back as a tuple of ints."""
    *outs, dims = outputs
    return outs, tuple(int(d) for d in np.asarray(dims).reshape(-1))


class BackendModel(ABC):
    """A model loaded on one backend. Thread-safe: sessions are created per executor."""

    name: ClassVar[str]
    info: ModelInfo
    #: Extra keyword arguments for :func:`gear_runtime.runtime.core.plan_layout` that the backend's
    #: device memory rules need, e.g. ``{"alignment": 64, "tail_padding": 32}`` (acl: buffers
    #: carved out of one device block). GearModel plans the one layout every session gets
    #: with them; ``fusion_size`` always comes from the user's ``input_fusion_size``. Empty:
    #: plan_layout's defaults (GE's packed staging). Read-only: never mutate it.
    layout_options: ClassVar[dict[str, int]] = {}
    #: Whether the backend reads the int32 dims buffer (``ascend_mbatch_shape_data``) from
    #: the staging layout, as GE's merged copy hands it to the device. Where it does not
    #: (ONNX Runtime runs the source graph at the gear's shapes; MindSpore Lite takes the
    #: inputs alone), the layout has no dims buffer and nothing is staged for it.
    stages_dims: ClassVar[bool] = True

    #: Whether :meth:`create_session` takes ``state=`` (resident state, double-buffered in
    #: the backend's memory: :mod:`gear_runtime.runtime.state`).
    supports_state: ClassVar[bool] = False
    #: Whether a state may have rows (axis 0 follows the gear: a batched decode's
    #: sequences, :attr:`gear_runtime.runtime.state.StatePair.rows`): each gear binds the
    #: leading rows of the state's buffers.
    supports_state_rows: ClassVar[bool] = False

    @abstractmethod
    def create_session(self, layout: Any) -> BackendSession:
        """A new session whose staging buffer fits ``layout`` (a
        ``gear_runtime.runtime.core.Layout``).

        The session binds gear ``g``'s input ``i`` to ``layout.offset(g, i)`` of its staging
        (or of the device buffer the merged span is copied to) and the dims buffer to
        ``layout.dims_offset(g)``. A backend with :attr:`supports_state` also takes
        ``state=plan`` (a :class:`~gear_runtime.runtime.state.StatePlan`): the layout then
        covers ``plan.inputs`` alone, in that order, and the session holds the state.
        """

    def state_refusal(self) -> str | None:
        """Why this model's sessions cannot take ``state=``, or None when they can."""
        if self.supports_state:
            return None
        return (f"state= is not built for the {self.name!r} backend (resident state runs on "
                "onnxruntime's CPU, acl, mindspore_lite's default provider and null)")

    def weights_shareable(self) -> bool:
        """Whether ``load(..., share_weights_with=)`` of this model can share its weights
        now (on a backend whose facts say it shares weights at all)."""
        return True

    def guard_graph(self) -> tuple[Any, ...] | None:
        """(the onnx GraphProto, its opset imports, the weights kept outside it by name, a
        function reading one's values) whose kernels this backend runs as ONNX Runtime
        does, for :func:`gear_runtime.gearfile.kernel_guards.find_guards`; None (the default)
        where the device runtime compiled the graph (its kernels check their own inputs)."""
        return None

    def state_graph(self) -> Any:
        """The onnx GraphProto this backend's sessions run, for the in-place state check
        (:func:`gear_runtime.runtime.state.in_place_refusal`); None where it cannot bind a
        state in place (the default)."""
        return None

    def close(self) -> None:
        """Unload the model; idempotent. Backends with nothing to free keep this."""
        return None


class StateSessions(Protocol):
    """A :class:`BackendModel` whose :attr:`~BackendModel.supports_state` is True: its
    :meth:`~BackendModel.create_session` also takes ``state=plan``."""

    def create_session(self, layout: Any, state: Any = None) -> BackendSession: ...


def import_runtime(module: str, backend: str, install: str) -> Any:
    """Import a backend's runtime lazily (only machines that run it have it).

    Raises BackendUnavailableError naming the backend, the module and ``install``: what to
    install to get it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {backend!r} needs the Python module {module!r}, which cannot be imported "
            f"here ({exc}); {install}") from exc


def aligned_buffer(nbytes: int, alignment: int = 64) -> np.ndarray:
    """A zeroed uint8 host buffer of ``nbytes`` whose data pointer is ``alignment``-aligned
    (what pinned allocators give; the staging layout's offsets assume it)."""
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    # an explicit offset, not raw[start:start + nbytes]: numpy gives an EMPTY slice the base
    # array's (unaligned) address, so a 0-byte buffer would break the promise
    return np.ndarray((nbytes,), np.uint8, buffer=raw, offset=start)


def output_buffers(info: ModelInfo, fresh_min_bytes: float = FRESH_OUTPUT_MIN_BYTES,
                   skip: Collection[int] = ()
                   ) -> tuple[list[np.ndarray], list[list[np.ndarray]], list[list[int]]]:
    """A CPU session's output memory, the one rule of every CPU backend: one buffer per
    output sized for its largest gear (64-byte aligned, as ORT's own allocations: vectorised
    kernels store faster there), the per-gear views of them (``[gear][output]``, the gear's
    shapes) and, per gear, the outputs of at least ``fresh_min_bytes`` (execute(copy=True)
    has the backend write those into pooled arrays the caller keeps:
    :meth:`OutputPool.for_outputs`). ``skip``: outputs with no buffer of their own (a state
    output, written into the state's buffers): one item of memory, empty views, never big."""
    gears = range(info.spec.gear_count)
    buffers = [aligned_buffer(dt.itemsize if k in skip else
                              max(max(info.output_size(g, k) for g in gears), dt.itemsize))
               .view(dt) for k, dt in enumerate(info.output_dtypes)]
    views = [[buf[:0] if k in skip else
              buf[:int(np.prod(info.output_shapes[g][k]))].reshape(info.output_shapes[g][k])
              for k, buf in enumerate(buffers)] for g in gears]
    big = [[k for k, o in enumerate(outs) if k not in skip and o.nbytes >= fresh_min_bytes]
           for outs in views]
    return buffers, views, big


# ---- checks every device backend makes -------------------------------------------------------
def check_device_id(device_id: object) -> int:
    """``device_id`` when it is a non-negative int (not a bool); InputError otherwise."""
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise InputError(f"device_id must be a non-negative int, got {device_id!r}")
    return device_id


def check_model_file(path: str) -> None:
    """GearFileError unless ``path`` is an existing file (before the runtime sees it)."""
    if not os.path.isfile(path):
        raise GearFileError(f"model file {path!r} does not exist or is not a file")


def check_layout_fits(layout: Any, info: ModelInfo,
                      staged: Sequence[int] | None = None) -> None:
    """BackendError unless ``layout`` places exactly each input's bytes of every gear inside
    its total (a session's staging is planned from ``info``; any other layout is refused).
    ``staged``: the model inputs the layout covers, in its order (a session with resident
    state stages the others alone); default every input."""
    names, total = info.spec.input_names, int(layout.total_bytes)
    staged = range(len(names)) if staged is None else staged
    for g, row in enumerate(info.input_nbytes()):
        for j, i in enumerate(staged):
            got = int(layout.nbytes(g, j))
            end = int(layout.offset(g, j)) + got
            if got != row[i] or end > total:
                raise BackendError(
                    f"staging layout does not fit the model: input {names[i]!r} of gear {g} "
                    f"gets {got} bytes ending at {end} of {total}, it needs {row[i]}")
