"""``gear-runtime serve``: its flags, and from the parsed flags to a running server (one
process or Ray). The serving modules are imported when the command runs: they need the serve
extra, and every other command must work without it."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gear_runtime.cli.common import (
    EXIT_FAILED,
    UsageError,
    add_device_flags,
    backends_help,
    device_options,
    error,
    existing_file,
    float_at_least,
    int_at_least,
)

if TYPE_CHECKING:
    from gear_runtime.serving.http import HttpLimits
    from gear_runtime.serving.options import ServeOptions

#: Default --drain-seconds (the home of the number is serving.lifecycle.DEFAULT_DRAIN_S; the
#: parser cannot import it without the serve extra, a test keeps the two equal).
DRAIN_SECONDS = 20.0
#: Default --worker-timeout (home: serving.workers.DEFAULT_TIMEOUT_S; kept equal by a test).
WORKER_TIMEOUT = 60.0
#: Seconds a worker whose supervisor died may drain before it kills itself (past the drain).
ORPHAN_GRACE_S = 10.0


def port(text: str) -> int:
    """A TCP port: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not in 0..65535 (0: a free port)")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``serve`` command's flags."""
    p = sub.add_parser("serve", help="serve gear files over HTTP and gRPC (KServe v2, "
                       "tritonclient)",
                       description="Serve gear files over the Open Inference Protocol (KServe "
                       "v2 REST and gRPC, with Triton's binary tensor, model configuration, "
                       "statistics and model repository extensions): one pool of executors "
                       "per model, gear-aware dynamic batching for batch-mode models, "
                       "Prometheus metrics at /metrics, a graceful drain on SIGTERM. A causal "
                       "LM folder (genai_config.json: onnxruntime-genai's builder, or "
                       "gear-runtime llm build) is served through the engine's continuous "
                       "batching on OpenAI's /v1/completions and /v1/chat/completions and "
                       "Triton's generate / generate_stream. Needs "
                       'the serve extra: pip install "gear_runtime[serve]" ([grpc] for '
                       "--grpc-port, [ray] for --ray).")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="gear files written by compile (with --backend acl: .om files; "
                   "mindspore_lite: .mindir files with --config), or causal LM folders "
                   "(MODEL_DIR with genai_config.json and tokenizer.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1)")
    p.add_argument("--port", type=port, default=8000,
                   help="HTTP port (default 8000; 0: a free port, printed at start)")
    p.add_argument("--grpc-port", type=port, default=None, metavar="PORT",
                   help="also serve the KServe v2 / Triton gRPC API on this port (0: a free "
                   "one); needs the grpc extra")
    p.add_argument("--model-repository", metavar="DIR",
                   help="a folder of models: NAME.gear.onnx files, or Triton's layout "
                   "(NAME/config.pbtxt, NAME/<version>/model.gear.onnx); all are served, and "
                   "POST /v2/repository/models/NAME/load|unload (re)loads one while serving")
    p.add_argument("--name", action="append", default=[], metavar="NAME",
                   help="model name (one per FILE, in order; default: the file name without "
                   ".gear.onnx / .onnx)")
    p.add_argument("--executors", type=int_at_least(1), default=None, metavar="N",
                   help="executors (worker threads) per model (default: one per core, "
                   "at most 4)")
    p.add_argument("--max-batch-delay-ms", type=float_at_least(0), default=2.0, metavar="MS",
                   help="batch-mode models: how long a request waits for others to share its "
                   "batch while every executor is busy (default 2; what waits goes as soon "
                   "as an executor is free)")
    p.add_argument("--batch-wait-when-idle", action="store_true",
                   help="wait out --max-batch-delay-ms even with an executor free, as "
                   "Triton's dynamic batcher does (default: send what waits at once)")
    p.add_argument("--no-batching", action="store_true",
                   help="run every request on its own (no dynamic batching)")
    p.add_argument("--profile", metavar="BENCH.json",
                   help="a `gear-runtime bench --json` result of the model, measured where it "
                   "is served: the batcher takes, of the waiting requests, as many as run the "
                   "most rows per second (one model only)")
    p.add_argument("--max-queue", type=int_at_least(1), default=256, metavar="N",
                   help="requests waiting per model beyond which it answers 503 (default 256)")
    p.add_argument("--max-body-mb", type=float_at_least(0), default=None, metavar="MB",
                   help="largest request body accepted, in MiB (default: per model, what its "
                   "largest gear's inputs take in JSON; more: 413)")
    p.add_argument("--pad", action="store_true",
                   help="dims / image-size mode: serve requests of any shape padded to the "
                   "covering gear (a batched batch-mode model pads its batches already); "
                   "a warning says to run check-padding unless --padding-checked")
    p.add_argument("--padding-checked", action="store_true",
                   help="with --pad: gear-runtime check-padding said the model is SAFE "
                   "(padding does not change its valid outputs): no warning")
    p.add_argument("--drain-seconds", type=float_at_least(0), default=DRAIN_SECONDS,
                   metavar="S", help="on SIGTERM, answer what was received for at most S "
                   f"seconds, then answer 503 + Retry-After (default {DRAIN_SECONDS:g})")
    p.add_argument("--header-timeout", type=float_at_least(0.001), default=10.0, metavar="S",
                   help="a request's headers must arrive within S seconds (default 10; "
                   "then 408)")
    p.add_argument("--body-timeout", type=float_at_least(0.001), default=30.0, metavar="S",
                   help="longest pause within a request body (default 30; then 408)")
    p.add_argument("--min-body-rate", type=float_at_least(0.0), default=1024.0, metavar="B",
                   help="after --body-timeout, a body must arrive at B bytes/s on average "
                   "(default 1024; then 408): a trickling client cannot hold its slot")
    p.add_argument("--keep-alive-timeout", type=float_at_least(0.001), default=75.0,
                   metavar="S", help="an idle keep-alive connection closes after S seconds "
                   "(default 75)")
    p.add_argument("--max-connections", type=int_at_least(1), default=2048, metavar="N",
                   help="open connections; more are answered 503 at once (default 2048)")
    p.add_argument("--intra-op-threads", type=int_at_least(1), default=None, metavar="N",
                   help="onnxruntime: intra-op threads per model (default: ORT's)")
    p.add_argument("--spin", action="store_true",
                   help="onnxruntime: let intra-op threads spin while waiting for work (a "
                   "little faster under load; the server then burns CPU between requests)")
    p.add_argument("--backend", default="onnxruntime", metavar="B", help=backends_help())
    p.add_argument("--state", action="append", default=[], metavar="IN=OUT",
                   help="a resident state pair of a stateful model (a decode step's KV cache: "
                   "past_kv=present_kv); the model is then served over Triton's sequence "
                   "protocol (sequence_id / sequence_start / sequence_end), one executor per "
                   "live sequence")
    p.add_argument("--sequence-start", metavar="GEAR",
                   help="with --state: the model a sequence_start request runs (a prefill gear "
                   "file, padded to its covering gear); its outputs named like the state "
                   "outputs become the new sequence's state, so a client sends the prompt "
                   "once, then one request per token")
    p.add_argument("--in-place-state", action="store_true",
                   help="with --state: keep each pair in ONE buffer that the run reads and "
                   "writes, where the graph updates it in place (onnxruntime-genai's "
                   "GroupQueryAttention: no copy of the cache per token); refused naming "
                   "the pair where the graph does not")
    p.add_argument("--max-sequences", type=int_at_least(1), default=None, metavar="N",
                   help="with --state: sequences live at once, one executor (and one copy "
                   "of the state) each (default 4); a causal LM folder: the engine's rows, "
                   "the largest decode batch gear (default: what llm build chose, else 8)")
    p.add_argument("--sequence-idle-seconds", type=float_at_least(0.001), default=60.0,
                   metavar="S", help="with --state: a sequence idle this long gives its slot "
                   "to a new one (Triton's max_sequence_idle_microseconds; default 60)")
    add_device_flags(p)
    p.add_argument("--ray", action="store_true",
                   help="serve on Ray Serve (a local Ray instance) instead of one process")
    p.add_argument("--workers", type=int_at_least(1), default=1, metavar="N",
                   help="N server processes on the one port, each with its own models and "
                   "executors, supervised (a worker that dies is started again); what Ascend "
                   "needs, where pyACL holds the GIL for the whole NPU run")
    p.add_argument("--devices", metavar="D,D",
                   help="one worker per device (acl / mindspore_lite / CUDA device ids, "
                   "OpenVINO device names), each opening its models there (--device D)")
    p.add_argument("--worker-timeout", type=float_at_least(0), default=WORKER_TIMEOUT,
                   metavar="S", help="with --workers / --devices: a worker whose event loop "
                   "sends no heartbeat for S seconds (stuck in a call that holds the GIL, or "
                   "hung) is killed and started again, as gunicorn's --timeout (default "
                   f"{WORKER_TIMEOUT:g}; 0: never)")
    p.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-lifeline", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-heartbeat", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--profile-checked", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--replicas", type=int_at_least(1), default=1, metavar="N",
                   help="with --ray: replicas, each with the models and their executors")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="server log level (default warning)")
    p.add_argument("--log-format", default="text", choices=("text", "json"),
                   help="log lines as text (default) or one JSON object per line: time, "
                   "level, logger, message and the record's extra fields")
    p.add_argument("--access-log", action="store_true",
                   help="one log line per answered HTTP request: method, path, status, "
                   "seconds, model (at any --log-level)")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT / SIGTERM (graceful: every request received is answered)."""
    if args.name and len(args.name) != len(args.files):
        raise UsageError(f"{len(args.name)} --name for {len(args.files)} files: give one "
                         "per FILE, or none")
    if not args.files and not args.model_repository:
        raise UsageError("give gear files to serve, or --model-repository DIR")
    if args.model_repository and not os.path.isdir(args.model_repository):
        raise UsageError(f"--model-repository {args.model_repository!r} is not a folder")
    if args.ray and (args.grpc_port is not None or args.model_repository):
        raise UsageError("--ray serves HTTP through Ray Serve's proxy: --grpc-port and "
                         "--model-repository are for the single-process server")
    if (args.workers > 1 or args.devices) and args.ray:
        raise UsageError("--workers / --devices are the single-host server's processes; "
                         "--ray has its replicas (--replicas)")
    if args.devices and args.device is not None:
        raise UsageError("--devices gives each worker its --device: give one of them")
    if args.profile is not None and (len(args.files) != 1 or args.model_repository):
        raise UsageError("--profile is one model's bench result: serve one gear file with it")
    if args.replicas > 1 and not args.ray:
        raise UsageError(f"--replicas {args.replicas} needs --ray (replicas are Ray Serve "
                         "deployments); the single-process server runs one copy, with "
                         "--executors N executors per model")
    if args.model_repository:
        _check_repository(args.model_repository, bool(args.files))
    _warn_padding(args)
    for path in args.files:
        if os.path.isdir(path):
            _check_llm_folder(args, path)
        else:
            existing_file(path, "gear file")
    try:  # the extra is optional: a missing one is one line, not a traceback
        import gear_runtime.serving.app  # noqa: F401
    except ImportError as exc:
        error(str(exc))
        return EXIT_FAILED
    return serve_from_args(args)


def _warn_padding(args: argparse.Namespace) -> None:
    """What serve pads, said once at start: ``--pad`` pads each gear file's requests,
    ``--sequence-start`` every prompt. A model with no recorded verdict (``check-padding
    --record``) is padded as asked, with a warning naming it (``--padding-checked``
    silences it); one recorded UNSAFE is never padded: a request that needs it is refused
    (400, PaddingUnsafeError) and this says so; one recorded SAFE is silent."""
    from gear_runtime.gearfile.padding import recorded_verdict

    padded = [(p, "--pad") for p in args.files if args.pad and os.path.isfile(p)]
    if getattr(args, "sequence_start", None):
        padded.append((args.sequence_start, "--sequence-start"))
    for path, flag in padded:
        verdict = recorded_verdict(path)
        if verdict is None and not args.padding_checked:
            print(f"gear-runtime serve: warning: {flag} pads requests of {path} to their "
                  "covering gear, and it records no padding verdict: if its outputs change "
                  "with padding (a recurrent state, a mean over the sequence) it answers "
                  f"wrongly: run gear-runtime check-padding --record {path} SOURCE.onnx first "
                  "(--padding-checked silences this)", file=sys.stderr)
        elif verdict is not None and not verdict.safe:
            print(f"gear-runtime serve: note: {path} records padding {verdict.describe()}: "
                  f"{flag} never pads it; a request that matches none of its gears exactly "
                  "is refused (400, PaddingUnsafeError)", file=sys.stderr)


def _check_llm_folder(args: argparse.Namespace, path: str) -> None:
    """A folder to serve is a causal LM's: it has genai_config.json, and the flags of
    tensor models' sequences or of other backends do not apply to it."""
    from gear_runtime.backends import DEFAULT_BACKEND
    from gear_runtime.llm.folder import CONFIG

    if not os.path.isfile(os.path.join(path, CONFIG)):
        raise UsageError(f"{path!r} is a folder without {CONFIG}: serve gear files, or a "
                         "causal LM folder (gear-runtime llm build, or onnxruntime-genai's "
                         "model builder)")
    if args.backend != DEFAULT_BACKEND or args.state or args.sequence_start or args.ray:
        raise UsageError(f"{path!r} is a causal LM folder: it is served by the engine on "
                         "ONNX Runtime's CPU in this server (no --backend, --state, "
                         "--sequence-start or --ray)")


