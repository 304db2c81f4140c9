"""ONNX Runtime backend: gear files on CPU, and on CUDA with one CUDA graph per gear.

Shape of the backend (docs/architecture.md says why; the figures come from benchmarks/):

* ONE ``InferenceSession`` per model, over the source graph the gear file keeps, with ORT's
  weight prepacking ON: the weights are loaded (or mapped, from the data file beside the gear
  file) and prepacked once, whatever the number of gears. Measured on ORT CPU: per-gear static
  sessions are no faster than one dynamic session, and per-gear sessions cannot share
  prepacked weights through ORT's Python API (prepacking off is slower at real sizes:
  docs/benchmarks.md, "Figures behind choices in the code").
* Per executor, one IO binding per gear on that session: gear ``g``'s inputs bound to their
  offsets in the executor's staging buffer with the gear's static shapes, its outputs to
  preallocated arrays of the gear's output shapes (ORT refuses a run whose output shape
  differs from a bound buffer's, so a wrong shape can never come back silently). A run is
  one ``run_with_iobinding`` through the C binding (the public Python wrapper adds tens of us
  of checks per call). On CPU the staging buffer is what the session reads: no further copy.
* So a gear runs as the source graph at its static shapes. The per-gear ``Batch_<i>``
  branches stay in the file (they give the gear -> output shape maps, as in DavinciModel;
  the compiler's tests run them against the source) and are never run here; nor is the int32
  dims buffer read (``stages_dims = False``: the layout has none).
* CUDA: the merged span of the staging buffer goes to the device in ONE copy; inputs too large
  to merge are copied one by one (GE's CopyInputDataWithMergeH2D). With ``cuda_graph=True``
  every (executor, gear) pair gets its own graph id in the one session (run option
  ``gpu_graph_id``), captured when the executor is created, largest gear first. The CUDA-only
  pieces (provider options, capture gate, device staging) live in ``onnxruntime_cuda.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnx
import onnxruntime as ort

from gear_runtime import arguments
from gear_runtime.backends import shared_weights
from gear_runtime.backends.base import (
    BackendModel,
    BackendSession,
    DeviceBuffer,
    DirectRun,
    HostState,
    aligned_buffer,
    output_buffers,
    split_sink_outputs,
)
from gear_runtime.backends.bench_hooks import BenchModel, BenchSession
from gear_runtime.backends.capture_check import capture_hazards
from gear_runtime.backends.onnxruntime_cuda import (
    CUDA,
    GRAPH_ID_KEY,
    DeviceStaging,
    DeviceState,
    cuda_available,
    cuda_exclusive,
    cuda_shared,
    gpu_present,
    is_capture_refusal,
    pinned_staging,
    provider_list,
)
from gear_runtime.backends.output_pool import FRESH_OUTPUT_MIN_BYTES, OutputPool
from gear_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    DataRefusedError,
    InputError,
)
from gear_runtime.gearfile import passthrough
from gear_runtime.gearfile.reader import GearFile, read_gear_file
from gear_runtime.spec.rules import PRECISION_LOWERED

#: ORT session config key: the folder external data is resolved against for a model given as
#: bytes (the gear file's folder, never the working directory).
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
#: The oldest ONNX Runtime with everything this backend uses: EXTERNAL_FOLDER_KEY (a gear file
#: with a data file does not load without it) came in 1.21.0 (ORT PR 23557), ``gpu_graph_id``
#: (one CUDA graph per gear, else every gear replays the first one's) in 1.18.0 (PR 19636).
#: Checked in the wheels' own binaries (docs/cuda.md); pyproject.toml states the same floor.
ORT_FLOOR = (1, 21, 0)


def open_model(path: str, providers: Sequence[Any] | None = None, *,
               cuda_graph: bool = False, cuda_graph_fallback: bool = True,
               device_id: int = 0, intra_op_num_threads: int | None = None,
               session_config: dict[str, str] | None = None,
               share_weights_with: OrtModel | None = None) -> OrtModel:
    """Load a gear file made by ``gear_runtime.compile`` (or a static ONNX model).

    ``providers``: ORT execution providers (default CPU). Asking for CUDA needs
    onnxruntime-gpu and a GPU; ``device_id`` is passed to the CUDA provider's options (a
    conflicting ``device_id`` there is refused); ``cuda_graph=True`` captures one CUDA graph
    per (executor, gear). A model CUDA graphs cannot run right (control flow, an input's value
    feeding a shape computation, nodes ORT puts on the CPU: :mod:`.capture_check`) runs
    without graphs and a RuntimeWarning says why (``cuda_graph_fallback=True``, the default),
    or is refused with a BackendError (``cuda_graph_fallback=False``); either way no output is
    ever computed by a graph that froze a value. ``session_config``: extra ORT session config
    entries. ``share_weights_with``: another OrtModel whose equal weights this one uses
    instead of a copy (:mod:`.shared_weights`). BackendUnavailableError when the installed
    onnxruntime is older than ORT_FLOOR.
    """
    providers = provider_items(providers)
    if intra_op_num_threads is not None:
        intra_op_num_threads = arguments.integer("intra_op_num_threads", intra_op_num_threads,
                                                 0, MAX_THREADS, unit=" (0: ORT's default)")
    config = None if session_config is None else arguments.text_mapping("session_config",
                                                                         session_config)
    return OrtModel(read_gear_file(path), providers=providers,
                    cuda_graph=arguments.flag("cuda_graph", cuda_graph),
                    device_id=arguments.integer("device_id", device_id, 0, arguments.INT32_MAX),
                    intra_op_num_threads=intra_op_num_threads, session_config=config,
                    cuda_graph_fallback=arguments.flag("cuda_graph_fallback",
                                                       cuda_graph_fallback),
                    share_weights_with=share_weights_with)


#: Inputs at least this large are read by ORT where the caller has them (CPU, a request that
#: needs no padding) instead of being copied into staging: above it, the copy costs more than
#: pointing a binding at the array, and below it less (benchmarks/bench_inputs.py; the
#: figures: docs/benchmarks.md, "Figures behind choices in the code").
IN_PLACE_INPUT_BYTES = 512 * 1024


@dataclass
class _Placed:
    """A binding for runs with inputs bound in place (OrtSession.run_gear_in_place)."""

    binding: Any
    arg: Any  # what the run call takes of it
    bound: list[int]  # per output: the pooled block it is bound to (0: none yet)
    moved: dict[int, int]  # staged input -> the address it points at, where not staging


#: Most ORT threads one session may ask for: far above any host's cores, far below what a
#: typo (2**40) would try to start.
MAX_THREADS = 4096


def provider_items(providers: object) -> list[str | tuple[str, dict[str, str]]] | None:
    """``providers`` as ORT takes them -- a list of provider names or (name, options)
    pairs, options a dict whose values ORT reads as strings -- or None (the default, CPU).
    InputError naming the item otherwise: a bare string (it would read as a list of its
    letters), a number, a pair of anything else."""
    if providers is None:
        return None
    if isinstance(providers, str | bytes) or not isinstance(providers, Sequence):
        raise InputError(f"providers must be a list of provider names or (name, options) "
                         f"pairs, e.g. ['CPUExecutionProvider'], got {arguments.shown(providers)}")
    out: list[str | tuple[str, dict[str, str]]] = []
    for item in providers:
        if isinstance(item, str):
            out.append(item)
            continue
        if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], Mapping)
                and all(isinstance(k, str) and isinstance(v, str | int | float | bool)
                        for k, v in item[1].items())):
            out.append((item[0], {k: str(v) for k, v in item[1].items()}))
            continue
        raise InputError(f"providers: {arguments.shown(item)} is neither a provider name nor "
                         "a (name, {option: value}) pair")
    return out


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "1.22.0.dev20250101" -> (1, 22, 0)."""
    numbers = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(numbers)


