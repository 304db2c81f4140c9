"""Backends, one file each, imported lazily so that ``import gear_runtime`` needs none of them.

| name             | runs                                   | needs                         |
|------------------|----------------------------------------|-------------------------------|
| onnxruntime      | gear files on ONNX Runtime (CPU, CUDA) | onnxruntime / onnxruntime-gpu |
| acl              | .om models on Ascend through pyACL     | CANN toolkit (pyACL, `acl`)   |
| mindspore_lite   | MindIR models on Ascend                | mindspore_lite                |
| openvino         | gear files on OpenVINO (CPU; GPU, NPU) | openvino ([openvino] extra)   |
| null             | nothing: records calls (tests)         | -                             |
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from gear_runtime.backends.base import (
    BackendModel,
    BackendSession,
    aligned_buffer,
    import_runtime,
)
from gear_runtime.errors import BackendUnavailableError, GearRuntimeError, InputError
from gear_runtime.gearfile.format import OWN_FILE_SUFFIXES

#: backend name -> module. acl, mindspore_lite and openvino import their runtime only when a
#: model is opened (and say what to install then); onnxruntime is a dependency of the package.
BACKENDS: dict[str, str] = {
    "onnxruntime": "gear_runtime.backends.onnxruntime",
    "acl": "gear_runtime.backends.acl",
    "mindspore_lite": "gear_runtime.backends.mindspore_lite",
    "openvino": "gear_runtime.backends.openvino",
    "null": "gear_runtime.backends.null",
}


@dataclass(frozen=True)
class BackendFacts:
    """What the command line, the server and the tools need to know of a backend, kept here
    (beside the backends) rather than as name checks where they are used.

    ``own_suffix``: the backend opens its own model files of this suffix (an .om, a MindIR),
    not gear files. ``threads_option`` / ``device_option`` / ``config_option`` /
    ``providers_option``: the ``load`` option ``--threads`` / ``--device`` / ``--config`` /
    ``--providers`` set (None: the backend has none). ``device_kind``: what ``--device``
    takes, an integer id or a device name. ``spin_keys``: the ``session_config`` keys that
    turn the backend's thread-pool spinning on or off (the server's ``--spin``).
    ``shares_weights``: ``load(..., share_weights_with=)`` works between two of its models.
    ``instance_kind``: the Triton model config's instance_group kind. ``reads_gear_file``:
    ``inspect`` reads a gear file itself, with no backend opened (the default backend runs
    the file as it is, so the file says everything). ``naive``: what the bench table's
    naive column runs on it (``BackendModel.naive_run``; empty: none)."""

    own_suffix: str | None = None
    threads_option: str | None = None
    device_option: str | None = None
    device_kind: type = int
    config_option: str | None = None
    input_shape_option: str | None = None
    providers_option: str | None = None
    spin_keys: tuple[str, ...] = ()
    shares_weights: bool = False
    instance_kind: str = "KIND_MODEL"
    reads_gear_file: bool = False
    naive: str = ""


_SUFFIX_OF = {backend: suffix for suffix, backend in OWN_FILE_SUFFIXES.items()}

#: The backend ``load`` uses when none is named.
DEFAULT_BACKEND = "onnxruntime"

FACTS: dict[str, BackendFacts] = {
    "onnxruntime": BackendFacts(
        threads_option="intra_op_num_threads", device_option="device_id",
        providers_option="providers", shares_weights=True, instance_kind="KIND_CPU",
        spin_keys=("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"),
        reads_gear_file=True, naive="session.run(None, feeds) on the model's session"),
    "acl": BackendFacts(own_suffix=_SUFFIX_OF["acl"], device_option="device_id",
                        input_shape_option="input_shape"),
    "mindspore_lite": BackendFacts(own_suffix=_SUFFIX_OF["mindspore_lite"],
                                   device_option="device_id", config_option="config",
                                   shares_weights=True),
    "openvino": BackendFacts(threads_option="num_threads", device_option="device",
                             device_kind=str,
                             naive="OpenVINO's own dynamic-shape model of the source graph (x "
                                   "naive: what the static gears gain)"),
    "null": BackendFacts(),
}


#: Names the command line takes for a backend with options: ``--backend cuda`` is ONNX Runtime
#: with the CUDA provider first (CPU for what CUDA lacks).
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "cuda": ("onnxruntime", {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}),
}


def facts(backend: str) -> BackendFacts:
    """The facts of ``backend`` (an unknown name gets none: ``open_model`` refuses it)."""
    return FACTS.get(backend, BackendFacts())


def backend_of_file(path: str) -> str | None:
    """The backend that opens ``path`` by its suffix (an .om: acl), or None."""
    lower = str(path).lower()
    return next((b for b, f in FACTS.items() if f.own_suffix and lower.endswith(f.own_suffix)),
                None)


__all__ = ["ALIASES", "BACKENDS", "DEFAULT_BACKEND", "FACTS", "BackendFacts", "BackendModel",
           "BackendSession", "aligned_buffer", "backend_of_file", "facts", "import_runtime",
           "open_model"]


def open_model(path: str, backend: str, **options: Any) -> BackendModel:
    """Open ``path`` on ``backend``; each backend module defines ``open_model(path, **options)``.

    Raises BackendUnavailableError (naming what to install) when the backend's runtime is
    missing, and GearRuntimeError for an unknown backend name.
    """
    if backend not in BACKENDS:
        raise GearRuntimeError(
            f"backend {backend!r} is unknown; expected one of {', '.join(sorted(BACKENDS))}")
    try:
        module = importlib.import_module(BACKENDS[backend])
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {backend!r} needs a module that is not installed here ({exc}); "
            f"pip install {exc.name or 'it'}") from exc
    try:  # a misspelt or foreign option is the user's error, not a TypeError from inside
        inspect.signature(module.open_model).bind(path, **options)
    except TypeError as exc:
        accepted = [p for p in inspect.signature(module.open_model).parameters if p != "path"]
        raise InputError(f"backend {backend!r} does not take these options ({exc}); it takes: "
                         f"{', '.join(accepted)}") from None
    return module.open_model(path, **options)
