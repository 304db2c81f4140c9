"""Parse ATC flag values and GE options into a validated :class:`GearSpec`.

The rules and error codes are GE's own (docs/ge-notes.md section 1: the option checks
``CheckDynamicInputParamValid`` and friends, then ``InitDynamicParams`` +
``CheckDynamicParams``), applied in GE's order, so that the code a user sees here is the
code ATC would have printed:

====== ==================================================================================
code   rule
====== ==================================================================================
E10009 more than one of dynamic_batch_size / dynamic_image_size / dynamic_dims
E10001 none of them given (see :func:`atc_fields`); dynamic_dims: no -1 in input_shape,
       a value that is not all digits; an unknown input_format; a duplicate input name
E10004 input_shape empty
E10040 input_shape contains ``~`` (a shape range) together with a gear option
E10002 input_shape: entry without ``:``, empty name, float, not digits, negative other than -1
E10014 input_shape: a value that is not a number at all (std::stol's invalid_argument)
E10013 input_shape: a value out of int64 range
E10012 dynamic_batch_size: an input with an empty (scalar) shape
E10018 dynamic_batch_size: a -1 on a dim other than 0
E10031 dynamic_batch_size: no input with N = -1
E10003 dynamic_batch_size / dynamic_image_size: characters other than digits and separators;
       dynamic_image_size with input_format other than NCHW/NHWC; dynamic_dims: a gear whose
       number of values differs from the number of -1 in input_shape
E10019 dynamic_image_size: an input with -1 that is not 4-D, or whose -1 are not exactly H, W
E10020 dynamic_image_size: a gear without exactly 2 values
E10058 dynamic_dims: empty value
E10035 fewer than 2 gears                 (CheckDynamicParams, after the checks above)
E10036 more than ``max_gears`` gears      (old GE kMaxShapesCount = 100; docs: 256 on 950)
E10037 gears of different lengths
E10038 a negative value in a gear (0 is accepted, as current GE does)
E10013 a gear value above int32 (2147483647): the gear table and dims input are int32
E10039 duplicate gears
====== ==================================================================================

Note on E10037 vs E10003: in dims mode GE's option check (``CheckAndParseDynamicDims``) rejects
a gear with the wrong number of values as E10003 *before* ``CheckDynamicParams`` could say
E10037, so that is what this parser reports too. E10037 and E10038 are reachable through
:func:`check_gears` and direct :class:`GearSpec` construction (every digits-only string that
reaches them has already been rejected by an earlier GE rule).

Whitespace (GE does not strip option values): surrounding whitespace of each whole option
value and of each ``;``-separated piece is stripped (CANN's own docs write
``--dynamic_dims="20,20,1,1; 40,40,2,2"``), and input names are trimmed as GE trims them.
Whitespace anywhere else (inside a number, around ``,``) is rejected like GE's digit checks.
Empty ``;``-separated pieces are skipped (a trailing ``;`` is fine); an empty value between
commas inside a gear or a shape is an error, because skipping it would move every later value
onto the wrong axis.

Whatever the input, the only exception that leaves this module is :class:`GearSpecError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

from gear_runtime.errors import GearSpecError
from gear_runtime.spec.rules import (
    DEFAULT_MAX_GEARS,
    Mode,
    check_gear_rows,
    check_precision_mode,
    int_rows,
)

__all__ = [
    "DEFAULT_MAX_GEARS",
    "INPUT_FORMATS",
    "SpecFields",
    "atc_fields",
    "atc_flags",
    "check_gears",
    "ge_option_fields",
    "parse_input_shape",
]


class SpecFields(NamedTuple):
    """What a parser finds: :class:`~gear_runtime.spec.GearSpec`'s constructor arguments, in
    order (the parsers never build the spec itself, so that GearSpec can call them)."""

    mode: Mode
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    gears: tuple[tuple[int, ...], ...]
    hybrid: bool
    input_format: str | None
    precision_mode: str | None = None

#: ATC ``--input_format`` values accepted (GE's CheckInputFormat rejects unknown formats).
INPUT_FORMATS: tuple[str, ...] = ("NCHW", "NHWC", "ND", "NCDHW", "NDHWC", "NC1HWC0")

#: dims and values are int64 in GE (std::stol / int64_t dims).
INT64_MAX = 2**63 - 1
_INT64_DIGITS = len(str(INT64_MAX))

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() would accept '²' and then int() fails
_SIGNED_INT = re.compile(r"-?[0-9]+")
_STOL_START = re.compile(r"\s*[+-]?[0-9]")  # what std::stol needs to parse anything at all
_QUOTE_MAX = 160

# The three gear options, ATC names, in GE's order.
_MODE_OPTIONS: tuple[tuple[str, Mode], ...] = (
    ("dynamic_batch_size", "batch"),
    ("dynamic_image_size", "image_size"),
    ("dynamic_dims", "dims"),
)
_MODE_OF_OPTION: dict[str, Mode] = dict(_MODE_OPTIONS)
_OPTION_OF_MODE: dict[str, str] = {mode: option for option, mode in _MODE_OPTIONS}

#: dynamic_image_size's (H, W) axes per input_format (CheckDynamicImageSizeShape).
_HW_AXES: dict[str, tuple[int, int]] = {"NCHW": (2, 3), "NHWC": (1, 2)}


# ---- small helpers ----------------------------------------------------------------------------
def _q(text: object) -> str:
    """Quote ``text`` for a message: repr (so spaces and control characters show), truncated."""
    r = repr(text)
    return r if len(r) <= _QUOTE_MAX else r[: _QUOTE_MAX - 5] + "...'"


def _fail(code: str, message: str) -> NoReturn:
    raise GearSpecError(message, code=code)


def _option_str(name: str, value: object, *, optional: bool) -> str | None:
    """Type-check one option value and strip its surrounding whitespace."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        _fail("E10001", f"{name} must be a string, got {type(value).__name__} {_q(value)}")
    return value.strip()


