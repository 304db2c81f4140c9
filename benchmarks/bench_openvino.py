"""gear_runtime on OpenVINO vs OpenVINO's own dynamic-shape model vs ONNX Runtime, per gear.

    python benchmarks/bench_openvino.py [--quick] [--threads 1,2] [--seconds S] [--workdir DIR]
    python benchmarks/bench_openvino.py --model bert.onnx [--vocab 30522] ...

The model: the BERT-like encoder of ``gear_runtime.examples.encoder`` at BERT-base's sizes
(12 layers, hidden 768, 418 MiB of float32 weights, built here with onnx.helper and saved with
its weights in a data file; ``--quick``: 4 layers of hidden 512, 66 MiB), or with ``--model``
an ONNX file whose inputs are all int64 ``[batch, sequence]`` token tensors, e.g. the Hugging
Face BERT-base that ``benchmarks/export_hf_bert.py`` exports with torch.onnx (418 MiB;
``input_ids``, ``attention_mask``, ``token_type_ids``): ids are random in [0, ``--vocab``),
the mask ones, any other input zeros. Either is compiled with the sequence gears
32 / 64 / 128 / 256 (batch 1, dims mode, as a text service would).

Measured side by side in ONE process per thread count, the runners interleaved per iteration
in a shuffled order (the machine is shared: repeat the script and read ranges):

* ``ov gears``: ``Executor.execute`` on ``backend="openvino"`` (the default: one compiled
  model, the source graph reshaped per gear, the weights packed once);
* ``ov branches``: the same with ``graphs="branches"`` (the gear file's static branches);
* ``ov per-gear``: ``share_weights=False`` (one compiled model per gear);
* ``ov dynamic``: OpenVINO's compiled dynamic-shape model of the source ONNX file, fed
  through one infer request (what a service on plain OpenVINO runs);
* ``ort``: ONNX Runtime's session of the source file.

Goal: ``ov gears`` <= 0.85x ``ov dynamic`` per gear. ``--clock cpu`` times each run in the
process's CPU time instead of wall time (at 1 thread: the run's own compute, which the other
jobs of a shared machine inflate less than its wall time). ``--profile RUNS``: only
OpenVINO's own per-node timing (PERF_COUNT) of the dynamic model and the static one per gear,
split into the weight products (FullyConnected, MatMul) and the rest: what a static shape can
save at best.

``--large``: only the large-output rows, on bench_scale's wide model (``x [B, 64] @ w [64,
262144]``: 1 MiB of float32 output per row, batch gears 1 / 16 / 64 / 256, 64 MiB of weights):
per gear, ``execute()`` (its large output written by OpenVINO into the session's recycled
output pool), the same with the pool off (a fresh ``np.empty`` per call: what it did before),
``execute(copy=False)`` (views of the session's buffers), ``execute()`` on one compiled model
per gear (``share_weights=False``: no If around the gear, whose body's outputs the shared
model copies out on every run) and OpenVINO's own infer request on the static model (its
output tensor reused, no array handed out).

Load, each in a FRESH process that imported everything first: wall time, compile time, RSS
increase after one run of every gear, split into anonymous memory (the process's own: the
CPU plugin's packed weights, once per compiled model) and file pages (the mapped data file,
shared with the page cache), and the peak (VmHWM), for the plain OpenVINO dynamic model,
gear_runtime's shared gears and its per-gear compiled models. Goal: the shared gears' RSS at
most 1.5x the dynamic model's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from bench_scale import (  # noqa: E402 (one interleaved loop for the benchmarks)
    WIDE_BATCHES,
    WIDE_COLUMNS,
    interleaved,
    mlp_model,
    save_external,
)

SEQS = (32, 64, 128, 256)
MAX_RATIO = 0.85
MAX_RSS_RATIO = 1.5
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
#: What the backend sets on CPU besides the threads (gear_runtime/backends/openvino.py): the
#: reference model runs with the same properties.
OV_PROPERTIES = {"PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}
SIZES = {"full": {"hidden": 768, "layers": 12, "heads": 12, "vocab": 30522},
         "quick": {"hidden": 512, "layers": 4, "heads": 8, "vocab": 8000}}


def build(workdir: Path, size: str) -> dict[str, Any]:
    """The encoder saved with external weights, and its gear file (compiled once)."""
    import onnx

    from gear_runtime.examples.encoder import build_encoder_model

    src = workdir / f"encoder_{size}.onnx"
    if not src.exists():
        model = build_encoder_model(**SIZES[size], max_positions=512)
        onnx.save(model, str(src), save_as_external_data=True, location=src.name + ".data",
                  size_threshold=1024)
    return compiled(src, workdir, ["input_ids", "attention_mask"], SIZES[size]["vocab"],
                    f"BERT-like encoder built with onnx.helper ({size})")


def token_inputs(source: Path) -> list[str]:
    """The names of ``source``'s inputs, each of which must be an int64 ``[batch, sequence]``
    tensor (what the gears 1 x seq and the token feeds assume); SystemExit otherwise."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    names = []
    for i in graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        if t.elem_type != onnx.TensorProto.INT64 or len(t.shape.dim) != 2:
            raise SystemExit(f"--model {source}: input {i.name!r} is not an int64 "
                             "[batch, sequence] tensor; this benchmark feeds token ids only")
        names.append(i.name)
    if "input_ids" not in names:
        raise SystemExit(f"--model {source}: no input named 'input_ids' (inputs: {names})")
    return names


