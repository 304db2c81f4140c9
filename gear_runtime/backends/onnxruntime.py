"""ONNX Runtime backend: gear files on CPU, and on CUDA with one CUDA graph per gear.

Shape of the backend (PEERS.md has the measurements behind each choice):

* One ``InferenceSession`` per gear, built from that gear's static branch, so ORT plans for a
  fully static shape (what GE gives each gear on the NPU).
* ONE copy of the weights for all sessions: every session gets the same ``OrtValue`` per
  weight through ``SessionOptions.add_initializer``, and the branches only *declare* the
  weights, as external data in one file written once at load (graph optimizers that fold or
  fuse a weight read it from there, briefly; nothing keeps a per-session copy). Prepacking is
  disabled, or each session would keep a private prepacked copy. Measured: 8 sessions of a
  64 MB MLP add ~11 MB instead of ~550 MB.
* IO binding done once per executor: gear ``g``'s inputs are bound to their offsets in the
  executor's staging buffer and its outputs to preallocated arrays, so a run is one
  ``run_with_iobinding`` through the C binding (the public Python wrapper adds tens of us of
  checks per call). On CPU the staging buffer is what the session reads: no further copy.
* CUDA: the merged span of the staging buffer goes to the device in ONE copy; inputs too large
  to merge are copied one by one (GE's CopyInputDataWithMergeH2D). With ``cuda_graph=True``
  every gear is captured once as a CUDA graph at executor creation, largest gear first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from gear_runtime.backends.base import BackendModel, BackendSession, ModelInfo, aligned_buffer
from gear_runtime.errors import BackendError
from gear_runtime.gearfile import GearFile, read_gear_file

#: Weights smaller than this stay inline in each branch: shape inference must read small
#: constants (axes, shapes) from the proto itself, and sharing a few bytes saves nothing.
SHARE_MIN_BYTES = 4096

#: Name of the file, in a private temporary folder, that the branches' weights point to.
WEIGHTS_FILE = "weights.bin"

_ALIGN = 64


def open_model(path: str, providers: Sequence[Any] | None = None, *,
               cuda_graph: bool = False, device_id: int = 0,
               intra_op_num_threads: int | None = None,
               session_config: dict[str, str] | None = None,
               prepack: bool = False) -> OrtModel:
    """Load a gear file made by ``gear_runtime.compile``.

    ``providers``: ORT execution providers (default CPU). Asking for CUDA needs
    onnxruntime-gpu and a GPU; ``cuda_graph=True`` captures one CUDA graph per gear.
    ``prepack``: let every gear's session prepack its weights (ORT's MatMul/Conv weight
    layout). Faster kernels, but each session keeps a private prepacked copy, so weight
    memory grows with the number of gears; the default keeps ONE copy (measured on the
    built-in example, 1 thread: prepacking off costs ~10% at the smallest gear).
    """
    return OrtModel(read_gear_file(path), providers=providers, cuda_graph=cuda_graph,
                    device_id=device_id, intra_op_num_threads=intra_op_num_threads,
                    session_config=session_config, prepack=prepack)


def check_providers(providers: Sequence[Any] | None) -> list[str]:
    """The providers' names (default CPU); a clear error for one this ORT build lacks."""
    names = [p[0] if isinstance(p, tuple) else str(p) for p in (providers or [])]
    names = names or ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    missing = [p for p in names if p not in available]
    if missing:
        raise BackendError(
            f"ONNX Runtime here has no {', '.join(missing)} (available: {', '.join(available)})"
            "; for CUDA install onnxruntime-gpu (pip install 'gear_runtime[cuda]') and run on "
            "a machine with an NVIDIA GPU")
    return names


