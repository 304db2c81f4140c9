"""A small HTTP/1.1 server on asyncio and httptools, built for what a model server needs.

Why not a general ASGI server: a model server on a loopback or in-cluster link must (1) set
TCP_NODELAY on every connection (without it a small response waits ~40 ms for the client's
delayed ACK: Nagle's algorithm), (2) bound how long a client may take to send its headers and
its body, and how many connections it may hold, (3) refuse an oversized body from its headers
or while it streams, at a limit that depends on the route (the model's largest request), and
(4) on shutdown answer every request whose bytes it has received. uvicorn (0.54) does (1)
only on uvloop, has no header/body timeout for (2), and on SIGTERM closes its listener and its
idle keep-alive connections at once, resetting requests already on the wire (4).

The server knows nothing about models: an :class:`HttpApp` says how large a body a request
may have, answers requests, and builds the error replies (its error format, its metrics).
Requests on one connection are answered in order (pipelining); a connection with a request
being answered reads at most one more before it stops reading (backpressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http
import logging
import socket
import struct
import sys
import termios
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, cast

import httptools

logger = logging.getLogger("gear_runtime.serving")

#: Response bodies at most this large are sent in the same write as their headers.
_SMALL_REPLY = 64 * 2**10
#: A connection that is closed waits this long for the client to hang up first (see
#: _Connection.close_after_reply).
_LINGER_S = 2.0
#: How often a drain checks whether every received request is answered.
_DRAIN_POLL_S = 0.01


@dataclass(frozen=True)
class HttpLimits:
    """What a client may do (``gear-runtime serve`` flags)."""

    #: from a request's first byte to the end of its headers (a slow-headers client)
    header_timeout_s: float = 10.0
    #: longest pause between two pieces of a body (a client that stops mid-body)
    body_timeout_s: float = 30.0
    #: after body_timeout_s, a body must have come at this many bytes/s on average (a
    #: client trickling a byte now and then would hold its connection slot for good)
    min_body_rate: float = 1024.0
    #: an idle keep-alive connection is closed after this long
    keep_alive_s: float = 75.0
    #: open connections; one more is answered 503 at once and closed
    max_connections: int = 2048
    #: the request line and headers of one request
    max_header_bytes: int = 64 * 2**10


@dataclass
class HttpRequest:
    """One request. ``headers``: lower-case names (repeated headers joined by ", ")."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes = b""
    #: time.perf_counter() when its headers were complete
    started: float = 0.0


@dataclass
class HttpReply:
    """One response: ``body`` is bytes or a sequence of buffers sent one after the other;
    or, with ``stream``, the body is what the stream yields, each piece sent as it comes
    (chunked transfer encoding: Server-Sent Events). A streamed reply whose client goes
    away is closed (``aclose``) where it waits: its ``finally`` frees what it holds."""

    status: int
    body: bytes | Sequence[bytes | memoryview] = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncIterator[bytes] | None = None


class HttpApp(Protocol):
    """What the server asks of the application."""

    def body_limit(self, request: HttpRequest) -> int:
        """The largest body ``request`` may have (its headers are read, its body not yet)."""

    def refuse(self, request: HttpRequest | None, status: int, message: str) -> HttpReply:
        """The reply for a request refused by the server itself (400 malformed, 408 too
        slow, 413 too large, 503 too many connections or shutting down)."""

    def handle(self, request: HttpRequest) -> Awaitable[HttpReply]:
        """Answer a complete request. Must not raise (an exception is a 500, logged)."""

    def disconnected(self, request: HttpRequest | None) -> None:
        """A client hung up before its request (``request``: None if its headers were not
        complete) was answered."""


#: raw body bytes allowed past twice the body limit: framing of ordinary chunk sizes
RAW_BODY_SLACK = 2**20


