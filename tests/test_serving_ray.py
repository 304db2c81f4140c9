"""The Ray Serve path: a local Ray instance started here (2 CPUs, loopback node address), the
app on 2 replicas behind Serve's proxy on 127.0.0.1, ``tritonclient.http`` against it: every
gear of both models, binary and JSON, concurrent clients; every response equals the
in-process executor's. About 15 s on 2 cores (Ray's start and stop are most of it).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("tritonclient.http")

from serving_support import HOST, compile_models, conv_input  # noqa: E402
from test_serving import infer  # noqa: E402

import gear_runtime as gr  # noqa: E402
from gear_runtime.examples import prefill  # noqa: E402
from gear_runtime.serving import ServeOptions  # noqa: E402

pytestmark = pytest.mark.ray


def test_cli_ray_serves_and_stops_on_sigterm(tmp_path) -> None:
    """``gear-runtime serve FILE --ray --replicas 2``: answers, then SIGTERM stops Serve and
    Ray and exits 0 (runs before the module's Ray instance starts)."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from serving_support import _read_line, request

    from gear_runtime.serving.ray_app import free_port

    files = compile_models(tmp_path)
    port = free_port(HOST)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gear_runtime.cli", "serve", str(files["conv"]), "--ray",
         "--replicas", "2", "--executors", "1", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = _read_line(proc, timeout=120)
        assert f"at http://127.0.0.1:{port} on Ray Serve (2 replicas)" in line, line
        x = conv_input(2, seed=9)
        body = json.dumps({"inputs": [{"name": "data", "shape": [2, 3, 8, 8],
                                       "datatype": "FP32", "data": x.ravel().tolist()}]})
        status, _, reply = request(port, "POST", "/v2/models/conv/infer", body.encode())
        assert status == 200, reply
        with gr.load(str(files["conv"])) as model:
            expected = model.create_executor().execute([x])[0]
        got = np.asarray(json.loads(reply)["outputs"][0]["data"], np.float32)
        np.testing.assert_array_equal(got, expected.ravel())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        assert "server stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def ray_port(tmp_path_factory):
    import ray
    from ray import serve

    from gear_runtime.serving import ray_app

    files = compile_models(tmp_path_factory.mktemp("ray"))
    port = ray_app.free_port(HOST)
    ray_app.start_local(HOST, port, num_cpus=2)
    try:
        app = ray_app.ray_app([str(files["conv"]), str(files["prefill"])], replicas=2,
                              options=ServeOptions(executors=1, max_batch_delay_ms=5))
        serve.run(app, name=ray_app.APP_NAME, route_prefix="/")
        yield port, files
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_tritonclient_correctly(ray_port) -> None:
    import tritonclient.http as triton

    port, files = ray_port
    conv, pre = gr.load(str(files["conv"])), gr.load(str(files["prefill"]))
    conv_ex, pre_ex = conv.create_executor(), pre.create_executor()
    c = triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60)
    assert c.is_server_ready() and c.get_model_metadata("conv")["parameters"]["batching"]
    for binary in (True, False):
        for batch in (1, 2, 4, 8):
            x = conv_input(batch, seed=batch)
            (got,) = infer(c, "conv", {"data": x}, ["logits"], binary)
            np.testing.assert_array_equal(got, conv_ex.execute([x])[0])
        for gear in range(pre.gear_count):
            inputs = prefill.example_inputs(pre.spec, gear, seed=gear)
            got = infer(c, "prefill", inputs, list(prefill.OUTPUT_NAMES), binary)
            for g, e in zip(got, pre_ex.execute(inputs), strict=True):
                np.testing.assert_array_equal(g, e)
    # concurrent clients: spread over both replicas, batched within each
    xs = [conv_input(1, seed=300 + i) for i in range(32)]
    got: dict[int, np.ndarray] = {}

    def run(k: int) -> None:
        ck = triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60)
        for i in range(k, 32, 8):
            got[i] = infer(ck, "conv", {"data": xs[i]}, ["logits"], True)[0]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == list(range(32))
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i], conv_ex.execute([x])[0], rtol=1e-5, atol=1e-6)
    conv.close()
    pre.close()
