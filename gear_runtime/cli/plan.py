"""``gear-runtime plan``: choose the gears from a trace of requests."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import (
    EXIT_OK,
    UsageError,
    check_output_file,
    existing_file,
    int_at_least,
)
from gear_runtime.errors import GearRuntimeError, InputError
from gear_runtime.tools.common import jsonout

TRACE_HELP = (
    "the requests, one per line: one value per distinct dynamic length, comma-separated (the "
    "-1 axes of --input-shape that share a symbolic dim name in MODEL.onnx move together: "
    'a Hugging Face prefill whose input_ids, attention_mask and position_ids are all '
    '[1, sequence_length] takes "79"), or one value per -1 axis in --input-shape order '
    '("79,79,79"), or JSON ("79", "[79, 79, 79]", {"dims": [79]}, or named: '
    '{"sequence_length": 79}); a non-numeric first line is a CSV header. A dim that never '
    "changes in your traffic: write its value in --input-shape instead of -1")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``plan`` command's flags."""
    p = sub.add_parser("plan", help="choose the gears from a trace of requests",
                       description="Plan at most K gears minimising the expected cost of the "
                       "trace's requests, each padded to its cheapest covering gear; report "
                       "the plan and the gears in use (--current) on the same footing: "
                       "coverage, the mean and p99 over every request (uncovered ones at their"
                       " own size, as the hybrid fallback runs them), padding waste.")
    p.add_argument("model", metavar="MODEL.onnx", help="the dynamic model (its symbolic dim "
                   "names tie the trace's values; its weights are read only with --cost "
                   "measured)")
    p.add_argument("--input-shape", "--input_shape", required=True, metavar="S",
                   help='ATC --input_shape, e.g. "input_ids:1,-1;attention_mask:1,-1"')
    p.add_argument("--trace", required=True, metavar="FILE", help=TRACE_HELP)
    p.add_argument("--max-gears", type=int_at_least(1), required=True, metavar="K",
                   help="the most gears to plan (GE accepts at most 100)")
    p.add_argument("--cost", choices=("elements", "measured"), default="elements",
                   help="what a request costs on a gear: elements = the gear's total input "
                   "elements (instant); measured = latency of MODEL.onnx compiled and "
                   "benchmarked at --ladder sizes, interpolated (default elements)")
    p.add_argument("--current", metavar="V", help='the gears in use, e.g. "32;512;1024;2048" '
                   "(values per gear as a trace line: per distinct length or per -1 axis)")
    p.add_argument("--max-gear", type=int_at_least(1), metavar="N",
                   help="cap on the largest gear; larger requests stay uncovered")
    p.add_argument("--ladder", type=int_at_least(2), default=8, metavar="N",
                   help="--cost measured: gears compiled and benchmarked (default 8)")
    p.add_argument("--iterations", type=int_at_least(1), default=20, metavar="N",
                   help="--cost measured: timed runs per ladder gear (default 20)")
    p.add_argument("--plot", metavar="OUT.png", help="histogram of the requests, each plan's "
                   "gear boundaries, the latency curve, and the figures side by side (needs "
                   "matplotlib)")
    p.add_argument("--json", metavar="PATH", help='write the result as JSON (schema '
                   '"gear-runtime-plan/1", see docs/json.md); "-" for stdout (then the text '
                   "is not printed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from gear_runtime.tools.plan.command import run_plan

    existing_file(args.model, "model", InputError)
    existing_file(args.trace, "trace", InputError)
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and path != "-":
            check_output_file(flag, path)  # fail now, not after a measured plan
    plot_error = _plotting_error() if args.plot is not None else None
    run = run_plan(args.model, args.input_shape, args.trace, args.max_gears, cost=args.cost,
                   current=args.current, max_gear=args.max_gear, ladder=args.ladder,
                   iterations=args.iterations, plot=None if plot_error else args.plot,
                   progress=not args.no_progress)
    if args.json != "-":
        print(run.text())
    if args.json is not None:
        jsonout.write(args.json, run.to_json())
    if plot_error is not None:  # the plan is printed; the plot it could not draw is the error
        raise UsageError(f"--plot: {plot_error}")
    return EXIT_OK


def _plotting_error() -> str | None:
    """Why no plot can be drawn here (matplotlib missing), checked before planning."""
    from gear_runtime.tools.bench.plot import check_plotting

    try:
        check_plotting()
    except GearRuntimeError as exc:
        return exc.message
    return None
