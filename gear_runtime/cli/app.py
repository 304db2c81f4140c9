"""The ``gear-runtime`` command: compile, inspect, run, bench, demo.

    gear-runtime compile MODEL.onnx --input-shape S --dynamic-dims V -o OUT   (or --config FILE)
    gear-runtime inspect FILE
    gear-runtime run FILE --input NAME=file.npy ... [--dynamic-dims D] [--output-dir DIR]
    gear-runtime bench FILE [--gears 0,2|all] [--iterations N] [--json OUT] [--plot OUT.png]
    gear-runtime demo [--workdir DIR] [--iterations N] [--quick]

Exit codes: 0 success; 2 usage errors and bad input (missing file, wrong gear, bad --input,
a spec GE would reject); 1 failed checks (demo) and failures while running (backend errors).
Every error is ONE line on stderr, ``gear-runtime: error: [code] message``; never a traceback
for a user error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from gear_runtime.errors import (
    BackendError,
    GearFileError,
    GearRuntimeError,
    InputError,
)

PROG = "gear-runtime"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting (one-line errors)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line and raises instead of calling sys.exit."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} -h')")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: the text as an int >= ``minimum``, else a one-line usage error."""
    return _number_at_least(int, minimum, "an integer", f">= {minimum}")


def _float_at_least(minimum: float) -> Callable[[str], float]:
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


def _int_list(text: str, what: str) -> list[int]:
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InputError(f"{what} {text!r} must be integers separated by ','") from None
    if not values:
        raise InputError(f"{what} is empty; give integers separated by ','")
    return values


