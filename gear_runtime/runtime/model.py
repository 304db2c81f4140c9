"""GearModel: a loaded gear model (GE's DavinciModel), and ``load``.

The model is shared, read-only state: the gears, the gear -> output shape / size maps, the
staging layout, and the backend's executables (ONNX Runtime sessions sharing one copy of the
weights, an ACL model id, ...). Per-request state lives in executors, one per thread:
``model.create_executor()``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from gear_runtime import arguments
from gear_runtime.backends import FACTS, BackendModel, facts, open_model
from gear_runtime.backends.base import StateSessions
from gear_runtime.errors import (
    ClosedError,
    GearFileError,
    GearMismatchError,
    InputError,
    MemoryBudgetError,
    PaddingUnsafeError,
)
from gear_runtime.gearfile.format import ACL_DYNAMIC_TENSOR_NAME
from gear_runtime.gearfile.info import ModelInfo, axes_from_shapes
from gear_runtime.gearfile.kernel_guards import KernelGuard, find_guards
from gear_runtime.gearfile.padding import PaddingVerdict
from gear_runtime.runtime import core
from gear_runtime.runtime.dispatch import GearDispatcher
from gear_runtime.runtime.executor import Executor
from gear_runtime.runtime.state import plan_state
from gear_runtime.spec import GearSpec

#: GE's default ``ge.exec.input_fusion_size``: inputs up to this many bytes share the one
#: merged host-to-device copy.
DEFAULT_INPUT_FUSION_SIZE = core.DEFAULT_FUSION_SIZE

#: Largest host buffer (bytes) one gear may ask for: an input's slot, the whole staging buffer,
#: or one output. Every executor allocates these up front, so a gear file asking for more (a
#: crafted or mistyped gear of seq 2**30 asks for hundreds of GiB) is refused at load with a
#: GearFileError naming the gear, the buffer and the size, instead of failing later in
#: ``create_executor`` with MemoryError. 16 GiB: far above any gear these models serve on
#: one device, far below what takes a host down. Override per load with
#: ``load(..., max_buffer_bytes=N)`` or per process with the environment variable named by
#: :data:`MAX_BUFFER_BYTES_ENV`; the keyword wins over the variable.
MAX_GEAR_BUFFER_BYTES = 16 * 2**30

#: Environment variable that overrides :data:`MAX_GEAR_BUFFER_BYTES` (a positive integer).
MAX_BUFFER_BYTES_ENV = "GEAR_RUNTIME_MAX_BUFFER_BYTES"


#: Environment variable: the most host memory (bytes) one executor's buffers -- staging,
#: outputs and resident state, together -- may take; ``gear-runtime run`` / ``bench`` count
#: their synthetic inputs in it too. Default: :func:`default_memory_budget`.
MAX_BYTES_ENV = "GEAR_RUNTIME_MAX_BYTES"


def default_memory_budget() -> int:
    """Half the host's physical memory (each buffer may be under the per-buffer limit while
    together they take the host down: the kernel's OOM killer picks a process, maybe not
    this one); 64 GiB where the host does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # no sysconf names on this platform
        return 64 * 2**30


def memory_budget(max_bytes: int | None = None) -> int:
    """The memory budget in force: ``max_bytes`` when given, else :data:`MAX_BYTES_ENV` when
    set, else :func:`default_memory_budget`. InputError for a value that is not a positive
    integer, naming where it came from."""
    return _bytes_limit(max_bytes, "max_bytes", MAX_BYTES_ENV, default_memory_budget)


def check_budget(needed: int, budget: int, what: str, how: str) -> None:
    """MemoryBudgetError naming ``what`` needs ``needed`` bytes, the ``budget`` and ``how`` to
    raise it, when ``needed`` exceeds ``budget``. Called before allocating."""
    if needed > budget:
        raise MemoryBudgetError(
            f"{what} need {needed} bytes ({needed / 2**30:.2f} GiB) in total, more than the "
            f"memory budget of {budget} bytes ({budget / 2**30:.2f} GiB; default: half the "
            f"host's memory); raise it with {how} or {MAX_BYTES_ENV}=N if this is meant")


