"""The v2 server (gear_runtime.serving) against the real ``tritonclient.http``, live on
127.0.0.1 (a free port, a server started by the tests): every gear of the prefill example and
of a batch-mode conv model, JSON and binary tensors; dynamic batching under 32 concurrent
clients; every kind of bad request answered with the right status while the server keeps
serving; a full queue; graceful shutdown on SIGTERM; the CLI without the extra.

Skipped as a whole when the serve extra or tritonclient is not installed.
"""

from __future__ import annotations

import gzip
import http.client
import json
import signal
import socket
import sys
import threading
import time
import unittest.mock
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("httptools")
pytest.importorskip("orjson")
pytest.importorskip("prometheus_client")
triton = pytest.importorskip("tritonclient.http")

from serving_support import (  # noqa: E402
    CONV_GEARS,
    CONV_SPEC,
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
from gear_runtime.examples import prefill  # noqa: E402
from gear_runtime.runtime.dispatch import GearDispatcher  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402
from gear_runtime.serving.batcher import BatchPlan, run_batch  # noqa: E402
from gear_runtime.serving.protocol import decode_request  # noqa: E402


# ---- models and servers -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return compile_models(tmp_path_factory.mktemp("serving"))


@pytest.fixture(scope="module")
def reference(files) -> dict[str, gr.Executor]:
    """In-process executors: what every served response must equal."""
    models = {name: gr.load(str(path)) for name, path in files.items()}
    yield {name: m.create_executor() for name, m in models.items()}
    for m in models.values():
        m.close()


@pytest.fixture(scope="module")
def port(files) -> Iterator[int]:
    """The shared server: both models, 2 executors each, a 1 MiB body limit."""
    server = build_server([str(files["conv"]), str(files["prefill"])],
                          options=ServeOptions(executors=2, max_batch_delay_ms=2,
                                               max_body_bytes=2**20))
    with live(server) as running:
        yield running.port


def client(port: int, **kwargs) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60, **kwargs)


def triton_inputs(arrays: dict[str, np.ndarray], binary: bool) -> list:
    out = []
    for name, a in arrays.items():
        datatype = {np.float32: "FP32", np.int64: "INT64"}[a.dtype.type]
        t = triton.InferInput(name, list(a.shape), datatype)
        t.set_data_from_numpy(a, binary_data=binary)
        out.append(t)
    return out


