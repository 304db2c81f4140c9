"""Triton's model repository layout (``DIR/<model>/config.pbtxt`` +
``DIR/<model>/<version>/model.gear.onnx``) served and queried with ``tritonclient.http``: the
newest version by default, ``version_policy`` all serving both, what config.pbtxt sets
(batch delay, instances) in the model's configuration, a config that contradicts the gear
file refused naming the tensor and both shapes, at start and on a reload that leaves the
old versions serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import conv_model

pytest.importorskip("httptools")
pytest.importorskip("orjson")
triton = pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc.model_config_pb2")

from serving_support import CONV_SPEC, HOST, conv_input, live  # noqa: E402

import gear_runtime as gr  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402
from gear_runtime.serving.errors import ModelConfigError  # noqa: E402
from gear_runtime.serving.triton_config import TritonModel  # noqa: E402

CONFIG = """
name: "conv"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "data" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 3000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def gear_files(tmp_path_factory) -> dict[int, Path]:
    """Two gear files of the conv model (batch gears 1, 2, 4, 8), different weights."""
    directory = tmp_path_factory.mktemp("versions")
    out = {}
    for seed in (0, 7):
        onnx.save(conv_model(seed=seed), str(directory / f"conv{seed}.onnx"))
        out[seed] = directory / f"conv{seed}.gear.onnx"
        gr.compile(str(directory / f"conv{seed}.onnx"), gr.GearSpec.from_atc(**CONV_SPEC),
                   str(out[seed]))
    return out


@pytest.fixture(scope="module")
def reference(gear_files):
    models = {seed: gr.load(str(path)) for seed, path in gear_files.items()}
    yield {seed: m.create_executor() for seed, m in models.items()}
    for m in models.values():
        m.close()


def _repository(root: Path, gear_files: dict[int, Path], config: str | None) -> Path:
    """``root/conv``: version 1 the seed-0 gear file (model.gear.onnx), version 2 the seed-7
    one named model.onnx (Triton's onnxruntime file name: a gear file read as such)."""
    (root / "conv" / "1").mkdir(parents=True)
    (root / "conv" / "2").mkdir()
    shutil.copy(gear_files[0], root / "conv" / "1" / "model.gear.onnx")
    shutil.copy(gear_files[7], root / "conv" / "2" / "model.onnx")
    (root / "conv" / "not_a_version").mkdir()  # skipped, as Triton skips it
    if config is not None:
        (root / "conv" / "config.pbtxt").write_text(config)
    return root