def compiled(src: Path, workdir: Path, inputs: list[str], vocab: int,
             what: str) -> dict[str, Any]:
    """``src``'s gear file with the sequence gears over every input (compiled once, in
    ``workdir``), and what the runs need to know of the model."""
    import gear_runtime as gr

    spec = gr.GearSpec.from_atc(input_shape=";".join(f"{n}:1,-1" for n in inputs),
                                dynamic_dims=";".join(",".join([str(s)] * len(inputs))
                                                      for s in SEQS))
    gear = workdir / (src.name.removesuffix(".onnx") + ".gear.onnx")
    if not gear.exists():
        gr.compile(str(src), spec, str(gear), progress=False)
    data = Path(str(src) + ".data")
    weights = data.stat().st_size if data.exists() else src.stat().st_size
    return {"source": src, "gear": gear, "spec": spec, "weights": weights, "vocab": vocab,
            "what": what}


def token_feeds(shapes: dict[str, Sequence[int]], seed: int, vocab: int,
                ) -> dict[str, np.ndarray]:
    """Feeds for a gear: ``encoder_inputs``' ids and mask, zeros for any other input
    (``token_type_ids``: segment 0)."""
    from gear_runtime.examples.encoder import encoder_inputs

    feeds = encoder_inputs(shapes, seed=seed, vocab=vocab)
    for name, shape in shapes.items():
        feeds.setdefault(name, np.zeros(tuple(int(d) for d in shape), np.int64))
    return {n: feeds[n] for n in shapes}


