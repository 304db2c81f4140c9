"""``serve --workers N`` / ``--devices 0,1,...``: N server processes on one port, each with its
own models and executors, supervised by the parent.

Why processes: pyACL holds the GIL for the whole NPU run (docs/ascend.md), so threads of one
process never overlap on Ascend; an 8-NPU box needs one process per device, as Triton's
``instance_group { kind: KIND_GPU gpus: [...] }`` gives. How:

* The parent binds the HTTP socket once and every worker inherits it (``pass_fds``) and
  accepts on it, as gunicorn's pre-fork workers do: the kernel hands each connection to one
  worker, and a port of 0 is resolved once for all. gRPC workers bind the same port with
  SO_REUSEPORT (grpcio's default on Linux); the parent picks the port.
* Worker ``i`` runs ``gear-runtime serve`` with the same flags, ``--worker-fd`` /
  ``--worker-index i`` and, with ``--devices``, ``--device <its device>``.
* Supervision: a worker that exits while the server is up is logged and started again (at
  most :data:`MAX_RESTARTS` times a minute, then the server stops). A worker that exits
  on its own before it ever served (a bad file, a bad ``--state``: it marks itself started
  only once its models are loaded and its sockets listen, :func:`mark_started`) stops the
  server at once with that worker's exit code: restarting it would fail the same way. One
  killed by a signal while loading is restarted. SIGTERM / SIGINT go to every worker,
  which drain as a single server does; a second one ends their drains. The parent exits
  when all have.
* Metrics: each worker labels its series ``worker="i"``, and whichever worker answers a
  scrape reports every worker's series: they share snapshots in a folder the parent makes
  (``--worker-dir``; serving/metrics.py), so ``sum without(worker)`` is the server's.
* Sequences (``--state``): each sequence id has one owner, ``crc32(id) % N``, the worker
  that holds its state; a request of that sequence reaching another worker is forwarded to
  the owner over the owner's Unix socket in the same folder and answered with the owner's
  answer (serving/peers.py). ``--max-sequences`` is per worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

logger = logging.getLogger("gear_runtime.serving")

#: restarts allowed within a minute before the supervisor gives up
MAX_RESTARTS = 5


def started_path(worker_dir: str, index: int) -> str:
    """The file worker ``index`` writes once it serves (see :func:`mark_started`)."""
    return os.path.join(worker_dir, f"worker-{index}.started")


def mark_started(worker_dir: str, index: int) -> None:
    """Worker ``index`` serves: its models are loaded and its sockets listen. From now on an
    exit of it is a crash to restart, not a start that failed."""
    with open(started_path(worker_dir, index), "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")


def free_port(host: str) -> int:
    """A free TCP port on ``host`` (for the workers' shared gRPC port)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def worker_command(argv: Sequence[str], index: int, fd: int, device: str | None,
                   grpc_port: int | None, worker_dir: str | None = None,
                   count: int = 1) -> list[str]:
    """The command line of worker ``index`` of ``count``: the parent's ``serve`` flags
    without the worker flags, plus the inherited socket, its index and the count, its
    device, the gRPC port and the folder the workers share."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--workers", "--devices", "--grpc-port", "--port", "--worker-dir",
                    "--worker-count"):
            skip = "=" not in arg and i + 1 < len(argv)
            continue
        out.append(arg)
    cmd = [sys.executable, "-m", "gear_runtime.cli", *out, "--worker-fd", str(fd),
           "--worker-index", str(index), "--worker-count", str(count)]
    if device is not None:
        cmd += ["--device", device]
    if grpc_port is not None:
        cmd += ["--grpc-port", str(grpc_port)]
    if worker_dir is not None:
        cmd += ["--worker-dir", worker_dir]
    return cmd


class Supervisor:
    """The parent: starts the workers, restarts one that dies, forwards the stop signals."""

    def __init__(self, commands: list[list[str]], fd: int,
                 worker_dir: str | None = None) -> None:
        self.commands, self.fd, self.worker_dir = commands, fd, worker_dir
        self.procs: list[subprocess.Popen] = []
        self.stopping = 0  # stop signals received
        self.restarts: list[float] = []

    def _start(self, index: int) -> subprocess.Popen:
        return subprocess.Popen(self.commands[index], pass_fds=(self.fd,))

    def _signal(self, signum: int, frame: object) -> None:
        self.stopping += 1
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Supervise until every worker has stopped after a stop signal; the exit code."""
        old = {s: signal.signal(s, self._signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.procs = [self._start(i) for i in range(len(self.commands))]
            failed = 0  # the exit code of a worker that could not start
            while True:
                if self.stopping and all(p.poll() is not None for p in self.procs):
                    if failed:
                        return failed
                    return 0 if all(p.returncode == 0 for p in self.procs) else 1
                for i, proc in enumerate(self.procs):
                    if proc.poll() is None or self.stopping:
                        continue
                    # exited on its own before serving: it would fail the same way again
                    # (killed by a signal while loading, e.g. the OOM killer: restarted)
                    if proc.returncode >= 0 and not self._has_started(i):
                        print(f"gear-runtime: worker {i} could not start (code "
                              f"{proc.returncode}): stopping the server", file=sys.stderr,
                              flush=True)
                        failed = failed or proc.returncode or 1
                        self._signal(signal.SIGTERM, None)
                        break
                    if not self._may_restart():
                        logger.error("worker %d exited (code %s); %d restarts within a "
                                     "minute: stopping the server", i, proc.returncode,
                                     MAX_RESTARTS)
                        print(f"gear-runtime: worker {i} keeps exiting (code "
                              f"{proc.returncode}): stopping", file=sys.stderr, flush=True)
                        self._signal(signal.SIGTERM, None)
                        break
                    print(f"gear-runtime: worker {i} exited (code {proc.returncode}): "
                          "starting it again", file=sys.stderr, flush=True)
                    self._forget_worker(i)
                    self.procs[i] = self._start(i)
                time.sleep(0.1)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _has_started(self, index: int) -> bool:
        """Whether worker ``index`` (its current process) marked itself started; without a
        worker folder (a caller's own commands), every exit counts as a crash."""
        return self.worker_dir is None or os.path.exists(started_path(self.worker_dir, index))

    def _forget_worker(self, index: int) -> None:
        """What a dead worker left in the worker folder goes. Its metrics snapshots: its
        restart counts from zero (a counter reset to Prometheus), and until it serves,
        scrapes show no series of a worker that is not there. Its started mark: the new
        process marks itself."""
        if self.worker_dir is not None:
            from gear_runtime.serving.metrics import snapshot_names

            for path in (*(os.path.join(self.worker_dir, n) for n in snapshot_names(index)),
                         started_path(self.worker_dir, index)):
                with contextlib.suppress(OSError):
                    os.remove(path)

    def _may_restart(self) -> bool:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 60] + [now]
        return len(self.restarts) <= MAX_RESTARTS


def serve_workers(argv: Sequence[str], count: int, devices: Sequence[str] | None,
                  sock: socket.socket, host: str, grpc: bool) -> int:
    """Run ``count`` workers (one per device of ``devices`` when given) on ``sock``."""
    fd = sock.fileno()
    os.set_inheritable(fd, True)
    grpc_port = free_port(host) if grpc else None
    # short: it holds the workers' socket paths (108 bytes at most on Linux)
    worker_dir = tempfile.mkdtemp(prefix="gear-w-")
    commands = [worker_command(argv, i, fd, devices[i] if devices else None, grpc_port,
                               worker_dir, count) for i in range(count)]
    http_host, http_port = sock.getsockname()[:2]
    where = f"http://{http_host}:{http_port}"
    if grpc_port is not None:
        where += f" and grpc {host}:{grpc_port}"
    print(f"gear-runtime: serving with {count} workers"
          + (f" (devices {', '.join(devices)})" if devices else "")
          + f" at {where} (KServe v2; metrics at /metrics, every worker's)", flush=True)
    try:
        code = Supervisor(commands, fd, worker_dir).run()
    finally:
        shutil.rmtree(worker_dir, ignore_errors=True)
    print("gear-runtime: server stopped (all workers)", flush=True)
    return code


__all__ = ["MAX_RESTARTS", "Supervisor", "free_port", "mark_started", "serve_workers",
           "started_path", "worker_command"]
