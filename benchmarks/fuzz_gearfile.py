"""Fuzz a gear file and its data file: random byte flips, truncations and insertions.

Every mutated model is inspected (``describe``: read + every digest checked), loaded on the
null backend and on ONNX Runtime, and run on one fixed input. An outcome is one of:

* ``refused``: a ``GearRuntimeError`` subclass (the contract for a bad file);
* ``same``: it loaded and its outputs equal the original's bit for bit;
* ``different``: outputs differ with no error (a silent wrong answer: must be 0 in ``raw``);
* ``other``: any other exception (must be 0); ``crash`` / ``hang``: the worker process died
  or stalled on that mutation (must be 0); counted, not fatal: mutations run in subprocess
  batches and a batch resumes after the one that killed its worker.

Two modes: ``raw`` mutates the files as a disk fault would (the digests must catch what the
parser lets through); ``resealed`` mutates the gear file and then recomputes its digest
record, as someone crafting a file would, so the reader's own checks are what is tested
(outputs may then differ legitimately: the file says so; never any other exception).

    python benchmarks/fuzz_gearfile.py --count 5000 --seed 1 [--batch 250] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODES = ("raw", "resealed")
KINDS = ("flip", "truncate", "insert")
TARGETS = ("gear", "data")
GEAR, DATA = "m.gear.onnx", "m.gear.onnx.data"


def source_model() -> onnx.ModelProto:
    """A small MLP: two weights big enough for the data file, one bias kept inline."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "w2")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["z"], name="mm2"),
             helper.make_node("Add", ["z", "b"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w1, w2, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def build(folder: Path) -> tuple[bytes, bytes]:
    """Compile the model into ``folder`` with its weights in a data file; return both files."""
    import gear_runtime as gr

    spec = gr.GearSpec.from_atc(input_shape="x:-1,16", dynamic_batch_size="1,2,4")
    gr.compile(source_model(), spec, str(folder / GEAR), progress=False, external_data=True)
    return (folder / GEAR).read_bytes(), (folder / DATA).read_bytes()


def feeds() -> dict[str, np.ndarray]:
    return {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)}


def mutate(rng: random.Random, blob: bytes, kind: str) -> bytes:
    """One random flip (a byte XOR a non-zero value), truncation or insertion of 1-16 bytes."""
    data = bytearray(blob)
    at = rng.randrange(len(data))
    if kind == "flip":
        data[at] ^= rng.randrange(1, 256)
    elif kind == "truncate":
        del data[at:]
    else:
        data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 17)))
    return bytes(data)


def reseal_bytes(blob: bytes, original: bytes) -> bytes:
    """``blob`` with its digest record recomputed (when the record survived the mutation)."""
    from gear_runtime.gearfile.digest import digest_placeholder, seal_digest
    from gear_runtime.gearfile.digest import parse_digest as parse
    from gear_runtime.gearfile.format import META_DIGEST

    text = next(p.value for p in onnx.load_from_string(original).metadata_props
                if p.key == META_DIGEST)
    _, graph, data = parse(text)
    placeholder = digest_placeholder(graph, data)
    if blob.count(text.encode()) != 1:
        return blob
    return seal_digest(blob.replace(text.encode(), placeholder.encode()), placeholder)


