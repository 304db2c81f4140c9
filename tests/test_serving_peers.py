"""The forwarding codec of serve --workers (serving/peers.py): a request re-encoded for the
owner decodes to the same tensors and parameters, the owner's outputs come back as they were,
its error keeps status, code and message, and the owner of an id is the same everywhere."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("orjson")

from gear_runtime.serving.errors import PeerAnswerError, http_status  # noqa: E402
from gear_runtime.serving.peers import (  # noqa: E402
    _peer_error,
    decode_reply,
    encode_forward,
    owner_of,
)
from gear_runtime.serving.protocol import (  # noqa: E402
    InferRequest,
    decode_request,
    encode_response,
)


def test_a_forwarded_request_decodes_to_the_same_tensors_and_parameters() -> None:
    ids = np.array([[7, 8, 9]], np.int64)
    pos = np.arange(3, dtype=np.int32)[::-1]  # not contiguous: sent as its values
    request = InferRequest(inputs={"input_ids": ids, "position": pos},
                           datatypes={"input_ids": "INT64", "position": "INT32"}, id="r1",
                           parameters={"sequence_id": "s-1", "sequence_start": True})
    head, body = encode_forward("de code", request)
    assert head.startswith(b"POST /v2/models/de%20code/infer HTTP/1.1\r\n")
    length = int(head.split(b"inference-header-content-length: ")[1].split(b"\r\n")[0])
    raw = b"".join(bytes(b) for b in body)
    assert int(head.split(b"content-length: ")[-1].split(b"\r\n")[0]) == len(raw)
    back = decode_request(raw, str(length))
    assert back.id == "r1" and back.binary_default
    assert back.parameters == {"sequence_id": "s-1", "sequence_start": True,
                               "binary_data_output": True}
    assert back.datatypes == request.datatypes
    for name, array in request.inputs.items():
        assert back.inputs[name].dtype == array.dtype
        np.testing.assert_array_equal(back.inputs[name], array)


def test_the_owners_outputs_come_back_as_they_were() -> None:
    logits = np.random.default_rng(0).standard_normal((1, 1, 50)).astype(np.float32)
    flags = np.array([True, False])
    request = InferRequest(inputs={}, datatypes={}, binary_default=True)
    parts, length = encode_response("decode", request, ["logits", "flags"], [logits, flags])
    out = decode_reply(b"".join(bytes(p) for p in parts), str(length))
    assert [o.dtype for o in out] == [np.float32, np.bool_]
    np.testing.assert_array_equal(out[0], logits)
    np.testing.assert_array_equal(out[1], flags)


def test_the_owners_error_keeps_its_status_code_and_message() -> None:
    exc = _peer_error(400, b'{"error": "[145000] sequence 5 is not live", "code": "145000"}')
    assert isinstance(exc, PeerAnswerError)
    assert (exc.status, exc.code, exc.message) == (400, "145000", "sequence 5 is not live")
    assert str(exc) == "[145000] sequence 5 is not live" and http_status(exc) == 400
    full = _peer_error(503, b'{"error": "[sequences_full] no slot", "code": "sequences_full"}')
    assert http_status(full) == 503 and full.code == "sequences_full"
    odd = _peer_error(502, b"<html>not json</html>")
    assert http_status(odd) == 502 and "not json" in odd.message


def test_every_worker_computes_the_same_owner() -> None:
    assert owner_of(12345, 4) == owner_of(12345, 4) == owner_of("12345", 4)
    owners = {owner_of(i, 4) for i in range(1, 200)}
    assert owners == {0, 1, 2, 3}  # ids spread over every worker
    assert owner_of("s\udcff", 3) in range(3)  # a lone surrogate in a JSON id: no crash


# ---- an owner that answers what is not a reply --------------------------------------------------
def _reply(body: bytes, status: int = 200, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


def _good_body(names: list[str]) -> tuple[bytes, str]:
    request = InferRequest(inputs={}, datatypes={}, binary_default=True)
    arrays = [np.zeros((1, 3), np.float32) for _ in names]
    parts, length = encode_response("decode", request, names, arrays)
    return b"".join(bytes(p) for p in parts), str(length)


def _bad_replies() -> dict[str, bytes]:
    good, length = _good_body(["logits"])
    header = f"inference-header-content-length: {length}\r\n"
    json_part = good[:int(length)]
    return {
        "not HTTP": b"garbage\r\n\r\n",
        "no content-length": b"HTTP/1.1 200 OK\r\n\r\n",
        "a head past the reader's limit": b"HTTP/1.1 200 OK\r\nx: " + b"a" * 70000,
        "cut short": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort",
        "not JSON": _reply(b"<html>", extra=header.replace(length, "6")),
        "JSON of another form": _reply(b"[1, 2]"),
        "outputs of another form": _reply(b'{"outputs": [1]}'),
        "another output": _reply(_good_body(["other"])[0],
                                 extra=f"inference-header-content-length: "
                                       f"{_good_body(['other'])[1]}\r\n"),
        "no outputs": _reply(b'{"outputs": []}'),
        "an output without its shape": _reply(
            b'{"outputs": [{"name": "logits", "datatype": "FP32"}]}'),
        "binary data missing": _reply(json_part, extra=header),
        "a header length past the body": _reply(
            good, extra=f"inference-header-content-length: {len(good) + 9}\r\n"),
    }


@pytest.mark.parametrize("case", list(_bad_replies()))
def test_an_owner_answering_what_is_not_a_reply_is_a_503_not_the_clients_fault(
        case: str, tmp_path) -> None:
    """A worker's socket is any local process's to answer on (a stale worker, a bug): what
    comes back that is not a v2 reply of the model's outputs is a 503 naming the worker,
    never the client's 400, a 500 of ours or a wrong answer."""
    import asyncio

    from gear_runtime.serving.errors import UnavailableError
    from gear_runtime.serving.peers import Peers, socket_path

    reply = _bad_replies()[case]

    async def main() -> None:
        async def owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(owner, socket_path(str(tmp_path), 1))
        peers = Peers(str(tmp_path), 0, 2)
        request = InferRequest(inputs={"ids": np.ones((1, 1), np.int64)},
                               datatypes={"ids": "INT64"}, parameters={"sequence_id": 7})
        try:
            with pytest.raises(UnavailableError, match="worker 1, which holds sequence 7"):
                await peers.forward(1, "decode", request, ["logits"])
        finally:
            peers.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_a_good_reply_with_the_outputs_asked_is_taken(tmp_path) -> None:
    """The same fake owner answering the model's outputs: they come back (the cases above
    fail for what they send, not for the fake)."""
    import asyncio

    from gear_runtime.serving.peers import Peers, socket_path

    good, length = _good_body(["logits", "extra"])
    reply = _reply(good, extra=f"inference-header-content-length: {length}\r\n")

    async def main() -> list[np.ndarray]:
        async def owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()

        server = await asyncio.start_unix_server(owner, socket_path(str(tmp_path), 1))
        peers = Peers(str(tmp_path), 0, 2)
        try:
            return await peers.forward(1, "decode", InferRequest(
                inputs={}, datatypes={}, parameters={"sequence_id": 7}), ["logits", "extra"])
        finally:
            peers.close()
            server.close()

    out = asyncio.run(main())
    assert [o.shape for o in out] == [(1, 3), (1, 3)]