def infer(c, model: str, arrays: dict[str, np.ndarray], outputs: list[str], binary: bool):
    requested = [triton.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    result = c.infer(model, triton_inputs(arrays, binary), outputs=requested)
    return [result.as_numpy(n) for n in outputs]


# ---- every gear, JSON and binary --------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_prefill_gear_equals_the_executor(port, reference, binary) -> None:
    c = client(port)
    ex = reference["prefill"]
    for gear in range(ex.model.gear_count):
        inputs = prefill.example_inputs(ex.model.spec, gear, seed=gear)
        expected = ex.execute(inputs)
        got = infer(c, "prefill", inputs, list(prefill.OUTPUT_NAMES), binary)
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == e.dtype
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_conv_gear_equals_the_executor(port, reference, binary) -> None:
    c = client(port)
    for batch in CONV_GEARS:
        x = conv_input(batch, seed=batch)
        (expected,) = reference["conv"].execute([x])
        (got,) = infer(c, "conv", {"data": x}, ["logits"], binary)
        np.testing.assert_array_equal(got, expected)


def test_all_outputs_binary_by_default_and_gzip_requests(port, reference) -> None:
    """No outputs named: tritonclient asks every output in binary; gzip bodies inflate."""
    ex = reference["prefill"]
    inputs = prefill.example_inputs(ex.model.spec, 1, seed=5)
    result = client(port).infer("prefill", triton_inputs(inputs, True),
                                request_compression_algorithm="gzip")
    for name, e in zip(prefill.OUTPUT_NAMES, ex.execute(inputs), strict=True):
        np.testing.assert_array_equal(result.as_numpy(name), e)


def test_metadata_health_and_dims_parameter(port, reference) -> None:
    c = client(port)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("conv") and not c.is_model_ready("nope")
    meta = c.get_model_metadata("conv")
    assert meta["inputs"] == [{"name": "data", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert meta["parameters"]["gears"] == [[1], [2], [4], [8]]
    assert meta["parameters"]["batching"] is True
    meta = c.get_model_metadata("prefill")
    assert meta["parameters"]["gears"] == [[s, s, s, 16] for s in prefill.SEQ_GEARS]
    assert meta["parameters"]["batching"] is False
    assert meta["inputs"][2] == {"name": "position_ids", "datatype": "INT64",
                                 "shape": [4, 1, -1]}
    # the request parameter dynamic_dims is set_dynamic_dims: right dims run, wrong refused
    ex = reference["prefill"]
    inputs = prefill.example_inputs(ex.model.spec, 2, seed=3)
    result = c.infer("prefill", triton_inputs(inputs, True),
                     parameters={"dynamic_dims": list(ex.model.gears[2])})
    np.testing.assert_array_equal(result.as_numpy("logits"), ex.execute(inputs)[0])
    with pytest.raises(triton.InferenceServerException) as info:
        c.infer("prefill", triton_inputs(inputs, True),
                parameters={"dynamic_dims": [32, 32, 32, 16]})
    assert info.value.status() == "400"


# ---- dynamic batching ---------------------------------------------------------------------
def test_32_concurrent_batch1_clients_are_batched_at_gear_sizes(files, reference) -> None:
    """32 client threads (a tritonclient each) send 4 batch-1 requests each, then one lone
    request follows: batches form at the gears (8 mostly), every batch on the smallest gear
    holding its rows (the lone request on gear 1, never padded to 8), every response equals
    the request run alone (to float rounding: ORT may sum a batch of 8 in another order than
    a batch of 1).

    Each run takes 3 ms more here (a sleep in the executor's thread, as a device's run
    leaves the GIL): requests pile up behind a busy executor, which is what gathers them
    (with an executor free, what waits goes at once). The test convnet alone runs in
    ~0.05 ms, and its in-process clients hold the GIL most of the time: whether any request
    waited behind a run came down to the scheduler (batches of one for 50-117 of the 129
    requests in 1 to 4 runs in 30, where the limit below is 64)."""
    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, max_batch_delay_ms=20))
    ex = next(iter(server.models.values())).pool._executors[0]
    execute = type(ex).execute

    def device_long(self, *args, **kwargs):
        time.sleep(0.003)
        return execute(self, *args, **kwargs)

    xs = [conv_input(1, seed=100 + i) for i in range(128)]
    got: dict[int, np.ndarray] = {}
    with unittest.mock.patch.object(type(ex), "execute", device_long), live(server) as running:
        p = running.port
        start = threading.Barrier(32)

        def run(k: int) -> None:
            c = client(p)
            start.wait(30)
            for i in range(k, 128, 32):
                got[i] = infer(c, "conv", {"data": xs[i]}, ["logits"], True)[0]

        threads = [threading.Thread(target=run, args=(k,)) for k in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # an idle executor takes a lone request at once (batch_wait_when_idle off): a batch
        # of 1 row, so every run has a batch that only the smallest-gear rule puts on gear 1
        lone = conv_input(1, seed=99)
        got[128] = infer(client(p), "conv", {"data": lone}, ["logits"], True)[0]
        xs.append(lone)
        m = metrics(p)
    assert sorted(got) == list(range(129))
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i], reference["conv"].execute([x])[0], rtol=1e-5,
                                   atol=1e-6)
    batches = {dict(k[1])["gear"]: v for k, v in m.items() if k[0] == "gear_batches_total"}
    rows = sum(v for k, v in m.items() if k[0] == "gear_batch_rows_total")
    padding = sum(v for k, v in m.items() if k[0] == "gear_padding_rows_total")
    assert set(batches) <= {"1", "2", "4", "8"} and rows == 129
    assert sum(batches.values()) <= 129 / 2, batches  # requests really were gathered
    assert batches.get("8", 0) >= 1 and batches.get("1", 0) >= 1, batches
    assert padding == sum(int(g) * n for g, n in batches.items()) - 129
    # every batch ran on the smallest gear holding its rows, more than the next smaller
    # gear's (the gears double): each batch's fill (rows / gear rows) is above 1/2, so the
    # fill histogram's le=0.5 bucket is empty for every gear
    half_full = {dict(k[1])["gear"]: v for k, v in m.items()
                 if k[0] == "gear_batch_fill_ratio_bucket" and dict(k[1])["le"] == "0.5"}
    assert set(half_full) == set(batches) and not any(half_full.values()), half_full


