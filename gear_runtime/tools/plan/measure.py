"""The ``"measured"`` cost: a ladder of gears of the user's model compiled and benchmarked
with the bench engine; the latency curve interpolates between them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.spec import GearSpec
from gear_runtime.tools.plan.costs import LatencyCurve


def measure_latency(model: str | os.PathLike[str], spec: GearSpec,
                    ladder: Sequence[Sequence[int]], key: int = 0, *, iterations: int = 20,
                    warmup: int = 3, threads: int | None = 1, inputs: Any = None,
                    workdir: str | None = None, progress: bool = False) -> LatencyCurve:
    """Compile ``model`` (a dynamic ONNX model) under ``spec``'s inputs with the ``ladder``
    gears, benchmark every gear with the bench engine (``execute`` p50) and return latency
    as a function of value ``key``. ``inputs(model, gear)`` as for ``bench_model``.
    ``progress``: the compile's and the benchmark's bars on a terminal (none on a log)."""
    import dataclasses
    import tempfile

    from gear_runtime.compiler import compile_model
    from gear_runtime.tools.bench.engine import bench_model

    gears = tuple(sorted({tuple(int(v) for v in g) for g in ladder}))
    ladder_spec = dataclasses.replace(spec, gears=gears, hybrid=False)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = os.path.join(tmp, "ladder.gear.onnx")
        compile_model(os.fspath(model), ladder_spec, path, progress=progress)
        report = bench_model(path, iterations=iterations, warmup=warmup, threads=threads,
                             inputs=inputs, progress=progress)
    return LatencyCurve(tuple(g[key] for g in gears), tuple(b.execute.p50 for b in report.gears))


def ladder_sizes(largest: int, count: int) -> list[int]:
    """``count`` sizes from 1 to ``largest``, geometric (latency curves bend at small sizes)."""
    sizes = np.unique(np.round(np.geomspace(1, largest, count)).astype(np.int64))
    return [int(v) for v in sizes]
