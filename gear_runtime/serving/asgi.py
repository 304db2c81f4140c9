"""``GearServer.app``: the server's routes as an ASGI application, for Ray Serve's replicas
or any ASGI server. Same routes, limits and replies as ``gear-runtime serve``'s own HTTP
server; the timeouts, connection limits and drain are then the hosting server's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from gear_runtime.serving.http import HttpReply, HttpRequest


class Routes(Protocol):
    """What the ASGI adapter needs of its server (``GearServer``, which creates it: typed
    here, not imported, so that the two modules do not import each other)."""

    def body_limit(self, request: HttpRequest) -> int: ...
    def refuse(self, request: HttpRequest | None, status: int, message: str) -> HttpReply: ...
    async def handle(self, request: HttpRequest) -> HttpReply: ...
    def disconnected(self, request: HttpRequest | None) -> None: ...
    async def close(self) -> None: ...


class AsgiApp:
    """An ASGI 3 application over ``server`` (lifespan: its shutdown closes the models)."""

    def __init__(self, server: Routes) -> None:
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.server.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key, val = name.decode("latin-1").lower(), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        request = HttpRequest(scope["method"], scope["path"],
                              scope.get("query_string", b"").decode("latin-1"), headers,
                              started=time.perf_counter())
        limit = self.server.body_limit(request)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            reply = self.server.refuse(request, 413, f"the body has {declared} bytes; "
                                                     f"{request.path} accepts at most {limit}")
            await _send(send, reply)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.server.disconnected(request)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send(send, self.server.refuse(
                    request, 413, f"the body exceeds {limit} bytes, the most "
                                  f"{request.path} accepts"))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        request.body = b"".join(chunks)
        reply = await self.server.handle(request)
        if reply.stream is None:
            await _send(send, reply, request.method == "HEAD")
            return
        await _send_stream(send, receive, reply, request.method == "HEAD")


async def _send_stream(send: Any, receive: Any, reply: HttpReply, head_only: bool) -> None:
    """A streamed reply, piece by piece; a client that disconnects meanwhile closes the
    stream where it waits (its ``finally`` frees what it holds)."""
    assert reply.stream is not None
    stream = reply.stream
    headers = [(b"content-type", reply.content_type.encode("latin-1"))]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})

    async def pump() -> None:
        if not head_only:
            async for piece in stream:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    pumping, watching = asyncio.ensure_future(pump()), asyncio.ensure_future(watch())
    try:
        await asyncio.wait((pumping, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pumping, watching):
            task.cancel()
        await asyncio.gather(pumping, watching, return_exceptions=True)
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    if pumping.done() and not pumping.cancelled():
        error = pumping.exception()
        if error is not None:
            raise error


async def _send(send: Any, reply: HttpReply, head_only: bool = False) -> None:
    body = reply.body if isinstance(reply.body, bytes) else b"".join(
        bytes(p) for p in reply.body)
    headers = [(b"content-type", reply.content_type.encode("latin-1")),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head_only else body})