def test_a_batch_runs_on_the_smallest_gear_holding_it(files) -> None:
    """One request of 3 rows: gear 4, one padding row (the batch table of the model's
    dispatcher), never the largest gear."""
    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, max_batch_delay_ms=1))
    with live(server) as p:
        (got,) = infer(client(p.port), "conv", {"data": conv_input(3, 5)}, ["logits"], True)
        m = metrics(p.port)
    batches = {dict(k[1])["gear"]: v for k, v in m.items() if k[0] == "gear_batches_total"}
    padding = sum(v for k, v in m.items() if k[0] == "gear_padding_rows_total")
    assert got.shape == (3, 10) and batches == {"4": 1} and padding == 1


def test_a_full_gear_goes_at_once(files) -> None:
    """8 rows (the largest gear) do not wait for the batch delay."""
    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, max_batch_delay_ms=30_000,
                                               batch_wait_when_idle=True))
    with live(server) as running:
        t0 = time.monotonic()
        (got,) = infer(client(running.port), "conv", {"data": conv_input(8, 1)}, ["logits"],
                       True)
        assert got.shape == (8, 10) and time.monotonic() - t0 < 10


def test_run_batch_pads_to_the_smallest_gear_and_splits_back() -> None:
    spec = gr.GearSpec.from_atc(**CONV_SPEC)
    plan, why = BatchPlan.for_model(GearDispatcher(spec), [((b, 10),) for b in CONV_GEARS])
    assert why == "" and plan.table == (0, 0, 1, 2, 2, 3, 3, 3, 3)
    seen = []

    def execute(inputs):
        seen.append(inputs[0].shape)
        return [inputs[0].reshape(inputs[0].shape[0], -1)[:, :10] * 2]

    requests = [[conv_input(1, 1)], [conv_input(2, 2)], [conv_input(2, 3)]]
    gear, outs = run_batch(execute, plan, requests)
    assert gear == 3 and seen == [(8, 3, 8, 8)]
    for req, (out,) in zip(requests, outs, strict=True):
        np.testing.assert_array_equal(out, req[0].reshape(len(req[0]), -1)[:, :10] * 2)


def test_models_that_cannot_be_batched_say_why() -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="4;8")
    assert BatchPlan.for_model(GearDispatcher(spec), [((1, 4),), ((1, 8),)]) == (
        None, "mode is 'dims', not batch")
    spec = gr.GearSpec.from_atc(**CONV_SPEC)
    plan, why = BatchPlan.for_model(GearDispatcher(spec), [((10,),)] * 4)
    assert plan is None and "output 0" in why


# ---- bad requests -------------------------------------------------------------------------
def _v2(name: str, shape, datatype: str, data) -> dict:
    return {"name": name, "shape": list(shape), "datatype": datatype, "data": data}


GOOD_CONV = {"inputs": [_v2("data", [1, 3, 8, 8], "FP32", [0.5] * 192)]}
BAD_JSON_REQUESTS = [
    ("not json", "conv", b"{not json", 400, "145000"),
    ("not an object", "conv", b"[1, 2]", 400, "145000"),
    ("no inputs", "conv", b"{}", 400, "145000"),
    ("unknown model", "nope", json.dumps(GOOD_CONV).encode(), 404, "145002"),
    ("wrong datatype", "conv",
     json.dumps({"inputs": [_v2("data", [1, 3, 8, 8], "FP64", [0.5] * 192)]}).encode(), 400,
     "145000"),
    ("unknown datatype", "conv",
     json.dumps({"inputs": [_v2("data", [1, 3, 8, 8], "FP8", [0.5] * 192)]}).encode(), 400,
     "145000"),
    ("bytes tensor", "conv",
     json.dumps({"inputs": [_v2("data", [1], "BYTES", ["a"])]}).encode(), 400, "145000"),
    ("wrong shape", "conv",
     json.dumps({"inputs": [_v2("data", [1, 3, 9, 9], "FP32", [0.5] * 243)]}).encode(), 400,
     "145012"),
    ("out of gear", "conv",
     json.dumps({"inputs": [_v2("data", [16, 3, 8, 8], "FP32", [0.5] * 3072)]}).encode(), 400,
     "145013"),
    ("too few values", "conv",
     json.dumps({"inputs": [_v2("data", [1, 3, 8, 8], "FP32", [0.5] * 10)]}).encode(), 400,
     "145000"),
    ("ragged data", "conv",
     json.dumps({"inputs": [_v2("data", [1, 3, 8, 8], "FP32", [[0.5], [1, 2]])]}).encode(),
     400, "145000"),
    ("strings as numbers", "conv",
     json.dumps({"inputs": [_v2("data", [1, 3, 8, 8], "FP32", ["x"] * 192)]}).encode(), 400,
     "145000"),
    ("unknown input", "conv", json.dumps({"inputs": [_v2("x", [1], "FP32", [1.0])]}).encode(),
     400, "145000"),
    ("unknown output", "conv",
     json.dumps({**GOOD_CONV, "outputs": [{"name": "nope"}]}).encode(), 400, "145000"),
    ("bad dims parameter", "conv",
     json.dumps({**GOOD_CONV, "parameters": {"dynamic_dims": "8"}}).encode(), 400, "145000"),
]


