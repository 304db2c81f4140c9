"""Request deadlines as Triton honours them: a request still waiting in the queue past its
``timeout`` parameter (microseconds; tritonclient's ``infer(..., timeout=)``) is dropped and
answered Triton's 503 / UNAVAILABLE "Request timeout expired"; past its gRPC deadline
(``client_timeout``) it is dropped too; a request already running finishes and is answered.

The model's one executor is held inside the first request's run (its ``execute`` waits for
an event), so the next request waits in the queue for as long as the test says."""

from __future__ import annotations

import threading
import time
import unittest.mock
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("httptools")
pytest.importorskip("orjson")
triton = pytest.importorskip("tritonclient.http")
tgrpc = pytest.importorskip("tritonclient.grpc")

from serving_support import HOST, compile_models, conv_input, live, metrics  # noqa: E402

import gear_runtime as gr  # noqa: E402
from gear_runtime.errors import InputError  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402
from gear_runtime.serving.deadline import Deadline, request_deadline  # noqa: E402
from gear_runtime.serving.errors import RequestExpiredError  # noqa: E402
from gear_runtime.serving.sequences import SequenceControl, SequenceSlots  # noqa: E402


@pytest.fixture(scope="module")
def conv(tmp_path_factory) -> Path:
    return compile_models(tmp_path_factory.mktemp("deadlines"))["conv"]


@pytest.fixture(scope="module")
def reference(conv):
    model = gr.load(str(conv))
    yield model.create_executor()
    model.close()


@contextmanager
def held_runs(server) -> Iterator[tuple[threading.Event, threading.Event, list[int]]]:
    """(started, release, runs): every run of the server's executors counts itself in
    ``runs``, sets ``started`` and waits for ``release``."""
    ex = next(iter(server.models.values())).pool._executors[0]
    execute = type(ex).execute
    started, release, runs = threading.Event(), threading.Event(), []

    def held(self, *args, **kwargs):
        runs.append(1)
        started.set()
        assert release.wait(30)
        return execute(self, *args, **kwargs)

    with unittest.mock.patch.object(type(ex), "execute", held):
        yield started, release, runs


def _http_infer(port: int, x: np.ndarray, timeout: int | None = None) -> np.ndarray:
    c = triton.InferenceServerClient(f"{HOST}:{port}", network_timeout=60)
    t = triton.InferInput("data", list(x.shape), "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    return c.infer("conv", [t], timeout=timeout).as_numpy("logits")


def _grpc_tensor(x: np.ndarray):
    t = tgrpc.InferInput("data", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return t


@pytest.mark.parametrize("batching", [True, False], ids=["batcher", "pool"])
def test_a_request_queued_past_its_timeout_is_answered_503_and_never_runs(
        conv, reference, batching) -> None:
    server = build_server([str(conv)], options=ServeOptions(executors=1, batching=batching))
    x, first = conv_input(1, 3), {}
    with held_runs(server) as (started, release, runs), live(server) as r:
        # the first request's timeout passes while it runs: it still finishes, answered 200
        running = threading.Thread(
            target=lambda: first.update(out=_http_infer(r.port, x, timeout=100_000)))
        running.start()
        assert started.wait(30)
        t0 = time.monotonic()
        with pytest.raises(triton.InferenceServerException) as info:
            _http_infer(r.port, x, timeout=300_000)
        waited = time.monotonic() - t0
        time.sleep(0.2)  # past the deadline, the first run still held
        release.set()
        running.join(30)
        time.sleep(0.2)  # a dropped request that ran anyway would count now
        errors = metrics(r.port)
    assert info.value.status() == "503", info.value.message()
    assert "Request timeout expired" in info.value.message()
    assert '"timeout" of 300000 microseconds' in info.value.message()
    assert 0.25 < waited < 10  # answered at its deadline, not when the executor freed
    assert len(runs) == 1  # the dropped request never ran
    np.testing.assert_allclose(first["out"], reference.execute([x])[0], rtol=1e-5, atol=1e-6)
    key = ("gear_errors_total", (("code", "request_timeout"), ("model", "conv"),
                                 ("status", "503")))
    assert errors[key] == 1


def test_grpc_timeout_is_unavailable_and_a_deadline_drops_the_request(conv) -> None:
    server = build_server([str(conv)], options=ServeOptions(executors=1))
    x = conv_input(1, 5)
    with held_runs(server) as (started, release, runs), live(server, grpc=True) as r:
        c = tgrpc.InferenceServerClient(f"{HOST}:{r.grpc_port}")
        running = threading.Thread(target=lambda: c.infer("conv", [_grpc_tensor(x)]))
        running.start()
        assert started.wait(30)
        with pytest.raises(tgrpc.InferenceServerException) as timeout:
            c.infer("conv", [_grpc_tensor(x)], timeout=200_000)
        with pytest.raises(tgrpc.InferenceServerException) as deadline:
            c.infer("conv", [_grpc_tensor(x)], client_timeout=0.3)
        release.set()
        running.join(30)
        time.sleep(0.2)
    assert "UNAVAILABLE" in timeout.value.status()
    assert "Request timeout expired" in timeout.value.message()
    assert "DEADLINE_EXCEEDED" in deadline.value.status()
    assert len(runs) == 1  # neither queued request ran


def test_a_sequence_step_past_its_deadline_is_answered_and_skipped_in_its_turn() -> None:
    """Behind a running step of its sequence, a step whose deadline passes is answered its
    error at once; in its turn it is skipped (it never runs); the sequence stays live."""
    import asyncio

    held, calls = threading.Event(), []

    class Executor:
        def reset_state(self) -> None:
            pass

        def close(self) -> None:
            pass

    class Model:
        def create_executor(self, **kwargs) -> Executor:
            return Executor()

    def step(name: str, wait: bool):
        def run(ex) -> str:
            calls.append(name)
            if wait:
                assert held.wait(30)
            return name
        return run

    async def main() -> tuple[str, BaseException, str, float]:
        slots = SequenceSlots(Model(), {"past": "present"}, 1, "decode")
        try:
            await slots.call(SequenceControl(7, True, False), step("start", False))
            first = asyncio.ensure_future(slots.call(SequenceControl(7, False, False),
                                                     step("one", True)))
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            deadline = Deadline(t0 + 0.2, "a test's deadline")
            with pytest.raises(RequestExpiredError) as info:
                await slots.call(SequenceControl(7, False, False), step("two", False),
                                 deadline)
            waited = time.perf_counter() - t0
            held.set()
            one = await first
            three = await slots.call(SequenceControl(7, False, True), step("three", False))
            return one, info.value, three, waited
        finally:
            held.set()
            slots.close()

    one, error, three, waited = asyncio.run(main())
    assert (one, three) == ("one", "three") and calls == ["start", "one", "three"]
    assert "Request timeout expired" in str(error) and 0.15 < waited < 10


def test_the_timeout_parameter_is_checked() -> None:
    assert request_deadline({}, 0.0) is None and request_deadline({"timeout": 0}, 0.0) is None
    assert request_deadline({"timeout": 1_500_000}, 10.0).at == pytest.approx(11.5)
    both = request_deadline({"timeout": 5_000_000}, 10.0, grpc_remaining=2.0)
    assert both.at == pytest.approx(12.0) and both.grpc
    for bad in (-1, 1.5, "100", True, 2**60):
        with pytest.raises(InputError, match='parameter "timeout" must be a whole number'):
            request_deadline({"timeout": bad}, 0.0)