def test_an_owners_error_of_any_json_form_keeps_its_status() -> None:
    exc = _peer_error(400, b"[1, 2]")
    assert http_status(exc) == 400 and "[1, 2]" in exc.message


# ---- the pooled connections to an owner ---------------------------------------------------------
async def _owner_server(tmp_path, close_after_reply: bool) -> tuple[object, list]:
    """A fake owner on worker 1's socket answering every request with the outputs
    ["logits"], kept alive (or closed after one reply: a restart); the list gets one entry
    per connection."""
    import asyncio

    from gear_runtime.serving.peers import socket_path

    good, length = _good_body(["logits"])
    reply = _reply(good, extra=f"inference-header-content-length: {length}\r\n")
    connections: list = []

    async def owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                size = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(size)
                writer.write(reply)
                await writer.drain()
                if close_after_reply:
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    server = await asyncio.start_unix_server(owner, socket_path(str(tmp_path), 1))
    return server, connections


def _forward_twice(tmp_path, close_after_reply: bool, pause: float = 0.2) -> int:
    """Two requests forwarded to the fake owner, ``pause`` apart; how many connections it
    saw (both requests must be answered)."""
    import asyncio

    from gear_runtime.serving.peers import Peers

    async def main() -> int:
        server, connections = await _owner_server(tmp_path, close_after_reply)
        peers = Peers(str(tmp_path), 0, 2)
        request = InferRequest(inputs={"ids": np.ones((1, 1), np.int64)},
                               datatypes={"ids": "INT64"}, parameters={"sequence_id": 7})
        try:
            for _ in range(2):
                (out,) = await peers.forward(1, "decode", request, ["logits"])
                assert out.shape == (1, 3)
                await asyncio.sleep(pause)  # a close reaches this side meanwhile
            return len(connections)
        finally:
            peers.close()
            server.close()

    return asyncio.run(main())


