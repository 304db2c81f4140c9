"""Reading a ``bench --json`` result back (``bench --compare``), as strictly as the loader reads
a gear file: only a regular file of at most :data:`MAX_RESULT_BYTES` (never /dev/zero, a FIFO
or a huge file), JSON nested no deeper than the reader allows, and every field the comparison
uses checked for its type, with the field named in the error (``gears[1].samples_ns.execute:
...``). Timings must be finite and positive, at most :data:`MAX_ITERATIONS` per runner: a NaN
would make every verdict "within noise", and the bootstrap's memory grows with the count.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from typing import Any

from gear_runtime.errors import InputError
from gear_runtime.files import read_regular_file, reason
from gear_runtime.tools.bench.report import MAX_ITERATIONS, RUNNERS, SCHEMA

#: The largest result file read (a run of 8 gears x 4 runners x 100,000 iterations is ~30 MB).
MAX_RESULT_BYTES = 64 * 2**20


def load_result(path: str | os.PathLike[str], flag: str = "--compare") -> dict[str, Any]:
    """A bench JSON written by this version's ``bench --json``; InputError naming the file
    (and the field) when it cannot be read, is not JSON, is an older layout without context
    and raw times, or holds a field of the wrong type or a timing that is not a positive
    finite number. ``flag``: the option that named the file, in the messages."""
    name = os.fspath(path)
    try:
        blob = read_regular_file(name, MAX_RESULT_BYTES)
    except OSError as exc:
        raise InputError(f"{flag}: bench result {name!r} cannot be read: {reason(exc)}") \
            from None
    try:
        data = json.loads(blob.decode("utf-8"))
    except RecursionError:
        raise InputError(f"{flag}: {name!r} is not a bench result: its JSON is nested "
                         "deeper than the reader allows") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{flag}: {name!r} is not JSON ({exc})") from None
    check_result(data, name, flag)
    return data


Fail = Callable[[str, str], InputError]


def check_result(data: Any, name: str, flag: str = "--compare") -> None:
    """InputError naming ``name`` (the file) and the field unless ``data`` is a result of
    :data:`SCHEMA` whose every field the comparison reads has the type it reads it as, and
    whose timings are positive and finite (compare_results checks what it is given too)."""
    if not isinstance(data, dict):
        raise InputError(f"{flag}: {name!r} is not a {SCHEMA} result: not a JSON object")
    if data.get("schema") != SCHEMA:
        raise InputError(f"{flag}: {name!r} is not a {SCHEMA} result (no context and no "
                         "per-iteration times: written by an older gear-runtime or another "
                         "tool); run gear-runtime bench --json again")
    _check_fields(data, lambda field, what: InputError(f"{flag}: {name!r} {field}: {what}"))


def _check_fields(data: dict[str, Any], fail: Fail) -> None:
    """Every field the comparison reads, of the type it reads it as."""
    context = _object(data.get("context", {}), "context", fail)
    for key in ("machine", "settings", "versions", "model"):
        _object(context.get(key, {}), f"context.{key}", fail)
    model = context.get("model", {})
    for key in ("digest", "path"):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise fail(f"context.model.{key}", "expected a string")
    if model.get("bytes") is not None and not _is_int(model["bytes"]):
        raise fail("context.model.bytes", "expected an integer")
    machine = context.get("machine", {})
    load = machine.get("load_average")
    if load is not None and not (isinstance(load, list) and all(_is_number(x) for x in load)):
        raise fail("context.machine.load_average", "expected a list of numbers")
    cores = machine.get("usable_cores")
    if cores is not None and not _is_int(cores):
        raise fail("context.machine.usable_cores", "expected an integer")
    gears = data.get("gears")
    if not isinstance(gears, list) or not gears:
        raise fail("gears", "expected a list of gears (one object per gear)")
    for i, gear in enumerate(gears):
        _check_gear(gear, f"gears[{i}]", fail)


def _check_gear(gear: Any, where: str, fail: Fail) -> None:
    gear = _object(gear, where, fail)
    if not _is_int(gear.get("gear")):
        raise fail(f"{where}.gear", "expected the gear index (an integer)")
    dims = gear.get("dims")
    if not isinstance(dims, list) or not all(_is_int(d) for d in dims):
        raise fail(f"{where}.dims", "expected the gear's dims (a list of integers)")
    samples = _object(gear.get("samples_ns"), f"{where}.samples_ns", fail)
    if "execute" not in samples:
        raise fail(f"{where}.samples_ns", "has no per-iteration execute times")
    for runner in RUNNERS:
        if runner in samples:
            _check_samples(samples[runner], f"{where}.samples_ns.{runner}", fail)


def _check_samples(values: Any, where: str, fail: Fail) -> None:
    """A non-empty list of at most MAX_ITERATIONS positive finite durations (ns)."""
    if not isinstance(values, list) or not values:
        raise fail(where, "expected a non-empty list of per-iteration times in ns")
    if len(values) > MAX_ITERATIONS:
        raise fail(where, f"{len(values)} samples; bench records at most {MAX_ITERATIONS} "
                   "iterations per runner")
    for k, v in enumerate(values):
        if not _is_number(v) or not math.isfinite(v) or v <= 0:
            raise fail(where, f"sample {k} is {v!r}; every time must be a positive, finite "
                       "number of ns")


def gear_latencies(data: dict[str, Any]) -> dict[tuple[int, ...], float]:
    """A checked result's median execute time per gear (seconds), by the gear's dims."""
    return {tuple(g["dims"]): statistics.median(g["samples_ns"]["execute"]) / 1e9
            for g in data["gears"]}


def _object(value: Any, where: str, fail: Fail) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(where, f"expected an object, got {type(value).__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


__all__ = ["MAX_RESULT_BYTES", "check_result", "gear_latencies", "load_result"]