def plan(seed: int, count: int) -> list[tuple[str, str, str]]:
    """(mode, target, kind) of every mutation; mutation i's bytes come from ``seed`` + i."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        mode = rng.choice(MODES)
        target = "gear" if mode == "resealed" else rng.choice(TARGETS)
        out.append((mode, target, rng.choice(KINDS)))
    return out


def run_one(folder: Path, files: tuple[bytes, bytes], want: list[np.ndarray], seed: int,
            index: int, job: tuple[str, str, str]) -> dict:
    """Apply mutation ``index`` in ``folder`` and classify what the runtime does with it."""
    import gear_runtime as gr
    from gear_runtime.tools.check.inspect import describe

    mode, target, kind = job
    rng = random.Random(seed * 1_000_003 + index)
    gear, data = files
    if target == "gear":
        gear = mutate(rng, gear, kind)
        if mode == "resealed":
            gear = reseal_bytes(gear, files[0])
    else:
        data = mutate(rng, data, kind)
    (folder / GEAR).write_bytes(gear)
    (folder / DATA).write_bytes(data)
    result = {"i": index, "mode": mode, "target": target, "kind": kind}
    stage = "inspect"
    try:
        describe(folder / GEAR)
        stage = "null"
        gr.load(str(folder / GEAR), backend="null").close()
        stage = "onnxruntime"
        model = gr.load(str(folder / GEAR))
        try:
            got = model.create_executor().execute(feeds())
        finally:
            model.close()
        same = len(got) == len(want) and all(
            g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
            for g, w in zip(got, want, strict=False))
        result["outcome"] = "same" if same else "different"
    except gr.GearRuntimeError as exc:
        by = "digest" if "digest mismatch" in str(exc) or "bytes, compile wrote" in str(exc) \
            else "check"
        result.update(outcome="refused", stage=stage, error=f"{type(exc).__name__}({by})")
    except Exception as exc:  # what the fuzz hunts: any exception outside the hierarchy
        result.update(outcome="other", stage=stage, error=f"{type(exc).__name__}: {exc}"[:300],
                      trace=traceback.format_exc(limit=6)[-1500:])
    return result


def worker(folder: Path, seed: int, start: int, stop: int, count: int) -> None:
    """Run mutations [start, stop) in this process; one JSON line each on stdout."""
    import gear_runtime as gr

    files = ((folder / "orig" / GEAR).read_bytes(), (folder / "orig" / DATA).read_bytes())
    model = gr.load(str(folder / "orig" / GEAR))
    want = model.create_executor().execute(feeds())
    model.close()
    jobs = plan(seed, count)
    work = folder / f"w{start}"
    work.mkdir(exist_ok=True)
    for i in range(start, stop):
        print(json.dumps(run_one(work, files, want, seed, i, jobs[i])), flush=True)


def run_batches(seed: int, count: int, batch: int, timeout: float) -> list[dict]:
    """Every mutation, in worker subprocesses of ``batch`` mutations; a worker that dies or
    stalls has its current mutation counted as ``crash`` / ``hang`` and the rest resumed."""
    results: list[dict] = []
    jobs = plan(seed, count)
    with tempfile.TemporaryDirectory(prefix="gear-fuzz-") as tmp:
        folder = Path(tmp)
        (folder / "orig").mkdir()
        build(folder / "orig")
        start = 0
        while start < count:
            stop = min(start + batch, count)
            cmd = [sys.executable, __file__, "--worker", str(folder), "--seed", str(seed),
                   "--start", str(start), "--stop", str(stop), "--count", str(count)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                lines, failed = proc.stdout.splitlines(), proc.returncode != 0 and "crash"
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout or b""
                lines = (out.decode() if isinstance(out, bytes) else out).splitlines()
                failed = "hang"
            done = [json.loads(line) for line in lines if line.startswith("{")]
            results += done
            start += len(done)
            if start < stop and failed:
                mode, target, kind = jobs[start]
                results.append({"i": start, "mode": mode, "target": target, "kind": kind,
                                "outcome": failed})
                start += 1
    return results


def summary(results: list[dict]) -> dict:
    """Counts by mode and outcome, refusals by stage, and the first few bad cases."""
    by = Counter(f"{r['mode']}/{r['outcome']}" for r in results)
    stages = Counter(f"{r['mode']}/{r.get('stage')}/{r.get('error')}" for r in results
                     if r["outcome"] == "refused")
    bad = [r for r in results if r["outcome"] in ("other", "crash", "hang")
           or (r["mode"] == "raw" and r["outcome"] == "different")]
    return {"mutations": len(results), "outcomes": dict(sorted(by.items())),
            "refused_by": dict(stages.most_common()), "bad": len(bad), "bad_examples": bad[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per batch")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker), args.seed, args.start, args.stop, args.count)
        return 0
    t0 = time.perf_counter()
    report = summary(run_batches(args.seed, args.count, args.batch, args.timeout))
    report["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 1 if report["bad"] else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
