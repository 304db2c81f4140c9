"""The package surface: light import, the public names, gr.compile stays a function."""

from __future__ import annotations

import subprocess
import sys

import gear_runtime as gr


def test_import_needs_no_backend_runtime() -> None:
    code = ("import sys, gear_runtime; print([m for m in "
            "('acl', 'mindspore_lite', 'onnxruntime', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_compile_stays_the_function_after_the_compiler_is_imported() -> None:
    import gear_runtime.compiler  # noqa: F401  (a subpackage named like the function would shadow it)

    assert callable(gr.compile) and gr.compile.__module__ == "gear_runtime"


def test_public_names() -> None:
    for name in ("GearSpec", "compile", "load", "GearModel", "Executor", "GearRuntimeError",
                 "GearSpecError", "GearMismatchError", "DynamicInputLengthError", "InputError",
                 "BackendError", "BackendUnavailableError", "CompileError", "GearFileError"):
        assert hasattr(gr, name), name
    assert issubclass(gr.GearMismatchError, gr.GearRuntimeError)
    assert gr.GearMismatchError("x").code == "145013"
    assert str(gr.DynamicInputLengthError("y")) == "[145012] y"
