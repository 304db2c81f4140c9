"""``gear-runtime serve``: from the parsed flags to a running server (one process or Ray)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from gear_runtime.serving.app import build_server, listen, uvicorn_server
from gear_runtime.serving.runner import DEFAULT_EXECUTORS, ServeOptions


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """The ServeOptions the ``serve`` flags ask for."""
    return ServeOptions(backend=args.backend, executors=args.executors or DEFAULT_EXECUTORS,
                        max_batch_delay_ms=args.max_batch_delay_ms,
                        batching=not args.no_batching, max_queue=args.max_queue, pad=args.pad,
                        max_body_bytes=int(args.max_body_mb * 2**20))


def serve_from_args(args: argparse.Namespace) -> int:
    """Serve ``args.files`` until SIGINT / SIGTERM; the exit code."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    options = options_from_args(args)
    names = args.name or None
    if not args.ray:
        return serve_forever(args.files, names, options, args.host, args.port, args.log_level)
    try:
        from gear_runtime.serving import ray_app
    except ImportError as exc:
        print(f'gear-runtime: error: --ray needs the ray extra: pip install "gear_runtime[ray]" '
              f"({exc.name} is not installed)", file=sys.stderr)
        return 1
    return ray_app.serve_forever(args.files, names, options, host=args.host, port=args.port,
                                 replicas=args.replicas)


def _ignore(signum: int, frame: object) -> None:
    """Handler that does nothing (see serve_forever)."""


def serve_forever(files: Sequence[str], names: Sequence[str] | None, options: ServeOptions,
                  host: str, port: int, log_level: str = "warning") -> int:
    """Bind first (a port in use fails before any model loads), load, print the address,
    serve until SIGINT / SIGTERM: then stop accepting, drain the requests in flight, close."""
    sock = listen(host, port)
    try:
        server = build_server(files, names, options)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    print(f"gear-runtime: serving {', '.join(server.models)} at http://{host}:{port} "
          "(KServe v2 REST; metrics at /metrics)", flush=True)
    # uvicorn catches SIGINT/SIGTERM while it serves, drains, then raises the signal again
    # for the handler found before: a no-op one makes a drained shutdown a normal exit (0)
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn_server(server, sock, log_level=log_level).run(sockets=[sock])
    finally:
        asyncio.run(server.close())  # a no-op after the app's own shutdown
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("gear-runtime: server stopped", flush=True)
    return 0