def load(path: str, backend: str = "onnxruntime", *,
         input_fusion_size: int = DEFAULT_INPUT_FUSION_SIZE, max_buffer_bytes: int | None = None,
         share_weights_with: GearModel | None = None, pad_safe: bool | None = None,
         **options: Any) -> GearModel:
    """Load the gear model at ``path`` on ``backend``.

    ``options`` go to the backend (e.g. ``providers=`` for onnxruntime, ``config=`` for
    mindspore_lite, ``device_id=`` for acl). ``input_fusion_size`` mirrors GE's
    ``ge.exec.input_fusion_size`` (negative turns merging off). ``max_buffer_bytes``: the
    largest buffer one gear may ask for (default :data:`MAX_GEAR_BUFFER_BYTES`, or the
    environment variable :data:`MAX_BUFFER_BYTES_ENV`); more is a GearFileError.
    ``share_weights_with``: a model loaded before (same backend; onnxruntime's CPU here)
    whose weights equal in dtype, shape and bytes this model uses instead of its own copy
    (a prefill and its decode). Executors of the other model made before keep their own
    copy until they close: create them after loading both to hold the weights once.
    ``pad_safe``: your declaration whether ``execute(pad=True)`` is exact for this model;
    it overrides the verdict the gear file records (``check-padding --record``). A model
    that is not (declared ``False``, or recorded UNSAFE and not declared) is never padded:
    a request that matches no gear exactly is :class:`PaddingUnsafeError` (see
    :attr:`GearModel.pad_safe`).
    """
    path = arguments.path("path", path)
    if pad_safe is not None:
        pad_safe = arguments.flag("pad_safe", pad_safe)
    if share_weights_with is not None:
        options["share_weights_with"] = _weights_source(share_weights_with, backend)
    fusion = arguments.integer("input_fusion_size", input_fusion_size, arguments.INT64_MIN,
                               arguments.INT64_MAX, unit=" of bytes (negative: no merging)")
    limit = buffer_limit(max_buffer_bytes)  # a bad limit fails before the file is opened
    model = GearModel(open_model(path, backend, **options), input_fusion_size=fusion,
                      max_buffer_bytes=limit)
    model.path, model.declared_pad_safe = path, pad_safe
    return model


def _weights_source(other: object, backend: str) -> BackendModel:
    """The backend model ``share_weights_with=other`` shares with; InputError unless it is
    an open GearModel on ``backend``, and that backend shares weights."""
    if not isinstance(other, GearModel):
        raise InputError(f"share_weights_with must be a GearModel (gear_runtime.load), got "
                         f"{type(other).__name__}")
    if other.closed:
        raise ClosedError("share_weights_with: that model is closed")
    if other.backend != backend or not facts(backend).shares_weights:
        sharing = ", ".join(b for b, f in FACTS.items() if f.shares_weights)
        raise InputError(f"share_weights_with: weights are shared between two models of one "
                         f"backend that shares them ({sharing}); this one is on {backend!r}, "
                         f"the other on {other.backend!r}")
    return other.backend_model


def buffer_limit(max_buffer_bytes: int | None = None) -> int:
    """The buffer limit in force: ``max_buffer_bytes`` when given, else the environment
    variable :data:`MAX_BUFFER_BYTES_ENV` when set, else :data:`MAX_GEAR_BUFFER_BYTES`.
    InputError for a value that is not a positive integer, naming where it came from."""
    return _bytes_limit(max_buffer_bytes, "max_buffer_bytes", MAX_BUFFER_BYTES_ENV,
                        lambda: MAX_GEAR_BUFFER_BYTES)


