"""What a Triton user meets at the edges: unimplemented gRPC calls answer UNIMPLEMENTED (no
traceback), --replicas without --ray is refused, a Triton-layout repository is refused with
what to do and an empty one is warned about, --pad warns to run check-padding."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli_support import run_cli  # noqa: E402
from serving_support import HOST, compile_models, live  # noqa: E402

from gear_runtime.cli import serve as serve_cli  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402

tgrpc = pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    return compile_models(tmp_path_factory.mktemp("m"))


def test_unimplemented_grpc_calls_answer_unimplemented(files, caplog) -> None:
    from tritonclient.utils import InferenceServerException
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with caplog.at_level(logging.INFO, "gear_runtime.serving"), live(server, grpc=True) as r:
        client = tgrpc.InferenceServerClient(f"{HOST}:{r.grpc_port}")
        for call in (client.get_system_shared_memory_status, client.get_log_settings,
                     client.get_cuda_shared_memory_status, client.get_trace_settings):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert "StatusCode.UNIMPLEMENTED" in str(info.value.status())
            assert "not implemented by gear_runtime" in info.value.message()
    assert not [rec for rec in caplog.records if rec.exc_info]  # no traceback logged


def test_replicas_without_ray_are_refused(files, capsys) -> None:
    code, _, err = run_cli(capsys, "serve", str(files["conv"]), "--replicas", "2")
    assert code == 2 and "--replicas 2 needs --ray" in err


def test_a_triton_layout_repository_is_refused_with_what_to_do(tmp_path, capsys) -> None:
    (tmp_path / "bert" / "1").mkdir(parents=True)
    (tmp_path / "bert" / "1" / "model.onnx").write_bytes(b"x")
    (tmp_path / "bert" / "config.pbtxt").write_text('name: "bert"\n')
    code, _, err = run_cli(capsys, "serve", "--model-repository", str(tmp_path))
    assert code == 2 and "Triton's layout (bert" in err
    assert f"gear-runtime compile {tmp_path}/bert/1/model.onnx" in err


def test_an_empty_repository_and_pad_are_warned_about(tmp_path, files, capsys,
                                                      monkeypatch) -> None:
    monkeypatch.setattr(serve_cli, "serve_from_args", lambda args: 0)
    code, _, err = run_cli(capsys, "serve", "--model-repository", str(tmp_path))
    assert code == 0 and "has no *.gear.onnx file: serving no model" in err
    code, _, err = run_cli(capsys, "serve", str(files["prefill"]), "--pad")
    assert code == 0 and "run gear-runtime check-padding" in err
    code, _, err = run_cli(capsys, "serve", str(files["prefill"]), "--pad",
                           "--padding-checked")
    assert code == 0 and "check-padding" not in err