def _check_max_gears(max_gears: object) -> int:
    if isinstance(max_gears, bool) or not isinstance(max_gears, int) or max_gears < 2:
        _fail("E10001", f"max_gears must be an integer >= 2, got {_q(max_gears)}")
    return max_gears


def _pieces(text: str, sep: str = ";") -> list[str]:
    """Split on ``sep``, strip each piece, skip empty ones (trailing separators are fine)."""
    return [p for p in (s.strip() for s in text.split(sep)) if p]


def _to_int(digits: str) -> int | None:
    """int of an ASCII digit string, or None when it does not fit int64 (checked before int()
    so that a 5000-digit string cannot hit Python's int-string limit)."""
    if len(digits) > _INT64_DIGITS:
        return None
    value = int(digits)
    return value if value <= INT64_MAX else None


def _gear_value(text: str) -> int | None:
    """A gear value: ``text`` as a non-negative int64 when it is ASCII digits only, else None."""
    return _to_int(text) if _DIGITS.fullmatch(text) else None


def _input_shape_text(names: Sequence[str], shapes: Sequence[Sequence[int]]) -> str:
    """``names`` and ``shapes`` written as an ATC input_shape value."""
    return ";".join(f"{n}:{','.join(map(str, s))}" for n, s in zip(names, shapes, strict=True))


def _gears_text(mode: str, gears: Iterable[Sequence[int]]) -> str:
    """``gears`` as the value of ``mode``'s ATC option (batch ``1,8``, else ``1,2;3,4``)."""
    return ("," if mode == "batch" else ";").join(",".join(map(str, g)) for g in gears)


def _hw_dynamic(shape: Sequence[int], hw: tuple[int, int]) -> bool:
    """``shape`` is a dynamic_image_size input: 4-D, -1 exactly on the H and W axes ``hw``."""
    return len(shape) == 4 and shape.count(-1) == 2 and shape[hw[0]] == shape[hw[1]] == -1


# ---- input_shape ------------------------------------------------------------------------------
def _parse_dim(entry: str, text: str) -> int:
    """One dim of one input_shape entry, with GE's ParseInputShape codes."""
    if "." in text:
        _fail("E10002", f"input_shape entry {_q(entry)}: dim {_q(text)} is a float; "
                        "expected an integer such as \"input_name1:1,3,224,224\"")
    if not _SIGNED_INT.fullmatch(text):
        if not _STOL_START.match(text):
            _fail("E10014", f"input_shape entry {_q(entry)}: dim {_q(text)} is not a number; "
                            "expected digits or -1")
        _fail("E10002", f"input_shape entry {_q(entry)}: dim {_q(text)} is not all digits; "
                        "expected digits or -1 (no sign, no spaces)")
    negative = text.startswith("-")
    value = _to_int(text[1:] if negative else text)
    if value is None:
        _fail("E10013", f"input_shape entry {_q(entry)}: dim {_q(text)} is out of int64 range")
    if negative and text != "-1":
        _fail("E10002", f"input_shape entry {_q(entry)}: dim {_q(text)} is negative; the only "
                        "negative dim allowed is -1 (a dynamic axis)")
    return -value if negative else value


