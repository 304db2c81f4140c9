"""GearSpec: the gears of a model, in GE's terms, independent of where they were written.

A spec is what ATC's ``--input_shape`` + one of ``--dynamic_batch_size`` /
``--dynamic_image_size`` / ``--dynamic_dims`` say (or the same in GE options or a config
file): the inputs in ``user_designate_shape_order`` with their shapes (``-1`` on dynamic
axes) and the list of gears, each a tuple of the dynamic values in GE order.

How a gear's values land on the inputs (GE's ParserDataToDynamicInfo) is precomputed once in
:attr:`GearSpec.dynamic_positions`, so every later stage (compiler, C++ core, executor) reads
the same mapping instead of re-deriving it.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gear_runtime.errors import GearSpecError, InputError

Mode = Literal["batch", "image_size", "dims"]
MODES: tuple[str, ...] = ("batch", "image_size", "dims")

#: GE's old ``kMaxShapesCount``: more gears than this is E10036. A named setting on purpose:
#: the docs say (1, 100] but 256 on 950-series chips.
DEFAULT_MAX_GEARS = 100

#: Largest gear value a gear file can hold: the gear table (GE's MapIndex Const) and the dims
#: input ``ascend_mbatch_shape_data`` are int32, as in current GE.
MAX_GEAR_VALUE = 2**31 - 1

#: Largest static dim: dims are int64 in GE and in ONNX.
MAX_DIM = 2**63 - 1

#: GE's code for a value out of range ("Value [...] for parameter [...] is out of range"): the
#: one ATC reports when std::stol overflows on an input_shape value. A gear value beyond int32
#: is the same failure one step later (it cannot be stored), so it gets the same code.
OUT_OF_RANGE_CODE = "E10013"


@dataclass(frozen=True)
class GearSpec:
    """The gears of a model.

    Attributes:
        mode: ``"batch"``, ``"image_size"`` or ``"dims"``.
        input_names: inputs in ``user_designate_shape_order`` (the order of input_shape).
        input_shapes: each input's shape with ``-1`` on its dynamic axes, same order.
        gears: each gear's dynamic values in GE order: ``(n,)`` in batch mode, ``(h, w)`` in
            image-size mode, one value per ``-1`` of input_shape (input order, then axis
            order) in dims mode.
        hybrid: GE's hybrid mode was asked for (ge.dynamicNodeType == "1" and
            ge.compileHybridMode == "1"): a miss runs the dynamic-shape graph.
        input_format: the ATC ``--input_format`` when given (``"NCHW"``, ``"NHWC"``, ``"ND"``).
        dynamic_positions: derived, not passed: ``(input index, axis, index into the gear
            tuple)`` for every ``-1`` of input_shapes, in input order then axis order.
    """

    mode: Mode
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    gears: tuple[tuple[int, ...], ...]
    hybrid: bool = False
    input_format: str | None = None
    dynamic_positions: tuple[tuple[int, int, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Cheap checks only (one pass over the values): what the parsers validate with GE's full
        # rules is re-checked here just enough that a directly built spec cannot hold values
        # that would break matching (negative or duplicate gears, duplicate input names) or
        # crash later stages.
        if self.mode not in MODES:
            raise GearSpecError(f"mode {self.mode!r} is not one of {MODES}", code="E10001")
        if isinstance(self.input_names, str) or not all(
                isinstance(n, str) for n in _iter_or_fail(self.input_names, "input_names")):
            raise GearSpecError(f"input_names must be a sequence of str, got {self.input_names!r}",
                                code="E10001")
        object.__setattr__(self, "input_names", tuple(self.input_names))
        if len(set(self.input_names)) != len(self.input_names):  # shapes() would drop one
            dup = next(n for i, n in enumerate(self.input_names) if n in self.input_names[:i])
            raise GearSpecError(f"input_names names input {dup!r} twice; each input may appear "
                                "once", code="E10001")
        object.__setattr__(self, "input_shapes", _int_rows(self.input_shapes, "input_shapes"))
        object.__setattr__(self, "gears", _int_rows(self.gears, "gears"))
        if not isinstance(self.hybrid, bool):  # bool("0") is True: no silent hybrid mode
            raise GearSpecError(f"hybrid must be a bool, got {self.hybrid!r}", code="E10001")
        if self.input_format is not None and not isinstance(self.input_format, str):
            raise GearSpecError(f"input_format must be a str or None, got {self.input_format!r}",
                                code="E10001")
        if len(self.input_names) != len(self.input_shapes):
            raise GearSpecError(
                f"{len(self.input_names)} input names but {len(self.input_shapes)} shapes",
                code="E10001")
        for name, shape in zip(self.input_names, self.input_shapes, strict=True):
            if any(d < -1 for d in shape):
                raise GearSpecError(f"input {name!r} shape {list(shape)}: dims must be >= 0 or "
                                    "-1 (dynamic)", code="E10002")
            big = next((d for d in shape if d > MAX_DIM), None)
            if big is not None:
                raise GearSpecError(f"input {name!r} shape {list(shape)}: dim {big} is out of "
                                    f"int64 range (at most {MAX_DIM})", code=OUT_OF_RANGE_CODE)
        object.__setattr__(self, "dynamic_positions", _dynamic_positions(self))
        width = self.values_per_gear
        _check_gear_rows(self.gears, width,
                         f"{self.mode} mode over this input_shape needs {width}", "gears")

    # ---- derived facts -------------------------------------------------------------------
    @property
    def gear_count(self) -> int:
        return len(self.gears)

    @property
    def values_per_gear(self) -> int:
        """Length of one gear tuple (and of the ``ascend_mbatch_shape_data`` buffer)."""
        if not self.dynamic_positions:
            return 0
        return max(v for _, _, v in self.dynamic_positions) + 1

    def shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """Every input's full static shape in gear ``i`` (input order).

        InputError (as :meth:`GearModel.gear_of <gear_runtime.model.GearModel.gear_of>`) when
        ``i`` is not a gear index: out of range, negative, a bool or not an integer.
        """
        gear = self.gears[self.gear_number(i)]
        shapes = [list(s) for s in self.input_shapes]
        for inp, axis, v in self.dynamic_positions:
            shapes[inp][axis] = gear[v]
        return {n: tuple(s) for n, s in zip(self.input_names, shapes, strict=True)}

    def full_dims(self, i: int) -> tuple[int, ...]:
        """Gear ``i`` as aclmdlGetInputDynamicDims gives it: all input shapes flattened.
        InputError when ``i`` is not a gear index (see :meth:`shapes`)."""
        return tuple(d for s in self.shapes(i).values() for d in s)

    def largest_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per input, the element-wise max over gears: what GE sizes the Data inputs to.
        GearSpecError (E10035) for a directly built spec without gears."""
        if not self.gears:
            raise GearSpecError("the spec has no gears, so its inputs have no largest shapes",
                                code="E10035")
        out: dict[str, list[int]] = {n: list(s) for n, s in self.shapes(0).items()}
        for i in range(1, len(self.gears)):
            for n, s in self.shapes(i).items():
                out[n] = [max(a, b) for a, b in zip(out[n], s, strict=True)]
        return {n: tuple(s) for n, s in out.items()}

    def gear_index(self, values: Sequence[int]) -> int | None:
        """Index of the gear with exactly these dynamic values, or None (no fallback; values
        of the wrong length match no gear). InputError when ``values`` is not a sequence of
        integers: 20.5 is refused, not truncated to gear 20 (numpy integers are fine)."""
        try:
            if isinstance(values, (str, bytes, bytearray)):  # iterable, but not of gear values
                raise TypeError
            key = tuple(operator.index(v) for v in values)
        except TypeError:
            raise InputError(f"gear values must be a sequence of integers (one per dynamic "
                             f"value, {self.values_per_gear} here), got {values!r}") from None
        try:
            return self.gears.index(key)
        except ValueError:
            return None

    def gear_number(self, i: object, owner: str = "spec") -> int:
        """``i`` as an index into :attr:`gears`; InputError when it is not one (see
        :func:`gear_number`; ``owner`` names what has the gears in the message)."""
        return gear_number(i, len(self.gears), owner)

    # ---- constructors (parsers live in gear_runtime.spec.parse / .config) ----------------
    @classmethod
    def from_atc(cls, input_shape: str, dynamic_batch_size: str | None = None,
                 dynamic_image_size: str | None = None, dynamic_dims: str | None = None,
                 input_format: str | None = None, max_gears: int = DEFAULT_MAX_GEARS,
                 ) -> GearSpec:
        """Spec from ATC flag values, validated with GE's rules and codes."""
        from gear_runtime.spec.parse import spec_from_atc

        return spec_from_atc(input_shape, dynamic_batch_size=dynamic_batch_size,
                             dynamic_image_size=dynamic_image_size, dynamic_dims=dynamic_dims,
                             input_format=input_format, max_gears=max_gears)

    @classmethod
    def from_ge_options(cls, options: Mapping[str, str], max_gears: int = DEFAULT_MAX_GEARS,
                        ) -> GearSpec:
        """Spec from GE session/graph options (ge.inputShape, ge.dynamicDims, ...)."""
        from gear_runtime.spec.parse import spec_from_ge_options

        return spec_from_ge_options(options, max_gears=max_gears)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], max_gears: int = DEFAULT_MAX_GEARS,
                    ) -> GearSpec:
        """Spec from an ATC / MindSpore Lite config file (see gear_runtime.spec.config)."""
        from gear_runtime.spec.config import spec_from_config

        return spec_from_config(path, max_gears=max_gears)

    def to_atc(self) -> dict[str, str]:
        """The ATC flags that give back this spec: ``GearSpec.from_atc(**spec.to_atc())``."""
        from gear_runtime.spec.parse import spec_to_atc

        return spec_to_atc(self)

    def to_config(self) -> str:
        """An ``[acl_build_options]`` config text that gives back this spec."""
        from gear_runtime.spec.config import spec_to_config

        return spec_to_config(self)


