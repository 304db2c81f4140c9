"""OpenVINO backend: every gear compiled with static shapes, the weights held once.

Why this backend: OpenVINO compiles a model for the shapes it is given, and a static-shape
model skips the per-run shape inference and memory planning a dynamic one does, as Ascend's
static gears do; its NPU plugin (Intel Core Ultra NPUs) compiles static shapes only, exactly
the gear use case off Ascend. Measured figures: ``benchmarks/bench_openvino.py``.

Shape of the backend (the calls are OpenVINO's Python API; ``docs/openvino.md`` cites the
plugin source behind each choice):

* The gear file's graphs are handed to OpenVINO's ONNX frontend WITHOUT their big weights:
  every weight in the data file becomes a ``Constant`` over ONE read-only memory map of that
  file (``ov.op.Constant(tensor, shared_memory=True)``), so every graph built from it points
  at the same bytes, nothing is copied at load and nothing is resolved against the working
  directory (the frontend resolves external data of an in-memory model there).
* Each gear is the source graph reshaped to the gear's static shapes (``Model.reshape``;
  ``graphs="branches"`` takes the file's ``Batch_<i>`` branch instead; ``benchmarks/``
  compares them), checked against the gear maps: a shape that differs is a BackendError at
  load, never at run time.
* ``share_weights=True`` (CPU's default): ONE compiled model holds every gear, one ``If`` per
  gear on a gear-index input, each gear's static graph its ``then`` body. OpenVINO's CPU plugin
  keeps its repacked weights in a cache per compiled model keyed by the source memory and
  the packed layout (``nodes/executors/dnnl/dnnl_utils.cpp``, ``compiled_model.cpp``), so the
  gears share one packed copy: an N-gear model costs the memory of one dynamic model. Per run
  the If copies the gear's inputs into its body and its outputs out (``nodes/if.cpp``).
  ``share_weights=False`` (the default on GPU, NPU, AUTO): one compiled model per gear, inputs
  and outputs bound without a copy, each compiled model with its own packed weights.
* Per executor, one infer request per compiled model, its inputs bound once to the gear's
  offsets in the executor's staging buffer (shared-memory tensors): a run is one ``infer``.
* Hybrid files: the dynamic-shape source graph is compiled once more and runs the misses.
  Sink files: the whole file (dims computed in its graph, returned last) is compiled as one
  dynamic model.
* Precision: float32 (``INFERENCE_PRECISION_HINT=f32``) on every device unless the gear
  file's GE ``precision_mode`` lowers it (f16 / bf16) or ``config=`` says otherwise, because
  OpenVINO's own defaults are bf16 on CPUs with AVX512_BF16/AMX and f16 on GPUs
  (:func:`precision_hint`; ``docs/precision.md``).

GPU, NPU and AUTO are written to the same API and NOT run here (no such device on the
machines this was built on); only CPU is tested.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from gear_runtime.backends.base import (
    BackendModel,
    BackendSession,
    aligned_buffer,
    check_layout_fits,
    import_runtime,
    output_buffers,
    split_sink_outputs,
)
from gear_runtime.backends.output_pool import OutputPool
from gear_runtime.errors import BackendError, InputError
from gear_runtime.gearfile import passthrough
from gear_runtime.gearfile.reader import GearFile, read_gear_file
from gear_runtime.progress import progress_bar
from gear_runtime.spec.rules import PRECISION_LOWERED

logger = logging.getLogger("gear_runtime")

INSTALL_HINT = "pip install 'gear_runtime[openvino]' (or pip install openvino)"
#: Devices this backend names; OpenVINO's own names (``core.available_devices``) also work,
#: e.g. "GPU.1".
DEVICES = ("CPU", "GPU", "NPU", "AUTO")
GRAPHS = ("source", "branches")
#: Name of the gear-index input of a shared-weights model (int32 scalar).
GEAR_INDEX = "gear_runtime_gear_index"


def open_model(path: str, *, device: str = "CPU", share_weights: bool | None = None,
               graphs: str = "source", num_threads: int | None = None,
               performance_hint: str = "LATENCY", cache_dir: str | None = None,
               config: Mapping[str, Any] | None = None, progress: bool = True) -> OvModel:
    """Load a gear file on OpenVINO (see the module doc).

    ``device``: "CPU" (default), "GPU", "NPU", "AUTO" or any name OpenVINO lists.
    ``share_weights``: one compiled model for every gear (True; CPU's default) or one per
    gear (False; the default elsewhere). ``graphs``: "source" (the source graph reshaped per
    gear) or "branches" (the file's per-gear branches). ``num_threads``: OpenVINO's
    INFERENCE_NUM_THREADS. ``performance_hint``: "LATENCY" (one stream) or "THROUGHPUT".
    ``cache_dir``: OpenVINO's model cache (CACHE_DIR): a second load of the same model
    imports the compiled blob instead of compiling. ``config``: more OpenVINO properties.
    ``progress``: a bar on stderr while compiling, only when stderr is a terminal.
    """
    return OvModel(read_gear_file(path), device=device, share_weights=share_weights,
                   graphs=graphs, num_threads=num_threads, performance_hint=performance_hint,
                   cache_dir=cache_dir, config=config, progress=progress)


def _runtime() -> Any:
    return import_runtime("openvino", "openvino", INSTALL_HINT)


def check_options(ov: Any, device: str, graphs: str, num_threads: int | None,
                  performance_hint: str) -> None:
    """InputError for an option this backend cannot take; BackendError for a device this
    machine lacks (naming the ones it has)."""
    if not isinstance(device, str) or not device:
        raise InputError(f"device must be a device name such as {', '.join(DEVICES)}, "
                         f"got {device!r}")
    if graphs not in GRAPHS:
        raise InputError(f"graphs must be one of {', '.join(GRAPHS)}, got {graphs!r}")
    if num_threads is not None and (isinstance(num_threads, bool)
                                    or not isinstance(num_threads, int) or num_threads < 1):
        raise InputError(f"num_threads must be an integer >= 1, got {num_threads!r}")
    if num_threads is not None and _family(device) != "CPU":
        # INFERENCE_NUM_THREADS is the CPU plugin's; the GPU and NPU plugins have no such
        # property and would refuse it at compile time with their own message
        raise InputError(f"num_threads={num_threads} is a CPU option of OpenVINO "
                         f"(INFERENCE_NUM_THREADS); device {device!r} has no such setting")
    if performance_hint not in ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"):
        raise InputError("performance_hint must be LATENCY, THROUGHPUT or "
                         f"CUMULATIVE_THROUGHPUT, got {performance_hint!r}")
    available = list(ov.Core().available_devices)
    family = _family(device)
    if family not in ("AUTO", "MULTI", "HETERO") and not any(
            d == device or d.split(".")[0] == device for d in available):
        raise BackendError(f"OpenVINO has no device {device!r} here (available: "
                           f"{', '.join(available) or 'none'}); GPU needs Intel's GPU driver, "
                           "NPU an Intel Core Ultra NPU and its driver")


def _family(device: str) -> str:
    """"GPU" of "GPU.1", "AUTO" of "AUTO:GPU,CPU"."""
    return device.split(".")[0].split(":")[0]


#: OpenVINO's INFERENCE_PRECISION_HINT for a GE precision mode that lowers float32
#: (:data:`~gear_runtime.spec.rules.PRECISION_LOWERED`); the others ask for f32.
_OV_PRECISION = {"f16": "f16", "bf16": "bf16"}


def precision_hint(device: str, precision_mode: str | None) -> str | None:
    """The INFERENCE_PRECISION_HINT this backend asks for: f32 unless the gear file's
    precision_mode lowers float32 (then f16 / bf16), because OpenVINO's own default is not
    f32 everywhere (the CPU plugin runs bf16 on CPUs with AVX512_BF16 or AMX, the GPU plugin
    f16), and a default that changes results must be the user's choice. None on the NPU,
    which computes in f16 whatever is asked (a float32-keeping mode is refused there)."""
    lowered = PRECISION_LOWERED.get(precision_mode) if precision_mode else None
    if _family(device) == "NPU":
        if precision_mode is not None and lowered is None:
            raise BackendError(f"precision_mode {precision_mode!r} keeps float32, but "
                               "OpenVINO's NPU computes in float16; run it on CPU or GPU")
        return None
    return _OV_PRECISION[lowered] if lowered else "f32"


# ---- the gear file's graphs as OpenVINO models, the weights mapped once -------------------------
class WeightMaps:
    """One read-only memory map per data file; each external weight a view of it."""

    def __init__(self, gear_file: GearFile) -> None:
        self._file = gear_file
        self._maps: dict[str, np.memmap] = {}

    def array(self, name: str) -> np.ndarray:
        """Weight ``name``'s bytes: a uint8 view of its data file's map (no copy)."""
        span = self._file.external[name]
        if span.path not in self._maps:
            try:
                self._maps[span.path] = np.memmap(span.path, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as exc:
                raise BackendError(f"cannot map the data file {span.path!r}: {exc}") from exc
        data = self._maps[span.path]
        if span.offset + span.length > data.size:
            raise BackendError(f"weight {name!r}: {span.length} bytes at offset {span.offset} "
                               f"of {span.path!r}, which has {data.size}")
        return data[span.offset:span.offset + span.length]


def to_ov_model(ov: Any, gear_file: GearFile, model: onnx.ModelProto, maps: WeightMaps,
                core: Any) -> Any:
    """``model`` (a branch, the source or the sink graph of ``gear_file``) as an OpenVINO
    model whose external weights are Constants over ``maps`` (see the module doc)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    graph = proto.graph
    declared = {t.name for t in graph.initializer}
    external = [n for n in gear_file.weight_names_of(model) if n in gear_file.external]
    external += [t.name for t in graph.initializer if t.name in gear_file.external]
    external = sorted(set(external))
    keep = [t for t in graph.initializer if t.name not in gear_file.external]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    graph.initializer.extend(gear_file.weights[n] for n in gear_file.weight_names_of(model)
                             if n not in gear_file.external and n not in declared)
    for name in external:  # a weight in the data file: a graph input, replaced below
        t = gear_file.weights[name]
        graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    passthrough.wrap(graph, inputs_count=False)
    try:
        ov_model = core.read_model(io.BytesIO(proto.SerializeToString()))
    except Exception as exc:  # OpenVINO raises RuntimeError / its own types: one message
        raise BackendError(f"OpenVINO cannot read {gear_file.path}: {_first_line(exc)}") from exc
    params = {p.get_friendly_name(): p for p in ov_model.get_parameters()}
    for name in external:
        param = params.get(name)
        if param is None:  # the frontend dropped an unused input: nothing reads the weight
            continue
        t = gear_file.weights[name]
        value = ov.Tensor(maps.array(name), list(t.dims), param.get_element_type())
        const = ov.op.Constant(value, shared_memory=True)
        const.set_friendly_name(name)
        param.output(0).replace(const.output(0))
        ov_model.remove_parameter(param)
    ov_model.validate_nodes_and_infer_types()
    return ov_model


def _first_line(exc: BaseException) -> str:
    """OpenVINO's exception text without its C++ source locations (one line)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Check ", "Exception from src"))]
    return (useful or lines or [type(exc).__name__])[-1][:500]


def check_gear_shapes(model: Any, gear_file: GearFile, gear: int) -> None:
    """BackendError unless OpenVINO's static output shapes of ``gear`` are the gear maps'."""
    want = gear_file.output_shapes[gear]
    for k, out in enumerate(model.outputs):
        shape = out.get_partial_shape()
        got = tuple(int(d.get_length()) for d in shape) if shape.is_static else None
        if got != tuple(want[k]):
            raise BackendError(
                f"OpenVINO infers output {gear_file.output_names[k]!r} of gear {gear} "
                f"{gear_file.spec.gears[gear]} as {shape}, the gear map says {tuple(want[k])}"
                f"; load with graphs='branches' to use the file's own static branches")


def _empty_like(ops: Any, value: Any, name: str) -> Any:
    """An empty tensor of ``value``'s type and rank (a scalar: a zero): what a gear that does
    not run returns through its If."""
    rank = value.get_partial_shape().rank.get_length()
    zero = ops.constant(np.array(0, dtype=value.get_element_type().to_dtype()),
                        name=f"{name}/zero")
    if not rank:
        return zero
    return ops.broadcast(zero, ops.constant(np.zeros(rank, np.int64), name=f"{name}/shape"),
                         name=name)


def route_gears(ov: Any, bodies: Sequence[Any], gear_file: GearFile) -> Any:
    """ONE model running one gear per call: input ``GEAR_INDEX`` picks the gear; gear g's
    inputs are ``<name>:g<g>`` (static), its outputs are outputs ``g * K .. g * K + K - 1``
    (empty when another gear ran). One If per gear, gear g's static graph its then-body."""
    from openvino import opset8 as ops

    # Every node named: OpenVINO's model cache hashes the graph with its names, and a
    # generated name ("Constant_1234") differs from one load to the next.
    index = ops.parameter([], ov.Type.i32, name=GEAR_INDEX)
    params, outputs = [index], []
    for g, body in enumerate(bodies):
        tag = f"gear_runtime/gear{g}"
        taken = ops.equal(index, ops.constant(np.int32(g), name=f"{tag}/index"),
                          name=f"{tag}/taken")
        branch = ops.if_op(taken.output(0))
        branch.set_friendly_name(f"{tag}/if")
        branch.set_then_body(body)
        misses = [ops.result(_empty_like(ops, r.input_value(0), f"{tag}/miss{k}"),
                             name=f"{tag}/miss{k}/result")
                  for k, r in enumerate(body.get_results())]
        branch.set_else_body(ov.Model(misses, [], f"{tag}/not_run"))
        by_name = {p.get_friendly_name(): p for p in body.get_parameters()}
        for name, shape in gear_file.spec.shapes(g).items():
            inner = by_name[name]
            outer = ops.parameter(list(shape), inner.get_element_type(), name=f"{name}:g{g}")
            params.append(outer)
            branch.set_input(outer.output(0), inner, None)
        outputs += [branch.set_output(r, m) for r, m in zip(body.get_results(), misses,
                                                             strict=True)]
    results = [ops.result(o, name=f"gear_runtime/out{k}") for k, o in enumerate(outputs)]
    return ov.Model(results, params, "gear_runtime_gears")


class OvModel(BackendModel):
    """A gear file compiled on OpenVINO: static gears (one compiled model, or one per gear),
    plus the dynamic-shape graph of a hybrid file or the whole graph of a sink file."""

    name = "openvino"
    #: The infer requests bind the inputs alone (the gear is the request's, one per gear):
    #: no dims buffer is staged.
    stages_dims = False

    def __init__(self, gear_file: GearFile, *, device: str, share_weights: bool | None,
                 graphs: str, num_threads: int | None, performance_hint: str,
                 cache_dir: str | None, config: Mapping[str, Any] | None,
                 progress: bool) -> None:
        info = gear_file.info
        if isinstance(device, str) and _family(device) == "NPU" and (info.sink or info.hybrid):
            # the NPU plugin compiles static shapes only; these kinds need a dynamic graph
            kind = "sink" if info.sink else "hybrid"
            raise BackendError(f"{gear_file.path}: a {kind} gear file runs a dynamic-shape "
                               "graph, which OpenVINO's NPU cannot compile (static shapes "
                               "only); load it on CPU or GPU, or compile it without "
                               f"--{kind}")
        ov = self._ov = _runtime()
        check_options(ov, device, graphs, num_threads, performance_hint)
        self.file, self.gear_file_path, self.info = gear_file, gear_file.path, gear_file.info
        self.device = device
        self.share_weights = (device.split(".")[0] == "CPU") if share_weights is None \
            else bool(share_weights)
        self.graphs = graphs
        self.core = ov.Core()
        if cache_dir is not None:
            self.core.set_property({"CACHE_DIR": os.fspath(cache_dir)})
        self.properties: dict[str, Any] = {"PERFORMANCE_HINT": performance_hint}
        if num_threads is not None:
            self.properties["INFERENCE_NUM_THREADS"] = num_threads
        #: what this model asked OpenVINO to compute in (None: the device's own, on NPU);
        #: a config= INFERENCE_PRECISION_HINT is the user's choice and wins
        self.precision = precision_hint(device, gear_file.info.spec.precision_mode)
        if self.precision is not None:
            self.properties["INFERENCE_PRECISION_HINT"] = self.precision
        if device == "CPU":
            # Pinned inference threads wait for their core when other processes run there:
            # on a shared machine a pinned run took several times as long (docs/openvino.md,
            # "CPU pinning").
            self.properties["ENABLE_CPU_PINNING"] = False
        self.properties.update(config or {})
        if "INFERENCE_PRECISION_HINT" in self.properties:
            self.precision = str(self.properties["INFERENCE_PRECISION_HINT"])
        self._maps = WeightMaps(gear_file)
        #: seconds each compile_model call took, and whether it came from the cache
        self.compile_seconds: list[float] = []
        self.loaded_from_cache: list[bool] = []
        self.gears: Any = None            # shared: ONE compiled model of every gear
        self.per_gear: list[Any] = []     # not shared: one compiled model per gear
        self.dynamic: Any = None          # hybrid misses / sink runs / naive runs
        # OpenVINO maps the data file by path: checked_load hashes it beside the build and
        # fails the load when the path no longer names the file that was checked
        gear_file.checked_load(lambda: self._load(progress))

    # ---- load ------------------------------------------------------------------------------
    def _load(self, progress: bool) -> None:
        if self.info.sink:
            assert self.file.model_bytes is not None
            sink = onnx.load_from_string(self.file.model_bytes)
            try:
                self.dynamic = self._compile(self._convert(sink), "the sink graph")
            except BackendError as exc:  # CPU: "doesn't support If operation with dynamic rank"
                raise BackendError(f"{exc.message}; a sink file routes with If nodes whose "
                                   "outputs change shape on a miss, which this OpenVINO "
                                   "device cannot compile: compile the model without "
                                   "sink=True to run it on OpenVINO") from exc
            return
        gears = range(self.info.spec.gear_count)
        with progress_bar(len(gears) + 1, f"openvino {self.device}", progress,
                          unit="step") as bar:
            bodies = []
            source = self._convert(self.file.dynamic) if self.graphs == "source" else None
            for g in gears:
                bodies.append(self._gear_graph(source, g))
                bar.update(1)
            if self.share_weights:
                self.gears = self._compile(route_gears(self._ov, bodies, self.file),
                                           f"{len(bodies)} gears")
            else:
                for g, body in enumerate(bodies):
                    self.per_gear.append(self._compile(body, f"gear {g}"))
            bar.update(1)
        if self.info.hybrid:
            self.dynamic = self._compile(source or self._convert(self.file.dynamic),
                                         "the dynamic-shape graph")

    def _convert(self, model: onnx.ModelProto | None) -> Any:
        assert model is not None  # the reader checks every case file has its source graph
        return to_ov_model(self._ov, self.file, model, self._maps, self.core)

    def _gear_graph(self, source: Any, g: int) -> Any:
        """Gear g as a static OpenVINO model: the source reshaped, or the file's branch."""
        if source is None:
            body = self._convert(self.file.branches[g])
        else:
            body = source.clone()
            try:
                body.reshape({n: list(s) for n, s in self.info.spec.shapes(g).items()})
            except Exception as exc:
                raise BackendError(
                    f"OpenVINO cannot reshape the source graph to gear {g} "
                    f"{self.info.spec.gears[g]}: {_first_line(exc)}; load with "
                    "graphs='branches' to use the file's static branches") from exc
        check_gear_shapes(body, self.file, g)
        return body

    def _compile(self, model: Any, what: str) -> Any:
        start = time.perf_counter()
        try:
            compiled = self.core.compile_model(model, self.device, self.properties)
        except Exception as exc:
            raise BackendError(f"OpenVINO could not compile {what} of {self.file.path} for "
                               f"{self.device}: {_first_line(exc)}") from exc
        self.compile_seconds.append(time.perf_counter() - start)
        try:
            self.loaded_from_cache.append(bool(compiled.get_property("LOADED_FROM_CACHE")))
        except Exception:  # a plugin without the property: not from a cache
            self.loaded_from_cache.append(False)
        logger.info("openvino: compiled %s on %s in %.2f s%s", what, self.device,
                    self.compile_seconds[-1], " (from the cache)"
                    if self.loaded_from_cache[-1] else "")
        return compiled

    # ---- what benchmarks and services see --------------------------------------------------
    @property
    def execution_providers(self) -> list[str] | None:
        """The devices OpenVINO runs the gears on (EXECUTION_DEVICES); None once closed."""
        compiled = self.gears or (self.per_gear[0] if self.per_gear else self.dynamic)
        return None if compiled is None else list(compiled.get_property("EXECUTION_DEVICES"))

    @property
    def has_naive_run(self) -> bool:
        return not self.info.sink

    def naive_run(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """OpenVINO's own dynamic-shape model of the source graph fed from Python (compiled
        on first use): the reference a gear's static run is compared with."""
        compiled = self.dynamic_model()
        result = compiled(dict(feeds))
        return [result[o] for o in compiled.outputs]

    def dynamic_model(self) -> Any:
        """The compiled dynamic-shape source graph (hybrid misses; benchmarks' reference)."""
        if self.dynamic is None:
            if self.info.sink:
                raise BackendError("a sink file has no separate dynamic-shape graph")
            self.dynamic = self._compile(self._convert(self.file.dynamic),
                                         "the dynamic-shape graph")
        return self.dynamic

    def live(self) -> None:
        if self.gears is None and not self.per_gear and self.dynamic is None:
            raise BackendError(f"the model {self.file.path} is closed")

    def create_session(self, layout: Any) -> OvSession:
        self.live()
        check_layout_fits(layout, self.info)
        return OvSession(self, layout)

    def close(self) -> None:
        self.gears, self.per_gear, self.dynamic = None, [], None


class OvSession(BackendSession):
    """Per-executor infer requests: every gear's inputs bound to the staging buffer, its
    outputs to the session's output buffers (both shared-memory tensors: OpenVINO reads and
    writes them in place)."""

    def __init__(self, model: OvModel, layout: Any) -> None:
        self.model, self.layout = model, layout
        self.staging = aligned_buffer(max(int(layout.total_bytes), 1))
        info = model.info
        # One buffer per output at its largest gear, viewed per gear (one gear runs at a time;
        # in a shared-weights model the gears that do not run return empty outputs).
        self._out_buffers, self._outputs, self._big = output_buffers(info)
        # what execute(copy=True) has OpenVINO write its large outputs into (output_pool.py)
        self._pool = OutputPool.for_outputs(self._outputs, self._big)
        self._index = np.zeros((), np.int32)  # the gear-index input of a shared model
        self._dynamic: Any = None
        self._requests: list[Any] = []
        self._ports: list[list[int]] = []  # [gear][output] -> output port of its request
        try:
            if not info.sink:
                self._bind_gears()
        except Exception as exc:
            raise BackendError(f"OpenVINO could not create an infer request for "
                               f"{model.file.path}: {_first_line(exc)}") from exc
        # What a run calls, looked up once: the C-level synchronous infer, in this thread (the
        # Python wrapper adds its input dispatch; start_async + wait hop to OpenVINO's stream
        # thread, which cost milliseconds on a loaded machine). It returns a dict of views of
        # every output (a cost per output, and a shared-weights model has G x K outputs:
        # docs/benchmarks.md, "Figures behind choices in the code").
        self._infer = _pyov().InferRequest.infer

    def _bind_gears(self) -> None:
        model, info, k_out = self.model, self.model.info, len(self.model.info.output_names)
        if model.share_weights:
            request = model.gears.create_infer_request()
            self._bind_input(request, GEAR_INDEX, self._index)
        for g in range(info.spec.gear_count):
            if not model.share_weights:
                request = model.per_gear[g].create_infer_request()
            ports = [g * k_out + k if model.share_weights else k for k in range(k_out)]
            for i, name in enumerate(info.spec.input_names):
                tag = f"{name}:g{g}" if model.share_weights else name
                self._bind_input(request, tag, self._input_view(g, i))
            for k, port in enumerate(ports):
                request.set_output_tensor(port, self._tensor(self._outputs[g][k]))
            self._requests.append(request)
            self._ports.append(ports)

    def _input_view(self, g: int, i: int) -> np.ndarray:
        """Input i of gear g as the staging bytes it is staged into (shape and dtype)."""
        info, off, n = self.model.info, self.layout.offset(g, i), self.layout.nbytes(g, i)
        shape = info.spec.shapes(g)[info.spec.input_names[i]]
        return self.staging[off:off + n].view(info.input_dtypes[i]).reshape(shape)

    def _tensor(self, array: np.ndarray) -> Any:
        """A tensor over ``array``'s memory. OpenVINO's tensor does not keep the array alive:
        every array bound here is owned by this session (staging, output buffers)."""
        return self.model._ov.Tensor(array, shared_memory=True)

    def _bind_input(self, request: Any, name: str, array: np.ndarray) -> None:
        request.set_tensor(name, self._tensor(array))

    def run_bound(self, gear: int) -> None:
        """The bare run of gear ``gear`` on what is staged and bound (no copies around it)."""
        try:
            request = self._requests[gear]
        except IndexError:
            raise BackendError(f"this executor's session of {self.model.file.path} is "
                               "closed") from None
        self._index[...] = gear
        try:
            self._infer(request, {}, True, False)
        except Exception as exc:
            raise BackendError(f"OpenVINO run of gear {gear} "
                               f"{self.model.info.spec.gears[gear]} failed: "
                               f"{_first_line(exc)}") from exc

    def run_gear(self, gear: int) -> list[np.ndarray]:
        """Gear ``gear``'s outputs, written by OpenVINO into this session's buffers (their
        static shapes were checked against the gear maps at load)."""
        self.run_bound(gear)
        return self._outputs[gear]

    def run_gear_owned(self, gear: int) -> list[np.ndarray]:
        """Big outputs are written by OpenVINO straight into arrays the caller keeps, bound
        for this one run (no copy), from the session's pool: memory no live array shares,
        recycled once the caller drops it, so a run does not first-touch fresh pages as a new
        ``np.empty`` would (output_pool.py); small ones are copied out of the session's
        buffers."""
        big = self._big[gear]
        if not big or not self._requests:
            return super().run_gear_owned(gear)
        request, ports, outs = self._requests[gear], self._ports[gear], self._outputs[gear]
        array = self._pool.array
        fresh = {k: array(outs[k].shape, outs[k].dtype, outs[k].nbytes)[0] for k in big}
        try:
            for k, f in fresh.items():
                request.set_output_tensor(ports[k], self._tensor(f))
            self.run_bound(gear)
        finally:  # outside this call the request only ever points at the session's buffers
            for k in fresh:
                request.set_output_tensor(ports[k], self._tensor(outs[k]))
        return [fresh[k] if k in fresh else o.copy() for k, o in enumerate(outs)]

    @property
    def has_bare_run(self) -> bool:
        return bool(self._requests)

    def output_nbytes(self) -> int | None:
        """Bytes of the session's output buffers (each output at its largest gear)."""
        return int(sum(b.nbytes for b in self._out_buffers))

    def _run_whole(self, what: str, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        model = self.model
        if self._dynamic is None:
            self._dynamic = model.dynamic_model().create_infer_request()
        feeds = dict(zip(model.info.spec.input_names, arrays, strict=True))
        try:
            result = self._dynamic.infer(feeds)
        except Exception as exc:
            raise BackendError(f"OpenVINO run of the {what} graph failed: "
                               f"{_first_line(exc)}") from exc
        return [np.array(result[o]) for o in self._dynamic.model_outputs]

    def run_dynamic(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if not self.model.info.hybrid:
            raise BackendError("this gear file is not hybrid: a miss has no graph to run")
        return self._run_whole("dynamic-shape", arrays)

    def run_sink(self, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...]]:
        if not self.model.info.sink:
            raise BackendError("this gear file has no sink graph")
        return split_sink_outputs(self._run_whole("sink", arrays))

    def close(self) -> None:
        self._requests, self._ports, self._dynamic = [], [], None


def _pyov() -> Any:
    """OpenVINO's pybind module (the C-level InferRequest methods, without the wrappers)."""
    import openvino._pyopenvino as pyov

    return pyov


def available() -> bool:
    """True when the openvino package imports here."""
    try:
        _runtime()
    except Exception:
        return False
    return True


__all__ = ["DEVICES", "GEAR_INDEX", "OvModel", "OvSession", "available", "open_model",
           "route_gears", "to_ov_model"]
