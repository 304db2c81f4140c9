"""``gear-runtime check-padding``: is ``execute(pad=True)`` exact for this model?"""

from __future__ import annotations

import argparse
import os

from gear_runtime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    error,
    existing_file,
    float_at_least,
    parse_pad_values,
)
from gear_runtime.errors import BackendError, DataRefusedError, GearRuntimeError, InputError
from gear_runtime.tools.common import jsonout

#: check-padding's exit codes: 0 SAFE, 1 UNSAFE, 2 could not check (bad input, a model or
#: source that fails to load or run, an internal error): a failure is never read as a verdict.
EXIT_SAFE, EXIT_UNSAFE, EXIT_UNCHECKED = EXIT_OK, EXIT_FAILED, 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``check-padding`` command's flags."""
    p = sub.add_parser("check-padding", help="is execute(pad=True) exact for this model?",
                       description="Run the source model at exact request sizes and the gear "
                       "file padded, compare the trimmed outputs. Exit 0: SAFE (they agree); "
                       "1: UNSAFE (they differ); 2: could not check (bad input, a static "
                       "model, a model that fails to load or run).")
    p.add_argument("file", metavar="GEAR", help="the gear file")
    p.add_argument("source", metavar="SOURCE.onnx", help="the model it was compiled from")
    p.add_argument("--samples", metavar="V", help='request sizes, e.g. "5;17;100" (one value '
                   'for every value that varies between the gears) or "5,5,5,16;17,17,17,16" '
                   "(every dynamic value); each must fit in some gear (default: inside and "
                   "between the gears)")
    p.add_argument("--pad-value", action="append", default=[], metavar="NAME=V",
                   help="pad value of an input (default 0), repeatable")
    p.add_argument("--rtol", type=float_at_least(0.0), default=1e-4, metavar="R",
                   help="relative tolerance of a float output: |padded - exact| <= atol + "
                   "rtol * |exact| (default 1e-4); integer outputs must be equal")
    p.add_argument("--atol", type=float_at_least(0.0), default=1e-5, metavar="A",
                   help="absolute tolerance of a float output (default 1e-5)")
    p.add_argument("--valid", action="append", default=[], metavar="NAME:AXIS",
                   help="compare output NAME only over the first request-length entries "
                        "along AXIS (a cache padded to a fixed length; repeatable)")
    p.add_argument("--ignore-output", action="append", default=[], metavar="NAME",
                   help="do not compare output NAME (repeatable)")
    p.add_argument("--json", metavar="PATH", help='write the report as JSON (schema '
                   '"gear-runtime-check-padding/1", see docs/json.md); "-" for stdout (then '
                   "the table is not printed)")
    p.add_argument("--record", action="store_true",
                   help="write the verdict (SAFE / UNSAFE, with the --valid / --ignore-output "
                   "it used) into the gear file's metadata (resealed): loading it then never "
                   "pads a model found UNSAFE, and serve --pad / --sequence-start read it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=cmd_check_padding)


def cmd_check_padding(args: argparse.Namespace) -> int:
    """0 SAFE, 1 UNSAFE, 2 could not check: a failure that would exit 1 elsewhere (a
    backend error, an internal error) exits 2 here, one line on stderr, so that 1 always
    means the outputs differ."""
    try:
        return _check(args)
    except (UsageError, GearRuntimeError, OSError) as exc:
        if isinstance(exc, BackendError) and not isinstance(exc, DataRefusedError):
            error(f"check-padding could not check: {exc.message}", exc.code)
            return EXIT_UNCHECKED
        raise  # the CLI's rule already exits 2 for these
    except Exception as exc:  # noqa: BLE001 - a bug: still "could not check", never UNSAFE
        if os.environ.get("GEAR_RUNTIME_TRACEBACK"):  # the CLI's switch (cli/app.py)
            raise
        error(f"check-padding could not check: internal error: {type(exc).__name__}: {exc} "
              "(a bug in gear-runtime, not in your input: please report it)")
        return EXIT_UNCHECKED


def _check(args: argparse.Namespace) -> int:
    from gear_runtime.tools.check.padding import MAX_SAMPLES, check_padding

    existing_file(args.file, "gear file")
    existing_file(args.source, "source model")
    if args.json is not None:
        jsonout.check_target(args.json)
    pads = parse_pad_values(args.pad_value)
    samples = _samples(args.samples, MAX_SAMPLES) if args.samples is not None else None
    report = check_padding(args.file, args.source, samples=samples, pad_values=pads,
                           rtol=args.rtol, atol=args.atol, progress=not args.no_progress,
                           valid=_valid(args.valid), ignore_outputs=args.ignore_output,
                           record=args.record)
    if args.json != "-":
        print(report.table())
        if args.record:
            print(f"recorded in {args.file}: padding {'SAFE' if report.safe else 'UNSAFE'}")
    if args.json is not None:
        jsonout.write(args.json, report.to_json())
    return EXIT_SAFE if report.safe else EXIT_UNSAFE


def _valid(items: list[str]) -> dict[str, int]:
    """``--valid NAME:AXIS`` items as {name: axis}; InputError naming a malformed one."""
    out = {}
    for item in items:
        name, sep, axis = item.rpartition(":")
        if not sep or not name or not axis.isdigit() or len(axis) > 3:
            raise InputError(f"--valid {item!r}: expected NAME:AXIS, e.g. present_kv:4")
        out[name] = int(axis)
    return out


def _samples(text: str, limit: int) -> list[list[int]]:
    """``--samples``: request sizes separated by ';', values by ','; each an integer >= 1."""
    pieces = [p for p in text.split(";") if p.strip()]
    if not pieces:
        raise InputError(f"--samples {text!r} is empty; give sizes such as \"5;17;100\"")
    if len(pieces) > limit:
        raise InputError(f"--samples: {len(pieces)} samples; at most {limit} per check")
    out = []
    for piece in pieces:
        values = []
        for token in piece.split(","):
            token = token.strip()
            if not token.isdigit() or len(token) > 10 or int(token) < 1:
                raise InputError(f"--samples {piece.strip()!r}: {token!r} is not a request "
                                 "size (an integer >= 1)")
            values.append(int(token))
        out.append(values)
    return out