def _dynamic_positions(spec: GearSpec) -> tuple[tuple[int, int, int], ...]:
    """(input index, axis, index into the gear tuple) for every -1, in input_shape order.

    dims mode: the k-th -1 takes value k (ParserDataToDynamicInfo). batch mode: every -1 is
    the batch, value 0. image_size mode: in each input the first -1 is H (value 0), the
    second W (value 1).
    """
    out: list[tuple[int, int, int]] = []
    counter = 0
    for i, shape in enumerate(spec.input_shapes):
        seen_in_input = 0
        for axis, d in enumerate(shape):
            if d != -1:
                continue
            if spec.mode == "dims":
                out.append((i, axis, counter))
                counter += 1
            elif spec.mode == "batch":
                out.append((i, axis, 0))
            else:
                out.append((i, axis, min(seen_in_input, 1)))
            seen_in_input += 1
    return tuple(out)


def _iter_or_fail(value: object, what: str) -> tuple[object, ...]:
    try:
        return tuple(value)  # type: ignore[call-overload]
    except TypeError:
        raise GearSpecError(f"{what} must be a sequence, got {value!r}", code="E10001") from None


def _int_rows(rows: object, what: str) -> tuple[tuple[int, ...], ...]:
    """``rows`` as a tuple of tuples of int; operator.index so that 2.5 or "3" are refused
    instead of silently truncated or parsed (numpy integers are fine)."""
    try:
        return tuple(tuple(operator.index(v) for v in row)
                     for row in _iter_or_fail(rows, what))  # type: ignore[attr-defined]
    except TypeError:
        raise GearSpecError(f"{what} must be a sequence of sequences of integers, got {rows!r}",
                            code="E10001") from None


