"""The ``gear-runtime`` command: the parser of every subcommand, and the one error rule.

    gear-runtime compile MODEL.onnx --input-shape S --dynamic-dims V -o OUT   (or --config FILE)
    gear-runtime inspect FILE
    gear-runtime run FILE --input NAME=file.npy ... [--dynamic-dims D] [--output-dir DIR]
    gear-runtime bench FILE [--gears 0,2|all] [--iterations N] [--json OUT] [--plot OUT.png]
    gear-runtime bench --compare BEFORE.json AFTER.json [--fail-on-regression PCT]
    gear-runtime demo [--workdir DIR] [--iterations N] [--quick]
    gear-runtime serve FILE... [--port N] [--ray]
    gear-runtime check-padding GEAR SOURCE.onnx [--samples V]
    gear-runtime plan MODEL.onnx --input-shape S --trace FILE --max-gears K
    gear-runtime completion bash|zsh|fish          (the shell completion script)
    gear-runtime -q COMMAND ... / -v COMMAND ...   (warnings only / the package's log)
    gear-runtime --version                         (and each backend runtime's)

Each command lives in its own module of this package (``add_parser`` and its ``cmd_*``);
:mod:`gear_runtime.cli.common` holds what they share. Exit codes: 0 success; 2 usage errors
and bad input; 1 failed checks and failures while running (backend errors). Every error is
ONE line on stderr, ``gear-runtime: error: [code] message``; never a traceback: an exception
no check expected is a bug, and is still one line (``internal error: ...``, exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gear_runtime.cli import (
    bench,
    compile,
    completion,
    demo,
    inspect,
    llm,
    padding,
    plan,
    run,
    serve,
    verbosity,
    versions,
)
from gear_runtime.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    PROG,
    Parser,
    UsageError,
    error,
)
from gear_runtime.errors import BackendError, DataRefusedError, GearRuntimeError

#: Set (to anything) to see the traceback of an internal error instead of its one line.
TRACEBACK_ENV = "GEAR_RUNTIME_TRACEBACK"
#: The exit code of a command whose stdout was closed early (128 + SIGPIPE, as a shell has it).
EXIT_BROKEN_PIPE = 141
#: The subcommands in the order ``--help`` lists them.
COMMAND_MODULES = (compile, inspect, run, bench, demo, serve, padding, plan, llm, completion)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every subcommand with its flags and its handler, and the
    global ``--version`` and ``-v`` / ``-q``."""
    parser = Parser(prog=PROG, description="Run models compiled with dynamic gears (CANN GE "
                    "dynamic batch / image size / dims) on ONNX Runtime or Ascend.")
    parser.add_argument("--version", action=versions.VersionAction)
    verbosity.add_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    return parser


def _quiet_onnxruntime() -> None:
    """ORT's own log lines (its environment logger: warnings at session creation, errors of
    a failing run) never reach the terminal: every failure comes back as an exception the
    command reports in its one line."""
    try:
        import onnxruntime
    except ImportError:  # a device-only install runs without it
        return
    onnxruntime.set_default_logger_severity(4)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except UsageError as exc:
        error(str(exc))
        return EXIT_USAGE
    except SystemExit as exc:  # --help / --version print and exit 0
        return int(exc.code or 0)
    except BrokenPipeError:  # --help / --version | head
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # serve --workers re-runs it
    args.parser = parser  # the whole command line: what `completion` describes
    verbosity.apply(args)
    _quiet_onnxruntime()
    try:
        return args.handler(args)
    except UsageError as exc:
        error(f"{args.command}: {exc}")
        return EXIT_USAGE
    except BrokenPipeError:  # stdout closed early (| head): stop quietly, as other tools do
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except DataRefusedError as exc:  # the backend refused the input's values: bad input
        error(exc.message, exc.code)
        return EXIT_USAGE
    except BackendError as exc:  # the input was fine; running it failed
        error(exc.message, exc.code)
        return EXIT_FAILED
    except GearRuntimeError as exc:  # spec, file, input, gear errors: bad input
        error(exc.message, exc.code)
        return EXIT_USAGE
    except OSError as exc:  # a path the user gave cannot be read or written
        error(f"{exc.strerror or exc}" + (f": {exc.filename!r}" if exc.filename else ""))
        return EXIT_USAGE
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 -- the last resort: a bug, still one line
        if os.environ.get(TRACEBACK_ENV):
            raise
        error(f"internal error: {type(exc).__name__}: {exc} (a bug in gear-runtime, not in "
              f"your input: please report it; {TRACEBACK_ENV}=1 shows the traceback)")
        return EXIT_FAILED


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
