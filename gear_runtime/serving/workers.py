"""``serve --workers N`` / ``--devices 0,1,...``: N server processes on one port, each with its
own models and executors, supervised by the parent.

Why processes: pyACL holds the GIL for the whole NPU run (docs/ascend.md), so threads of one
process never overlap on Ascend; an 8-NPU box needs one process per device, as Triton's
``instance_group { kind: KIND_GPU gpus: [...] }`` gives. How:

* The parent binds the HTTP socket once and every worker inherits it (``pass_fds``) and
  accepts on it, as gunicorn's pre-fork workers do: the kernel hands each connection to one
  worker, and a port of 0 is resolved once for all. gRPC workers bind the same port with
  SO_REUSEPORT: the ``--grpc-port`` asked (checked free by the parent first), or for 0 one
  the parent picks.
* Worker ``i`` runs ``gear-runtime serve`` with the same flags, ``--worker-fd`` /
  ``--worker-index i`` and, with ``--devices``, ``--device <its device>``. It is started as
  ``python -c`` with the folder holding the parent's ``gear_runtime`` first on its path (and
  the working directory off it), so it imports exactly the package the parent runs, never a
  ``gear_runtime`` folder of the working directory (:func:`worker_command`).
* Supervision: a worker that exits while the server is up is logged and started again (at
  most :data:`MAX_RESTARTS` times a minute, then the server stops). A worker that exits
  on its own before it ever served (a bad file, a bad ``--state``: it marks itself started
  only once its models are loaded and its sockets listen, :func:`mark_started`) stops the
  server at once with that worker's exit code: restarting it would fail the same way. One
  killed by a signal while loading is restarted. SIGTERM / SIGINT go to every worker,
  which drain as a single server does; a second one ends their drains. The parent exits
  when all have.
* Watchdog (gunicorn's scheme): a worker's event loop writes a byte to a pipe every
  :data:`HEARTBEAT_S` seconds once it serves; a worker silent for ``--worker-timeout``
  seconds (its loop blocked, e.g. by a device call holding the GIL, or the whole process
  hung) is killed (SIGKILL: a blocked loop runs no SIGTERM handler) and started again.
* Workers die with their parent: on Linux the kernel sends them SIGTERM when it dies
  (``PR_SET_PDEATHSIG``), and everywhere each watches a pipe only the parent holds open:
  its EOF means the parent is gone, kill -9 or OOM kill included (:func:`watch_supervisor`).
* Metrics: each worker labels its series ``worker="i"``, and whichever worker answers a
  scrape reports every worker's series, each asked afresh over its Unix socket
  (serving/metrics.py), so ``sum without(worker)`` is the server's.
* Sequences (``--state``): each sequence id has one owner, ``crc32(id) % N``, the worker
  that holds its state; a request of that sequence reaching another worker is forwarded to
  the owner over the owner's Unix socket in the same folder and answered with the owner's
  answer (serving/peers.py). ``--max-sequences`` is per worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

logger = logging.getLogger("gear_runtime.serving")

#: restarts allowed within a minute before the supervisor gives up
MAX_RESTARTS = 5
#: how often a serving worker's event loop tells the parent it is alive (seconds)
HEARTBEAT_S = 1.0
#: default --worker-timeout: a worker silent this long is killed and started again. Longer
#: than gunicorn's 30 s: pyACL holds the GIL (and so blocks the loop) for a whole NPU run
DEFAULT_TIMEOUT_S = 60.0
#: what a worker runs: the folder of the parent's gear_runtime (argv[1]) replaces the
#: working directory at the head of sys.path (``python -m`` would put the cwd first)
BOOT = ("import sys; sys.path[:] = [sys.argv.pop(1)] + [p for p in sys.path if p not in "
        "('', '.')]; from gear_runtime.cli.app import main; sys.exit(main(sys.argv[1:]))")


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


def package_root() -> str:
    """The folder holding the ``gear_runtime`` package this process runs."""
    import gear_runtime

    return os.path.dirname(os.path.dirname(os.path.abspath(gear_runtime.__file__)))


def worker_command(argv: Sequence[str], index: int, fd: int, device: str | None,
                   grpc_port: int | None, worker_dir: str | None = None,
                   count: int = 1) -> list[str]:
    """The command line of worker ``index`` of ``count``: the parent's ``serve`` flags
    without the worker flags, plus the inherited socket, its index and the count, its
    device, the gRPC port and the folder the workers share. It runs the parent's
    interpreter on the parent's ``gear_runtime`` (:data:`BOOT`), whatever the cwd holds."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--workers", "--devices", "--grpc-port", "--port", "--worker-dir",
                    "--worker-count", "--worker-lifeline", "--worker-heartbeat"):
            skip = "=" not in arg and i + 1 < len(argv)
            continue
        out.append(arg)
    cmd = [sys.executable, "-c", BOOT, package_root(), *out, "--worker-fd", str(fd),
           "--worker-index", str(index), "--worker-count", str(count)]
    if device is not None:
        cmd += ["--device", device]
    if grpc_port is not None:
        cmd += ["--grpc-port", str(grpc_port)]
    if worker_dir is not None:
        cmd += ["--worker-dir", worker_dir]
    return cmd


