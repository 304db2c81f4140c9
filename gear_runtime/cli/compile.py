"""``gear-runtime compile``: a dynamic ONNX model and an ATC-style spec (flags or a config
file) to one gear file."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from gear_runtime.cli.common import EXIT_OK, UsageError, existing_file, make_dir, model_file
from gear_runtime.cli.verbosity import info
from gear_runtime.errors import InputError

#: atc's --framework values (0 Caffe, 1 MindSpore, 3 TensorFlow, 5 ONNX): only ONNX compiles here.
ATC_FRAMEWORK_ONNX = "5"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``compile`` command's flags, each also under atc's spelling (``--input_shape``...):
    an atc command line pasted after ``gear-runtime compile`` compiles (``--model=M.onnx
    --framework=5 --output=NAME --soc_version=...``; NAME gets ``.gear.onnx`` as atc's gets
    ``.om``)."""
    p = sub.add_parser("compile", help="compile a dynamic ONNX model into one gear file",
                       description="Compile MODEL.onnx for the gears of an ATC-style spec "
                       "(--input-shape + one gear flag) or a config file (--config). atc's "
                       "spellings work too (--input_shape, --dynamic_batch_size, "
                       "--dynamic_image_size, --dynamic_dims, --input_format, "
                       "--precision_mode, --model, "
                       "--output, --framework=5; --soc_version and --log are accepted and "
                       "do not change the gear file; --output_type, --insert_op_conf and "
                       "--input_fp16_nodes are accepted with a line saying what is done "
                       "instead; --out_nodes selects the outputs), so a pasted atc line "
                       "compiles.")
    p.add_argument("model", metavar="MODEL.onnx", nargs="?",
                   help="the model with dynamic input dims (or --model)")
    p.add_argument("--model", dest="model_flag", metavar="MODEL.onnx",
                   help="atc's spelling of MODEL.onnx")
    p.add_argument("--input-shape", "--input_shape", metavar="S",
                   help='ATC --input_shape, e.g. "data:-1,3,224,224" or "x:1,-1;m:-1,-1"')
    gears = p.add_mutually_exclusive_group()
    gears.add_argument("--dynamic-batch-size", "--dynamic_batch_size", metavar="V",
                       help='batch gears, e.g. "1,8,16"')
    gears.add_argument("--dynamic-image-size", "--dynamic_image_size", metavar="V",
                       help='image-size gears (H,W per gear), e.g. "224,224;448,448"')
    gears.add_argument("--dynamic-dims", "--dynamic_dims", metavar="V",
                       help='dims gears (the -1 values of --input-shape per gear), e.g. '
                       '"20,1,1;40,2,2"')
    p.add_argument("--config", metavar="FILE",
                   help="ATC / MindSpore Lite config ([acl_build_options], [ascend_context], "
                   "[ge_graph_options]) instead of the flags")
    p.add_argument("--input-format", "--input_format", metavar="F", help="NCHW, NHWC or ND")
    p.add_argument("--precision-mode", "--precision_mode", metavar="MODE",
                   help="GE's precision_mode (force_fp32, force_fp16, allow_fp32_to_fp16, "
                   "allow_mix_precision, must_keep_origin_dtype, ...): recorded in the gear "
                   "file; each backend applies it or says what it runs instead "
                   "(docs/precision.md)")
    p.add_argument("--hybrid", action="store_true",
                   help="also store the dynamic-shape graph: a miss runs it (GE hybrid mode)")
    p.add_argument("--sink", action="store_true",
                   help="GetNext-sink kind: the graph computes the dims from its inputs")
    p.add_argument("--external-data", choices=("auto", "yes", "no"), default="auto",
                   help="put the weights in one data file beside the gear file (OUT.data); "
                   "auto: from 16 MiB of weights, or when the model keeps its weights in "
                   "external data (needed past 2 GiB)")
    p.add_argument("--verify", choices=("auto", "yes", "no"), default="auto",
                   help="run every gear once on ONNX Runtime (zero inputs) before writing and "
                   "refuse a gear that fails, as atc does; auto: while the runs take under "
                   "60 s, for sources of at most 2 GiB of weights")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="gear file to write (its folder is created if needed); a name "
                   "without .onnx gets .gear.onnx, as atc's --output gets .om")
    p.add_argument("--framework", metavar="N",
                   help=f"atc's source framework: only {ATC_FRAMEWORK_ONNX} (ONNX) compiles here")
    p.add_argument("--soc_version", "--soc-version", metavar="SOC",
                   help="atc's target chip: accepted, no effect (a gear file runs on every "
                   "backend; the chip matters when atc compiles the .om)")
    p.add_argument("--log", metavar="LEVEL", help="atc's log level: accepted, no effect")
    p.add_argument("--output_type", "--output-type", metavar="T",
                   help="atc's output dtype (FP32, FP16, UINT8): accepted; the gear file's "
                   "outputs keep the model's dtypes (a line says so)")
    p.add_argument("--insert_op_conf", "--insert-op-conf", metavar="FILE",
                   help="atc's AIPP config: accepted, not applied (a line says so; inputs are "
                   "preprocessed on the host)")
    p.add_argument("--input_fp16_nodes", "--input-fp16-nodes", metavar="NODES",
                   help="atc's float16 inputs: accepted; the inputs keep the model's dtypes "
                   "(a line says so)")
    p.add_argument("--out_nodes", "--out-nodes", metavar="NODES",
                   help="atc's output selection: the gear file's outputs, in this order: node "
                   'outputs "node_name:0;node_name:1" (intermediate ones too) or graph output '
                   'names "out1;out2"')
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none when stderr is not a terminal)")
    p.set_defaults(handler=cmd_compile)


