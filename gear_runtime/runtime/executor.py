"""Executor: one per thread (or stream); set the dims, execute, get the gear's outputs.

The hot path is one C++ call (``ExecutorCore.execute``): the request read (a dict or list
of numpy arrays; anything else takes the Python rules of :mod:`gear_runtime.runtime.inputs`
first), dims from the input shapes, exact O(1) match, every input copied into the merged
staging buffer (the GIL released around a large copy), the int32 dims buffer written where
the backend reads it, and then the gear's run itself where the session offers it as a direct
run (``BackendSession.direct_runs``: ONNX Runtime on the CPU); otherwise the session's
``run_gear`` follows. Everything an executor mutates is its own (staging, bindings, current
dims), so executors of one model run concurrently with no shared lock.

Ownership: one executor serves one thread at a time. ``execute``, ``set_*`` and
``clear_dynamic_dims`` hold the executor for the whole call (dims, staging, the backend run,
the output buffers, the ``last_*`` fields); a second thread entering meanwhile gets
:class:`~gear_runtime.errors.ExecutorBusyError` at once -- it never waits, never gets another
call's outputs, and the call in flight is not disturbed. The hold is one non-blocking lock
acquire and release per call. ``close`` is the exception: from the moment it begins every
later call, from any thread, raises :class:`~gear_runtime.errors.ClosedError`, and it waits
for the call in flight (at most one: no new call can take the executor any more).

Differences from GE, on purpose: a miss is an error (GE silently keeps gear 0), an output
shape is never empty (GE returns an empty shape on a miss), and dims are per executor (ACL's
set-dims-then-execute pair is per dataset and races when a dataset is shared).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, Protocol, cast

import numpy as np

from gear_runtime import arguments
from gear_runtime.backends.base import BackendSession, DeviceBuffer
from gear_runtime.errors import (
    BackendError,
    ClosedError,
    DirectRunFailed,
    DynamicInputLengthError,
    ExecutorBusyError,
    GearMismatchError,
    InputError,
)
from gear_runtime.gearfile.info import ModelInfo
from gear_runtime.gearfile.kernel_guards import KernelGuard
from gear_runtime.runtime import core
from gear_runtime.runtime import inputs as inputs_rules
from gear_runtime.runtime.dispatch import GearDispatcher
from gear_runtime.runtime.state import ResidentState, StatePlan, StateView
from gear_runtime.spec import GearSpec

logger = logging.getLogger("gear_runtime")

Inputs = Mapping[str, Any] | Sequence[Any]


class ExecutorModel(Protocol):
    """What an executor reads of its model (a :class:`~gear_runtime.runtime.model.GearModel`,
    which creates it: typed here, not imported, so that the two modules do not import each
    other)."""

    spec: GearSpec
    info: ModelInfo
    layout: Any

    @property
    def dispatcher(self) -> GearDispatcher: ...
    @property
    def output_dynamic_axes(self) -> list[dict[int, int]]: ...
    @property
    def mode(self) -> str: ...
    @property
    def gears(self) -> list[tuple[int, ...]]: ...
    @property
    def output_names(self) -> list[str]: ...


class Executor:
    """Runs one gear model; created by :meth:`GearModel.create_executor`. One thread at a
    time: a second thread entering gets ExecutorBusyError (see the module doc)."""

    def __init__(self, model: ExecutorModel, session: BackendSession,
                 pad_values: Mapping[str, Any] | None = None, state: StatePlan | None = None,
                 layout: Any = None) -> None:
        """``state``: the executor's resident state (checked by
        :func:`~gear_runtime.runtime.state.plan_state`; the session holds it), and
        ``layout`` the staging layout over ``state.inputs`` the session was created with."""
        spec, info = model.spec, model.info
        self.model = model
        self._session = session
        self._plan = state  # None: no state (execute's test of whether a run is bound)
        self._gear_values = [tuple(g) for g in spec.gears]  # what an unpadded run reports
        #: the resident state's rules over the session's buffers (no pairs without state)
        self._state = ResidentState(state, session, self._gear_values)
        # what execute takes and returns: the model's inputs / outputs less the state's
        staged = range(len(spec.input_names)) if state is None else state.inputs
        self._returned = list(range(len(info.output_names)) if state is None else state.outputs)
        self._names = tuple(spec.input_names[i] for i in staged)
        self._dtypes = tuple(info.input_dtypes[i] for i in staged)
        self._hybrid = info.hybrid
        self._sink = info.sink
        shapes = [spec.input_shapes[i] for i in staged]
        self._ranks = sum(len(s) for s in shapes)
        # "which gear": the model's one table (shared by every executor, never rebuilt here),
        # or the one over the staged inputs when the others are resident state
        self._dispatch = model.dispatcher.over(staged)
        self._core = core.ExecutorCore(
            self._dispatch, [np.dtype(d) for d in self._dtypes],
            model.layout if layout is None else layout, session.staging)
        self._out_names = {info.output_names[k]: k for k in self._returned}
        self._preset: tuple[int, ...] | None = None
        # Held for the whole of every call that reads or writes the executor's state; taken
        # for good by close(), so a closed executor costs the hot path nothing extra.
        self._owner = threading.Lock()
        self._closing = threading.Lock()
        self._closed = False
        # close() called from inside one of this executor's own calls on that call's thread
        # (a signal handler, a callback of the inputs): the close finishes when the call ends
        self._deferred = False
        self._after_close: Callable[[], None] | None = None
        #: The dynamic dims of the last run: matched on the host, or (GetNext-sink mode) read
        #: back from the device after the run. None before the first run.
        self.last_dynamic_dims: tuple[int, ...] | None = None
        #: Index of the gear the last run used; None before the first run, or when the last
        #: run went to the dynamic-shape graph (hybrid miss).
        self.last_gear: int | None = None
        #: The dynamic values of the last request itself, before any padding (equal to
        #: last_dynamic_dims unless the last run was padded). None before the first run.
        self.last_request_dims: tuple[int, ...] | None = None
        self._pad_values = self._pad_bytes(pad_values or {})
        # Per output, the (axis, value index) pairs a padded run's outputs are trimmed along.
        axes = model.output_dynamic_axes
        self._trim_axes = [sorted(axes[k].items()) for k in self._returned]
        self._core.set_padding(self._pad_values)
        # The model's kernel guard (an attention mask's lengths) reads the staged request
        # between staging and the run: such an executor stages everything and runs through
        # the session, never the core's direct run
        self._guard = self._guard_of(model, layout if layout is not None else model.layout)
        # The runs the core makes itself right after staging (where the session offers them)
        self._core.set_runs(session.direct_runs() if self._guard is None else None)
        # Large inputs of a plain request read where the caller has them (ORT's CPU; a state
        # executor stages everything: its runs go through _execute_bound), never one sharing
        # memory with the session's output buffers (a copy=False output fed back in would be
        # written while it is read): the core copies those
        self._core.in_place_bytes = 0 if self._plan is not None or self._guard else \
            int(session.in_place_input_bytes)
        if self._core.in_place_bytes:
            self._core.set_written(session.written_buffers())
        self._execute_c = self._core.execute  # bound once: the hot path's one C++ call

    def _guard_of(self, model: ExecutorModel, layout: Any) -> _StagedGuard | None:
        """The model's kernel guard over this executor's staging, or None (no guard, or one
        reading a resident state input, which no request carries: logged)."""
        guard = getattr(model, "guard", None)
        if guard is None:
            return None
        missing = [n for n in guard.inputs if n not in self._names]
        if missing:
            logger.warning("the attention lengths are computed from %s, resident state of "
                           "this executor: its runs are not checked", ", ".join(missing))
            return None
        return _StagedGuard(guard, model, self._names, self._dtypes, layout, self._session)

    # ---- choosing the gear ---------------------------------------------------------------
    def set_dynamic_dims(self, dims: Sequence[int]) -> None:
        owner = self._enter("set_dynamic_dims")
        try:
            self._set_dynamic_dims(dims)
        finally:
            self._leave(owner)

    def _set_dynamic_dims(self, dims: Sequence[int]) -> None:
        """aclmdlSetInputDynamicDims: the FULL shapes of all inputs flattened, in input order.

        The dynamic values alone (one per -1 of input_shape) are accepted too. Raises
        DynamicInputLengthError (145012) on a wrong length or static dim and GearMismatchError
        (145013) when the dims are no gear (hybrid models accept any dims: a miss runs the
        dynamic-shape graph). The dims stay set for the following executes, whose input
        shapes must agree with them, until changed or :meth:`clear_dynamic_dims`.
        """
        values = self._to_ints("dims", dims)
        if len(values) == 0:
            raise InputError("dims is empty: aclmdlSetInputDynamicDims rejects dimCount 0; "
                             f"pass the {self._ranks} dims of all inputs")
        if len(values) != self._ranks and len(values) == self._dispatch.values_per_gear:
            gear_values = values  # the dynamic values alone
        else:
            gear_values = self._dispatch.values_from_full_dims(values)
        self._set(gear_values)

    def set_dynamic_batch_size(self, batch: int) -> None:
        """aclmdlSetDynamicBatchSize: dynamic batch mode only; 0 is rejected as ACL does."""
        owner = self._enter("set_dynamic_batch_size")
        try:
            self._set_batch(batch)
        finally:
            self._leave(owner)

    def _set_batch(self, batch: int) -> None:
        self._require_mode("batch", "set_dynamic_batch_size")
        (b,) = self._to_ints("batch", [batch])
        if b <= 0:
            raise InputError(f"batch must be positive (aclmdlSetDynamicBatchSize rejects {b}); "
                             f"batch gears: {', '.join(str(g[0]) for g in self.model.gears)}")
        self._set((b,))

    def set_dynamic_image_size(self, height: int, width: int) -> None:
        """aclmdlSetDynamicHWSize: dynamic image size mode only; 0 is rejected as ACL does."""
        owner = self._enter("set_dynamic_image_size")
        try:
            self._set_hw(height, width)
        finally:
            self._leave(owner)

    def _set_hw(self, height: int, width: int) -> None:
        self._require_mode("image_size", "set_dynamic_image_size")
        h, w = self._to_ints("image size", [height, width])
        if h <= 0 or w <= 0:
            raise InputError(f"image size must be positive, got height={h}, width={w}")
        self._set((h, w))

    def clear_dynamic_dims(self) -> None:
        """Forget set dims: the next execute derives them from the input shapes again."""
        owner = self._enter("clear_dynamic_dims")
        self._preset = None
        self._leave(owner)

    @property
    def dynamic_dims(self) -> tuple[int, ...] | None:
        """The dims set by ``set_*`` (gear values), or None when derived from the inputs."""
        return self._preset

    def _set(self, values: tuple[int, ...]) -> None:
        if not self._hybrid:
            self._dispatch.match(values)  # raises 145013 now, at set time, as ACL does
        self._preset = tuple(values)

    def _require_mode(self, mode: str, call: str) -> None:
        if self.model.mode != mode:
            raise InputError(f"{call} needs a model compiled with dynamic {mode.replace('_', ' ')}"
                             f"; this model's mode is {self.model.mode!r}: use "
                             "set_dynamic_dims")

    #: integers only (numpy's too), no bools, none beyond int64: InputError naming the value
    _to_ints = staticmethod(inputs_rules.to_ints)

    def _pad_bytes(self, pad_values: Mapping[str, Any]) -> list[bytes | None]:
        """Each input's pad value as one element of its dtype (None: 0), under the rules list
        inputs follow (:mod:`gear_runtime.runtime.inputs`: 0.5 for an integer input is
        refused, 0 for a float input is 0.0)."""
        if not isinstance(pad_values, Mapping):
            raise InputError("pad_values must be a dict input name -> value, got "
                             f"{type(pad_values).__name__}")
        inputs_rules.check_known(pad_values, self._names, "pad_values")
        out: list[bytes | None] = []
        for name, dtype in zip(self._names, self._dtypes, strict=True):
            if name not in pad_values:
                out.append(None)
                continue
            try:
                value = inputs_rules.as_input_array(name, pad_values[name], np.dtype(dtype))
            except InputError as exc:
                raise InputError(f"pad_values: {exc.message}") from None
            if value.shape != () or value.dtype != dtype:
                raise InputError(f"pad value of input {name!r} must be one {np.dtype(dtype)} "
                                 f"value, got {pad_values[name]!r}")
            out.append(value.tobytes())
        return out

    @property
    def pad_values(self) -> dict[str, Any]:
        """The pad value of every input (what padded positions are filled with)."""
        return {n: (np.frombuffer(b, dtype=dt)[0] if b is not None else np.zeros((), dt)[()])
                for n, b, dt in zip(self._names, self._pad_values, self._dtypes, strict=True)}

    # ---- running -------------------------------------------------------------------------
    def execute(self, inputs: Inputs, *, pad: bool = False, copy: bool = True,
                out: Mapping[str, np.ndarray] | None = None,
                first_row: int = 0) -> list[np.ndarray]:
        """Run the gear that the inputs (or the set dims) select; outputs in model order.

        ``inputs``: a dict name -> array, or a list in input order (numpy arrays, or nested
        lists; dtypes must be the model's, lists must hold values of its kind that fit it: no
        silent casts or truncation: :mod:`gear_runtime.runtime.inputs`). Outputs have the
        gear's real shapes. With ``copy=False`` they are views of this executor's buffers,
        valid until its next execute (zero-copy for services that consume them at once).

        ``pad=True``: inputs that match no gear exactly run on the cheapest gear whose every
        dynamic value is at least theirs (an exact hit is itself; cost: the model's attached
        profile, else the gear's total input elements). Each input goes to the leading part
        of every padded axis, the rest is its pad value (``create_executor(pad_values=)``,
        default 0). Outputs are trimmed to the request's sizes along the axes that
        ``model.output_dynamic_axes`` lists (views: of the executor's buffers with
        ``copy=False``, of arrays the caller owns with ``copy=True``); other outputs are the
        gear's, whole. Nothing covers the request: GearMismatchError (145013). A hybrid model
        runs only uncovered requests on its dynamic-shape graph; a sink model refuses
        padding (InputError). Whether padding is safe for a model: :func:`check_padding`.

        ``out``: output name -> a C-contiguous, writable array of the gear's shape and dtype
        for that output (else InputError naming it, the value and what was expected): the
        output is written into it (bound in place on ONNX Runtime's CPU: no copy; one copy
        on other backends) and that array is returned in its place (a trimmed view of it
        after a padded run). Or a :class:`~gear_runtime.backends.state.DeviceBuffer` (another
        executor's ``state[name]`` on a device backend) of the gear's shape and dtype, on
        this executor's backend and device: the output is written into it on the device (no
        host copy) and it is returned, whole, in its place; anything else is refused before
        the run. No state output can be given (its buffers are the state's). An ``out=``
        array that shares memory with anything the run reads or writes -- this executor's
        state (either buffer, a kept ``ex.state[name]`` included), its output buffers (a
        ``copy=False`` output), an input of this run, another ``out=`` array -- is refused
        (InputError naming both), never computed through a temporary. Not on hybrid or
        sink models.

        An executor with resident state (``create_executor(state=...)``) takes only the
        NON-state inputs and returns the NON-state outputs, in model order; the state
        outputs become the state the next run reads only when this run succeeded.

        ``first_row``: with a state that has rows (its axis 0 follows the gear: a batched
        decode's sequences, :attr:`state_rows`), the run reads and writes rows
        ``first_row .. first_row + the gear's rows`` of its buffers (default 0: the leading
        rows); InputError when they do not fit, or without such a state.

        The calling thread owns the executor until the call returns: another thread's
        execute / set_* meanwhile raises ExecutorBusyError at once (this call is unaffected);
        after :meth:`close`, ClosedError (145003).
        """
        if (pad is not False and pad is not True) or (copy is not True and copy is not False):
            pad, copy = arguments.flag("pad", pad), arguments.flag("copy", copy)  # no "yes"
        # The whole call runs owned (inline, not a helper: a call frame costs as much as the
        # lock itself on this path). The lock is read once: close() swaps it for _CLOSED.
        owner = self._owner
        if not owner.acquire(False):
            self._refuse("execute")
        try:
            outputs: list[np.ndarray] | None  # None: staged, the gear still to run
            if out is not None or self._plan is not None or first_row != 0:
                return self._execute_bound(inputs, pad, copy, out, first_row)
            if self._sink:
                if pad:
                    self._refuse_sink_padding()
                outputs = self._run_sink(self._arrays(inputs))
                self.last_request_dims = self.last_dynamic_dims
                return _handed_out(outputs, copy)
            try:
                # One C++ call: the common request (a dict or list of numpy arrays) read and
                # staged, then the gear's direct run where the session offers one. None: the
                # inputs need the Python rules first (lists to arrays, names to diff).
                done = self._execute_c(inputs, self._preset, pad, copy)
                if done is None:
                    gear, outputs = self._core.stage(self._arrays(inputs), self._preset, pad), None
                else:
                    gear, outputs = done
            except GearMismatchError:
                if not self._hybrid:
                    raise
                outputs = self._run_dynamic(self._arrays(inputs))
                return _handed_out(outputs, copy)
            except DirectRunFailed as failed:  # the session's direct run, made by the core
                self.last_gear = None
                cause = cast(Exception, failed.__cause__)  # the core wraps Exceptions only
                raise self._session.run_failed(failed.gear, cause) from cause
            if outputs is None:  # the gear runs through the session
                self.last_gear = None  # until this run succeeds
                if self._guard is not None:
                    self._guard.check(gear)
                outputs = (self._session.run_gear_owned(gear) if copy
                           else list(self._session.run_gear(gear)))
            elif type(outputs) is dict:  # large inputs the core checked and left in place
                self.last_gear = None  # until this run succeeds
                outputs = self._session.run_gear_in_place(gear, outputs, copy)
            self.last_gear = gear
            self.last_dynamic_dims = values = self._gear_values[gear]
            if not pad:  # then the request is the gear's values: no core call
                self.last_request_dims = values
                return outputs
            self.last_request_dims = request = self._core.last_request
            if request != values:
                return self._trim(outputs, request)
            return outputs
        finally:
            owner.release()  # inline, as the acquire above: this is the hot path
            if self._deferred:  # closed from inside this call (a signal handler): now
                self._finish_close()

    def _execute_bound(self, inputs: Inputs, pad: bool, copy: bool,
                       out: Mapping[str, np.ndarray] | None,
                       first_row: int = 0) -> list[np.ndarray]:
        """execute with ``out=`` or resident state: staged by the core, run through the
        session (whose bindings the state swaps), state committed only after success."""
        if self._sink or self._hybrid:
            raise InputError("execute(out=...) needs a model that is neither hybrid nor sink "
                             "(their dynamic-shape and sink runs allocate their outputs)")
        outs = self._out_indices(out)
        arrays = self._arrays(inputs)
        gear = self._core.stage(arrays, self._preset, pad)
        self.last_gear = None  # until this run succeeds
        self._state.bind_rows(gear, first_row)
        if self._guard is not None:
            self._guard.check(gear)
        for k, buf in outs.items():
            self._check_out(k, buf, gear)
        if outs:
            self._check_aliasing(outs, arrays)
            outputs = self._session.run_gear_into(gear, outs)
        else:
            outputs = list(self._session.run_gear(gear))
        self._state.commit()
        outputs = [o if k in outs or not copy else o.copy()
                   for k, o in ((k, outputs[k]) for k in self._returned)]
        self.last_gear = gear
        self.last_dynamic_dims = values = self._gear_values[gear]
        self.last_request_dims = request = self._core.last_request if pad else values
        return self._trim(outputs, request) if request != values else outputs

    def copy_state_rows(self, source: int, target: int) -> None:
        """Copy row ``source`` of every state with rows onto row ``target`` (a sequence
        moving to another row of a batched state: one row copy of each buffer the next
        run reads). InputError naming the row when it is outside the buffers."""
        owner = self._enter("copy_state_rows")
        try:
            self._state.copy_rows(source, target)
        finally:
            self._leave(owner)

    @property
    def state_rows(self) -> int:
        """Rows of the states with rows (the most a gear runs: a batched decode's slots);
        0 when no state has rows."""
        return self._state.rows

    def _out_indices(self, out: Mapping[str, np.ndarray] | None) -> dict[int, np.ndarray]:
        """``out`` as output index -> array; InputError for anything but a dict of this
        executor's returned output names to numpy arrays."""
        if out is None:
            return {}
        if not isinstance(out, Mapping):
            raise InputError(f"out must be a dict output name -> numpy array, got "
                             f"{type(out).__name__}")
        outs = {}
        for name, buf in out.items():
            if name not in self._out_names:
                why = (f"{name!r} is a state output (its buffers are the state's)"
                       if self._state.is_output(name) else f"no output {name!r}")
                raise InputError(f"out: {why}; outputs execute returns: "
                                 f"{', '.join(self._out_names)}")
            if not isinstance(buf, np.ndarray | DeviceBuffer):
                raise InputError(f"out[{name!r}] must be a numpy array (or a device state "
                                 f"buffer: ex.state[name] on a device backend), got "
                                 f"{type(buf).__name__}")
            outs[self._out_names[name]] = buf
        return outs

    def _check_out(self, k: int, buf: np.ndarray, gear: int) -> None:
        """InputError unless ``buf`` can take output ``k`` of ``gear`` as it is."""
        info = self.model.info
        name, dtype = info.output_names[k], info.output_dtypes[k]
        shape = info.output_shapes[gear][k]
        if tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            raise InputError(f"out[{name!r}] is {buf.dtype} {list(buf.shape)}; output {name!r} "
                             f"of gear {gear} {self._gear_values[gear]} is {np.dtype(dtype)} "
                             f"{list(shape)}")
        if isinstance(buf, DeviceBuffer):
            buf.check_genuine(f"out[{name!r}]")
            self._state.refuse_own(f"out[{name!r}]", buf)
            why = self._session.device_out_refusal(buf)
            if why is not None:
                raise InputError(f"out[{name!r}] is {buf!r}: {why}")
            return
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            raise InputError(f"out[{name!r}] must be C-contiguous and writable (got "
                             f"c_contiguous={buf.flags.c_contiguous}, "
                             f"writeable={buf.flags.writeable}): the output is written in place")

    def _check_aliasing(self, outs: dict[int, Any], arrays: list[np.ndarray]) -> None:
        """InputError naming ``out[name]`` and what it overlaps when a numpy ``out=`` array
        shares memory (``np.may_share_memory``: bounds, so a false alarm is possible, a miss
        is not) with anything this run reads or writes: either buffer of a state pair, this
        executor's own output buffers (a ``copy=False`` output kept) or staging, an input of
        this run, or another ``out=`` array. Refused, never computed through a temporary:
        the run would read what it writes, or write one memory twice (ORT binds an out=
        array in place)."""
        names = self.model.info.output_names
        given = [(k, b) for k, b in outs.items() if isinstance(b, np.ndarray)]
        used = self._memory_in_use(arrays)
        for n, (k, buf) in enumerate(given):
            earlier = [(f"out[{names[j]!r}]", b) for j, b in given[:n]]
            for what, other in used + earlier:
                if np.may_share_memory(buf, other):
                    raise InputError(
                        f"out[{names[k]!r}] shares memory with {what}, which this run reads "
                        "or writes: the output would overwrite it (or be overwritten); give "
                        "an array of its own (another executor's state is fine)")

    def _memory_in_use(self, arrays: list[np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """What one run of this executor reads or writes on the host, named for errors."""
        used = [(f"input {n!r} of this run", a) for n, a in zip(self._names, arrays, strict=True)]
        used += self._state.host_memory()
        used += [("this executor's output buffers (a copy=False output of it)", b)
                 for b in self._session.written_buffers()]
        staging = self._session.staging
        if isinstance(staging, np.ndarray):
            used.append(("this executor's staging buffer", staging))
        return used

    # ---- resident state ------------------------------------------------------------------
    @property
    def state(self) -> Mapping[str, np.ndarray]:
        """State input name -> the buffer the NEXT run reads (a writable numpy array on the
        CPU backends; empty without state). That run leaves it as it is (it writes the other
        buffer); the run after it writes into it. A pair run in place (:attr:`state_modes`)
        has one buffer, which every run writes. Give it as ``out=`` of another executor to
        hand a prefill's output over with no copy. On a device backend (acl, mindspore_lite,
        ONNX Runtime's CUDA provider) the state lives in device memory and this is a
        :class:`~gear_runtime.backends.state.DeviceBuffer` over it: ``out=`` of an executor
        on the same device writes into it there, ``.numpy()`` / ``np.asarray`` is a host
        copy, :meth:`set_state` writes it (one host-to-device copy)."""
        return StateView(self._state)

    @property
    def state_modes(self) -> dict[str, str]:
        """State input name -> how it runs: ``"double-buffered"`` (a run reads one buffer and
        writes the other; they swap after a successful run) or ``"in place"`` (one buffer,
        read and written by the run: create_executor's ``in_place_state``)."""
        return self._state.modes

    def set_state(self, name: str, value: Any) -> None:
        """Copy ``value`` (its exact shape and dtype) once into state ``name``'s buffer: an
        array (or nested lists), or a :class:`~gear_runtime.backends.state.DeviceBuffer`
        (copied on the device where the backend can: acl; else through the host)."""
        owner = self._enter("set_state")
        try:
            self._state.set(name, value)
        finally:
            self._leave(owner)

    def reset_state(self) -> None:
        """Zero every state buffer (a new sequence)."""
        owner = self._enter("reset_state")
        try:
            self._state.reset()
        finally:
            self._leave(owner)

    @property
    def state_names(self) -> dict[str, str]:
        """The executor's state pairs: input name -> output name (empty without state)."""
        return dict(self._state.names)

    @property
    def input_names(self) -> list[str]:
        """What execute takes, in order: the model's inputs less the state's."""
        return list(self._names)

    @property
    def output_names(self) -> list[str]:
        """What execute returns, in order: the model's outputs less the state's."""
        return list(self._out_names)

    def _arrays(self, inputs: Inputs) -> list[np.ndarray]:
        """Inputs as a list of arrays in input order; clear errors for missing/unknown names.
        The Python rules for what the core's ``execute`` leaves to them (nested lists, array
        subclasses, other mappings, wrong names), and for the hybrid and sink paths."""
        if type(inputs) is dict or isinstance(inputs, Mapping):
            # one lookup per input; the names are diffed only when they do not match
            try:
                values = list(map(inputs.__getitem__, self._names))
            except KeyError:
                values = []
            if len(values) != len(self._names) or len(inputs) != len(self._names):
                inputs_rules.check_names(inputs, self._names)
        elif isinstance(inputs, Sequence) and not isinstance(inputs, str | bytes):
            if len(inputs) != len(self._names):
                raise InputError(f"got {len(inputs)} inputs, the model takes {len(self._names)}"
                                 f" ({', '.join(self._names)})")
            values = list(inputs)
        else:
            raise InputError("inputs must be a dict name -> array or a list in input order "
                             f"({', '.join(self._names)}), got {type(inputs).__name__}")
        if not _NDARRAY.issuperset(map(type, values)):  # all plain arrays: nothing to convert
            for i, v in enumerate(values):
                if not isinstance(v, np.ndarray):
                    values[i] = inputs_rules.as_input_array(self._names[i], v, self._dtypes[i])
        return values

    def _trim(self, outputs: list[np.ndarray], request: tuple[int, ...]) -> list[np.ndarray]:
        """A padded run's outputs cut to the request's sizes along their dynamic axes; a
        device buffer given as ``out=`` (no view of it can be cut) is returned whole, the
        gear's shape, as the caller gave it."""
        for k, axes in enumerate(self._trim_axes):
            if axes and not isinstance(outputs[k], DeviceBuffer):
                index = [slice(None)] * outputs[k].ndim
                for axis, value in axes:
                    index[axis] = slice(0, request[value])
                outputs[k] = outputs[k][tuple(index)]
        return outputs

    def _refuse_sink_padding(self) -> None:
        raise InputError("execute(pad=True) is not possible on a model compiled with sink=True:"
                         " its device computes the dims from the input shapes, so padded inputs"
                         " would select the padded gear's dims without trimming; compile it "
                         "without sink to serve padded requests")

    def _run_dynamic(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Hybrid mode after a miss (GE's SelectExecuteGraph): the dynamic-shape graph."""
        values = self._dispatch.extract(arrays)
        self._check_preset(values, "the inputs' dynamic dims")
        logger.info("dynamic dims %s match no gear: running the dynamic-shape graph", values)
        self._check_dtypes(arrays)
        if self._guard is not None:
            self._guard.check_arrays(arrays)
        outputs = self._session.run_dynamic(arrays)
        self.last_gear = None
        self.last_dynamic_dims = self.last_request_dims = values
        return outputs

    def _run_sink(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """GetNext-sink mode: the device computes the dims; read them back, then look up."""
        self._check_dtypes(arrays)
        outputs, dims = self._session.run_sink(arrays)
        self.last_dynamic_dims = tuple(int(d) for d in dims)
        self.last_gear = None
        self._check_preset(self.last_dynamic_dims, "the dims computed on the device")
        try:
            gear = self._dispatch.match(self.last_dynamic_dims)
        except GearMismatchError as exc:
            raise GearMismatchError(f"{exc.message} (dims computed on the device from the "
                                    "input shapes)", exc.code) from None
        expected = self.model.info.output_shapes[gear]
        for k, (out, shape) in enumerate(zip(outputs, expected, strict=True)):
            if tuple(out.shape) != tuple(shape):
                raise BackendError(
                    f"output {self.model.output_names[k]!r} of gear {gear} has shape "
                    f"{tuple(out.shape)}, the gear map says {tuple(shape)}")
        self.last_gear = gear
        return outputs

    def _check_preset(self, values: tuple[int, ...], what: str) -> None:
        """Paths that bypass ``core.stage`` apply its rule: inputs must agree with set dims."""
        if self._preset is not None and values != self._preset:
            raise DynamicInputLengthError(
                f"{what} {values} disagree with the dims set with set_dynamic_* "
                f"{self._preset}")

    def _check_dtypes(self, arrays: list[np.ndarray]) -> None:
        """Paths that bypass ``core.stage`` check dtypes as it does (same message)."""
        for name, a, dt in zip(self._names, arrays, self._dtypes, strict=True):
            if a.dtype != dt:
                raise InputError(f"input '{name}' has dtype {a.dtype}, the model's input has "
                                 f"{np.dtype(dt)}")

    # ---- ownership -----------------------------------------------------------------------
    def _enter(self, call: str) -> threading.Lock:
        """Own the executor for ``call`` or raise at once (never wait): see the module doc.
        Returns the lock taken, which the caller releases (not ``self._owner``, which close()
        may have swapped meanwhile)."""
        owner = self._owner
        if not owner.acquire(False):
            self._refuse(call)
        return owner

    def _refuse(self, call: str) -> None:
        """Why ``call`` could not own the executor: it is closed (or closing), or another
        thread is in it."""
        if self._owner is _CLOSED:
            raise ClosedError(f"{call} on a closed executor: create a new one with "
                              "model.create_executor() (on a model that is still open)")
        raise ExecutorBusyError(
            f"{call}: this executor is in use by another thread right now; an executor "
            "serves one thread at a time: give each thread its own with "
            "model.create_executor()")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun (directly, or through the model's close): every
        call from then on raises ClosedError."""
        return self._owner is _CLOSED

    def close(self) -> None:
        """Free the executor's backend session; idempotent.

        From the moment close begins, every call that has not yet taken the executor, from any
        thread, raises ClosedError (never ExecutorBusyError): the executor's lock is swapped
        for :data:`_CLOSED`, which no call can take. Then close waits for the call in flight,
        if any (unlike execute, which refuses at once: a service shutting down should not
        have to retry); as no new call can take the old lock, that is at most one call's time
        however hard other threads keep calling. Called from inside one of this executor's
        own calls on that thread (a signal handler that interrupted its execute), it does not
        wait for itself: it returns at once and the call in flight finishes the close as it
        returns (:attr:`close_deferred` meanwhile).
        """
        if self._closed or self._deferred:
            return
        with self._closing:  # a second closer waits here, then finds the work done
            if self._closed or self._deferred:
                return
            owner, self._owner = self._owner, _CLOSED
            if owner.locked() and self._owned_here():
                # Waiting would wait for this very thread's call: the call in flight finishes
                # the close as it returns (every new call is refused from now on).
                self._deferred = True
                return
            owner.acquire()  # the call in flight ends; nobody else can take this lock now
            self._release_session()

    def _leave(self, owner: threading.Lock) -> None:
        """The end of an owned call: release the executor; finish a close made inside it."""
        owner.release()
        if self._deferred:
            self._finish_close()

    def _finish_close(self) -> None:
        with self._closing:
            if self._closed:
                return
            self._release_session()

    def _release_session(self) -> None:
        self._closed = True
        self._deferred = False
        self._core.set_runs(None)  # the core lets go of the session's bindings
        self._session.close()
        if self._after_close is not None:
            self._after_close()

    def _owned_here(self) -> bool:
        """Whether the calling thread is inside one of this executor's owned calls (its
        frame is on this thread's stack: a signal handler runs on top of the call it
        interrupted). Only close() asks, and only when the executor is held."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code in _OWNING_CODES and frame.f_locals.get("self") is self:
                return True
            frame = frame.f_back
        return False

    @property
    def close_deferred(self) -> bool:
        """True while a close made inside this executor's own call waits for that call."""
        return self._deferred

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def session(self) -> BackendSession:
        """This executor's backend session (read-only). Where it offers the optional bare run
        (:class:`gear_runtime.backends.bench_hooks.BenchSession`), benchmarks time it as the
        floor under ``execute``; running it directly bypasses the executor."""
        return self._session


#: The code of the calls that own the executor: what close() looks for on its own stack.
_OWNING_CODES = frozenset(getattr(Executor, name).__code__ for name in (
    "execute", "set_dynamic_dims", "set_dynamic_batch_size", "set_dynamic_image_size",
    "clear_dynamic_dims", "set_state", "reset_state", "copy_state_rows"))


class _StagedGuard:
    """A model's :class:`~gear_runtime.gearfile.kernel_guards.KernelGuard` over one executor's
    staging buffer: the guarded inputs read where the core stages them for a gear (what the
    kernel will see, padding included: views of the staging buffer, made once per gear), the
    gear's static shapes by name."""

    def __init__(self, guard: KernelGuard, model: ExecutorModel, names: Sequence[str],
                 dtypes: Sequence[Any], layout: Any, session: BackendSession) -> None:
        self._guard, self._model, self._layout = guard, model, layout
        self._names = tuple(names)
        self._staging = session.staging
        self._inputs = [(n, names.index(n), np.dtype(dtypes[names.index(n)]))
                        for n in guard.inputs]
        #: per gear: the staged views of the guarded inputs, input shapes, output shapes
        self._gears: dict[int, tuple[dict[str, np.ndarray], dict[str, Any],
                                     dict[str, Any]]] = {}

    def check(self, gear: int) -> None:
        """InputError (see KernelGuard.check) unless gear ``gear``'s staged request is safe."""
        self._guard.check(*self._of(gear))

    def check_arrays(self, arrays: Sequence[np.ndarray]) -> None:
        """The same for a hybrid miss's unstaged request (its own shapes)."""
        staged = dict(zip(self._names, arrays, strict=True))
        shapes = {n: a.shape for n, a in staged.items()}
        self._guard.check({n: staged[n] for n, _, _ in self._inputs}, shapes, {})

    def _of(self, gear: int) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
        found = self._gears.get(gear)
        if found is None:
            info = self._model.info
            shapes = {n: tuple(s) for n, s in self._model.spec.shapes(gear).items()}
            views = {}
            for name, k, dtype in self._inputs:
                at, count = self._layout.offset(gear, k), int(np.prod(shapes[name]))
                views[name] = self._staging[at:at + count * dtype.itemsize].view(
                    dtype).reshape(shapes[name])
            found = (views, shapes,
                     dict(zip(info.output_names, info.output_shapes[gear], strict=True)))
            self._gears[gear] = found
        return found


def _handed_out(outputs: Sequence[np.ndarray], copy: bool) -> list[np.ndarray]:
    """A hybrid miss's or a sink run's outputs as execute returns them: copies the caller
    keeps, or (``copy=False``) the backend's arrays themselves, in a list of their own."""
    return [o.copy() for o in outputs] if copy else list(outputs)


#: What an executor's lock becomes when its close() begins: a lock held for good, shared by
#: every closed executor, so a later call's non-blocking acquire fails and it raises
#: ClosedError (the hot path pays nothing for the closed check).
_CLOSED = threading.Lock()
_CLOSED.acquire()

_NDARRAY = frozenset({np.ndarray})
