"""``gear-runtime inspect``: describe a gear file (text, or ``--json``)."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import EXIT_OK, add_json_flag, existing_file
from gear_runtime.tools import jsonout


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``inspect`` command's flags."""
    p = sub.add_parser("inspect", help="describe a gear file",
                       description="Describe a gear file: its mode, inputs, outputs, every "
                       "gear's shapes, weights and files, after verifying its integrity.")
    p.add_argument("file", metavar="FILE", help="a gear file written by compile")
    add_json_flag(p, "inspect", "the description")
    p.set_defaults(handler=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from gear_runtime.tools.inspect import inspect_document, text

    existing_file(args.file, "gear file")
    if args.json is not None:
        jsonout.check_target(args.json)
    doc = inspect_document(args.file)
    if args.json != jsonout.STDOUT:
        print(text(doc))
    if args.json is not None and jsonout.write(args.json, doc) is not None:
        print(f"wrote {args.json}")
    return EXIT_OK