def _check_gear_rows(gears: tuple[tuple[int, ...], ...], width: int, why: str,
                     what: str) -> None:
    """GE's CheckDynamicParams on the gears themselves, in GE's order: gear by gear its length
    (E10037: ``width`` values; ``why`` says where that number comes from) and its values
    (E10038: none negative; 0 is accepted, as current GE does; E10013: none above
    :data:`MAX_GEAR_VALUE`, which the file cannot hold), then duplicates (E10039).
    ``what`` names the gears in messages. Shared by GearSpec and parse.check_gears."""
    for g in gears:
        if len(g) != width:
            raise GearSpecError(f"{what}: gear {list(g)} has {len(g)} values but {why}; all "
                                "gears must have the same size", code="E10037")
        neg = next((v for v in g if v < 0), None)
        if neg is not None:
            raise GearSpecError(f"{what}: gear {list(g)} has the negative value {neg}; gear "
                                "values must be >= 0", code="E10038")
        big = next((v for v in g if v > MAX_GEAR_VALUE), None)
        if big is not None:
            raise GearSpecError(f"{what}: gear {list(g)} has the value {big}, out of range: "
                                f"gear values are int32 in the model (at most {MAX_GEAR_VALUE})",
                                code=OUT_OF_RANGE_CODE)
    seen: set[tuple[int, ...]] = set()
    for g in gears:
        if g in seen:
            raise GearSpecError(f"{what}: gear {list(g)} appears more than once; gears must be "
                                "unique", code="E10039")
        seen.add(g)


def gear_number(i: object, count: int, owner: str = "spec") -> int:
    """``i`` as a gear index in ``0..count-1``: the one check of a gear index, wherever one is
    given (spec, model, gear file, backend session, bench). InputError when ``i`` is not an
    integer (a bool or 1.5 never becomes gear 1) or out of range; the message names the
    ``owner`` ("the model has 4 gears (0..3)")."""
    legal = f"the {owner} has {count} gears" + (f" (0..{count - 1})" if count else "")
    try:
        index = None if isinstance(i, bool) else operator.index(i)
    except TypeError:
        index = None
    if index is None:
        raise InputError(f"gear index {i!r} is not an integer; {legal}")
    if not 0 <= index < count:
        raise InputError(f"gear index {index} is out of range: {legal}")
    return index