def test_a_kept_alive_connection_to_the_owner_is_reused(tmp_path) -> None:
    assert _forward_twice(tmp_path, close_after_reply=False) == 1


def test_a_connection_the_owner_closed_is_never_reused(tmp_path) -> None:
    """The owner closed the pooled connection after its answer (it restarted): the next
    request goes on a new connection and is answered, never a 503 from the dead one."""
    assert _forward_twice(tmp_path, close_after_reply=True) == 2


def test_a_connection_idle_too_long_is_never_reused(tmp_path, monkeypatch) -> None:
    """A pooled connection idle past IDLE_CONNECTION_S is closed, not reused: the owner's
    keep-alive timeout may be closing it at that very moment."""
    from gear_runtime.serving import peers

    monkeypatch.setattr(peers, "IDLE_CONNECTION_S", 0.1)
    assert _forward_twice(tmp_path, close_after_reply=False, pause=0.3) == 2


# ---- a non-owner worker checks what it can before forwarding ------------------------------------
def test_an_unknown_output_is_refused_before_the_owner_is_asked(tmp_path) -> None:
    """serve --workers: a request of a sequence another worker owns, asking an output the
    model does not have, is the client's 400 on the worker it reached (naming the output),
    never forwarded (where its answer could not be made: a 500). A request that is fine is
    forwarded."""
    import json
    import socket
    import sys
    import threading
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from serving_support import live, request

    from gear_runtime.examples import causal_lm
    from gear_runtime.serving import ServeOptions, build_server
    from gear_runtime.serving.peers import socket_path

    _, decode = causal_lm.write_pair(tmp_path / "lm", causal_lm.SMALL)
    folder = tmp_path / "workers"
    folder.mkdir()
    seq = next(i for i in range(1, 100) if owner_of(i, 2) == 1)
    contacted: list[int] = []
    owner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    owner.bind(socket_path(str(folder), 1))
    owner.listen(4)

    def accept() -> None:  # worker 1: counts who asks, answers nothing (a 503 there)
        while True:
            try:
                conn, _ = owner.accept()
            except OSError:
                return
            contacted.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()

    def step(outputs: list[str]) -> tuple[int, bytes]:
        body = {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64",
                            "data": [1]},
                           {"name": "position", "shape": [1], "datatype": "INT64", "data": [0]}],
                "outputs": [{"name": n} for n in outputs],
                "parameters": {"sequence_id": seq, "sequence_start": True}}
        status, _, answer = request(running.port, "POST", "/v2/models/decode/infer",
                                    json.dumps(body).encode(),
                                    {"Content-Type": "application/json"})
        return status, answer

    server = build_server([str(decode)], options=ServeOptions(
        state=tuple(causal_lm.STATE.items()), executors=1, worker=0, workers=2,
        worker_dir=str(folder)))
    try:
        with live(server) as running:
            status, answer = step(["nope"])
            assert status == 400 and b"no output 'nope'" in answer, (status, answer)
            assert contacted == []
            status, answer = step(["logits"])  # fine: forwarded to worker 1
            assert status == 503 and contacted == [1], (status, answer)
    finally:
        owner.close()