class Supervisor:
    """The parent: starts the workers, restarts one that dies or stops beating (``timeout``
    seconds without a heartbeat, None or 0: never), forwards the stop signals. Every worker
    inherits the read end of one pipe whose write end only the parent holds (its EOF tells
    the workers the parent is gone) and the write end of a heartbeat pipe of its own."""

    def __init__(self, commands: list[list[str]], fd: int, worker_dir: str | None = None,
                 timeout: float | None = None) -> None:
        self.commands, self.fd, self.worker_dir = commands, fd, worker_dir
        self.timeout = timeout or None
        self.procs: list[subprocess.Popen] = []
        self.stopping = 0  # stop signals received
        self.restarts: list[float] = []
        self._lifeline: tuple[int, int] | None = None  # (read end, write end)
        self._beats: dict[int, int] = {}  # worker index -> its heartbeat pipe's read end
        self._last_beat: dict[int, float] = {}  # worker index -> monotonic time of its last

    def _start(self, index: int) -> subprocess.Popen:
        assert self._lifeline is not None
        self._close_beats(index)
        beat_r, beat_w = os.pipe()
        os.set_blocking(beat_r, False)
        self._beats[index] = beat_r
        cmd = [*self.commands[index], "--worker-lifeline", str(self._lifeline[0]),
               "--worker-heartbeat", str(beat_w)]
        try:
            return subprocess.Popen(cmd, pass_fds=(self.fd, self._lifeline[0], beat_w))
        finally:
            os.close(beat_w)  # the worker's: its EOF would be the worker's exit

    def _close_beats(self, index: int) -> None:
        self._last_beat.pop(index, None)
        with contextlib.suppress(KeyError, OSError):
            os.close(self._beats.pop(index))

    def _signal(self, signum: int, frame: object) -> None:
        self.stopping += 1
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Supervise until every worker has stopped after a stop signal; the exit code."""
        old = {s: signal.signal(s, self._signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self._lifeline = os.pipe()
        try:
            self.procs = [self._start(i) for i in range(len(self.commands))]
            failed = 0  # the exit code of a worker that could not start
            while True:
                if self.stopping and all(p.poll() is not None for p in self.procs):
                    if failed:
                        return failed
                    return 0 if all(p.returncode == 0 for p in self.procs) else 1
                self._watchdog()
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
            for index in list(self._beats):
                self._close_beats(index)
            for end in self._lifeline:
                os.close(end)

    def _watchdog(self) -> None:
        """Read the heartbeats; kill a worker that served (beat once) and has been silent
        for :attr:`timeout` seconds. Its exit is then a crash: restarted unless stopping."""
        now = time.monotonic()
        for index, beat_r in list(self._beats.items()):
            with contextlib.suppress(BlockingIOError, OSError):
                if os.read(beat_r, 4096):
                    self._last_beat[index] = now
            last = self._last_beat.get(index)
            proc = self.procs[index] if index < len(self.procs) else None
            if self.timeout is None or last is None or proc is None or \
                    now - last <= self.timeout or proc.poll() is not None:
                continue
            print(f"gear-runtime: worker {index} (pid {proc.pid}) sent no heartbeat for "
                  f"{now - last:.1f} s (--worker-timeout {self.timeout:g}; expected one every "
                  f"{HEARTBEAT_S:g} s): its event loop or process is stuck: killing it",
                  file=sys.stderr, flush=True)
            proc.kill()
            self._last_beat.pop(index, None)  # one kill per silence

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
                  sock: socket.socket, host: str, grpc_port: int | None,
                  timeout: float | None = DEFAULT_TIMEOUT_S) -> int:
    """Run ``count`` workers (one per device of ``devices`` when given) on ``sock``, and
    with ``grpc_port`` gRPC on that port (0: one picked here, shared by all; the caller
    checked a given one is free); ``timeout``: the watchdog's (see :class:`Supervisor`)."""
    fd = sock.fileno()
    os.set_inheritable(fd, True)
    if grpc_port == 0:
        grpc_port = free_port(host)
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
        code = Supervisor(commands, fd, worker_dir, timeout).run()
    finally:
        shutil.rmtree(worker_dir, ignore_errors=True)
    print("gear-runtime: server stopped (all workers)", flush=True)
    return code


# ---- in the worker ------------------------------------------------------------------------------
#: Linux prctl option: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1


def watch_supervisor(lifeline_fd: int | None, grace_s: float, index: int | None = None) -> None:
    """Make this worker die with its parent. On Linux the kernel sends it SIGTERM when the
    parent dies (a drain as any SIGTERM's); everywhere a daemon thread waits for EOF on
    ``lifeline_fd`` (the parent holds the only write end, so EOF means it is gone, however
    it died, even before this ran), sends SIGTERM where the kernel did not, and kills the
    process if it is still there ``grace_s`` seconds later (a stuck drain)."""
    if lifeline_fd is None:
        return
    armed = _death_signal(signal.SIGTERM)
    parent = os.getppid()

    def wait() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline_fd, 1):  # the parent never writes: only EOF comes
                pass
        print(f"gear-runtime: worker {index} (pid {os.getpid()}): its supervisor (pid "
              f"{parent}) is gone: stopping (killed if still running in {grace_s:g} s)",
              file=sys.stderr, flush=True)
        if not armed:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="gear-supervisor-watch", daemon=True).start()


def _death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies; whether it did."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start_heartbeat(fd: int | None) -> None:
    """Write a byte to ``fd`` every :data:`HEARTBEAT_S` seconds from the running event loop
    (call it on the loop): the parent's watchdog hears a loop that runs. Stops when the
    parent is gone (EPIPE); a full pipe (the parent busy) drops the beat."""
    if fd is None:
        return
    import asyncio

    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)

    def beat() -> None:
        try:
            os.write(fd, b".")
        except BlockingIOError:
            pass
        except OSError:
            return
        loop.call_later(HEARTBEAT_S, beat)

    beat()


__all__ = ["DEFAULT_TIMEOUT_S", "HEARTBEAT_S", "MAX_RESTARTS", "Supervisor", "free_port",
           "mark_started", "package_root", "serve_workers", "start_heartbeat", "started_path",
           "watch_supervisor", "worker_command"]
