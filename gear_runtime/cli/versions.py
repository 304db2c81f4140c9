"""``gear-runtime --version``: the package's version, then each backend runtime's.

Read from the installed distributions' metadata and the import system's finders, never by
importing a runtime: the answer is instant (onnxruntime, openvino and mindspore_lite take a
second or more to import, pyACL opens the driver) and a broken runtime cannot break it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

NOT_INSTALLED = "not installed"


def distribution_version(name: str) -> str | None:
    """The installed version of pip distribution ``name``, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def module_origin(name: str) -> str | None:
    """Where ``import name`` (a top-level module) would load from, found without importing
    it; None when nothing would."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: in sys.modules without a __spec__
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: its folder
        return str(next(iter(spec.submodule_search_locations)))
    return spec.origin


def _installed(name: str) -> str:
    version = distribution_version(name)
    return NOT_INSTALLED if version is None else f"installed {version}"


def cuda_provider() -> str:
    """Whether the import package ``onnxruntime`` (whichever distribution put it there) has
    ONNX Runtime's CUDA provider library: what ``get_available_providers()`` lists it from.
    Running on it also needs a GPU and CUDA's libraries."""
    origin = module_origin("onnxruntime")
    if origin is None:
        return "not available (no onnxruntime)"
    found = sorted(Path(origin, "capi").glob("*onnxruntime_providers_cuda*"))
    return f"available ({found[0]})" if found else "not available (the CPU build)"


def pyacl() -> str:
    """pyACL ships with the CANN toolkit (no pip metadata): found on the path or not. PyPI's
    unrelated ``acl`` package would be found too, so it is named as what it is."""
    origin = module_origin("acl")
    if origin is None:
        return NOT_INSTALLED
    unrelated = distribution_version("acl")
    if unrelated is not None:
        return f"{NOT_INSTALLED} (`import acl` finds PyPI's unrelated acl {unrelated})"
    return f"installed (the CANN toolkit's: {origin})"


def mindspore_lite() -> str:
    """The MindSpore Lite wheel's version; one installed without metadata is named by path."""
    version = distribution_version("mindspore_lite")
    if version is not None:
        return f"installed {version}"
    origin = module_origin("mindspore_lite")
    return NOT_INSTALLED if origin is None else f"installed (version unknown: {origin})"


def backend_lines() -> list[tuple[str, str]]:
    """(runtime, what is installed) for every backend's runtime, in the README's order."""
    return [("onnxruntime", _installed("onnxruntime")),
            ("onnxruntime-gpu", _installed("onnxruntime-gpu")),
            ("  CUDA provider", cuda_provider()),
            ("openvino", _installed("openvino")),
            ("pyACL", pyacl()),
            ("mindspore_lite", mindspore_lite())]


def version_text(prog: str) -> str:
    """What ``--version`` prints: ``PROG VERSION`` (the first line, as before), then the
    backends, and a warning where the CPU and GPU builds of ONNX Runtime are both installed."""
    from gear_runtime.version import __version__

    python = ".".join(map(str, sys.version_info[:3]))
    lines = [f"{prog} {__version__}", f"backends (Python {python}):"]
    lines += [f"  {name:<16} {state}" for name, state in backend_lines()]
    if distribution_version("onnxruntime") and distribution_version("onnxruntime-gpu"):
        lines.append("warning: onnxruntime and onnxruntime-gpu are both installed; they share "
                     "the import package, so one overwrote the other: pip uninstall -y "
                     "onnxruntime onnxruntime-gpu, then install one (README, \"ONNX Runtime on "
                     "an NVIDIA GPU\")")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0. The text is made only when the
    flag is given (the metadata look-ups cost a few ms), and printed as it is (argparse's
    own action reflows it into one paragraph)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "the version, and each backend's runtime installed")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_text(parser.prog))
        parser.exit()


__all__ = ["VersionAction", "backend_lines", "cuda_provider", "version_text"]