def _bytes_limit(given: object, keyword: str, env: str, default: Any) -> int:
    """A byte limit: ``given`` (the keyword ``keyword``), else the environment variable
    ``env`` when set, else ``default()``; InputError naming the source unless positive."""
    if given is not None:
        value, where = given, keyword
    elif os.environ.get(env, "").strip():
        value, where = os.environ[env].strip(), env
        value = int(value) if value.isascii() and value.isdigit() else value
    else:
        return int(default())
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where} must be a positive integer number of bytes, got {value!r}")
    return value


class GearModel:
    """A gear model loaded on one backend (thread-safe; executors are per thread)."""

    def __init__(self, backend_model: BackendModel,
                 input_fusion_size: int = DEFAULT_INPUT_FUSION_SIZE,
                 max_buffer_bytes: int | None = None) -> None:
        """Wrap ``backend_model``; GearFileError (and the backend model closed) when a gear's
        buffers exceed ``max_buffer_bytes`` (see :func:`buffer_limit`)."""
        self._backend = backend_model
        self.info: ModelInfo = backend_model.info
        self.spec: GearSpec = self.info.spec
        self._closed = False
        self._lock = threading.Lock()  # guards _closed and _executors
        self._executors: weakref.WeakSet[Executor] = weakref.WeakSet()
        try:
            self.max_buffer_bytes = buffer_limit(max_buffer_bytes)
            self._fusion = input_fusion_size
            self.layout = self._plan_layout(input_fusion_size)
            self._output_axes = self._find_output_axes()
            self._dispatcher = GearDispatcher(self.spec)
            #: the checks of request values a kernel turns into memory offsets (an attention
            #: mask's lengths): every executor makes them before each run; None: none needed
            self.guard: KernelGuard | None = find_guards(*graph) \
                if (graph := backend_model.guard_graph()) is not None else None
        except BaseException:
            backend_model.close()
            raise
        self._profile: tuple[float, ...] | None = None
        #: the file loaded (named by a refused padding); None for a model made otherwise
        self.path: str | None = None
        #: ``load(pad_safe=)``: the user's declaration, over the recorded verdict
        self.declared_pad_safe: bool | None = None

    @property
    def padding_verdict(self) -> PaddingVerdict | None:
        """The verdict the gear file records (``check-padding --record``); None: none."""
        return self.info.padding

    @property
    def pad_safe(self) -> bool | None:
        """Whether ``execute(pad=True)`` may pad this model: the declaration
        (``load(pad_safe=)``), else the recorded verdict, else None (unknown: padded, as
        before; ``serve --pad`` / ``--sequence-start`` warn)."""
        if self.declared_pad_safe is not None:
            return self.declared_pad_safe
        return None if self.info.padding is None else self.info.padding.safe

    def _find_output_axes(self) -> tuple[dict[int, int], ...]:
        """What the compiler recorded (in the model info), else what the per-gear output
        shapes alone show (backends reading .om / MindIR files have no record)."""
        axes = self.info.output_dynamic_axes
        if axes is None:
            axes = axes_from_shapes(self.spec.gears, self.info.output_shapes)
        return tuple(dict(a) for a in axes)

    def _plan_layout(self, input_fusion_size: int,
                     staged: Sequence[int] | None = None) -> Any:
        """One layout for every executor: computed once here, never on the hot path. The
        backend's device memory rules (alignment, padding) shape it; the user's fusion size
        decides what merges. Every buffer is checked against the limit first. ``staged``:
        the inputs it covers (an executor with resident state stages only the others)."""
        nbytes = self._input_nbytes()
        self._check_outputs()
        if staged is not None:
            nbytes = [[row[i] for i in staged] for row in nbytes]
        options = {**self._backend.layout_options, "fusion_size": input_fusion_size}
        dims = self.spec.values_per_gear if self._backend.stages_dims else 0
        layout = core.plan_layout(nbytes, dims, **options)
        for g in range(layout.gear_count):  # the staging buffer is as large as its largest gear
            ends = [layout.offset(g, i) + layout.nbytes(g, i) for i in range(layout.input_count)]
            end = max([*ends, layout.dims_offset(g) + layout.dims_nbytes])
            self._check_buffer(g, "the staging buffer (its inputs, aligned, and the dims)", end)
        self._check_buffer(None, "the staging buffer", int(layout.total_bytes))
        return layout

    def _input_nbytes(self) -> list[list[int]]:
        """[gear][input] bytes (exact integers: ModelInfo.input_nbytes), each within the
        limit."""
        nbytes = self.info.input_nbytes()
        for g, row in enumerate(nbytes):
            for (name, shape), size in zip(self.spec.shapes(g).items(), row, strict=True):
                self._check_buffer(g, f"input {name!r} of shape {shape}", size)
        return nbytes

    def _check_outputs(self) -> None:
        for g, shapes in enumerate(self.info.output_shapes):
            for k, (name, shape) in enumerate(zip(self.info.output_names, shapes, strict=True)):
                self._check_buffer(g, f"output {name!r} of shape {tuple(shape)}",
                                   self.info.output_size(g, k))

    def _check_buffer(self, gear: int | None, what: str, size: int) -> None:
        if size > self.max_buffer_bytes:
            where = "" if gear is None else f"gear {gear} {self.spec.gears[gear]}: "
            raise GearFileError(
                f"{where}{what} needs {size} bytes ({size / 2**30:.1f} GiB), more than the "
                f"limit of {self.max_buffer_bytes} bytes; raise it with "
                f"load(..., max_buffer_bytes=N) or {MAX_BUFFER_BYTES_ENV} if this is meant")

    # ---- what the model is ---------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def shared_weights(self) -> tuple[int, int]:
        """(count, bytes) of the weights this model uses from another's
        (``load(..., share_weights_with=)``); (0, 0) when none."""
        shared = getattr(self._backend, "shared_weights", None)
        return (0, 0) if shared is None else (shared.count, shared.nbytes)

    @property
    def backend_model(self) -> BackendModel:
        """The backend's model (read-only). Where it offers the optional benchmark hooks
        (:class:`gear_runtime.backends.bench_hooks.BenchModel`), benchmarks compare with
        them."""
        return self._backend

    @property
    def gear_count(self) -> int:
        return self.spec.gear_count

    @property
    def gears(self) -> list[tuple[int, ...]]:
        return list(self.spec.gears)

    @property
    def mode(self) -> str:
        return self.spec.mode

    @property
    def input_names(self) -> list[str]:
        return list(self.spec.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self.info.output_names)

    @property
    def hybrid(self) -> bool:
        return self.info.hybrid

    @property
    def sink(self) -> bool:
        return self.info.sink

    def gear_of(self, gear: int | Sequence[int]) -> int:
        """Index of ``gear``: an index, or a gear's dynamic values. Raises, never guesses."""
        if isinstance(gear, int | np.integer) and not isinstance(gear, bool):
            return self.spec.gear_number(gear, "model")
        if isinstance(gear, str | bytes) or not isinstance(gear, Sequence | np.ndarray):
            raise InputError(f"gear must be an index or a tuple of dynamic values, got "
                             f"{gear!r}")
        return self._dispatcher.match(gear)  # integers only: 40.7 is no gear 40

    def output_shape(self, gear: int | Sequence[int], index: int) -> tuple[int, ...]:
        """Output ``index``'s shape in ``gear`` (GE's gear -> output shape map; never empty)."""
        return self.info.output_shape(self.gear_of(gear), index)

    def output_size(self, gear: int | Sequence[int], index: int) -> int:
        """Output ``index``'s size in bytes in ``gear`` (GE's gear -> output size map)."""
        return self.info.output_size(self.gear_of(gear), index)

    @property
    def output_dynamic_axes(self) -> list[dict[int, int]]:
        """Per output, ``{axis: index of the dynamic value its size follows}`` (logits
        ``(1, seq, vocab)`` of a seq gear model: ``{1: 0}``): the axes a padded run's outputs
        are trimmed along. An output with ``{}`` follows no value and is returned whole."""
        return [dict(a) for a in self._output_axes]

    # ---- which gear (the dispatcher) and its costs ------------------------------------------
    @property
    def dispatcher(self) -> GearDispatcher:
        """THE answer to "which gear" for this model (:mod:`gear_runtime.runtime.dispatch`):
        exact match, the cheapest covering gear by :meth:`gear_costs`, the batch table the
        server batches to. Executors are configured from the dispatcher current when they
        are created."""
        return self._dispatcher

    def attach_profile(self, latencies: Any) -> None:
        """Measured latency per gear, used as the gear cost by executors created after
        this call (and by the server's batch table): a :class:`gear_runtime.bench.BenchReport`
        (its ``execute`` p50), a sequence with one latency per gear, or a mapping gear
        (index or values) -> latency. Every gear needs a finite latency >= 0 (InputError
        otherwise). ``None`` detaches. Each call makes a new :attr:`dispatcher`."""
        profile = None if latencies is None else self._latencies(latencies)
        self._dispatcher = GearDispatcher(self.spec, profile)
        self._profile = profile

    def _latencies(self, latencies: Any) -> tuple[float, ...]:
        if hasattr(latencies, "gears") and not isinstance(latencies, Mapping):  # BenchReport
            latencies = {g.gear: g.execute.p50 for g in latencies.gears}
        if isinstance(latencies, Mapping):
            by_gear = {self.gear_of(k): v for k, v in latencies.items()}
            missing = [self.spec.gears[g] for g in range(self.gear_count) if g not in by_gear]
            if missing:
                raise InputError(f"the profile has no latency for gear(s) "
                                 f"{', '.join(map(str, missing))}")
            latencies = [by_gear[g] for g in range(self.gear_count)]
        if isinstance(latencies, str | bytes) or not isinstance(latencies, Iterable):
            raise InputError(f"a profile is a BenchReport, a sequence with one latency per "
                             f"gear or a mapping gear -> latency, got {arguments.shown(latencies)}")
        values = list(latencies)
        if len(values) != self.gear_count:
            raise InputError(f"a profile needs one finite latency >= 0 per gear "
                             f"({self.gear_count}), got {len(values)}: {arguments.shown(values)}")
        return tuple(arguments.real(f"the latency of gear {g} {self.spec.gears[g]}", v)
                     for g, v in enumerate(values))

    @property
    def profile(self) -> tuple[float, ...] | None:
        """The attached per-gear latencies, or None."""
        return self._profile

    def gear_costs(self) -> list[float]:
        """Each gear's cost when padding chooses among covering gears (the dispatcher's):
        its measured latency when a profile is attached (:meth:`attach_profile`), else its
        total input elements."""
        return list(self._dispatcher.costs)

    # ---- ACL-style queries (docs/ge-notes.md sections 8 and 12) ------------------------------
    def get_input_dynamic_gear_count(self) -> int:
        """aclmdlGetInputDynamicGearCount(desc, -1)."""
        return self.gear_count

    def get_input_dynamic_dims(self) -> list[tuple[int, ...]]:
        """aclmdlGetInputDynamicDims(desc, -1): per gear, all inputs' shapes flattened."""
        return [self.spec.full_dims(i) for i in range(self.gear_count)]

    def get_dynamic_batch(self) -> list[int]:
        """aclmdlGetDynamicBatch: the batch gears (empty unless dynamic batch mode)."""
        return [g[0] for g in self.spec.gears] if self.mode == "batch" else []

    def get_dynamic_hw(self) -> list[tuple[int, int]]:
        """aclmdlGetDynamicHW: the (h, w) gears (empty unless dynamic image size mode)."""
        return [(g[0], g[1]) for g in self.spec.gears] if self.mode == "image_size" else []

    def get_input_index_by_name(self, name: str) -> int:
        """aclmdlGetInputIndexByName; ``ascend_mbatch_shape_data`` is the last input."""
        if name == ACL_DYNAMIC_TENSOR_NAME:
            return len(self.spec.input_names)
        try:
            return self.spec.input_names.index(name)
        except ValueError:
            raise InputError(f"the model has no input {name!r}; inputs: "
                             f"{', '.join([*self.spec.input_names, ACL_DYNAMIC_TENSOR_NAME])}"
                             ) from None

    # ---- running -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def create_executor(self, *, pad_values: Mapping[str, Any] | None = None,
                        state: Mapping[str, str] | None = None,
                        in_place_state: bool | Iterable[str] = False,
                        max_bytes: int | None = None,
                        pad_safe: bool | None = None) -> Executor:
        """A new executor: its own staging buffer, bindings and dims; one per thread.
        ``pad_values``: input name -> the value ``execute(pad=True)`` fills padded positions
        of that input with (default 0; e.g. ``{"input_ids": 151643, "attention_mask": 0}``).
        ``state``: input name -> output name, kept resident between runs (a decode's KV
        cache: see :mod:`gear_runtime.runtime.state`), checked here (InputError naming the
        pair). ``in_place_state``: True, or the state inputs, to keep ONE buffer per pair,
        read and written by the same run, where the graph is built for it (GroupQueryAttention
        with a shared past / present: no copy of the cache per step); InputError naming the
        pair where it is not. ``ex.state_modes`` says which mode each pair runs.
        ``max_bytes``: the most host memory the executor's buffers (staging, outputs, state)
        may take together (default :func:`memory_budget`: ``GEAR_RUNTIME_MAX_BYTES``, else
        half the host's memory); more is a MemoryBudgetError, before anything is allocated.
        ``pad_safe``: this executor's declaration over the model's :attr:`pad_safe`; an
        executor of a model not padding-safe runs ``execute(pad=True)`` only on a gear the
        request matches exactly (a hybrid model's miss: its dynamic-shape graph, unpadded)
        and refuses any other with :class:`PaddingUnsafeError` (145013), never padded.
        ClosedError (145003) once the model is closed."""
        budget = memory_budget(max_bytes)  # a bad value fails before anything else
        safe = self.pad_safe if pad_safe is None else arguments.flag("pad_safe", pad_safe)
        cls = Executor if safe is not False else _UnpaddedExecutor
        plan, layout = None, self.layout
        if state is None and in_place_state is not False and in_place_state is not None:
            raise InputError("in_place_state says how state= pairs are kept: give state= "
                             "too (input name -> output name)")
        if state is not None:
            graph = self._backend.state_graph() if in_place_state is not False else None
            plan = plan_state(self.info, state, in_place_state, graph)
            why = self._backend.state_refusal()
            if why is None and any(p.rows for p in plan.pairs) and \
                    not self._backend.supports_state_rows:
                why = (f"state {next(p.input_name for p in plan.pairs if p.rows)!r} has rows "
                       "(its axis 0 follows the gear): the leading rows of one buffer are "
                       f"bound per gear on onnxruntime's CPU only, not on {self.backend!r}")
            if why is not None:
                raise InputError(why)
            layout = self._plan_layout(self._fusion, plan.inputs)
        check_budget(self.executor_bytes(layout, plan), budget,
                     "this executor's buffers (staging, outputs, state)",
                     "create_executor(max_bytes=N)")
        with self._lock:
            if self._closed:
                raise ClosedError("create_executor on a closed model: load it again with "
                                  "gear_runtime.load()")
            # with a plan, state_refusal() said above that the backend takes state=
            session = (self._backend.create_session(layout) if plan is None
                       else cast(StateSessions, self._backend).create_session(layout, state=plan))
            try:
                executor = cls(self, session, pad_values, plan, layout)
                if isinstance(executor, _UnpaddedExecutor):
                    executor.why_unpadded = _why_unpadded(self, pad_safe)
            except BaseException:
                session.close()
                raise
            self._executors.add(executor)
            return executor

    def executor_bytes(self, layout: Any = None, plan: Any = None) -> int:
        """The host bytes an executor allocates up front: its staging buffer (``layout``,
        default the model's), each output's buffer at its largest gear (a state output has
        none) and the state's buffers (``plan``: two per pair, one in place)."""
        layout = self.layout if layout is None else layout
        state_out = set() if plan is None else {p.output_index for p in plan.pairs}
        outputs = sum(max(self.info.output_size(g, k) for g in range(self.gear_count))
                      for k in range(len(self.info.output_names)) if k not in state_out)
        state = 0 if plan is None else sum(p.nbytes * (1 if p.in_place else 2)
                                           for p in plan.pairs)
        return int(layout.total_bytes) + int(outputs) + int(state)

    def close(self) -> None:
        """Unload the model (device memory, sessions). Idempotent.

        Closes this model's executors first, each after its call in flight (if any) ends, so
        that no execute runs on freed buffers (from inside such a call on its own thread, a
        signal handler's, close returns at once and the backend closes when the call ends);
        then every use of them, and :meth:`create_executor`, raises ClosedError. What the
        model is (gears, shapes, names) stays readable.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executors = list(self._executors)
        for executor in executors:
            executor.close()
        deferred = [e for e in executors if e.close_deferred]
        if not deferred:
            self._backend.close()
            return
        # closed from inside an executor's own call (a signal handler): the backend goes
        # when the last such call has returned, never under it
        def after_close() -> None:
            if not any(e.close_deferred for e in deferred):
                self._backend.close()

        for e in deferred:
            e._after_close = after_close

    def __enter__(self) -> GearModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GearModel(backend={self.backend!r}, mode={self.mode!r}, "
                f"inputs={self.input_names}, gears={self.gears}, hybrid={self.hybrid}, "
                f"sink={self.sink})")


class _UnpaddedExecutor(Executor):
    """The executor of a model that is not padding-safe (:attr:`GearModel.pad_safe` False):
    ``execute(pad=True)`` runs a request unpadded -- on the gear it matches exactly, or a
    hybrid model's dynamic-shape graph -- and refuses one that needs padding with
    :class:`PaddingUnsafeError` saying why, never a silently wrong answer."""

    why_unpadded = "its padding is not safe"

    def execute(self, inputs: Any, *, pad: bool = False, copy: bool = True,
                out: Mapping[str, np.ndarray] | None = None,
                first_row: int = 0) -> list[np.ndarray]:
        if pad is not True:
            return super().execute(inputs, pad=pad, copy=copy, out=out, first_row=first_row)
        try:
            return super().execute(inputs, pad=False, copy=copy, out=out, first_row=first_row)
        except PaddingUnsafeError:
            raise
        except GearMismatchError:
            gears = "; ".join(",".join(map(str, g)) for g in self.model.gears)
            raise PaddingUnsafeError(
                f"execute(pad=True) refused: {self.why_unpadded}, so it is never padded, and "
                f"this request matches no gear exactly (the gears: {gears}). Send a "
                "request of a gear's exact shape, re-export the model padding-safe (e.g. a "
                "prefill that masks pad positions out of its recurrent / conv state) and "
                "re-run gear-runtime check-padding --record, or declare pad_safe=True if "
                "padding is right for your use") from None


def _why_unpadded(model: GearModel, declared: bool | None) -> str:
    """Why ``model``'s executor does not pad: the declaration or the recorded verdict."""
    name = f"model {model.path}" if model.path else "this model"
    if declared is False:
        return f"{name} is declared pad_safe=False (create_executor)"
    if model.declared_pad_safe is False:
        return f"{name} is declared pad_safe=False (load)"
    verdict = model.padding_verdict
    what = verdict.describe() if verdict is not None else "UNSAFE"
    return f"{name} has the padding verdict {what}"
