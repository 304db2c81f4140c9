"""The structure stays: no import circles, and no import from a lower layer to a higher one.

Every import counts -- at module level, inside functions (lazy imports) and under
``TYPE_CHECKING`` (a type-only import is still a dependency of the design: where a module
only needs the shape of its owner, it types it with a Protocol instead, as the executor does
for its model). The layers are declared once, below, lowest first: a module may import its own
package (``gear_runtime.<package>``) and packages of strictly lower layers only.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: gear_runtime's packages (and top modules), lowest layer first; one tuple per layer. The flow
#: (spec -> compile -> gear file -> load -> execute -> backend) as imports see it: the format
#: sits below both its writer (the compiler) and its readers (the backends); the runtime drives
#: the backends; the tools, the package's public facade (``gear_runtime/__init__.py``, lazy
#: re-exports), the server and the CLI sit on top.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "version", "files", "progress"),
    ("arguments",),
    ("spec",),
    ("gearfile",),
    ("compiler", "backends", "_core"),
    ("examples",),  # above the compiler: an example writes its model and compiles it
    ("runtime",),
    ("tools",),
    ("llm",),  # above the tools: a build plans its prompt gears from a trace
    ("<facade>",),
    ("serving",),
    ("cli",),
    ("__main__",),  # python -m gear_runtime: runs the CLI
)
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
#: Folders of scripts run as ``python <folder>/<script>.py``, each of which puts the folder on
#: ``sys.path`` and imports its siblings by bare name (``import bench_gears``).
SCRIPT_FOLDERS = ("benchmarks",)


def modules(folder: str, root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file of every .py under ``folder`` (packages by their __init__)."""
    out = {}
    for path in sorted((root / folder).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(module: str, path: Path) -> Iterator[str]:
    """Every module name ``module`` imports anywhere in its file (relative ones resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)  # `from pkg import module`


def graph(*folders: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``folders`` it imports (a package's import is its __init__).

    A module of a :data:`SCRIPT_FOLDERS` folder imports its siblings by their bare names
    (``import bench_gears`` in benchmarks/ is ``benchmarks.bench_gears``): a bare name that
    is a module of the importer's own script folder is resolved to it, as Python does with
    the folder first on ``sys.path``.
    """
    mods: dict[str, Path] = {}
    for folder in folders:
        mods |= modules(folder, root)
    siblings = {folder: _siblings(mods, folder) for folder in SCRIPT_FOLDERS}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        top = name.split(".")[0]
        for target in imported(name, path):
            if target.split(".")[0] in siblings.get(top, ()):
                target = f"{top}.{target}"
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                edges[name].add(target)  # a module importing its own package's __init__
    return edges


def _siblings(mods: dict[str, Path], folder: str) -> set[str]:
    """The bare names of the modules directly in script folder ``folder``."""
    return {m.split(".")[1] for m in mods if m.startswith(folder + ".") and m.count(".") == 1}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return "<facade>" if parts == ["gear_runtime"] else parts[1]


def facade_imports(module: str, path: Path, root: Path = ROOT) -> Iterator[int]:
    """The lines where ``module`` imports the package face itself (``gear_runtime/__init__.py``):
    ``import gear_runtime`` (under any alias) or ``from gear_runtime import NAME`` where NAME
    is no module of the package (``from gear_runtime import arguments`` imports a module,
    not the face). :func:`graph` cannot see these: to it every module's ancestors are its own
    packages, and the face is everyone's ancestor."""
    own = {m.split(".")[1] for m in modules("gear_runtime", root) if "." in m}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            if any(a.name == "gear_runtime" for a in node.names):
                yield node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base == "gear_runtime" and any(a.name not in own for a in node.names):
                yield node.lineno


def test_no_import_circles_in_the_package_or_the_benchmarks() -> None:
    assert circles(graph("gear_runtime")) == []
    assert circles(graph("benchmarks")) == []
    assert circles(graph("gear_runtime", "benchmarks")) == []


def test_bare_name_imports_of_the_benchmarks_are_seen(tmp_path) -> None:
    """The benchmarks import each other by bare name (their folder on sys.path): the graph
    resolves those to the sibling modules, finds a circle made of them, and leaves a bare
    name that is no sibling (a third-party module) alone."""
    edges = graph("benchmarks")
    assert "benchmarks.bench_scale" in edges["benchmarks.bench_cuda"]  # from bench_scale import
    assert "benchmarks.bench_gears" in edges["benchmarks.run_all"]  # import bench_gears (lazy)
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "a.py").write_text("import numpy\nimport b\n")
    (folder / "b.py").write_text("def f():\n    from c import g\n")
    (folder / "c.py").write_text("from a import x\n")
    found = graph("benchmarks", root=tmp_path)
    assert circles(found) == [["benchmarks.a", "benchmarks.b", "benchmarks.c"]]
    assert found["benchmarks.a"] == {"benchmarks.b"}


