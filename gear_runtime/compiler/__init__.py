"""The gear compiler: a dynamic ONNX model + a GearSpec -> one gear file.

    from gear_runtime.compiler import compile_model
    compile_model("model.onnx", spec, "model.gear.onnx", hybrid=False, sink=False)

Modules by concern: ``check`` (spec vs model), ``branch`` (static clone per gear), ``outputs``
(per-gear output shapes), ``route`` (GE Case structure / sink routing), ``build`` (the flow
and the file). The format itself: :mod:`gear_runtime.gearfile`; describing a gear file:
:func:`gear_runtime.tools.check.inspect.describe` (a tool, above the compiler).
"""

from __future__ import annotations

from gear_runtime.compiler.build import CompileReport, compile_gears, compile_model

__all__ = ["CompileReport", "compile_gears", "compile_model"]

