"""``gear-runtime compile``: a dynamic ONNX model and an ATC-style spec (flags or a config
file) to one gear file."""

from __future__ import annotations

import argparse

from gear_runtime.cli.common import EXIT_OK, UsageError, existing_file


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``compile`` command's flags."""
    p = sub.add_parser("compile", help="compile a dynamic ONNX model into one gear file",
                       description="Compile MODEL.onnx for the gears of an ATC-style spec "
                       "(--input-shape + one gear flag) or a config file (--config).")
    p.add_argument("model", metavar="MODEL.onnx", help="the model with dynamic input dims")
    p.add_argument("--input-shape", metavar="S",
                   help='ATC --input_shape, e.g. "data:-1,3,224,224" or "x:1,-1;m:-1,-1"')
    gears = p.add_mutually_exclusive_group()
    gears.add_argument("--dynamic-batch-size", metavar="V", help='e.g. "1,8,16"')
    gears.add_argument("--dynamic-image-size", metavar="V", help='e.g. "224,224;448,448"')
    gears.add_argument("--dynamic-dims", metavar="V", help='e.g. "20,1,1;40,2,2"')
    p.add_argument("--config", metavar="FILE",
                   help="ATC / MindSpore Lite config ([acl_build_options], [ascend_context], "
                   "[ge_graph_options]) instead of the flags")
    p.add_argument("--input-format", metavar="F", help="NCHW, NHWC or ND")
    p.add_argument("--hybrid", action="store_true",
                   help="also store the dynamic-shape graph: a miss runs it (GE hybrid mode)")
    p.add_argument("--sink", action="store_true",
                   help="GetNext-sink kind: the graph computes the dims from its inputs")
    p.add_argument("--external-data", choices=("auto", "yes", "no"), default="auto",
                   help="put the weights in one data file beside the gear file (OUT.data); "
                   "auto: from 16 MiB of weights, or when the model keeps its weights in "
                   "external data (needed past 2 GiB)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="gear file to write")
    p.set_defaults(handler=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    import gear_runtime as gr
    from gear_runtime.spec import spec_from_atc

    existing_file(args.model, "model")
    gear_flags = {"dynamic_batch_size": args.dynamic_batch_size,
                  "dynamic_image_size": args.dynamic_image_size,
                  "dynamic_dims": args.dynamic_dims}
    if args.config is not None:
        if args.input_shape is not None or any(v is not None for v in gear_flags.values()):
            raise UsageError("--config excludes --input-shape and the --dynamic-* flags")
        existing_file(args.config, "config file")
        spec = gr.GearSpec.from_config(args.config)
        if args.input_format is not None:
            # parsed again, not replaced: the format is checked (E10001) and picks the H/W
            # axes of dynamic image size, as it would in the config itself
            spec = spec_from_atc(**{**spec.to_atc(), "input_format": args.input_format},
                                 hybrid=spec.hybrid)
    elif args.input_shape is not None:
        if all(v is None for v in gear_flags.values()):
            raise UsageError("--input-shape needs one of --dynamic-batch-size, "
                             "--dynamic-image-size, --dynamic-dims")
        spec = gr.GearSpec.from_atc(args.input_shape, input_format=args.input_format,
                                    **{k: v for k, v in gear_flags.items() if v is not None})
    else:
        raise UsageError("give --input-shape with a --dynamic-* flag, or --config FILE")
    hybrid = bool(args.hybrid or spec.hybrid)
    from gear_runtime.compiler import compile_gears

    external = {"auto": None, "yes": True, "no": False}[args.external_data]
    report = compile_gears(args.model, spec, args.output, hybrid=hybrid, sink=args.sink,
                           external_data=external)
    kind = "sink" if args.sink else "case"
    print(f"wrote {report.path}: {spec.gear_count} gears ({spec.mode} mode, "
          f"{kind}{', hybrid' if hybrid else ''}): "
          + "; ".join(",".join(map(str, g)) for g in spec.gears)
          + (f"; weights in {report.data_path} ({report.data_bytes} bytes)"
             if report.data_path else ""))
    return EXIT_OK
