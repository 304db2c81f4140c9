"""The rules for what a caller passes as inputs, once: Python lists (and scalars) to arrays,
and input names. The executor and the server (``serving/protocol.py``, ``serving/start.py``)
both apply these functions; nothing else converts or checks them.

The list rule (no silent cast, no silent truncation, no silent wrap-around): a list holds
values of the input's kind -- bools for a bool input, integers for an integer input, floats
for a float input, numbers for a complex input -- or integers that a float / complex input
holds exactly (``1`` for a float32 input is ``1.0``: JSON writers print 1.0 as 1, and Python
users write ``[[1, 2]]``; ``16777217`` for a float32 input is refused: it would become
16777216). Within a kind a value takes the input's width when it fits (0.7 is a valid
float16 value; 300 is no uint8 value and 1e39 no float32 value). Anything else -- a float
for an integer input, a bool for a number, None, strings, ``Fraction`` / ``Decimal`` objects,
ragged lists -- is an :class:`InputError` naming the input, the value and what was expected.
Arrays are not converted here: the C++ core demands the model's exact dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gear_runtime import arguments
from gear_runtime.errors import InputError

#: Per input kind (numpy's), the kinds of list values accepted for it.
ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "c": "iufc"}

_KIND_NAMES = {"b": "bool", "i": "integer", "u": "integer", "f": "float", "c": "complex",
               "U": "string", "S": "bytes", "O": "object", "M": "datetime", "m": "timedelta",
               "V": "void"}


def list_to_array(name: str, value: Any, dtype: np.dtype | type | str) -> np.ndarray:
    """``value`` (a Python list, nested lists or a scalar) as an array of ``dtype`` under the
    list rule of this module; InputError naming input ``name`` otherwise. The shape is
    numpy's reading of the nesting (callers check it against what they expect)."""
    expected = np.dtype(dtype)
    try:
        natural = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:  # ragged lists, odd objects
        raise InputError(f"input {name!r} cannot be read as a {expected} array: {exc}"
                         ) from None
    if natural.dtype == expected or natural.size == 0:
        return natural.astype(expected, copy=False)
    if natural.dtype.kind == "f":  # numpy reads [2**63, 0] as float64
        natural = _big_ints_as_written(value, natural, expected)
    if natural.dtype.kind == "O":
        natural = _from_objects(name, natural, expected)
    kind = natural.dtype.kind
    if kind not in ACCEPTED_KINDS.get(expected.kind, ""):
        raise InputError(
            f"input {name!r} holds {_KIND_NAMES.get(kind, str(natural.dtype))} values "
            f"(first: {natural.flat[0].item()!r}); the model's input is {expected}: pass "
            f"{_KIND_NAMES.get(expected.kind, str(expected))} values or a {expected} array "
            "(no silent cast or truncation)")
    if expected.kind in "iu":
        check_int_range(name, [natural.min().item(), natural.max().item()], expected)
        return natural.astype(expected)
    with np.errstate(over="ignore", invalid="ignore"):
        out = natural.astype(expected)
    if kind in "iu":
        _check_exact_ints(name, natural, out, expected)
    overflow = ~np.isfinite(out) & np.isfinite(natural)
    if overflow.any():
        raise InputError(f"input {name!r} holds the value {natural[overflow].flat[0].item()}, "
                         f"out of range for the model's {expected} input (it would become inf)")
    return out


def as_input_array(name: str, value: Any, dtype: np.dtype | type | str) -> np.ndarray:
    """A non-ndarray input as an array: anything with a dtype (numpy scalars, other
    libraries' arrays) keeps it (the core then demands the model's exact dtype, as for an
    ndarray); Python lists and scalars follow :func:`list_to_array`."""
    if hasattr(value, "dtype"):
        try:
            return np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise InputError(f"input {name!r} cannot be read as an array: {exc}") from None
    return list_to_array(name, value, dtype)


def _big_ints_as_written(value: Any, natural: np.ndarray, expected: np.dtype) -> np.ndarray:
    """numpy's float reading of a list, or the values as written (an object array) where
    that reading may hide integers beyond int64 / uint64: for an integer input when every
    value is an integer (then they are checked against its range), for a float input when
    one is an integer beyond 2**53 (below it every integer is exact in float64)."""
    finite = natural[np.isfinite(natural)]
    if expected.kind not in "iu" and not (finite.size and np.abs(finite).max() >= 2**53):
        return natural
    written = np.asarray(value, dtype=object)
    ints = [_is_int(v) for v in written.flat]
    if all(ints) if expected.kind in "iu" else any(ints):
        return written
    return natural