def _prefill_request(seq: int, ids_dtype: str = "INT64", ids_value=1) -> bytes:
    tensors = [_v2("input_ids", [1, seq], ids_dtype, [ids_value] * seq),
               _v2("attention_mask", [1, seq], "INT64", [1] * seq),
               _v2("position_ids", [4, 1, seq], "INT64", list(range(seq)) * 4),
               _v2("image_embeds", [16, 64], "FP32", [0.0] * 1024)]
    return json.dumps({"inputs": tensors}).encode()


BAD_PREFILL_REQUESTS = [
    ("prefill out of gear", "prefill", _prefill_request(33), 400, "145013"),
    ("float ids", "prefill", _prefill_request(32, ids_value=1.5), 400, "145000"),
    ("ids out of int64", "prefill", _prefill_request(32, ids_value=2**70), 400, "145000"),
    ("ids as int32", "prefill", _prefill_request(32, ids_dtype="INT32"), 400, "145000"),
]


def _binary_body(declared: int, sent: int, header_length: int | None = None):
    head = json.dumps({"inputs": [{"name": "data", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": declared}}]}).encode()
    length = len(head) if header_length is None else header_length
    return head + bytes(sent), {"Inference-Header-Content-Length": str(length)}


BAD_BINARY_REQUESTS = [
    ("truncated binary", *_binary_body(768, 700), "145000"),
    ("binary size does not match the shape", *_binary_body(700, 700), "145000"),
    ("binary left over", *_binary_body(768, 800), "145000"),
    ("header length past the body", *_binary_body(768, 768, header_length=10**6), "145000"),
    ("header length not a number", b"{}", {"Inference-Header-Content-Length": "x"}, "145000"),
]


def _assert_error(status: int, headers: dict, body: bytes, want_status: int, code: str) -> None:
    assert status == want_status, body
    doc = json.loads(body)
    assert doc["code"] == code and doc["error"].startswith(f"[{code}] "), doc
    assert headers.get("content-type", "").startswith("application/json")


def _assert_still_serving(port: int) -> None:
    status, _, body = request(port, "POST", "/v2/models/conv/infer",
                              json.dumps(GOOD_CONV).encode())
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["shape"] == [1, 10]


@pytest.mark.parametrize(("what", "model", "body", "status", "code"),
                         BAD_JSON_REQUESTS + BAD_PREFILL_REQUESTS,
                         ids=[c[0] for c in BAD_JSON_REQUESTS + BAD_PREFILL_REQUESTS])
def test_bad_requests_get_their_status_and_code(port, what, model, body, status, code) -> None:
    got = request(port, "POST", f"/v2/models/{model}/infer", body)
    _assert_error(*got, status, code)
    _assert_still_serving(port)


@pytest.mark.parametrize(("what", "body", "headers", "code"), BAD_BINARY_REQUESTS,
                         ids=[c[0] for c in BAD_BINARY_REQUESTS])
def test_bad_binary_payloads_are_400(port, what, body, headers, code) -> None:
    got = request(port, "POST", "/v2/models/conv/infer", body, headers)
    _assert_error(*got, 400, code)
    _assert_still_serving(port)


def test_oversized_bodies_are_413_before_they_are_read(port) -> None:
    # declared too large: answered from the headers, the body is never sent
    with socket.create_connection((HOST, port), timeout=30) as s:
        s.sendall(b"POST /v2/models/conv/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 1073741824\r\n\r\n" + b"{" * 1000)
        reply = read_reply(s).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 413") and '"error"' in reply
    # streamed past the limit (chunked: no Content-Length)
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    conn.request("POST", "/v2/models/conv/infer", body=iter([b" " * 2**19] * 3),
                 encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["code"] == "145000"
    conn.close()
    # a small gzip body that inflates past the limit
    bomb = gzip.compress(b" " * (2**20 + 1))
    got = request(port, "POST", "/v2/models/conv/infer", bomb, {"Content-Encoding": "gzip"})
    _assert_error(*got, 413, "145000")
    _assert_still_serving(port)


def test_the_raw_reply_reader_waits_for_the_whole_body() -> None:
    """read_reply (the 413 test's reader) reads a reply that arrives in pieces, headers split
    and the body after a pause, to its Content-Length: one recv would see a part of it."""
    reply = b'HTTP/1.1 413 Payload Too Large\r\ncontent-length: 17\r\n\r\n{"error": "big"}\n'
    ours, theirs = socket.socketpair()
    with ours, theirs:
        def send() -> None:
            for part in (reply[:9], reply[9:40], reply[40:-5], reply[-5:]):
                theirs.sendall(part)
                time.sleep(0.05)

        sender = threading.Thread(target=send)
        sender.start()
        got = read_reply(ours, timeout=10)
        sender.join()
    assert got == reply


def test_unknown_paths_and_methods_are_json_errors(port) -> None:
    status, _, body = request(port, "GET", "/v2/nothing/here")
    assert status == 404 and "error" in json.loads(body)
    status, _, body = request(port, "GET", "/v2/models/conv/infer")
    assert status == 405 and "error" in json.loads(body)
    status, _, body = request(port, "GET", "/v2/models/conv/versions/2")
    assert status == 404 and json.loads(body)["code"] == "145002"
    status, _, body = request(port, "GET", "/v2/models/conv/versions/1")
    assert status == 200 and json.loads(body)["name"] == "conv"


def test_tritonclient_sees_the_code_and_errors_are_counted(port) -> None:
    with pytest.raises(triton.InferenceServerException) as info:
        client(port).infer("conv", triton_inputs({"data": conv_input(16, 0)}, True))
    assert info.value.status() == "400" and "[145013]" in info.value.message()
    m = metrics(port)
    key = ("gear_errors_total", (("code", "145013"), ("model", "conv"), ("status", "400")))
    assert m[key] >= 1


def test_a_failure_of_ours_is_500_and_the_server_goes_on(files, reference) -> None:
    server = build_server([str(files["prefill"])], options=ServeOptions(executors=1))
    served = server.models["prefill"]
    real = served._execute
    calls = []

    def fail_once(ex, arrays):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("backend exploded")
        return real(ex, arrays)

    served._execute = fail_once
    inputs = prefill.example_inputs(served.model.spec, 0, seed=1)
    with live(server) as running:
        p = running.port
        c = client(p)
        with pytest.raises(triton.InferenceServerException) as info:
            infer(c, "prefill", inputs, ["logits"], True)
        assert info.value.status() == "500" and "backend exploded" in info.value.message()
        (got,) = infer(c, "prefill", inputs, ["logits"], True)
        m = metrics(p)
    np.testing.assert_array_equal(got, reference["prefill"].execute(inputs)[0])
    key = ("gear_errors_total", (("code", "RuntimeError"), ("model", "prefill"),
                                 ("status", "500")))
    assert m[key] == 1


def test_a_full_queue_is_503_with_retry_after(files) -> None:
    server = build_server([str(files["conv"])],
                          options=ServeOptions(executors=1, max_batch_delay_ms=1500,
                                               max_queue=1, batch_wait_when_idle=True))
    body = json.dumps(GOOD_CONV).encode()
    with live(server) as running:
        p = running.port
        first: list = []
        t = threading.Thread(target=lambda: first.append(
            request(p, "POST", "/v2/models/conv/infer", body)))
        t.start()
        wait_for_queue(p, "conv", 1)
        status, headers, reply = request(p, "POST", "/v2/models/conv/infer", body)
        assert status == 503 and headers["retry-after"] == "1", reply
        assert json.loads(reply)["code"] == "queue_full"
        t.join(30)
        assert first[0][0] == 200
        # still serving: a full gear (8 rows) goes without waiting for the long delay
        (got,) = infer(client(p), "conv", {"data": conv_input(8, 2)}, ["logits"], True)
        assert got.shape == (8, 10)


# ---- padding (dims mode) ------------------------------------------------------------------
def test_pad_serves_any_length(files, reference) -> None:
    options = ServeOptions(executors=1, pad=True)
    server = build_server([str(files["prefill"])], options=options)
    with live(server) as running:
        p = running.port
        inputs = prefill.inputs_for_shapes(prefill.example_shapes(20), seed=7)
        got = infer(client(p), "prefill", inputs, list(prefill.OUTPUT_NAMES), True)
        m = metrics(p)
    fill = (("gear", "32,32,32,16"), ("model", "prefill"))
    assert m[("gear_pad_fill_ratio_count", fill)] == 1
    assert m[("gear_pad_fill_ratio_sum", fill)] == pytest.approx(20 * 20 * 20 / 32**3)
    expected = reference["prefill"].execute(inputs, pad=True)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


# ---- protocol details ---------------------------------------------------------------------
def test_decode_keeps_binary_and_json_tensors_apart() -> None:
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    head = json.dumps({"id": "r1", "inputs": [
        {"name": "a", "shape": [2, 3], "datatype": "INT64",
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "b", "shape": [2], "datatype": "BOOL", "data": [True, False]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}]}).encode()
    req = decode_request(head + a.tobytes(), str(len(head)))
    np.testing.assert_array_equal(req.inputs["a"], a)
    np.testing.assert_array_equal(req.inputs["b"], [True, False])
    assert req.id == "r1" and req.binary("y") and not req.binary("z")
    with pytest.raises(gr.InputError, match="out of range"):
        decode_request(json.dumps({"inputs": [_v2("u", [1], "UINT8", [300])]}).encode())
    with pytest.raises(gr.InputError, match="out of range"):
        decode_request(json.dumps({"inputs": [_v2("f", [1], "FP16", [1e6])]}).encode())


# ---- process: CLI, SIGTERM ----------------------------------------------------------------
def test_sigterm_drains_requests_in_flight(files, reference) -> None:
    """gear-runtime serve in a process of its own: requests waiting in the batcher when
    SIGTERM arrives are answered (200, right outputs), then it exits 0."""
    server = ServeProcess([str(files["conv"]), "--executors", "1", "--max-batch-delay-ms",
                           "1500", "--batch-wait-when-idle"])
    try:
        p = server.port
        xs = [conv_input(1, seed=200 + i) for i in range(3)]
        results: dict[int, tuple] = {}

        def send(i: int) -> None:
            body = json.dumps({"inputs": [_v2("data", [1, 3, 8, 8], "FP32",
                                              xs[i].ravel().tolist())]}).encode()
            results[i] = request(p, "POST", "/v2/models/conv/infer", body)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        wait_for_queue(p, "conv", 3)
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        code, out, _ = server.stop()
        assert code == 0
        for i, x in enumerate(xs):
            status, _, body = results[i]
            assert status == 200, body
            got = np.asarray(json.loads(body)["outputs"][0]["data"], np.float32)
            np.testing.assert_allclose(got, reference["conv"].execute([x])[0].ravel(),
                                       rtol=1e-5, atol=1e-6)
        assert "server stopped" in out
    finally:
        server.kill()


def test_cli_without_the_extra_is_one_line(files, monkeypatch, capsys) -> None:
    from gear_runtime.cli import app as cli

    for mod in [m for m in sys.modules if m.startswith("gear_runtime.serving")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "httptools", None)  # import httptools -> ImportError
    assert cli.main(["serve", str(files["conv"])]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "gear_runtime[serve]"' in err


def test_cli_refuses_bad_flags_before_loading(files, capsys) -> None:
    from gear_runtime.cli import app as cli

    assert cli.main(["serve", str(files["conv"]), "--max-batch-delay-ms", "nan"]) == 2
    assert cli.main(["serve", str(files["conv"]), "--name", "a", "--name", "b"]) == 2
    assert cli.main(["serve", "missing.gear.onnx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("gear-runtime: error:") for line in err)


def test_an_executor_that_cannot_be_created_fails_the_load_at_once() -> None:
    from gear_runtime.serving.pool import ExecutorPool

    class Broken:
        def create_executor(self):
            raise gr.BackendError("no device")

    pool = ExecutorPool(Broken(), 3, "broken")
    t0 = time.monotonic()
    with pytest.raises(gr.BackendError, match="no device"):
        pool.warm_up()
    assert time.monotonic() - t0 < 10  # not the barrier's timeout
    pool.close()
