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


def test_the_core_stub_names_what_the_module_has() -> None:
    """gear_runtime/_core.pyi (for editors and type checkers) lists every public name and
    method of the built C++ module: a binding added or renamed without regenerating the
    stub fails here."""
    import ast
    from pathlib import Path

    from gear_runtime import _core

    tree = ast.parse((Path(_core.__file__).parent / "_core.pyi").read_text())
    stub: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stub[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            stub[node.name] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub[node.target.id] = set()
    public = {n for n in dir(_core) if not n.startswith("_")}
    assert public <= set(stub), public - set(stub)
    for name in public:
        obj = getattr(_core, name)
        if isinstance(obj, type):
            methods = {m for m in vars(obj) if not m.startswith("_")}
            assert methods <= stub[name], (name, methods - stub[name])
