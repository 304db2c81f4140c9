"""Serving throughput and latency, side by side in one run: ``gear-runtime serve`` (HTTP with
binary tensors, HTTP with JSON, gRPC; with and without dynamic batching) against KServe's
Python ModelServer running the same ONNX model through ONNX Runtime, at concurrency 1, 8 and
32 (closed loop: each client thread sends its next request when the last is answered).

Fair by construction:

- **Compute threads matched and stated.** KServe's ModelServer runs a synchronous
  ``predict`` on its event loop, one at a time per process; gear runs ``--executors 1`` (one
  run at a time) by default, and both ONNX Runtime sessions get ``--threads`` intra-op
  threads (default 1) and one inter-op thread. ``--workers N`` adds the same with N
  processes on each side (``serve --workers N``; KServe's ``workers=N``, its REST
  multi-process server).
- **One server loaded at a time**: each round starts a server, runs its variants at every
  concurrency, stops it, then the next; the order of the servers is reversed every other
  round, and each cell reports the range over the rounds (the machine may be shared).
- **Models of realistic size by default** (built here with onnx.helper, random weights,
  batch gears 1, 2, 4, 8):
  ``bert``: a BERT-shaped encoder (benchmarks/bert_model.py), seq 128, ``--bert`` "4x768"
  (4 layers, hidden 768: 208 MB of weights, the default), "base" (12 layers, 436 MB) or
  "tiny" (2 layers, hidden 128); inputs input_ids + attention_mask, output
  last_hidden_state [seq, hidden] per row.
  ``conv``: tests/models.py's convnet on 3x64x64 images, 64 channels.

The clients are the real ``tritonclient.http`` / ``tritonclient.grpc`` (one client per
thread, batch-1 requests, closed loops). Server CPU per request is the server process tree's
user + system time over the window, divided by the requests answered. KServe runs in its own
virtual environment (``--kserve-python``, default /tmp/serve-kserve-venv/bin/python:
``python -m venv /tmp/serve-kserve-venv && /tmp/serve-kserve-venv/bin/pip install kserve
onnxruntime``); the table says so when it is not there. Needs the serve and grpc extras.

    python benchmarks/bench_serve.py [--models conv,bert] [--concurrency 1,8,32]
        [--seconds 4] [--rounds 2] [--bert 4x768|base|tiny] [--threads 1] [--executors 1]
        [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bert_model import bert_model, bert_tiny  # noqa: E402
from models import conv_model  # noqa: E402

import gear_runtime as gr  # noqa: E402

GEARS = "1,2,4,8"
SEQ = 128
KSERVE_PYTHON = "/tmp/serve-kserve-venv/bin/python"


# ---- models ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bench:
    """A benchmark model: its file names, inputs of one row, output name."""

    name: str
    onnx_path: Path
    gear_path: Path
    inputs: dict[str, np.ndarray]
    output: str


def build(directory: Path, kind: str, bert: str) -> Bench:
    """Write ``kind``'s ONNX model and its gear file (batch gears 1, 2, 4, 8)."""
    rng = np.random.default_rng(0)
    if kind == "conv":
        model = conv_model(hidden=64)
        inputs = {"data": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
        shape, output = "data:-1,3,64,64", "logits"
    else:
        model = {"tiny": lambda: bert_tiny(SEQ), "4x768": lambda: bert_model(layers=4, seq=SEQ),
                 "base": lambda: bert_model(seq=SEQ)}[bert]()
        vocab = model.graph.initializer[0].dims[0]
        inputs = {"input_ids": rng.integers(0, vocab, (1, SEQ), dtype=np.int64),
                  "attention_mask": np.ones((1, SEQ), dtype=np.int64)}
        shape, output = f"input_ids:-1,{SEQ};attention_mask:-1,{SEQ}", "last_hidden_state"
    src, out = directory / f"{kind}.onnx", directory / f"{kind}.gear.onnx"
    onnx.save(model, str(src))
    gr.compile(str(src), gr.GearSpec.from_atc(input_shape=shape, dynamic_batch_size=GEARS),
               str(out))
    return Bench(kind, src, out, inputs, output)


# ---- servers --------------------------------------------------------------------------------
KSERVE_SCRIPT = textwrap.dedent('''
    """KServe's Python ModelServer serving one ONNX model through ONNX Runtime."""
    import logging
    import sys

    import onnxruntime as ort
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

    class OrtModel(Model):
        def __init__(self, name, path, threads):
            super().__init__(name)
            self.path, self.threads = path, threads
            self.load()

        def load(self):
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = self.threads, 1
            self.session = ort.InferenceSession(self.path, options,
                                                providers=["CPUExecutionProvider"])
            self.names = [o.name for o in self.session.get_outputs()]
            self.ready = True
            return True

        # workers > 1: KServe pickles the model into each REST worker process; the
        # session is made again there
        def __getstate__(self):
            return {k: v for k, v in self.__dict__.items() if k != "session"}

        def __setstate__(self, state):
            self.__dict__.update(state)
            self.load()

        def predict(self, payload: InferRequest, headers=None, response_headers=None):
            feeds = {i.name: i.as_numpy() for i in payload.inputs}
            binary = payload.use_binary_outputs or any(
                (out.parameters or {}).get("binary_data") for out in payload.request_outputs or [])
            outputs = []
            for name, array in zip(self.names, self.session.run(None, feeds)):
                out = InferOutput(name=name, shape=list(array.shape), datatype="FP32")
                out.set_data_from_numpy(array, binary_data=binary)
                outputs.append(out)
            return InferResponse(model_name=self.name, infer_outputs=outputs,
                                 response_id=payload.id or "", use_binary_outputs=binary)

    if __name__ == "__main__":
        name, path = sys.argv[1], sys.argv[2]
        port, grpc_port, threads, workers = map(int, sys.argv[3:7])
        logging.disable(logging.INFO)  # no per-request log lines (ours writes none either)
        ModelServer(http_port=port, grpc_port=grpc_port, workers=workers,
                    enable_docs_url=False, enable_latency_logging=False
                    ).start([OrtModel(name, path, threads)])
''')


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process: gear-runtime serve, or KServe's ModelServer."""

    def __init__(self, label: str, argv: list[str], http_port: int | None = None,
                 grpc_port: int | None = None, env: dict | None = None) -> None:
        self.label = label
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                     **(env or {})})
        self.http_port, self.grpc_port = http_port, grpc_port
        self.log: list[str] = []
        if http_port is None:  # gear-runtime serve prints its ports
            line = self.proc.stdout.readline()
            self.log.append(line)
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if not match:
                self.close()
                raise SystemExit(f"{label} did not start: {line!r}")
            self.http_port = int(match.group(1))
            grpc = re.search(r"grpc 127\.0\.0\.1:(\d+)", line)
            self.grpc_port = int(grpc.group(1)) if grpc else None
        threading.Thread(target=self._drain_output, daemon=True).start()

    def _drain_output(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line)
            del self.log[:-50]

    def wait_ready(self, model: str, timeout: float = 180) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.label} exited: {''.join(self.log)[-2000:]}")
            try:
                url = f"http://127.0.0.1:{self.http_port}/v2/models/{model}/ready"
                if urllib.request.urlopen(url, timeout=5).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.label} not ready after {timeout} s")

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process and its children so far."""
        import psutil

        try:
            proc = psutil.Process(self.proc.pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def gear_server(bench: Bench, args: argparse.Namespace, *flags: str) -> Server:
    return Server(f"gear {' '.join(flags)}".strip(), [
        sys.executable, "-m", "gear_runtime.cli", "serve", str(bench.gear_path), "--name",
        bench.name, "--port", "0", "--grpc-port", "0", "--executors", str(args.executors),
        "--intra-op-threads", str(args.threads), *flags])


def kserve_server(bench: Bench, args: argparse.Namespace, directory: Path,
                  workers: int = 1) -> Server:
    script = directory / "kserve_ort.py"
    script.write_text(KSERVE_SCRIPT)
    port, grpc_port = free_port(), free_port()
    return Server("kserve", [args.kserve_python, str(script), bench.name, str(bench.onnx_path),
                             str(port), str(grpc_port), str(args.threads), str(workers)],
                  http_port=port, grpc_port=grpc_port)


# ---- clients --------------------------------------------------------------------------------
def http_caller(bench: Bench, port: int, binary: bool) -> Callable[[], Callable[[], object]]:
    import tritonclient.http as triton

    def make() -> Callable[[], object]:
        c = triton.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=300,
                                         connection_timeout=300)
        tensors = []
        for name, a in bench.inputs.items():
            t = triton.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32
                                  else "INT64")
            t.set_data_from_numpy(a, binary_data=binary)
            tensors.append(t)
        outputs = [triton.InferRequestedOutput(bench.output, binary_data=binary)]
        # a JSON body says so (KServe reads any other body as binary tensors)
        headers = None if binary else {"Content-Type": "application/json"}
        return lambda: c.infer(bench.name, tensors, outputs=outputs,
                               headers=headers).as_numpy(bench.output)

    return make


def grpc_caller(bench: Bench, port: int) -> Callable[[], Callable[[], object]]:
    import tritonclient.grpc as tgrpc

    def make() -> Callable[[], object]:
        # a channel of its own per client: grpc's global subchannel pool would otherwise put
        # every client thread on ONE connection, i.e. one worker of a --workers server
        c = tgrpc.InferenceServerClient(f"127.0.0.1:{port}", channel_args=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_send_message_length", 2**31 - 1),
            ("grpc.max_receive_message_length", 2**31 - 1)])
        tensors = []
        for name, a in bench.inputs.items():
            t = tgrpc.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32
                                 else "INT64")
            t.set_data_from_numpy(a)
            tensors.append(t)
        return lambda: c.infer(bench.name, tensors).as_numpy(bench.output)

    return make


@dataclass
class Cell:
    """One variant at one concurrency: a measurement per round."""

    rate: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    errors: int = 0


def drive(make: Callable[[], Callable[[], object]], threads: int, seconds: float,
          server: Server) -> tuple[float, np.ndarray, float, int]:
    """``threads`` closed-loop clients for ``seconds``: (rows/s, latencies, server CPU
    seconds per request, errors)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def run(k: int) -> None:
        call = make()  # in the thread that uses it (tritonclient.http's gevent hub is per thread)
        call()  # warm: its connection, first requests
        start.wait()
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            try:
                call()
            except Exception as exc:
                errors[k] += 1
                if errors[k] == 1:
                    print(f"  error: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                continue
            latencies[k].append(time.perf_counter() - t0)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    stop_at[0] = time.perf_counter() + 3600  # until every thread is warm
    start.wait()
    cpu0 = server.cpu_seconds()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    flat = np.array([x for lat in latencies for x in lat])
    n = max(1, len(flat))
    return len(flat) / wall, flat, cpu / n, sum(errors)


# ---- the run --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """A server to start and the variants (label, transport) measured on it."""

    name: str
    start: Callable[[], Server]
    variants: tuple[tuple[str, str], ...]


def configs(bench: Bench, args: argparse.Namespace, directory: Path) -> list[Config]:
    """Every server of the run: gear (batching, and not), KServe, and with ``--workers`` both
    again with that many processes."""
    delay = ("--max-batch-delay-ms", str(args.max_batch_delay_ms))
    three = (("HTTP binary", "binary"), ("HTTP JSON", "json"), ("gRPC", "grpc"))
    out = [Config("gear", lambda: gear_server(bench, args, *delay),
                  tuple((f"gear {t}", k) for t, k in three)),
           Config("gear-nobatch", lambda: gear_server(bench, args, "--no-batching"),
                  (("gear HTTP binary, no batching", "binary"),
                   ("gear gRPC, no batching", "grpc")))]
    kserve = Path(args.kserve_python).exists()
    if kserve:
        out.append(Config("kserve", lambda: kserve_server(bench, args, directory),
                          tuple((f"KServe {t}", k) for t, k in three)))
    if args.workers > 1:
        w = args.workers
        out.append(Config("gear-workers", lambda: gear_server(bench, args, *delay, "--workers",
                                                              str(w)),
                          ((f"gear --workers {w} HTTP binary", "binary"),
                           (f"gear --workers {w} gRPC", "grpc"))))
        if kserve:
            out.append(Config("kserve-workers",
                              lambda: kserve_server(bench, args, directory, w),
                              ((f"KServe workers={w} HTTP binary", "binary"),
                               (f"KServe workers={w} gRPC", "grpc"))))
    return out


def caller(bench: Bench, server: Server, transport: str) -> Callable:
    if transport == "grpc":
        return grpc_caller(bench, server.grpc_port)
    return http_caller(bench, server.http_port, transport == "binary")


def rng_text(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return (fmt % lo) if fmt % lo == fmt % hi else f"{fmt % lo}-{fmt % hi}"


def round_table(labels: list[str], rows: dict[tuple[str, ...], list[tuple[float, ...]]],
                fields: list[tuple[str, str]]) -> str:
    """A markdown table: per row its labels, then per field (name, format) the range of
    that field over the row's rounds (``rows``: labels -> one tuple per round)."""
    lines = ["| " + " | ".join([*labels, *(name for name, _ in fields)]) + " |",
             "|" + "---|" * (len(labels) + len(fields))]
    for key, cells in rows.items():
        ranges = [rng_text([c[i] for c in cells], fmt) for i, (_, fmt) in enumerate(fields)]
        lines.append("| " + " | ".join([*key, *ranges]) + " |")
    return "\n".join(lines)


def run_model(kind: str, args: argparse.Namespace, directory: Path) -> None:
    bench = build(directory, kind, args.bert)
    size_mb = sum(t.nbytes for t in bench_weights(bench)) / 1e6
    plan = configs(bench, args, directory)
    labels = [label for config in plan for label, _ in config.variants]
    cells = {(label, c): Cell() for label in labels for c in args.concurrency}
    for round_ in range(args.rounds):
        for config in (plan if round_ % 2 == 0 else plan[::-1]):
            server = config.start()  # one server loaded at a time
            try:
                server.wait_ready(bench.name)
                for c in args.concurrency:
                    for label, transport in config.variants:
                        rate, lat, cpu, errors = drive(caller(bench, server, transport), c,
                                                       args.seconds, server)
                        cell = cells[(label, c)]
                        cell.rate.append(rate)
                        if len(lat):
                            cell.p50.append(np.percentile(lat, 50) * 1e3)
                            cell.p99.append(np.percentile(lat, 99) * 1e3)
                        cell.cpu.append(cpu * 1e3)
                        cell.errors += errors
                        print(f"  [{kind} round {round_ + 1} c={c}] {label}: {rate:.0f} rows/s",
                              file=sys.stderr, flush=True)
            finally:
                server.close()
    load = os.getloadavg()
    versions = ort_versions(args.kserve_python)
    kserve_note = "" if Path(args.kserve_python).exists() else \
        f" (KServe not run: {args.kserve_python} is not there)"
    what = f"bert {args.bert}" if kind == "bert" else "convnet 3x64x64"
    size = f"{size_mb:.0f} MB" if size_mb >= 10 else f"{size_mb * 1e3:.0f} kB"
    print(f"\n{what}, {size} of weights: batch-1 requests, gears {GEARS}; compute "
          f"threads matched: gear {args.executors} executor(s), KServe one predict at a time, "
          f"per process, each session {args.threads} intra-op thread(s); {args.seconds:g} s "
          f"windows x {args.rounds} rounds, one server at a time (ranges over rounds), load "
          f"average {load[0]:.1f}{kserve_note}; {versions}")
    print("| concurrency | server | rows/s | p50 ms | p99 ms | server CPU ms/request | errors |")
    print("|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        for label in labels:
            cell = cells[(label, c)]
            print(f"| {c} | {label} | {rng_text(cell.rate, '%.0f')} | "
                  f"{rng_text(cell.p50, '%.2f')} | {rng_text(cell.p99, '%.2f')} | "
                  f"{rng_text(cell.cpu, '%.2f')} | {cell.errors} |", flush=True)


def ort_versions(kserve_python: str) -> str:
    """Which ONNX Runtime each side runs (a different release alone moves a BERT's latency
    by 5-10% on one CPU: both should be the same for the figures to compare)."""
    import onnxruntime

    ours = onnxruntime.__version__
    if not Path(kserve_python).exists():
        return f"onnxruntime {ours}"
    theirs = subprocess.run([kserve_python, "-c", "import onnxruntime; "
                             "print(onnxruntime.__version__)"], capture_output=True,
                            text=True, check=False).stdout.strip() or "?"
    same = "the same on both sides" if theirs == ours else \
        f"KServe's venv has {theirs}: NOT the same, the figures do not compare"
    return f"onnxruntime {ours} ({same})"


def bench_weights(bench: Bench) -> list[np.ndarray]:
    from onnx import numpy_helper

    model = onnx.load(str(bench.onnx_path))
    return [numpy_helper.to_array(t) for t in model.graph.initializer]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="conv,bert", help="conv, bert or both")
    parser.add_argument("--concurrency", default="1,8,32",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=4.0, help="per window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--executors", type=int, default=1,
                        help="gear's executors per model (1 matches KServe's one predict "
                        "at a time)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of each ONNX Runtime session, both servers")
    parser.add_argument("--workers", type=int, default=2,
                        help="also run both servers with this many processes (1: not)")
    parser.add_argument("--max-batch-delay-ms", default="2")
    parser.add_argument("--bert", choices=("4x768", "base", "tiny"), default="4x768")
    parser.add_argument("--kserve-python", default=KSERVE_PYTHON)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            run_model(kind, args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
