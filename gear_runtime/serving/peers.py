"""``serve --workers N`` with a stateful model: each sequence's requests run on the one worker
that holds its state.

A connection lands on any worker (the kernel picks), so a sequence's requests may reach
several. Each sequence id has one owner, ``crc32(str(id)) % N``: every worker computes the
same owner with no shared table, and a worker that restarts owns the same ids again (their
state is lost with it: their next step answers 400 "not live", as after an idle timeout).
A request that reaches another worker is decoded there (a bad request is refused there),
sent on to the owner over the owner's Unix socket in the workers' folder (the v2 binary
protocol, every output in binary), and answered from the owner's answer in the client's
protocol; an error the owner answers goes back unchanged (status, code, message). The owner
counts the request, once, in its statistics and metrics.

The step payload of a generation is a few token ids, so the hop costs a local round trip
(measured in benchmarks/bench_sequences.py), never the state: that stays on its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from gear_runtime.errors import InputError
from gear_runtime.serving.errors import PeerAnswerError, UnavailableError
from gear_runtime.serving.protocol import (
    DATATYPES,
    HEADER_LENGTH,
    InferRequest,
    binary_tensor,
    check_datatype,
    check_shape,
    split_body,
)

#: a pooled connection idle longer than this is closed rather than reused (the owner's
#: keep-alive timeout closes its side after 75 s by default)
IDLE_CONNECTION_S = 30.0
#: connections kept open per peer
POOL_SIZE = 8


def socket_path(directory: str, index: int) -> str:
    """Where worker ``index`` listens for the requests of the sequences it owns."""
    return os.path.join(directory, f"worker-{index}.sock")


def owner_of(sequence_id: int | str, workers: int) -> int:
    """The worker that owns ``sequence_id``: the same in every process (crc32, not hash())."""
    return zlib.crc32(str(sequence_id).encode("utf-8", "surrogatepass")) % workers


class Peers:
    """This worker's view of the others: who owns a sequence, and the forwarding to it."""

    def __init__(self, directory: str, index: int, count: int) -> None:
        self.directory, self.index, self.count = directory, index, count
        self._idle: dict[int, list[tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                         float]]] = {}

    @property
    def path(self) -> str:
        """This worker's own socket."""
        return socket_path(self.directory, self.index)

    def owner(self, sequence_id: int | str) -> int:
        return owner_of(sequence_id, self.count)

    async def forward(self, owner: int, model: str, request: InferRequest,
                      outputs: Sequence[str]) -> list[np.ndarray]:
        """Run ``request`` on worker ``owner``; its outputs, which must be ``outputs`` (every
        output of the model but the state, in model order). PeerAnswerError for the owner's
        error answer; UnavailableError (503) when the owner does not answer (restarting, or
        stopped) or answers what is not such a reply: the client's request was fine, so it
        never becomes the client's 400 (nor a 500 of ours)."""
        head, body = encode_forward(model, request)
        reader, writer = await self._connection(owner, request)
        try:
            writer.writelines([head, *body])
            await writer.drain()
            status, headers, payload = await _read_reply(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:
            writer.close()
            raise UnavailableError(
                f"worker {owner}, which holds sequence {_seq(request)!r}, did not answer "
                f"({type(exc).__name__}): retry later") from None
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self._release(owner, reader, writer)
        if status != 200:
            raise _peer_error(status, payload)
        try:
            return decode_reply(payload, headers.get(HEADER_LENGTH.lower()), outputs)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UnavailableError(
                f"worker {owner}, which holds sequence {_seq(request)!r}, answered a reply "
                f"that is not the model's outputs ({exc}): retry later") from None

    async def _connection(self, owner: int, request: InferRequest
                          ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        idle = self._idle.setdefault(owner, [])
        now = time.monotonic()
        while idle:
            reader, writer, since = idle.pop()
            if now - since < IDLE_CONNECTION_S and not reader.at_eof() and \
                    not writer.is_closing():
                return reader, writer
            writer.close()
        try:
            return await asyncio.open_unix_connection(socket_path(self.directory, owner))
        except OSError as exc:
            raise UnavailableError(
                f"worker {owner}, which holds sequence {_seq(request)!r}, is not answering "
                f"({exc.strerror or exc}): it may be restarting; retry later") from None

    def _release(self, owner: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        idle = self._idle.setdefault(owner, [])
        if len(idle) < POOL_SIZE:
            idle.append((reader, writer, time.monotonic()))
        else:
            writer.close()

    def close(self) -> None:
        """Close every pooled connection."""
        for idle in self._idle.values():
            for _, writer, _ in idle:
                writer.close()
        self._idle.clear()


#: The header a worker's scrape of another sends (value "own"): answer with your own series
#: alone (serving/metrics.py merges them).
OWN_HEADER = "x-gear-scrape"


async def scrape_peer(path: str, timeout: float, limit: int) -> bytes:
    """The body of ``GET /metrics`` (that worker's own series: :data:`OWN_HEADER`) from the
    worker listening on the Unix socket ``path``, within ``timeout`` seconds. OSError (not
    listening), asyncio.TimeoutError (not answering: its loop blocked), ValueError (an answer
    that is not a 200 reply of at most ``limit`` bytes)."""

    async def ask() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            writer.write(f"GET /metrics HTTP/1.1\r\nhost: gear-worker\r\n{OWN_HEADER}: own"
                         "\r\nconnection: close\r\n\r\n".encode("latin-1"))
            await writer.drain()
            status, _, body = await _read_reply(reader, limit)
        finally:
            writer.close()
        if status != 200:
            raise ValueError(f"answered {status} to a scrape, expected 200: {body[:100]!r}")
        return body

    return await asyncio.wait_for(ask(), timeout)


def _seq(request: InferRequest) -> Any:
    return request.parameters.get("sequence_id")


# ---- the forwarded request and its answer: v2 binary tensors ----------------------------------
def encode_forward(model: str, request: InferRequest) -> tuple[bytes, list[Any]]:
    """(HTTP head, body buffers) of ``request`` as a v2 binary request for ``model``: the
    inputs as sent (datatype and shape), the parameters (the sequence's among them), every
    output asked in binary."""
    inputs, chunks = [], []
    for name, array in request.inputs.items():
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        inputs.append({"name": name, "datatype": request.datatypes[name],
                       "shape": list(array.shape),
                       "parameters": {"binary_data_size": raw.nbytes}})
        chunks.append(raw.data.cast("B") if raw.nbytes else b"")
    params = {k: v for k, v in request.parameters.items() if k != "binary_data_output"}
    doc: dict[str, Any] = {"inputs": inputs,
                           "parameters": {**params, "binary_data_output": True}}
    if request.id is not None:
        doc["id"] = request.id
    json_part = orjson.dumps(doc)
    size = len(json_part) + sum(memoryview(c).nbytes for c in chunks)
    head = (f"POST /v2/models/{_quote(model)}/infer HTTP/1.1\r\nhost: gear-worker\r\n"
            f"content-type: application/octet-stream\r\n"
            f"{HEADER_LENGTH.lower()}: {len(json_part)}\r\ncontent-length: {size}\r\n\r\n")
    return head.encode("latin-1"), [json_part, *chunks]


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


async def _read_reply(reader: asyncio.StreamReader, limit: int | None = None
                      ) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-case headers, body) of one HTTP/1.1 reply with a content-length (the
    server's own replies always have one) of at most ``limit`` bytes (None: any). ValueError
    on anything else."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP reply: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    length = headers.get("content-length", "")
    if not length.isdigit():
        raise ValueError("a reply without a content-length")
    if limit is not None and int(length) > limit:
        raise ValueError(f"a reply of {length} bytes, more than {limit}")
    return int(parts[1]), headers, await reader.readexactly(int(length))


def decode_reply(body: bytes, header_length: str | None,
                 names: Sequence[str] | None = None) -> list[np.ndarray]:
    """The outputs of a v2 response whose outputs are all binary, in its order; with
    ``names``, exactly those outputs in that order. ValueError (InputError) for a reply that
    is not that (KeyError / TypeError for a document of the wrong form)."""
    text, binary = split_body(body, header_length)
    doc = orjson.loads(text)
    entries = doc["outputs"] if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("worker reply: no list of outputs")
    got = [e.get("name") for e in entries]
    if names is not None and got != list(names):
        raise ValueError(f"worker reply: outputs {got}, expected {list(names)}")
    outputs, offset = [], 0
    for entry in entries:
        name = entry["name"]
        shape = check_shape(name, entry["shape"])
        dtype = DATATYPES[check_datatype(name, entry["datatype"])]
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            raise InputError(f"worker reply: output {name!r} is not binary")
        outputs.append(binary_tensor(name, shape, dtype, size, binary[offset:]))
        offset += size
    return outputs


def _peer_error(status: int, body: bytes) -> PeerAnswerError:
    """The owner's error answer ``{"error": "[code] message", "code": code}`` as an error
    that keeps its status, code and message."""
    doc: Any = {}
    with contextlib.suppress(ValueError):
        doc = orjson.loads(body)
    if not isinstance(doc, dict):  # valid JSON of another form: its text is the message
        doc = {}
    text = str(doc.get("error", body[:200].decode("utf-8", "replace")))
    code = str(doc.get("code", "") or "")
    prefix = f"[{code}] "
    message = text[len(prefix):] if code and text.startswith(prefix) else text
    return PeerAnswerError(message, code, status)


__all__ = ["Peers", "decode_reply", "encode_forward", "owner_of", "scrape_peer",
           "socket_path"]
