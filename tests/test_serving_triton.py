"""Triton's extensions through the real clients: model configuration, statistics, the model
repository (index, load, unload, a hot swap that drops no request of the old model), over
``tritonclient.http``; and the same calls plus inference over ``tritonclient.grpc`` (raw
binary contents, every conv gear, the prefill model with its dims parameter, errors)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import conv_model

pytest.importorskip("httptools")
pytest.importorskip("orjson")
triton = pytest.importorskip("tritonclient.http")
tgrpc = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("grpc")

from serving_support import (  # noqa: E402
    CONV_GEARS,
    CONV_SPEC,
    HOST,
    ServeProcess,
    compile_models,
    conv_input,
    live,
    request,
    wait_for_queue,
)

import gear_runtime as gr  # noqa: E402
from gear_runtime.examples import prefill  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("triton")
    found = compile_models(directory)
    onnx.save(conv_model(seed=7), str(directory / "conv7.onnx"))
    gr.compile(str(directory / "conv7.onnx"), gr.GearSpec.from_atc(**CONV_SPEC),
               str(directory / "conv7.gear.onnx"))
    return {**found, "conv7": directory / "conv7.gear.onnx"}


@pytest.fixture(scope="module")
def reference(files):
    models = {name: gr.load(str(path)) for name, path in files.items()}
    yield {name: m.create_executor() for name, m in models.items()}
    for m in models.values():
        m.close()


@pytest.fixture(scope="module")
def running(files):
    """Both models over HTTP and gRPC, in one server."""
    server = build_server([str(files["conv"]), str(files["prefill"])],
                          options=ServeOptions(executors=2, max_batch_delay_ms=3))
    with live(server, grpc=True) as r:
        yield r


def _http(port: int) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60)


def _grpc(port: int) -> tgrpc.InferenceServerClient:
    return tgrpc.InferenceServerClient(f"{HOST}:{port}")


def _http_conv(c, x: np.ndarray, model: str = "conv") -> np.ndarray:
    t = triton.InferInput("data", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    return c.infer(model, [t]).as_numpy("logits")


# ---- model configuration, statistics over HTTP -----------------------------------------------
def test_model_config_in_tritons_schema(running) -> None:
    c = _http(running.port)
    config = c.get_model_config("conv")
    assert config["name"] == "conv" and config["max_batch_size"] == 8
    assert config["input"] == [{"name": "data", "data_type": "TYPE_FP32", "dims": [3, 8, 8]}]
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}]
    assert config["dynamic_batching"] == {"preferred_batch_size": list(CONV_GEARS),
                                          "max_queue_delay_microseconds": 3000}
    assert config["instance_group"][0]["count"] == 2
    config = c.get_model_config("prefill")  # dims mode: no batch axis, -1 where gears differ
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"][0] == {"name": "input_ids", "data_type": "TYPE_INT64",
                                  "dims": [1, -1]}
    assert config["parameters"]["mode"] == {"string_value": "dims"}
    with pytest.raises(triton.InferenceServerException) as info:
        c.get_model_config("nope")
    assert info.value.status() == "404" and "[145002]" in info.value.message()


def test_statistics_count_requests_rows_and_executions(files) -> None:
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with live(server) as r:
        c = _http(r.port)
        assert c.get_inference_statistics("conv")["model_stats"][0]["inference_count"] == 0
        for batch in (1, 3, 8):  # alone: idle batcher, one execution each
            _http_conv(c, conv_input(batch, batch))
        with pytest.raises(triton.InferenceServerException):
            _http_conv(c, conv_input(16, 0))
        stats = c.get_inference_statistics("conv")["model_stats"]
        every = c.get_inference_statistics()["model_stats"]
    assert every == stats
    (s,) = stats
    assert s["name"] == "conv" and s["version"] == "1"
    assert s["inference_count"] == 12 and s["execution_count"] == 3
    infer = s["inference_stats"]
    for kind in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert infer[kind]["count"] == 3, (kind, infer)
    assert infer["fail"]["count"] == 1
    assert infer["success"]["ns"] >= infer["compute_infer"]["ns"] > 0
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    assert sizes == {1: 1, 4: 1, 8: 1}  # the gears run: 3 rows run as gear 4
    assert s["last_inference"] > 0


# ---- the model repository over HTTP ----------------------------------------------------------
@pytest.fixture()
def repository(files, tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(files["conv"], repo / "conv.gear.onnx")
    shutil.copy(files["conv7"], repo / "other.gear.onnx")
    return repo


def test_repository_index_load_unload(repository, reference) -> None:
    server = build_server([], options=ServeOptions(executors=1),
                          model_repository=str(repository))
    x = conv_input(2, 5)
    with live(server) as r:
        c = _http(r.port)
        index = c.get_model_repository_index()
        assert [(m["name"], m["state"]) for m in index] == [("conv", "READY"),
                                                            ("other", "READY")]
        c.unload_model("other")
        assert not c.is_model_ready("other")
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["other"]["state"] == "UNAVAILABLE" and index["other"]["reason"] == \
            "unloaded"
        with pytest.raises(triton.InferenceServerException) as info:
            _http_conv(c, x, "other")
        assert info.value.status() == "404" and "[145003]" in info.value.message()
        c.load_model("other")
        np.testing.assert_allclose(_http_conv(c, x, "other"),
                                   reference["conv7"].execute([x])[0], rtol=1e-5, atol=1e-6)
        for bad, status in (("nope", "404"), ("..%2Fconv", "400"), (".hidden", "400")):
            with pytest.raises(triton.InferenceServerException) as info:
                c.load_model(bad)
            assert info.value.status() == status, (bad, info.value.message())
        assert json.loads(request(r.port, "POST", "/v2/repository/index",
                                  b'{"ready": true}')[2])[0]["state"] == "READY"


def test_a_hot_swap_answers_the_old_models_requests(repository, reference) -> None:
    """Requests queued on the old model when a new gear file is loaded under its name are
    answered by the old one (200, its outputs); requests after the load get the new one."""
    server = build_server([], options=ServeOptions(executors=1, max_batch_delay_ms=1500,
                                                   batch_wait_when_idle=True),
                          model_repository=str(repository))
    xs = [conv_input(1, 40 + i) for i in range(3)]
    with live(server) as r:
        got: dict[int, np.ndarray] = {}

        def send(i: int) -> None:
            got[i] = _http_conv(_http(r.port), xs[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        wait_for_queue(r.port, "conv", 3)
        shutil.copy(repository / "other.gear.onnx", repository / "conv.gear.onnx")
        t0 = time.monotonic()
        _http(r.port).load_model("conv")
        for t in threads:
            t.join(30)
        after = _http_conv(_http(r.port), xs[0])
        took = time.monotonic() - t0
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[i], reference["conv"].execute([x])[0], rtol=1e-5,
                                   atol=1e-6)
    np.testing.assert_allclose(after, reference["conv7"].execute([xs[0]])[0], rtol=1e-5,
                               atol=1e-6)
    assert took < 30


def test_repository_calls_need_a_repository(running) -> None:
    with pytest.raises(triton.InferenceServerException) as info:
        _http(running.port).load_model("conv")
    assert info.value.status() == "400" and "--model-repository" in info.value.message()


# ---- gRPC ------------------------------------------------------------------------------------
def test_grpc_health_metadata_config_statistics(running) -> None:
    c = _grpc(running.grpc_port)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("conv") and not c.is_model_ready("nope")
    meta = c.get_server_metadata(as_json=True)
    assert meta["name"] == "gear_runtime" and "statistics" in meta["extensions"]
    meta = c.get_model_metadata("conv", as_json=True)
    assert meta["inputs"] == [{"name": "data", "datatype": "FP32", "shape": ["-1", "3", "8",
                                                                             "8"]}]
    config = c.get_model_config("conv", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == list(CONV_GEARS)
    assert config["input"][0]["dims"] == ["3", "8", "8"]  # protobuf JSON writes int64 as text
    stats = c.get_inference_statistics("conv", as_json=True)["model_stats"][0]
    assert stats["name"] == "conv"
    index = c.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} == {"conv", "prefill"}
    with pytest.raises(tgrpc.InferenceServerException) as info:
        c.get_model_config("nope")
    assert "NOT_FOUND" in info.value.status() and "[145002]" in info.value.message()


def test_grpc_infer_every_conv_gear_and_prefill(running, reference) -> None:
    c = _grpc(running.grpc_port)
    for batch in CONV_GEARS + (3,):
        x = conv_input(batch, batch)
        t = tgrpc.InferInput("data", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        got = c.infer("conv", [t]).as_numpy("logits")  # 3 rows: batched into gear 4
        expected = reference["conv"].execute([x], pad=batch not in CONV_GEARS)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    ex = reference["prefill"]
    for gear in range(ex.model.gear_count):
        inputs = prefill.example_inputs(ex.model.spec, gear, seed=gear)
        tensors = []
        for name, a in inputs.items():
            t = tgrpc.InferInput(name, list(a.shape), {np.float32: "FP32",
                                                       np.int64: "INT64"}[a.dtype.type])
            t.set_data_from_numpy(a)
            tensors.append(t)
        dims = ",".join(map(str, ex.model.gears[gear]))
        result = c.infer("prefill", tensors, parameters={"dynamic_dims": dims},
                         outputs=[tgrpc.InferRequestedOutput("logits")])
        np.testing.assert_array_equal(result.as_numpy("logits"), ex.execute(inputs)[0])
        assert result.get_output("next_token") is None  # only what was asked for


def test_grpc_errors_carry_the_code(running) -> None:
    c = _grpc(running.grpc_port)
    x = conv_input(16, 0)
    t = tgrpc.InferInput("data", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    with pytest.raises(tgrpc.InferenceServerException) as info:
        c.infer("conv", [t])
    assert "INVALID_ARGUMENT" in info.value.status() and "[145013]" in info.value.message()
    with pytest.raises(tgrpc.InferenceServerException) as info:
        c.infer("nope", [t])
    assert "NOT_FOUND" in info.value.status() and "[145002]" in info.value.message()
    t = tgrpc.InferInput("data", [1, 3, 8, 8], "FP64")
    t.set_data_from_numpy(np.zeros((1, 3, 8, 8)))
    with pytest.raises(tgrpc.InferenceServerException) as info:
        c.infer("conv", [t])
    assert "INVALID_ARGUMENT" in info.value.status() and "FP32" in info.value.message()


def test_grpc_repository_load_unload(repository) -> None:
    server = build_server([], options=ServeOptions(executors=1),
                          model_repository=str(repository))
    with live(server, grpc=True) as r:
        c = _grpc(r.grpc_port)
        c.unload_model("other")
        assert not c.is_model_ready("other")
        c.load_model("other")
        assert c.is_model_ready("other")


def test_cli_serves_grpc_and_stops_on_sigterm(files, reference) -> None:
    server = ServeProcess([str(files["conv"]), "--grpc-port", "0", "--executors", "1"])
    try:
        assert server.grpc_port
        x = conv_input(2, 3)
        t = tgrpc.InferInput("data", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        got = _grpc(server.grpc_port).infer("conv", [t]).as_numpy("logits")
        np.testing.assert_allclose(got, reference["conv"].execute([x])[0], rtol=1e-5,
                                   atol=1e-6)
        code, out, err = server.stop()
    finally:
        server.kill()
    assert code == 0 and "server stopped" in out, err