def check_ort_version(version: str | None = None) -> None:
    """BackendUnavailableError naming the installed and the needed version unless
    ``version`` (default: the installed onnxruntime's) is at least :data:`ORT_FLOOR`."""
    installed = ort.__version__ if version is None else version
    if version_tuple(installed) < ORT_FLOOR:
        need = ".".join(map(str, ORT_FLOOR))
        raise BackendUnavailableError(
            f"onnxruntime {installed} is installed; the onnxruntime backend needs "
            f"onnxruntime >= {need} (a gear file's data file is found through a session option "
            f"that came in 1.21.0, one CUDA graph per gear needs 1.18.0): pip install -U "
            f"'onnxruntime>={need}' (or onnxruntime-gpu)")


def check_providers(providers: Sequence[Any] | None) -> list[str]:
    """The providers' names (default CPU); a clear error for one this ORT build lacks."""
    names = [p[0] if isinstance(p, tuple) else str(p) for p in (providers or [])]
    names = names or ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    missing = [p for p in names if p not in available]
    if missing:
        raise BackendError(
            f"ONNX Runtime here has no {', '.join(missing)} (available: {', '.join(available)})"
            "; for CUDA, onnxruntime-gpu in place of onnxruntime (pip uninstall -y onnxruntime "
            f"&& pip install 'onnxruntime-gpu>={'.'.join(map(str, ORT_FLOOR))}': the two share "
            "one import package) on a machine with an NVIDIA GPU")
    return names


