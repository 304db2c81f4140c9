"""The hot path of an executor: exact O(1) gear matching and merged input staging.

Exports, from the C++ extension ``gear_runtime._core``:

``plan_layout(input_nbytes, dims_count, fusion_size=131072, alignment=64, tail_padding=0)
-> Layout``
    Where each input and the int32 dims buffer sit in the host staging buffer per gear, and
    which bytes GE's ONE merged host-to-device copy moves (rules in
    csrc/layout.h). ``tail_padding > 0`` gives every buffer
    ``ALIGN_UP(nbytes, 32) + tail_padding`` bytes before the next one (pyACL's rule for
    buffers carved out of one device block; 0 packs them as GE does). ``Layout`` is
    read-only: ``gear_count``, ``input_count``, ``merged``, ``dims_nbytes``, ``total_bytes``,
    ``alignment``, ``tail_padding``, ``offset(g, i)``, ``nbytes(g, i)``, ``fused(i)``,
    ``dims_offset(g)``, ``merged_span(g) -> (start, end)``, ``separate(g) -> [(start, end),
    ...]``.

``ExecutorCore(input_names, input_shapes, dynamic_positions, gears, input_dtypes, layout,
staging)``
    One per executor (per thread). ``input_shapes`` has -1 on dynamic axes;
    ``dynamic_positions`` is GearSpec's (input, axis, value index) list; ``gears`` the gear
    tuples; ``staging`` a writable C-contiguous uint8 array of at least
    ``layout.total_bytes`` bytes, kept alive by the core. Members:

    * ``gear_count``, ``values_per_gear``, ``layout``, ``last_values`` (values of the last
      successful ``stage``; ``()`` before any).
    * ``match(values) -> int``: O(1) exact lookup; 145012 for a wrong count, 145013
      (GearMismatchError) naming the inputs' dynamic axes and the legal gears nearest first.
    * ``values_from_full_dims(full_dims) -> tuple``: aclmdlSetInputDynamicDims' full dims (all
      inputs' shapes flattened) to gear values, with GE's 145012 checks; not matched.
    * ``extract(arrays) -> tuple``: GetCurDynamicDims from the arrays' shapes (count:
      InputError; rank, static dims, agreement of positions sharing a value: 145012).
    * ``stage(arrays, preset=None, pad=False) -> int``: the whole hot path in one call --
      extract; compare with ``preset`` (values from ``set_dynamic_*``; 145012 if they differ,
      unless ``pad`` and the preset is a gear covering them); match (145013; with ``pad``,
      the cheapest covering gear, the inputs padded with their pad values);
      dtype must equal the model's (InputError; non-C-contiguous arrays are copied first);
      copy every input to ``layout.offset(g, i)`` with the GIL released, write the values as
      int32 at ``layout.dims_offset(g)``; returns the gear index. An array already sitting in
      its own slot of the staging buffer is not copied (zero copy); any other overlap with the
      staging buffer is an InputError.
    * ``nearest(values, k=5) -> list[tuple]``: legal gears by L1 distance, ties by index.
    * ``set_padding(pad_values=None, costs=None)``: per input one element's bytes (None:
      zeros), per gear a cost (None: its input elements); ``cover(values) -> int``: the
      cheapest covering gear; ``last_request``: the last stage's own values (before padding).

Errors are the package's classes (gear_runtime.errors) with GE's codes; a call whose
arguments have the wrong types is a TypeError. The core itself is plain C++
(csrc/executor_core.h); tests/oracle.py models it for the parity tests.
"""

from __future__ import annotations

try:
    from gear_runtime._core import (
        DEFAULT_ALIGNMENT,
        DEFAULT_FUSION_SIZE,
        MAX_FUSION_SIZE,
        ExecutorCore,
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
    "Layout",
    "plan_layout",
]