def _check_repository(directory: str, files_given: bool) -> None:
    """A repository without models (no ``NAME.gear.onnx``, no model folder of Triton's
    layout: ``NAME/config.pbtxt``, ``NAME/1/model.gear.onnx``) is served empty with a
    warning: models can be loaded into it later through the repository API."""
    from gear_runtime.serving.repository import ModelRepository

    if not files_given and not ModelRepository(directory).names():
        print(f"gear-runtime serve: warning: --model-repository {directory!r} has no model "
              "(NAME.gear.onnx, or a folder NAME/ with config.pbtxt and version folders "
              "1/model.gear.onnx): serving no model until one is loaded (POST "
              "/v2/repository/models/NAME/load)", file=sys.stderr)


def _devices(args: argparse.Namespace) -> list[str] | None:
    if not args.devices:
        return None
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if not devices:
        raise UsageError(f"--devices {args.devices!r}: give device ids separated by ','")
    return devices


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """The ServeOptions the ``serve`` flags ask for."""
    from gear_runtime.serving.options import DEFAULT_EXECUTORS, ServeOptions

    body = None if args.max_body_mb is None else max(1, int(args.max_body_mb * 2**20))
    return ServeOptions(backend=args.backend, executors=args.executors or DEFAULT_EXECUTORS,
                        max_batch_delay_ms=args.max_batch_delay_ms,
                        batching=not args.no_batching, max_queue=args.max_queue, pad=args.pad,
                        profile=args.profile, profile_checked=args.profile_checked,
                        max_body_bytes=body, batch_wait_when_idle=args.batch_wait_when_idle,
                        spin=args.spin, intra_op_threads=args.intra_op_threads,
                        device_options=tuple(device_options(args.backend, args).items()),
                        state=_state_pairs(args.state, args.sequence_start,
                                           args.in_place_state),
                        max_sequences=args.max_sequences,
                        sequence_start=args.sequence_start,
                        in_place_state=args.in_place_state,
                        sequence_idle_s=args.sequence_idle_seconds, worker=args.worker_index,
                        workers=args.worker_count, worker_dir=args.worker_dir,
                        access_log=args.access_log)


