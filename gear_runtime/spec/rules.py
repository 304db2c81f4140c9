"""The rules every gear spec obeys, whatever it was written in (the parsers and GearSpec share
them): limits, GE's codes for them, and the checks of gear rows and gear indices."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Literal, SupportsIndex, cast

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


#: GE's ``precision_mode`` values (atc ``--precision_mode``, GE option ``ge.exec.precision_mode``),
#: exactly GE's list (``CheckPrecisionModeParamValid``, hicann/ge; anything else is E10001).
PRECISION_MODES: tuple[str, ...] = (
    "force_fp32", "must_keep_origin_dtype", "allow_fp32_to_fp16", "force_fp16",
    "cube_fp16in_fp32out", "allow_mix_precision", "allow_mix_precision_fp16",
    "allow_mix_precision_bf16", "allow_fp32_to_bf16")
#: What each mode lowers float32 compute to on a backend where every op has a float32 kernel
#: (ONNX Runtime and OpenVINO on the CPU): None keeps float32. allow_fp32_to_fp16 means
#: "float32 where the op supports it, else float16", so it keeps float32 there.
PRECISION_LOWERED: dict[str, str | None] = {
    "force_fp32": None, "must_keep_origin_dtype": None, "allow_fp32_to_fp16": None,
    "force_fp16": "f16", "cube_fp16in_fp32out": "f16", "allow_mix_precision": "f16",
    "allow_mix_precision_fp16": "f16", "allow_mix_precision_bf16": "bf16",
    "allow_fp32_to_bf16": "bf16"}


def check_precision_mode(value: object, where: str = "precision_mode") -> str | None:
    """``value`` as a precision mode: None or "" is unset (None), else one of
    :data:`PRECISION_MODES` (surrounding whitespace stripped); GearSpecError E10001 naming
    ``where``, the value and the valid ones otherwise."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise GearSpecError(f"{where} must be a str, got {value!r}", code="E10001")
    text = value.strip()
    if not text:
        return None
    if text not in PRECISION_MODES:
        raise GearSpecError(f"{where} {value!r} is not a valid value; valid values are: "
                            f"{', '.join(PRECISION_MODES)}", code="E10001")
    return text


def iter_or_fail(value: object, what: str) -> tuple[object, ...]:
    try:
        # a non-iterable raises the TypeError caught below
        return tuple(cast(Iterable[object], value))
    except TypeError:
        raise GearSpecError(f"{what} must be a sequence, got {value!r}", code="E10001") from None


def int_rows(rows: object, what: str) -> tuple[tuple[int, ...], ...]:
    """``rows`` as a tuple of tuples of int; operator.index so that 2.5 or "3" are refused
    instead of silently truncated or parsed (numpy integers are fine)."""
    try:
        # a row that is no sequence, or a value with no __index__, raises the TypeError
        # caught below
        return tuple(tuple(operator.index(cast(SupportsIndex, v))
                           for v in cast(Iterable[object], row))
                     for row in iter_or_fail(rows, what))
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
        index = None if isinstance(i, bool) else operator.index(cast(SupportsIndex, i))
    except TypeError:
        index = None
    if index is None:
        raise InputError(f"gear index {i!r} is not an integer; {legal}")
    if not 0 <= index < count:
        raise InputError(f"gear index {index} is out of range: {legal}")
    return index