def ov_dynamic(source: Path, threads: int) -> Any:
    """OpenVINO's compiled dynamic-shape model and one infer request on it."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(source)), "CPU",
                                  {**OV_PROPERTIES, "INFERENCE_NUM_THREADS": threads})
    return compiled, compiled.create_infer_request()


def latency(m: dict[str, Any], threads: int, budget_s: float, clock: str = "wall",
            ) -> list[dict[str, Any]]:
    """Per gear, the p50 of every runner (ms of ``clock``: ``wall`` time, or ``cpu``: the
    process's CPU time, which other jobs on the machine inflate less; ORT's spinning pool
    threads are then turned off, as they would bill their spin to the next runner)."""
    import onnxruntime as ort

    import gear_runtime as gr

    spec = m["spec"]
    common = {"backend": "openvino", "num_threads": threads, "progress": False}
    ours = {"ov gears": gr.load(str(m["gear"]), **common),
            "ov branches": gr.load(str(m["gear"]), graphs="branches", **common),
            "ov per-gear": gr.load(str(m["gear"]), share_weights=False, **common)}
    executors = {k: v.create_executor() for k, v in ours.items()}
    _, request = ov_dynamic(m["source"], threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if clock == "cpu":
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(m["source"]), so, providers=["CPUExecutionProvider"])
    rows = []
    for g in range(spec.gear_count):
        feeds = token_feeds(spec.shapes(g), seed=g, vocab=m["vocab"])
        want = session.run(None, feeds)[0]
        runs: dict[str, Callable[[], Any]] = {
            k: (lambda ex=ex, feeds=feeds: ex.execute(feeds)) for k, ex in executors.items()}
        runs["ov dynamic"] = lambda feeds=feeds: request.infer(feeds)
        runs["ort"] = lambda feeds=feeds: session.run(None, feeds)
        for name, ex in executors.items():  # every runner computes the same thing
            got = ex.execute(feeds)[0]
            assert np.abs(got - want).max() < 1e-3, (name, np.abs(got - want).max())
        times = interleaved(list(runs.values()), budget_s, min_iter=3, warmup=1,
                            clock=CLOCKS[clock])
        p50 = {k: float(np.median(t)) * 1e3 for k, t in zip(runs, times, strict=True)}
        rows.append({"threads": threads, "gear": g, "seq": spec.gears[g][0], **p50,
                     "iterations": len(times[0])})
    for model in ours.values():
        model.close()
    return rows


def profile(source: Path, seq: int, runs: int) -> dict[str, tuple[dict[str, float], int]]:
    """OpenVINO's own per-node timing (PERF_COUNT, 1 thread) of ``source``'s dynamic model and
    of the same reshaped to ``[1, seq]`` on every input (the two one after the other, not
    interleaved): per model, ms of CPU time per node type (the median over ``runs`` runs) and
    the number of nodes a run executes."""
    import openvino as ov

    core = ov.Core()
    props = {**OV_PROPERTIES, "INFERENCE_NUM_THREADS": 1, "PERF_COUNT": True}
    static = core.read_model(str(source))
    static.reshape({i.get_any_name(): [1, seq] for i in static.inputs})
    out = {}
    for name, model in (("dynamic", core.read_model(str(source))), ("static", static)):
        request = core.compile_model(model, "CPU", props).create_infer_request()
        feeds = {i.get_any_name(): np.ones((1, seq), np.int64) for i in request.model_inputs}
        per_run: list[dict[str, float]] = []
        for i in range(runs + 2):  # 2 warm-up runs
            request.infer(feeds)
            executed = [n for n in request.profiling_info
                        if n.status == ov.ProfilingInfo.Status.EXECUTED]
            by_type: dict[str, float] = {}
            for node in executed:
                by_type[node.node_type] = (by_type.get(node.node_type, 0.0)
                                           + node.cpu_time.total_seconds() * 1e3)
            if i >= 2:
                per_run.append(by_type)
        types = set().union(*per_run)
        out[name] = ({t: float(np.median([r.get(t, 0.0) for r in per_run])) for t in types},
                     len(executed))
    return out


def report_profile(source: Path, seqs: Sequence[int], runs: int) -> None:
    """Where a run's time goes, dynamic vs static: the weight products (FullyConnected,
    MatMul) against everything else, i.e. all that a static shape could save at best."""
    from gear_runtime.tools.common.textfmt import format_table

    heavy = ("FullyConnected", "MatMul")
    rows = [["seq", "model", "nodes run", "total ms", "FC+MatMul ms", "rest ms", "rest share",
             "static at best"]]
    for seq in seqs:
        for name, (by_type, nodes) in profile(source, seq, runs).items():
            total = sum(by_type.values())
            rest = total - sum(by_type.get(t, 0.0) for t in heavy)
            best = f"{(total - rest) / total:.2f}x" if name == "dynamic" else ""
            rows.append([str(seq), name, str(nodes), f"{total:.1f}", f"{total - rest:.1f}",
                         f"{rest:.1f}", f"{rest / total:.1%}", best])
    print(f"\nOpenVINO PERF_COUNT, 1 thread, median of {runs} runs, {source.name} (static at "
          "best: the dynamic run's time if every node but the weight products were free)")
    print("\n".join(format_table(rows, right=lambda c: c >= 2, rule=True)))


_CHILD = r"""
import json, sys, time
import numpy as np
import openvino as ov
import gear_runtime as gr
from gear_runtime.backends import openvino as _ovb  # noqa: F401 (imports paid before)
what, gear, source, shapes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
def status(key):
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith(key + ":")).split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM: the peak from here on is the load's
rss0, anon0, file0 = status("VmRSS"), status("RssAnon"), status("RssFile")
t0 = time.perf_counter()
if what == "ov dynamic":
    core = ov.Core()
    compiled = core.compile_model(core.read_model(source), "CPU", {
        "INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False})
    request = compiled.create_infer_request()
    run = lambda feeds: request.infer(feeds)
    compile_s = time.perf_counter() - t0
else:
    model = gr.load(gear, backend="openvino", num_threads=1, progress=False,
                    share_weights=what == "ov gears")
    ex = model.create_executor()
    run = lambda feeds: ex.execute(feeds, copy=False)
    compile_s = sum(model.backend_model.compile_seconds)
seconds = time.perf_counter() - t0
for shape in shapes:
    run({n: np.ones(s, np.int64) for n, s in shape.items()})
print(json.dumps({"seconds": seconds, "compile_s": compile_s, "rss": status("VmRSS") - rss0,
                  "anon": status("RssAnon") - anon0, "file": status("RssFile") - file0,
                  "peak": status("VmHWM") - rss0}))
"""


def load(m: dict[str, Any], repeats: int) -> dict[str, dict[str, float]]:
    spec = m["spec"]
    shapes = [{n: list(s) for n, s in spec.shapes(g).items()} for g in range(spec.gear_count)]
    runs: dict[str, list[dict[str, float]]] = {"ov dynamic": [], "ov gears": [],
                                                "ov per-gear": []}
    for _ in range(repeats):  # alternate; best of repeats (least disturbed)
        for what in runs:
            out = subprocess.run([sys.executable, "-c", _CHILD, what, str(m["gear"]),
                                  str(m["source"]), json.dumps(shapes)],
                                 capture_output=True, text=True, check=True)
            runs[what].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {k: {f: min(r[f] for r in v) for f in v[0]} for k, v in runs.items()}


def report(m: dict[str, Any], lat: list[dict[str, Any]], ld: dict[str, dict[str, float]],
           clock: str = "wall") -> int:
    import onnxruntime as ort
    import openvino as ov

    from gear_runtime.tools.common.textfmt import format_table

    print(f"\nmodel: {m['what']}, {m['weights'] / 2**20:.0f} MB of weights, "
          f"seq gears {', '.join(map(str, SEQS))} (batch 1); OpenVINO {ov.__version__}, "
          f"ONNX Runtime {ort.__version__}; p50 ms of "
          f"{'process CPU time' if clock == 'cpu' else 'wall time'}, interleaved\n")
    names = ["ov gears", "ov branches", "ov per-gear", "ov dynamic", "ort"]
    rows = [["threads", "seq", *names, "gears/dyn", "branches/dyn", "per-gear/dyn", "gears/ort",
             "iters"]]
    failed = 0
    for r in lat:
        ratio = r["ov gears"] / r["ov dynamic"]
        failed += ratio > MAX_RATIO
        rows.append([str(r["threads"]), str(r["seq"]), *(f"{r[n]:.1f}" for n in names),
                     f"{ratio:.2f}", f"{r['ov branches'] / r['ov dynamic']:.2f}",
                     f"{r['ov per-gear'] / r['ov dynamic']:.2f}",
                     f"{r['ov gears'] / r['ort']:.2f}", str(r["iterations"])])
    print("\n".join(format_table(rows, right=lambda c: c >= 2, rule=True)))
    print(f"goal: gears/dyn <= {MAX_RATIO} per gear")
    if ld:
        base = ld["ov dynamic"]["rss"]
        rows = [["", "load s", "compile s", "RSS MB", "x dynamic", "anon MB", "file MB",
                 "peak MB"]]
        for k, v in ld.items():
            rows.append([k, f"{v['seconds']:.1f}", f"{v['compile_s']:.1f}",
                         f"{v['rss'] / 2**20:.0f}", f"{v['rss'] / base:.2f}",
                         f"{v['anon'] / 2**20:.0f}", f"{v['file'] / 2**20:.0f}",
                         f"{v['peak'] / 2**20:.0f}"])
        print("\nload, fresh process each, 1 thread, RSS after one run of every gear (anon: "
              "the process's own memory, the packed weights; file: pages of the mapped data "
              "file, shared with the page cache):")
        print("\n".join(format_table(rows, right=lambda c: c >= 1, rule=True)))
        rss_ratio = ld["ov gears"]["rss"] / base
        print(f"goal: ov gears RSS <= {MAX_RSS_RATIO}x ov dynamic: {rss_ratio:.2f}x")
        failed += rss_ratio > MAX_RSS_RATIO
    return 1 if failed else 0


def large_outputs(workdir: Path, threads: int, budget_s: float) -> int:
    """The ``--large`` table: per batch gear of the wide model, p50 ms of execute() with the
    pool, without it, copy=False, and OpenVINO's own static infer request."""
    import openvino as ov

    import gear_runtime as gr
    from gear_runtime.backends.output_pool import OutputPool

    src = save_external(mlp_model([64, WIDE_COLUMNS], relu=False), workdir / "wide.onnx")
    spec = gr.GearSpec.from_atc(input_shape="x:-1,64",
                                dynamic_batch_size=",".join(map(str, WIDE_BATCHES)))
    path = workdir / "wide.gear.onnx"
    gr.compile(str(src), spec, str(path), progress=False)
    model = gr.load(str(path), backend="openvino", num_threads=threads)
    pooled, fresh = model.create_executor(), model.create_executor()
    fresh.session._pool = OutputPool(0)  # keeps no block: every call maps new memory
    per_gear = gr.load(str(path), backend="openvino", num_threads=threads,
                       share_weights=False).create_executor()
    core = ov.Core()
    print(f"large outputs on OpenVINO {ov.__version__}, {threads} thread(s): wide model, "
          f"{WIDE_COLUMNS * 4 // 2**20} MiB of output per batch row; p50 ms per call")
    header = ("batch", "output MiB", "execute()", "no pool", "copy=False", "per-gear",
              "ov infer", "execute/ov", "no pool/ov", "per-gear/ov")
    print("  ".join(f"{h:>11}" for h in header))
    ok = True
    for g, batch in enumerate(WIDE_BATCHES):
        x = np.random.default_rng(g).standard_normal((batch, 64), dtype=np.float32)
        static = core.read_model(str(src))
        static.reshape({"x": [batch, 64]})
        request = core.compile_model(static, "CPU", {**OV_PROPERTIES,
                                                      "INFERENCE_NUM_THREADS": threads,
                                                      "INFERENCE_PRECISION_HINT": "f32"}
                                     ).create_infer_request()
        feeds = {"x": x}
        runs = [lambda f=feeds: pooled.execute(f), lambda f=feeds: fresh.execute(f),
                lambda f=feeds: pooled.execute(f, copy=False),
                lambda f=feeds: per_gear.execute(f),
                lambda f=feeds, r=request: r.infer(f, share_inputs=True, share_outputs=True)]
        times = [float(np.median(t)) * 1e3 for t in interleaved(runs, budget_s)]
        ratios = [times[k] / times[4] for k in (0, 1, 3)]
        ok &= ratios[2] <= 1.10
        print("  ".join(f"{v:>11}" for v in (batch, batch * WIDE_COLUMNS * 4 // 2**20,
                                               *(f"{t:.2f}" for t in times),
                                               *(f"{r:.2f}x" for r in ratios))))
    print("goal: execute() per gear (share_weights=False) <= 1.10x OpenVINO's own infer "
          "request on every gear: " + ("PASS" if ok else "FAIL") + "; the shared model "
          "(the CPU default) also copies each output out of its If")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the 66 MiB encoder, short budgets")
    p.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    p.add_argument("--seconds", type=float, default=None, help="budget per gear and count")
    p.add_argument("--repeats", type=int, default=2, help="fresh-process loads per variant")
    p.add_argument("--no-load", action="store_true", help="skip the load measurements")
    p.add_argument("--workdir", default=None, help="where the models go (default: a temp dir)")
    p.add_argument("--model", default=None,
                   help="an ONNX file of int64 [batch, sequence] inputs instead of the encoder "
                        "(e.g. benchmarks/export_hf_bert.py's); its gear file goes to --workdir")
    p.add_argument("--vocab", type=int, default=30522, help="--model's vocabulary (ids < N)")
    p.add_argument("--profile", type=int, default=0, metavar="RUNS",
                   help="only OpenVINO's per-node profile of the dynamic vs static model per "
                        "seq gear, median of RUNS runs")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="time per run: wall (default) or the process's CPU time")
    p.add_argument("--large", action="store_true",
                   help="only the large-output rows (bench_scale's wide model): execute() with "
                        "and without the output pool vs OpenVINO's own infer request")
    args = p.parse_args(argv)
    size = "quick" if args.quick else "full"
    budget = args.seconds if args.seconds is not None else (3.0 if args.quick else 20.0)
    with tempfile.TemporaryDirectory(prefix="bench_openvino_") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.large:
            return large_outputs(workdir, int(args.threads.split(",")[0]),
                                 args.seconds if args.seconds is not None else 3.0)
        if args.model:
            src = Path(args.model).resolve()
            m = compiled(src, workdir, token_inputs(src), args.vocab, f"{src.name} (--model)")
        else:
            m = build(workdir, size)
        if args.profile:
            report_profile(m["source"], SEQS, args.profile)
            return 0
        lat = []
        for t in (int(x) for x in args.threads.split(",")):
            lat += latency(m, t, budget, args.clock)
        ld = {} if args.no_load else load(m, args.repeats)
        return report(m, lat, ld, args.clock)


if __name__ == "__main__":
    sys.exit(main())
