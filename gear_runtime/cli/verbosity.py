"""``gear-runtime -v`` / ``-q`` (before the command): how much a command says besides its results.

    (default)  progress bars on a terminal, info lines (``wrote FILE``), warnings, errors
    -q         warnings and errors only: no bar, no info line, the package's log at WARNING
    -v, -vv    also the package's log (logger ``gear_runtime``) at INFO, DEBUG, on stderr

A command's results (a table, a description, a JSON document) are printed either way, and so
is its one error line: ``-q`` is for scripts and jobs that want nothing else.
"""

from __future__ import annotations

import argparse
import logging

from gear_runtime import progress

#: The package's logger: every module logs under it (``gear_runtime.serving`` etc.).
LOGGER = "gear_runtime"
#: The same lines as ``serve --log-level`` writes.
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"

_quiet = False


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``-v`` (counted) and ``-q`` on ``parser``: the top-level one, so every command has them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="the package's log on stderr: INFO, -vv DEBUG")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="warnings and errors only: no progress bar, no info line (results "
                       "are still printed)")


def apply(args: argparse.Namespace) -> None:
    """Set this process's output from ``args.verbose`` / ``args.quiet``. Sets all of it on
    every call, the default included, so that one in-process run never leaks into the next."""
    global _quiet
    quiet, verbose = bool(getattr(args, "quiet", False)), int(getattr(args, "verbose", 0))
    _quiet = quiet
    progress.silence(quiet)
    logger = logging.getLogger(LOGGER)
    if quiet:
        logger.setLevel(logging.WARNING)
    elif verbose:
        logger.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
        # a handler on the root (none is there by default: logging's last resort prints
        # warnings only); `serve` configures the same one itself, so it keeps this one
        logging.basicConfig(format=LOG_FORMAT)
    else:
        logger.setLevel(logging.NOTSET)  # as before -v/-q: serve's --log-level decides


def info(line: str) -> None:
    """Print ``line`` on stdout unless ``-q``: what a command did (``wrote FILE``), not its
    result."""
    if not _quiet:
        print(line)


def quiet() -> bool:
    """Whether ``-q`` was given (for a command's own progress lines)."""
    return _quiet


__all__ = ["LOGGER", "add_flags", "apply", "info", "quiet"]