def build_parser() -> argparse.ArgumentParser:
    from gear_runtime.backends import BACKENDS
    from gear_runtime.version import __version__

    backends = f"one of {', '.join(sorted(BACKENDS))} (default onnxruntime)"

    parser = _Parser(prog=PROG, description="Run models compiled with dynamic gears (CANN GE "
                     "dynamic batch / image size / dims) on ONNX Runtime or Ascend.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

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

    p = sub.add_parser("inspect", help="describe a gear file")
    p.add_argument("file", metavar="FILE", help="a gear file written by compile")

    p = sub.add_parser("run", help="execute a gear file once on .npy inputs",
                       description="Execute once; every output is saved in --output-dir as "
                       "<output name>.npy (odd characters as '_', a suffix _2, _3... where "
                       "two names would share a file). Without a --dynamic-* flag the gear "
                       "comes from the inputs' shapes.")
    p.add_argument("file", metavar="FILE", help="a gear file written by compile")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input (repeat for every input)")
    dims = p.add_mutually_exclusive_group()
    dims.add_argument("--dynamic-dims", metavar="D",
                      help="full dims of all inputs flattened, or the gear's dynamic values")
    dims.add_argument("--dynamic-batch-size", metavar="N", type=int,
                      help="the batch gear (dynamic batch models)")
    dims.add_argument("--dynamic-image-size", metavar="H,W",
                      help="the image-size gear (dynamic image size models)")
    p.add_argument("--output-dir", default=".", metavar="DIR",
                   help="where the outputs go (created if needed; default: here)")
    p.add_argument("--backend", default="onnxruntime", metavar="B", help=backends)

    p = sub.add_parser("bench", help="per-gear latency, throughput, overhead and memory",
                       description="Benchmark every gear: execute vs the backend's bare run, "
                       "the naive per-input session.run and the original dynamic model. With "
                       "--compare: compare two --json results of the same model instead "
                       "(exit 1 with --fail-on-regression PCT when a gear got slower).")
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="a gear file written by compile (not with --compare)")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE.json", "AFTER.json"),
                   help="compare two bench --json results, gear by gear (ratio of execute "
                   "medians with a bootstrap 95%% CI); --plot draws the comparison")
    p.add_argument("--fail-on-regression", type=_float_at_least(0), metavar="PCT",
                   help="with --compare: exit 1 when a gear is slower beyond noise and its "
                   "median grew by more than PCT percent")
    p.add_argument("--noise", type=_float_at_least(0), default=5.0, metavar="PCT",
                   help="with --compare: the run-to-run noise band in percent; a gear is "
                   "faster / slower only when its whole CI is beyond it (default 5)")
    p.add_argument("--no-copy", action="store_true",
                   help="time execute(copy=False): outputs as views, no output copy "
                   "(default: copy=True, what execute returns by default)")
    p.add_argument("--gears", default="all", metavar="0,2|all",
                   help="gear indices to benchmark (default all)")
    p.add_argument("--iterations", type=_int_at_least(1), default=100, metavar="N",
                   help="timed runs per gear (default 100)")
    p.add_argument("--warmup", type=_int_at_least(0), default=10, metavar="N",
                   help="untimed runs per gear first (default 10)")
    p.add_argument("--threads", type=_int_at_least(1), default=None, metavar="N",
                   help="ORT intra-op threads of every session (default: ORT's)")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a latency plot (needs matplotlib)")
    p.add_argument("--reference", metavar="ORIGINAL.onnx",
                   help="the original dynamic model, for the dynamic-model comparison")
    p.add_argument("--backend", default="onnxruntime", metavar="B", help=backends)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("demo", help="build, compile, run, check and benchmark the example")
    p.add_argument("--workdir", metavar="DIR", help="keep the files here (default: a temp dir)")
    p.add_argument("--iterations", type=_int_at_least(1), default=None, metavar="N",
                   help="benchmark iterations per gear (default 100; 20 with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer benchmark iterations")
    p.add_argument("--threads", type=_int_at_least(1), default=1, metavar="N",
                   help="ORT intra-op threads of the benchmark's sessions (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p = sub.add_parser("serve", help="serve gear files over HTTP (KServe v2, tritonclient)",
                       description="Serve gear files over the Open Inference Protocol (KServe "
                       "v2 REST, with Triton's binary tensor extension): one pool of executors "
                       "per model, gear-aware dynamic batching for batch-mode models, "
                       "Prometheus metrics at /metrics. Needs the serve extra: "
                       'pip install "gear_runtime[serve]" (and [ray] for --ray).')
    p.add_argument("files", nargs="+", metavar="FILE", help="gear files written by compile")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1)")
    p.add_argument("--port", type=_int_at_least(0), default=8000,
                   help="port (default 8000; 0: a free port, printed at start)")
    p.add_argument("--name", action="append", default=[], metavar="NAME",
                   help="model name (one per FILE, in order; default: the file name without "
                   ".gear.onnx / .onnx)")
    p.add_argument("--executors", type=_int_at_least(1), default=None, metavar="N",
                   help="executors (worker threads) per model (default: one per core, "
                   "at most 4)")
    p.add_argument("--max-batch-delay-ms", type=_float_at_least(0), default=2.0, metavar="MS",
                   help="batch-mode models: how long a request waits for others to share its "
                   "batch (default 2)")
    p.add_argument("--no-batching", action="store_true",
                   help="run every request on its own (no dynamic batching)")
    p.add_argument("--max-queue", type=_int_at_least(1), default=256, metavar="N",
                   help="requests waiting per model beyond which it answers 503 (default 256)")
    p.add_argument("--max-body-mb", type=_float_at_least(0), default=64.0, metavar="MB",
                   help="largest request body accepted, in MiB (default 64; more: 413)")
    p.add_argument("--pad", action="store_true",
                   help="dims mode: serve requests of any shape padded to the covering gear")
    p.add_argument("--backend", default="onnxruntime", metavar="B", help=backends)
    p.add_argument("--ray", action="store_true",
                   help="serve on Ray Serve (a local Ray instance) instead of one process")
    p.add_argument("--replicas", type=_int_at_least(1), default=1, metavar="N",
                   help="with --ray: replicas, each with the models and their executors")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="server log level (default warning)")
    _add_padding_commands(sub)
    return parser


def _add_padding_commands(sub: argparse._SubParsersAction) -> None:
    """check-padding and plan."""
    p = sub.add_parser("check-padding", help="is execute(pad=True) exact for this model?",
                       description="Run the source model at exact request sizes and the gear "
                       "file padded, compare the trimmed outputs; exit 1 when they differ.")
    p.add_argument("file", metavar="GEAR", help="the gear file")
    p.add_argument("source", metavar="SOURCE.onnx", help="the model it was compiled from")
    p.add_argument("--samples", metavar="V", help='request sizes, e.g. "5;17;100" or '
                   '"5,5,5,16;17,17,17,16" (default: inside and between the gears)')
    p.add_argument("--pad-value", action="append", default=[], metavar="NAME=V",
                   help="pad value of an input (default 0), repeatable")
    p.add_argument("--rtol", type=_float_at_least(0.0), default=1e-4, metavar="R")
    p.add_argument("--atol", type=_float_at_least(0.0), default=1e-5, metavar="A")
    p = sub.add_parser("plan", help="choose the gears from a trace of requests",
                       description="Plan at most K gears minimising the expected cost of the "
                       "trace's requests, each padded to its cheapest covering gear.")
    p.add_argument("model", metavar="MODEL.onnx", help="the dynamic model")
    p.add_argument("--input-shape", required=True, metavar="S",
                   help='ATC --input_shape, e.g. "x:1,-1"')
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="requests: CSV (values per line) or JSON lines")
    p.add_argument("--max-gears", type=_int_at_least(1), required=True, metavar="K")
    p.add_argument("--cost", choices=("elements", "measured"), default="elements")
    p.add_argument("--current", metavar="V", help='the gears in use, e.g. "32;512;1024;2048"')
    p.add_argument("--max-gear", type=_int_at_least(1), metavar="N",
                   help="cap on the largest gear; larger requests stay uncovered")
    p.add_argument("--ladder", type=_int_at_least(2), default=8, metavar="N",
                   help="--cost measured: gears compiled and benchmarked (default 8)")
    p.add_argument("--iterations", type=_int_at_least(1), default=20, metavar="N")
    p.add_argument("--plot", metavar="OUT.png", help="histogram, gear boundaries, latency")


