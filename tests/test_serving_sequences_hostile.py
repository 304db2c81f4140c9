"""Issue 48: a stateful model's sequences under hostile clients. A request that is cut off
(a hang-up, a client timeout, a gRPC deadline) leaves its sequence's slot held until its run
is done; sequence requests obey --max-queue and readiness never reads the queue; a start
that fails leaves no live sequence; an id may start again right after its end.

Runs are made slow with a gate (a threading.Event the run waits on), never with a race
against the wall clock: each test holds on a loaded machine."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serving_support import HOST, live, request  # noqa: E402

from gear_runtime.errors import ClosedError, InputError  # noqa: E402
from gear_runtime.examples import causal_lm  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402
from gear_runtime.serving.errors import QueueFullError  # noqa: E402
from gear_runtime.serving.sequences import (  # noqa: E402
    SequenceControl,
    SequencesFullError,
    SequenceSlots,
    sequence_control,
)
from gear_runtime.serving.served import ServedModel  # noqa: E402
from gear_runtime.serving.start import StartModel  # noqa: E402

STATE = tuple(causal_lm.STATE.items())
SIZES = causal_lm.SMALL
WAIT = 30  # seconds a gate or a thread may take at most: a hang, never a timing


class _Executor:
    """A slot's executor: its state a word, each run logged, a second run at once an error
    (what a real executor answers: "executor busy")."""

    def __init__(self) -> None:
        self.state, self.busy, self.log, self.closed = "zero", False, [], False

    def reset_state(self) -> None:
        self.log.append("reset")
        self.state = "zero"

    def close(self) -> None:
        self.closed = True


class _Model:
    def create_executor(self, state=None, in_place_state=False) -> _Executor:
        return _Executor()


def _run(name: str, gate: threading.Event | None = None,
         entered: threading.Event | None = None, writes: str | None = None):
    """A run on a slot's executor: logs ``name``, waits for ``gate`` (``entered`` set once
    it runs), writes ``writes`` into the state; answers (state seen, busy seen)."""
    def run(ex: _Executor) -> tuple[str, bool]:
        seen = (ex.state, ex.busy)
        ex.busy = True
        try:
            if entered is not None:
                entered.set()
            if gate is not None:
                assert gate.wait(WAIT)
            ex.log.append(name)
            if writes is not None:
                ex.state = writes
            return seen
        finally:
            ex.busy = False
    return run


def _slots(size: int = 2, **kw) -> SequenceSlots:
    return SequenceSlots(_Model(), causal_lm.STATE, size, "m", **kw)


async def _entered(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, WAIT)


# ---- finding 1: a cut-off request holds its slot until its run is done --------------------
async def _running(slots: SequenceSlots, control: SequenceControl, name: str,
                   **kw) -> tuple[asyncio.Future, threading.Event]:
    """``slots.call(control, ...)`` started and inside its run, held at its gate: the task
    and the gate that lets the run finish."""
    gate, entered = threading.Event(), threading.Event()
    task = asyncio.ensure_future(slots.call(control, _run(name, gate, entered, **kw)))
    await _entered(entered)
    return task, gate


def test_a_cancelled_start_holds_the_slot_until_its_run_is_done() -> None:
    """The start's task is cancelled mid-run (the client went away): the next step of the
    sequence waits for that run and sees what it wrote, never an empty state, and never
    runs beside it on the same executor."""
    slots = _slots(2)  # two slot threads: a step released early would run at once

    async def main() -> None:
        first, gate = await _running(slots, SequenceControl(1, True, False), "start",
                                     writes="prompt")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        step = asyncio.ensure_future(slots.call(SequenceControl(1, False, False),
                                                _run("step")))
        done, _ = await asyncio.wait([step], timeout=1.0)
        assert not done, f"the step ran while the start still ran: saw {step.result()}"
        gate.set()
        assert await step == ("prompt", False)

    asyncio.run(main())
    slots.close()


def test_a_cancelled_step_keeps_the_next_one_behind_it() -> None:
    """Without a start model: a cut-off step's run goes on; the next step waits for it
    (before: it ran at once on the same executor, a 500 "executor busy")."""
    slots = _slots(2)

    async def main() -> None:
        await slots.call(SequenceControl(1, True, False), _run("start"))
        cut, gate = await _running(slots, SequenceControl(1, False, False), "slow", writes="slow")
        cut.cancel()
        nxt = asyncio.ensure_future(slots.call(SequenceControl(1, False, False),
                                               _run("next")))
        done, _ = await asyncio.wait([nxt], timeout=1.0)
        assert not done, f"the next step ran beside the cut-off one: saw {nxt.result()}"
        gate.set()
        assert await nxt == ("slow", False)
        assert slots._slots[0].executor.log == ["reset", "start", "slow", "next"]

    asyncio.run(main())
    slots.close()


def test_a_start_cancelled_before_it_ran_leaves_the_sequence_not_live() -> None:
    """A start over, cut off while it waits behind a step: it never runs, and the steps
    after it are refused as not live (never run on the state the start would have
    replaced)."""
    slots = _slots(1)

    async def main() -> None:
        await slots.call(SequenceControl(1, True, False), _run("start"))
        busy, gate = await _running(slots, SequenceControl(1, False, False), "busy")
        again = asyncio.ensure_future(slots.call(SequenceControl(1, True, False),
                                                 _run("again")))
        after = asyncio.ensure_future(slots.call(SequenceControl(1, False, False),
                                                 _run("after")))
        await asyncio.sleep(0)
        again.cancel()  # the client went away: its task ends before the run's turn
        await asyncio.gather(again, return_exceptions=True)
        gate.set()
        await busy
        with pytest.raises(InputError, match="not live"):
            await after
        assert slots._slots[0].executor.log == ["reset", "start", "busy"]
        assert slots.live == 0 and slots.waiting == 0
        with pytest.raises(InputError, match="not live"):
            await slots.call(SequenceControl(1, False, False), _run("late"))

    asyncio.run(main())
    slots.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    from gear_runtime.tools import generate
    return generate.build_pair(tmp_path_factory.mktemp("pair"), SIZES)


class _Gate:
    """Holds every run of ``owner.method`` (a class attribute, patched) until opened."""

    def __init__(self, monkeypatch, owner: type, method: str) -> None:
        self.open, self.entered = threading.Event(), threading.Event()
        self.open.set()
        inner = getattr(owner, method)

        def gated(*args, **kwargs):
            self.entered.set()
            assert self.open.wait(WAIT)
            return inner(*args, **kwargs)

        monkeypatch.setattr(owner, method, gated)

    def close(self) -> None:
        self.open.clear()
        self.entered.clear()


def _prompt_body(prompt: np.ndarray, seq: int) -> bytes:
    ids = {"shape": list(prompt.shape), "datatype": "INT64", "data": prompt.ravel().tolist()}
    return json.dumps({"inputs": [{"name": "input_ids", **ids},
                                  {"name": "attention_mask", **ids,
                                   "data": [1] * prompt.size}],
                       "parameters": {"sequence_id": seq, "sequence_start": True}}).encode()


def _step_body(token: int, pos: int, seq, **flags) -> bytes:
    return json.dumps({
        "inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64",
                    "data": [token]},
                   {"name": "position", "shape": [1], "datatype": "INT64", "data": [pos]}],
        "parameters": {"sequence_id": seq, **flags}}).encode()


def _infer(port: int, body: bytes) -> tuple[int, dict]:
    status, _, answer = request(port, "POST", "/v2/models/decode/infer", body,
                                {"Content-Type": "application/json"})
    return status, json.loads(answer)


def _logits(answer: dict) -> np.ndarray:
    (out,) = [o for o in answer["outputs"] if o["name"] == "logits"]
    return np.array(out["data"], np.float32)


def _hang_up_after_sending(port: int, body: bytes, gate: _Gate) -> None:
    """Send an infer request, wait until its run is held at the gate, hang up (a reset:
    a plain close is a half-close, which the server still answers)."""
    with socket.create_connection((HOST, port), timeout=WAIT) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(b"POST /v2/models/decode/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert gate.entered.wait(WAIT)


def _grpc_cut_off(port: int, prompt: np.ndarray, seq: int) -> None:
    """A start over gRPC with a deadline the held run outlives."""
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException
    client = tgrpc.InferenceServerClient(f"{HOST}:{port}")
    inputs = [tgrpc.InferInput("input_ids", list(prompt.shape), "INT64"),
              tgrpc.InferInput("attention_mask", list(prompt.shape), "INT64")]
    inputs[0].set_data_from_numpy(prompt)
    inputs[1].set_data_from_numpy(np.ones_like(prompt))
    with pytest.raises(InferenceServerException, match="(?i)deadline"):
        client.infer("decode", inputs, sequence_id=seq, sequence_start=True,
                     client_timeout=0.5)


@pytest.mark.parametrize("cut", ["http hang-up", "grpc deadline"])
def test_steps_after_a_cut_off_start_see_its_cache(pair, monkeypatch, cut) -> None:
    """serve --sequence-start: the client of a start hangs up (or its gRPC deadline passes)
    while the prefill runs; its next steps answer what an uncut sequence answers (before:
    200 from an empty cache)."""
    _, prefill_gear, decode = pair
    prompt = causal_lm.prompt(20, SIZES, seed=4)
    gate = _Gate(monkeypatch, StartModel, "run")
    server = build_server([str(decode)], options=ServeOptions(
        state=STATE, max_sequences=4, sequence_start=str(prefill_gear)))
    with live(server, grpc=True) as running:
        status, answer = _infer(running.port, _prompt_body(prompt, 1))  # the reference
        assert status == 200
        token = int(_logits(answer).argmax())
        _, want = _infer(running.port, _step_body(token, 20, 1))
        gate.close()
        if cut == "http hang-up":
            _hang_up_after_sending(running.port, _prompt_body(prompt, 2), gate)
        else:
            _grpc_cut_off(running.grpc_port, prompt, 2)
        got: list = []
        step = threading.Thread(target=lambda: got.append(
            _infer(running.port, _step_body(token, 20, 2))))
        step.start()
        step.join(1.0)  # on the old code the step answered here, from an empty cache
        gate.open.set()
        step.join(WAIT)
        status, answer = got[0]
        assert status == 200, answer
        np.testing.assert_allclose(_logits(answer), _logits(want), rtol=1e-5, atol=1e-5)


# ---- finding 2: sequence requests obey --max-queue; readiness never reads the queue -------
@pytest.fixture(scope="module")
def decode(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, decode = causal_lm.write_pair(tmp_path_factory.mktemp("lm"), SIZES)
    return decode


def test_one_sequences_flood_is_refused_and_the_server_stays_ready(decode,
                                                                    monkeypatch) -> None:
    """One client piles 10 steps on its sequence (one runs, held): 4 wait (--max-queue 4),
    the others get 503 queue_full; the server and the model stay ready all along (a probe
    never takes the pod out for one client's backlog); the waiting ones answer 200 once the
    run goes on."""
    gate = _Gate(monkeypatch, ServedModel, "_run_one")
    server = build_server([str(decode)], options=ServeOptions(state=STATE, max_sequences=2,
                                                              max_queue=4))
    model = server.models["decode"]
    with live(server) as running:
        port = running.port
        assert _infer(port, _step_body(1, 0, 7, sequence_start=True))[0] == 200
        gate.close()
        answers: list[tuple[int, dict]] = []
        threads = [threading.Thread(target=lambda: answers.append(
            _infer(port, _step_body(1, 1, 7)))) for _ in range(10)]
        for t in threads:
            t.start()
        assert gate.entered.wait(WAIT)
        refused = _wait_for(lambda: len(answers) >= 5)
        assert refused, f"nothing refused: {len(answers)} answered, depth " \
                        f"{model.queue_depth()} (--max-queue 4)"
        assert model.queue_depth() == 4
        assert request(port, "GET", "/v2/health/ready")[0] == 200
        assert request(port, "GET", "/v2/models/decode/ready")[0] == 200
        gate.open.set()
        for t in threads:
            t.join(WAIT)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 5 + [503] * 5
    assert all("queue_full" in a["error"] for s, a in answers if s == 503)


def _wait_for(condition, timeout: float = 10.0) -> bool:
    import time
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_the_bound_refuses_only_requests_that_would_wait() -> None:
    """Past the bound a request that would wait is refused (QueueFullError, 503); another
    sequence's request, which runs at once on its own slot, is not."""
    slots = _slots(2, max_waiting=1)

    async def main() -> None:
        held, gate = await _running(slots, SequenceControl(1, True, False), "held")
        queued = asyncio.ensure_future(slots.call(SequenceControl(1, False, False),
                                                  _run("queued")))
        await asyncio.sleep(0)  # the task is admitted
        try:
            with pytest.raises(QueueFullError, match="--max-queue 1"):  # at once
                await asyncio.wait_for(slots.call(SequenceControl(1, False, False),
                                                  _run("refused")), 5)
            assert await slots.call(SequenceControl(2, True, False), _run("other")) \
                == ("zero", False)
        finally:
            gate.set()
        await asyncio.gather(held, queued)

    asyncio.run(main())
    slots.close()


# ---- finding 3: a failed start leaves no live sequence -------------------------------------
def test_a_refused_start_leaves_the_sequence_not_live(pair) -> None:
    """A 129-token prompt to a start model whose largest gear is 128: the start is 400
    [145013], the next step of that id 400 "not live" (before: 200 on a zeroed cache), and
    the one slot is free for another sequence."""
    _, prefill_gear, decode = pair
    server = build_server([str(decode)], options=ServeOptions(
        state=STATE, max_sequences=1, sequence_start=str(prefill_gear)))
    with live(server) as running:
        for length in (129, 500):
            status, answer = _infer(running.port,
                                    _prompt_body(causal_lm.prompt(length, SIZES), 3))
            assert status == 400 and "145013" in answer["error"], answer
            status, answer = _infer(running.port, _step_body(1, length, 3))
            assert status == 400 and "not live" in answer["error"], answer
            assert server.models["decode"].sequences.live == 0
            status, answer = _infer(running.port,
                                    _prompt_body(causal_lm.prompt(9, SIZES), 4))
            assert status == 200, answer
            assert _infer(running.port, _step_body(1, 9, 4, sequence_end=True))[0] == 200


def test_a_failed_start_frees_its_slot() -> None:
    slots = _slots(1)

    async def main() -> None:
        def fails(ex):
            raise InputError("no gear fits")
        with pytest.raises(InputError, match="no gear fits"):
            await slots.call(SequenceControl(1, True, False), fails)
        assert slots.live == 0
        with pytest.raises(InputError, match="sequence 1 .* is not live"):
            await slots.call(SequenceControl(1, False, False), _run("step"))
        assert await slots.call(SequenceControl(2, True, False), _run("start")) \
            == ("zero", False)

    asyncio.run(main())
    slots.close()


# ---- finding 4: an id starts again right after its end -------------------------------------
def test_an_end_then_an_immediate_start_of_the_same_id() -> None:
    """The end still runs when the new start arrives: the start waits for it, then resets
    the state and runs (Triton reuses an id after its end)."""
    slots = _slots(1)

    async def main() -> None:
        await slots.call(SequenceControl(5, True, False), _run("start", writes="old"))
        end, gate = await _running(slots, SequenceControl(5, False, True), "end")
        again = asyncio.ensure_future(slots.call(SequenceControl(5, True, False),
                                                 _run("again")))
        gate.set()
        assert await end == ("old", False)
        assert await again == ("zero", False)
        assert slots._slots[0].executor.log == ["reset", "start", "end", "reset", "again"]
        assert slots.live == 1
        assert await slots.call(SequenceControl(5, False, True), _run("step")) \
            == ("zero", False)
        assert slots.live == 0

    asyncio.run(main())
    slots.close()


def test_an_end_then_a_start_of_the_same_id_over_http(decode, monkeypatch) -> None:
    gate = _Gate(monkeypatch, ServedModel, "_run_one")
    server = build_server([str(decode)], options=ServeOptions(state=STATE, max_sequences=1))
    with live(server) as running:
        port = running.port
        assert _infer(port, _step_body(1, 0, 8, sequence_start=True))[0] == 200
        gate.close()
        got: list = []
        end = threading.Thread(target=lambda: got.append(
            _infer(port, _step_body(1, 1, 8, sequence_end=True))))
        end.start()
        assert gate.entered.wait(WAIT)
        start = threading.Thread(target=lambda: got.append(
            _infer(port, _step_body(1, 0, 8, sequence_start=True))))
        start.start()
        assert _wait_for(lambda: server.models["decode"].sequences.waiting == 1)
        gate.open.set()
        end.join(WAIT)
        start.join(WAIT)
    assert [s for s, _ in got] == [200, 200], got


# ---- guards: mutations no other test catches -----------------------------------------------
@pytest.mark.parametrize("cancelled", [False, True])
def test_idle_expiry_never_frees_a_sequence_whose_step_runs(cancelled) -> None:
    slots = _slots(1, idle_s=0.0)

    async def main() -> None:
        held, gate = await _running(slots, SequenceControl(1, True, False), "held")
        try:
            if cancelled:  # the client went away: its task ends, its run goes on
                held.cancel()
                await asyncio.gather(held, return_exceptions=True)
            with pytest.raises(SequencesFullError):  # at once: never queued behind "held"
                await asyncio.wait_for(slots.call(SequenceControl(2, True, False),
                                                  _run("thief")), 5)
        finally:
            gate.set()
        await asyncio.gather(held, return_exceptions=True)
        await asyncio.sleep(0.05)  # the slot is idle now: a new start takes it
        assert await slots.call(SequenceControl(2, True, False), _run("next")) \
            == ("zero", False)

    asyncio.run(main())
    slots.close()


def test_a_step_queued_behind_its_end_never_runs() -> None:
    slots = _slots(1)

    async def main() -> None:
        await slots.call(SequenceControl(1, True, False), _run("start"))
        end, gate = await _running(slots, SequenceControl(1, False, True), "end")
        late = asyncio.ensure_future(slots.call(SequenceControl(1, False, False),
                                                _run("late")))
        gate.set()
        await end
        with pytest.raises(InputError, match="sequence 1 .*ended"):
            await late
        await slots.call(SequenceControl(2, True, False), _run("other"))
        assert slots._slots[0].executor.log == ["reset", "start", "end", "reset", "other"]

    asyncio.run(main())
    slots.close()


@pytest.mark.parametrize("params", [{"sequence_id": ""}, {"sequence_id": 0}, {}])
def test_an_empty_id_is_no_sequence(params) -> None:
    with pytest.raises(InputError, match="sequence_id"):
        sequence_control(params)


def test_past_the_drain_deadline_sequence_requests_are_refused() -> None:
    slots = _slots(1)

    async def main() -> None:
        held, gate = await _running(slots, SequenceControl(1, True, False), "held")
        queued = asyncio.ensure_future(slots.call(SequenceControl(1, False, False),
                                                  _run("queued")))
        await asyncio.sleep(0)
        slots.refusing = True
        gate.set()
        assert await held == ("zero", False)  # running: finishes
        with pytest.raises(ClosedError, match="drain deadline"):
            await queued
        with pytest.raises(ClosedError, match="drain deadline"):
            await slots.call(SequenceControl(1, False, False), _run("new"))
        assert slots._slots[0].executor.log == ["reset", "held"]

    asyncio.run(main())
    slots.close()


def test_past_the_drain_deadline_a_request_is_refused_at_once() -> None:
    """Past the drain deadline every new sequence request is answered at once with the
    drain's 503 (retry on another replica): never queued behind its sequence's running
    step, never "sequences full" nor "not live" instead."""
    slots = _slots(1)

    async def main() -> None:
        held, gate = await _running(slots, SequenceControl(1, True, False), "held")
        slots.refusing = True
        try:
            for control in (SequenceControl(1, False, False), SequenceControl(2, True, False),
                            SequenceControl(3, False, False)):
                with pytest.raises(ClosedError, match="drain deadline"):
                    await asyncio.wait_for(slots.call(control, _run("new")), 5)
        finally:
            gate.set()
        assert await held == ("zero", False)  # running: finishes
        assert slots._slots[0].executor.log == ["reset", "held"] and slots.waiting == 0

    asyncio.run(main())
    slots.close()