def _from_objects(name: str, natural: np.ndarray, expected: np.dtype) -> np.ndarray:
    """An object array numpy made of a list: integers beyond 64 bits (and, for a float
    input, floats beside them) are checked against the input; anything else (None,
    Fraction, Decimal, strings among numbers) is refused, naming the first odd value."""
    items = natural.ravel().tolist()
    numbers = (int, np.integer, float, np.floating) if expected.kind in "fc" else (int,
                                                                                 np.integer)
    odd = [v for v in items if isinstance(v, bool | np.bool_) or not isinstance(v, numbers)]
    odd = odd[:1]
    if odd or expected.kind not in "iufc":
        (first,) = odd or items[:1]
        raise InputError(
            f"input {name!r} holds a {type(first).__name__} value ({first!r}); the model's "
            f"input is {expected}: pass {_KIND_NAMES.get(expected.kind, str(expected))} values"
            f" or a {expected} array")
    if expected.kind in "iu":
        check_int_range(name, [int(v) for v in items], expected)
        return np.asarray(items, dtype=expected).reshape(natural.shape)
    return _float_objects(name, items, expected).reshape(natural.shape)


def _float_objects(name: str, items: list[Any], expected: np.dtype) -> np.ndarray:
    """Python numbers into a float / complex input: integers only where held exactly."""
    out = []
    with np.errstate(over="ignore"):
        for v in items:
            if not _is_int(v):
                out.append(expected.type(v))  # a float (big ints beside it brought us here)
                continue
            f = expected.type(float(v)) if abs(v) < 2**1024 else expected.type(np.inf)
            if not np.isfinite(f) or int(f.real) != v:
                raise InputError(f"input {name!r} holds the integer {v}, which the model's "
                                 f"{expected} input cannot hold exactly")
            out.append(f)
    return np.asarray(out, dtype=expected)


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


def _check_exact_ints(name: str, ints: np.ndarray, floats: np.ndarray,
                      expected: np.dtype) -> None:
    """Integers into a float / complex input: each must be held exactly. Up to 2**(mantissa
    bits + 1) every integer is; only larger ones are compared one by one."""
    limit = 2 ** (np.finfo(expected).nmant + 1)
    big = (ints > limit) | (ints < -limit) if ints.dtype.kind == "i" else ints > limit
    for i in np.flatnonzero(big.ravel()):
        v, f = int(ints.flat[i]), floats.flat[i]
        if not np.isfinite(f) or int(f.real) != v:
            raise InputError(f"input {name!r} holds the integer {v}, which the model's "
                             f"{expected} input cannot hold exactly")


def check_int_range(name: str, ints: Iterable[int], dtype: np.dtype) -> None:
    """InputError naming the first of ``ints`` outside integer ``dtype``'s range."""
    info = np.iinfo(dtype)
    bad = next((v for v in ints if not info.min <= v <= info.max), None)
    if bad is not None:
        raise InputError(f"input {name!r} holds the value {bad}, out of range for the model's "
                         f"{dtype} input ({info.min}..{info.max})")


def check_names(given: Iterable[Any], names: Sequence[str], owner: str = "the model") -> None:
    """InputError unless ``given`` (a request's input names) are exactly ``names``: it lists
    the missing and the unknown ones, and the inputs ``owner`` takes."""
    given = list(given)
    missing = [n for n in names if n not in given]
    unknown = [n for n in given if n not in names]
    if missing or unknown or len(given) != len(names):
        raise InputError(
            f"inputs do not match {owner}"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else "")
            + f"; the inputs are: {', '.join(names)}")


def check_known(given: Iterable[Any], names: Sequence[str], what: str) -> None:
    """InputError when ``given`` names inputs that are not among ``names`` (``what``: what
    names them, e.g. ``"pad_values"``)."""
    unknown = [n for n in given if n not in names]
    if unknown:
        raise InputError(f"{what} names unknown inputs: {', '.join(map(str, unknown))}; the "
                         f"model's inputs are: {', '.join(names)}")


def to_ints(what: str, values: Any) -> tuple[int, ...]:
    """``values`` as Python ints, integers only (Python or numpy): no silent truncation of
    2.5, no "3" strings, none beyond int64 (no tensor dimension is; the C++ core takes int64).
    InputError naming ``what`` otherwise. The rule of every integer argument of an executor
    (dims, batch, image size, state rows)."""
    try:
        items = list(values)
        ints = tuple(operator.index(v) for v in items)
    except TypeError:
        raise InputError(f"{what} must be a sequence of integers, got "
                         f"{arguments.shown(values)}") from None
    if any(isinstance(v, bool | np.bool_) for v in items):  # True is 1 to index()
        raise InputError(f"{what} must be integers, got a bool in "
                         f"{arguments.shown(values)}")
    for v in ints:
        if not arguments.INT64_MIN <= v <= arguments.INT64_MAX:
            raise InputError(f"{what} holds {v}, beyond any tensor dimension (int64: "
                             f"{arguments.INT64_MIN}..{arguments.INT64_MAX})")
    return ints
