"""``gear-runtime demo``: build, compile, run, check and benchmark the built-in example."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import int_at_least, make_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` command's flags."""
    p = sub.add_parser("demo", help="build, compile, run, check and benchmark the example",
                       description="The whole flow on the built-in prefill example (4 inputs, "
                       "4 sequence gears), checked end to end: build the model and its config, "
                       "parse the gear spec, compile a gear file and a hybrid one, run every "
                       "gear against ONNX Runtime on the original model, refuse an "
                       "out-of-gear request (and serve it on the hybrid file), benchmark every "
                       "gear, check padding. Exit 0 only when every check passed.")
    p.add_argument("--workdir", metavar="DIR", help="keep the files here (default: a temp dir)")
    p.add_argument("--iterations", type=int_at_least(1), default=None, metavar="N",
                   help="benchmark iterations per gear (default 100; 20 with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer benchmark iterations")
    p.add_argument("--threads", type=int_at_least(1), default=1, metavar="N",
                   help="ORT intra-op threads of the benchmark's sessions (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from gear_runtime.tools.demo import run_demo

    if args.workdir is not None:
        make_dir("--workdir", args.workdir)  # before the demo starts printing
    return run_demo(args.workdir, iterations=args.iterations, quick=args.quick,
                    progress=not args.no_progress, threads=args.threads)
