"""``gear-runtime bench``: benchmark a gear file gear by gear, or compare two results
(``--compare``)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from gear_runtime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    UsageError,
    add_backend_flags,
    add_json_flag,
    add_memory_flag,
    add_state_flags,
    backend_options,
    check_output_file,
    check_run_memory,
    check_state_names,
    device_options,
    existing_file,
    float_at_least,
    int_at_least,
    model_file,
    opens_own_files,
    request_shapes,
    state_pairs,
    synthetic_nbytes,
)
from gear_runtime.cli.run import add_gear_flags, gear_flag
from gear_runtime.cli.verbosity import info
from gear_runtime.tools.bench.context import model_context
from gear_runtime.tools.bench.report import MAX_ITERATIONS
from gear_runtime.tools.common import jsonout
from gear_runtime.tools.common.inputs import FILLS, check_request_shapes


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` command's flags."""
    p = sub.add_parser("bench", help="per-gear latency, throughput, overhead and memory",
                       description="Benchmark every gear: execute vs the backend's bare run, "
                       "the naive per-input session.run and the original dynamic model; the "
                       "table is followed by ais_bench's Performance Summary lines of each "
                       "gear (NPU_compute_time and throughput, of execute). With "
                       "--compare: compare two --json results of the same model instead "
                       "(exit 1 with --fail-on-regression PCT when a gear got slower).")
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="a gear file written by compile (not with --compare)")
    p.add_argument("--model", dest="model_flag", metavar="FILE",
                   help="ais_bench's spelling of FILE")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE.json", "AFTER.json"),
                   help="compare two bench --json results, gear by gear (ratio of execute "
                   "medians with a bootstrap 95%% CI); --plot draws the comparison")
    p.add_argument("--fail-on-regression", type=float_at_least(0), metavar="PCT",
                   help="with --compare: exit 1 when a gear is slower beyond noise and its "
                   "median grew by more than PCT percent")
    p.add_argument("--noise", type=float_at_least(0), default=5.0, metavar="PCT",
                   help="with --compare: the run-to-run noise band in percent; a gear is "
                   "faster / slower only when its whole CI is beyond it (default 5)")
    p.add_argument("--no-copy", action="store_true",
                   help="time execute(copy=False): outputs as views, no output copy "
                   "(default: copy=True, what execute returns by default)")
    p.add_argument("--gears", default="all", metavar="0,2|all",
                   help="gear indices to benchmark (default all)")
    p.add_argument("--shapes", metavar="NAME:DxD,...",
                   help="instead of every gear, time the request of these shapes (trtexec's "
                   "--shapes; synthetic inputs) on the gear it selects (with --pad: the "
                   "covering gear it is padded to)")
    p.add_argument("--dymShape", "--dym-shape", dest="dym_shape", metavar="NAME:D,D;...",
                   help="ais_bench's --dymShape: the request's shapes, e.g. "
                   '"input_ids:1,100;attention_mask:1,100" (as --shapes)')
    add_gear_flags(p)
    p.add_argument("--pad", action="store_true",
                   help="time execute(pad=True) (with --shapes: a request between gears)")
    p.add_argument("--fill", choices=FILLS, default="random",
                   help="the synthetic inputs: random (floats standard normal, integers 1, "
                   "bools True), zeros or ones (default random)")
    p.add_argument("--iterations", "--loop", type=int_at_least(1, MAX_ITERATIONS), default=100,
                   metavar="N", help=f"timed runs per gear (ais_bench's --loop; default 100, at "
                   f"most {MAX_ITERATIONS})")
    p.add_argument("--warmup", "--warmup_count", "--warmup-count", type=int_at_least(0),
                   default=10, metavar="N",
                   help="untimed runs per gear first (ais_bench's --warmup_count; default 10)")
    p.add_argument("--batchsize", type=int_at_least(1), metavar="N",
                   help="ais_bench's --batchsize: the items per run that the throughput of "
                   "ais_bench's summary lines counts (1000 * N / mean ms); the gears run as "
                   "they are (default: per gear, the first dim of its first input)")
    add_json_flag(p, "bench", "the results with their context and every iteration's times "
                  "(what --compare reads)")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write a latency plot as PNG (needs matplotlib)")
    p.add_argument("--reference", metavar="ORIGINAL.onnx",
                   help="the original dynamic model, for the dynamic-model comparison")
    add_state_flags(p, "execute is timed with the state resident, one step as a service runs "
                    "it (each run reads what the one before wrote), naive with the state fed "
                    "and returned every run")
    add_memory_flag(p)
    add_backend_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from gear_runtime.tools.bench.engine import bench_model
    from gear_runtime.tools.bench.plot import check_plotting, check_png_name, plot_report

    if args.compare is not None:
        return _bench_compare(args)
    args.file = model_file(args.file, args.model_flag, "give a gear FILE to benchmark, or "
                           "--compare BEFORE.json AFTER.json")
    if args.fail_on_regression is not None:
        raise UsageError("--fail-on-regression needs --compare BEFORE.json AFTER.json")
    state = state_pairs(args.state, args.in_place_state)
    existing_file(args.file, "model file" if opens_own_files(args.backend) else "gear file")
    if args.reference is not None:
        existing_file(args.reference, "reference model")
    if args.json is not None:  # fail now, not after the benchmark
        jsonout.check_target(args.json)
    if args.plot is not None:
        check_output_file("--plot", args.plot)
        check_png_name(args.plot, "--plot")
        check_plotting()
    request = request_shapes(args)
    if request is not None and args.gears.strip().lower() != "all":
        raise UsageError("--shapes selects its own gear; drop --gears")
    picked = any(getattr(args, f) is not None for f in
                 ("dynamic_dims", "dynamic_batch_size", "dynamic_image_size"))
    if picked and (request is not None or args.gears.strip().lower() != "all"):
        raise UsageError("--dymBatch / --dymHW / --dymDims name the one gear to time; drop "
                         "--gears and --shapes / --dymShape")
    select = gear_flag(args) if picked else None
    backend, options = backend_options(args)
    with _loaded(args, backend, options) as model:
        if state is not None:
            check_state_names(state, model.input_names, model.output_names)
        _check_memory(model, args, request, state or {})
        report = bench_model(model, gears=args.gears, iterations=args.iterations,
                             warmup=args.warmup, threads=args.threads,
                             reference=args.reference, backend=backend,
                             progress=not args.no_progress, copy=not args.no_copy,
                             request=request, pad=args.pad, fill=args.fill,
                             batchsize=args.batchsize, select=select,
                             max_bytes=args.max_memory, state=state,
                             in_place_state=args.in_place_state)
        # the file, as bench_model reports a model it loads itself (files, digest)
        report.context["model"] = model_context(args.file, model)
    report.model = args.file
    quiet = args.json == jsonout.STDOUT  # stdout is the JSON alone
    if not quiet:
        print(report.table())
        print()
        print(report.ais_bench_summary())
    if args.json is not None and jsonout.write(args.json, report.to_dict()) is not None:
        info(f"wrote {args.json}")
    if args.plot is not None:
        written = plot_report(report, args.plot)
        if not quiet:
            info(f"wrote {written}")
    return EXIT_OK


