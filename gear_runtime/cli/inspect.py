"""``gear-runtime inspect``: describe a gear file (text, or ``--json``)."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import (
    EXIT_OK,
    add_device_flags,
    add_json_flag,
    backends_help,
    device_options,
    existing_file,
)
from gear_runtime.cli.verbosity import info
from gear_runtime.tools.common import jsonout


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``inspect`` command's flags."""
    p = sub.add_parser("inspect", help="describe a gear file",
                       description="Describe a gear file: its mode, inputs, outputs, every "
                       "gear's shapes, weights and files, after verifying its integrity.")
    p.add_argument("file", metavar="FILE", help="a gear file written by compile (with "
                   "--backend acl: an .om; mindspore_lite: a .mindir, with --config unless it "
                   "records its gears)")
    p.add_argument("--backend", default=None, metavar="B",
                   help=backends_help() + "; acl / mindspore_lite open their own model files "
                   "and report the gears the backend reads")
    add_device_flags(p)
    add_json_flag(p, "inspect", "the description")
    p.set_defaults(handler=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from gear_runtime.tools.check.inspect import inspect_document, text

    if args.json is not None:
        jsonout.check_target(args.json)
    from gear_runtime.backends import DEFAULT_BACKEND, facts

    backend = args.backend or DEFAULT_BACKEND
    if facts(backend).reads_gear_file and device_options(backend, args) == {}:
        existing_file(args.file, "gear file")
        doc = inspect_document(args.file)
    else:
        doc = _backend_document(args)
    if args.json != jsonout.STDOUT:
        print(text(doc))
    if args.json is not None and jsonout.write(args.json, doc) is not None:
        info(f"wrote {args.json}")
    return EXIT_OK


def _backend_document(args: argparse.Namespace) -> dict:
    """The document of the model ``--backend`` opens from FILE (an .om, a MindIR, or a gear
    file on another backend)."""
    import gear_runtime as gr
    from gear_runtime.tools.check.inspect import model_document

    existing_file(args.file, "model file")
    with gr.load(args.file, backend=args.backend, **device_options(args.backend, args)) as m:
        return model_document(args.file, m)
