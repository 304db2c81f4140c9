"""The rules every gear spec obeys, whatever it was written in (the parsers and GearSpec share
them): limits, GE's codes for them, and the checks of gear rows and gear indices."""

from __future__ import annotations

import operator
from typing import Literal

from gear_runtime.errors import GearSpecError, InputError

Mode = Literal["batch", "image_size", "dims", "static"]
#: The gear modes. "static" is no GE mode: a model with no dynamic axis at all (a decode
#: step at fixed shapes), loaded as it is with its one gear ``()``; no parser produces it and
#: nothing compiles it.
MODES: tuple[str, ...] = ("batch", "image_size", "dims", "static")
#: The one gear of a static model: no dynamic values.
STATIC_GEARS: tuple[tuple[int, ...], ...] = ((),)

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


def iter_or_fail(value: object, what: str) -> tuple[object, ...]:
    try:
        return tuple(value)  # type: ignore[call-overload]
    except TypeError:
        raise GearSpecError(f"{what} must be a sequence, got {value!r}", code="E10001") from None


def int_rows(rows: object, what: str) -> tuple[tuple[int, ...], ...]:
    """``rows`` as a tuple of tuples of int; operator.index so that 2.5 or "3" are refused
    instead of silently truncated or parsed (numpy integers are fine)."""
    try:
        return tuple(tuple(operator.index(v) for v in row)
                     for row in iter_or_fail(rows, what))  # type: ignore[attr-defined]
    except TypeError:
        raise GearSpecError(f"{what} must be a sequence of sequences of integers, got {rows!r}",
                            code="E10001") from None


def check_gear_rows(gears: tuple[tuple[int, ...], ...], width: int, why: str,
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
