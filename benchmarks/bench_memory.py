"""Resident memory of loading an 8-gear weight-heavy model vs its 1-gear version; and of a
static model (no gears) vs the same file in a plain ONNX Runtime session.

    python benchmarks/bench_memory.py [--width 1024] [--layers 8] [--repeats 3]
    python benchmarks/bench_memory.py --section static [--repeats 3]

The model is an MLP of ``layers`` float32 [width, width] MatMuls (32 MiB of weights by
default) with a dynamic batch; the 8-gear file has batch gears 1..128, the 1-gear file only
batch 1. Each load runs in a FRESH subprocess that imports everything first and then measures
the resident-set delta of ``gear_runtime.load`` + ``create_executor`` (psutil RSS, /proc
fallback). Target: 8-gear delta <= 1.3 x 1-gear delta (weights are stored and loaded once,
every gear's session shares them). For context, the same delta for 8 plain ORT sessions of
the original model (one per batch size, free-dimension override: the naive way) is reported.

The static section (``--section static``) is the example causal LM pair at
:data:`STATIC_SIZES` (74 MiB of float32 weights): its static decode, weights inside the .onnx
(as ``onnx.save`` writes a model under 2 GiB) and in a data file; and the pair as served,
``load(prefill gear file, share_weights_with=decode)``. Each is the RSS added by the load, an
executor and one run (and the peak over them, where /proc lets it be reset), against the same
file(s) in plain ORT sessions (``onnxruntime.InferenceSession``) and one run each, each in a
fresh subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

MAX_RATIO = 1.3
GEARS_8 = (1, 2, 4, 8, 16, 32, 64, 128)
#: The static section's causal LM (gear_runtime.examples.causal_lm.Sizes): 74 MiB of weights.
STATIC_SIZES: dict[str, Any] = dict(vocab=6500, hidden=512, heads=8, layers=4, max_seq=256,
                                    seq_gears=(64, 128))
#: A static load may add at most this much more than ONNX Runtime's own (the weights are held
#: once, as ORT's; what is left is gear_runtime's buffers and bookkeeping).
STATIC_MAX_RATIO = 1.15


def build_heavy_model(width: int = 1024, layers: int = 8, seed: int = 0) -> Any:
    """MatMul/Relu chain, x float32 [N, width] -> y [N, width]; seeded weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes, cur = [], [], "x"
    for k in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        mm = "y" if k == layers - 1 else f"mm{k}"
        nodes.append(helper.make_node("MatMul", [cur, f"w{k}"], [mm], name=f"matmul{k}"))
        if k != layers - 1:
            nodes.append(helper.make_node("Relu", [mm], [f"h{k}"], name=f"relu{k}"))
            cur = f"h{k}"
    graph = helper.make_graph(
        nodes, "heavy_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# ---- the child: one load in a fresh process -------------------------------------------------
def _child(kind: str, path: str, threads: int) -> dict[str, Any]:
    if kind in _STATIC_KINDS:
        return _static_child(kind, path, threads)
    import gc

    import onnxruntime as ort

    import gear_runtime as gr
    import gear_runtime.backends.onnxruntime  # noqa: F401  (imports are not what we measure)
    import gear_runtime.runtime.model  # noqa: F401
    from gear_runtime.tools.bench.context import rss_bytes

    gc.collect()
    before = rss_bytes()
    if kind == "gear":
        model = gr.load(path, intra_op_num_threads=threads)
        executor = model.create_executor()
        gc.collect()
        after = rss_bytes()
        shapes = [model.spec.shapes(g)["x"] for g in range(model.gear_count)]
        for shape in shapes:
            executor.execute({"x": np.zeros(shape, np.float32)})
        gears = model.gear_count
    else:  # naive: one plain ORT session per batch size, each with its own weights
        sessions = []
        for b in GEARS_8:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.add_free_dimension_override_by_name("N", b)
            sessions.append(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]))
        gc.collect()
        after = rss_bytes()
        width = sessions[0].get_inputs()[0].shape[1]
        for b, s in zip(GEARS_8, sessions, strict=True):
            s.run(None, {"x": np.zeros((b, width), np.float32)})
        gears = len(sessions)
    gc.collect()
    return {"before": before, "after_load": after, "after_runs": rss_bytes(), "gears": gears}