def _model_path(args: argparse.Namespace) -> str:
    """MODEL.onnx from the positional or atc's --model (one of them), and --framework=5."""
    model = model_file(args.model, args.model_flag, "give the model to compile: MODEL.onnx "
                       "(or atc's --model=MODEL.onnx)")
    if args.framework is not None and args.framework.strip() != ATC_FRAMEWORK_ONNX:
        raise UsageError(f"--framework {args.framework}: gear-runtime compiles ONNX models "
                         f"(atc's --framework={ATC_FRAMEWORK_ONNX}); export the model to ONNX "
                         "first")
    return model


def _output_path(output: str) -> str:
    """The gear file to write: ``output``, with ``.gear.onnx`` added to a name without
    ``.onnx`` (atc adds ``.om`` to its --output); its folder is created like run's
    --output-dir. InputError naming -o when it is a directory or cannot be created."""
    if Path(output).is_dir():
        raise InputError(f"-o {output!r} is a directory; give the gear file's name, e.g. "
                         f"{os.path.join(output, 'model.gear.onnx')!r}")
    if not output.lower().endswith(".onnx"):
        output += ".gear.onnx"
    make_dir("-o", os.path.dirname(output) or ".")
    return output


def _atc_only_flags(args: argparse.Namespace) -> None:
    """atc flags that change nothing in a gear file: one line each on stderr saying what is
    done instead (--out_nodes changes the outputs: the compiler applies it)."""
    notes = {
        "output_type": "the gear file's outputs keep the model's dtypes (the acl backend runs "
                       "the .om atc built with it)",
        "insert_op_conf": "AIPP is not applied: preprocess on the host (an .om built with it "
                          "is refused by the acl backend)",
        "input_fp16_nodes": "the inputs keep the model's dtypes",
    }
    for flag, note in notes.items():
        value = getattr(args, flag)
        if value is not None:
            print(f"gear-runtime compile: --{flag}={value} accepted, not applied: {note}",
                  file=sys.stderr)


def cmd_compile(args: argparse.Namespace) -> int:
    import gear_runtime as gr
    from gear_runtime.spec import spec_from_atc

    model = existing_file(_model_path(args), "model")
    _atc_only_flags(args)
    gear_flags = {"dynamic_batch_size": args.dynamic_batch_size,
                  "dynamic_image_size": args.dynamic_image_size,
                  "dynamic_dims": args.dynamic_dims}
    if args.config is not None:
        if args.input_shape is not None or any(v is not None for v in gear_flags.values()):
            raise UsageError("--config excludes --input-shape and the --dynamic-* flags")
        existing_file(args.config, "config file")
        spec = gr.GearSpec.from_config(args.config)
        precision = args.precision_mode
        if precision is not None and spec.precision_mode not in (None, precision.strip()):
            raise UsageError(f"--precision_mode {precision!r} and the config's precision_mode "
                             f"{spec.precision_mode!r} disagree; give one")
        if args.input_format is not None or precision is not None:
            # parsed again, not replaced: the format is checked (E10001) and picks the H/W
            # axes of dynamic image size, as it would in the config itself
            flags = {**spec.to_atc(), **({} if args.input_format is None else
                                         {"input_format": args.input_format}),
                     **({} if precision is None else {"precision_mode": precision})}
            spec = spec_from_atc(**flags, hybrid=spec.hybrid)
    elif args.input_shape is not None:
        if all(v is None for v in gear_flags.values()):
            raise UsageError("--input-shape needs one of --dynamic-batch-size, "
                             "--dynamic-image-size, --dynamic-dims")
        spec = gr.GearSpec.from_atc(args.input_shape, input_format=args.input_format,
                                    precision_mode=args.precision_mode,
                                    **{k: v for k, v in gear_flags.items() if v is not None})
    else:
        raise UsageError("give --input-shape with a --dynamic-* flag, or --config FILE")
    hybrid = bool(args.hybrid or spec.hybrid)
    from gear_runtime.compiler import compile_gears

    external = {"auto": None, "yes": True, "no": False}[args.external_data]
    verify = {"auto": None, "yes": True, "no": False}[args.verify]
    with warnings.catch_warnings():  # the report's lines say it, once, below
        warnings.simplefilter("ignore", UserWarning)
        report = compile_gears(model, spec, _output_path(args.output), hybrid=hybrid,
                               sink=args.sink, external_data=external,
                               progress=not args.no_progress, verify=verify,
                               out_nodes=args.out_nodes)
    kind = "sink" if args.sink else "case"
    info(f"wrote {report.path}: {spec.gear_count} gears ({spec.mode} mode, "
         f"{kind}{', hybrid' if hybrid else ''}): "
         + "; ".join(",".join(map(str, g)) for g in spec.gears)
         + (f"; precision_mode {spec.precision_mode}" if spec.precision_mode else "")
         + (f"; weights in {report.data_path} ({report.data_bytes} bytes)"
            if report.data_path else ""))
    if report.unverified:
        print(f"not run at compile time: gear(s) {report.unverified}"
              + (" (--verify no)" if verify is False else
                 " (past the budget: --verify yes runs them all)"))
    for line in report.unchecked_ties:
        print(f"unchecked: {line}")
    return EXIT_OK
