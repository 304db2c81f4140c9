"""``gear-runtime serve``: its flags, and from the parsed flags to a running server (one
process or Ray). The serving modules are imported when the command runs: they need the serve
extra, and every other command must work without it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gear_runtime.cli.common import (
    EXIT_FAILED,
    UsageError,
    backends_help,
    error,
    existing_file,
    float_at_least,
    int_at_least,
)

if TYPE_CHECKING:
    from gear_runtime.serving.runner import ServeOptions


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``serve`` command's flags."""
    p = sub.add_parser("serve", help="serve gear files over HTTP (KServe v2, tritonclient)",
                       description="Serve gear files over the Open Inference Protocol (KServe "
                       "v2 REST, with Triton's binary tensor extension): one pool of executors "
                       "per model, gear-aware dynamic batching for batch-mode models, "
                       "Prometheus metrics at /metrics. Needs the serve extra: "
                       'pip install "gear_runtime[serve]" (and [ray] for --ray).')
    p.add_argument("files", nargs="+", metavar="FILE", help="gear files written by compile")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1)")
    p.add_argument("--port", type=int_at_least(0), default=8000,
                   help="port (default 8000; 0: a free port, printed at start)")
    p.add_argument("--name", action="append", default=[], metavar="NAME",
                   help="model name (one per FILE, in order; default: the file name without "
                   ".gear.onnx / .onnx)")
    p.add_argument("--executors", type=int_at_least(1), default=None, metavar="N",
                   help="executors (worker threads) per model (default: one per core, "
                   "at most 4)")
    p.add_argument("--max-batch-delay-ms", type=float_at_least(0), default=2.0, metavar="MS",
                   help="batch-mode models: how long a request waits for others to share its "
                   "batch (default 2)")
    p.add_argument("--no-batching", action="store_true",
                   help="run every request on its own (no dynamic batching)")
    p.add_argument("--max-queue", type=int_at_least(1), default=256, metavar="N",
                   help="requests waiting per model beyond which it answers 503 (default 256)")
    p.add_argument("--max-body-mb", type=float_at_least(0), default=64.0, metavar="MB",
                   help="largest request body accepted, in MiB (default 64; more: 413)")
    p.add_argument("--pad", action="store_true",
                   help="dims mode: serve requests of any shape padded to the covering gear")
    p.add_argument("--backend", default="onnxruntime", metavar="B", help=backends_help())
    p.add_argument("--ray", action="store_true",
                   help="serve on Ray Serve (a local Ray instance) instead of one process")
    p.add_argument("--replicas", type=int_at_least(1), default=1, metavar="N",
                   help="with --ray: replicas, each with the models and their executors")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="server log level (default warning)")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT / SIGTERM (graceful: requests in flight finish first)."""
    if args.name and len(args.name) != len(args.files):
        raise UsageError(f"{len(args.name)} --name for {len(args.files)} files: give one "
                         "per FILE, or none")
    for path in args.files:
        existing_file(path, "gear file")
    try:  # the extra is optional: a missing one is one line, not a traceback
        import gear_runtime.serving.app  # noqa: F401
    except ImportError as exc:
        error(str(exc))
        return EXIT_FAILED
    return serve_from_args(args)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """The ServeOptions the ``serve`` flags ask for."""
    from gear_runtime.serving.runner import DEFAULT_EXECUTORS, ServeOptions

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
    from gear_runtime.serving.app import build_server, listen, uvicorn_server

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