def parse_input_shape(input_shape: str) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Parse an ATC ``--input_shape`` value into (names, shapes), in the order written.

    Entries are separated by ``;`` (empty ones skipped); each is split at its LAST ``:`` so
    names may contain ``:``; the name is trimmed; ``name:`` (nothing after the colon) is a
    scalar input, shape ``()``. Dims are ASCII digits or ``-1``. Raises GearSpecError with
    E10004 (empty), E10002, E10013, E10014 (bad dims) or E10001 (duplicate name).
    """
    text = _option_str("input_shape", input_shape, optional=False)
    assert text is not None  # for the type checker: optional=False never returns None
    entries = _pieces(text)
    if not entries:
        _fail("E10004", f"input_shape {_q(input_shape)} is empty; a gear option needs "
                        "input_shape such as \"data:-1,3,224,224\"")
    names: list[str] = []
    shapes: list[tuple[int, ...]] = []
    for entry in entries:
        name, colon, dims = entry.rpartition(":")
        name = name.strip()
        if not colon:
            _fail("E10002", f"input_shape entry {_q(entry)} has no ':'; the shape must contain "
                            "two parts, name and value, e.g. \"input_name1:n1,c1,h1,w1\"")
        if not name:
            _fail("E10002", f"input_shape entry {_q(entry)} has an empty input name; expected "
                            "\"input_name1:n1,c1,h1,w1\"")
        if name in names:
            _fail("E10001", f"input_shape names input {_q(name)} twice (entry {_q(entry)}); "
                            "each input may appear once")
        shape = () if dims == "" else tuple(_parse_dim(entry, d) for d in dims.split(","))
        names.append(name)
        shapes.append(shape)
    return tuple(names), tuple(shapes)


# ---- the three modes --------------------------------------------------------------------------
def _by_name(names: Sequence[str], shapes: Sequence[tuple[int, ...]],
             ) -> list[tuple[str, tuple[int, ...]]]:
    # GE walks a std::map<name, shape> here, i.e. in name order; that decides which input's
    # error is reported first when several are wrong.
    return sorted(zip(names, shapes, strict=True))


def _batch_gears(value: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 ) -> list[tuple[int, ...]]:
    """CheckDynamicBatchSizeInputShapeValid, then InitDynamicParams' split on ','."""
    for name, shape in _by_name(names, shapes):
        if not shape:
            _fail("E10012", f"input {_q(name)} has an empty shape; with dynamic_batch_size every "
                            "input needs at least one dim (N)")
        for axis, d in enumerate(shape):
            # Stricter than GE, which only looks when N is -1 and silently ignores e.g.
            # "1,-1" (that input would then get the batch value on a non-batch axis).
            if d == -1 and axis != 0:
                _fail("E10018", f"input {_q(name)} shape {list(shape)}: dim {axis} is -1; with "
                                "dynamic_batch_size only dim 0 (N) may be -1")
    if not any(s[0] == -1 for s in shapes):
        _fail("E10031", f"no input in input_shape has N = -1 ({_shapes_text(names, shapes)}); "
                        "dynamic_batch_size needs at least one input with dim 0 = -1")
    bad = next((c for c in value if c not in "0123456789,"), None)
    if bad is not None:
        _fail("E10003", f"dynamic_batch_size {_q(value)} contains {_q(bad)}; it can only "
                        "contain digits and \",\", e.g. \"1,8,16\"")
    gears: list[tuple[int, ...]] = []
    for v in value.split(","):
        if not v:
            continue  # GE skips empty pieces ("1,,8" and a trailing ",")
        n = _to_int(v)
        if n is None:
            _fail("E10003", f"dynamic_batch_size {_q(value)}: value {_q(v)} is out of int64 range")
        gears.append((n,))
    return gears


def _image_axes(input_format: str | None) -> tuple[int, int]:
    fmt = "NCHW" if input_format is None else input_format  # ATC's default for ONNX/Caffe
    if fmt not in _HW_AXES:
        _fail("E10003", f"input_format {_q(fmt)}: when dynamic_image_size is set the input "
                        "format only supports NCHW or NHWC")
    return _HW_AXES[fmt]


