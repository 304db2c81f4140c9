"""The gear compiler (issue #3): a dynamic ONNX model + a GearSpec -> one gear file.

    from gear_runtime.compile import compile_model, describe
    compile_model("model.onnx", spec, "model.gear.onnx", hybrid=False, sink=False)
    print(describe("model.gear.onnx"))

Modules by concern: ``check`` (spec vs model), ``branch`` (static clone per gear), ``outputs``
(per-gear output shapes), ``route`` (GE Case structure / sink routing), ``compiler`` (the flow
and the file), ``inspect`` (human description). The format itself: :mod:`gear_runtime.gearfile`.

This package is also CALLABLE: ``gear_runtime.compile(model, spec, output, ...)`` is
:func:`compile_model`. Importing a subpackage sets it as an attribute of its parent, so once
``gear_runtime.compile`` (this package) is imported, ``gear_runtime.compile`` names the
package, not the function of the same name in ``gear_runtime/__init__.py``; making the package
callable keeps the public ``gr.compile(...)`` working either way.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from gear_runtime.compile.compiler import CompileReport, compile_gears, compile_model
from gear_runtime.compile.inspect import describe

__all__ = ["CompileReport", "compile_gears", "compile_model", "describe"]


class _CallablePackage(types.ModuleType):
    """Module type of this package: calling it calls :func:`compile_model`."""

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return compile_model(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