async def _close_stream(reply: HttpReply) -> None:
    """Close a streamed reply's stream (an async generator's ``finally`` runs now)."""
    close = getattr(reply.stream, "aclose", None)
    if close is not None:
        await close()


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request that is already answered."""


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def pending_bytes(sock: object) -> int:
    """Bytes received on ``sock`` (anything with ``fileno()``) and not read yet (FIONREAD);
    0 when it cannot be told."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):
        return 0
    return struct.unpack("i", buf)[0]


def accept_queue_length(sock: socket.socket) -> int | None:
    """Connections the kernel has completed on listening ``sock`` that nobody has accepted
    yet: Linux reports them as ``tcpi_unacked`` of TCP_INFO on a listening socket. None
    where that cannot be read (other systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except OSError:
        return None
    # struct tcp_info: 8 single bytes, then __u32 rto, ato, snd_mss, rcv_mss, unacked, ...
    return struct.unpack_from("I", info, 24)[0]


class _Connection(asyncio.Protocol):
    """One client connection: parse, queue, answer in order, time out, close."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        # the request being received
        self.receiving = False
        self.url = b""
        self.header_list: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.request: HttpRequest | None = None
        self.chunks: list[bytes] = []
        self.body_size = 0
        self.body_started = 0.0
        self.body_cap = 0
        # complete requests (or replies decided already) waiting their turn, with keep-alive
        self.queue: deque[tuple[HttpRequest | HttpReply, bool]] = deque()
        self.answering: asyncio.Task | None = None
        self.current: HttpRequest | None = None
        self.closing = False  # a reply with "connection: close" is written or being written
        self.paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.last_activity = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_kind = ""
        self.overflowed = False
        #: a 100 Continue owed to the request being received, held back until the answers
        #: before it are written (a 100 may not come before an earlier request's answer)
        self.continue_owed = False
        #: bytes read since the request's headers ended: chunk framing and chunk extensions
        #: count too (the parser hands only the data to on_body)
        self.raw_body = 0

    # ---- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream protocol's transport: asyncio types the argument as its base class
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # responses are small writes: never let Nagle's algorithm hold one back
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.server.connections) >= self.limits.max_connections:
            self._overflow(self.transport)
            return
        self.server.connections.add(self)
        self._arm("idle", self.limits.keep_alive_s)

    def _overflow(self, transport: asyncio.Transport) -> None:
        """One connection past the limit: a quick 503 and close (never an fd exhausted by
        clients that hold connections). Past twice the limit, closed without a word."""
        self.overflowed = True
        self.server.overflow += 1
        self.server.refused_connections += 1
        if self.server.overflow > self.limits.max_connections:
            transport.abort()
            return
        self.closing = True
        self.queue.append((self.app.refuse(None, 503, "too many connections (the limit is "
                                           f"{self.limits.max_connections})"), False))
        self._answer_next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.overflowed:
            self.server.overflow -= 1
            self.overflowed = False
        self._disarm()
        lost_request = self.current or next(
            (r for r, _ in self.queue if isinstance(r, HttpRequest)), None)
        if self.receiving and not self.closing:
            self.app.disconnected(self.request)
        elif lost_request is not None:
            self.app.disconnected(lost_request)
        if self.answering is not None and not self.answering.done():
            self.answering.cancel()  # a batch drops a request whose client went away
        self.queue.clear()
        self.transport = None
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # lingering: what a client sends after its answer is discarded
        self.last_activity = self.loop.time()
        if self.request is not None:  # in a body: its raw bytes are bounded too
            self.raw_body += len(data)
            limit = 2 * self.body_cap + RAW_BODY_SLACK
            if self.raw_body > limit:
                self._refuse(413, f"the body's bytes on the wire (chunk framing and "
                                  f"extensions included) exceed {limit}; {self.request.path} "
                                  f"accepts a body of at most {self.body_cap}", self.request)
                return
        try:
            self.parser.feed_data(data)
        except _Refused:
            pass
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")

    def eof_received(self) -> bool:
        # a client that half-closes after its request still gets its answer
        if self.receiving:
            self.app.disconnected(self.request)
            self.receiving = False
            return False
        if self.current is None and not self.queue:
            return False  # nothing to answer: close
        self.closing = True  # answer what is queued, then close
        return True

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    # ---- httptools callbacks -----------------------------------------------------------
    def on_message_begin(self) -> None:
        self.receiving = True
        self.url, self.header_list, self.header_bytes = b"", [], 0
        self.request, self.chunks, self.body_size = None, [], 0
        self._arm("headers", self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        self.header_list.append((name, value))

    def _count_header_bytes(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"the request line and headers exceed "
                              f"{self.limits.max_header_bytes} bytes")
            raise _Refused

    def on_headers_complete(self) -> None:
        headers: dict[str, str] = {}
        for name, value in self.header_list:
            key, val = name.decode("latin-1").lower(), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        url = httptools.parse_url(self.url)
        request = HttpRequest(self.parser.get_method().decode("ascii", "replace"),
                              url.path.decode("latin-1"),
                              (url.query or b"").decode("latin-1"), headers,
                              started=time.perf_counter())
        self.request = request
        self.body_cap = self.app.body_limit(request)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.body_cap:
            self._refuse(413, f"the body has {declared} bytes; {request.path} accepts at "
                              f"most {self.body_cap}", request)
            raise _Refused
        if headers.get("expect", "").lower() == "100-continue" and self.transport:
            if self.current is not None or self.queue:
                self.continue_owed = True  # written after the answers before it
            else:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.raw_body = 0
        self.body_started = self.loop.time()
        self._arm("body", self.limits.body_timeout_s)

    def on_body(self, chunk: bytes) -> None:
        self.continue_owed = False  # the body comes without waiting: no 100 is needed
        self.body_size += len(chunk)
        if self.body_size > self.body_cap:
            self._refuse(413, f"the body exceeds {self.body_cap} bytes, the most "
                              f"{self.request.path if self.request else 'this path'} accepts",
                         self.request)
            raise _Refused
        self.chunks.append(chunk)

    def on_message_complete(self) -> None:
        request = self.request
        assert request is not None
        request.body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.receiving, self.request, self.chunks = False, None, []
        self.continue_owed = False
        self.queue.append((request, self.parser.should_keep_alive()))
        self._disarm()
        if not self.paused and self.transport is not None:
            # Read nothing more until the queue is answered: a client that pipelines without
            # reading its answers holds at most what one read brought, not the server's RAM.
            self.transport.pause_reading()
            self.paused = True
        self._answer_next()

    # ---- answering ---------------------------------------------------------------------
    def _refuse(self, status: int, message: str, request: HttpRequest | None = None) -> None:
        """Answer ``status`` (after what is queued) and close: the rest of what the client
        sends is not read."""
        self.receiving = False
        self.queue.append((self.app.refuse(request, status, message), False))
        self.closing = True
        self._disarm()
        self._answer_next()

    def _answer_next(self) -> None:
        if self.answering is None or self.answering.done():
            self.answering = self.loop.create_task(self._answer_queue())

    async def _answer_queue(self) -> None:
        while self.queue and self.transport is not None:
            item, keep_alive = self.queue.popleft()
            if self.paused and not self.queue and not self.closing and self.transport is not None:
                self.transport.resume_reading()  # the last one queued: read the next meanwhile
                self.paused = False
            if isinstance(item, HttpReply):
                reply, keep_alive = item, False
            else:
                self.current = item
                reply = await self.server.answer(item)
                self.current = None
            if self.transport is None:
                await _close_stream(reply)
                return
            keep_alive = keep_alive and not self.server.draining and not (
                self.closing and not self.queue)
            head_only = isinstance(item, HttpRequest) and item.method == "HEAD"
            if reply.stream is not None:
                self.current = item if isinstance(item, HttpRequest) else None
                try:  # a drain waits for it: the request is current until its stream ends
                    keep_alive = await self._write_stream(reply, keep_alive, head_only)
                finally:
                    self.current = None
                if self.transport is None:
                    return
            else:
                self._write(reply, keep_alive, head_only)
            if not keep_alive:
                self.close_after_reply()
                return
            if self.continue_owed and not self.queue and self.current is None:
                self.continue_owed = False  # every earlier answer is out: now the 100
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.writable.wait()
            if self.queue:  # answers that never wait would keep every other client waiting
                await asyncio.sleep(0)
        if self.transport is not None and not self.receiving:
            self._arm("idle", self.limits.keep_alive_s)

    def _write(self, reply: HttpReply, keep_alive: bool, head_only: bool) -> None:
        body = reply.body
        parts = [body] if isinstance(body, bytes | bytearray | memoryview) else list(body)
        size = sum(memoryview(p).nbytes for p in parts)
        lines = [f"HTTP/1.1 {reply.status} {_reason(reply.status)}",
                 f"content-type: {reply.content_type}", f"content-length: {size}"]
        lines += [f"{k}: {v}" for k, v in reply.headers.items()]
        if not keep_alive:
            lines.append("connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        assert self.transport is not None
        if head_only:
            self.transport.write(head)
        elif size <= _SMALL_REPLY:
            self.transport.write(b"".join([head, *parts]))  # one segment for a small reply
        else:
            self.transport.writelines([head, *parts])

    async def _write_stream(self, reply: HttpReply, keep_alive: bool, head_only: bool) -> bool:
        """Write a streamed reply's head, then each piece as its stream yields it (waiting
        while the client reads slowly); the stream is closed however this ends. Returns
        whether the connection stays open (not when the stream failed mid-body: the client
        sees a body cut off, never a truncated reply passed for whole)."""
        assert reply.stream is not None and self.transport is not None
        lines = [f"HTTP/1.1 {reply.status} {_reason(reply.status)}",
                 f"content-type: {reply.content_type}", "transfer-encoding: chunked"]
        lines += [f"{k}: {v}" for k, v in reply.headers.items()]
        if not keep_alive:
            lines.append("connection: close")
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if head_only:
            await _close_stream(reply)
            return keep_alive
        try:
            async for piece in reply.stream:
                if self.transport is None:
                    return False
                if piece:
                    self.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                await self.writable.wait()
        except Exception as exc:  # the app's bug mid-body: logged, the body cut off
            logger.error("a streamed reply failed", exc_info=exc)
            return False
        finally:
            await _close_stream(reply)
        if self.transport is None:
            return False
        self.transport.write(b"0\r\n\r\n")
        return keep_alive

    def close_after_reply(self) -> None:
        """Close once the reply is sent: half-close first and read (discarding) until the
        client hangs up or ``_LINGER_S`` passes. Closing with unread client bytes would make
        the kernel send a reset, which can destroy the reply before the client reads it."""
        self.closing = True
        transport = self.transport
        if transport is None:
            return
        if self.paused:
            transport.resume_reading()
            self.paused = False
        if transport.can_write_eof():
            transport.write_eof()
            self._arm("linger", _LINGER_S)
        else:
            transport.close()

    # ---- timers ------------------------------------------------------------------------
    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self.timer_kind = kind
        self.last_activity = self.loop.time()
        self.timer = self.loop.call_later(seconds, self._expire, kind, seconds)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_kind = ""

    def _expire(self, kind: str, seconds: float) -> None:
        self.timer = None
        if self.transport is None:
            return
        if kind == "body":  # an inactivity limit: any byte since re-arms it ...
            now = self.loop.time()
            took = now - self.body_started
            rest = self.last_activity + seconds - now
            slow = took >= seconds and self.body_size < self.limits.min_body_rate * took
            if slow:  # ... unless the bytes come too slowly on average
                self.server.timeouts += 1
                self._refuse(408, f"the request's body came at {self.body_size / took:.0f} "
                                  f"bytes/s, below the {self.limits.min_body_rate:g} bytes/s "
                                  "the server needs", self.request)
                return
            if rest > 0:  # checked again within `seconds`: the rate too
                self.timer = self.loop.call_later(min(rest, seconds), self._expire, kind,
                                                  seconds)
                return
        if kind in ("idle", "linger"):
            self.transport.close()
            return
        what = "headers" if kind == "headers" else "body"
        timeout = self.limits.header_timeout_s if kind == "headers" else seconds
        self.server.timeouts += 1
        self._refuse(408, f"the request's {what} did not arrive within {timeout:g} s",
                     self.request)

    # ---- draining ----------------------------------------------------------------------
    def idle(self) -> bool:
        """Nothing received that is not answered, and nothing waiting in the socket."""
        if self.receiving or self.queue or self.current is not None:
            return False
        sock = self.transport.get_extra_info("socket") if self.transport else None
        return sock is None or pending_bytes(sock) == 0

    def close_idle(self) -> None:
        if self.transport is not None and not self.closing:
            self.closing = True
            self.transport.close()


#: serve --workers: a worker waits this long per connection it holds before it accepts a new
#: one, so that a worker holding fewer (woken by the same connection: the workers share the
#: listening socket) takes it first; at most ACCEPT_DELAY_MAX_S, which is what a new
#: connection may wait when every worker holds 5 or more (the balance matters most when
#: there are few: two clients on one of two workers idle the other)
ACCEPT_DELAY_PER_CONNECTION_S = 0.002
ACCEPT_DELAY_MAX_S = 0.01


class SharedAcceptor:
    """Accepts on a listening socket other worker processes accept on too, in the shape of
    the asyncio Server it stands for (``close`` / ``wait_closed``).

    Why: every worker is woken by each new connection and asyncio's (and uvloop's) accept
    takes all that wait, so whichever wakes first may take every connection of a burst: two
    keep-alive clients on two workers then land on one worker in about half the starts,
    and the other idles (measured on the convnet: well under half the rows/s of an even
    spread; docs/benchmarks.md). Here a worker
    takes one connection per wake-up, and one that holds ``open_count()`` connections (or
    accepts in progress) first waits ACCEPT_DELAY_PER_CONNECTION_S for each: an idle worker
    takes the connection meanwhile. After its wait it accepts what is still there.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 factory: Callable[[], asyncio.Protocol], open_count: Callable[[], int]) -> None:
        self._loop, self._sock, self._factory, self._count = loop, sock, factory, open_count
        self._fd = sock.fileno()
        self._pending: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        loop.add_reader(self._fd, self._readable)

    def _readable(self, waited: bool = False) -> None:
        if self._closed:
            return
        held = self._count() + len(self._pending)
        if held and not waited:
            self._loop.remove_reader(self._fd)
            self._timer = self._loop.call_later(
                min(ACCEPT_DELAY_MAX_S, ACCEPT_DELAY_PER_CONNECTION_S * held), self._resume)
            return
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another worker took it
        except OSError as exc:  # out of file descriptors: asyncio's answer, a pause
            logger.error("accept failed (%s): pausing accepts for 1 s", exc)
            self._loop.remove_reader(self._fd)
            self._timer = self._loop.call_later(1.0, self._resume)
            return
        conn.setblocking(False)
        task = self._loop.create_task(self._loop.connect_accepted_socket(self._factory, conn))
        self._pending.add(task)
        task.add_done_callback(partial(self._connected, conn=conn))

    def _connected(self, task: asyncio.Task, conn: socket.socket) -> None:
        self._pending.discard(task)
        if task.cancelled() or task.exception() is not None:
            conn.close()

    def _resume(self) -> None:
        self._timer = None
        if self._closed:
            return
        self._loop.add_reader(self._fd, self._readable)
        self._readable(waited=True)

    def close(self) -> None:
        """Stop accepting (the socket stays open: it is the caller's)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._loop.remove_reader(self._fd)

    async def wait_closed(self) -> None:
        """Until the connections being set up are (they then belong to the server)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


class HttpServer:
    """Serves ``app`` on listening sockets; :meth:`drain` is the graceful shutdown."""

    def __init__(self, app: HttpApp, limits: HttpLimits | None = None) -> None:
        self.app = app
        self.limits = limits or HttpLimits()
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self.overflow = 0
        self.refused_connections = 0
        self.timeouts = 0
        self.in_flight = 0
        self.draining = False
        #: past the drain deadline: complete requests are answered 503 without running
        self.refusing = False
        self._servers: list[asyncio.base_events.Server | SharedAcceptor] = []
        self._socks: list[socket.socket] = []

    async def start(self, sock: socket.socket, shared: bool = False) -> None:
        """Serve on the bound, listening ``sock``; ``shared``: other processes accept on it
        too (serve --workers), so connections are taken as :class:`SharedAcceptor` does."""
        if shared:
            sock.setblocking(False)
            server: asyncio.base_events.Server | SharedAcceptor = SharedAcceptor(
                self.loop, sock, lambda: _Connection(self), lambda: len(self.connections))
        else:
            server = await self.loop.create_server(lambda: _Connection(self), sock=sock)
        self._servers.append(server)
        self._socks.append(sock)

    async def answer(self, request: HttpRequest) -> HttpReply:
        """The app's reply to ``request`` (503 past the drain deadline; 500 if it raised)."""
        if self.refusing:
            return self.app.refuse(request, 503, "the server is shutting down")
        self.in_flight += 1
        try:
            return await self.app.handle(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the app's own bug: answered, logged
            logger.error("request failed", exc_info=exc)
            return self.app.refuse(request, 500, f"internal error: {exc}")
        finally:
            self.in_flight -= 1

    def quiet(self) -> bool:
        """Every request received is answered and no connection waits to be accepted."""
        if self.in_flight or not all(c.idle() for c in self.connections):
            return False
        backlog = [accept_queue_length(s) for s in self._socks]
        return not any(backlog)

    async def drain(self, deadline_s: float, force: asyncio.Event,
                    on_deadline: Callable[[], None] = lambda: None) -> bool:
        """The graceful shutdown: keep accepting and answering (every reply now closes its
        connection; an idle keep-alive connection may still carry a request, so it stays
        open) until every request received is answered and nothing waits to be accepted,
        or ``deadline_s`` passes, or ``force`` is set. Then stop listening. Past the
        deadline, ``on_deadline()`` (the app refuses what waits to run) and every request
        completing from then on is answered 503; requests already running finish; then
        every connection is closed. Returns whether it drained before the deadline."""
        self.draining = True
        deadline = self.loop.time() + deadline_s
        quiet_polls = 0
        while not force.is_set() and self.loop.time() < deadline:
            quiet_polls = quiet_polls + 1 if self.quiet() else 0
            if quiet_polls >= 2:  # twice in a row: a connection just accepted is seen
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(force.wait(), _DRAIN_POLL_S)
        timed_out = quiet_polls < 2
        for server in self._servers:
            server.close()
        if timed_out:
            self.refusing = True
            logger.warning("drain: deadline reached; requests still arriving get 503")
            on_deadline()
        # what runs finishes (a batch on an executor cannot be stopped); then close
        while self.in_flight or any(c.queue or c.current for c in self.connections):
            await asyncio.sleep(_DRAIN_POLL_S)
        for c in list(self.connections):
            c.close_idle()
        for server in self._servers:
            await server.wait_closed()
        return not timed_out

    def close_now(self) -> None:
        """Stop listening and drop every connection (tests, a failed start)."""
        for server in self._servers:
            server.close()
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port; read it back with
    ``getsockname``). Created with IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted
    sockets only when their ``proto`` says TCP (the server sets it itself as well)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
