"""The package as its ecosystem sees it: an sdist that builds, the PEP 639 license,
``python -m gear_runtime``, ``--version`` naming the backends, the global ``-v`` / ``-q``.

(The sdist installed into a fresh venv, the C++ core built from it, is .ci/sdist.sh: minutes.)
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import onnx
import pytest
from cli_support import run_cli
from models import RESHAPE_SPEC, reshape_model
from test_progress import run_cli as run_cli_on

from gear_runtime import progress
from gear_runtime.cli import verbosity, versions
from gear_runtime.version import __version__

ROOT = Path(__file__).resolve().parent.parent
#: Not copied to where the sdist is built: what a fresh checkout lacks (.gitignore's). An old
#: gear_runtime.egg-info above all: setuptools adds every file its SOURCES.txt lists, which
#: would hide a file MANIFEST.in misses (seen: the sdist kept csrc/ without `graft csrc`).
NOT_IN_A_CHECKOUT = (".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__",
                     "*.so", ".*cache", ".hypothesis", ".benchmarks", "out")
#: What ``--version`` names, one line each.
BACKEND_LABELS = ("onnxruntime", "onnxruntime-gpu", "CUDA provider", "openvino", "pyACL",
                  "mindspore_lite")


# ---- the sdist ---------------------------------------------------------------------------------
class Sdist(NamedTuple):
    names: set[str]  # its files, relative to its top folder
    pkg_info: str  # its metadata


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Sdist:
    """The sdist of a clean copy of the sources, built in a child process through the PEP 517
    hook of the setuptools installed here (the test extra's, >= 77), without an isolated build
    environment: a second or two, where ``python -m build`` takes 10 s or more."""
    out = tmp_path_factory.mktemp("sdist")
    shutil.copytree(ROOT, out / "src", ignore=shutil.ignore_patterns(*NOT_IN_A_CHECKOUT))
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=out / "src", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    name = done.stdout.strip().splitlines()[-1]
    prefix = f"gear_runtime-{__version__}/"
    with tarfile.open(out / name) as tar:
        names = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
        pkg_info = tar.extractfile(prefix + "PKG-INFO").read().decode()  # type: ignore[union-attr]
    return Sdist(names, pkg_info)


def test_the_sdist_holds_everything_the_cmake_build_needs(sdist: Sdist) -> None:
    """Every C++ source and header (csrc/, its tests included: GEAR_RUNTIME_BUILD_TESTS
    builds from it too), CMakeLists.txt, setup.py, pyproject.toml, the README and the stub."""
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").rglob("*")
               if p.suffix in (".cc", ".h")}
    assert len(sources) > 20, sources  # the glob saw the tree
    needed = sources | {"CMakeLists.txt", "setup.py", "pyproject.toml", "README.md",
                        "gear_runtime/_core.pyi", "gear_runtime/py.typed",
                        "gear_runtime/__main__.py"}
    assert needed <= sdist.names, sorted(needed - sdist.names)


def test_the_sdist_holds_no_tests_nor_build_outputs(sdist: Sdist) -> None:
    """No test files (setuptools' defaults add tests/test*.py alone, which cannot run without
    their conftest), no built module, no venv."""
    unwanted = [n for n in sdist.names
                if n.startswith(("tests/", "build/", ".venv/", "benchmarks/", ".ci/"))
                or n.endswith((".so", ".pyc", ".o"))]
    assert unwanted == []


def test_the_license_is_an_spdx_expression(sdist: Sdist) -> None:
    """PEP 639: ``license = "Apache-2.0"`` (a string, no longer a table), built by a
    setuptools that reads it (>= 77), and so written to the metadata as License-Expression.
    (Python 3.10 has no tomllib: the lines are read as text.)"""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.findall(r"^license = (.*)$", text, re.M) == ['"Apache-2.0"']
    requires = re.search(r"^requires = \[(.*)\]$", text, re.M)
    assert requires is not None and '"setuptools>=77"' in requires.group(1)
    assert sdist.pkg_info.count("\nLicense-Expression: Apache-2.0\n") == 1


# ---- python -m gear_runtime --version ----------------------------------------------------------
def test_python_m_gear_runtime_version_names_every_backend() -> None:
    """The first line as before (``gear-runtime X``), then one line per backend runtime,
    each installed with its version or not installed; onnxruntime's matches pip's."""
    out = subprocess.run([sys.executable, "-m", "gear_runtime", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (0, "")
    lines = out.stdout.splitlines()
    assert lines[0] == f"gear-runtime {__version__}"
    for label in BACKEND_LABELS:
        line = next((x for x in lines if x.strip().startswith(label + " ")), None)
        assert line is not None, (label, out.stdout)
        assert re.search(r"(installed|available)", line), line
    ort = next(x for x in lines if x.strip().startswith("onnxruntime "))
    assert f"installed {metadata.version('onnxruntime')}" in ort


def test_version_imports_no_runtime() -> None:
    code = ("import sys; from gear_runtime.cli.app import main; main(['--version']); "
            "print([m for m in ('onnxruntime', 'openvino', 'acl', 'mindspore_lite', 'torch') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "[]"


def test_version_warns_when_both_onnxruntime_builds_are_installed(monkeypatch) -> None:
    monkeypatch.setattr(versions, "distribution_version", lambda name: {
        "onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"}.get(name))
    text = versions.version_text("gear-runtime")
    assert "onnxruntime-gpu  installed 1.31.1" in text
    assert "warning: onnxruntime and onnxruntime-gpu are both installed" in text.splitlines()[-1]


def test_version_sees_the_cuda_provider_in_the_import_package(monkeypatch, tmp_path) -> None:
    """Whichever distribution put it there: the provider library in onnxruntime/capi."""
    (tmp_path / "capi").mkdir()
    monkeypatch.setattr(versions, "module_origin", lambda name: str(tmp_path))
    assert versions.cuda_provider() == "not available (the CPU build)"
    (tmp_path / "capi" / "libonnxruntime_providers_cuda.so").touch()
    assert versions.cuda_provider().startswith("available (")


def test_version_names_pypis_unrelated_acl_package(monkeypatch) -> None:
    monkeypatch.setattr(versions, "module_origin", lambda name: "/site-packages/acl")
    monkeypatch.setattr(versions, "distribution_version",
                        lambda name: "0.1" if name == "acl" else None)
    assert "PyPI's unrelated acl 0.1" in versions.pyacl()
    monkeypatch.setattr(versions, "distribution_version", lambda name: None)
    assert versions.pyacl() == "installed (the CANN toolkit's: /site-packages/acl)"


# ---- -v / -q -----------------------------------------------------------------------------------
@pytest.fixture
def restored() -> Iterator[None]:
    """An in-process ``-q`` / ``-v`` run leaves its settings behind (the next run resets
    them): reset them here so the next test's bars and log are as usual."""
    yield
    progress.silence(False)
    logging.getLogger(verbosity.LOGGER).setLevel(logging.NOTSET)


@pytest.fixture(scope="module")
def reshape_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quiet") / "m.onnx"
    onnx.save(reshape_model(), str(path))
    return path


def _compile_args(out: str) -> list[str]:
    return ["compile", "m.onnx", "--input-shape", RESHAPE_SPEC["input_shape"],
            "--dynamic-dims", RESHAPE_SPEC["dynamic_dims"], "--hybrid", "-o", out]


def test_quiet_silences_the_progress_bar_on_a_terminal(reshape_onnx: Path) -> None:
    folder = reshape_onnx.parent
    code, err = run_cli_on(_compile_args("bar.gear.onnx"), True, folder)
    assert code == 0 and "compile:" in err  # the bar, as a user sees it
    code, err = run_cli_on(["-q", *_compile_args("quiet.gear.onnx")], True, folder)
    assert (code, err) == (0, "")


def test_quiet_drops_the_info_line_not_the_results(capsys, reshape_onnx: Path, monkeypatch,
                                                   restored: None) -> None:
    monkeypatch.chdir(reshape_onnx.parent)
    code, out, _ = run_cli(capsys, *_compile_args("a.gear.onnx"))
    assert code == 0 and out.startswith("wrote a.gear.onnx")
    code, out, err = run_cli(capsys, "-q", *_compile_args("b.gear.onnx"))
    assert (code, out, err) == (0, "", "")
    code, out, _ = run_cli(capsys, "-q", "run", "b.gear.onnx", "--shapes", "x:2x8x8",
                           "--json", "r.json")
    assert code == 0 and "y: float32 [2, 128]" in out and "wrote" not in out  # the result stays


def test_verbose_shows_the_packages_info_log(reshape_onnx: Path) -> None:
    """``-v``: the INFO lines of the ``gear_runtime`` logger on stderr (here the hybrid miss:
    dims that match no gear run the dynamic-shape graph); none without it."""
    folder = reshape_onnx.parent
    assert run_cli_on(_compile_args("h.gear.onnx"), False, folder)[0] == 0
    run = ["run", "h.gear.onnx", "--shapes", "x:3x5x8"]
    code, err = run_cli_on(["-v", *run], False, folder)
    assert code == 0 and "gear_runtime INFO: dynamic dims (3, 5) match no gear" in err, err
    assert run_cli_on(run, False, folder) == (0, "")


def test_verbose_and_quiet_exclude_each_other(capsys) -> None:
    code, _, err = run_cli(capsys, "-v", "-q", "inspect", "x.gear.onnx")
    assert code == 2 and "not allowed with argument" in err
