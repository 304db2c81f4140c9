"""Backends, one file each, imported lazily so that ``import gear_runtime`` needs none of them.

| name             | runs                                   | needs                         |
|------------------|----------------------------------------|-------------------------------|
| onnxruntime      | gear files on ONNX Runtime (CPU, CUDA) | onnxruntime / onnxruntime-gpu |
| acl              | .om models on Ascend through pyACL     | CANN toolkit (pyACL, `acl`)   |
| mindspore_lite   | MindIR models on Ascend                | mindspore_lite                |
| null             | nothing: records calls (tests)         | -                             |
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from gear_runtime.backends.base import BackendModel, BackendSession, ModelInfo
from gear_runtime.errors import BackendUnavailableError, GearRuntimeError, InputError

#: backend name -> (module, what to install when its runtime is missing)
BACKENDS: dict[str, tuple[str, str]] = {
    "onnxruntime": ("gear_runtime.backends.onnxruntime",
                    "pip install onnxruntime (or onnxruntime-gpu)"),
    "acl": ("gear_runtime.backends.acl",
            "the CANN toolkit (pyACL): source set_env.sh of Ascend-cann-toolkit"),
    "mindspore_lite": ("gear_runtime.backends.mindspore_lite",
                       "pip install mindspore-lite (Ascend build)"),
    "null": ("gear_runtime.backends.null", ""),
}

__all__ = ["BACKENDS", "BackendModel", "BackendSession", "ModelInfo", "open_model"]


def open_model(path: str, backend: str, **options: Any) -> BackendModel:
    """Open ``path`` on ``backend``; each backend module defines ``open_model(path, **options)``.

    Raises BackendUnavailableError (naming what to install) when the backend's runtime is
    missing, and GearRuntimeError for an unknown backend name.
    """
    if backend not in BACKENDS:
        raise GearRuntimeError(
            f"backend {backend!r} is unknown; expected one of {', '.join(sorted(BACKENDS))}")
    module_name, install = BACKENDS[backend]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {backend!r} needs a runtime that is not installed here ({exc}); "
            f"install {install}") from exc
    try:  # a misspelt or foreign option is the user's error, not a TypeError from inside
        inspect.signature(module.open_model).bind(path, **options)
    except TypeError as exc:
        accepted = [p for p in inspect.signature(module.open_model).parameters if p != "path"]
        raise InputError(f"backend {backend!r} does not take these options ({exc}); it takes: "
                         f"{', '.join(accepted)}") from None
    return module.open_model(path, **options)
