"""What every ``gear-runtime`` command shares: the exit codes, the one-line usage error, the
argparse types, the checks of the paths a user passes, and the one error line.

The CLI's error rule (one home; :func:`gear_runtime.cli.app.main` applies it): every error is
ONE line on stderr, ``gear-runtime: error: [code] message``, never a traceback for a user
error. Exit 2: usage errors and bad input (a missing file, a wrong gear, a bad flag, a spec
GE would reject); exit 1: failed checks and failures while running (backend errors).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from gear_runtime.errors import GearFileError, GearRuntimeError, InputError

PROG = "gear-runtime"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad command line: raised by the parser instead of printing usage and exiting, and by
    the commands for flags that do not go together (one-line errors, exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line and raises instead of calling sys.exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} -h')")


def backends_help() -> str:
    """The help text of every ``--backend`` flag: the registered backends."""
    from gear_runtime.backends import BACKENDS

    return f"one of {', '.join(sorted(BACKENDS))} (default onnxruntime)"


# ---- argparse types ---------------------------------------------------------------------------
def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: the text as an int >= ``minimum``, else a one-line usage error."""
    return _number_at_least(int, minimum, "an integer", f">= {minimum}")


def float_at_least(minimum: float) -> Callable[[str], float]:
    """An argparse ``type``: the text as a finite float >= ``minimum``."""
    return _number_at_least(float, minimum, "a number", f"a number >= {minimum:g}")


def _number_at_least(convert: Callable[[str], Any], minimum: float, kind: str,
                     bound: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not value >= minimum or value == float("inf"):  # also refuses nan
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        return value

    return parse


def int_list(text: str, what: str) -> list[int]:
    """``"1,2,3"`` (or ``;``-separated) as integers; InputError naming ``what`` otherwise."""
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InputError(f"{what} {text!r} must be integers separated by ','") from None
    if not values:
        raise InputError(f"{what} is empty; give integers separated by ','")
    return values


# ---- paths ------------------------------------------------------------------------------------
def existing_file(path: str, what: str,
                  error: type[GearRuntimeError] = GearFileError) -> str:
    """``path`` when it is an existing file, else ``error`` naming ``what`` and the path."""
    if not os.path.exists(path):
        raise error(f"{what} {path!r} does not exist")
    if not os.path.isfile(path):
        raise error(f"{what} {path!r} is not a file")
    return path


def make_dir(flag: str, path: str) -> Path:
    """Create directory ``path`` (and its parents) if needed; InputError naming ``flag``."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {path!r} cannot be created: {exc}") from None
    return Path(path)


def check_output_file(flag: str, path: str) -> None:
    """InputError naming ``flag`` when ``path`` cannot be written as a file: its directory is
    missing, or it is a directory itself."""
    if Path(path).is_dir():
        raise InputError(f"{flag} {path!r} is a directory; give a file path")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InputError(f"{flag} {path!r}: directory {str(parent)!r} does not exist")


# ---- JSON output ------------------------------------------------------------------------------
def write_json(flag: str, path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path``, or to stdout for ``-``; InputError naming ``flag``
    when the file cannot be written (the directory is checked up front by
    :func:`check_output_file`)."""
    import json

    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{flag} {path!r} cannot be written: {exc.strerror or exc}") from None


# ---- the error line ---------------------------------------------------------------------------
def error(message: str, code: str = "") -> None:
    """Print the one error line: ``gear-runtime: error: [code] message`` on stderr."""
    line = " ".join(message.split())  # one line, whatever the message holds
    prefix = f"[{code}] " if code and not line.startswith(f"[{code}]") else ""
    print(f"{PROG}: error: {prefix}{line}", file=sys.stderr)


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "PROG", "Parser", "UsageError",
           "backends_help", "check_output_file", "error", "existing_file", "float_at_least",
           "int_at_least", "int_list", "make_dir", "write_json"]
