"""The staging layout for backend tests: the C++ core's own (``gear_runtime.runtime.core``).

:func:`plan_layout` is ``gear_runtime.runtime.core.plan_layout`` with the backend tests' argument
order, plus the backend's ``layout_options`` as keywords, so a test plans the same layout
GearModel does. :func:`stage` writes a known gear's inputs into a staging buffer without the
core's checks (tests only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.runtime import core


def plan_layout(input_nbytes: Sequence[Sequence[int]], dims_count: int,
                fusion_size: int = core.DEFAULT_FUSION_SIZE, **options: int) -> Any:
    """``gear_runtime.runtime.core.plan_layout``; ``options`` are a backend's ``layout_options``
    (e.g. ``alignment``, ``tail_padding``)."""
    return core.plan_layout(input_nbytes, dims_count, fusion_size=fusion_size, **options)


def stage(staging: Any, layout: Any, spec: Any, dtypes: Sequence[Any], gear: int,
          arrays: Sequence[Any]) -> None:
    """What the core's ``stage`` does for a known gear: every input at ``offset(gear, i)``,
    the int32 dynamic values at ``dims_offset(gear)`` (tests only; no checks)."""
    for i, a in enumerate(arrays):
        off, n = int(layout.offset(gear, i)), int(layout.nbytes(gear, i))
        staging[off:off + n] = np.ascontiguousarray(a, dtype=dtypes[i]).view(np.uint8).ravel()
    if int(layout.dims_nbytes):
        off = int(layout.dims_offset(gear))
        values = np.asarray(spec.gears[gear], dtype=np.int32).view(np.uint8)
        staging[off:off + values.size] = values