def _image_gears(value: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 input_format: str | None) -> list[tuple[int, ...]]:
    """CheckDynamicImagesizeInputShapeValid (+ CheckDynamicImageSizeShape per input)."""
    hw = _image_axes(input_format)
    counted = 0
    for name, shape in _by_name(names, shapes):
        if -1 not in shape:
            continue
        if not _hw_dynamic(shape, hw):
            _fail("E10019", f"input {_q(name)} shape {list(shape)}: with dynamic_image_size an "
                            f"input must be 4-D {input_format or 'NCHW'} with exactly H (dim "
                            f"{hw[0]}) and W (dim {hw[1]}) = -1")
        counted += 1
    if counted == 0:
        _fail("E10019", f"no input in input_shape has H and W = -1 "
                        f"({_shapes_text(names, shapes)}); dynamic_image_size needs one")
    bad = next((c for c in value if c not in "0123456789,; "), None)
    if bad is not None:
        _fail("E10003", f"dynamic_image_size {_q(value)} contains {_q(bad)}; it can only "
                        "contain digits, \",\", \" \" and \";\", e.g. \"224,224;448,448\"")
    gears = []
    for group in _pieces(value):
        parts = group.split(",")
        if len(parts) != 2:
            _fail("E10020", f"dynamic_image_size {_q(value)}: gear {_q(group)} has {len(parts)} "
                            "values; each gear must be exactly \"height,width\"")
        gear = []
        for p in parts:
            n = _gear_value(p)
            if n is None:
                _fail("E10003", f"dynamic_image_size {_q(value)}: value {_q(p)} in gear "
                                f"{_q(group)} is not a non-negative int64 written in digits")
            gear.append(n)
        gears.append(tuple(gear))
    return gears


def _dims_gears(value: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                ) -> list[tuple[int, ...]]:
    """CheckDynamicDimsInputShapeValid + CheckAndParseDynamicDims."""
    n_dynamic = sum(s.count(-1) for s in shapes)
    if n_dynamic == 0:
        _fail("E10001", f"input_shape has no -1 ({_shapes_text(names, shapes)}); at least one "
                        "dim should be -1 when dynamic_dims is set")
    groups = _pieces(value)
    if not groups:
        _fail("E10058", f"dynamic_dims {_q(value)} is empty; expected gears such as "
                        "\"20,1;40,2\" (';' between gears, ',' between values)")
    gears = []
    for group in groups:
        parts = group.split(",")
        if len(parts) != n_dynamic:
            _fail("E10003", f"dynamic_dims {_q(value)}: gear {_q(group)} has {len(parts)} "
                            f"values; each gear needs {n_dynamic}, one per -1 in input_shape")
        gear = []
        for p in parts:
            n = _gear_value(p)
            if n is None:
                _fail("E10001", f"dynamic_dims {_q(value)}: value {_q(p)} in gear {_q(group)} "
                                "must be a non-negative int64 written in digits")
            gear.append(n)
        gears.append(tuple(gear))
    return gears


