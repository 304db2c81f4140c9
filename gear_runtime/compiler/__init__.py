"""The gear compiler: a dynamic ONNX model + a GearSpec -> one gear file.

    from gear_runtime.compiler import compile_model, describe
    compile_model("model.onnx", spec, "model.gear.onnx", hybrid=False, sink=False)
    print(describe("model.gear.onnx"))

Modules by concern: ``check`` (spec vs model), ``branch`` (static clone per gear), ``outputs``
(per-gear output shapes), ``route`` (GE Case structure / sink routing), ``build`` (the flow
and the file). The format itself: :mod:`gear_runtime.gearfile`.
"""

from __future__ import annotations

from gear_runtime.compiler.build import CompileReport, compile_gears, compile_model
from gear_runtime.tools.inspect import describe

__all__ = ["CompileReport", "compile_gears", "compile_model", "describe"]