def test_every_package_has_a_layer() -> None:
    packages = {package_of(m) for m in modules("gear_runtime")}
    assert packages <= set(LAYER_OF), sorted(packages - set(LAYER_OF))


def test_imports_only_go_down_the_layers() -> None:
    upward = sorted(
        (source, target) for source, targets in graph("gear_runtime").items()
        for target in targets
        if package_of(source) != package_of(target)
        and LAYER_OF[package_of(source)] <= LAYER_OF[package_of(target)])
    assert upward == []


def test_only_the_layers_above_the_package_face_import_it() -> None:
    """``import gear_runtime as gr`` in a module below the face (an example calling
    ``gr.compile``) is an upward import too: such a module imports the module it needs
    (``gear_runtime.compiler``). The serving layer and the CLI, above the face, may use it."""
    below = sorted(f"{m}:{line}" for m, path in modules("gear_runtime").items()
                   if package_of(m) != "<facade>"
                   and LAYER_OF[package_of(m)] < LAYER_OF["<facade>"]
                   for line in facade_imports(m, path))
    assert below == []


def test_the_checks_see_what_they_claim() -> None:
    """The graph is not empty and finds what it must: a known edge, a circle, an upward
    import (a test of the test: a graph that sees nothing would pass everything)."""
    edges = graph("gear_runtime")
    assert "gear_runtime.runtime.dispatch" in edges["gear_runtime.runtime.model"]
    assert "gear_runtime.spec" in edges["gear_runtime.runtime.executor"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert LAYER_OF["spec"] < LAYER_OF["runtime"] < LAYER_OF["serving"]


def test_the_face_check_sees_what_it_claims(tmp_path) -> None:
    """An import of the package face is found in every spelling, and an import of one of
    the package's modules through ``from gear_runtime import`` is not one."""
    package = tmp_path / "gear_runtime"
    (package / "examples").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "arguments.py").write_text("")
    (package / "examples" / "__init__.py").write_text("")
    module = package / "examples" / "m.py"
    module.write_text("from gear_runtime import arguments\n"  # 1: a module, not the face
                      "import gear_runtime as gr\n"  # 2
                      "def f():\n"
                      "    import gear_runtime\n"  # 4: lazy
                      "    from gear_runtime import compile, arguments\n"  # 5: compile: the face
                      "    from .. import load\n")  # 6: relative, the face's
    found = list(facade_imports("gear_runtime.examples.m", module, root=tmp_path))
    assert found == [2, 4, 5, 6]


def test_only_the_export_scripts_need_torch() -> None:
    """Nothing in the package, the tests or the benchmarks imports torch or transformers
    except the Hugging Face exports benchmarks/hf_prefill.py, benchmarks/export_hf_bert.py,
    benchmarks/hf_genai_pair.py and benchmarks/hf_engine_check.py, the random checkpoint
    gear_runtime/examples/hf_qwen3.py (lazily) and its test tests/test_llm_build.py (skipped
    without them), each of which says so in the first line of its docstring: the tests must
    run without them (found through every import, lazy ones included)."""
    files = {**modules("gear_runtime"), **modules("tests"), **modules("benchmarks")}
    users = sorted(m for m, path in files.items()
                   if any(name.split(".")[0] in ("torch", "transformers")
                          for name in imported(m, path)))
    assert users == ["benchmarks.export_hf_bert", "benchmarks.hf_engine_check",
                     "benchmarks.hf_genai_pair", "benchmarks.hf_prefill",
                     "gear_runtime.examples.hf_qwen3", "tests.test_llm_build"]
    for m in users:
        doc = ast.get_docstring(ast.parse(files[m].read_text())) or ""
        assert "NEEDS torch + transformers" in doc.splitlines()[0], m