@contextlib.contextmanager
def _loaded(args: argparse.Namespace, backend: str, options: Mapping[str, Any]) -> Iterator[Any]:
    """The model, loaded as ``bench_model`` loads a path (device options, --threads,
    --providers), so that its memory is checked before the executor and inputs exist."""
    import gear_runtime as gr
    from gear_runtime.tools.bench.engine import THREADS_OPTION

    load = dict(device_options(backend, args))
    if args.threads is not None and backend in THREADS_OPTION:
        load[THREADS_OPTION[backend]] = args.threads
    if options.get("providers") is not None:
        load["providers"] = list(options["providers"])
    with gr.load(args.file, backend=backend, **load) as model:
        yield model


def _check_memory(model: Any, args: argparse.Namespace,
                  request: Mapping[str, tuple[int, ...]] | None,
                  state: Mapping[str, str]) -> None:
    """The executor's buffers and the largest gear's synthetic inputs (one gear's inputs are
    alive at a time; a ``state`` input's too, fed to the naive run) against the budget,
    before either is allocated: MemoryBudgetError (the state's own buffers are the
    executor's to check when it is created)."""
    from gear_runtime.runtime.model import memory_budget
    from gear_runtime.tools.bench.engine import parse_gears

    budget = memory_budget(args.max_memory)
    check_run_memory(model, budget)
    dtypes = model.info.input_dtype_map
    if request is not None:
        if set(request) != set(dtypes) - set(state):
            return  # bench_model refuses it, naming the inputs, before making any
        check_request_shapes(model, request, "request shapes")  # bench_model's words first
        # the state inputs at their largest gear's shapes (the request's gear is not known yet)
        shapes = [{**request, **{n: max((model.spec.shapes(g)[n]
                                         for g in range(model.gear_count)), key=_size)
                                 for n in state}}]
    elif args.gears.strip().lower() == "all":
        shapes = [model.spec.shapes(g) for g in range(model.gear_count)]
    else:
        shapes = [model.spec.shapes(g) for g in parse_gears(args.gears, model.gear_count)]
    largest = max(shapes, key=lambda s: synthetic_nbytes(dtypes, s, args.fill))
    shown = ", ".join(f"{n}{list(largest[n])}" for n in dtypes)
    check_run_memory(model, budget, f" and the synthetic inputs {shown}",
                     synthetic_nbytes(dtypes, largest, args.fill))


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _bench_compare(args: argparse.Namespace) -> int:
    """``bench --compare``: the table on stdout, warnings on stderr; exit 1 when
    ``--fail-on-regression`` finds a gear slower beyond noise and the threshold."""
    from gear_runtime.tools.bench import compare as bench_compare
    from gear_runtime.tools.bench.plot import check_plotting, check_png_name
    from gear_runtime.tools.bench.result import load_result

    if args.file is not None:
        raise UsageError(f"--compare compares two results; drop the gear file {args.file!r}")
    if args.batchsize is not None:
        raise UsageError("--batchsize counts the items of a benchmark run; --compare compares "
                         "two results: drop it")
    if args.plot is not None:
        check_output_file("--plot", args.plot)
        check_png_name(args.plot, "--plot")
        check_plotting()
    before_path, after_path = args.compare
    before, after = load_result(before_path), load_result(after_path)
    cmp = bench_compare.compare_results(before, after, noise=args.noise / 100,
                                        names=(before_path, after_path))
    for line in cmp.warnings:
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    print(cmp.table())
    if args.plot is not None:
        info(f"wrote {bench_compare.plot_comparison(cmp, before, after, args.plot)}")
    if args.fail_on_regression is not None:
        slow = cmp.regressions(args.fail_on_regression)
        if slow:
            print(f"regression: {len(slow)} gear(s) slower by more than "
                  f"{args.fail_on_regression:g}%: " + "; ".join(
                      f"gear {d.gear} {d.change_pct:+.1f}%" for d in slow))
            return EXIT_FAILED
    return EXIT_OK