def _state_pairs(items: Sequence[str], start: str | None = None, in_place: bool = False
                 ) -> tuple[tuple[str, str], ...]:
    """``IN=OUT`` items -> ((in, out), ...); UsageError naming the item otherwise, or for a
    ``--sequence-start`` without state to start."""
    if start is not None and not items:
        raise UsageError("--sequence-start needs --state IN=OUT: it starts a sequence's state")
    if in_place and not items:
        raise UsageError("--in-place-state needs --state IN=OUT: it says how the state is kept")
    pairs = []
    for item in items:
        name, sep, out = item.partition("=")
        if not sep or not name.strip() or not out.strip():
            raise UsageError(f"--state {item!r}: expected INPUT=OUTPUT (e.g. "
                             "past_kv=present_kv)")
        pairs.append((name.strip(), out.strip()))
    return tuple(pairs)


def limits_from_args(args: argparse.Namespace) -> HttpLimits:
    """The HttpLimits the ``serve`` flags ask for."""
    from gear_runtime.serving.http import HttpLimits

    return HttpLimits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                      min_body_rate=args.min_body_rate, keep_alive_s=args.keep_alive_timeout,
                      max_connections=args.max_connections)


def serve_from_args(args: argparse.Namespace) -> int:
    """Serve ``args.files`` until SIGINT / SIGTERM; the exit code."""
    from gear_runtime.serving.logs import configure

    configure(args.log_level, args.log_format, args.access_log)
    options = options_from_args(args)
    names = args.name or None
    devices = _devices(args)
    if (args.workers > 1 or devices) and args.worker_fd is None:
        from gear_runtime.serving.workers import serve_workers

        argv = list(args.argv)
        if args.profile is not None:  # hashed here once, not in every worker
            from gear_runtime.serving.loading import check_profile

            check_profile(args.profile, args.files[0], args.backend)
            argv.append("--profile-checked")
        sock = bind(args.host, args.port)
        try:
            if args.grpc_port:  # in use: one clear error here, not one per worker
                bind(args.host, args.grpc_port, "--grpc-port").close()
            return serve_workers(argv, len(devices) if devices else args.workers,
                                 devices, sock, args.host, args.grpc_port,
                                 args.worker_timeout)
        finally:
            sock.close()
    if args.worker_fd is not None:  # a worker: it dies with its supervisor
        from gear_runtime.serving.workers import watch_supervisor

        watch_supervisor(args.worker_lifeline, args.drain_seconds + ORPHAN_GRACE_S,
                         args.worker_index)
    if not args.ray:
        return serve_forever(args.files, names, options, args.host, args.port,
                             limits=limits_from_args(args), drain_s=args.drain_seconds,
                             grpc_port=args.grpc_port, model_repository=args.model_repository,
                             worker_fd=args.worker_fd, heartbeat_fd=args.worker_heartbeat)
    try:
        from gear_runtime.serving import ray_app
    except ImportError as exc:
        print(f'gear-runtime: error: --ray needs the ray extra: pip install "gear_runtime[ray]" '
              f"({exc.name} is not installed)", file=sys.stderr)
        return 1
    return ray_app.serve_forever(args.files, names, options, host=args.host, port=args.port,
                                 replicas=args.replicas)


