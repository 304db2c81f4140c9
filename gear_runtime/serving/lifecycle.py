"""A server's life in one process: start HTTP (and gRPC), serve until SIGTERM / SIGINT, then
drain and close.

The shutdown sequence (what a Kubernetes pod needs; docs/serving.md):

1. First SIGTERM (or SIGINT): ``/v2/health/ready`` answers 503 at once, so the readiness
   probe fails and the pod leaves the Service's endpoints. The server keeps accepting and
   answering; every reply now closes its connection, so keep-alive clients reconnect
   elsewhere. gRPC stops taking new calls and finishes the ones it has.
2. The drain ends when every request whose bytes arrived is answered and no connection waits
   in the kernel's accept queue (Linux), or at ``--drain-seconds``: past that deadline,
   requests waiting for an executor, and requests still arriving, are answered 503 with
   ``Retry-After``; batches running on an executor finish.
3. Then it stops listening, closes the connections and the models, and exits 0.

A second SIGTERM ends the drain at once (as the deadline does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass

from gear_runtime.serving.app import GearServer
from gear_runtime.serving.http import HttpLimits, HttpServer

logger = logging.getLogger("gear_runtime.serving")

#: Default --drain-seconds: under Kubernetes' default terminationGracePeriodSeconds (30),
#: with room for a preStop hook's few seconds.
DEFAULT_DRAIN_S = 20.0


@dataclass
class Running:
    """What a started server listens on (given to ``on_started``)."""

    http: HttpServer
    http_address: tuple[str, int]
    grpc_address: tuple[str, int] | None


def new_loop() -> asyncio.AbstractEventLoop:
    """An event loop: uvloop's where it is installed (faster accept, reads and writes),
    else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


#: seconds gRPC calls get past the drain deadline to send the answer the deadline gave them
GRPC_ANSWER_S = 1.0


async def serve(server: GearServer, sock: socket.socket, *, limits: HttpLimits | None = None,
                drain_s: float = DEFAULT_DRAIN_S, grpc: tuple[str, int] | None = None,
                on_started: Callable[[Running], None] = lambda running: None,
                stop: asyncio.Event | None = None) -> bool:
    """Serve ``server`` on the listening ``sock`` (and gRPC on ``grpc`` = (host, port), port
    0: a free one) until SIGTERM / SIGINT (or ``stop`` is set), then drain and close.
    Returns whether the drain ended before its deadline."""
    loop = asyncio.get_running_loop()
    http = HttpServer(server, limits)
    server.metrics.track_connections(lambda: len(http.connections))
    # the workers of serve --workers share the listening socket: spread its connections
    await http.start(sock, shared=server.options.worker is not None)
    if server.peers is not None:  # serve --workers: the sequences this worker owns
        await http.start(listen_unix(server.peers.path))
    grpc_server = grpc_address = None
    signals: list[int] = []
    try:
        if grpc is not None:
            from gear_runtime.serving.grpc_app import start_grpc

            grpc_server, grpc_address = await start_grpc(server, *grpc)
        stop = stop or asyncio.Event()
        force = asyncio.Event()

        def on_signal() -> None:
            (force if stop.is_set() else stop).set()

        signals[:] = [s for s in (signal.SIGTERM, signal.SIGINT)
                      if _add_signal_handler(loop, s, on_signal)]
        # the handlers stay until the server is closed (see the finally)
        # serve --workers: from now on the other workers' scrapes report this one too
        server.metrics.start_snapshots(server.own_statistics)
        on_started(Running(http, sock.getsockname()[:2], grpc_address))
        await stop.wait()
        logger.warning("shutting down: draining (at most %g s)", drain_s)
        server.begin_drain()
        # gRPC refuses new calls from now on (UNAVAILABLE); the calls in flight get the
        # drain and a little more: the deadline refuses what still waits (503 ->
        # UNAVAILABLE), and that answer must go out before grpc's grace cancels the call
        grpc_stopped = (loop.create_task(grpc_server.stop(drain_s + GRPC_ANSWER_S))
                        if grpc_server is not None else None)
        drained = await http.drain(drain_s, force, on_deadline=server.refuse_waiting)
        if grpc_stopped is not None:
            assert grpc_server is not None  # grpc_stopped is its stop
            if force.is_set():  # a second signal: no more waiting
                await grpc_server.stop(0)
            await grpc_stopped
        return drained
    finally:
        http.close_now()
        if grpc_server is not None:
            await grpc_server.stop(0)
        await server.close()
        # only now: a signal while the server closes (the drain done) is ignored rather
        # than killing the process with the default action before its exit code 0
        for s in signals:
            loop.remove_signal_handler(s)


def listen_unix(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (a file left there by a worker that died is
    replaced: the folder is the server's own)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(512)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _add_signal_handler(loop: asyncio.AbstractEventLoop, sig: int,
                        handler: Callable[[], None]) -> bool:
    """Handle ``sig`` on the loop; False where that cannot be done (not the main thread)."""
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        loop.add_signal_handler(sig, handler)
        return True
    return False