class OrtModel(BackendModel, BenchModel):
    """ONE ORT session over the gear file's source graph (or its sink graph). Offers the
    benchmark hooks (:class:`~gear_runtime.backends.bench_hooks.BenchModel`)."""

    name = "onnxruntime"
    #: The one session runs the source graph at the gear's static shapes (bound per gear):
    #: no graph input reads ascend_mbatch_shape_data, so nothing is staged for it.
    stages_dims = False

    def __init__(self, gear_file: GearFile, providers: Sequence[Any] | None, cuda_graph: bool,
                 device_id: int, intra_op_num_threads: int | None,
                 session_config: dict[str, str] | None,
                 cuda_graph_fallback: bool = True,
                 share_weights_with: OrtModel | None = None) -> None:
        check_ort_version()
        self.file = gear_file
        self.gear_file_path = gear_file.path
        names = check_providers(providers)
        self.on_cuda = names[0] == CUDA
        if cuda_graph and not self.on_cuda:
            raise BackendError("cuda_graph=True needs providers=['CUDAExecutionProvider', ...]")
        self.device = ("cuda", device_id) if self.on_cuda else ("cpu", 0)
        self._providers, self._device_id = providers, device_id
        self._fallback = cuda_graph_fallback
        self._threads = intra_op_num_threads
        self._config = dict(session_config or {})
        self.info = gear_file.info
        #: whether the CUDA EP may round float32 MatMul/Conv to TF32 (only when the gear
        #: file's precision_mode lowers float32 anyway)
        self.tf32 = self._precision(self.info.spec.precision_mode)
        #: why this model runs without the CUDA graphs it was asked for (None: it was not
        #: asked, or it runs with them)
        self.cuda_graph_refused: str | None = None
        self._use_graphs(cuda_graph)
        if self.info.sink:
            assert gear_file.model_bytes is not None
            graph = gear_file.model_bytes  # runnable as it is; the dims come out last
            proto = onnx.load_from_string(graph) if self.cuda_graph else None
        else:
            proto, graph = self._source_graph()
        if self.cuda_graph and proto is not None:
            hazards = capture_hazards(proto.graph)
            if hazards:
                self._without_graphs("; ".join(hazards))
        self._store: shared_weights.WeightStore | None = None
        self._store_lock = threading.Lock()
        # ORT's CUDA EP: with CUDA graphs on, Run() may not be called on one session from
        # several threads at once (docs "Using CUDA Graphs"), so every run on it is exclusive.
        self._graph_lock = threading.Lock()
        #: the weights this model's session takes from another model's (none: not shared)
        self.shared_weights = shared_weights.SharedWeights({}, 0)
        if share_weights_with is not None:
            self.shared_weights = shared_weights.match(
                share_weights_with.weight_store(), self._weights(proto))
        # ORT reads the data file by path: checked_load hashes it beside the session build
        # (both release the GIL) and proves afterwards that the path still named the file
        # hashed, unchanged; else the load fails and the session is dropped.
        session = gear_file.checked_load(lambda: self._create(graph))
        self.session: ort.InferenceSession | None = session
        self._graph_ids = itertools.count(1)  # 0 and -1 mean something to ORT; ours start at 1

    def _source_graph(self) -> tuple[onnx.ModelProto, bytes]:
        """The graph the session runs (not sink): the source graph with the weights it reads,
        its passthrough outputs wrapped; and it serialized."""
        assert self.file.dynamic is not None  # the reader checks every case file has it
        proto = self.file.runnable(self.file.dynamic)
        # ORT never writes a pre-bound buffer for an output no node computes
        passthrough.wrap(proto.graph, inputs_count=False)
        return proto, proto.SerializeToString()

    def _weights(self, proto: onnx.ModelProto | None) -> Any:
        """(name, array) of the weights this model's session reads (CPU only)."""
        if self.on_cuda or self.info.sink or proto is None:
            raise BackendError(f"{self.file.path}: weights are shared on onnxruntime's CPU "
                               "provider, between non-sink models")
        return shared_weights.weight_arrays(self.file, [t.name for t in proto.graph.initializer])

    def weight_store(self) -> shared_weights.WeightStore:
        """This model's weights held as OrtValues another model can share; the first call
        reads them from the file once and rebuilds the session over them (prepacking off).
        Executors created before keep the session they were bound to (and its own copy of
        the weights) until they close: create them after loading both models to hold the
        weights once."""
        with self._store_lock:  # two models sharing at once build it once
            if self._store is not None:
                return self._store
            proto, graph = self._source_graph()

            def build() -> ort.InferenceSession:
                # read while checked_load holds and hashes the data files: the weights held
                # are the ones compile recorded
                self._store = shared_weights.WeightStore.from_arrays(self._weights(proto))
                return self._create(graph)  # _new_session gives it the store's OrtValues

            try:
                self.session = self.file.checked_load(build)
            except BaseException:
                self._store = None
                raise
            return cast(shared_weights.WeightStore, self._store)  # build made it

    def _use_graphs(self, cuda_graph: bool) -> None:
        """Set whether the session captures CUDA graphs, and the providers to match."""
        self.cuda_graph = cuda_graph
        self.providers = provider_list(self._providers, self._device_id, cuda_graph,
                                       tf32=self.tf32)

    def _precision(self, mode: str | None) -> bool:
        """How this backend takes the gear file's GE precision_mode: float32 as it is, always
        (ORT does not convert a model's dtypes). A mode that lowers float32 on the NPU
        (force_fp16, ...) is said in a RuntimeWarning: the outputs here are float32's; on
        CUDA it allows TF32, the nearest the CUDA EP has. Returns whether TF32 is allowed."""
        lowered = PRECISION_LOWERED.get(mode) if mode else None
        if lowered is None:
            return False
        where = "TF32 MatMul/Conv on CUDA" if self.on_cuda else "float32 on the CPU"
        warnings.warn(f"{self.file.path}: precision_mode {mode!r} computes in {lowered} on "
                      f"Ascend; ONNX Runtime runs the model's own dtypes ({where}), so its "
                      "outputs are more precise than the NPU's", RuntimeWarning, stacklevel=5)
        return self.on_cuda

    def _without_graphs(self, why: str) -> None:
        """Run this model without CUDA graphs, with a warning saying ``why``; or, when the
        user chose ``cuda_graph_fallback=False``, refuse it (BackendError)."""
        what = f"{self.file.path}: CUDA graphs cannot run this model right: {why}"
        if not self._fallback:
            raise BackendError(f"{what} (cuda_graph_fallback=False refuses it; with True it "
                               "runs without graphs)")
        warnings.warn(f"{what}; it runs without CUDA graphs", RuntimeWarning, stacklevel=4)
        self.cuda_graph_refused = why
        self._use_graphs(False)

    def _create(self, graph: bytes) -> ort.InferenceSession:
        """The session; when ORT itself refuses graph capture for this model (nodes it put on
        the CPU behind Memcpy nodes), the same choice as a hazard found beforehand."""
        try:
            with cuda_exclusive(self.on_cuda):  # loading the weights allocates device memory
                return self._new_session(graph)
        except BackendError as exc:
            if not (self.cuda_graph and is_capture_refusal(str(exc))):
                raise
            self._without_graphs(f"onnxruntime refused graph capture ({exc.__cause__})")
        with cuda_exclusive(self.on_cuda):
            return self._new_session(graph)

    def _new_session(self, graph: bytes) -> ort.InferenceSession:
        so = ort.SessionOptions()
        # Errors reach the caller as BackendError; ORT's own copy on stderr would only
        # duplicate them (and break one-line CLI errors). Level 3 (errors) still prints a
        # failing kernel's error, in ANSI colours, before the exception: log fatal only.
        so.log_severity_level = 4
        if self._threads is not None:
            so.intra_op_num_threads = self._threads
        so.add_session_config_entry(EXTERNAL_FOLDER_KEY, self.file.data_folder)
        for key, val in self._config.items():
            so.add_session_config_entry(key, val)
        shared_weights.add_to_options(so, {**(self._store.by_name if self._store else {}),
                                           **self.shared_weights.values})
        try:
            session = ort.InferenceSession(graph, so, providers=self.providers)
        except Exception as exc:  # ORT raises its own types; map them in one place
            raise BackendError(f"onnxruntime could not create a session for "
                               f"{self.file.path}: {exc}") from exc
        release_model_bytes(session)
        return session

    @property
    def execution_providers(self) -> list[str] | None:
        """The providers ORT really uses for this model's session (None once closed)."""
        return None if self.session is None else list(self.session.get_providers())

    @property
    def has_naive_run(self) -> bool:
        return not self.info.sink  # a sink file runs whole: no gear to feed naively

    def naive_run(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """``session.run(None, feeds)`` on the model's own session: no IO binding, each
        input fed separately from Python, outputs allocated by ORT. Under CUDA graphs it says
        ``gpu_graph_id=-1`` (a run without an id is graph 0, which ORT would capture with this
        call's addresses and replay for later calls without filling their outputs) and shares
        the GPU through the capture gate like every run."""
        options = ort.RunOptions()
        options.add_run_config_entry(GRAPH_ID_KEY, "-1")
        with self.run_guard():
            return self.live_session().run(None, feeds, options)

    @contextlib.contextmanager
    def run_guard(self) -> Iterator[None]:
        """What every run on this model's session holds. On CUDA: the GPU shared with other
        runs, never with a capture (:data:`CUDA_GATE`); with CUDA graphs also the session to
        itself, since ORT forbids concurrent Run() calls on a graph session. The gate is taken
        first: a run waiting for the session then holds no place a capture waits on that the
        run holding the session needs. The executors of one model share its stream, so the
        GPU work is in one queue either way. Off CUDA: nothing."""
        with cuda_shared(self.on_cuda):
            if self.cuda_graph:
                with self._graph_lock:
                    yield
            else:
                yield

    def live_session(self) -> ort.InferenceSession:
        if self.session is None:
            raise BackendError(f"the model {self.file.path} is closed")
        return self.session

    def new_graph_id(self) -> int:
        return next(self._graph_ids)

    @property
    def supports_state(self) -> bool:  # type: ignore[override]
        """Resident state on the CPU (host buffers bound in place) and on CUDA (OrtValues in
        device memory: onnxruntime_cuda.DeviceState); not on a sink file (fed whole)."""
        return not (self.on_cuda and self.info.sink)

    @property
    def supports_state_rows(self) -> bool:  # type: ignore[override]
        """On the CPU: a gear binds the leading rows of a host state buffer (one address,
        the gear's shape). Not on CUDA, whose state OrtValues have one shape."""
        return not self.on_cuda

    def guard_graph(self) -> tuple[Any, ...] | None:
        """The source graph ORT runs, CPU or CUDA (a sink file's graph computes its dims
        itself and is not guarded)."""
        if self.info.sink or self.file.dynamic is None:
            return None
        return (self.file.dynamic.graph, list(self.file.dynamic.opset_import),
                self.file.weights, self.file.weight_array)

    def state_graph(self) -> Any:
        """The source graph ORT runs (CPU, not sink): an in-place pair binds its one buffer
        as both the kernel's past and present, which GroupQueryAttention then shares."""
        if self.on_cuda or self.info.sink or self.file.dynamic is None:
            return None
        return self.file.dynamic.graph

    def state_refusal(self) -> str | None:
        if self.supports_state:
            return None
        return "state= needs a model that is not sink (a sink file's runs take every input)"

    def create_session(self, layout: Any, state: Any = None) -> OrtSession:
        if state is not None and not self.supports_state:
            raise BackendError(str(self.state_refusal()))
        return OrtSession(self, layout, state)

    def close(self) -> None:
        self.session = None


def release_model_bytes(session: ort.InferenceSession) -> None:
    """Let go of the serialized model ORT's Python session keeps for its whole life
    (``InferenceSession._model_bytes``, a private name, as of ORT 1.32), so the session holds
    its weights once, as its own tensors. ORT keeps those bytes only to build the session
    again on its fallback providers after a run fails on the first (printing to stdout);
    that fallback is turned off, so such a run raises, as any failed run does here."""
    if getattr(session, "_model_bytes", None) is None:
        return
    session.disable_fallback()
    session._model_bytes = None


def _refuses_data(exc: Exception) -> bool:
    """Whether ORT's run error ``exc`` is a kernel refusing the input VALUES: ORT raises
    InvalidArgument (status INVALID_ARGUMENT) for them (a Gather index out of its data's
    bounds: gather.cc), and the shapes and dtypes were checked before the run, so at run
    time that status is the data's fault."""
    invalid = getattr(getattr(ort.capi, "onnxruntime_pybind11_state", None),
                      "InvalidArgument", None)
    return (invalid is not None and isinstance(exc, invalid)) or \
        "INVALID_ARGUMENT" in str(exc)[:80]


def private_run(session: ort.InferenceSession) -> Any:
    """ORT's C binding ``session._sess.run_with_iobinding(iobinding._iobinding, run_options)``
    (a private name: checked for 1.21-1.32), or None when this ORT has no such call or it does
    not take those arguments. Probed once per session with a binding that binds nothing: the
    call then fails inside ORT ("At least one output should be requested"), a RuntimeError
    that says the arguments were taken; a TypeError (pybind11's "incompatible function
    arguments") or a missing name says they were not. Nothing runs either way."""
    call = getattr(getattr(session, "_sess", None), "run_with_iobinding", None)
    empty = getattr(session.io_binding(), "_iobinding", None)
    if call is None or empty is None:
        return None
    try:
        call(empty, ort.RunOptions())
    except (TypeError, AttributeError):
        return None
    except Exception:  # noqa: BLE001 - ORT refusing the empty binding: the call fits
        return call
    return call


class OrtSession(BackendSession, BenchSession):
    """Per-executor bindings: every gear pre-bound to staging offsets and output buffers.
    Offers the bare run (:class:`~gear_runtime.backends.bench_hooks.BenchSession`)."""

    def __init__(self, model: OrtModel, layout: Any, state: Any = None) -> None:
        self.model = model
        self.layout = layout
        info = model.info
        on_device = model.on_cuda and not info.sink  # a sink file is fed whole, by ORT
        #: the resident state (None: none): host buffers on the CPU, OrtValues in the
        #: provider's memory on a device; and which inputs the staging layout covers:
        #: (index in the layout, index in the model) per non-state input
        with cuda_exclusive(on_device):  # it allocates on the GPU: never under a capture
            self.state: HostState | DeviceState | None = (
                None if state is None else DeviceState(state, model.device) if on_device
                else HostState(state))
        staged = range(len(info.spec.input_names)) if state is None else state.inputs
        self._staged = list(enumerate(staged))
        self._state_in = {} if state is None else {p.input_index: j
                                                    for j, p in enumerate(state.pairs)}
        self._state_out = {} if state is None else {p.output_index: j
                                                     for j, p in enumerate(state.pairs)}
        self._into: dict[tuple[int, int], tuple[Any, Any, dict[int, int]]] = {}
        #: per gear, the first row of a state with rows its bindings hold (0 when absent)
        self._first_rows: dict[int, int] = {}
        gears = range(info.spec.gear_count)
        self._thread = threading.get_ident()
        # the session's names: same order as the model's, passthrough outputs renamed
        # The model's session as it is now, for good: a later share_weights_with rebuilds the
        # model's session, and this executor's bindings belong to this one.
        self._ort = model.live_session()
        self._output_names = [o.name for o in self._ort.get_outputs()]
        self._run_options = [ort.RunOptions() for _ in gears]
        # ORT runs without an id under graph id 0, which it captures: other runs say -1. On
        # CUDA every run names its id: the public run_with_iobinding looks it up, and a lookup
        # of a missing key raises (and catches) a RuntimeError inside ORT on every run.
        self._plain_options = ort.RunOptions()
        self._graph_ids: list[int] = []
        self.graphs_left = 0  # graphs close() could not free (see close)
        # With state, the run options of the other parity: its bindings hold other addresses,
        # so under CUDA graphs they are other graphs (ids of their own); swapped with them.
        self._alt_run_options = [] if state is None else [ort.RunOptions() for _ in gears]
        if model.on_cuda:
            self._plain_options.add_run_config_entry(GRAPH_ID_KEY, "-1")
            # a graph holds this executor's addresses: its own id (one per parity with state)
            for opts in self._run_options + self._alt_run_options:
                if model.cuda_graph:
                    self._graph_ids.append(model.new_graph_id())
                opts.add_run_config_entry(
                    GRAPH_ID_KEY, str(self._graph_ids[-1]) if model.cuda_graph else "-1")
        # Device buffers, bindings (which may copy across devices) and captures: all of it
        # allocates or captures on the GPU, so none of it may overlap another thread's capture.
        with cuda_exclusive(model.on_cuda):
            self._host_staging(on_device)
            self._out_buffers: list[np.ndarray] = []
            self._outputs: list[list[np.ndarray]] = []
            if on_device:
                self._device: DeviceStaging | None = DeviceStaging(
                    info, model.device, layout, self.staging, skip=self._state_out)
            else:
                self._device = None
                self._host_outputs()
            # A sink file runs whole through run_sink: nothing to bind per gear.
            self._bindings = [] if info.sink else [self._bind(g, 0) for g in gears]
            self._run_c, self._c_bindings = self._run_call(self._ort, on_device)
            # With state, the bindings of the other parity (state read from buffer 1, written
            # to buffer 0); commit_state swaps the two sets after each successful run.
            self._alt_bindings = [] if state is None else [self._bind(g, 1) for g in gears]
            self._alt_c_bindings = [self._run_arg(g, b) for g, b in enumerate(self._alt_bindings)]
            if self._device is None and state is None and self._bindings:
                # ORT's CPU reads an input where it is, as its own run() does: a large one is
                # bound there instead of copied into staging (not with state: its runs swap
                # bindings, and a decode step's inputs are small)
                self.in_place_input_bytes = IN_PLACE_INPUT_BYTES
            if model.cuda_graph:
                # Largest gear first, as vLLM captures: later, smaller graphs reuse its pool.
                order = sorted(gears, key=lambda g: -sum(layout.nbytes(g, i)
                                                         for i in range(layout.input_count)))
                for g in order:  # ORT captures a new id's graph within its first run
                    self._run(g)
                if self.state is not None:  # the other parity's graphs, then a clean state
                    self.commit_state()
                    for g in order:
                        self._run(g)
                    self.commit_state()
                    self.state.zero()

    def _host_staging(self, on_device: bool) -> None:
        """The host staging buffer: in the CUDA provider's pinned memory where this ORT offers
        it (the merged copy then goes straight to the device, no driver bounce buffer), else
        pageable and 64-byte aligned. ``staging_pinned`` says which."""
        nbytes = max(int(self.layout.total_bytes), 1)
        pinned = (pinned_staging(nbytes, self.model.device[1])
                  if on_device and self.model.device[0] == "cuda" else None)
        self.staging_pinned = pinned is not None
        self._pinned_owner = None if pinned is None else pinned[1]  # keeps the memory alive
        self.staging = aligned_buffer(nbytes) if pinned is None else pinned[0]

    def _host_outputs(self) -> None:
        """CPU: the output memory of every CPU backend (base.output_buffers; a state output
        is written into the state's buffers, no buffer of its own), and what
        ``execute(copy=True)`` writes into instead (:meth:`run_gear_owned`): per gear, the
        large outputs ORT writes into arrays the caller keeps, memory recycled from the pool
        once the caller drops them (output_pool.py). With resident state none are pooled."""
        fresh = FRESH_OUTPUT_MIN_BYTES if self.state is None else math.inf
        self._out_buffers, self._outputs, self._big_outputs = output_buffers(
            self.model.info, fresh, skip=self._state_out)
        self._pool = OutputPool.for_outputs(self._outputs, self._big_outputs)
        # Per gear, a second binding for copy=True runs (built on first use), what a run
        # takes of it, and the address each of its pooled outputs is bound to: a recycled
        # block is rebound only when it moved. The first binding keeps pointing at the
        # executor's buffers (copy=False).
        self._owned: list[tuple[Any, Any, list[int]] | None] = [None] * len(self._outputs)
        # Runs with inputs bound in place (run_gear_in_place), per gear: copy=False (outputs
        # in the executor's buffers) and copy=True with pooled outputs, each a binding of its
        # own with the inputs it points elsewhere than staging (the first binding, which the
        # core's direct runs use, always reads staging).
        self._placed: dict[tuple[int, bool], _Placed] = {}

    def _run_call(self, session: ort.InferenceSession,
                  on_device: bool) -> tuple[Any, list[Any]]:
        """What a run calls, looked up once, and the binding objects it takes.

        On a device: ORT's public ``InferenceSession.run_with_iobinding`` (its checks are
        nothing next to a GPU run). On CPU, where they would be a large share of the whole
        executor overhead (benchmarks/bench_core.py), ORT's C binding ``_sess.run_with_iobinding``
        with each binding's ``_iobinding``, where this ORT has them and the call takes them
        (:func:`private_run`); else the public wrapper.
        """
        c_run = None if on_device else private_run(session)
        c_bindings = [getattr(b, "_iobinding", None) for b in self._bindings]
        if c_run is None or any(b is None for b in c_bindings):
            return session.run_with_iobinding, list(self._bindings)
        return c_run, c_bindings

    def _run_arg(self, g: int, binding: Any) -> Any:
        """What ``_run_c`` takes of another binding of gear ``g``: the form it takes of the
        first one (:meth:`_run_call`)."""
        return binding if self._c_bindings[g] is self._bindings[g] else binding._iobinding

    def _bind(self, g: int, parity: int | None = None) -> Any:
        """An IOBinding of gear g: inputs at staging (or device) offsets, outputs preallocated;
        a state input at its buffer ``parity`` (default: the current one), its output at the
        other."""
        if parity is None:
            parity = 0 if self.state is None else self.state.parity
        self.model.live_session()  # BackendError once the model is closed
        binding = self._ort.io_binding()
        self._bind_inputs(binding, g, parity)
        info = self.model.info
        for k, name in enumerate(self._output_names):
            shape, dtype = list(info.output_shapes[g][k]), info.output_dtypes[k]
            if k in self._state_out and isinstance(self.state, DeviceState):
                binding.bind_ortvalue_output(
                    name, self.state.value(self._state_out[k], 1 - parity))
            elif k in self._state_out:
                assert isinstance(self.state, HostState)
                buf = self.state.write(self._state_out[k], parity)
                binding.bind_output(name, "cpu", 0, dtype, shape,
                                    self._row_address(buf, g))
            elif self._device is not None:
                binding.bind_output(name, self.model.device[0], self.model.device[1], dtype,
                                    shape, self._device.output_ptr(k))
            else:
                binding.bind_output(name, "cpu", 0, dtype, shape,
                                    self._outputs[g][k].ctypes.data)
        return binding

    def _bind_inputs(self, binding: Any, g: int, parity: int = 0) -> None:
        spec, info = self.model.info.spec, self.model.info
        shapes = spec.shapes(g)
        for j, i in self._staged:
            name = spec.input_names[i]
            if self._device is not None:
                device, ptr = self._device.input_ptr(g, j)  # layout index: staged inputs
            else:
                device, ptr = "cpu", self.staging.ctypes.data + self.layout.offset(g, j)
            binding.bind_input(name, device, self.model.device[1], info.input_dtypes[i],
                               list(shapes[name]), ptr)
        for i, pair in self._state_in.items():  # read in place: no copy into staging
            if isinstance(self.state, DeviceState):
                binding.bind_ortvalue_input(spec.input_names[i], self.state.value(pair, parity))
                continue
            assert isinstance(self.state, HostState)
            buf = self.state.buffer(pair, parity)  # a state with rows: the gear's rows
            binding.bind_input(spec.input_names[i], "cpu", 0, buf.dtype,
                               list(shapes[spec.input_names[i]]), self._row_address(buf, g))

    def _row_address(self, buf: np.ndarray, g: int) -> int:
        """Where gear ``g``'s rows of state buffer ``buf`` begin (its first row, see
        :meth:`bind_rows`; a state without rows is bound whole, from its start)."""
        return buf.ctypes.data + self._first_rows.get(g, 0) * (buf.nbytes // max(len(buf), 1))

    def bind_rows(self, gear: int, first_row: int) -> None:
        """Gear ``gear``'s runs read and write rows ``first_row ..`` of every state with rows
        from now on: its bindings of both parities rebound there (nothing to do when they
        already are). The executor checked the rows fit the buffers."""
        if self._first_rows.get(gear, 0) == first_row:
            return
        if self._device is not None or not isinstance(self.state, HostState):
            raise BackendError("state rows are bound on onnxruntime's CPU only")
        self._first_rows[gear] = first_row
        parity = self.state.parity  # self._bindings are the current parity's, as commit swaps
        for p, bindings in ((parity, self._bindings), (1 - parity, self._alt_bindings)):
            self._bind_inputs(bindings[gear], gear, p)
            info = self.model.info
            for k, j in self._state_out.items():
                bindings[gear].bind_output(
                    self._output_names[k], "cpu", 0, info.output_dtypes[k],
                    list(info.output_shapes[gear][k]),
                    self._row_address(self.state.write(j, p), gear))

    def run_bound(self, gear: int) -> None:
        """Run gear ``gear``'s pre-bound binding as it stands: the bare ORT run that
        :meth:`run_gear` wraps (no host/device copies). What benchmarks time as "bare".
        On a device it keeps every rule of a run: the graphs' thread, the capture gate."""
        if self._device is None:
            self._bare(gear)
            return
        self._check_thread()
        with self.model.run_guard():
            self._bare(gear)

    def _bare(self, gear: int) -> None:
        try:
            self._run_c(self._c_bindings[gear], self._run_options[gear])
        except Exception as exc:
            raise self._failed(gear, exc) from exc

    @property
    def thread_bound(self) -> bool:  # type: ignore[override]
        """With CUDA graphs the session runs on its creating thread alone (_check_thread)."""
        return bool(self.model.cuda_graph)

    def _check_thread(self) -> None:
        if self.model.cuda_graph and threading.get_ident() != self._thread:
            # ORT's CUDA EP keeps graphs per thread: another thread would capture anew.
            raise BackendError("an executor with CUDA graphs runs on the thread that "
                               "created it (its graphs were captured there)")

    def direct_runs(self) -> list[DirectRun] | None:
        """CPU: every gear's run is ORT's C binding on its pre-bound IOBinding (what
        :meth:`run_gear` calls), made by the core right after staging; copies of its outputs
        are what :meth:`run_gear_owned` returns for a gear without large outputs (those go
        through the output pool). On a device (copies in and out around the run): None."""
        if self._device is not None or not self._bindings or self.state is not None:
            return None  # a stateful run swaps its bindings after it: through run_gear
        return [(self._run_c, (self._c_bindings[g], self._run_options[g]), self._outputs[g],
                 not self._big_outputs[g]) for g in range(len(self._bindings))]

    def run_failed(self, gear: int, exc: Exception) -> BackendError:
        return self._failed(gear, exc)

    def _failed(self, gear: int, exc: Exception,
                placed: dict[int, np.ndarray] | None = None) -> BackendError:
        if not self._c_bindings:
            return BackendError(f"this executor's session of {self.model.file.path} is closed")
        what = f"onnxruntime run of gear {gear} {self.model.info.spec.gears[gear]}"
        if _refuses_data(exc) or self._data_refused_again(gear, placed or {}):
            return DataRefusedError(f"{what} refused the request's data: {exc}")
        return BackendError(f"{what} failed: {exc}")

    def _data_refused_again(self, gear: int, placed: dict[int, np.ndarray]) -> bool:
        """Whether the failed run was the data's fault, when the error does not say: ORT's C
        binding of run_with_iobinding turns every status into "Error in execution", so the
        gear runs once more through ``session.run`` on the same staged inputs, whose error
        keeps ORT's status (InvalidArgument). Only after a failure (a rare, already failed
        request), on the CPU; inputs bound in place are read from ``placed``, a resident
        state from the buffer the failed run read (no commit happened: the current parity;
        ORT allocates this run's outputs, so the state is read, never written)."""
        if self._device is not None or self._ort is None:
            return False
        spec, info = self.model.info.spec, self.model.info
        shapes = spec.shapes(gear)
        feeds = {}
        for j, i in self._staged:
            name = spec.input_names[i]
            if j in placed:
                feeds[name] = placed[j]
                continue
            start, n = int(self.layout.offset(gear, j)), int(self.layout.nbytes(gear, j))
            feeds[name] = self.staging[start:start + n].view(info.input_dtypes[i]).reshape(
                shapes[name])
        if isinstance(self.state, HostState):
            for i, pair in self._state_in.items():
                feeds[spec.input_names[i]] = self.state.read(pair)
        try:
            self._ort.run(None, feeds, self._plain_options)
        except Exception as again:  # noqa: BLE001 - classified, never raised from here
            return _refuses_data(again)
        return False

    @property
    def has_bare_run(self) -> bool:
        return bool(self._bindings)  # a sink file has no pre-bound gears

    def output_nbytes(self) -> int:
        """Bytes of the preallocated output buffers (each output at its largest gear): host
        buffers on CPU, the device output arena on a device (host arrays are fresh per run)."""
        if self._device is not None:
            return int(self._device.output_bytes)
        return int(sum(b.nbytes for b in self._out_buffers))

    def commit_state(self) -> None:
        """The written buffers become the read ones: swap the parity, the binding sets and
        their run options (graph ids)."""
        if self.state is not None:
            self.state.swap()
            self._bindings, self._alt_bindings = self._alt_bindings, self._bindings
            self._c_bindings, self._alt_c_bindings = self._alt_c_bindings, self._c_bindings
            self._run_options, self._alt_run_options = self._alt_run_options, self._run_options

    def device_out_refusal(self, buf: DeviceBuffer) -> str | None:
        """On a device, an output is bound to a state OrtValue of this provider and device
        (the prefill handoff); on the CPU, outputs are host memory (the base rule)."""
        if self._device is None:
            return super().device_out_refusal(buf)
        backend, device_id = f"onnxruntime-{self.model.device[0]}", self.model.device[1]
        if buf.backend != backend or buf.device_id != device_id:
            return (f"this executor runs on {backend} device {device_id}: it writes an output "
                    f"into that device's memory only; hand it over with set_state(name, "
                    "output)")
        return None

    def _run_into_device(self, gear: int, out: dict[int, Any]) -> list[Any]:
        """A device run with outputs bound to the :class:`DeviceBuffer` values in ``out``
        (another executor's state OrtValues: no copy through the host), on a binding of
        its own, made for the call (handoffs are one per sequence) under the capture gate,
        and run without a graph id (a captured graph replays this executor's own addresses);
        numpy buffers in ``out`` get one copy after the run.

        The inputs go to the device BEFORE the binding is made, as :meth:`_run` does: ORT
        copies an input whose kernel reads it on the CPU when it is bound
        (``IOBinding::BindInput`` -> ``utils::CopyOneInputAcrossDevices``,
        onnxruntime/core/session/IOBinding.cc, core/framework/utils.cc), so a bind first would
        run with the bytes the previous request left on the device."""
        bound = {k: b for k, b in out.items() if isinstance(b, DeviceBuffer)}
        parity = 0 if self.state is None else self.state.parity
        self._check_thread()
        assert self._device is not None
        with cuda_exclusive(True):
            self._device.to_device(gear)  # this request's bytes, then the bind that reads them
            binding = self._bind(gear, parity)
            for k, buf in bound.items():
                binding.bind_ortvalue_output(self._output_names[k], buf.handle)
        with self.model.run_guard():
            try:
                self._ort.run_with_iobinding(binding, self._plain_options)
            except Exception as exc:
                raise self._failed(gear, exc) from exc
            outputs = self._device.to_host(gear, binding, kept=bound)
        for k, buf in out.items():
            if k not in bound:
                np.copyto(buf, outputs[k])
            outputs[k] = buf
        return outputs

    def run_gear_into(self, gear: int, out: dict[int, np.ndarray]) -> list[np.ndarray]:
        """CPU: ORT writes output ``k`` straight into ``out[k]`` (no copy): a binding of its
        own per (parity, gear), an output rebound only when its address changed (the other
        binding keeps the executor's buffers)."""
        if self._device is not None:
            if any(isinstance(b, DeviceBuffer) for b in out.values()):
                return self._run_into_device(gear, out)
            return super().run_gear_into(gear, out)
        parity = 0 if self.state is None else self.state.parity
        entry = self._into.get((parity, gear))
        if entry is None:
            binding = self._bind(gear, parity)
            arg = self._run_arg(gear, binding)
            bound = {k: o.ctypes.data for k, o in enumerate(self._outputs[gear])
                     if k not in self._state_out}
            entry = self._into[(parity, gear)] = (binding, arg, bound)
        binding, arg, bound = entry
        outputs = list(self._outputs[gear])
        for k in bound:
            target = out.get(k, outputs[k])
            ptr = target.ctypes.data
            if bound[k] != ptr:
                binding.bind_output(self._output_names[k], "cpu", 0, target.dtype,
                                    list(target.shape), ptr)
                bound[k] = ptr
            outputs[k] = target
        try:
            self._run_c(arg, self._run_options[gear])
        except Exception as exc:
            raise self._failed(gear, exc) from exc
        return outputs

    def run_gear_owned(self, gear: int) -> list[np.ndarray]:
        """The gear's outputs as arrays the caller keeps: small ones copied, large ones written
        by ORT into pooled memory that no live array shares (:class:`OutputPool`)."""
        if self._device is not None:  # a device run returns fresh arrays already
            return self.run_gear(gear)
        big = self._big_outputs[gear]
        if not big:  # copies (execute() copies these in the core's direct run instead)
            return super().run_gear_owned(gear)
        binding, arg, bound = self._owned[gear] or self._owned_binding(gear)
        return self._run_pooled(gear, binding, arg, bound)

    def _run_pooled(self, gear: int, binding: Any, arg: Any, bound: list[int],
                    placed: dict[int, np.ndarray] | None = None) -> list[np.ndarray]:
        """Run ``binding`` of ``gear`` with its large outputs written into pooled blocks the
        caller keeps (``bound``: the address each is bound to now), the others copied."""
        big = self._big_outputs[gear]
        outs, fresh, array = self._outputs[gear], {}, self._pool.array
        for k in big:
            out = outs[k]
            fresh[k], ptr = array(out.shape, out.dtype, out.nbytes)
            if bound[k] != ptr:  # the block moved: bind the new one
                binding.bind_output(self._output_names[k], "cpu", 0, out.dtype,
                                    list(out.shape), ptr)
                bound[k] = ptr
        try:
            self._run_c(arg, self._run_options[gear])
        except Exception as exc:
            raise self._failed(gear, exc, placed) from exc
        if len(fresh) == len(outs):
            return list(fresh.values())
        return [fresh[k] if k in fresh else o.copy() for k, o in enumerate(outs)]

    def written_buffers(self) -> list[np.ndarray]:
        return list(self._out_buffers)

    def run_gear_in_place(self, gear: int, placed: dict[int, np.ndarray],
                          copy: bool) -> list[np.ndarray]:
        """CPU: ORT reads the inputs ``placed`` (staged index -> the caller's array) where
        they are, the others from staging, as its own ``run`` reads numpy inputs: no copy of
        a large input. A binding of its own per (gear, pooled outputs), an input rebound only
        when its address changed, and pointed back at staging when a later request stages
        it. Outputs as :meth:`run_gear_owned` (``copy``) or :meth:`run_gear` give them."""
        pooled = copy and bool(self._big_outputs[gear])
        entry = self._placed.get((gear, pooled))
        if entry is None:
            binding = self._bind(gear)
            entry = self._placed[(gear, pooled)] = _Placed(
                binding, self._run_arg(gear, binding), [0] * len(self._outputs[gear]), {})
        self._point_inputs(entry, gear, placed)
        if pooled:
            return self._run_pooled(gear, entry.binding, entry.arg, entry.bound, placed)
        try:
            self._run_c(entry.arg, self._run_options[gear])
        except Exception as exc:
            raise self._failed(gear, exc, placed) from exc
        outs = self._outputs[gear]
        return [o.copy() for o in outs] if copy else list(outs)

    def _point_inputs(self, entry: _Placed, gear: int, placed: dict[int, np.ndarray]) -> None:
        """Bind ``entry``'s inputs for this run: those in ``placed`` at the caller's arrays,
        every other one at its staging slot (only those that pointed elsewhere move)."""
        for j in [j for j in entry.moved if j not in placed]:
            self._bind_staged(entry.binding, gear, j,
                              self.staging.ctypes.data + self.layout.offset(gear, j))
            del entry.moved[j]
        for j, array in placed.items():
            ptr = array.ctypes.data
            if entry.moved.get(j) != ptr:
                self._bind_staged(entry.binding, gear, j, ptr)
                entry.moved[j] = ptr

    def _bind_staged(self, binding: Any, gear: int, j: int, ptr: int) -> None:
        """Bind staged input ``j`` of ``gear`` (host memory) at address ``ptr``."""
        i = self._staged[j][1]
        spec, info = self.model.info.spec, self.model.info
        name = spec.input_names[i]
        binding.bind_input(name, "cpu", 0, info.input_dtypes[i], list(spec.shapes(gear)[name]),
                           ptr)

    def _owned_binding(self, gear: int) -> tuple[Any, Any, list[int]]:
        """Gear ``gear``'s copy=True binding, what ``_run_c`` takes of it (as for the first
        binding) and its bound output addresses (0: not bound to a pooled block yet)."""
        binding = self._bind(gear)
        arg = self._run_arg(gear, binding)
        owned = self._owned[gear] = binding, arg, [0] * len(self._outputs[gear])
        return owned

    def _run(self, gear: int) -> list[np.ndarray]:
        """A device run of gear ``gear``: copies in, run, one copy out per output."""
        assert self._device is not None
        self._device.to_device(gear)
        if not self.model.cuda_graph:
            # ORT copies a bound input at BIND time when the node consuming it runs on
            # another device (IOBinding CopyOneInputAcrossDevices): bind again so such an
            # input is this run's data. Under CUDA graphs every node is on the GPU.
            self._bind_inputs(self._bindings[gear], gear,
                              0 if self.state is None else self.state.parity)
        self._bare(gear)
        return self._device.to_host(gear, self._bindings[gear])

    def run_gear(self, gear: int) -> list[np.ndarray]:
        if self._device is None:  # CPU: ORT reads the staging buffer itself (execute()'s
            self._bare(gear)  # plain requests make this run from the core: direct_runs)
            return self._outputs[gear]
        self._check_thread()
        with self.model.run_guard():
            return self._run(gear)

    def _run_session(self, what: str, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self.model.info.spec.input_names, arrays, strict=True))
        self.model.live_session()  # BackendError once the model is closed
        session = self._ort
        if session is None:
            raise BackendError(f"this executor's session of {self.model.file.path} is closed")
        try:
            with self.model.run_guard():
                return session.run(None, feeds, self._plain_options)
        except Exception as exc:
            raise BackendError(f"onnxruntime run of the {what} graph failed: {exc}") from exc

    def run_dynamic(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if not self.model.info.hybrid:
            raise BackendError("this gear file is not hybrid: a miss has no graph to run")
        return self._run_session("dynamic-shape", arrays)

    def run_sink(self, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...]]:
        if not self.model.info.sink:
            raise BackendError("this gear file has no sink graph")
        return split_sink_outputs(self._run_session("sink", arrays))

    def close(self) -> None:
        """Drop the bindings; free this executor's CUDA graphs where ORT can.

        ORT's public ``InferenceSession.release_captured_graph`` (1.30+) frees a graph id;
        the CUDA EP keeps graphs per thread, so only a close on the thread that captured them
        frees them. Closed from another thread (or on an older ORT) they are left to the
        session, which frees them when the model closes (docs/cuda.md: ORT ties them to it);
        ``graphs_left`` counts them."""
        session = self._ort
        release = getattr(session, "release_captured_graph", None)
        if self._graph_ids and release is not None and threading.get_ident() == self._thread:
            with cuda_exclusive(True):
                for graph_id in self._graph_ids:
                    with contextlib.suppress(Exception):  # a no-op where unsupported
                        release(graph_id)
        else:
            self.graphs_left = len(self._graph_ids)
        self._graph_ids = []
        self._bindings = []
        self._c_bindings = []
        self._alt_bindings, self._alt_c_bindings, self._into = [], [], {}
        if isinstance(self.state, DeviceState):  # its OrtValues go with the session
            self.state.closed = True
        if self._device is None:
            self._owned = [None] * len(self._owned)
            self._placed = {}
            self._pool.clear()
        self._run_c = None  # drop the last references to the model's session (its weights)
        self._ort = None


__all__ = ["OrtModel", "OrtSession", "check_providers", "cuda_available", "gpu_present",
           "open_model", "private_run", "provider_list"]