def bind(host: str, port: int, flag: str = "--port") -> socket.socket:
    """The listening socket; a port in use is one clear OSError naming it and what to do."""
    from gear_runtime.serving.http import listen

    try:
        return listen(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"port {port} on {host} is in use (another server?): "
                                     f"choose another {flag}, or {flag} 0 for a free one"
                          ) from None
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None


def serve_forever(files: Sequence[str], names: Sequence[str] | None, options: ServeOptions,
                  host: str, port: int, *, limits: HttpLimits | None = None,
                  drain_s: float = DRAIN_SECONDS, grpc_port: int | None = None,
                  model_repository: str | None = None, worker_fd: int | None = None,
                  heartbeat_fd: int | None = None) -> int:
    """Bind first (a port in use fails before any model loads), load, print the address,
    serve until SIGINT / SIGTERM, drain (serving.lifecycle), close. A worker of serve
    --workers accepts on ``worker_fd`` and, once serving, beats on ``heartbeat_fd``."""
    from gear_runtime.serving.app import build_server
    from gear_runtime.serving.lifecycle import Running, new_loop, serve

    if grpc_port is not None:  # a missing extra or a port in use fails before any load
        from gear_runtime.serving import grpc_app  # noqa: F401

        if grpc_port and worker_fd is None:  # workers share the port the parent chose
            bind(host, grpc_port, "--grpc-port").close()
    # a worker accepts on the socket its parent bound (serve --workers)
    sock = bind(host, port) if worker_fd is None else socket.socket(fileno=worker_fd)
    try:
        server = build_server(files, names, options, model_repository)
    except BaseException:
        sock.close()
        raise

    def started(running: Running) -> None:
        http_host, http_port = running.http_address
        where = f"http://{http_host}:{http_port}"
        if running.grpc_address is not None:
            where += f" and grpc {running.grpc_address[0]}:{running.grpc_address[1]}"
        names = [*server.models, *server.llms]
        print(f"gear-runtime: serving {', '.join(names) or '(no model)'} at {where} "
              "(KServe v2" + ("; OpenAI at /v1" if server.llms else "") +
              "; metrics at /metrics)", flush=True)
        if options.worker_dir is not None and options.worker is not None:
            from gear_runtime.serving.workers import mark_started

            mark_started(options.worker_dir, options.worker)
        if heartbeat_fd is not None:  # from the loop: the parent hears a loop that runs
            from gear_runtime.serving.workers import start_heartbeat

            start_heartbeat(heartbeat_fd)

    loop = new_loop()
    try:
        drained = loop.run_until_complete(serve(
            server, sock, limits=limits, drain_s=drain_s, on_started=started,
            grpc=(host, grpc_port) if grpc_port is not None else None))
    finally:
        loop.close()
        sock.close()
    print("gear-runtime: server stopped" + ("" if drained else
          f" (drain deadline of {drain_s:g} s reached: requests past it were answered 503)"),
          flush=True)
    return 0
