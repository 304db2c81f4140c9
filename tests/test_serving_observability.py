"""What operators read: process metrics (``process_*``) in the server's own registry, the
access log (``serve --access-log``: one line per answered request) and JSON log lines
(``serve --log-format json``), as ``gear-runtime serve`` writes them on stderr."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("httptools")
pytest.importorskip("orjson")
triton = pytest.importorskip("tritonclient.http")

from serving_support import (  # noqa: E402
    HOST,
    ServeProcess,
    compile_models,
    conv_input,
    live,
    metrics,
    request,
)

from gear_runtime.serving import ServeOptions, build_server  # noqa: E402
from gear_runtime.serving.logs import ACCESS_LOGGER, JsonFormatter  # noqa: E402
from gear_runtime.serving.metrics import Metrics, merge_expositions  # noqa: E402

PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes",
           "process_start_time_seconds", "process_open_fds")


@pytest.fixture(scope="module")
def conv(tmp_path_factory) -> Path:
    return compile_models(tmp_path_factory.mktemp("observability"))["conv"]


def _infer(port: int, model: str = "conv") -> None:
    c = triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60)
    t = triton.InferInput("data", [1, 3, 8, 8], "FP32")
    t.set_data_from_numpy(conv_input(1, 0))
    c.infer(model, [t])


def test_process_metrics_are_scraped_and_kept_per_worker(conv) -> None:
    server = build_server([str(conv)], options=ServeOptions(executors=1))
    with live(server) as r:
        found = metrics(r.port)
    for name in PROCESS:
        assert found[(name, ())] > 0, name
    # serve --workers: every worker's series, labelled apart, in one family each
    merged = merge_expositions([Metrics(w).exposition()[0] for w in ("0", "1")]).decode()
    for name in PROCESS:
        assert {line.split()[0] for line in merged.splitlines()
                if line.startswith(name + "{")} == {f'{name}{{worker="{w}"}}' for w in "01"}
    assert merged.count("# TYPE process_cpu_seconds_total counter") == 1


def test_the_access_log_has_one_line_per_answered_request(conv, caplog) -> None:
    server = build_server([str(conv)], options=ServeOptions(executors=1, access_log=True))
    with caplog.at_level(logging.INFO, ACCESS_LOGGER), live(server) as r:
        _infer(r.port)
        request(r.port, "GET", "/v2/models/nope")
        request(r.port, "GET", "/v2/health/ready")
    lines = [(rec.method, rec.path, rec.status, rec.model)
             for rec in caplog.records if rec.name == ACCESS_LOGGER]
    assert lines == [("POST", "/v2/models/conv/infer", 200, "conv"),
                     ("GET", "/v2/models/nope", 404, "nope"),
                     ("GET", "/v2/health/ready", 200, "")]
    first = next(rec for rec in caplog.records if rec.name == ACCESS_LOGGER)
    assert 0 < first.seconds < 30
    assert first.getMessage().startswith("POST /v2/models/conv/infer 200 ")


def test_serve_log_format_json_writes_one_json_object_per_line(conv) -> None:
    server = ServeProcess([str(conv), "--executors", "1", "--log-format", "json",
                           "--access-log"])
    try:
        _infer(server.port)
        with pytest.raises(triton.InferenceServerException):
            _infer(server.port, "nope")
        code, _, err = server.stop()
    finally:
        server.kill()
    assert code == 0, err
    docs = [json.loads(line) for line in err.splitlines() if line.strip()]
    for doc in docs:
        assert {"time", "level", "logger", "message"} <= set(doc), doc
    access = [(d["method"], d["path"], d["status"], d["model"]) for d in docs
              if d["logger"] == ACCESS_LOGGER]
    assert access == [("POST", "/v2/models/conv/infer", 200, "conv"),
                      ("POST", "/v2/models/nope/infer", 404, "nope")]
    assert any(d["level"] == "WARNING" and "draining" in d["message"] for d in docs)


def test_a_json_line_carries_the_traceback_in_one_line() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed %s", ("here",), exc_info=sys.exc_info(),
            extra={"model": "conv", "array": np.zeros(2)})
    line = JsonFormatter().format(record)
    doc = json.loads(line)
    assert "\n" not in line and doc["message"] == "failed here" and doc["model"] == "conv"
    assert "ValueError: broken" in doc["exception"] and doc["array"] == "[0. 0.]"
