"""Serving throughput and latency: the v2 server with and without dynamic batching, against
direct in-process ``execute`` calls, in one run (ratios against direct).

A batch-mode model (batch gears 1, 2, 4, 8: a conv net on 3x64x64 images, and a 16 MiB
MLP of width 1024) gets batch-1 requests from ``--clients``
client threads (one ``tritonclient.http`` client each, binary tensors) against
``gear-runtime serve`` in a process of its own on 127.0.0.1 (a free port). "direct" is the
same requests as ``execute`` calls on ``--executors`` threads with an executor each (no HTTP,
no batching): the runtime alone; "direct, batches of 8" runs the same rows 8 per call (what
batching can reach at best). Needs the serve extra and tritonclient.

    python benchmarks/bench_serve.py [--models conv,mlp] [--clients 32] [--requests 1024]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from models import conv_model, heavy_model  # noqa: E402

import gear_runtime as gr  # noqa: E402

#: name -> (builder, input name, row shape, output name)
MODELS = {
    "conv": (lambda: conv_model(hidden=64, classes=100), "data", (3, 64, 64), "logits"),
    "mlp": (lambda: heavy_model(width=1024, layers=4), "x", (1024,), "y"),
}
GEARS = "1,2,4,8"


def build(directory: Path, kind: str) -> Path:
    builder, name, row, _ = MODELS[kind]
    onnx.save(builder(), str(directory / f"{kind}.onnx"))
    out = directory / f"{kind}.gear.onnx"
    spec = gr.GearSpec.from_atc(input_shape=f"{name}:-1,{','.join(map(str, row))}",
                                dynamic_batch_size=GEARS)
    gr.compile(str(directory / f"{kind}.onnx"), spec, str(out))
    return out


def inputs(kind: str, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, *MODELS[kind][2])).astype(np.float32) for _ in range(n)]


def drive(threads: int, xs: list[np.ndarray], make: Callable[[], Callable[[np.ndarray], object]]
          ) -> tuple[float, np.ndarray]:
    """``threads`` threads share ``xs``; each calls ``make()`` once, then its call per input.
    Returns (wall seconds, per-request latencies in seconds)."""
    latencies = np.zeros(len(xs))
    start = threading.Barrier(threads + 1)

    def run(k: int) -> None:
        call = make()
        start.wait()
        for i in range(k, len(xs), threads):
            t0 = time.perf_counter()
            call(xs[i])
            latencies[i] = time.perf_counter() - t0

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - t0, latencies


def direct(path: Path, executors: int, xs: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """``execute`` per request on ``executors`` threads."""
    model = gr.load(str(path))

    def make() -> Callable[[np.ndarray], object]:
        ex = model.create_executor()
        return lambda x: ex.execute([x])

    try:
        drive(executors, xs[: len(xs) // 8], make)  # warm-up
        return drive(executors, xs, make)
    finally:
        model.close()


def direct_batched(path: Path, executors: int, xs: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """The same rows, 8 per ``execute`` (the largest gear): latency per call."""
    batches = [np.concatenate(xs[i:i + 8]) for i in range(0, len(xs) - 7, 8)]
    return direct(path, executors, batches)


class Server:
    """``gear-runtime serve`` in a subprocess on a free 127.0.0.1 port."""

    def __init__(self, path: Path, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gear_runtime.cli", "serve", str(path), "--port", "0",
             "--host", "127.0.0.1", *flags], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not match:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {line!r}")
        self.url = f"127.0.0.1:{match.group(1)}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def served(path: Path, kind: str, clients: int, xs: list[np.ndarray], *flags: str
           ) -> tuple[float, np.ndarray, str]:
    import tritonclient.http as triton

    server = Server(path, *flags)
    _, name, _, output = MODELS[kind]

    def make() -> Callable[[np.ndarray], object]:
        c = triton.InferenceServerClient(server.url, network_timeout=120)

        def call(x: np.ndarray) -> object:
            t = triton.InferInput(name, list(x.shape), "FP32")
            t.set_data_from_numpy(x, binary_data=True)
            return c.infer(kind, [t]).as_numpy(output)

        return call

    try:
        drive(clients, xs[: len(xs) // 8], make)  # warm-up
        wall, lat = drive(clients, xs, make)
        return wall, lat, batches(server.url, kind)
    finally:
        server.close()


def batches(url: str, kind: str) -> str:
    """The batches formed per gear, from /metrics (e.g. "8:120 4:3")."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    found = re.findall(rf'^gear_batches_total\{{gear="(\d+)",model="{kind}"\}} (\S+)', text,
                       re.M)
    return " ".join(f"{g}:{float(n):.0f}" for g, n in sorted(found, key=lambda x: -int(x[0])))


def table(kind: str, args: argparse.Namespace, directory: Path) -> None:
    """Run every mode on model ``kind`` and print its table."""
    xs = inputs(kind, args.requests)
    path = build(directory, kind)
    ex = ("--executors", str(args.executors))
    wall, lat = direct_batched(path, args.executors, xs)
    rows = [("direct execute (in process)", *direct(path, args.executors, xs), "-"),
            ("direct execute, batches of 8", wall / 1, lat, "8 rows per call"),
            ("server, no batching", *served(path, kind, args.clients, xs, *ex,
                                            "--no-batching")),
            (f"server, batching ({args.max_batch_delay_ms} ms)",
             *served(path, kind, args.clients, xs, *ex, "--max-batch-delay-ms",
                     args.max_batch_delay_ms))]
    base = args.requests / rows[0][1]
    print(f"\n{kind}: {args.requests} batch-1 requests, gears {GEARS}, {args.executors} "
          f"executors, {args.clients} client threads (server rows)")
    print("| mode | rows/s | vs direct | p50 ms | p99 ms | batches (gear:count) |")
    print("|---|---|---|---|---|---|")
    for name, wall, lat, formed in rows:
        rate = args.requests / wall
        print(f"| {name} | {rate:.0f} | {rate / base:.2f}x | {np.percentile(lat, 50) * 1e3:.2f}"
              f" | {np.percentile(lat, 99) * 1e3:.2f} | {formed} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="conv,mlp", help="conv, mlp or both (default)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--max-batch-delay-ms", default="2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            table(kind, args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
