"""``gear-runtime check-padding``: is ``execute(pad=True)`` exact for this model?"""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    existing_file,
    float_at_least,
    int_list,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``check-padding`` command's flags."""
    p = sub.add_parser("check-padding", help="is execute(pad=True) exact for this model?",
                       description="Run the source model at exact request sizes and the gear "
                       "file padded, compare the trimmed outputs; exit 1 when they differ.")
    p.add_argument("file", metavar="GEAR", help="the gear file")
    p.add_argument("source", metavar="SOURCE.onnx", help="the model it was compiled from")
    p.add_argument("--samples", metavar="V", help='request sizes, e.g. "5;17;100" or '
                   '"5,5,5,16;17,17,17,16" (default: inside and between the gears)')
    p.add_argument("--pad-value", action="append", default=[], metavar="NAME=V",
                   help="pad value of an input (default 0), repeatable")
    p.add_argument("--rtol", type=float_at_least(0.0), default=1e-4, metavar="R")
    p.add_argument("--atol", type=float_at_least(0.0), default=1e-5, metavar="A")
    p.set_defaults(handler=cmd_check_padding)


def cmd_check_padding(args: argparse.Namespace) -> int:
    from gear_runtime.tools.padding import check_padding

    existing_file(args.file, "gear file")
    existing_file(args.source, "source model")
    pads = {}
    for item in args.pad_value:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--pad-value {item!r}: expected NAME=VALUE")
        try:
            pads[name] = int(value)
        except ValueError:
            try:
                pads[name] = float(value)
            except ValueError:
                raise UsageError(f"--pad-value {item!r}: {value!r} is not a number") from None
    samples = None
    if args.samples:
        samples = [int_list(s, "--samples") for s in args.samples.split(";")]
    report = check_padding(args.file, args.source, samples=samples, pad_values=pads,
                           rtol=args.rtol, atol=args.atol)
    print(report.table())
    return EXIT_OK if report.safe else EXIT_FAILED
