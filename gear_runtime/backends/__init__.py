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
from typing import Any

from gear_runtime.backends.base import (
    BackendModel,
    BackendSession,
    aligned_buffer,
    import_runtime,
)
from gear_runtime.errors import BackendUnavailableError, GearRuntimeError, InputError

#: backend name -> module. acl, mindspore_lite and openvino import their runtime only when a
#: model is opened (and say what to install then); onnxruntime is a dependency of the package.
BACKENDS: dict[str, str] = {
    "onnxruntime": "gear_runtime.backends.onnxruntime",
    "acl": "gear_runtime.backends.acl",
    "mindspore_lite": "gear_runtime.backends.mindspore_lite",
    "openvino": "gear_runtime.backends.openvino",
    "null": "gear_runtime.backends.null",
}

__all__ = ["BACKENDS", "BackendModel", "BackendSession", "aligned_buffer",
           "import_runtime", "open_model"]


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
