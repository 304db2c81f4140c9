"""``gear-runtime inspect``: describe a gear file."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import EXIT_OK, existing_file


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``inspect`` command's flags."""
    p = sub.add_parser("inspect", help="describe a gear file")
    p.add_argument("file", metavar="FILE", help="a gear file written by compile")
    p.set_defaults(handler=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from gear_runtime.tools.inspect import describe

    print(describe(existing_file(args.file, "gear file")))
    return EXIT_OK