# ---- commands ---------------------------------------------------------------------------------
def _existing_file(path: str, what: str,
                   error: type[GearRuntimeError] = GearFileError) -> str:
    """``path`` when it is an existing file, else ``error`` naming ``what`` and the path."""
    if not os.path.exists(path):
        raise error(f"{what} {path!r} does not exist")
    if not os.path.isfile(path):
        raise error(f"{what} {path!r} is not a file")
    return path


def cmd_compile(args: argparse.Namespace) -> int:
    import gear_runtime as gr
    from gear_runtime.spec import spec_from_atc

    _existing_file(args.model, "model")
    gear_flags = {"dynamic_batch_size": args.dynamic_batch_size,
                  "dynamic_image_size": args.dynamic_image_size,
                  "dynamic_dims": args.dynamic_dims}
    if args.config is not None:
        if args.input_shape is not None or any(v is not None for v in gear_flags.values()):
            raise _UsageError("--config excludes --input-shape and the --dynamic-* flags")
        _existing_file(args.config, "config file")
        spec = gr.GearSpec.from_config(args.config)
        if args.input_format is not None:
            # parsed again, not replaced: the format is checked (E10001) and picks the H/W
            # axes of dynamic image size, as it would in the config itself
            spec = spec_from_atc(**{**spec.to_atc(), "input_format": args.input_format},
                                 hybrid=spec.hybrid)
    elif args.input_shape is not None:
        if all(v is None for v in gear_flags.values()):
            raise _UsageError("--input-shape needs one of --dynamic-batch-size, "
                              "--dynamic-image-size, --dynamic-dims")
        spec = gr.GearSpec.from_atc(args.input_shape, input_format=args.input_format,
                                    **{k: v for k, v in gear_flags.items() if v is not None})
    else:
        raise _UsageError("give --input-shape with a --dynamic-* flag, or --config FILE")
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


def cmd_inspect(args: argparse.Namespace) -> int:
    from gear_runtime.tools.inspect import describe

    print(describe(_existing_file(args.file, "gear file")))
    return EXIT_OK


def _parse_input_args(items: Sequence[str]) -> list[tuple[str, str]]:
    """``NAME=FILE.npy`` items -> (name, path), checked before the model is loaded."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input {item!r} must be NAME=FILE.npy (e.g. input_ids=ids.npy)")
        if any(name == n for n, _ in pairs):
            raise InputError(f"--input {name!r} is given twice")
        _existing_file(path, f"--input {name}:", InputError)
        pairs.append((name, path))
    return pairs


def _read_inputs(pairs: Sequence[tuple[str, str]], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Load the checked (name, path) pairs for a model with inputs ``names``; InputError on an
    unknown or missing name or a file that is not one .npy array."""
    unknown = [n for n, _ in pairs if n not in names]
    if unknown:
        raise InputError(f"--input: the model has no input {unknown[0]!r}; its inputs are "
                         f"{', '.join(names)}")
    missing = [n for n in names if all(n != m for m, _ in pairs)]
    if missing:
        raise InputError(f"missing --input for {', '.join(missing)}; the model's inputs are "
                         f"{', '.join(names)}")
    feeds: dict[str, np.ndarray] = {}
    for name, path in pairs:
        _check_npy_magic(name, path)
        try:
            value = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"--input {name}={path}: not a readable .npy file ({exc})") from None
        if not isinstance(value, np.ndarray):  # np.load gives an NpzFile for .npz archives
            raise InputError(f"--input {name}={path}: an .npz archive; give one .npy array "
                             "per input")
        feeds[name] = value
    return feeds


#: The first bytes of every .npy file (numpy.lib.format.MAGIC_PREFIX) and of an .npz (a zip).
_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