def _reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int | None:
    """This process's peak RSS (VmHWM), or None where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return None


def _zeros(inputs: Any, seq: int) -> dict[str, np.ndarray]:
    """Zero feeds for ORT input metadata (a named dim, the prefill's seq, is ``seq``)."""
    dtypes = {"tensor(float)": np.float32, "tensor(int64)": np.int64}
    return {i.name: np.zeros([d if isinstance(d, int) else seq for d in i.shape],
                             dtypes[i.type]) for i in inputs}


def _gear_zeros(model: Any) -> dict[str, np.ndarray]:
    """Zero feeds for a loaded model's first gear."""
    shapes = model.spec.shapes(0)
    return {n: np.zeros(shapes[n], dt)
            for n, dt in zip(model.input_names, model.info.input_dtypes, strict=True)}


def _static_load(kind: str, path: str, threads: int) -> list[Any]:
    """What the static child measures: the loads, executors and one run of each."""
    import onnxruntime as ort

    import gear_runtime as gr

    folder = Path(path)
    if kind in ("static", "pair"):
        decode = gr.load(str(folder / "decode.onnx"), intra_op_num_threads=threads)
        models = [decode]
        if kind == "pair":
            models.append(gr.load(str(folder / "prefill.gear.onnx"), share_weights_with=decode,
                                  intra_op_num_threads=threads))
        executors = [m.create_executor() for m in models]
        for m, ex in zip(models, executors, strict=True):
            ex.execute(_gear_zeros(m))
        return [*models, *executors]
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    names = ["decode.onnx"] + (["prefill.onnx"] if kind == "pair-ort" else [])
    sessions = [ort.InferenceSession(str(folder / n), so, providers=["CPUExecutionProvider"])
                for n in names]
    for s in sessions:
        s.run(None, _zeros(s.get_inputs(), STATIC_SIZES["seq_gears"][0]))
    return sessions


def _static_child(kind: str, path: str, threads: int) -> dict[str, Any]:
    import gc

    import onnxruntime  # noqa: F401  (imports are not what we measure)

    import gear_runtime.backends.onnxruntime  # noqa: F401
    import gear_runtime.runtime.model  # noqa: F401
    from gear_runtime.tools.bench.context import rss_bytes

    gc.collect()
    before, reset = rss_bytes(), _reset_peak()
    held = _static_load(kind, path, threads)
    gc.collect()
    peak = _peak_rss() if reset else None
    return {"before": before, "after_runs": rss_bytes(), "peak": peak, "held": len(held)}


_STATIC_KINDS = ("static", "static-ort", "pair", "pair-ort")


def measure(kind: str, path: str, threads: int = 1) -> dict[str, Any]:
    """Run one load in a fresh subprocess; its RSS numbers (bytes)."""
    proc = subprocess.run([sys.executable, __file__, "--child", kind, path,
                           "--threads", str(threads)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if proc.returncode != 0:
        raise RuntimeError(f"memory child for {path} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(width: int = 1024, layers: int = 8, repeats: int = 3, threads: int = 1,
        verbose: bool = False) -> list[dict[str, Any]]:
    """Compile the two versions, measure each load ``repeats`` times; return run_all rows."""
    import onnx
    from bench_rows import row

    import gear_runtime as gr
    from gear_runtime.compiler import compile_model

    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        original = build_heavy_model(width, layers)
        weights = sum(np.prod(t.dims) * 4 for t in original.graph.initializer)
        src = os.path.join(tmp, "heavy.onnx")
        onnx.save(original, src)
        shape = f"x:-1,{width}"
        spec8 = gr.GearSpec.from_atc(shape, dynamic_batch_size=",".join(map(str, GEARS_8)))
        # GE refuses a spec of one gear (E10035); the 1-gear baseline is built directly.
        spec1 = gr.GearSpec("batch", ("x",), ((-1, width),), ((1,),))
        p8 = compile_model(src, spec8, os.path.join(tmp, "heavy8.gear.onnx"), progress=False)
        p1 = compile_model(src, spec1, os.path.join(tmp, "heavy1.gear.onnx"), progress=False)
        results: dict[str, list[dict[str, Any]]] = {"8": [], "1": [], "naive": []}
        for _ in range(repeats):
            results["8"].append(measure("gear", p8, threads))
            results["1"].append(measure("gear", p1, threads))
            results["naive"].append(measure("naive", src, threads))

    def delta(key: str, field: str = "after_load") -> float:
        return statistics.median(r[field] - r["before"] for r in results[key])

    d8, d1, dn = delta("8"), delta("1"), delta("naive")
    r8, r1 = delta("8", "after_runs"), delta("1", "after_runs")
    ratio = d8 / d1
    if verbose:
        print(f"weights {weights / mib:.1f} MiB; median of {repeats} fresh processes each; "
              f"RSS delta of load + create_executor:")
        print(f"  1-gear {d1 / mib:.1f} MiB, 8-gear {d8 / mib:.1f} MiB (ratio {ratio:.2f}); "
              f"8 naive ORT sessions {dn / mib:.1f} MiB ({dn / d1:.2f}x)")
        print(f"  after one run of every gear: 1-gear {r1 / mib:.1f} MiB, 8-gear "
              f"{r8 / mib:.1f} MiB")
    return [
        row("memory", f"weights of the model ({layers}x[{width},{width}] f32)",
            weights / mib, "MiB"),
        row("memory", "load RSS delta, 1-gear file", d1 / mib, "MiB"),
        row("memory", "load RSS delta, 8-gear file", d8 / mib, "MiB"),
        row("memory", "8-gear / 1-gear load RSS", ratio, "x", f"<= {MAX_RATIO}",
            ratio <= MAX_RATIO),
        row("memory", "8 naive ORT sessions / 1-gear load RSS", dn / d1, "x"),
        row("memory", "8-gear / 1-gear RSS after running every gear", r8 / r1, "x"),
    ]


def build_static_pairs(tmp: str) -> dict[str, str]:
    """causal_lm's pair at :data:`STATIC_SIZES` twice: layout name -> folder of decode.onnx,
    prefill.onnx (weights inside the .onnx, or in a data file each) and prefill.gear.onnx
    (compiled once; its weights in its data file either way, as compile writes them)."""
    import onnx

    from gear_runtime.examples import causal_lm
    from gear_runtime.tools.generate import build_pair

    inside, beside = Path(tmp, "inside"), Path(tmp, "beside")
    build_pair(inside, causal_lm.Sizes(**STATIC_SIZES))
    beside.mkdir()
    for name in ("prefill.gear.onnx", "prefill.gear.onnx.data"):
        os.link(inside / name, beside / name)
    for name in ("decode.onnx", "prefill.onnx"):
        onnx.save(onnx.load(str(inside / name)), str(beside / name), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=name + ".data", size_threshold=1024)
    return {"inside the .onnx": str(inside), "in a data file": str(beside)}


def run_static(repeats: int = 3, threads: int = 1, verbose: bool = False) -> list[dict[str, Any]]:
    """The static section (see the module doc); run_all rows."""
    from bench_rows import row

    from gear_runtime.examples import causal_lm

    mib, rows = 1 << 20, []
    weights = causal_lm.Sizes(**STATIC_SIZES).parameters() * 4 / mib
    rows.append(row("memory", "weights of the static causal LM (float32)", weights, "MiB"))
    with tempfile.TemporaryDirectory(prefix="bench-memory-static-") as tmp:
        for layout, folder in build_static_pairs(tmp).items():
            for what, ours, theirs, target in (
                    ("static decode", "static", "static-ort", STATIC_MAX_RATIO),
                    ("decode + prefill sharing weights", "pair", "pair-ort", 1.0)):
                got = {k: [measure(k, folder, threads) for _ in range(repeats)]
                       for k in (ours, theirs)}
                rows += _static_rows(f"{what}, weights {layout}", got[ours], got[theirs],
                                     target, verbose)
    return rows


def _static_rows(what: str, ours: list[dict[str, Any]], theirs: list[dict[str, Any]],
                 target: float, verbose: bool) -> list[dict[str, Any]]:
    """RSS added (median of the runs) by gear_runtime and by plain ORT, their ratio against
    ``target``, and the peaks (info)."""
    from bench_rows import row

    mib = 1 << 20

    def median(runs: list[dict[str, Any]], field: str) -> float | None:
        if any(r[field] is None for r in runs):
            return None
        return statistics.median(r[field] - r["before"] for r in runs) / mib

    a, b = median(ours, "after_runs"), median(theirs, "after_runs")
    pa, pb = median(ours, "peak"), median(theirs, "peak")
    assert a is not None and b is not None
    if verbose:
        peaks = "" if pa is None or pb is None else f" (peak {pa:.0f} vs {pb:.0f})"
        print(f"  {what}: gear_runtime {a:.0f} MiB, plain ORT {b:.0f} MiB{peaks}")
    return [row("memory", f"{what}: load + run RSS, gear_runtime", a, "MiB"),
            row("memory", f"{what}: load + run RSS, plain ORT", b, "MiB"),
            row("memory", f"{what}: gear_runtime / plain ORT", a / b, "x", f"<= {target}",
                a / b <= target),
            row("memory", f"{what}: peak RSS, gear_runtime / plain ORT",
                None if pa is None or pb is None else pa / pb, "x")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--section", choices=("gears", "static", "all"), default="all",
                        help="the 8-gear vs 1-gear loads, the static model's, or both")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], args.threads)))
        return 0
    from bench_rows import format_rows

    rows = []
    if args.section in ("gears", "all"):
        rows += run(args.width, args.layers, args.repeats, args.threads, verbose=True)
    if args.section in ("static", "all"):
        rows += run_static(args.repeats, args.threads, verbose=True)
    print()
    print(format_rows(rows))
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