class OrtModel(BackendModel):
    """Per-gear ORT sessions over one shared copy of the weights."""

    name = "onnxruntime"

    def __init__(self, gear_file: GearFile, providers: Sequence[Any] | None, cuda_graph: bool,
                 device_id: int, intra_op_num_threads: int | None,
                 session_config: dict[str, str] | None, prepack: bool = False) -> None:
        self.file = gear_file
        self.prepack = prepack
        names = check_providers(providers)
        self.providers = list(providers) if providers else names
        self.on_cuda = names[0] == "CUDAExecutionProvider"
        if cuda_graph and not self.on_cuda:
            raise BackendError("cuda_graph=True needs providers=['CUDAExecutionProvider', ...]")
        self.cuda_graph = cuda_graph
        self.device = ("cuda", device_id) if self.on_cuda else ("cpu", 0)
        self._threads = intra_op_num_threads
        self._config = dict(session_config or {})
        self.info = ModelInfo(
            spec=gear_file.spec, input_dtypes=tuple(gear_file.input_dtypes),
            output_names=tuple(gear_file.output_names),
            output_dtypes=tuple(gear_file.output_dtypes),
            output_shapes=tuple(gear_file.output_shapes),
            hybrid=gear_file.dynamic is not None, sink=gear_file.kind == "sink")
        if cuda_graph and self.info.sink:
            raise BackendError("cuda_graph=True needs a gear file compiled without sink=True: "
                               "a sink file routes with If nodes, which CUDA graphs cannot "
                               "capture")
        # The one copy of the weights, on the sessions' device (add_initializer needs that).
        shared = {n: a for n, a in gear_file.weights.items() if a.nbytes >= SHARE_MIN_BYTES}
        self.weights = {n: self._ortvalue(a) for n, a in shared.items()}
        self._weights_dir, self._weight_spans = _write_weights(shared)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._weights_dir, True)
        self._branch_bytes = [self._with_shared_weights(m) for m in gear_file.branches]
        # Sessions are shared by all executors, except under CUDA graphs, where a captured
        # graph owns fixed addresses and each executor builds its own. A sink file runs whole
        # (the dims are computed inside it): no per-gear sessions.
        per_gear = not (cuda_graph or self.info.sink)
        self.sessions = [self.new_session(b) for b in self._branch_bytes] if per_gear else []
        self.dynamic_session = (self.new_session(self._with_shared_weights(gear_file.dynamic))
                                if gear_file.dynamic is not None else None)
        self.sink_session = (self.new_session(gear_file.model_bytes, share=False)
                             if self.info.sink and gear_file.model_bytes is not None else None)

    def _ortvalue(self, array: np.ndarray) -> ort.OrtValue:
        array = np.ascontiguousarray(array)
        return ort.OrtValue.ortvalue_from_numpy(array, self.device[0], self.device[1])

    def _with_shared_weights(self, model: onnx.ModelProto) -> bytes:
        """Serialized ``model`` whose weights are placeholders filled by add_initializer.

        Outputs that are an input or a weight as they stand get an Identity node and a
        private name (``PASSTHROUGH_SUFFIX``): ORT hands such outputs back as the input's or
        the initializer's own value and never writes a pre-bound output buffer.
        """
        # The reader hands us fresh protos, owned by this model: editing in place is safe.
        _compute_passthrough_outputs(model.graph)
        declared = {t.name for t in model.graph.initializer}
        for name in self.file.weight_names_of(model):
            if name in declared:
                continue
            value = self.file.weights[name]
            if name not in self.weights:  # small: inline
                model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
                continue
            t = model.graph.initializer.add()
            t.name = name
            t.data_type = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
            t.dims.extend(value.shape)
            t.data_location = onnx.TensorProto.EXTERNAL
            offset, length = self._weight_spans[name]
            for key, val in (("location", WEIGHTS_FILE), ("offset", str(offset)),
                             ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, val
        return model.SerializeToString()

    def session_options(self, share: bool = True) -> ort.SessionOptions:
        so = ort.SessionOptions()
        # Errors reach the caller as BackendError; ORT's own copy on stderr would only
        # duplicate them (and break one-line CLI errors): log errors and worse only.
        so.log_severity_level = 3
        if self._threads is not None:
            so.intra_op_num_threads = self._threads
        for key, val in self._config.items():
            so.add_session_config_entry(key, val)
        if share:
            if not self.prepack:  # else each session keeps a private prepacked copy
                so.add_session_config_entry("session.disable_prepacking", "1")
            so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                        self._weights_dir)
            for name, value in self.weights.items():
                so.add_initializer(name, value)
        return so

    def new_session(self, model_bytes: bytes, share: bool = True,
                    providers: list[Any] | None = None) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(model_bytes, self.session_options(share),
                                        providers=providers or self.providers)
        except Exception as exc:  # ORT raises its own types; map them in one place
            raise BackendError(f"onnxruntime could not create a session for "
                               f"{self.file.path}: {exc}") from exc

    def create_session(self, layout: Any) -> OrtSession:
        return OrtSession(self, layout)

    def close(self) -> None:
        self.sessions = []
        self.dynamic_session = self.sink_session = None
        self._cleanup()