def _shapes_text(names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> str:
    return f"input_shape {_q(_input_shape_text(names, shapes))}"


# ---- gear list checks (CheckDynamicParams) ----------------------------------------------------
def check_gears(gears: Iterable[Sequence[int]], max_gears: int = DEFAULT_MAX_GEARS,
                option: str = "gears") -> tuple[tuple[int, ...], ...]:
    """GE's CheckDynamicParams on a parsed gear list; returns it as a tuple of tuples.

    E10001 a value that is not an integer (2.5 and "3" are refused, not converted), E10035
    fewer than 2 gears, E10036 more than ``max_gears``, E10037 gears of different lengths,
    E10038 a negative value (0 is fine), E10039 a duplicate gear. ``option`` names the option
    in messages.
    """
    limit = _check_max_gears(max_gears)
    out = int_rows(gears, option)
    if len(out) < 2:
        _fail("E10035", f"{option} has {len(out)} gear(s) {_q(list(out))}; at least 2 are "
                        "needed")
    if len(out) > limit:
        _fail("E10036", f"{option} has {len(out)} gears; at most {limit} are supported "
                        "(max_gears)")
    width = len(out[0])
    check_gear_rows(out, width, f"the first gear {list(out[0])} has {width}", option)
    return out


# ---- public entry points ----------------------------------------------------------------------
def atc_fields(input_shape: str, dynamic_batch_size: str | None = None,
               dynamic_image_size: str | None = None, dynamic_dims: str | None = None,
               input_format: str | None = None, max_gears: int = DEFAULT_MAX_GEARS,
               hybrid: bool = False, precision_mode: str | None = None) -> SpecFields:
    """A spec's fields from ATC flag values, validated with GE's rules, codes and order.

    Exactly one of ``dynamic_batch_size`` / ``dynamic_image_size`` / ``dynamic_dims`` must be
    given (not None); an empty string counts as given (``dynamic_dims=""`` is E10058).
    ``input_format`` (NCHW default) picks the H/W axes for dynamic_image_size. ``hybrid``
    (GE's hybrid compile mode) is only meaningful with dynamic_dims. ``precision_mode``:
    GE's, checked against GE's list (E10001), "" or None unset. Every rejection is a
    :class:`GearSpecError` whose ``.code`` is GE's and whose message quotes the bad text.
    """
    _check_max_gears(max_gears)
    text = _option_str("input_shape", input_shape, optional=False)
    values = {opt: _option_str(opt, v, optional=True) for opt, v in (
        ("dynamic_batch_size", dynamic_batch_size), ("dynamic_image_size", dynamic_image_size),
        ("dynamic_dims", dynamic_dims))}
    fmt = _option_str("input_format", input_format, optional=True)
    given = [opt for opt, _ in _MODE_OPTIONS if values[opt] is not None]
    if len(given) > 1:
        _fail("E10009", f"{' and '.join(given)} are both set; dynamic_batch_size, "
                        "dynamic_image_size and dynamic_dims are mutually exclusive")
    if not given:
        # GE itself would just build a static model here; a GearSpec without gears is
        # meaningless, so it is an invalid parameter: E10001 (GE's generic "value for parameter
        # is invalid, reason ...") rather than E10009, which means "more than one given".
        _fail("E10001", "none of dynamic_batch_size, dynamic_image_size, dynamic_dims is set; "
                        "a gear spec needs exactly one of them")
    if fmt is not None and fmt not in INPUT_FORMATS:
        _fail("E10001", f"input_format {_q(fmt)} is not valid; expected one of {INPUT_FORMATS}")
    if not isinstance(hybrid, bool):
        _fail("E10001", f"hybrid must be a bool, got {_q(hybrid)}")
    option = given[0]
    value = values[option]
    assert text is not None and value is not None  # narrowed above, for the type checker
    if "~" in text:
        _fail("E10040", f"input_shape {_q(text)} contains '~'; with {option} it cannot hold a "
                        "shape range and must mark dynamic dims with -1")
    names, shapes = parse_input_shape(text)  # E10004 when empty, as GE
    mode = _MODE_OF_OPTION[option]
    if mode == "batch":
        raw = _batch_gears(value, names, shapes)
    elif mode == "image_size":
        raw = _image_gears(value, names, shapes, fmt)
    else:
        raw = _dims_gears(value, names, shapes)
    gears = check_gears(raw, max_gears, option=f"{option} {_q(value)}")
    if hybrid and mode != "dims":
        _fail("E10001", f"hybrid mode needs dynamic_dims (GE recognises it only with "
                        f"ge.inputShape + ge.dynamicDims), got {option}")
    return SpecFields(mode, names, shapes, gears, hybrid, fmt,
                      check_precision_mode(precision_mode))


#: GE option keys read by :func:`ge_option_fields` -> :func:`atc_fields` argument.
GE_OPTION_KEYS: dict[str, str] = {
    "ge.inputShape": "input_shape",
    "ge.dynamicBatchSize": "dynamic_batch_size",
    "ge.dynamicImageSize": "dynamic_image_size",
    "ge.dynamicDims": "dynamic_dims",
    "ge.inputFormat": "input_format",
    "input_format": "input_format",  # GE's ir_option::INPUT_FORMAT is spelled this way
    "ge.exec.precision_mode": "precision_mode",
    "precision_mode": "precision_mode",  # ir_option::PRECISION_MODE (atc's flag name)
}
#: GE's newer precision option: GE refuses it beside precision_mode (E10056) and this
#: runtime does not read it yet, so it is refused rather than dropped (a dropped precision
#: option changes results silently).
PRECISION_MODE_V2_KEYS = ("ge.exec.precision_mode_v2", "precision_mode_v2")


def ge_option_fields(options: Mapping[str, str], max_gears: int = DEFAULT_MAX_GEARS,
                     ) -> SpecFields:
    """A spec's fields from GE session/graph options.

    Reads ``ge.inputShape``, ``ge.dynamicDims`` / ``ge.dynamicBatchSize`` /
    ``ge.dynamicImageSize``, ``ge.inputFormat`` (or ``input_format``), ``ge.dynamicNodeType``,
    ``ge.compileHybridMode`` and ``ge.exec.precision_mode`` (or ``precision_mode``); other keys
    are ignored, but ``precision_mode_v2`` is refused (see :data:`PRECISION_MODE_V2_KEYS`).
    As in GE an empty value counts as not set. Hybrid mode is on exactly when ge.inputShape
    and ge.dynamicDims are set, ge.dynamicNodeType == "1" and ge.compileHybridMode == "1"
    (UserHybridGraphManager), values compared after stripping surrounding whitespace.
    """
    if not isinstance(options, Mapping):
        _fail("E10001", f"GE options must be a mapping of str to str, got "
                        f"{type(options).__name__}")
    got: dict[str, str | None] = {}
    for key in (*GE_OPTION_KEYS, "ge.dynamicNodeType", "ge.compileHybridMode"):
        value = _option_str(key, options.get(key), optional=True)
        got[key] = value or None  # GE: an empty option is an unset option
    fmt, alt = got["ge.inputFormat"], got["input_format"]
    if fmt and alt and fmt != alt:
        _fail("E10001", f"ge.inputFormat {_q(got['ge.inputFormat'])} and input_format "
                        f"{_q(got['input_format'])} disagree")
    precision, precision_alt = got["ge.exec.precision_mode"], got["precision_mode"]
    if precision and precision_alt and precision != precision_alt:
        _fail("E10001", f"ge.exec.precision_mode {_q(precision)} and precision_mode "
                        f"{_q(precision_alt)} disagree")
    v2 = next((k for k in PRECISION_MODE_V2_KEYS
               if _option_str(k, options.get(k), optional=True)), None)
    if v2 is not None:
        _fail("E10001", f"{v2} {_q(options[v2])} is not supported here (this runtime reads "
                        f"precision_mode, not precision_mode_v2); write precision_mode instead")
    hybrid = (got["ge.inputShape"] is not None and got["ge.dynamicDims"] is not None
              and got["ge.dynamicNodeType"] == "1" and got["ge.compileHybridMode"] == "1")
    return atc_fields(
        got["ge.inputShape"] or "",
        dynamic_batch_size=got["ge.dynamicBatchSize"],
        dynamic_image_size=got["ge.dynamicImageSize"],
        dynamic_dims=got["ge.dynamicDims"],
        input_format=fmt or alt,
        max_gears=max_gears, hybrid=hybrid, precision_mode=precision or precision_alt)


def atc_flags(spec: Any) -> dict[str, str]:
    """ATC flag values for ``spec`` (a GearSpec): ``input_shape``, the mode's option,
    ``input_format`` when set.

    Round trip: ``atc_fields(**atc_flags(spec), max_gears=...)`` gives back the spec's fields
    for every spec with ``hybrid=False`` (hybrid is not an ATC flag: it is dropped here; the
    config writer keeps it). Raises GearSpecError when the spec cannot be written so that it
    reads back the same (an input name that is empty, has surrounding whitespace or contains
    ';' or '~', or a spec GE would reject).
    """
    for name in spec.input_names:
        if not name or name != name.strip() or ";" in name or "~" in name:
            _fail("E10001", f"input name {_q(name)} cannot be written in input_shape: it must be "
                            "non-empty, without surrounding whitespace, ';' or '~'")
    out = {"input_shape": _input_shape_text(spec.input_names, spec.input_shapes),
           _OPTION_OF_MODE[spec.mode]: _gears_text(spec.mode, spec.gears)}
    if spec.input_format is not None:
        out["input_format"] = spec.input_format
    if spec.precision_mode is not None:
        out["precision_mode"] = spec.precision_mode
    # Prove the round trip instead of hoping for it: a directly built spec can hold things GE
    # would reject (one gear, a -1 on a non-batch axis in batch mode, ...).
    try:
        back = atc_fields(**out, max_gears=max(len(spec.gears), 2), hybrid=False)
    except GearSpecError as e:
        raise GearSpecError(f"spec cannot be written as ATC flags: {e.message}",
                            code=e.code) from None
    if back != spec.fields()._replace(hybrid=False):
        _fail("E10001", f"spec cannot be written as ATC flags: {out} reads back as {back!r}")
    return out
