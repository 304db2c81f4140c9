"""Pure-Python twin of the C++ core ``gear_runtime._core``: same names, results and errors.

It exists for three reasons: parity tests run both on the same inputs and compare results and
error class / code / message; the benchmark uses it as the baseline; and
``GEAR_RUNTIME_PURE_PYTHON=1`` makes :mod:`gear_runtime.core` export it for debugging.
Every message here must stay identical to ``csrc/`` (errors.cc, gear_table.cc, dims.cc,
layout.cc, staging.cc, bindings.cc); the checks run in the same order as there, so that the
first failure reported is the same one.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import (
    ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID,
    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID,
    ACL_ERROR_GE_PARAM_INVALID,
    DynamicInputLengthError,
    GearMismatchError,
    GearSpecError,
    InputError,
)

#: ge.exec.input_fusion_size's default (bytes): inputs up to this size join the merged copy.
DEFAULT_FUSION_SIZE = 131072
#: GE caps input_fusion_size at 32 MiB.
MAX_FUSION_SIZE = 32 * 1024 * 1024
#: Default alignment of every buffer in the staging layout (bytes).
DEFAULT_ALIGNMENT = 64
_PADDING_GRANULE = 32  # ALIGN_UP(len, 32) of pyACL's carving rule (csrc/layout.h)

_MAX_GEAR_VALUE = 2**31 - 1  # the dims buffer (ascend_mbatch_shape_data) is int32
_MAX_VALUES = 128  # ACL_MAX_DIM_CNT
_GEARS_SHOWN = 8  # gears listed in a 145013 message before "... and N more"
_SIZE_MAX = 2**64 - 1  # size_t in the C++ core: the layout must fit it
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


# ---- errors (csrc/errors.cc) -----------------------------------------------------------------
def _input(message: str) -> InputError:
    return InputError(message, ACL_ERROR_GE_PARAM_INVALID)


def _length(message: str) -> DynamicInputLengthError:
    return DynamicInputLengthError(message, ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID)


def _mismatch(message: str) -> GearMismatchError:
    return GearMismatchError(message, ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)


def _spec(message: str, code: str | None = None) -> GearSpecError:
    return GearSpecError(message, code)


def _tuple_text(values: Sequence[int]) -> str:
    """Python's repr of a tuple of ints (what C++'s format_tuple writes)."""
    return repr(tuple(int(v) for v in values))


# ---- argument conversion (csrc/bindings.cc) --------------------------------------------------
def _items(obj: Any, what: str) -> list[Any] | tuple[Any, ...]:
    """``obj`` as PySequence_Fast sees it: lists/tuples as they are, other iterables read once."""
    if isinstance(obj, list | tuple):
        return obj
    try:
        return list(obj)
    except TypeError:
        raise _input(f"{what} must be a sequence, got {type(obj).__name__}") from None


def _int64(obj: Any, label: str) -> int:
    """``operator.index(obj)`` within int64; ``label`` names it in messages."""
    try:
        value = int(operator.index(obj))  # int(): True -> 1, as C++ reads it
    except TypeError:
        raise _input(f"{label} is {type(obj).__name__}, not an int") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _input(f"{label} does not fit in 64 bits")
    return value


def _int_list(obj: Any, what: str) -> list[int]:
    return [_int64(v, f"{what} item {j}") for j, v in enumerate(_items(obj, what))]


def _read_values(obj: Any, what: str, expected: int) -> tuple[int, ...]:
    """A gear-sized tuple of values: sequence, then length (145012), then items."""
    items = _items(obj, what)
    if len(items) != expected:
        raise _length(f"{what} have {len(items)} values, the model's gears have {expected}")
    return tuple(_int64(v, f"{what} item {j}") for j, v in enumerate(items))


def _index_arg(obj: Any, what: str, count: int, unit: str) -> int:
    value = _int64(obj, what)
    if not 0 <= value < count:
        raise _input(f"{what} {value} out of range: the layout has {count} {unit}")
    return value


# ---- layout (csrc/layout.cc) -----------------------------------------------------------------
def _checked(value: int) -> int:
    if value > _SIZE_MAX:
        raise _input("layout size overflows: the inputs are too large")
    return value


def _align_up(x: int, alignment: int) -> int:
    return _checked(x + alignment - 1) & ~(alignment - 1)


def _footprint(n: int, tail_padding: int) -> int:
    """Bytes a buffer of ``n`` bytes owns before the next one may start (see plan_layout)."""
    if tail_padding == 0:
        return n  # packed: byte for byte GE's staging
    return _checked(_align_up(n, _PADDING_GRANULE) + tail_padding)


def _place(cursor: int, nbytes: int, alignment: int, tail_padding: int) -> tuple[int, int]:
    """``(offset, end)`` of a buffer placed at ``cursor`` rounded up to ``alignment``; ``end``
    is where its footprint stops (layout.cc's ``place``)."""
    offset = _align_up(cursor, alignment)
    return offset, _checked(offset + _footprint(nbytes, tail_padding))


class Layout:
    """Where each input and the dims buffer sit in the staging buffer, per gear.

    Built by :func:`plan_layout` (whose docstring states the rules); read-only.
    """

    __slots__ = ("_alignment", "_dims_nbytes", "_dims_offsets", "_fused", "_gear_count",
                 "_input_count", "_merged", "_merged_end", "_nbytes", "_offsets",
                 "_tail_padding", "_total_bytes")

    def __init__(self, table: list[list[int]], dims_count: int, fusion_size: int,
                 alignment: int, tail_padding: int = 0) -> None:
        if not table:
            raise _input("input_nbytes has no gears: at least one is needed")
        if alignment <= 0 or alignment & (alignment - 1):  # 0 would put every buffer at 0
            raise _input(f"alignment must be a power of two >= 1, got {alignment}")
        if tail_padding < 0:
            raise _input(f"tail_padding must be >= 0, got {tail_padding}")
        if dims_count > _SIZE_MAX // 4:
            raise _input(f"dims_count {dims_count} is too large")
        gears, inputs = len(table), len(table[0])
        for g in range(1, gears):
            if len(table[g]) != inputs:
                raise _input(f"input_nbytes row {g} has {len(table[g])} inputs, row 0 has {inputs}")
        self._gear_count, self._input_count = gears, inputs
        self._alignment = alignment
        self._tail_padding = tail_padding
        self._dims_nbytes = 4 * dims_count
        fused = [False] * inputs
        taking_part = 0
        if fusion_size >= 0:
            limit = min(fusion_size, MAX_FUSION_SIZE)
            for i in range(inputs):
                fused[i] = max(row[i] for row in table) <= limit
                taking_part += fused[i]
            taking_part += dims_count > 0 and self._dims_nbytes <= limit
        self._merged = taking_part >= 2  # GE merges only two or more buffers
        self._fused = fused if self._merged else [False] * inputs
        self._offsets = [[0] * inputs for _ in range(gears)]
        self._nbytes = [list(row) for row in table]
        self._dims_offsets = [0] * gears
        self._merged_end = [0] * gears
        fused_inputs = [i for i in range(inputs) if self._fused[i]]
        other_inputs = [i for i in range(inputs) if not self._fused[i]]
        total = 0
        for g in range(gears):
            cursor = 0
            for i in fused_inputs:
                self._offsets[g][i], cursor = _place(cursor, table[g][i], alignment, tail_padding)
            cursor = _align_up(cursor, alignment)
            self._dims_offsets[g] = cursor
            if self._dims_nbytes:  # no dims buffer: nothing to own, not even padding
                cursor = _checked(cursor + _footprint(self._dims_nbytes, tail_padding))
            if self._merged:
                self._merged_end[g] = cursor
            for i in other_inputs:
                self._offsets[g][i], cursor = _place(cursor, table[g][i], alignment, tail_padding)
            total = max(total, cursor)
        self._total_bytes = total

    @property
    def gear_count(self) -> int:
        return self._gear_count

    @property
    def input_count(self) -> int:
        return self._input_count

    @property
    def merged(self) -> bool:
        """Whether GE's merged copy happens (at least two buffers take part)."""
        return self._merged

    @property
    def dims_nbytes(self) -> int:
        return self._dims_nbytes

    @property
    def total_bytes(self) -> int:
        """Size the staging buffer needs: the largest gear's end."""
        return self._total_bytes

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def tail_padding(self) -> int:
        """Spare bytes each buffer owns after ALIGN_UP(nbytes, 32) (0: packed; plan_layout)."""
        return self._tail_padding

    def _gear(self, g: Any) -> int:
        return _index_arg(g, "gear index", self._gear_count, "gears")

    def _input(self, i: Any) -> int:
        return _index_arg(i, "input index", self._input_count, "inputs")

    def offset(self, g: int, i: int) -> int:
        """Byte offset of input ``i`` in gear ``g``'s staging layout."""
        g, i = self._gear(g), self._input(i)
        return self._offsets[g][i]

    def nbytes(self, g: int, i: int) -> int:
        """Bytes of input ``i`` in gear ``g`` (its slot size)."""
        g, i = self._gear(g), self._input(i)
        return self._nbytes[g][i]

    def fused(self, i: int) -> bool:
        """Whether input ``i`` takes part in the merged copy (False when nothing merges)."""
        return self._fused[self._input(i)]

    def dims_offset(self, g: int) -> int:
        """Byte offset of the int32 dims buffer in gear ``g``."""
        return self._dims_offsets[self._gear(g)]

    def merged_span(self, g: int) -> tuple[int, int]:
        """``(0, end)`` moved by the ONE merged copy in gear ``g``; ``(0, 0)`` when not merged."""
        return (0, self._merged_end[self._gear(g)])

    def separate(self, g: int) -> list[tuple[int, int]]:
        """Spans copied on their own in gear ``g``, in staging order (see plan_layout)."""
        g = self._gear(g)
        out: list[tuple[int, int]] = []
        if not self._merged and self._dims_nbytes > 0:
            out.append((self._dims_offsets[g], self._dims_offsets[g] + self._dims_nbytes))
        for i in range(self._input_count):
            n = self._nbytes[g][i]
            if not self._fused[i] and n > 0:
                out.append((self._offsets[g][i], self._offsets[g][i] + n))
        return out

    def __repr__(self) -> str:
        padding = f", tail_padding={self._tail_padding}" if self._tail_padding else ""
        return (f"Layout(gears={self._gear_count}, inputs={self._input_count}, "
                f"merged={self._merged}, total_bytes={self._total_bytes}{padding})")


def plan_layout(input_nbytes: Sequence[Sequence[int]], dims_count: int,
                fusion_size: int = DEFAULT_FUSION_SIZE,
                alignment: int = DEFAULT_ALIGNMENT, tail_padding: int = 0) -> Layout:
    """Plan the staging layout of every gear (GE's merged host-to-device input copy).

    Args:
        input_nbytes: ``[gear][input]`` bytes of each input in that gear (rows of equal
            length, at least one gear, every count >= 0).
        dims_count: values per gear; the dims buffer holds ``dims_count`` int32 (0 = none).
        fusion_size: GE's ``ge.exec.input_fusion_size``; the limit is
            ``min(fusion_size, 32 MiB)``; negative turns merging off.
        alignment: every buffer's offset is a multiple of it (a power of two >= 1).
        tail_padding: spare bytes every buffer owns after its data rounded up to 32 (>= 0;
            0 = packed, exactly GE's staging). The acl backend asks for 32: pyACL wants each
            buffer carved out of one aclrtMalloc block to own ``ALIGN_UP(len, 32) + 32``
            bytes from a 64-aligned start.

    Rules, per gear:
        * A buffer takes part in the merge when its LARGEST size over all gears is <= the
          limit; the buffers are the inputs and, when ``dims_count > 0``, the dims buffer.
        * GE merges only when at least two buffers take part; then ``merged`` is True and
          ``fused(i)`` says which inputs take part. Otherwise nothing is fused.
        * Packing: fused inputs in input order, then the dims buffer, then the other inputs
          in input order, each offset rounded up to ``alignment``.
        * Footprint: a buffer of ``n`` bytes owns ``n`` bytes when ``tail_padding == 0``
          (packed), else ``ALIGN_UP(n, 32) + tail_padding`` bytes; the next buffer starts at
          its end rounded up to ``alignment``. Every input owns a footprint (even with 0
          bytes); the dims buffer only when ``dims_count > 0``. ``nbytes(g, i)`` and
          ``dims_nbytes`` stay the real sizes.
        * ``merged_span(g)`` is ``(0, end of the last merged buffer's footprint)`` when merged
          (so with ``tail_padding > 0`` it covers that buffer's padding too; without a dims
          buffer the end is rounded up to ``alignment``), else ``(0, 0)``. ``separate(g)``
          lists the spans copied on their own, in staging order: the dims buffer when it is
          not merged (and exists), then every non-fused input with at least one byte (data
          only, no padding). The merged span plus the separate spans cover every byte that
          has to reach the device.
        * ``total_bytes`` is the largest gear's end (of its last footprint): the staging
          buffer size.

    Raises:
        InputError (145000): a bad argument (``tail_padding`` < 0 among them), a ragged
        table, a size overflowing 64 bits.
    """
    rows = _items(input_nbytes, "input_nbytes")
    table: list[list[int]] = []
    for g, row_obj in enumerate(rows):
        what = f"input_nbytes[{g}]"
        row = _int_list(row_obj, what)
        for i, n in enumerate(row):
            if n < 0:
                raise _input(f"{what}[{i}] is {n}, a byte count must be >= 0")
        table.append(row)
    dims = _int64(dims_count, "dims_count")
    if dims < 0:
        raise _input(f"dims_count must be >= 0, got {dims}")
    fusion = _int64(fusion_size, "fusion_size")
    align = _int64(alignment, "alignment")
    if align <= 0:
        raise _input(f"alignment must be a power of two >= 1, got {align}")
    padding = _int64(tail_padding, "tail_padding")  # < 0: Layout, as in C++
    return Layout(table, dims, fusion, align, padding)


# ---- gear table (csrc/gear_table.cc) ---------------------------------------------------------
def _gear_table(gears: list[list[int]], width: int) -> dict[tuple[int, ...], int]:
    if not gears:
        raise _spec("the model has no gears: at least one is needed", "E10035")
    table: dict[tuple[int, ...], int] = {}
    for g, gear in enumerate(gears):
        if len(gear) != width:
            raise _spec(f"gear {g} {_tuple_text(gear)} has {len(gear)} values, the model's "
                        f"inputs have {width} dynamic values", "E10037")
        for v in gear:
            if not 0 <= v <= _MAX_GEAR_VALUE:
                raise _spec(f"gear {g} {_tuple_text(gear)} has value {v} outside "
                            f"[0, {_MAX_GEAR_VALUE}]", "E10038")
    for g, gear in enumerate(gears):  # after all values are checked, as in C++
        key = tuple(gear)
        if key in table:
            raise _spec(f"gear {g} {_tuple_text(gear)} repeats gear {table[key]}", "E10039")
        table[key] = g
    return table


# ---- dims (csrc/dims.cc) ---------------------------------------------------------------------
class _Dims:
    """GE's GetCurDynamicDims over the model's input shapes and dynamic positions."""

    def __init__(self, names: list[str], shapes: list[list[int]],
                 positions: list[tuple[int, int, int]]) -> None:
        if len(names) != len(shapes):
            raise _spec(f"{len(names)} input names but {len(shapes)} input shapes")
        self.names, self.shapes = names, shapes
        for name, shape in zip(names, shapes, strict=True):
            for a, d in enumerate(shape):
                if d < -1:
                    raise _spec(f"input '{name}' axis {a} is {d}: a model dim is >= 0, or -1 "
                                "when dynamic")
        self.value_of: list[list[int]] = [[-1] * len(s) for s in shapes]
        self.first: list[list[bool]] = [[False] * len(s) for s in shapes]
        width = 0
        for p, (inp, axis, value) in enumerate(positions):
            where = f"dynamic position {p} ({inp}, {axis}, {value})"
            if inp >= len(shapes):
                raise _spec(f"{where} names input {inp}, the model has {len(shapes)} inputs")
            name, shape = names[inp], shapes[inp]
            if axis >= len(shape):
                raise _spec(f"{where} names axis {axis} of input '{name}', which has "
                            f"{len(shape)} dims")
            if shape[axis] != -1:
                raise _spec(f"{where} names input '{name}' axis {axis}, which the model fixes "
                            f"to {shape[axis]}")
            if self.value_of[inp][axis] != -1:
                raise _spec(f"{where} repeats input '{name}' axis {axis}")
            if value > _MAX_VALUES - 1:
                raise _spec(f"{where} names gear value {value}, GE allows at most "
                            f"{_MAX_VALUES} dynamic values")
            self.value_of[inp][axis] = value
            width = max(width, value + 1)
        self.width = width
        self.first_pos: list[tuple[int, int] | None] = [None] * width
        parts: list[str] = []
        for i, shape in enumerate(shapes):
            axes: list[int] = []
            for a, d in enumerate(shape):
                if d != -1:
                    continue
                v = self.value_of[i][a]
                if v < 0:
                    raise _spec(f"input '{names[i]}' axis {a} is -1 but no dynamic position "
                                "maps it to a gear value")
                if self.first_pos[v] is None:
                    self.first_pos[v] = (i, a)
                    self.first[i][a] = True
                axes.append(a)
            if axes:
                word = "axis" if len(axes) == 1 else "axes"
                parts.append(f"{names[i]} {word} {', '.join(str(a) for a in axes)}")
        for v in range(width):
            if self.first_pos[v] is None:
                raise _spec(f"no dynamic position carries gear value {v} (values "
                            f"0..{width - 1} must all be used)")
        self.axes_text = "; ".join(parts) if parts else "no dynamic axes"
        self.total_rank = sum(len(s) for s in shapes)

    def check_input(self, i: int, dims: Sequence[int], out: list[int]) -> None:
        name, shape = self.names[i], self.shapes[i]
        if len(dims) != len(shape):
            raise _length(f"input '{name}' has {len(dims)} dims, the model's input has "
                          f"{len(shape)}")
        value_of, first = self.value_of[i], self.first[i]
        for a, d in enumerate(dims):
            v = value_of[a]
            if v < 0:
                if d != shape[a]:
                    raise _length(f"input '{name}' axis {a} is {d} but the model fixes it to "
                                  f"{shape[a]}")
            elif first[a]:
                out[v] = d
            elif out[v] != d:
                fi, fa = self.first_pos[v]  # type: ignore[misc]
                raise _length(f"input '{name}' axis {a} is {d} but input '{self.names[fi]}' "
                              f"axis {fa} is {out[v]}, and both carry gear value {v}")

    def from_full_dims(self, dims: list[int]) -> tuple[int, ...]:
        if len(dims) != self.total_rank:
            ranks = ", ".join(f"{n}:{len(s)}" for n, s in zip(self.names, self.shapes,
                                                                strict=True))
            raise _length(f"full dims have {len(dims)} values, the model's inputs have "
                          f"{self.total_rank} dims in all ({ranks})")
        out = [0] * self.width
        offset = 0
        for i, shape in enumerate(self.shapes):
            self.check_input(i, dims[offset:offset + len(shape)], out)
            offset += len(shape)
        return tuple(out)

    def gear_shape(self, i: int, gear: Sequence[int]) -> list[int]:
        return [gear[v] if v >= 0 else d for d, v in zip(self.shapes[i], self.value_of[i],
                                                         strict=True)]


# ---- executor core (csrc/bindings.cc, csrc/staging.cc) ---------------------------------------
def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class ExecutorCore:
    """Gear matching and input staging for one executor (one per thread).

    See :mod:`gear_runtime.core` for the contract; this is the reference implementation.
    """

    def __init__(self, input_names: Sequence[str], input_shapes: Sequence[Sequence[int]],
                 dynamic_positions: Sequence[Sequence[int]], gears: Sequence[Sequence[int]],
                 input_dtypes: Sequence[Any], layout: Layout, staging: np.ndarray) -> None:
        names: list[str] = []
        for j, n in enumerate(_items(input_names, "input_names")):
            if not isinstance(n, str):
                raise _input(f"input_names item {j} is {type(n).__name__}, not a str")
            try:
                n.encode("utf-8")  # the C++ core holds names as UTF-8
            except UnicodeEncodeError:
                raise _input(f"input_names item {j} {n!r} cannot be encoded as UTF-8") from None
            names.append(n)
        shapes = [_int_list(s, f"input_shapes[{j}]")
                  for j, s in enumerate(_items(input_shapes, "input_shapes"))]
        positions: list[tuple[int, int, int]] = []
        rows = [_int_list(p, f"dynamic_positions[{j}]")
                for j, p in enumerate(_items(dynamic_positions, "dynamic_positions"))]
        for p, row in enumerate(rows):
            what = f"dynamic_positions[{p}]"
            if len(row) != 3:
                raise _input(f"{what} must have 3 values (input, axis, value), got {len(row)}")
            if min(row) < 0:
                raise _input(f"{what} {_tuple_text(row)} has a negative value")
            positions.append((row[0], row[1], row[2]))
        self._dims = _Dims(names, shapes, positions)
        gear_rows = [_int_list(g, f"gears[{j}]") for j, g in enumerate(_items(gears, "gears"))]
        self._table = _gear_table(gear_rows, self._dims.width)
        self._gears = [tuple(g) for g in gear_rows]
        self._names = names
        self._dtypes = self._init_dtypes(input_dtypes)
        self._init_staging(layout, staging)
        self._last_values: tuple[int, ...] = ()
        self._last_request: tuple[int, ...] = ()
        self._busy = threading.Lock()
        self._gear_shapes = [[tuple(self._dims.gear_shape(i, g)) for i in range(len(names))]
                             for g in self._gears]
        self._pads = [bytes(dt.itemsize) for dt in self._dtypes]
        self._costs = self._element_costs()

    # ---- padding (csrc/gear_table.cc Coverer, csrc/staging.cc pad_copy) ---------------------
    def _element_costs(self) -> list[float]:
        return [float(sum(float(np.prod(s, dtype=np.float64)) for s in shapes))
                for shapes in self._gear_shapes]

    def set_padding(self, pad_values: Sequence[bytes | None] | None = None,
                    costs: Sequence[float] | None = None) -> None:
        """Pad values (each input's dtype as bytes; None: zeros) and gear costs (None: total
        input elements per gear) for ``stage(pad=True)``."""
        pads = [bytes(dt.itemsize) for dt in self._dtypes]
        if pad_values is not None:
            items = _items(pad_values, "pad_values")
            if len(items) != len(pads):
                raise _input(f"{len(items)} pad values for {len(pads)} inputs")
            for i, item in enumerate(items):
                if item is None:
                    continue
                size = self._dtypes[i].itemsize
                if not isinstance(item, bytes) or len(item) != size:
                    raise _input(f"pad value of input '{self._names[i]}' must be {size} bytes "
                                 f"(one {self._dtypes[i]}), got {item!r}")
                pads[i] = item
        cost = self._element_costs()
        if costs is not None:
            items = _items(costs, "costs")
            if len(items) != len(cost):
                raise _input(f"{len(items)} gear costs for {len(cost)} gears")
            for g, item in enumerate(items):
                try:
                    cost[g] = float(item)
                except (TypeError, ValueError):
                    raise _input(f"costs item {g} is {type(item).__name__}, not a number"
                                 ) from None
        for g, c in enumerate(cost):
            if not (np.isfinite(c) and c >= 0):
                raise _input(f"gear {g} cost must be finite and >= 0")
        self._pads, self._costs = pads, cost

    def _largest(self) -> int:
        sums = [sum(g) for g in self._gears]
        return sums.index(max(sums))

    def _cover_or_raise(self, values: tuple[int, ...]) -> int:
        gear = self._table.get(values)  # an exact hit is always itself
        if gear is not None:
            return gear
        covering = [g for g, gv in enumerate(self._gears)
                    if all(a >= b for a, b in zip(gv, values, strict=True))]
        if covering:
            return min(covering, key=lambda g: (self._costs[g], g))
        raise _mismatch(f"dynamic dims {_tuple_text(values)} fit in no gear of the model "
                        f"(inputs: {self._dims.axes_text}): padding needs a gear at least as "
                        f"large in every value; the largest gear is "
                        f"{_tuple_text(self._gears[self._largest()])}; legal gears, nearest "
                        f"first: {self._legal_text(values)}")

    def cover(self, values: Sequence[int]) -> int:
        """The cheapest gear covering ``values`` (the exact gear when there is one); 145013
        when none does."""
        return self._cover_or_raise(_read_values(values, "dynamic dims", self._dims.width))

    @property
    def last_request(self) -> tuple[int, ...]:
        """The inputs' own dynamic values of the last successful :meth:`stage` (before any
        padding; ``()`` before any)."""
        return self._last_request

    def _init_dtypes(self, input_dtypes: Any) -> list[np.dtype]:
        items = _items(input_dtypes, "input_dtypes")
        n = len(self._names)
        if len(items) != n:
            raise _input(f"{len(items)} input dtypes for {n} inputs")
        out = []
        for i, item in enumerate(items):
            try:
                dt = np.dtype(item)
            except Exception:
                raise _input(f"input_dtypes item {i} is not a numpy dtype: {item!r}") from None
            if dt.hasobject:
                raise _input(f"input '{self._names[i]}' dtype {dt} holds Python objects, which "
                             "cannot be staged as bytes")
            out.append(dt)
        return out

    def _init_staging(self, layout: Any, staging: Any) -> None:
        if not isinstance(layout, Layout):
            raise _input(f"layout must be a Layout from plan_layout, got {type(layout).__name__}")
        if not hasattr(layout, "_total_bytes"):  # Layout.__new__ alone: no plan in it
            raise _input("layout must be a Layout from plan_layout, got one whose __init__ was "
                         "not called")
        n, width = len(self._names), self._dims.width
        if layout.gear_count != len(self._gears):
            raise _input(f"layout has {layout.gear_count} gears, the model has {len(self._gears)}")
        if layout.input_count != n:
            raise _input(f"layout has {layout.input_count} inputs, the model has {n}")
        if layout.dims_nbytes != 4 * width:
            raise _input(f"layout dims buffer has {layout.dims_nbytes} bytes, the model's gears "
                         f"have {width} values ({4 * width} bytes as int32)")
        for g, gear in enumerate(self._gears):
            for i in range(n):
                shape = self._dims.gear_shape(i, gear)
                need = self._dtypes[i].itemsize
                for d in shape:
                    need *= d
                slot = layout.nbytes(g, i)
                if need > slot:
                    raise _input(f"layout slot of input '{self._names[i]}' in gear {g} has "
                                 f"{slot} bytes, its shape {_tuple_text(shape)} of "
                                 f"{self._dtypes[i]} needs {need}")
        if not isinstance(staging, np.ndarray):
            raise _input(f"staging must be a numpy.ndarray, got {type(staging).__name__}")
        if staging.dtype != np.uint8:
            raise _input(f"staging must have dtype uint8, got {staging.dtype}")
        if not (staging.flags.c_contiguous and staging.flags.writeable):
            raise _input("staging must be C-contiguous and writable")
        if staging.nbytes < layout.total_bytes:
            raise _input(f"staging buffer has {staging.nbytes} bytes, the layout needs "
                         f"{layout.total_bytes}")
        self._layout = layout
        self._staging = staging
        self._flat = staging.reshape(-1)  # byte view: slots are slices of it

    # ---- properties --------------------------------------------------------------------------
    @property
    def gear_count(self) -> int:
        return len(self._gears)

    @property
    def values_per_gear(self) -> int:
        return self._dims.width

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def last_values(self) -> tuple[int, ...]:
        """Dynamic values of the last successful :meth:`stage` (``()`` before any)."""
        return self._last_values

    # ---- matching ----------------------------------------------------------------------------
    def _find_or_raise(self, values: tuple[int, ...]) -> int:
        gear = self._table.get(values)
        if gear is None:
            raise _mismatch(f"dynamic dims {_tuple_text(values)} match no gear of the model "
                            f"(inputs: {self._dims.axes_text}); legal gears, nearest first: "
                            f"{self._legal_text(values)}")
        return gear

    def _nearest_indices(self, values: Sequence[int], k: int) -> list[int]:
        order = sorted(range(len(self._gears)), key=lambda g: (
            sum(abs(a - b) for a, b in zip(self._gears[g], values, strict=True)), g))
        return order[:k]

    def _legal_text(self, values: Sequence[int]) -> str:
        shown = self._nearest_indices(values, _GEARS_SHOWN)
        text = ", ".join(_tuple_text(self._gears[g]) for g in shown)
        if len(self._gears) > len(shown):
            text += f", ... and {len(self._gears) - len(shown)} more"
        return text

    def match(self, values: Sequence[int]) -> int:
        """Index of the gear with exactly these dynamic values (O(1) dict lookup).

        Raises DynamicInputLengthError (145012) for a wrong count, GearMismatchError (145013)
        naming the legal gears nearest first, InputError for non-int values.
        """
        return self._find_or_raise(_read_values(values, "dynamic dims", self._dims.width))

    def nearest(self, values: Sequence[int], k: int = 5) -> list[tuple[int, ...]]:
        """Up to ``k`` legal gears by L1 distance to ``values``, ties by gear index."""
        vals = _read_values(values, "dynamic dims", self._dims.width)
        count = _int64(k, "k")
        if count < 0:
            raise _input(f"k must be >= 0, got {count}")
        return [self._gears[g] for g in self._nearest_indices(vals, count)]

    # ---- dims --------------------------------------------------------------------------------
    def values_from_full_dims(self, full_dims: Sequence[int]) -> tuple[int, ...]:
        """Gear values from aclmdlSetInputDynamicDims' full dims (all shapes flattened)."""
        return self._dims.from_full_dims(_int_list(full_dims, "full dims"))

    def _arrays(self, arrays: Any) -> list[np.ndarray] | tuple[np.ndarray, ...]:
        items = _items(arrays, "input arrays")
        n = len(self._names)
        if len(items) != n:
            raise _input(f"expected {n} input arrays ({', '.join(self._names)}), got "
                         f"{len(items)}")
        for i, a in enumerate(items):
            if not isinstance(a, np.ndarray):
                raise _input(f"input '{self._names[i]}' must be a numpy.ndarray, got "
                             f"{type(a).__name__}")
        return items

    def _extract(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        out = [0] * self._dims.width
        for i, a in enumerate(arrays):
            self._dims.check_input(i, a.shape, out)
        return tuple(out)

    def extract(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        """Gear values from the arrays' shapes (GetCurDynamicDims); not matched yet."""
        return self._extract(self._arrays(arrays))

    # ---- staging -----------------------------------------------------------------------------
    def stage(self, arrays: Sequence[np.ndarray], preset: Sequence[int] | None = None,
              pad: bool = False) -> int:
        """Extract, check against ``preset``, match, check dtypes, copy into staging.

        Returns the gear index; see :mod:`gear_runtime.core` for the full contract.
        """
        if not self._busy.acquire(blocking=False):
            raise _input("ExecutorCore.stage is already running in another thread: use one "
                         "executor per thread")
        try:
            return self._stage(arrays, preset, bool(pad))
        finally:
            self._busy.release()

    def _stage(self, arrays: Any, preset: Any, pad: bool) -> int:
        items = self._arrays(arrays)
        values = self._extract(items)
        width = self._dims.width
        gear = None
        if preset is not None:
            gear = self._preset_gear(_read_values(preset, "preset dims", width), values, pad)
        if gear is None:
            gear = self._cover_or_raise(values) if pad else self._find_or_raise(values)
        gear_values = self._gears[gear]
        sources = [self._source(i, a) for i, a in enumerate(items)]
        padded = [gear_values != values and src.shape != self._gear_shapes[gear][i]
                  for i, src in enumerate(sources)]
        self._check_sources(gear, sources, gear_values, padded)
        layout, flat = self._layout, self._flat
        for i, src in enumerate(sources):
            start = layout.offset(gear, i)
            if padded[i]:
                self._pad_copy(start, src, self._gear_shapes[gear][i], self._pads[i])
            elif src.nbytes and _address(src) != _address(flat) + start:  # else zero copy
                flat[start:start + src.nbytes] = src.reshape(-1).view(np.uint8)
        if width:
            start = layout.dims_offset(gear)
            flat[start:start + 4 * width] = np.asarray(gear_values, dtype=np.int32).view(np.uint8)
        self._last_values = tuple(gear_values)
        self._last_request = values
        return gear

    def _preset_gear(self, wanted: tuple[int, ...], values: tuple[int, ...],
                     pad: bool) -> int | None:
        """ExecutorCore::preset_gear: None when the set dims equal the values."""
        if wanted == values:
            return None
        gear = self._table.get(wanted) if pad else None
        if gear is None or any(a < b for a, b in zip(wanted, values, strict=True)):
            raise _length(f"the inputs' dynamic dims {_tuple_text(values)} disagree with "
                          f"the dims set with set_dynamic_* {_tuple_text(wanted)}")
        return gear

    def _pad_copy(self, start: int, src: np.ndarray, shape: tuple[int, ...],
                  pad: bytes) -> None:
        """pad_copy: ``src`` in the leading corner of the slot, the rest ``pad``."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * src.dtype.itemsize
        slot = self._flat[start:start + nbytes].view(src.dtype).reshape(shape)
        slot[...] = np.frombuffer(pad, dtype=src.dtype)[0]
        slot[tuple(slice(0, d) for d in src.shape)] = src

    def _source(self, i: int, a: np.ndarray) -> np.ndarray:
        expected = self._dtypes[i]
        if a.dtype != expected:
            raise _input(f"input '{self._names[i]}' has dtype {a.dtype}, the model's input has "
                         f"{expected}")
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)

    def _check_sources(self, gear: int, sources: list[np.ndarray],
                       values: Sequence[int], padded: list[bool]) -> None:
        """Stager::check: every source fits its slot and does not alias another slot; a
        padded one does not overlap the staging buffer at all."""
        layout = self._layout
        lo = _address(self._flat)
        hi = lo + self._flat.nbytes
        for i, src in enumerate(sources):
            if padded[i]:
                s = _address(src)
                if src.nbytes and s < hi and lo < s + src.nbytes:
                    raise _input(f"input '{self._names[i]}' overlaps the staging buffer and "
                                 "must be padded: pass a copy")
                continue
            slot = layout.nbytes(gear, i)
            if src.nbytes > slot:
                raise _input(f"input '{self._names[i]}' has {src.nbytes} bytes, more than its "
                             f"slot of {slot} bytes in gear {gear}")
            if src.nbytes == 0:
                continue
            s = _address(src)
            if s < hi and lo < s + src.nbytes and s != lo + layout.offset(gear, i):
                raise _input(f"input '{self._names[i]}' overlaps the staging buffer but is not "
                             f"its own slot in gear {gear}")
        for v in values:
            if not _INT32_MIN <= v <= _INT32_MAX:
                raise _input(f"dynamic value {v} does not fit int32")