#: Suffix of the private name an output gets when it is an input or a weight as it stands.
PASSTHROUGH_SUFFIX = "__gear_runtime_output"


def _compute_passthrough_outputs(graph: onnx.GraphProto) -> None:
    """Give every graph output that no node computes an Identity node of its own."""
    computed = {o for node in graph.node for o in node.output}
    for out in graph.output:
        if out.name not in computed:
            graph.node.append(onnx.helper.make_node(
                "Identity", [out.name], [out.name + PASSTHROUGH_SUFFIX],
                name=out.name + PASSTHROUGH_SUFFIX))
            out.name += PASSTHROUGH_SUFFIX


def _write_weights(weights: dict[str, np.ndarray]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Write every weight once, aligned, to a private folder; return it and each span."""
    folder = tempfile.mkdtemp(prefix="gear_runtime_weights_")
    spans: dict[str, tuple[int, int]] = {}
    with open(os.path.join(folder, WEIGHTS_FILE), "wb") as f:
        for name, array in weights.items():
            f.write(b"\0" * ((-f.tell()) % _ALIGN))
            spans[name] = (f.tell(), array.nbytes)
            f.write(np.ascontiguousarray(array).tobytes())
    return folder, spans


class OrtSession(BackendSession):
    """Per-executor bindings: every gear pre-bound to staging offsets and output buffers."""

    def __init__(self, model: OrtModel, layout: Any) -> None:
        self.model = model
        self.layout = layout
        self.staging = aligned_buffer(max(int(layout.total_bytes), 1))
        info = model.info
        self._run_options = ort.RunOptions()
        gears = range(info.spec.gear_count)
        # Output buffers sized for each output's largest gear, viewed per gear.
        self._out_buffers = [
            np.empty(max(info.output_size(g, k) for g in gears) // info.output_dtypes[k].itemsize
                     or 1, dtype=info.output_dtypes[k])
            for k in range(len(info.output_names))]
        self._outputs = [[buf[:int(np.prod(info.output_shapes[g][k]))].reshape(
            info.output_shapes[g][k]) for k, buf in enumerate(self._out_buffers)] for g in gears]
        if model.cuda_graph:
            # Largest gear first, as vLLM captures: later, smaller graphs reuse its pool.
            order = sorted(gears, key=lambda g: -sum(layout.nbytes(g, i)
                                                     for i in range(layout.input_count)))
            self._sessions: list[ort.InferenceSession | None] = [None] * info.spec.gear_count
            for g in order:
                self._sessions[g] = model.new_session(
                    model._branch_bytes[g],
                    providers=[("CUDAExecutionProvider",
                                {"device_id": model.device[1], "enable_cuda_graph": "1"})])
        else:
            self._sessions = list(model.sessions)
        on_device = model.on_cuda and not info.sink  # a sink file is fed whole, by ORT
        self._device = _DeviceStaging(model, layout, self.staging) if on_device else None
        # A sink file runs whole through run_sink: nothing to bind per gear.
        self._bindings = [] if info.sink else [self._bind(g) for g in gears]
        if model.cuda_graph:
            for g in order:  # the first run captures the graph
                self.run_gear(g)

    def _bind(self, g: int) -> Any:
        """An IOBinding of gear g: inputs at staging (or device) offsets, outputs preallocated."""
        sess = self._sessions[g]
        assert sess is not None
        binding = sess.io_binding()
        spec, info = self.model.info.spec, self.model.info
        shapes = spec.shapes(g)
        for i, name in enumerate(spec.input_names):
            if self._device is not None:
                device, ptr = self._device.input_ptr(g, i)
            else:
                device, ptr = "cpu", self.staging.ctypes.data + self.layout.offset(g, i)
            binding.bind_input(name, device, self.model.device[1], info.input_dtypes[i],
                               list(shapes[name]), ptr)
        for k, output in enumerate(sess.get_outputs()):  # same order, private names kept
            name, out = output.name, self._outputs[g][k]
            if self._device is not None:
                binding.bind_output(name, "cuda", self.model.device[1], out.dtype,
                                    list(out.shape), self._device.output_ptr(g, k))
            else:
                binding.bind_output(name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
        return binding

    def run_gear(self, gear: int) -> list[np.ndarray]:
        if self._device is not None:
            self._device.to_device(gear)
        try:
            self._sessions[gear]._sess.run_with_iobinding(  # type: ignore[union-attr]
                self._bindings[gear]._iobinding, self._run_options)
        except Exception as exc:
            raise BackendError(f"onnxruntime run of gear {gear} "
                               f"{self.model.info.spec.gears[gear]} failed: {exc}") from exc
        if self._device is not None:
            self._device.to_host(gear, self._outputs[gear])
        return self._outputs[gear]

    def _run_session(self, sess: ort.InferenceSession | None, what: str,
                     arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if sess is None:
            raise BackendError(f"this gear file has no {what} graph")
        feeds = dict(zip(self.model.info.spec.input_names, arrays, strict=True))
        try:
            return sess.run(None, feeds)
        except Exception as exc:
            raise BackendError(f"onnxruntime run of the {what} graph failed: {exc}") from exc

    def run_dynamic(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._run_session(self.model.dynamic_session, "dynamic-shape", arrays)

    def run_sink(self, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], tuple[int, ...]]:
        outputs = self._run_session(self.model.sink_session, "sink", arrays)
        *outs, dims = outputs  # GE wires GetDynamicDims as the LAST input of NetOutput
        return outs, tuple(int(d) for d in np.asarray(dims).reshape(-1))

    def close(self) -> None:
        self._bindings = []
        self._sessions = []


class _DeviceStaging:
    """CUDA side of the staging buffer: where gear g's merged span and big inputs live.

    Per gear, one device buffer holds the merged span (ONE host-to-device copy per run) and
    each input too big to merge has its own (one copy each), as GE's merged H2D copy does.
    Outputs are bound to device buffers and copied back after the run.
    Written to ORT's documented Python API; not run on a GPU in this repository's CI.
    """

    def __init__(self, model: OrtModel, layout: Any, staging: np.ndarray) -> None:
        self.layout, self.staging, self.device_id = layout, staging, model.device[1]
        info = model.info
        self.merged: list[ort.OrtValue | None] = []
        self.separate: list[dict[int, ort.OrtValue]] = []
        self.outputs: list[list[ort.OrtValue]] = []
        for g in range(info.spec.gear_count):
            start, end = layout.merged_span(g)
            self.merged.append(self._alloc(end - start) if end > start else None)
            # Empty inputs need no copy (update_inplace wants equal sizes): bound to a 1-byte
            # buffer that is never written.
            self.separate.append({i: self._alloc(layout.nbytes(g, i))
                                  for i in range(layout.input_count) if not layout.fused(i)})
            self.outputs.append([
                ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dt, "cuda", self.device_id)
                for shape, dt in zip(info.output_shapes[g], info.output_dtypes, strict=True)])

    def _alloc(self, nbytes: int) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type([max(nbytes, 1)], np.uint8, "cuda",
                                                         self.device_id)

    def input_ptr(self, g: int, i: int) -> tuple[str, int]:
        if self.layout.fused(i):
            start, _ = self.layout.merged_span(g)
            value = self.merged[g]
            assert value is not None
            return "cuda", value.data_ptr() + self.layout.offset(g, i) - start
        return "cuda", self.separate[g][i].data_ptr()

    def output_ptr(self, g: int, k: int) -> int:
        return self.outputs[g][k].data_ptr()

    def to_device(self, g: int) -> None:
        start, end = self.layout.merged_span(g)
        value = self.merged[g]
        if value is not None:
            value.update_inplace(self.staging[start:end])  # the ONE merged copy
        for i, dev in self.separate[g].items():
            off, n = self.layout.offset(g, i), self.layout.nbytes(g, i)
            if n:
                dev.update_inplace(self.staging[off:off + n])

    def to_host(self, g: int, host: list[np.ndarray]) -> None:
        for dev, out in zip(self.outputs[g], host, strict=True):
            np.copyto(out, dev.numpy())


def cuda_available() -> bool:
    """True when this ORT build has the CUDA EP (a GPU may still be missing)."""
    return "CUDAExecutionProvider" in ort.get_available_providers()


def gpu_present() -> bool:
    """True when an NVIDIA GPU device node exists (the CUDA EP needs one to run)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


__all__ = ["OrtModel", "OrtSession", "check_providers", "cuda_available", "gpu_present",
           "open_model"]
