"""Test oracle: a plain-Python model of the C++ core (``gear_runtime._core``).

Written from the rules (csrc/layout.h, csrc/dims.h, csrc/gear_table.h, csrc/staging.h), not
from the C++ code, so that tests/test_core_parity.py can compare the two on random models:
the same results, the same error class and code, byte-identical staging buffers and, for the
domain errors (145012 wrong dims, 145013 no gear), the same message. It is a test tool only:
arguments are trusted to be of the right types (the binding's conversions are not modelled),
and other errors' messages are not the core's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import (
    ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID,
    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID,
    ACL_ERROR_GE_PARAM_INVALID,
    DirectRunFailed,
    DynamicInputLengthError,
    GearMismatchError,
    GearSpecError,
    InputError,
)
from gear_runtime.spec.rules import MAX_GEAR_VALUE

DEFAULT_FUSION_SIZE = 131072
MAX_FUSION_SIZE = 32 * 1024 * 1024
DEFAULT_ALIGNMENT = 64
_GRANULE = 32  # ALIGN_UP(len, 32) of pyACL's carving rule
_MAX_GEAR_VALUE = MAX_GEAR_VALUE  # the spec's (csrc/gear_table.h kMaxGearValue: test_shared_facts)
_MAX_VALUES = 128
_GEARS_SHOWN = 8
_SIZE_MAX = 2**64 - 1


def _input(message: str) -> InputError:
    return InputError(message, ACL_ERROR_GE_PARAM_INVALID)


def _length(message: str) -> DynamicInputLengthError:
    return DynamicInputLengthError(message, ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID)


def _mismatch(message: str) -> GearMismatchError:
    return GearMismatchError(message, ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)


def _text(values: Sequence[int]) -> str:
    return repr(tuple(int(v) for v in values))


# ---- layout ----------------------------------------------------------------------------------
def _fit(value: int) -> int:
    if value > _SIZE_MAX:
        raise _input("layout size overflows")
    return value


def _align(x: int, alignment: int) -> int:
    return _fit(x + alignment - 1) // alignment * alignment


def _footprint(n: int, tail_padding: int) -> int:
    return n if tail_padding == 0 else _fit(_align(n, _GRANULE) + tail_padding)


class Layout:
    """The staging layout (facts only; what parity compares)."""

    def __init__(self, table: list[list[int]], dims_count: int, fusion_size: int,
                 alignment: int, tail_padding: int) -> None:
        if any(n < 0 for row in table for n in row) or dims_count < 0 or alignment <= 0 \
                or alignment & (alignment - 1) or tail_padding < 0 or not table \
                or any(len(row) != len(table[0]) for row in table):
            raise _input("bad layout arguments")
        self.gear_count, self.input_count = len(table), len(table[0])
        self.alignment, self.tail_padding = alignment, tail_padding
        self.dims_nbytes = 4 * dims_count
        limit = min(fusion_size, MAX_FUSION_SIZE)
        fused = [fusion_size >= 0 and max(r[i] for r in table) <= limit
                 for i in range(self.input_count)]
        dims_joins = fusion_size >= 0 and 0 < self.dims_nbytes <= limit
        self.merged = sum(fused) + dims_joins >= 2
        self._fused = fused if self.merged else [False] * self.input_count
        self._nbytes = table
        self._offsets: list[list[int]] = []
        self._dims_offsets: list[int] = []
        self._merged_end: list[int] = []
        self.total_bytes = 0
        for row in table:
            self._plan_gear(row)

    def _plan_gear(self, row: list[int]) -> None:
        offsets = [0] * len(row)
        cursor = 0
        for i in [i for i in range(len(row)) if self._fused[i]]:
            offsets[i] = _align(cursor, self.alignment)
            cursor = _fit(offsets[i] + _footprint(row[i], self.tail_padding))
        cursor = _align(cursor, self.alignment)
        self._dims_offsets.append(cursor)
        if self.dims_nbytes:
            cursor = _fit(cursor + _footprint(self.dims_nbytes, self.tail_padding))
        self._merged_end.append(cursor if self.merged else 0)
        for i in [i for i in range(len(row)) if not self._fused[i]]:
            offsets[i] = _align(cursor, self.alignment)
            cursor = _fit(offsets[i] + _footprint(row[i], self.tail_padding))
        self._offsets.append(offsets)
        self.total_bytes = max(self.total_bytes, cursor)

    def offset(self, g: int, i: int) -> int:
        return self._offsets[g][i]

    def nbytes(self, g: int, i: int) -> int:
        return self._nbytes[g][i]

    def fused(self, i: int) -> bool:
        return self._fused[i]

    def dims_offset(self, g: int) -> int:
        return self._dims_offsets[g]

    def merged_span(self, g: int) -> tuple[int, int]:
        return (0, self._merged_end[g])

    def separate(self, g: int) -> list[tuple[int, int]]:
        out = []
        if not self.merged and self.dims_nbytes:
            out.append((self._dims_offsets[g], self._dims_offsets[g] + self.dims_nbytes))
        out += [(self._offsets[g][i], self._offsets[g][i] + n)
                for i, n in enumerate(self._nbytes[g]) if not self._fused[i] and n > 0]
        return out

    def __repr__(self) -> str:
        padding = f", tail_padding={self.tail_padding}" if self.tail_padding else ""
        return (f"Layout(gears={self.gear_count}, inputs={self.input_count}, "
                f"merged={self.merged}, total_bytes={self.total_bytes}{padding})")


def plan_layout(input_nbytes: Sequence[Sequence[int]], dims_count: int,
                fusion_size: int = DEFAULT_FUSION_SIZE, alignment: int = DEFAULT_ALIGNMENT,
                tail_padding: int = 0) -> Layout:
    return Layout([list(r) for r in input_nbytes], dims_count, fusion_size, alignment,
                  tail_padding)


# ---- dims ------------------------------------------------------------------------------------
class _Dims:
    """GetCurDynamicDims: which axis carries which gear value; the 145012 checks."""

    def __init__(self, names: list[str], shapes: list[list[int]],
                 positions: list[tuple[int, int, int]]) -> None:
        self.names, self.shapes = names, shapes
        self.value_of = [[-1] * len(s) for s in shapes]
        for p in positions:
            inp, axis, value = p
            if min(p) < 0 or inp >= len(shapes) or axis >= len(shapes[inp]) \
                    or shapes[inp][axis] != -1 or self.value_of[inp][axis] != -1 \
                    or value >= _MAX_VALUES:
                raise GearSpecError(f"bad dynamic position {p}")
            self.value_of[inp][axis] = value
        self.width = max((v for *_, v in positions), default=-1) + 1
        self.first: list[tuple[int, int]] = []
        for v in range(self.width):
            cells = [(i, a) for i, row in enumerate(self.value_of)
                     for a, w in enumerate(row) if w == v]
            if not cells:
                raise GearSpecError(f"no dynamic position carries gear value {v}")
            self.first.append(cells[0])
        if any(d < -1 or (d == -1 and self.value_of[i][a] < 0)
               for i, s in enumerate(shapes) for a, d in enumerate(s)):
            raise GearSpecError("a dim below -1, or a -1 no position maps")
        parts = []
        for name, shape in zip(names, shapes, strict=True):
            axes = [str(a) for a, d in enumerate(shape) if d == -1]
            if axes:
                parts.append(f"{name} {'axis' if len(axes) == 1 else 'axes'} {', '.join(axes)}")
        self.axes_text = "; ".join(parts) or "no dynamic axes"

    def check(self, i: int, dims: Sequence[int], out: list[int]) -> None:
        name, shape = self.names[i], self.shapes[i]
        if len(dims) != len(shape):
            raise _length(f"input '{name}' has {len(dims)} dims, the model's input has "
                          f"{len(shape)}")
        for a, d in enumerate(dims):
            v = self.value_of[i][a]
            if v < 0 and d != shape[a]:
                raise _length(f"input '{name}' axis {a} is {d} but the model fixes it to "
                              f"{shape[a]}")
            if v >= 0 and self.first[v] == (i, a):
                out[v] = d
            elif v >= 0 and out[v] != d:
                fi, fa = self.first[v]
                raise _length(f"input '{name}' axis {a} is {d} but input '{self.names[fi]}' "
                              f"axis {fa} is {out[v]}, and both carry gear value {v}")

    def gear_shape(self, i: int, gear: Sequence[int]) -> tuple[int, ...]:
        return tuple(gear[v] if v >= 0 else d
                     for d, v in zip(self.shapes[i], self.value_of[i], strict=True))


# ---- the core --------------------------------------------------------------------------------
def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class ExecutorCore:
    """match / cover / nearest / extract / values_from_full_dims / stage, as the core."""

    def __init__(self, input_names: Sequence[str], input_shapes: Sequence[Sequence[int]],
                 dynamic_positions: Sequence[Sequence[int]], gears: Sequence[Sequence[int]],
                 input_dtypes: Sequence[Any], layout: Any, staging: np.ndarray) -> None:
        if any(len(p) != 3 or min(p) < 0 for p in dynamic_positions):
            raise _input("bad dynamic position")
        self._names = list(input_names)
        self._dims = _Dims(self._names, [list(s) for s in input_shapes],
                           [tuple(p) for p in dynamic_positions])  # type: ignore[misc]
        self._gears = [tuple(int(v) for v in g) for g in gears]
        self._check_gears()
        self._table = {g: k for k, g in enumerate(self._gears)}
        self._dtypes = [np.dtype(d) for d in input_dtypes]
        if len(self._dtypes) != len(self._names) or any(d.hasobject for d in self._dtypes):
            raise _input("bad input dtypes")
        self._shapes = [[self._dims.gear_shape(i, g) for i in range(len(self._names))]
                        for g in self._gears]
        self._check_layout(layout, staging)
        self.layout, self._flat = layout, staging.reshape(-1)
        self.last_values: tuple[int, ...] = ()
        self.last_request: tuple[int, ...] = ()
        #: inputs of at least this many bytes that a plain request does not pad are bound in
        #: place (not copied); 0: none
        self.in_place_bytes = 0
        self.last_in_place: tuple[int, ...] = ()
        self._written: list[tuple[int, int]] = []  # set_written: [start, end) byte ranges
        self._runs: list[Any] = []
        self.set_padding()

    def _check_gears(self) -> None:
        codes = [(not self._gears, "E10035"),
                 (any(len(g) != self._dims.width for g in self._gears), "E10037"),
                 (any(not 0 <= v <= _MAX_GEAR_VALUE for g in self._gears for v in g), "E10038"),
                 (len(set(self._gears)) != len(self._gears), "E10039")]
        for bad, code in codes:
            if bad:
                raise GearSpecError("bad gears", code)

    def _check_layout(self, layout: Any, staging: np.ndarray) -> None:
        fits = all(layout.nbytes(g, i) >= int(np.prod(s, dtype=object)) * dt.itemsize
                   for g, shapes in enumerate(self._shapes)
                   for i, (s, dt) in enumerate(zip(shapes, self._dtypes, strict=True))) \
            if layout.gear_count == len(self._gears) \
            and layout.input_count == len(self._names) else False
        if not fits or layout.dims_nbytes not in (0, 4 * self._dims.width) \
                or staging.dtype != np.uint8 or not staging.flags.c_contiguous \
                or not staging.flags.writeable or staging.nbytes < layout.total_bytes:
            raise _input("the layout or staging buffer does not fit the model")

    @property
    def gear_count(self) -> int:
        return len(self._gears)

    @property
    def values_per_gear(self) -> int:
        return self._dims.width

    def set_padding(self, pad_values: Sequence[bytes | None] | None = None,
                    costs: Sequence[float] | None = None) -> None:
        pads = [bytes(dt.itemsize) for dt in self._dtypes]
        for i, p in enumerate(pad_values or []):
            if p is not None:
                if len(p) != self._dtypes[i].itemsize:
                    raise _input(f"pad value of input '{self._names[i]}' must be "
                                 f"{self._dtypes[i].itemsize} bytes")
                pads[i] = p
        default = [sum(float(np.prod(s, dtype=np.float64)) for s in shapes)
                   for shapes in self._shapes]
        cost = list(default if costs is None else costs)
        if len(cost) != len(self._gears):
            raise _input(f"{len(cost)} gear costs for {len(self._gears)} gears")
        if not all(np.isfinite(c) and c >= 0 for c in cost):
            raise _input("gear cost must be finite and >= 0")
        self._pads, self._costs = pads, cost

    # ---- lookups -----------------------------------------------------------------------------
    def _values(self, values: Sequence[int], what: str = "dynamic dims") -> tuple[int, ...]:
        if len(values) != self._dims.width:
            raise _length(f"{what} have {len(values)} values, the model's gears have "
                          f"{self._dims.width}")
        return tuple(int(v) for v in values)

    def _legal(self, values: Sequence[int]) -> str:
        shown = self.nearest(values, _GEARS_SHOWN)
        text = ", ".join(_text(g) for g in shown)
        more = len(self._gears) - len(shown)
        return text + (f", ... and {more} more" if more > 0 else "")

    def nearest(self, values: Sequence[int], k: int = 5) -> list[tuple[int, ...]]:
        values = self._values(values)
        if k < 0:
            raise _input("k must be >= 0")
        order = sorted(range(len(self._gears)), key=lambda g: (
            sum(abs(a - b) for a, b in zip(self._gears[g], values, strict=True)), g))
        return [self._gears[g] for g in order[:k]]

    def match(self, values: Sequence[int]) -> int:
        values = self._values(values)
        if values not in self._table:
            covering = self._covering(values)
            hint = ("" if covering is None else
                    f"; the cheapest gear holding them is gear {covering} "
                    f"{_text(self._gears[covering])}: execute(pad=True) (gear-runtime run / "
                    "bench: --pad) runs them there, padded, the outputs trimmed to them")
            raise _mismatch(f"dynamic dims {_text(values)} match no gear of the model (inputs: "
                            f"{self._dims.axes_text}){hint}; legal gears, nearest first: "
                            f"{self._legal(values)}")
        return self._table[values]

    def _covering(self, values: tuple[int, ...]) -> int | None:
        covering = [g for g, gv in enumerate(self._gears)
                    if all(a >= b for a, b in zip(gv, values, strict=True))]
        return min(covering, key=lambda g: (self._costs[g], g)) if covering else None

    def cover(self, values: Sequence[int]) -> int:
        values = self._values(values)
        if values in self._table:
            return self._table[values]
        covering = self._covering(values)
        if covering is not None:
            return covering
        largest = max(range(len(self._gears)), key=lambda g: (sum(self._gears[g]), -g))
        raise _mismatch(f"dynamic dims {_text(values)} fit in no gear of the model (inputs: "
                        f"{self._dims.axes_text}): padding needs a gear at least as large in "
                        f"every value; the largest gear is {_text(self._gears[largest])}; "
                        f"legal gears, nearest first: {self._legal(values)}")

    # ---- dims --------------------------------------------------------------------------------
    def values_from_full_dims(self, full_dims: Sequence[int]) -> tuple[int, ...]:
        ranks = [len(s) for s in self._dims.shapes]
        if len(full_dims) != sum(ranks):
            text = ", ".join(f"{n}:{r}" for n, r in zip(self._names, ranks, strict=True))
            raise _length(f"full dims have {len(full_dims)} values, the model's inputs have "
                          f"{sum(ranks)} dims in all ({text})")
        out, start = [0] * self._dims.width, 0
        for i, r in enumerate(ranks):
            self._dims.check(i, full_dims[start:start + r], out)
            start += r
        return tuple(out)

    def extract(self, arrays: Sequence[Any]) -> tuple[int, ...]:
        if len(arrays) != len(self._names) or not all(isinstance(a, np.ndarray)
                                                      for a in arrays):
            raise _input("expected the model's input arrays")
        out = [0] * self._dims.width
        for i, a in enumerate(arrays):
            self._dims.check(i, a.shape, out)
        return tuple(out)

    # ---- stage -------------------------------------------------------------------------------
    def stage(self, arrays: Sequence[Any], preset: Sequence[int] | None = None,
              pad: bool = False) -> int:
        """One caller at a time, as the core (the executor's lock guarantees it)."""
        return self._stage(arrays, preset, pad)

    def set_runs(self, runs: Sequence[Any] | None) -> None:
        """The direct runs execute() makes after staging (None: none), as the core checks
        them."""
        if runs is not None and type(runs) is not list:
            raise _input(f"runs must be None or a list with one entry per gear, got "
                         f"{type(runs).__name__}")
        table = list(runs or [])
        for entry in table:
            if entry is not None and (
                    type(entry) is not tuple or len(entry) != 4 or not callable(entry[0])
                    or type(entry[1]) is not tuple or type(entry[2]) is not list
                    or type(entry[3]) is not bool
                    or any(type(o) is not np.ndarray or not o.flags.c_contiguous
                           for o in entry[2])):
                raise _input(f"a direct run is None or a tuple (call, args: tuple, outputs: "
                             f"list, copyable: bool), got {entry!r}")
        if runs is not None and len(table) != len(self._gears):
            raise _input(f"{len(table)} direct runs for {len(self._gears)} gears")
        self._runs = table

    def set_written(self, buffers: Any) -> None:
        """The backend's output buffers: an input sharing memory with one is staged, never
        bound in place."""
        if type(buffers) is not list:
            raise _input(f"written must be a list of numpy arrays, got {type(buffers).__name__}")
        if any(not isinstance(b, np.ndarray) for b in buffers):
            raise _input("written must hold numpy arrays")
        if any(not b.flags.c_contiguous for b in buffers):
            raise _input("written arrays must be C-contiguous (their bytes one range)")
        self._written = [(_address(b), _address(b) + b.nbytes) for b in buffers]

    def execute(self, inputs: Any, preset: Sequence[int] | None, pad: bool,
                copy: bool) -> tuple[int, Any] | None:
        """stage() of a plain request (a dict of exactly the input names or a list / tuple
        in input order, of numpy arrays, not subclasses), then the gear's direct run. None:
        not a plain request, nothing staged; (gear, {index: array}) when inputs were bound in
        place (the arrays checked); (gear, None) without a direct run; else (gear, outputs)."""
        if type(inputs) is dict:
            if len(inputs) != len(self._names) or any(n not in inputs for n in self._names):
                return None
            arrays = [inputs[n] for n in self._names]
        elif type(inputs) in (list, tuple) and len(inputs) == len(self._names):
            arrays = list(inputs)
        else:
            return None
        if any(type(a) is not np.ndarray for a in arrays):
            return None
        # the caller's own arrays (none copied into a temporary first): large ones in place
        plain = all(a.flags.c_contiguous and a.dtype == dt
                    for a, dt in zip(arrays, self._dtypes, strict=True))
        gear = self._stage(arrays, preset, pad, in_place=plain)
        if self.last_in_place:
            return gear, {i: arrays[i] for i in self.last_in_place}
        run = self._runs[gear] if self._runs else None
        if run is None or (copy and not run[3]):
            return gear, None
        call, args, outputs, _ = run
        try:
            call(*args)
        except Exception as exc:
            raise DirectRunFailed(gear) from exc
        return gear, [o.copy() for o in outputs] if copy else list(outputs)

    def _gear_for(self, values: tuple[int, ...], preset: Sequence[int] | None,
                  pad: bool) -> int:
        if preset is not None:
            wanted = self._values(preset, "preset dims")
            if wanted != values:
                gear = self._table.get(wanted) if pad else None
                if gear is None or any(a < b for a, b in zip(wanted, values, strict=True)):
                    raise _length(f"the inputs' dynamic dims {_text(values)} disagree with "
                                  f"the dims set with set_dynamic_* {_text(wanted)}")
                return gear
        return self.cover(values) if pad else self.match(values)

    def _stage(self, arrays: Sequence[Any], preset: Sequence[int] | None, pad: bool,
               in_place: bool = False) -> int:
        values = self.extract(arrays)
        gear = self._gear_for(values, preset, pad)
        if any(a.dtype != dt for a, dt in zip(arrays, self._dtypes, strict=True)):
            raise _input("an input has another dtype than the model's")
        sources = [np.ascontiguousarray(a) for a in arrays]
        shapes = self._shapes[gear]
        padded = [s.shape != shapes[i] for i, s in enumerate(sources)]
        self._check(gear, sources, padded)
        placed = tuple(i for i, src in enumerate(sources)
                       if in_place and self.in_place_bytes and not padded[i]
                       and src.nbytes >= self.in_place_bytes
                       and _address(src) % src.dtype.itemsize == 0
                       and not any(_address(src) < end and start < _address(src) + src.nbytes
                                   for start, end in self._written))
        for i, src in enumerate(sources):
            start = self.layout.offset(gear, i)
            if i in placed:
                continue
            if padded[i]:
                n = int(np.prod(shapes[i], dtype=np.int64)) * src.dtype.itemsize
                slot = self._flat[start:start + n].view(src.dtype).reshape(shapes[i])
                slot[...] = np.frombuffer(self._pads[i], dtype=src.dtype)[0]
                slot[tuple(slice(0, d) for d in src.shape)] = src
            elif src.nbytes and _address(src) != _address(self._flat) + start:
                self._flat[start:start + src.nbytes] = src.reshape(-1).view(np.uint8)
        if self.layout.dims_nbytes:  # a layout without a dims buffer stages no dims
            start = self.layout.dims_offset(gear)
            dims = np.asarray(self._gears[gear], dtype="<i4").view(np.uint8)
            self._flat[start:start + dims.size] = dims
        self.last_values, self.last_request = self._gears[gear], values
        self.last_in_place = placed
        return gear

    def _check(self, gear: int, sources: list[np.ndarray], padded: list[bool]) -> None:
        """No source overlaps the staging buffer, unless (unpadded) it is its own slot."""
        lo = _address(self._flat)
        hi = lo + self._flat.nbytes
        for i, src in enumerate(sources):
            s = _address(src)
            overlaps = src.nbytes > 0 and s < hi and lo < s + src.nbytes
            if overlaps and (padded[i] or s != lo + self.layout.offset(gear, i)):
                raise _input(f"input '{self._names[i]}' overlaps the staging buffer")