def _check_npy_magic(name: str, path: str) -> None:
    """InputError naming the input unless ``path`` starts like a .npy file (or an .npz,
    refused later with its own message). Checked first because np.load takes any other file
    for a pickle and answers with a message about pickled data."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise InputError(f"--input {name}={path}: cannot be read ({exc.strerror})") from None
    if head != _NPY_MAGIC and not head.startswith(_ZIP_MAGIC):
        raise InputError(f"--input {name}={path}: not a .npy file; a .npy array is expected "
                         "(write one with numpy.save)")


def _make_dir(flag: str, path: str) -> Path:
    """Create directory ``path`` (and its parents) if needed; InputError naming ``flag``."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {path!r} cannot be created: {exc}") from None
    return Path(path)


def _output_files(names: Sequence[str]) -> list[str]:
    """One distinct ``.npy`` file name per output: path separators and odd characters become
    '_'; a name that would collide with an earlier one (``y:0`` and ``y_0``) gets ``_2``,
    ``_3``... so that no output overwrites another."""
    used: set[str] = set()
    files = []
    for name in names:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "output"
        candidate, n = stem, 1
        while candidate.lower() in used:  # lower(): case-insensitive file systems too
            n += 1
            candidate = f"{stem}_{n}"
        used.add(candidate.lower())
        files.append(f"{candidate}.npy")
    return files


def cmd_run(args: argparse.Namespace) -> int:
    import gear_runtime as gr

    _existing_file(args.file, "gear file")
    pairs = _parse_input_args(args.input)  # syntax and files first: no load for a typo
    model = gr.load(args.file, backend=args.backend)
    feeds = _read_inputs(pairs, model.input_names)
    ex = model.create_executor()
    if args.dynamic_dims is not None:
        ex.set_dynamic_dims(_int_list(args.dynamic_dims, "--dynamic-dims"))
    elif args.dynamic_batch_size is not None:
        ex.set_dynamic_batch_size(args.dynamic_batch_size)
    elif args.dynamic_image_size is not None:
        hw = _int_list(args.dynamic_image_size, "--dynamic-image-size")
        if len(hw) != 2:
            raise InputError(f"--dynamic-image-size {args.dynamic_image_size!r} must be H,W")
        ex.set_dynamic_image_size(*hw)
    outputs = ex.execute(feeds)
    out_dir = _make_dir("--output-dir", args.output_dir)
    if ex.last_gear is not None:
        print(f"gear {ex.last_gear}: dims {','.join(map(str, model.gears[ex.last_gear]))}")
    else:
        print(f"no gear matched: dims {ex.last_dynamic_dims} ran on the dynamic-shape graph "
              "(hybrid)")
    files = _output_files(model.output_names)
    for name, value, file in zip(model.output_names, outputs, files, strict=True):
        path = out_dir / file
        np.save(path, value)
        print(f"  {name}: {value.dtype} {list(value.shape)} -> {path}")
    return EXIT_OK


def _check_output_file(flag: str, path: str) -> None:
    """InputError naming ``flag`` when ``path`` cannot be written as a file: its directory is
    missing, or it is a directory itself."""
    if Path(path).is_dir():
        raise InputError(f"{flag} {path!r} is a directory; give a file path")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InputError(f"{flag} {path!r}: directory {str(parent)!r} does not exist")


def cmd_bench(args: argparse.Namespace) -> int:
    from gear_runtime.tools.bench import engine as bench

    if args.compare is not None:
        return _bench_compare(args)
    if args.file is None:
        raise _UsageError("give a gear FILE to benchmark, or --compare BEFORE.json AFTER.json")
    if args.fail_on_regression is not None:
        raise _UsageError("--fail-on-regression needs --compare BEFORE.json AFTER.json")
    _existing_file(args.file, "gear file")
    if args.reference is not None:
        _existing_file(args.reference, "reference model")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            _check_output_file(flag, path)  # fail now, not after the benchmark
    if args.plot is not None:
        bench.check_plotting()
    report = bench.bench_model(args.file, gears=args.gears, iterations=args.iterations,
                               warmup=args.warmup, threads=args.threads,
                               reference=args.reference, backend=args.backend,
                               progress=not args.no_progress, copy=not args.no_copy)
    print(report.table())
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n",
                                       encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--json {args.json!r} cannot be written: {exc}") from None
        print(f"wrote {args.json}")
    if args.plot is not None:
        print(f"wrote {bench.plot_report(report, args.plot)}")
    return EXIT_OK


