"""The context of a benchmark run, stored in its JSON so that two runs can be compared: the
machine, the versions, the model's files and their digest, and the process's memory."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from gear_runtime.backends import FACTS
from gear_runtime.gearfile.digest import hash_file

if TYPE_CHECKING:
    from gear_runtime.runtime.model import GearModel

#: The algorithm prefix of :func:`files_digest` (compare: two runs' digests are compared only
#: when their prefixes agree, else their sizes).
FILES_DIGEST = "xxh3_128-files"

def rss_bytes() -> int | None:
    """Resident set size of this process (psutil when installed, else /proc), or None."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.Process().memory_info().rss)
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None



def machine_context() -> dict[str, Any]:
    """The machine now: CPU model, logical cores (all, and those this process may use), the
    1/5/15-minute load average (None where the OS has none) and the platform."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cores": usable,
            "load_average": load, "platform": platform.platform()}


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8",
                                             errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def versions() -> dict[str, str | None]:
    """Versions of what the timings depend on (None: not installed)."""
    from gear_runtime.version import __version__

    ort_version = None
    with contextlib.suppress(ImportError):
        import onnxruntime

        ort_version = onnxruntime.__version__
    return {"gear_runtime": __version__, "onnxruntime": ort_version, "numpy": np.__version__,
            "python": platform.python_version()}


#: backends that open a model file of their own (an .om, a MindIR), not a gear file
OWN_FILE_BACKENDS = frozenset(b for b, f in FACTS.items() if f.own_suffix)


def model_files(path: str, backend: str = "onnxruntime") -> list[str]:
    """The gear file and the data files it names (absolute paths, in a fixed order); for a
    backend that opens its own file kind (:data:`OWN_FILE_BACKENDS`), that file."""
    if backend in OWN_FILE_BACKENDS:
        return [os.path.abspath(path)]
    from gear_runtime.gearfile.reader import read_gear_file

    return [os.path.abspath(f) for f in read_gear_file(path).files]


def files_digest(files: Sequence[str]) -> str:
    """A digest of the files' contents, ``xxh3_128-files:<hex>``: the xxh3_128 of each file's
    size and xxh3_128 (:func:`gear_runtime.gearfile.digest.hash_file`, the loader's hash), in
    order, so that moving bytes from one file to the next changes it."""
    h = xxhash.xxh3_128()
    for f in files:
        digest, size = hash_file(f)
        h.update(f"{size}:{digest}\n".encode("ascii"))
    return f"{FILES_DIGEST}:{h.hexdigest()}"


def model_context(path: str | None, model: GearModel) -> dict[str, Any]:
    """What identifies the model: path, files, total bytes, digest, mode and gears (path,
    files, bytes and digest None when the gear file is not known)."""
    files = (model_files(path, model.backend) if path is not None and os.path.isfile(path)
             else None)
    return {"path": os.path.abspath(path) if path is not None else None, "files": files,
            "bytes": sum(os.path.getsize(f) for f in files) if files else None,
            "digest": files_digest(files) if files else None, "mode": model.mode,
            "gears": [list(g) for g in model.gears]}




__all__ = ["FILES_DIGEST", "files_digest", "machine_context", "model_context", "model_files",
           "rss_bytes", "versions"]
