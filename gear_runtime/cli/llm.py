"""``gear-runtime llm``: the LLM engine's commands.

    gear-runtime llm build HF_FOLDER -o MODEL_DIR [--max-sequences N] [--prompt-gears 16,32]
        [--batch-gears 1,2,4,8] [--max-length L] [--trace FILE]

``build`` turns a Hugging Face checkpoint into a folder ``Engine.from_folder`` serves
(:func:`gear_runtime.llm.build.build_folder`).
"""

from __future__ import annotations

import argparse

from gear_runtime.cli import verbosity
from gear_runtime.cli.common import EXIT_OK, UsageError, existing_file, int_at_least, int_list
from gear_runtime.errors import InputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``llm`` command and its subcommands."""
    p = sub.add_parser("llm", help="the LLM engine: build a model folder from a Hugging Face "
                       "checkpoint", description="Commands of the LLM engine "
                       "(gear_runtime.llm, docs/llm.md).")
    commands = p.add_subparsers(dest="llm_command", metavar="SUBCOMMAND", required=True,
                                help="build: a Hugging Face checkpoint to a model folder")
    add_build_parser(commands)


def add_build_parser(commands: argparse._SubParsersAction) -> None:
    """``llm build``'s flags."""
    p = commands.add_parser(
        "build", help="a Hugging Face checkpoint to a folder the engine serves",
        description="Run onnxruntime-genai's model builder (fp32, CPU) on HF_FOLDER into "
        "MODEL_DIR, then compile the engine's gears into MODEL_DIR, so that "
        "Engine.from_folder(MODEL_DIR) compiles nothing. Needs torch and the llm-build extra "
        "(docs/llm.md). A MODEL_DIR that already holds genai_config.json has its gears "
        "compiled again, without the builder.")
    p.add_argument("hf_folder", metavar="HF_FOLDER",
                   help="the checkpoint (config.json, weights, tokenizer files), or a builder "
                   "folder (genai_config.json); never written")
    p.add_argument("-o", "--output", required=True, metavar="MODEL_DIR",
                   help="the folder to write: new, empty, or a builder folder")
    p.add_argument("--max-sequences", type=int_at_least(1), default=8, metavar="N",
                   help="sequences decoding at once (default 8)")
    p.add_argument("--prompt-gears", metavar="G,G", help="prompt gears in tokens, ascending, "
                   "each below --max-length (default 16, 32, 48, 64, 96, ... 512)")
    p.add_argument("--batch-gears", metavar="B,B", help="decode batch gears, ascending from 1 "
                   "(default: the powers of two below N, and N)")
    p.add_argument("--max-length", type=int_at_least(2), metavar="L",
                   help="tokens per sequence, prompt and output (default: the model's context "
                   "length)")
    p.add_argument("--trace", metavar="FILE", help="prompt lengths in tokens, one per line, or "
                   "prompts, one per line: the gear planner picks the prompt gears for them "
                   "(instead of --prompt-gears)")
    p.set_defaults(handler=cmd_build)


def cmd_build(args: argparse.Namespace) -> int:
    from gear_runtime.llm.build import build_folder

    if args.trace is not None and args.prompt_gears is not None:
        raise UsageError("--trace picks the prompt gears: give it or --prompt-gears, not both")
    if args.trace is not None:
        existing_file(args.trace, "--trace", InputError)
    build_folder(args.hf_folder, args.output, max_sequences=args.max_sequences,
                 prompt_gears=_gears(args.prompt_gears, "--prompt-gears"),
                 batch_gears=_gears(args.batch_gears, "--batch-gears"),
                 max_length=args.max_length, trace=args.trace,
                 progress=verbosity.info)
    return EXIT_OK


def _gears(text: str | None, flag: str) -> list[int] | None:
    return None if text is None else int_list(text, flag)