def _bench_compare(args: argparse.Namespace) -> int:
    """``bench --compare``: the table on stdout, warnings on stderr; exit 1 when
    ``--fail-on-regression`` finds a gear slower beyond noise and the threshold."""
    from gear_runtime.tools.bench import compare as bench_compare
    from gear_runtime.tools.bench import engine as bench

    if args.file is not None:
        raise _UsageError(f"--compare compares two results; drop the gear file {args.file!r}")
    if args.plot is not None:
        _check_output_file("--plot", args.plot)
        bench.check_plotting()
    before_path, after_path = args.compare
    before = bench_compare.load_result(before_path)
    after = bench_compare.load_result(after_path)
    cmp = bench_compare.compare_results(before, after, noise=args.noise / 100,
                                        names=(before_path, after_path))
    for line in cmp.warnings:
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    print(cmp.table())
    if args.plot is not None:
        print(f"wrote {bench_compare.plot_comparison(cmp, before, after, args.plot)}")
    if args.fail_on_regression is not None:
        slow = cmp.regressions(args.fail_on_regression)
        if slow:
            print(f"regression: {len(slow)} gear(s) slower by more than "
                  f"{args.fail_on_regression:g}%: " + "; ".join(
                      f"gear {d.gear} {d.change_pct:+.1f}%" for d in slow))
            return EXIT_FAILED
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from gear_runtime.tools.demo import run_demo

    if args.workdir is not None:
        _make_dir("--workdir", args.workdir)  # before the demo starts printing
    return run_demo(args.workdir, iterations=args.iterations, quick=args.quick,
                    progress=not args.no_progress, threads=args.threads)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT / SIGTERM (graceful: requests in flight finish first)."""
    if args.name and len(args.name) != len(args.files):
        raise _UsageError(f"{len(args.name)} --name for {len(args.files)} files: give one "
                          "per FILE, or none")
    for path in args.files:
        _existing_file(path, "gear file")
    try:  # the extra is optional: a missing one is one line, not a traceback
        from gear_runtime.cli.serve import serve_from_args
    except ImportError as exc:
        _error(str(exc))
        return EXIT_FAILED
    return serve_from_args(args)


def cmd_check_padding(args: argparse.Namespace) -> int:
    from gear_runtime.tools.padding import check_padding

    _existing_file(args.file, "gear file")
    _existing_file(args.source, "source model")
    pads = {}
    for item in args.pad_value:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _UsageError(f"--pad-value {item!r}: expected NAME=VALUE")
        try:
            pads[name] = int(value)
        except ValueError:
            try:
                pads[name] = float(value)
            except ValueError:
                raise _UsageError(f"--pad-value {item!r}: {value!r} is not a number") from None
    samples = None
    if args.samples:
        samples = [_int_list(s, "--samples") for s in args.samples.split(";")]
    report = check_padding(args.file, args.source, samples=samples, pad_values=pads,
                           rtol=args.rtol, atol=args.atol)
    print(report.table())
    return EXIT_OK if report.safe else EXIT_FAILED


def cmd_plan(args: argparse.Namespace) -> int:
    from gear_runtime.tools.plan.search import run_plan

    _existing_file(args.model, "model", InputError)
    _existing_file(args.trace, "trace", InputError)
    print(run_plan(args.model, args.input_shape, args.trace, args.max_gears, cost=args.cost,
                   current=args.current, max_gear=args.max_gear, ladder=args.ladder,
                   iterations=args.iterations, plot=args.plot))
    return EXIT_OK


COMMANDS = {"compile": cmd_compile, "inspect": cmd_inspect, "run": cmd_run,
            "bench": cmd_bench, "demo": cmd_demo, "serve": cmd_serve,
            "check-padding": cmd_check_padding, "plan": cmd_plan}


# ---- entry point ------------------------------------------------------------------------------
def _error(message: str, code: str = "") -> None:
    line = " ".join(message.split())  # one line, whatever the message holds
    prefix = f"[{code}] " if code and not line.startswith(f"[{code}]") else ""
    print(f"{PROG}: error: {prefix}{line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except _UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except SystemExit as exc:  # --help / --version print and exit 0
        return int(exc.code or 0)
    try:
        return COMMANDS[args.command](args)
    except _UsageError as exc:
        _error(f"{args.command}: {exc}")
        return EXIT_USAGE
    except BackendError as exc:  # the input was fine; running it failed
        _error(exc.message, exc.code)
        return EXIT_FAILED
    except GearRuntimeError as exc:  # spec, file, input, gear errors: bad input
        _error(exc.message, exc.code)
        return EXIT_USAGE
    except OSError as exc:  # a path the user gave cannot be read or written
        _error(f"{exc.strerror or exc}" + (f": {exc.filename!r}" if exc.filename else ""))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
