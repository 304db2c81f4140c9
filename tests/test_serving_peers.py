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
