"""What the serving tests share: compiled test models, a live server in a thread, raw HTTP,
the Prometheus scrape, and ``gear-runtime serve`` as a subprocess."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from models import conv_model

import gear_runtime as gr
from gear_runtime.examples import prefill

HOST = "127.0.0.1"
CONV_SPEC = {"input_shape": "data:-1,3,8,8", "dynamic_batch_size": "1,2,4,8"}
CONV_GEARS = (1, 2, 4, 8)


def compile_models(directory: Path) -> dict[str, Path]:
    """The conv model (batch gears 1, 2, 4, 8) and the prefill example, compiled."""
    onnx.save(conv_model(), str(directory / "conv.onnx"))
    gr.compile(str(directory / "conv.onnx"), gr.GearSpec.from_atc(**CONV_SPEC),
               str(directory / "conv.gear.onnx"))
    model_path, config_path = prefill.write_example(directory)
    gr.compile(str(model_path), gr.GearSpec.from_config(str(config_path)),
               str(directory / "prefill.gear.onnx"))
    return {"conv": directory / "conv.gear.onnx", "prefill": directory / "prefill.gear.onnx"}


def conv_input(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 8, 8)).astype(np.float32)


@dataclass
class Live:
    """A server running in a thread: its ports, its HTTP server object, its loop."""

    port: int
    grpc_port: int | None
    http: object
    loop: asyncio.AbstractEventLoop

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the server's loop and return its result."""
        done = threading.Event()
        out: list = []
        self.loop.call_soon_threadsafe(lambda: (out.append(fn(*args)), done.set()))
        assert done.wait(30)
        return out[0]


@contextmanager
def live(server, *, limits=None, grpc: bool = False, drain_s: float = 5.0) -> Iterator[Live]:
    """Serve ``server`` (gear_runtime.serving.serve) on a free 127.0.0.1 port in a thread
    with its own event loop; yields the Live server, stops (drains) it after."""
    from gear_runtime.serving import listen, serve
    from gear_runtime.serving.lifecycle import new_loop

    sock = listen(HOST, 0)
    loop = new_loop()
    started = threading.Event()
    state: dict = {}

    async def main() -> None:
        state["stop"] = asyncio.Event()
        try:
            await serve(server, sock, limits=limits, drain_s=drain_s, stop=state["stop"],
                        grpc=(HOST, 0) if grpc else None,
                        on_started=lambda r: (state.update(running=r), started.set()))
        except BaseException as exc:
            state["error"] = exc
            started.set()
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(60), "server did not start"
    if "error" in state:
        raise state["error"]
    running = state["running"]
    grpc_port = running.grpc_address[1] if running.grpc_address else None
    try:
        yield Live(running.http_address[1], grpc_port, running.http, loop)
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(60)
        sock.close()
        loop.close()


def request(port: int, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP request (status, headers, body): what a non-triton client sends."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def read_reply(sock, timeout: float = 30) -> bytes:
    """Read one whole HTTP response from a raw socket: headers, then Content-Length bytes
    (never one recv: a reply may arrive in pieces)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"content-length: *(\d+)", head, re.I)
    want = int(match.group(1)) if match else 0
    while len(body) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    status, _, body = request(port, "GET", "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def wait_for_queue(port: int, model: str, depth: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while metrics(port).get(("gear_queue_depth", (("model", model),)), 0) < depth:
        assert time.monotonic() < deadline, "requests never queued"
        time.sleep(0.02)


class ServeProcess:
    """``gear-runtime serve`` in a process of its own on a free 127.0.0.1 port."""

    def __init__(self, args: Sequence[str], timeout: float = 60) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gear_runtime.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = _read_line(self.proc, timeout)
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        self.port = int(match.group(1))
        grpc = re.search(r"grpc 127\.0\.0\.1:(\d+)", line)
        self.grpc_port = int(grpc.group(1)) if grpc else None

    def stop(self, timeout: float = 60) -> tuple[int, str, str]:
        """SIGTERM, wait: (exit code, stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.kill()
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not out or not out[0]:
        proc.kill()
        raise AssertionError(f"no start line; stderr: {proc.stderr.read()[-2000:]}")
    return out[0]


def prefill_inputs(spec, gear: int, seed: int) -> dict[str, np.ndarray]:
    return prefill.example_inputs(spec, gear, seed=seed)
