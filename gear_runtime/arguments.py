"""The one rule for a bad argument to a public call: a GearRuntimeError subclass -- the
caller's (InputError for load and executor options, CompileError for compile options) --
naming the argument, the value given and what was expected; never Python's TypeError,
ValueError or OverflowError from deeper down (a pybind11 signature, ``float()``, a C int).

Checks of the kinds of argument the API takes. Python's own signature errors (a missing
argument, an unknown keyword) stay Python's TypeError: they are caught before any of this runs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Any, SupportsFloat, SupportsIndex, cast

import numpy as np

from gear_runtime.errors import GearRuntimeError, InputError

#: The range of a C ``int`` (ORT's thread counts, device ids) and of an int64 (tensor dims).
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message never holds a megabyte)."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def flag(name: str, value: object, error: type[GearRuntimeError] = InputError) -> bool:
    """``value`` when it is True or False (numpy's bools too); ``error`` otherwise (a
    truthy ``"no"`` is not taken for True)."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise error(f"{name} must be True or False, got {shown(value)}")


def integer(name: str, value: object, low: int, high: int,
            error: type[GearRuntimeError] = InputError, unit: str = "") -> int:
    """``value`` as an int when it is an integer (Python's or numpy's, not a bool) from
    ``low`` to ``high``; ``error`` otherwise."""
    if not isinstance(value, bool | np.bool_):
        try:
            number = operator.index(cast(SupportsIndex, value))  # else the TypeError below
        except TypeError:
            pass
        else:
            if low <= number <= high:
                return number
    raise error(f"{name} must be an integer{unit} from {low} to {high}, got {shown(value)}")


def real(name: str, value: object, error: type[GearRuntimeError] = InputError) -> float:
    """``value`` as a float when it is a finite real number >= 0 (an int, a float, a numpy
    number; not a bool, a string or a complex); ``error`` otherwise."""
    if not isinstance(value, bool | np.bool_ | str | bytes | complex | np.complexfloating):
        try:
            number = float(cast(SupportsFloat, value))  # else an error caught below
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            if math.isfinite(number) and number >= 0:
                return number
    raise error(f"{name} must be a finite number >= 0, got {shown(value)}")


def text_mapping(name: str, value: object,
                 error: type[GearRuntimeError] = InputError) -> dict[str, str]:
    """``value`` as a dict when it maps strings to strings, none holding a NUL character
    (C strings would end there); ``error`` otherwise."""
    if not isinstance(value, Mapping):
        raise error(f"{name} must be a dict of str to str, got {shown(value)}")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not isinstance(val, str) or "\0" in key + val:
            raise error(f"{name} must map str to str (no NUL characters); entry "
                        f"{shown(key)}: {shown(val)} is not")
        out[key] = val
    return out


def path(name: str, value: Any, error: type[GearRuntimeError] = InputError) -> str:
    """``value`` as a path string (a str, bytes or os.PathLike without NUL characters);
    ``error`` otherwise."""
    import os

    try:
        text = os.fsdecode(os.fspath(value))
    except TypeError:
        raise error(f"{name} must be a file path, got {type(value).__name__}") from None
    if "\0" in text:
        raise error(f"{name} {text!r} is not a file path: it holds a NUL character")
    return text


def output_file(flag: str, path: str, hint: str = "") -> None:
    """InputError naming ``flag`` now (before any work) when ``path`` cannot be written as a
    file: it is a directory (``hint`` follows "give a file path"), or its folder does not
    exist."""
    if Path(path).is_dir():
        raise InputError(f"{flag} {path!r} is a directory; give a file path{hint}")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InputError(f"{flag} {path!r}: directory {str(parent)!r} does not exist")


__all__ = ["INT32_MAX", "INT64_MAX", "INT64_MIN", "flag", "integer", "output_file", "path", "real",
           "shown", "text_mapping"]
