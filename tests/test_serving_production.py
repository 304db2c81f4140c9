"""The server as an operator and an adversary see it: latency at concurrency 1 (TCP_NODELAY,
an idle batcher that does not wait), SIGTERM with many requests on the wire (none left
unanswered), an inflating body refused while health stays responsive, slow clients cut off,
a connection limit answered 503, malformed requests answered 4xx (never 500, never a
traceback), disconnects counted apart, and the CLI's serve refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import signal
import socket
import statistics
import struct
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("httptools")
pytest.importorskip("orjson")
pytest.importorskip("prometheus_client")
triton = pytest.importorskip("tritonclient.http")

from serving_support import (  # noqa: E402
    HOST,
    ServeProcess,
    compile_models,
    conv_input,
    live,
    metrics,
    read_reply,
    request,
    wait_for_queue,
)

import gear_runtime as gr  # noqa: E402
from gear_runtime.serving import HttpLimits, ServeOptions, build_server  # noqa: E402
from gear_runtime.serving.protocol import decode_request  # noqa: E402

#: the wide model: y = Relu(x), x float32 [N, WIDE], batch gears 1, 2, 4, 8 (98,304 values in
#: its largest request, as the issue's model)
WIDE = 12288


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("production")
    found = compile_models(directory)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDE])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(directory / "wide.onnx"))
    gr.compile(str(directory / "wide.onnx"),
               gr.GearSpec.from_atc(input_shape=f"x:-1,{WIDE}", dynamic_batch_size="1,2,4,8"),
               str(directory / "wide.gear.onnx"))
    return {**found, "wide": directory / "wide.gear.onnx"}


def _conv_body(batch: int = 1) -> bytes:
    x = conv_input(batch, seed=batch)
    return json.dumps({"inputs": [{"name": "data", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()


def _raw_request(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def _exited(server: ServeProcess, timeout: float = 60) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) once the server exits on its own, after the SIGTERMs the
    test sent: ``server.stop()`` would send one more where the exit is slow (a loaded
    machine), and a SIGTERM after the server closed (its handlers gone) kills it (-15)."""
    try:
        out, err = server.proc.communicate(timeout=timeout)
    finally:
        server.kill()
    return server.proc.returncode, out, err


def _until(check, timeout: float = 20) -> None:
    """Wait until ``check()`` holds (not a fixed sleep: a loaded machine is slower)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never came to pass"
        time.sleep(0.02)


def _binary_latency(port: int, n: int = 150) -> list[float]:
    """Seconds per tritonclient binary request at concurrency 1 (after a warm-up)."""
    c = triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60)
    x = conv_input(1, seed=1)
    t = triton.InferInput("data", [1, 3, 8, 8], "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    out = [triton.InferRequestedOutput("logits", binary_data=True)]
    for _ in range(20):
        c.infer("conv", [t], outputs=out)
    seconds = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.infer("conv", [t], outputs=out)
        seconds.append(time.perf_counter() - t0)
    c.close()
    return seconds


# ---- latency floor ----------------------------------------------------------------------------
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tcp_nodelay_on_every_connection(files, loop, monkeypatch) -> None:
    """Every accepted connection has TCP_NODELAY, on asyncio's loop (which sets it only for
    sockets whose proto says TCP) and on uvloop's."""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    else:
        from gear_runtime.serving import lifecycle

        monkeypatch.setattr(lifecycle, "new_loop", asyncio.new_event_loop)
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with live(server) as running:
        socks = [socket.create_connection((HOST, running.port)) for _ in range(3)]
        for s in socks:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(s).startswith(b"HTTP/1.1 200")
        flags = running.call(lambda: [
            c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                            socket.TCP_NODELAY)
            for c in running.http.connections])
        for s in socks:
            s.close()
    assert len(flags) == 3 and all(flags), flags


