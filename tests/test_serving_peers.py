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
