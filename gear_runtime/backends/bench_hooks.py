"""Optional benchmark hooks: what ``gear-runtime bench`` compares ``execute`` with.

They are not part of the backend interface (:mod:`gear_runtime.backends.base`): a backend
implements them only where it has such runs to offer (today: ONNX Runtime and OpenVINO). The bench
checks for them with ``isinstance`` (these protocols are ``runtime_checkable``) and leaves
out the columns a backend does not offer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class BenchSession(Protocol):
    """A backend session with a bare run of its own: the floor under ``run_gear``."""

    @property
    def has_bare_run(self) -> bool:
        """Whether :meth:`run_bound` can run on this session's model (a sink file has no
        pre-bound gears: then False)."""

    def run_bound(self, gear: int) -> None:
        """The backend's bare run of gear ``gear`` on what is staged and bound, without the
        host/device copies around it: what benchmarks time as "bare"."""

    def output_nbytes(self) -> int:
        """Bytes of the output buffers this session holds."""


@runtime_checkable
class BenchModel(Protocol):
    """A backend model with a naive way to run a gear, and the context a report names."""

    #: The gear file the model was loaded from.
    gear_file_path: str

    @property
    def execution_providers(self) -> list[str] | None:
        """The execution providers in use (ONNX Runtime's names; None once closed)."""

    @property
    def has_naive_run(self) -> bool:
        """Whether :meth:`naive_run` can run this model."""

    def naive_run(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """The naive way to serve a gear, for benchmarks to compare with: the model's own
        runtime fed from Python (``feeds``: input name -> array), outputs allocated by it."""


__all__ = ["BenchModel", "BenchSession"]