def _infer(client, x: np.ndarray, version: str = "") -> tuple[np.ndarray, str]:
    t = triton.InferInput("data", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    result = client.infer("conv", [t], model_version=version)
    return result.as_numpy("logits"), result.get_response()["model_version"]


def _close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_the_newest_version_is_served_with_what_config_pbtxt_sets(tmp_path, gear_files,
                                                                  reference) -> None:
    repo = _repository(tmp_path, gear_files, CONFIG)
    shutil.copy(gear_files[0], repo / "flat.gear.onnx")  # the flat layout, beside it
    server = build_server([], options=ServeOptions(executors=1, max_batch_delay_ms=1),
                          model_repository=str(repo))
    x = conv_input(3, 1)
    with live(server) as r:
        c = triton.InferenceServerClient(f"{HOST}:{r.port}", network_timeout=60)
        got, version = _infer(c, x)
        assert version == "2"
        _close(got, reference[7].execute([x], pad=True)[0])
        with pytest.raises(triton.InferenceServerException) as info:
            _infer(c, x, "1")  # latest 1: version 1 is not served
        assert info.value.status() == "404" and "versions served: 2" in info.value.message()
        assert c.get_model_metadata("conv")["versions"] == ["2"]
        config = c.get_model_config("conv")
        assert config["max_batch_size"] == 8
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
        assert config["instance_group"][0]["count"] == 2
        assert config["version_policy"] == {"latest": {"num_versions": 1}}
        index = [(m["name"], m["version"], m["state"]) for m in c.get_model_repository_index()]
        assert index == [("conv", "2", "READY"), ("flat", "1", "READY")]
        t = triton.InferInput("data", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        _close(c.infer("flat", [t]).as_numpy("logits"), reference[0].execute([x], pad=True)[0])


def test_version_policy_all_serves_every_version(tmp_path, gear_files, reference) -> None:
    config = CONFIG + "version_policy: { all { } }\n"
    repo = _repository(tmp_path, gear_files, config)
    server = build_server([], options=ServeOptions(executors=1), model_repository=str(repo))
    x = conv_input(2, 4)
    with live(server) as r:
        c = triton.InferenceServerClient(f"{HOST}:{r.port}", network_timeout=60)
        for version, seed in (("1", 0), ("2", 7), ("", 7)):
            got, answered = _infer(c, x, version)
            assert answered == (version or "2")
            _close(got, reference[seed].execute([x])[0])
        assert c.get_model_metadata("conv", "1")["versions"] == ["1", "2"]
        assert c.get_model_config("conv")["version_policy"] == {"all": {}}
        stats = c.get_inference_statistics("conv")["model_stats"]
        assert [(s["version"], s["inference_count"]) for s in stats] == [("1", 2), ("2", 4)]
        assert [m["version"] for m in c.get_model_repository_index()] == ["1", "2"]
        c.unload_model("conv")  # the repository calls keep working: both versions go
        for version in ("1", "2"):
            assert not c.is_model_ready("conv", version)
        c.load_model("conv")
        _close(_infer(c, x, "1")[0], reference[0].execute([x])[0])


def test_a_config_that_contradicts_the_gear_file_is_refused(tmp_path, gear_files,
                                                            reference) -> None:
    """At start, a wrong dims is refused naming the tensor and both shapes; a reload with a
    wrong max_batch_size is refused (400) and the versions served before keep serving."""
    wrong = CONFIG.replace("dims: [ 3, 8, 8 ]", "dims: [ 3, 8, 9 ]")
    repo = _repository(tmp_path, gear_files, wrong)
    with pytest.raises(ModelConfigError) as info:
        build_server([], options=ServeOptions(executors=1), model_repository=str(repo))
    assert "input 'data' has dims [3, 8, 9] in config.pbtxt, the gear file [3, 8, 8]" in \
        str(info.value)
    (repo / "conv" / "config.pbtxt").write_text(CONFIG)
    server = build_server([], options=ServeOptions(executors=1), model_repository=str(repo))
    x = conv_input(1, 2)
    with live(server) as r:
        c = triton.InferenceServerClient(f"{HOST}:{r.port}", network_timeout=60)
        (repo / "conv" / "config.pbtxt").write_text(
            CONFIG.replace("max_batch_size: 8", "max_batch_size: 4"))
        with pytest.raises(triton.InferenceServerException) as info:
            c.load_model("conv")
        assert info.value.status() == "400"
        assert "max_batch_size is 4, the gear file's is 8" in info.value.message()
        _close(_infer(c, x)[0], reference[7].execute([x])[0])


@pytest.mark.parametrize(("config", "fragment"), [
    ('name: "other"', "unexpected directory name 'conv' for model 'other'"),
    ('platform: "tensorrt_plan"', "platform 'tensorrt_plan' does not describe a gear file"),
    ('backend: "python"', "backend 'python' does not describe a gear file"),
    ("version_policy: { specific { versions: [ 3 ] } }", "no version folder 3"),
    ("sequence_batching { control_input [ { name: \"START\" } ] }", "control_input 'START'"),
    ("max_batch_size: 8 input [ { nme: \"x\" } ]", "is not a Triton model configuration"),
])
def test_what_config_pbtxt_cannot_say_is_refused_naming_it(tmp_path, gear_files, config,
                                                           fragment) -> None:
    repo = _repository(tmp_path, gear_files, config)
    with pytest.raises(ModelConfigError, match=fragment.replace("[", r"\[")):
        TritonModel.read(repo / "conv").options(ServeOptions(executors=1))


def test_a_folder_without_config_serves_its_newest_version_with_the_flags(tmp_path,
                                                                          gear_files) -> None:
    model = TritonModel.read(_repository(tmp_path, gear_files, None) / "conv")
    assert list(model.versions) == ["2"] and model.versions["2"].name == "model.onnx"
    options = ServeOptions(executors=3, max_batch_delay_ms=5)
    assert model.options(options) == options


def test_config_pbtxt_fields_become_the_models_serve_options(tmp_path, gear_files) -> None:
    """dynamic_batching -> batching and its delay, its queue policy's bound -> --max-queue,
    instance_group -> executors (a stateful model: sequence slots), sequence_batching ->
    the state pairs, the idle limit, in-place state; no dynamic_batching -> each request
    alone."""
    base = ServeOptions(executors=1, max_batch_delay_ms=2, max_queue=256)
    batched = CONFIG.replace("max_queue_delay_microseconds: 3000",
                             "max_queue_delay_microseconds: 1500 "
                             "default_queue_policy { max_queue_size: 9 }")
    repo = _repository(tmp_path / "a", gear_files, batched)
    got = TritonModel.read(repo / "conv").options(base)
    assert (got.batching, got.max_batch_delay_ms, got.max_queue, got.executors) == \
        (True, 1.5, 9, 2)
    stateful = """
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          state [ { input_name: "past" output_name: "present"
                    use_same_buffer_for_input_output: true } ]
        }
        instance_group [ { count: 3 } ]
    """
    repo = _repository(tmp_path / "b", gear_files, stateful)
    got = TritonModel.read(repo / "conv").options(base)
    assert (got.state, got.sequence_idle_s, got.in_place_state, got.max_sequences,
            got.executors, got.batching) == ((("past", "present"),), 5.0, True, 3, 1, False)
    repo = _repository(tmp_path / "c", gear_files,
                       "max_batch_size: 0 dynamic_batching { }")
    with pytest.raises(ModelConfigError, match="dynamic_batching with max_batch_size 0"):
        TritonModel.read(repo / "conv").options(base)
