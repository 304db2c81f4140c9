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

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from gear_runtime.backends.host_memory import aligned_buffer as aligned_buffer
from gear_runtime.backends.output_pool import (
    FRESH_OUTPUT_MIN_BYTES,
    POOL_BUDGET_FACTOR,
    OutputPool,
)

# the resident-state classes live in state.py; re-exported here, where backends import them
from gear_runtime.backends.state import DeviceBuffer as DeviceBuffer
from gear_runtime.backends.state import DeviceStateBase as DeviceStateBase
from gear_runtime.backends.state import HostState as HostState
from gear_runtime.backends.state import SessionState as SessionState
from gear_runtime.backends.state import locks_in_order as locks_in_order
from gear_runtime.errors import (
    BackendError,
    BackendUnavailableError,
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

    # ---- resident state: the contract (gear_runtime.backends.state) ------------------------
    #: The session's resident state (created with ``state=plan``): its buffers, behind
    #: :class:`~gear_runtime.backends.state.SessionState` (a :class:`HostState` in host
    #: memory, a :class:`DeviceStateBase` on a device); None for a session without state.
    state: SessionState | None = None

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
