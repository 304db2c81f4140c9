"""The C++ hot path, ``gear_runtime._core``: what it exports and where its contract lives.

* ``plan_layout(...) -> Layout``: where every input and the int32 dims buffer sit in the
  staging buffer per gear, and what GE's ONE merged host-to-device copy moves
  (csrc/layout.h).
* ``GearDispatch``: which gear -- exact match, the cheapest cover by the configured costs,
  GetCurDynamicDims from shapes, any request's input elements (csrc/dispatch.h); one per
  model, immutable; Python uses it through
  :class:`gear_runtime.runtime.dispatch.GearDispatcher`.
* ``ExecutorCore(dispatch, input_dtypes, layout, staging)``: one executor's hot path -- the
  shared GearDispatch's answer for the request (``core.dispatch`` is that very instance),
  every check, then one copy of all inputs (padded where the gear is larger) and the dims
  into the staging buffer, with the GIL released around a large copy (csrc/executor_core.h).
  ``stage(arrays, preset, pad)`` stages a list of arrays; ``execute(inputs, preset, pad,
  copy)`` reads a plain request itself (a dict of the input names or a list / tuple, of
  numpy arrays; anything else: None, nothing staged), stages it and makes the gear's direct
  run set with ``set_runs`` (``BackendSession.direct_runs``), all in one call.

The headers state each call's contract once. csrc/bindings.cc holds the declarative pybind11
bindings, csrc/py_convert.* the conversions they share with the fast path, and
csrc/fast_path.* the one hand-written CPython call (``execute``, numpy's public C API) that
also makes the direct run (a Python call the backend handed over; its contract is in its
comments there).
Errors are the package's classes (gear_runtime.errors) with GE's codes; a call whose
arguments have the wrong types is a TypeError. tests/oracle.py models the pair in plain
Python for the parity tests (tests/native_pair.py puts the C++ pair in the oracle's shape).
"""

from __future__ import annotations

try:
    from gear_runtime._core import (
        DEFAULT_ALIGNMENT,
        DEFAULT_FUSION_SIZE,
        MAX_FUSION_SIZE,
        ExecutorCore,
        GearDispatch,
        Layout,
        plan_layout,
    )
except ImportError as exc:
    raise ImportError(
        "gear_runtime._core, the C++ hot path, is not built: install the package with "
        "`pip install .` (or build it in a checkout with `python setup.py build_ext "
        f"--inplace`) ({exc})") from exc

__all__ = [
    "DEFAULT_ALIGNMENT",
    "DEFAULT_FUSION_SIZE",
    "MAX_FUSION_SIZE",
    "ExecutorCore",
    "GearDispatch",
    "Layout",
    "plan_layout",
]