@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no-batching"])
def test_concurrency_1_latency_on_a_tiny_model(files, batching) -> None:
    """A 0.06 ms model at concurrency 1, binary tensors over loopback: far below the ~40 ms
    of a Nagle / delayed-ACK stall (a loose bound: the CI machine is shared and noisy)."""
    server = ServeProcess([str(files["conv"]), "--executors", "1", "--max-batch-delay-ms",
                           "5", *([] if batching else ["--no-batching"])])
    try:
        seconds = _binary_latency(server.port)
    finally:
        server.stop()
    p50 = statistics.median(seconds)
    assert p50 < 0.015, f"p50 {p50 * 1e3:.1f} ms"
    assert sorted(seconds)[len(seconds) * 9 // 10] < 0.035, "p90 of a Nagle stall"


def test_an_idle_batcher_does_not_wait_out_its_delay(files) -> None:
    """A lone request to an idle batcher with a 2 s delay is answered at once; asked to
    (--batch-wait-when-idle), it waits."""
    x = {"data": conv_input(1, 3)}
    for wait, low, high in ((False, 0.0, 1.0), (True, 1.9, 30.0)):
        server = build_server([str(files["conv"])], options=ServeOptions(
            executors=1, max_batch_delay_ms=2000, batch_wait_when_idle=wait))
        with live(server) as running:
            c = triton.InferenceServerClient(f"{HOST}:{running.port}", network_timeout=60)
            t = triton.InferInput("data", [1, 3, 8, 8], "FP32")
            t.set_data_from_numpy(x["data"])
            t0 = time.perf_counter()
            c.infer("conv", [t])
            took = time.perf_counter() - t0
        assert low <= took < high, (wait, took)


def test_no_thread_spins_between_requests(files) -> None:
    """Requests 20 ms apart (a client's think time): the server burns little CPU per request.
    ORT's intra-op threads spin-wait for work by default (~10 ms of CPU per request here);
    the server turns that off (session.intra_op.allow_spinning=0; --spin turns it on)."""
    psutil = pytest.importorskip("psutil")
    server = ServeProcess([str(files["conv"]), "--executors", "1"])
    try:
        c = triton.InferenceServerClient(f"{HOST}:{server.port}", network_timeout=60)
        t = triton.InferInput("data", [1, 3, 8, 8], "FP32")
        t.set_data_from_numpy(conv_input(1, 0))
        for _ in range(20):
            c.infer("conv", [t])
        proc = psutil.Process(server.proc.pid)
        before, n = proc.cpu_times(), 40
        for _ in range(n):
            c.infer("conv", [t])
            time.sleep(0.02)
        after = proc.cpu_times()
    finally:
        server.stop()
    per_request = ((after.user + after.system) - (before.user + before.system)) / n
    assert per_request < 0.006, f"{per_request * 1e3:.1f} ms of CPU per request"


# ---- nothing accepted is lost -----------------------------------------------------------------
def _sigterm_after_requests(args: list[str], count: int) -> tuple[list[bytes], tuple]:
    """Serve ``args``, put ``count`` complete infer requests on the wire (a connection
    each), SIGTERM the server: every connection's reply, and ``server.stop()``'s result."""
    server = ServeProcess(args)
    socks = []
    try:
        body = _conv_body(1)
        for _ in range(count):
            s = socket.create_connection((HOST, server.port), timeout=60)
            s.sendall(_raw_request("/v2/models/conv/infer", body))
            socks.append(s)
        server.proc.send_signal(signal.SIGTERM)
        replies = [read_reply(s, timeout=60) for s in socks]
        return replies, _exited(server)
    finally:
        for s in socks:
            s.close()
        server.kill()


def test_sigterm_with_many_requests_on_the_wire_answers_every_one(files) -> None:
    """200 complete requests on the wire (many still in the accept queue), then SIGTERM:
    every one gets a whole HTTP answer (200, or 503 + Retry-After), then exit 0."""
    replies, (code, out, err) = _sigterm_after_requests(
        [str(files["conv"]), "--executors", "1", "--max-batch-delay-ms", "50"], 200)
    statuses = [r.split(b" ", 2)[1] if r.startswith(b"HTTP/1.1 ") else r[:40] for r in replies]
    assert all(s in (b"200", b"503") for s in statuses), statuses
    for r in replies:
        head, _, payload = r.partition(b"\r\n\r\n")
        if b" 503 " in head.split(b"\r\n")[0]:
            assert b"retry-after: 1" in head.lower()
        else:
            assert json.loads(payload)["outputs"][0]["shape"] == [1, 10]
    assert code == 0, err
    assert "server stopped" in out


def test_requests_received_while_draining_are_answered(files) -> None:
    """Round 3's F6: SIGTERM starts the drain, and what arrives before the deadline is
    answered (200), not refused with 503 from the first millisecond."""
    replies, (code, _, err) = _sigterm_after_requests(
        [str(files["conv"]), "--executors", "1", "--drain-seconds", "30"], 20)
    statuses = [r.split(b" ", 2)[1] for r in replies]
    assert statuses == [b"200"] * 20, statuses
    assert code == 0, err


def test_the_drain_deadline_answers_503_and_exits(files) -> None:
    """Past --drain-seconds, requests still waiting are answered 503 + Retry-After."""
    server = ServeProcess([str(files["conv"]), "--executors", "1", "--max-batch-delay-ms",
                           "60000", "--batch-wait-when-idle", "--drain-seconds", "0.5"])
    socks = []
    try:
        for _ in range(3):
            s = socket.create_connection((HOST, server.port), timeout=60)
            s.sendall(_raw_request("/v2/models/conv/infer", _conv_body(1)))
            socks.append(s)
        wait_for_queue(server.port, "conv", 3)  # they wait in the batcher (60 s delay)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        replies = [read_reply(s, timeout=30) for s in socks]
        code, out, _ = _exited(server)
        took = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
        server.kill()
    for r in replies:
        assert r.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in r.lower(), r[:200]
    assert code == 0 and took < 20 and "drain deadline" in out


# ---- no client stalls the others --------------------------------------------------------------
def _health_latency_while(port: int, work: threading.Thread) -> float:
    """The slowest /v2/health/live answer while ``work`` runs."""
    worst = 0.0
    work.start()
    while work.is_alive():
        t0 = time.perf_counter()
        status, _, _ = request(port, "GET", "/v2/health/live")
        assert status == 200
        worst = max(worst, time.perf_counter() - t0)
        time.sleep(0.01)
    work.join()
    return worst


def test_an_inflating_body_is_refused_while_health_stays_responsive(files) -> None:
    """4 clients at once send 57 KiB of gzip that inflates to a 57 MiB JSON array (for a
    model whose largest request holds 98k values): each is a 413 at once, and health
    answers within a second meanwhile; the largest legal JSON requests are decoded off the
    event loop too."""
    values = b"[" + b"0.5," * (15 * 2**20 // 4) + b"0.5]"
    doc = b'{"inputs":[{"name":"x","shape":[8,%d],"datatype":"FP32","data":' % WIDE
    bomb = gzip.compress(doc + values + b"}]}", 9)
    assert len(bomb) < 200 * 2**10
    legal = json.dumps({"inputs": [{"name": "x", "shape": [8, WIDE], "datatype": "FP32",
                                    "data": [-2.2250738585072014e-308] * (8 * WIDE)}]}).encode()
    server = build_server([str(files["wide"])], options=ServeOptions(executors=2))
    with live(server) as running:
        p = running.port
        results: list = []

        def send(body: bytes, headers: dict) -> None:
            t0 = time.perf_counter()
            status, _, reply = request(p, "POST", "/v2/models/wide/infer", body, headers)
            results.append((status, time.perf_counter() - t0, reply))

        def bombs() -> None:
            threads = [threading.Thread(target=send, args=(bomb, {"Content-Encoding": "gzip"}))
                       for _ in range(4)]
            threads += [threading.Thread(target=send, args=(legal, {})) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)

        worst = _health_latency_while(p, threading.Thread(target=bombs))
    refused = [r for r in results if r[0] == 413]
    served = [r for r in results if r[0] == 200]
    assert len(refused) == 4 and len(served) == 4, [(s, t) for s, t, _ in results]
    assert all(json.loads(r[2])["code"] == "145000" for r in refused)
    assert max(t for _, t, _ in refused) < 5.0
    assert worst < 1.0, f"health took {worst:.2f} s"


def test_the_request_limit_follows_the_model(files) -> None:
    """Per model: its largest legal request fits (JSON, pretty-printed even), one value more
    than its largest gear is 413 from the declared length alone."""
    server = build_server([str(files["wide"]), str(files["conv"])],
                          options=ServeOptions(executors=1))
    wide, conv = server.models["wide"].max_request_bytes, server.models["conv"].max_request_bytes
    assert wide > 8 * WIDE * 26 and conv < wide / 20
    with live(server) as running:
        x = (np.arange(8 * 192, dtype=np.float32) / 7).reshape(8, 3, 8, 8)
        pretty = json.dumps({"inputs": [{"name": "data", "shape": [8, 3, 8, 8],
                                         "datatype": "FP32", "data": x.tolist()}]}, indent=2)
        status, _, reply = request(running.port, "POST", "/v2/models/conv/infer",
                                   pretty.encode())
        assert status == 200, reply
        with socket.create_connection((HOST, running.port), timeout=30) as s:
            s.sendall(b"POST /v2/models/conv/infer HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: %d\r\n\r\n" % (conv + 1))
            reply = read_reply(s)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_a_half_sent_request_is_cut_off_by_the_timeouts(files) -> None:
    """Half the headers and then nothing: 408 and closed after --header-timeout; headers and
    half the body: 408 after --body-timeout; the server serves on."""
    limits = HttpLimits(header_timeout_s=0.5, body_timeout_s=0.5)
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with live(server, limits=limits) as running:
        for partial in (b"POST /v2/models/conv/infer HTTP/1.1\r\nHost: x\r\nContent-Le",
                        _raw_request("/v2/models/conv/infer", _conv_body(1))[:-100]):
            with socket.create_connection((HOST, running.port), timeout=30) as s:
                s.sendall(partial)
                t0 = time.monotonic()
                reply = read_reply(s, timeout=10)
                took = time.monotonic() - t0
                assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
                assert s.recv(10) == b""  # and closed
            assert 0.3 < took < 5, took
        assert request(running.port, "GET", "/v2/health/live")[0] == 200


def test_a_trickling_body_is_cut_off_by_the_minimum_rate(files) -> None:
    """Round 3's F5: one body byte every 0.1 s never trips the inactivity limit; below
    --min-body-rate on average past --body-timeout, it is 408 and closed (a slot freed),
    while a body at full speed is served."""
    limits = HttpLimits(body_timeout_s=0.5, min_body_rate=1000)
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with live(server, limits=limits) as running:
        raw = _raw_request("/v2/models/conv/infer", _conv_body(1))
        head = raw.index(b"\r\n\r\n") + 4
        with socket.create_connection((HOST, running.port), timeout=30) as s:
            s.sendall(raw[:head])
            t0, reply = time.monotonic(), b""
            s.settimeout(0.1)
            for byte in raw[head:head + 100]:
                try:
                    s.sendall(bytes([byte]))
                    reply = s.recv(4096)
                    if reply:
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            took = time.monotonic() - t0
        assert reply.startswith(b"HTTP/1.1 408") and b"bytes/s" in reply, reply[:300]
        assert 0.4 < took < 5, took
        with socket.create_connection((HOST, running.port), timeout=30) as s:
            s.sendall(raw)
            assert read_reply(s).startswith(b"HTTP/1.1 200")


def test_past_the_connection_limit_a_quick_503(files) -> None:
    """--max-connections 8: the 9th connection is answered 503 at once and closed; when
    connections close, new ones are served again (no fd exhaustion, no hang)."""
    limits = HttpLimits(max_connections=8)
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with live(server, limits=limits) as running:
        held = [socket.create_connection((HOST, running.port), timeout=30) for _ in range(8)]
        for s in held:  # each one really is a connection of the server
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(s).startswith(b"HTTP/1.1 200")
        with socket.create_connection((HOST, running.port), timeout=30) as extra:
            t0 = time.monotonic()
            reply = read_reply(extra, timeout=10)
            assert reply.startswith(b"HTTP/1.1 503") and time.monotonic() - t0 < 2
            assert json.loads(reply.partition(b"\r\n\r\n")[2])["code"] == "overloaded"
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while running.call(lambda: len(running.http.connections)) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert request(running.port, "GET", "/v2/health/live")[0] == 200
        m = metrics(running.port)
    assert m[("gear_refused_connections_total", ())] >= 1


# ---- client errors are 4xx ----------------------------------------------------------------
def _tensor(shape, datatype="FP32", data=None, **extra) -> dict:
    return {"name": "data", "shape": shape, "datatype": datatype,
            "data": [] if data is None else data, **extra}


MALFORMED = [
    ("datatype as a list", {"inputs": [_tensor([1, 3, 8, 8], ["FP32"], [0.5] * 192)]}),
    ("a 5000-digit number", b'{"inputs":[{"name":"data","shape":[1],"datatype":"FP32",'
                            b'"data":[1' + b"0" * 5000 + b"]}]}"),
    ("shape 10**30, 0, 8", {"inputs": [_tensor([10**30, 0, 8])]}),
    ("shape 2**62, 4, 0", {"inputs": [_tensor([2**62, 4, 0])]}),
    ("100 dims", {"inputs": [_tensor([1] * 100, data=[0.5])]}),
    ("dynamic_dims 2**63, 4", {"inputs": [_tensor([1, 3, 8, 8], data=[0.5] * 192)],
                               "parameters": {"dynamic_dims": [2**63, 4]}}),
    ("dynamic_dims negative", {"inputs": [_tensor([1, 3, 8, 8], data=[0.5] * 192)],
                               "parameters": {"dynamic_dims": [-1]}}),
    ("name as a number", {"inputs": [{**_tensor([1]), "name": 5}]}),
    ("outputs as a dict", {"inputs": [_tensor([1, 3, 8, 8], data=[0.5] * 192)],
                           "outputs": {"name": "logits"}}),
    ("parameters as a list", {"inputs": [_tensor([1, 3, 8, 8], data=[0.5] * 192)],
                              "parameters": [1]}),
    ("nested too deep", b'{"inputs":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("not UTF-8", b'{"inputs":[{"name":"\xff\xfe"}]}'),
]


def test_malformed_requests_are_4xx_naming_the_field(files, caplog) -> None:
    server = build_server([str(files["conv"]), str(files["prefill"])],
                          options=ServeOptions(executors=1))
    caplog.set_level(logging.INFO, logger="gear_runtime.serving")
    with live(server) as running:
        for what, doc in MALFORMED:
            body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            for model in ("conv", "prefill"):
                status, _, reply = request(running.port, "POST",
                                           f"/v2/models/{model}/infer", body)
                assert 400 <= status < 500, (what, model, status, reply)
                assert json.loads(reply)["code"] == "145000", (what, reply)
                assert len(reply) < 2000, (what, len(reply))  # never echoes a huge value
        m = metrics(running.port)
    assert not [k for k, v in m.items() if k[0] == "gear_errors_total" and
                dict(k[1])["status"] == "500" and v], m
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_decode_never_raises_anything_but_input_error() -> None:
    """Any JSON document at all: an InferRequest or an InputError (hypothesis)."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "shape", "datatype", "data", "parameters", "inputs",
                         "outputs", "binary_data_size", "binary_data", "id", "x"]),
        inner, max_size=5), max_leaves=30)
    tensor = st.fixed_dictionaries(
        {"name": st.text(max_size=3) | st.integers(), "shape": st.lists(
            st.integers(-2, 2**64), max_size=4) | values,
         "datatype": st.sampled_from(["FP32", "INT64", "BOOL", "UINT8", "FP16"]) | values},
        optional={"data": values, "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "x"]), values, max_size=2)})
    doc = st.fixed_dictionaries({"inputs": st.lists(tensor, max_size=3) | values},
                                optional={"outputs": values, "parameters": values,
                                          "id": values})

    @hypothesis.settings(max_examples=400, deadline=None)
    @hypothesis.given(doc=doc, tail=st.binary(max_size=16), header=st.booleans())
    def check(doc, tail, header) -> None:
        head = json.dumps(doc).encode()
        with contextlib.suppress(gr.InputError):
            decode_request(head + tail, str(len(head)) if header else None)

    check()


def test_a_client_that_hangs_up_is_counted_apart(files, caplog) -> None:
    """Half a body, then the client goes: gear_client_disconnects_total, no 500, no
    traceback (logged at info)."""
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    caplog.set_level(logging.INFO, logger="gear_runtime.serving")
    with live(server) as running:
        for _ in range(3):
            with socket.create_connection((HOST, running.port), timeout=30) as s:
                s.sendall(_raw_request("/v2/models/conv/infer", _conv_body(1))[:-200])
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = metrics(running.port)
            if m.get(("gear_client_disconnects_total", (("model", "conv"),)), 0) >= 3:
                break
            time.sleep(0.05)
    assert m[("gear_client_disconnects_total", (("model", "conv"),))] == 3
    assert not [k for k in m if k[0] == "gear_errors_total"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("hung up" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_a_request_whose_client_left_is_not_run(files, batching) -> None:
    """A request waiting for the executor whose client hangs up is dropped, never run: no
    one reads its answer, and its rows would delay every request behind it. The requests
    behind it are answered."""
    import unittest.mock

    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, batching=batching))
    cls = type(server.models["conv"].pool._executors[0])
    execute = cls.execute
    gate, entered, ran = threading.Event(), threading.Event(), []

    def spy(ex, inputs, *args, **kw):
        rows = inputs[0].shape[0]
        ran.append(rows)
        if rows == 2:  # the request that holds the one executor
            entered.set()
            assert gate.wait(30)
        return execute(ex, inputs, *args, **kw)

    def infer(rows: int) -> int:
        return request(running.port, "POST", "/v2/models/conv/infer", _conv_body(rows),
                       {"Content-Type": "application/json"})[0]

    disconnects = ("gear_client_disconnects_total", (("model", "conv"),))
    with unittest.mock.patch.object(cls, "execute", spy), live(server) as running:
        holder = threading.Thread(target=infer, args=(2,))
        holder.start()
        try:
            assert entered.wait(30)
            with socket.create_connection((HOST, running.port), timeout=30) as s:
                s.sendall(_raw_request("/v2/models/conv/infer", _conv_body(4)))
                wait_for_queue(running.port, "conv", 1)
                # gone at once (a reset: a plain close is a half-close, still answered)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            deadline = time.monotonic() + 20  # the hang-up reached the server
            while metrics(running.port).get(disconnects, 0) < 1:
                assert time.monotonic() < deadline, "the hang-up was never seen"
                time.sleep(0.02)
        finally:
            gate.set()
            holder.join(30)
        assert infer(1) == 200
    assert ran == [2, 1]  # the 4 rows of the client that left never ran


# ---- what the server is told at start -----------------------------------------------------
def test_pad_on_a_batched_batch_mode_model_is_refused(files) -> None:
    with pytest.raises(gr.InputError, match="--pad does nothing"):
        build_server([str(files["conv"])], options=ServeOptions(executors=1, pad=True))
    # without batching, --pad pads each request to its covering batch gear: allowed
    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, pad=True, batching=False))
    assert server.models["conv"].metadata()["parameters"]["pad"] is True
    asyncio.run(server.close())


def test_cli_serve_refuses_bad_ports_in_one_line(files, capsys) -> None:
    from gear_runtime.cli import app as cli

    assert cli.main(["serve", str(files["conv"]), "--port", "70000"]) == 2
    assert cli.main(["serve", str(files["conv"]), "--grpc-port", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not in 0..65535" in err[0], err
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main(["serve", str(files["conv"]), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"port {port}" in err[0] and "--port 0" in err[0], err


def test_the_cli_drain_default_is_the_servers() -> None:
    from gear_runtime.cli import serve as cli_serve
    from gear_runtime.serving import lifecycle

    assert cli_serve.DRAIN_SECONDS == lifecycle.DEFAULT_DRAIN_S


# ---- the paths round 3's mutations showed untested -----------------------------------------------
def test_the_body_timeout_is_a_pause_limit_not_a_total(files) -> None:
    """A body whose pieces come well within --body-timeout of each other is served however
    long it takes in all (a re-arm turned into a total limit cut it off)."""
    limits = HttpLimits(body_timeout_s=0.4, min_body_rate=0)
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with live(server, limits=limits) as running:
        raw = _raw_request("/v2/models/conv/infer", _conv_body(1))
        head = raw.index(b"\r\n\r\n") + 4
        pieces = np.array_split(np.frombuffer(raw[head:], np.uint8), 8)
        with socket.create_connection((HOST, running.port), timeout=30) as s:
            s.sendall(raw[:head])
            t0 = time.monotonic()
            for piece in pieces:
                time.sleep(0.15)
                s.sendall(piece.tobytes())
            reply = read_reply(s, timeout=10)
        assert time.monotonic() - t0 > 1.0  # longer than the timeout in all
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_grpc_status_codes_follow_the_http_ones(files) -> None:
    """413 -> RESOURCE_EXHAUSTED, 503 -> UNAVAILABLE, 400 -> INVALID_ARGUMENT (what Triton's
    gRPC front end answers), checked on a live request too."""
    import grpc

    tgrpc = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    from gear_runtime.serving.grpc_app import _CODES
    assert _CODES[413] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _CODES[503] == grpc.StatusCode.UNAVAILABLE
    assert _CODES[400] == grpc.StatusCode.INVALID_ARGUMENT
    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, max_body_bytes=4096))
    with live(server, grpc=True) as running:
        client = tgrpc.InferenceServerClient(f"{HOST}:{running.grpc_port}")
        x = tgrpc.InferInput("data", [8, 3, 8, 8], "FP32")
        x.set_data_from_numpy(np.zeros((8, 3, 8, 8), np.float32))  # 6 KiB > 4 KiB
        with pytest.raises(InferenceServerException) as info:
            client.infer("conv", [x])
        assert "RESOURCE_EXHAUSTED" in str(info.value.status())


def test_every_v2_datatype_maps_to_its_own_numpy_type() -> None:
    from gear_runtime.serving.protocol import DATATYPES, datatype_of
    expect = {"BOOL": ("b", 1), "INT8": ("i", 1), "INT16": ("i", 2), "INT32": ("i", 4),
              "INT64": ("i", 8), "UINT8": ("u", 1), "UINT16": ("u", 2), "UINT32": ("u", 4),
              "UINT64": ("u", 8), "FP16": ("f", 2), "FP32": ("f", 4), "FP64": ("f", 8)}
    for name, (kind, size) in expect.items():
        dt = np.dtype(DATATYPES[name])
        assert (dt.kind, dt.itemsize) == (kind, size), name
        assert datatype_of(dt) == name


def test_the_body_limit_takes_the_widest_json_of_the_largest_gear(files) -> None:
    """A JSON request of the largest gear with every value at its widest text (the most
    negative float32, nested per axis and pretty-printed) fits the model's body limit."""
    server = build_server([str(files["wide"])], options=ServeOptions(executors=1))
    model = server.models["wide"]
    values = np.full((8, WIDE), np.finfo(np.float32).min, np.float32)
    body = json.dumps({"inputs": [{"name": "x", "shape": [8, WIDE], "datatype": "FP32",
                                   "data": values.astype(float).tolist()}]}, indent=1).encode()
    assert len(body) <= model.max_request_bytes, (len(body), model.max_request_bytes)
    asyncio.run(server.close())


def test_a_second_sigterm_ends_the_drain_and_the_drain_is_not_ready(files) -> None:
    """While draining (a request held in the batcher, --drain-seconds 60) readiness says
    503 and answers close their connections; a second SIGTERM ends the drain at once."""
    server = ServeProcess([str(files["conv"]), "--executors", "1", "--max-batch-delay-ms",
                           "60000", "--batch-wait-when-idle", "--drain-seconds", "60"])
    held = socket.create_connection((HOST, server.port), timeout=60)
    try:
        held.sendall(_raw_request("/v2/models/conv/infer", _conv_body(1)))
        wait_for_queue(server.port, "conv", 1)
        server.proc.send_signal(signal.SIGTERM)
        answers: list = []
        _until(lambda: answers.append(request(server.port, "GET", "/v2/health/ready"))
               or answers[-1][0] == 503)
        assert answers[-1][1].get("connection", "").lower() == "close"
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code, out, _ = _exited(server)
        assert time.monotonic() - t0 < 15 and code == 0
    finally:
        held.close()
        server.kill()


def test_a_grpc_call_past_the_drain_deadline_is_answered_unavailable(files) -> None:
    """A gRPC call still waiting at the drain deadline gets UNAVAILABLE (retry elsewhere),
    not CANCELLED by the server's stop."""
    tgrpc = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    server = ServeProcess([str(files["conv"]), "--executors", "1", "--max-batch-delay-ms",
                           "60000", "--batch-wait-when-idle", "--drain-seconds", "0.5",
                           "--grpc-port", "0"])
    errors: list[BaseException] = []
    try:
        client = tgrpc.InferenceServerClient(f"{HOST}:{server.grpc_port}")
        x = tgrpc.InferInput("data", [1, 3, 8, 8], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))

        def call() -> None:
            try:
                client.infer("conv", [x])
            except InferenceServerException as exc:
                errors.append(exc)

        t = threading.Thread(target=call)
        t.start()
        wait_for_queue(server.port, "conv", 1)  # held in the batcher (60 s delay)
        server.proc.send_signal(signal.SIGTERM)
        t.join(30)
        code, _, _ = _exited(server)
    finally:
        server.kill()
    assert errors and "UNAVAILABLE" in str(errors[0].status()), errors
    assert code == 0
