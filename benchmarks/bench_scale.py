"""The gear executor vs plain ONNX Runtime at realistic sizes: latency per gear, threads, load.

    python benchmarks/bench_scale.py [--quick] [--big] [--large-only] [--threads 1,2]
                                     [--workdir DIR] [--load-only] [--repeats N]
                                     [--baseline CHECKOUT]

Two models built here with onnx.helper, saved with their weights in external data:

* ``prefill``: the built-in prefill example at hidden 512, vocab 8000, 4 layers (~83 MB of
  weights), dims gears seq 32 / 128 / 512 / 1024;
* ``mlp``: 6 float32 [4096, 4096] MatMul+Relu layers (~403 MB), batch gears 1..32;
* ``wide``: one MatMul x [N, 64] @ w [64, 262144] (64 MiB of weights) whose only work is a
  large output: batch gears 1 / 16 / 64 / 256 give 1 / 16 / 64 / 256 MiB of output per call
  (the large-output rows: LLM logits are 19-311 MB per call).

Measured side by side in ONE run, in this process, with the same ORT thread count:

* latency: per gear, ``Executor.execute`` (outputs copied out, as a service gets them) vs
  plain ``InferenceSession.run`` of the source model at that shape, interleaved per
  iteration in a shuffled order; the ratio of medians, measured with either session created
  first and combined (geometric mean: the first session to allocate its weights runs
  memory-bound batches faster here). Target <= 1.05x, at every output size (the outputs of
  ``execute()`` are the caller's; their memory is recycled once dropped, as ORT's arena
  recycles its own: backends/output_pool.py). ``execute(copy=False)`` is timed in the same
  loop and shown beside it (no target: views of the executor's buffers).
* throughput: 4 Python threads, each with its own executor, vs 4 threads sharing one plain
  ORT session (1 ORT thread each), prefill seq 128. Target >= 0.95x.
* load, each in a FRESH subprocess that imported everything first: resident-set increase
  (psutil), peak increase (ru_maxrss), wall time, RSS after one run of every gear, and the
  bytes the process wrote (``wchar`` of /proc/self/io) during the load: a file written at
  load (a temporary weight copy) shows there. Targets: RSS <= 1.1x, peak <= 1.3x, time <=
  1.2x plain ORT's; 0 bytes written. ``--baseline CHECKOUT`` (another gear_runtime source
  tree, its ``_core`` built in place: ``python setup.py build_ext --inplace``) adds a column:
  the same gear file loaded by that code, in its own fresh processes, interleaved with the
  other two; target: load time <= 1.05x the baseline's (a change must not slow the load).

``--big`` adds a synthetic model over 2 GiB (9 float32 [4096, 16384] / [16384, 4096]
layers, 2.25 GiB, dynamic batch, external data): compile with 4 gears (time, peak RSS), load
(RSS), and every gear compared with ORT on the source model. It needs ~5 GiB of disk and
~7 GiB of memory and takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

MAX_LATENCY_RATIO = 1.05
MIN_THROUGHPUT_RATIO = 0.95
MAX_RSS_RATIO = 1.1
MAX_PEAK_RATIO = 1.3
MAX_LOAD_TIME_RATIO = 1.2
MAX_BASELINE_LOAD_RATIO = 1.05

PREFILL_SEQS = (32, 128, 512, 1024)
MLP_BATCHES = (1, 2, 4, 8, 16, 32)
WIDE_BATCHES = (1, 16, 64, 256)
WIDE_COLUMNS = 262144  # float32: 1 MiB of output per batch row


# ---- models -----------------------------------------------------------------------------------
def mlp_model(widths: Sequence[int], seed: int = 0, relu: bool = True) -> Any:
    """MatMul+Relu chain x [N, widths[0]] -> y [N, widths[-1]], seeded float32 weights
    (MatMul alone without ``relu``)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        w = (rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        if relu:
            nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
        x = nodes[-1].output[0]
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", widths[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", widths[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_external(model: Any, path: Path) -> Path:
    """Save ``model`` with its weights in one external data file beside it (ONNX's way)."""
    import onnx

    # onnx.save APPENDS to an existing data file: a reused --workdir grew by a copy per run
    (path.parent / (path.name + ".weights")).unlink(missing_ok=True)

    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".weights", size_threshold=1024)
    return path


def build_models(workdir: Path, large_only: bool = False, load_only: bool = False
                 ) -> dict[str, dict[str, Any]]:
    """The models saved with external data, compiled; name -> paths, spec and inputs
    (``large_only``: the wide model alone; ``load_only``: the realistic ones alone)."""
    import gear_runtime as gr

    out: dict[str, dict[str, Any]] = {} if large_only else _realistic(workdir)
    if load_only and not large_only:
        return _compiled(workdir, out)
    src = save_external(mlp_model([64, WIDE_COLUMNS], relu=False), workdir / "wide.onnx")
    spec = gr.GearSpec.from_atc(input_shape="x:-1,64",
                                dynamic_batch_size=",".join(map(str, WIDE_BATCHES)))
    out["wide"] = {"source": src, "spec": spec, "latency_only": True,
                   "inputs": lambda g, spec=spec: {"x": np.random.default_rng(g).standard_normal(
                       spec.shapes(g)["x"], dtype=np.float32)}}
    return _compiled(workdir, out)


def _compiled(workdir: Path, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each model compiled to a gear file in ``workdir`` (its path, compile time, weights)."""
    import gear_runtime as gr

    for name, m in out.items():
        t0 = time.perf_counter()
        m["gear"] = gr.compile(str(m["source"]), m["spec"], str(workdir / f"{name}.gear.onnx"),
                               progress=False)
        m["compile_s"] = time.perf_counter() - t0
        m["weights_bytes"] = os.path.getsize(str(m["source"]) + ".weights")
    return out


def _realistic(workdir: Path) -> dict[str, dict[str, Any]]:
    """The prefill and the MLP (latency, threads and load rows)."""
    import gear_runtime as gr
    from gear_runtime.examples import prefill

    out: dict[str, dict[str, Any]] = {}
    src = save_external(prefill.build_prefill_model(hidden=512, vocab=8000, layers=4,
                                                     heads=8, max_positions=1024),
                        workdir / "prefill.onnx")
    spec = _prefill_spec(workdir)
    out["prefill"] = {"source": src, "spec": spec,
                      "inputs": lambda g, spec=spec: prefill.inputs_for_shapes(
                          spec.shapes(g), seed=g, vocab=8000)}
    src = save_external(mlp_model([4096] * 7), workdir / "mlp.onnx")
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4096",
                                dynamic_batch_size=",".join(map(str, MLP_BATCHES)))
    out["mlp"] = {"source": src, "spec": spec,
                  "inputs": lambda g, spec=spec: {"x": np.random.default_rng(g).standard_normal(
                      spec.shapes(g)["x"], dtype=np.float32)}}
    return out


def _prefill_spec(workdir: Path) -> Any:
    import gear_runtime as gr
    from gear_runtime.examples import prefill

    ini = workdir / "config_prefill_512.ini"
    ini.write_text(prefill.prefill_config(hidden=512, seq_gears=PREFILL_SEQS), encoding="utf-8")
    return gr.GearSpec.from_config(str(ini))


# ---- latency ------------------------------------------------------------------------------------
def plain_session(path: str | Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def latency(models: dict[str, dict[str, Any]], threads: int, budget_s: float
            ) -> list[dict[str, Any]]:
    """Per model and gear: p50 of execute and of plain ORT run, interleaved, and the ratio.

    Measured twice, once with the gear model created first and once with the plain session
    first, each pair in a fresh pair of sessions: on this machine whichever session allocates
    its (prepacked) weights first runs the memory-bound small batches up to 8% faster (memory
    placement), a bias of the order, not of either side. The ratio is the geometric mean of
    the two orders; both are kept in the JSON."""
    rows = []
    for name, m in models.items():
        runs = [_latency_pass(m, threads, budget_s, gear_first) for gear_first in (True, False)]
        for g, (a, b) in enumerate(zip(*runs, strict=True)):
            ratio = float(np.sqrt(a["ratio"] * b["ratio"]))
            rows.append({"model": name, "threads": threads, "gear": g, "dims": a["dims"],
                         "output_bytes": a["output_bytes"],
                         "execute_ms": (a["execute_ms"] + b["execute_ms"]) / 2,
                         "nocopy_ms": (a["nocopy_ms"] + b["nocopy_ms"]) / 2,
                         "ort_ms": (a["ort_ms"] + b["ort_ms"]) / 2, "ratio": ratio,
                         "ratio_nocopy": float(np.sqrt(a["ratio_nocopy"] * b["ratio_nocopy"])),
                         "ratio_gear_first": a["ratio"], "ratio_ort_first": b["ratio"]})
    return rows


def _latency_pass(m: dict[str, Any], threads: int, budget_s: float, gear_first: bool
                  ) -> list[dict[str, Any]]:
    import gear_runtime as gr

    if not gear_first:
        ref = plain_session(m["source"], threads)
    model = gr.load(m["gear"], intra_op_num_threads=threads)
    if gear_first:
        ref = plain_session(m["source"], threads)
    out = []
    with model:
        ex = model.create_executor()
        for g in range(model.gear_count):
            feeds = m["inputs"](g)
            got, want = ex.execute(feeds), ref.run(None, feeds)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            # each call's outputs are dropped at once, as a service that answers them does
            times = interleaved([lambda ex=ex, f=feeds: ex.execute(f),
                                 lambda ex=ex, f=feeds: ex.execute(f, copy=False),
                                 lambda ref=ref, f=feeds: ref.run(None, f)], budget_s / 2)
            p50 = [float(np.median(t)) for t in times]
            out.append({"dims": model.gears[g], "execute_ms": p50[0] * 1e3,
                        "nocopy_ms": p50[1] * 1e3, "ort_ms": p50[2] * 1e3,
                        "ratio": p50[0] / p50[2], "ratio_nocopy": p50[1] / p50[2],
                        "output_bytes": sum(int(w.nbytes) for w in want)})
    del ref
    return out


def interleaved(runs: Sequence[Callable[[], Any]], budget_s: float, min_iter: int = 5,
                max_iter: int = 300, warmup: int = 2,
                clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Run every callable once per iteration in a shuffled order until ``budget_s`` (wall
    seconds) is spent (at least ``min_iter``, at most ``max_iter`` iterations, after ``warmup``
    untimed iterations); seconds of ``clock`` per call (wall time by default;
    ``time.process_time``: the process's CPU time), per callable."""
    rng = np.random.default_rng(0)
    out: list[list[float]] = [[] for _ in runs]
    for run in runs * warmup:
        run()
    start = time.perf_counter()
    i = 0
    while i < max_iter and (i < min_iter or time.perf_counter() - start < budget_s):
        for k in rng.permutation(len(runs)):
            t0 = clock()
            runs[k]()
            out[k].append(clock() - t0)
        i += 1
    return out


# ---- threads -----------------------------------------------------------------------------------
def throughput(m: dict[str, Any], gear: int, seconds: float, workers: int = 4
               ) -> dict[str, Any]:
    """Runs per second of ``workers`` threads: own executor each vs one shared ORT session."""
    import gear_runtime as gr

    feeds = m["inputs"](gear)
    with gr.load(m["gear"], intra_op_num_threads=1) as model:
        executors = [model.create_executor() for _ in range(workers)]
        ref = plain_session(m["source"], 1)
        ours = [lambda ex=ex: ex.execute(feeds) for ex in executors]
        plain = [lambda: ref.run(None, feeds)] * workers
        rates = {"gear_runtime": [], "ort": []}
        for _ in range(2):  # alternate, so drifts of the machine hit both
            rates["gear_runtime"].append(_rate(ours, seconds))
            rates["ort"].append(_rate(plain, seconds))
    ours_rate, ort_rate = max(rates["gear_runtime"]), max(rates["ort"])
    return {"gear": gear, "dims": model.gears[gear], "workers": workers,
            "gear_runtime_per_s": ours_rate, "ort_per_s": ort_rate, "ratio": ours_rate / ort_rate}


def _rate(calls: Sequence[Callable[[], Any]], seconds: float) -> float:
    counts = [0] * len(calls)
    stop = threading.Event()

    def work(k: int) -> None:
        calls[k]()  # warm
        while not stop.is_set():
            calls[k]()
            counts[k] += 1

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    before, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    done, t1 = sum(counts) - before, time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    return done / (t1 - t0)


# ---- load in a fresh process --------------------------------------------------------------------
_CHILD = r"""
import json, os, sys, time
import numpy as np, psutil, onnxruntime as ort, gear_runtime as gr
# everything imported before the measurement (imports are paid once per process, not per load)
from gear_runtime import _core  # noqa: F401
from gear_runtime.gearfile import reader  # noqa: F401
from gear_runtime.runtime import executor, model  # noqa: F401
from gear_runtime.backends import onnxruntime as _ort_backend  # noqa: F401
what, path, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
module = gr.__file__  # the baseline's child must import the baseline's package

def wchar():
    with open("/proc/self/io") as f:
        return int(next(l for l in f if l.startswith("wchar:")).split()[1])

def hwm():  # peak RSS since the last reset, bytes (ru_maxrss would carry the parent's peak)
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM:")).split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM: the peak from here on is the load's
proc = psutil.Process()
rss0, w0 = proc.memory_info().rss, wchar()
t0 = time.perf_counter()
if what == "gear_runtime":
    model = gr.load(path, intra_op_num_threads=1)
    ex = model.create_executor()
    run = lambda feeds: ex.execute(feeds, copy=False)
    names, dtypes = model.input_names, model.info.input_dtypes
else:
    so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    run = lambda feeds: sess.run(None, feeds)
    names = [i.name for i in sess.get_inputs()]
    dtypes = [np.int64 if "int64" in i.type else np.float32 for i in sess.get_inputs()]
seconds = time.perf_counter() - t0
written = wchar() - w0
rss1, peak1 = proc.memory_info().rss, hwm()
for gear in shapes:
    run({n: np.zeros(gear[n], dtype=dt) for n, dt in zip(names, dtypes)})
rss2 = proc.memory_info().rss
print(json.dumps({"seconds": seconds, "written": written, "rss": rss1 - rss0,
                  "peak": peak1 - rss0, "steady": rss2 - rss0, "module": module}))
"""


def load_in_fresh_process(what: str, path: str | Path, shapes: list[dict[str, list[int]]],
                          source_tree: Path | None = None) -> dict[str, Any]:
    """One load in a new interpreter; ``source_tree``: import gear_runtime from there."""
    env = None
    if source_tree is not None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(source_tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # `python -c` imports from its working folder first: run the baseline's child in its tree
    out = subprocess.run([sys.executable, "-c", _CHILD, what, str(path), json.dumps(shapes)],
                         capture_output=True, text=True, check=True, env=env, cwd=source_tree)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if source_tree is not None and not Path(result["module"]).resolve().is_relative_to(
            source_tree.resolve()):
        raise SystemExit(f"--baseline: the child imported {result['module']}, "
                         f"not the package in {source_tree}")
    return result


def load(models: dict[str, dict[str, Any]], repeats: int, baseline: Path | None = None
         ) -> list[dict[str, Any]]:
    rows = []
    for name, m in models.items():
        spec = m["spec"]
        shapes = [{n: list(s) for n, s in spec.shapes(g).items()} for g in range(spec.gear_count)]
        runs: dict[str, list[dict[str, Any]]] = {"gear_runtime": [], "ort": []}
        if baseline is not None:
            runs["baseline"] = []
        for _ in range(repeats):  # alternate, best of repeats (least disturbed)
            runs["gear_runtime"].append(load_in_fresh_process("gear_runtime", m["gear"], shapes))
            if baseline is not None:
                runs["baseline"].append(load_in_fresh_process(
                    "gear_runtime", m["gear"], shapes, baseline))
            runs["ort"].append(load_in_fresh_process("ort", m["source"], shapes))
        best = {k: {f: min(r[f] for r in v) for f in ("seconds", "rss", "peak", "steady")}
                | {"written": max(r["written"] for r in v)} for k, v in runs.items()}
        rows.append({"model": name, "weights_bytes": m["weights_bytes"], **{
            f"{k}_{f}": v for k, d in best.items() for f, v in d.items()}})
    return rows


# ---- over 2 GiB ----------------------------------------------------------------------------------
_BIG_CHILD = r"""
import json, sys, time
import numpy as np, psutil, onnxruntime as ort, gear_runtime as gr
from gear_runtime.compiler import compile_gears
src, gear = sys.argv[1], sys.argv[2]
spec = gr.GearSpec.from_atc(input_shape="x:-1,4096", dynamic_batch_size="1,2,4,8")
def hwm():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM:")).split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
rss0 = psutil.Process().memory_info().rss
t0 = time.perf_counter()
report = compile_gears(src, spec, gear, progress=False)
compile_s = time.perf_counter() - t0
compile_peak = hwm() - rss0
t0 = time.perf_counter()
model = gr.load(gear, intra_op_num_threads=2)
ex = model.create_executor()
load_s = time.perf_counter() - t0
load_rss = psutil.Process().memory_info().rss - rss0
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
ref = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
diffs = []
for g, (b,) in enumerate(model.gears):
    x = np.random.default_rng(g).standard_normal((b, 4096), dtype=np.float32)
    got, want = ex.execute({"x": x})[0], ref.run(None, {"x": x})[0]
    diffs.append(float(np.max(np.abs(got - want))))
print(json.dumps({"compile_s": compile_s, "compile_peak": compile_peak, "load_s": load_s,
                  "load_rss": load_rss, "gear_file_bytes": report.file_bytes,
                  "data_bytes": report.data_bytes, "max_abs_diff": diffs}))
"""


def big(workdir: Path) -> dict[str, Any]:
    """The > 2 GiB model: build (streamed layer by layer), compile, load, compare."""
    import onnx
    from onnx import TensorProto, helper

    src = workdir / "big.onnx"
    data = workdir / "big.onnx.weights"
    widths = [4096, 16384] * 5  # 9 layers: 4096->16384->4096 ...
    nodes, inits, x, offset = [], [], "x", 0
    rng = np.random.default_rng(0)
    with open(data, "wb") as f:  # one layer in memory at a time
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            w = (rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a)).astype(np.float32)
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[a, b])
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data.name), ("offset", str(offset)),
                         ("length", str(w.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            f.write(w.tobytes())
            offset += w.nbytes
            inits.append(t)
            nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                      helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
            x = f"r{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", widths[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(src))
    out = subprocess.run([sys.executable, "-c", _BIG_CHILD, str(src),
                          str(workdir / "big.gear.onnx")],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["weights_bytes"] = offset
    return result


# ---- report -------------------------------------------------------------------------------------
def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


def report(lat: list[dict[str, Any]], thr: dict[str, Any] | None, ld: list[dict[str, Any]],
           big_result: dict[str, Any] | None, models: dict[str, dict[str, Any]]) -> bool:
    ok = True
    sizes = ", ".join(f"{n} {_mb(m['weights_bytes'])} of weights" for n, m in models.items())
    print(f"models: {sizes or 'none'}; ORT {_ort_version()}, {os.cpu_count()} CPUs")
    if lat:
        print("\nlatency per gear: execute (outputs copied) vs plain ORT run of the source "
              "model;\nratio = geometric mean over both session creation orders (each order "
              "in brackets)")
        print(f"{'model':8} {'thr':>3} {'gear':>4} {'dims':>16} {'output':>9} "
              f"{'execute ms':>11} {'ORT ms':>9} {'ratio':>6}  target <= {MAX_LATENCY_RATIO}"
              "  (orders)         copy=False ratio")
    for r in lat:
        good = r["ratio"] <= MAX_LATENCY_RATIO
        ok &= good
        print(f"{r['model']:8} {r['threads']:>3} {r['gear']:>4} "
              f"{','.join(map(str, r['dims'])):>16} {_mb(r['output_bytes']):>9} "
              f"{r['execute_ms']:>11.3f} {r['ort_ms']:>9.3f} "
              f"{r['ratio']:>6.3f}  {'PASS' if good else 'FAIL'}  ("
              f"{r['ratio_gear_first']:.3f} / {r['ratio_ort_first']:.3f})  "
              f"{r['ratio_nocopy']:.3f}")
    if thr is not None:
        good = thr["ratio"] >= MIN_THROUGHPUT_RATIO
        ok &= good
        print(f"\n{thr['workers']} threads, prefill seq {thr['dims'][0]}: executor each "
              f"{thr['gear_runtime_per_s']:.1f} runs/s vs shared ORT session "
              f"{thr['ort_per_s']:.1f} runs/s: {thr['ratio']:.3f}x "
              f"(target >= {MIN_THROUGHPUT_RATIO}) {'PASS' if good else 'FAIL'}")
    if ld:
        print("\nload in a fresh process (best of repeats): gear_runtime.load + "
              "create_executor vs plain InferenceSession")
        print(f"{'model':8} {'what':14} {'gear_runtime':>14} {'plain ORT':>12} {'ratio':>6} "
              f"{'target':>7}")
    for r in ld:
        for field, target in (("rss", MAX_RSS_RATIO), ("peak", MAX_PEAK_RATIO),
                              ("seconds", MAX_LOAD_TIME_RATIO), ("steady", MAX_RSS_RATIO)):
            a, b = r[f"gear_runtime_{field}"], r[f"ort_{field}"]
            ratio = a / b if b else float("inf")
            good = ratio <= target
            ok &= good
            fmt = (lambda v: f"{v:.2f} s") if field == "seconds" else _mb
            print(f"{r['model']:8} {field:14} {fmt(a):>14} {fmt(b):>12} {ratio:>6.2f} "
                  f"{'<= ' + str(target):>7} {'PASS' if good else 'FAIL'}")
        good = r["gear_runtime_written"] == 0
        ok &= good
        print(f"{r['model']:8} {'bytes written':14} {r['gear_runtime_written']:>14} "
              f"{r['ort_written']:>12} {'':>6} {'0':>7} {'PASS' if good else 'FAIL'}")
        ok &= _report_baseline(r)
    if big_result is not None:
        b = big_result
        good = max(b["max_abs_diff"]) < 1e-3
        ok &= good
        print(f"\nover 2 GiB: {_mb(b['weights_bytes'])} of weights, 4 batch gears: compile "
              f"{b['compile_s']:.1f} s, compile peak RSS +{_mb(b['compile_peak'])} "
              f"({b['compile_peak'] / b['weights_bytes']:.2f}x the weights); gear file "
              f"{b['gear_file_bytes']:,} bytes + data {_mb(b['data_bytes'])}; load "
              f"{b['load_s']:.1f} s, RSS +{_mb(b['load_rss'])} "
              f"({b['load_rss'] / b['weights_bytes']:.2f}x the weights); max |diff| vs ORT on "
              f"the source per gear {[f'{d:.1e}' for d in b['max_abs_diff']]} "
              f"{'PASS' if good else 'FAIL'}")
    return ok


def _report_baseline(r: dict[str, Any]) -> bool:
    """The --baseline rows of one model's load (True when there are none)."""
    if "baseline_seconds" not in r:
        return True
    ratio = r["gear_runtime_seconds"] / r["baseline_seconds"]
    good = ratio <= MAX_BASELINE_LOAD_RATIO
    print(f"{r['model']:8} {'vs baseline':14} {'this tree':>14} {'baseline':>12}")
    print(f"{r['model']:8} {'seconds':14} {r['gear_runtime_seconds']:>12.3f} s "
          f"{r['baseline_seconds']:>10.3f} s {ratio:>6.3f} "
          f"{'<= ' + str(MAX_BASELINE_LOAD_RATIO):>7} "
          f"{'PASS' if good else 'FAIL'}")
    for field in ("rss", "peak", "steady"):
        a, b = r[f"gear_runtime_{field}"], r[f"baseline_{field}"]
        print(f"{r['model']:8} {field:14} {_mb(a):>14} {_mb(b):>12} "
              f"{a / b if b else float('inf'):>6.2f}")
    return good


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count")
    return value


def _ort_version() -> str:
    import onnxruntime as ort

    return ort.__version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings (a smoke run)")
    parser.add_argument("--big", action="store_true", help="also the > 2 GiB model (minutes)")
    parser.add_argument("--big-only", action="store_true", help="only the > 2 GiB model")
    parser.add_argument("--large-only", action="store_true",
                        help="only the large-output latency rows (the wide model)")
    parser.add_argument("--load-only", action="store_true",
                        help="only the load table (fresh processes, --repeats per side)")
    parser.add_argument("--repeats", type=_positive, default=3,
                        help="loads per side (best of)")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="also load with the gear_runtime of this source tree (its _core "
                             "built in place), interleaved: the load-time ratio of a change")
    parser.add_argument("--threads", default="1,2", help="ORT threads of the latency table")
    parser.add_argument("--seconds", type=float, help="latency: seconds per gear (default 3)")
    parser.add_argument("--workdir", help="keep the models here (default: a temporary folder)")
    parser.add_argument("--json", help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    budget = args.seconds or (0.5 if args.quick else 3.0)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.big_only:
            result = big(workdir)
            return 0 if report([], None, [], result, {}) else 1
        models = build_models(workdir, args.large_only, args.load_only)
        lat = [] if args.load_only else [
            r for t in args.threads.split(",") for r in latency(models, int(t), budget)]
        realistic = {n: m for n, m in models.items() if not m.get("latency_only")}
        thr = throughput(models["prefill"], 1, 1.0 if args.quick else 4.0) \
            if realistic and not args.load_only else None
        ld = load(realistic, 1 if args.quick else args.repeats, args.baseline)
        big_result = big(workdir) if args.big else None
        ok = report(lat, thr, ld, big_result, models)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"latency": lat, "throughput": thr, "load": ld, "big": big_result,
                 "weights_bytes": {n: m["weights_bytes"] for n, m in models.items()},
                 "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss},
                indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
