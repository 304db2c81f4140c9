"""``gear-runtime plan``: choose the gears from a trace of requests."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import EXIT_OK, existing_file, int_at_least
from gear_runtime.errors import InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``plan`` command's flags."""
    p = sub.add_parser("plan", help="choose the gears from a trace of requests",
                       description="Plan at most K gears minimising the expected cost of the "
                       "trace's requests, each padded to its cheapest covering gear.")
    p.add_argument("model", metavar="MODEL.onnx", help="the dynamic model")
    p.add_argument("--input-shape", required=True, metavar="S",
                   help='ATC --input_shape, e.g. "x:1,-1"')
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="requests: CSV (values per line) or JSON lines")
    p.add_argument("--max-gears", type=int_at_least(1), required=True, metavar="K")
    p.add_argument("--cost", choices=("elements", "measured"), default="elements")
    p.add_argument("--current", metavar="V", help='the gears in use, e.g. "32;512;1024;2048"')
    p.add_argument("--max-gear", type=int_at_least(1), metavar="N",
                   help="cap on the largest gear; larger requests stay uncovered")
    p.add_argument("--ladder", type=int_at_least(2), default=8, metavar="N",
                   help="--cost measured: gears compiled and benchmarked (default 8)")
    p.add_argument("--iterations", type=int_at_least(1), default=20, metavar="N")
    p.add_argument("--plot", metavar="OUT.png", help="histogram, gear boundaries, latency")
    p.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from gear_runtime.tools.plan.command import run_plan

    existing_file(args.model, "model", InputError)
    existing_file(args.trace, "trace", InputError)
    print(run_plan(args.model, args.input_shape, args.trace, args.max_gears, cost=args.cost,
                   current=args.current, max_gear=args.max_gear, ladder=args.ladder,
                   iterations=args.iterations, plot=args.plot))
    return EXIT_OK
