"""``serve --workers`` under what production does to it (issue 48): the gRPC port asked is
the one served, workers die with their supervisor, a hung worker is replaced, workers import
the package the parent runs (not the working directory's), and a scrape is current and
survives a hostile file in the workers' folder.

Every server here binds 127.0.0.1 and every process started is killed at the end (the
``serve`` fixture's finally, and the survivors of a killed parent by their pids). Timings are
polled with generous deadlines: the machine may be a loaded 2-core box."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serving_support import HOST, ServeProcess, compile_models, request  # noqa: E402

thttp = pytest.importorskip("tritonclient.http")
tgrpc = pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    return compile_models(tmp_path_factory.mktemp("m"))


@contextlib.contextmanager
def serve(*args: str) -> Iterator[ServeProcess]:
    """``gear-runtime serve --workers 2 ARGS`` whose parent and workers are killed at the
    end, whatever happened to the parent."""
    server = ServeProcess(["--workers", "2", "--executors", "1", *args])
    seen: set[int] = set()
    try:
        yield server
    finally:
        seen |= set(_children(server.proc.pid))
        server.kill()
        for pid in seen:
            _kill(pid)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    with contextlib.suppress(OSError):
        return [int(p) for p in path.read_text().split()]
    return []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)


def _wait(what: str, check, timeout: float = 60.0, every: float = 0.1):
    """Poll ``check()`` until it is truthy; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(every)


def _workers_seen(port: int) -> set[str]:
    """The ``worker`` labels of one scrape ({} when no one answers yet)."""
    with contextlib.suppress(OSError):
        status, _, body = request(port, "GET", "/metrics")
        if status == 200:
            return {w.decode() for w in re.findall(rb'worker="(\d+)"', body)}
    return set()


def _both_serve(server: ServeProcess) -> None:
    _wait("both workers in a scrape", lambda: _workers_seen(server.port) >= {"0", "1"})
    _wait("two workers", lambda: len(_children(server.proc.pid)) == 2)


def _infer(port: int) -> None:
    x = thttp.InferInput("data", [1, 3, 8, 8], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    client = thttp.InferenceServerClient(f"{HOST}:{port}")  # a new connection: any worker
    try:
        client.infer("conv", [x])
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _worker_dir(server: ServeProcess) -> Path:
    """The workers' folder, read from a worker's command line."""
    pid = _children(server.proc.pid)[0]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(argv[argv.index(b"--worker-dir") + 1].decode())


# ---- 1. --grpc-port P is served, on P ---------------------------------------------------------
def test_workers_serve_grpc_on_the_port_asked(files) -> None:
    port = _free_port()
    with serve(str(files["conv"]), "--grpc-port", str(port)) as server:
        assert server.grpc_port == port, f"start line names grpc port {server.grpc_port}"
        _both_serve(server)
        client = tgrpc.InferenceServerClient(f"{HOST}:{port}")
        try:
            assert _wait(f"gRPC live on {port}", lambda: _grpc_live(client), timeout=30)
        finally:
            client.close()


def _grpc_live(client) -> bool:
    with contextlib.suppress(Exception):
        return bool(client.is_server_live())
    return False


# ---- 2. workers die with their parent ----------------------------------------------------------
def test_workers_die_when_their_parent_is_killed(files) -> None:
    with serve(str(files["conv"])) as server:
        _both_serve(server)
        workers = _children(server.proc.pid)
        try:
            os.kill(server.proc.pid, signal.SIGKILL)  # the OOM killer's way: no cleanup
            server.proc.wait()
            killed = time.monotonic()
            _wait("workers gone after their parent's kill -9",
                  lambda: not any(_alive(p) for p in workers), timeout=30)
            print(f"workers gone {time.monotonic() - killed:.2f} s after the parent's kill -9")
            with pytest.raises(OSError):  # nobody serves the port any more
                socket.create_connection((HOST, server.port), timeout=5).close()
        finally:  # orphans (the bug this tests) are killed here: the parent cannot
            for pid in workers:
                _kill(pid)


# ---- 3. a hung worker is replaced --------------------------------------------------------------
def test_a_hung_worker_is_killed_and_started_again(files) -> None:
    with serve(str(files["conv"]), "--worker-timeout", "4") as server:
        _both_serve(server)
        hung, other = _children(server.proc.pid)
        os.kill(hung, signal.SIGSTOP)  # hung as a whole: no heartbeat, no answer
        stopped = time.monotonic()
        _wait("the hung worker replaced", lambda: (set(_children(server.proc.pid)) - {hung, other})
              and hung not in _children(server.proc.pid), timeout=90)
        print(f"hung worker replaced {time.monotonic() - stopped:.2f} s after SIGSTOP")
        assert other in _children(server.proc.pid), "the healthy worker was killed too"
        _both_serve(server)
        code, _, err = server.stop()
        assert code == 0, err
        assert re.search(r"worker \d \(pid \d+\) sent no heartbeat for [\d.]+ s "
                         r"\(--worker-timeout 4;", err), err[-3000:]


def test_worker_timeout_is_checked(files) -> None:
    proc = subprocess.run([sys.executable, "-m", "gear_runtime.cli", "serve", str(files["conv"]),
                           "--workers", "2", "--worker-timeout", "-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--worker-timeout" in proc.stderr, proc.stderr


# ---- 4. workers import what the parent runs ----------------------------------------------------
def test_workers_ignore_a_gear_runtime_folder_in_the_working_directory(files,
                                                                       tmp_path) -> None:
    decoy = tmp_path / "gear_runtime"
    (decoy / "cli").mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy gear_runtime ran')\n")
    (decoy / "cli" / "__init__.py").write_text("")
    (decoy / "cli" / "__main__.py").write_text("raise SystemExit('the decoy cli ran')\n")
    # the console script, as a user runs it: its folder, not the cwd, is first on its path
    script = Path(sys.executable).with_name("gear-runtime")
    if not script.exists():
        pytest.skip(f"no console script at {script}")
    proc = subprocess.Popen([str(script), "serve", str(files["conv"]), "--port", "0",
                             "--workers", "2", "--executors", "1"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    workers: list[int] = []
    try:
        line = _read_line(proc)
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        _wait("both workers serving", lambda: proc.poll() is not None
              or _workers_seen(port) >= {"0", "1"})
        workers = _children(proc.pid)
        assert proc.poll() is None, proc.communicate(timeout=30)[1][-3000:]
        _infer(port)
    finally:
        workers += _children(proc.pid)
        proc.kill()
        proc.communicate(timeout=60)
        for pid in workers:
            _kill(pid)


def _read_line(proc: subprocess.Popen, timeout: float = 60) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert out and out[0], "no start line"
    return out[0]


# ---- 5. a scrape is current, and a bad file in the folder is skipped ---------------------------
def _requests_total(port: int) -> dict[str, float]:
    status, _, body = request(port, "GET", "/metrics")
    assert status == 200, body[:500]
    return {w.decode(): float(v) for w, v in re.findall(
        rb'^gear_requests_total\{[^}]*worker="(\d+)"[^}]*\} (\S+)$', body, re.M)}


def test_a_scrape_right_after_the_requests_counts_every_one(files) -> None:
    with serve(str(files["conv"])) as server:
        _both_serve(server)
        total = 0
        for _ in range(3):
            for _ in range(48):
                _infer(server.port)
            total += 48
            counts = _requests_total(server.port)  # at once: no time to catch up
            assert sum(counts.values()) == total, (counts, total)
        assert set(counts) == {"0", "1"}, counts
        print(f"scrape right after {total} requests: {sum(counts.values()):g} ({counts})")


def test_a_bad_file_in_the_workers_folder_is_skipped(files) -> None:
    with serve(str(files["conv"])) as server:
        _both_serve(server)
        folder = _worker_dir(server)
        (folder / "worker-7.prom").write_bytes(b"not {{ a prometheus exposition\n\xff")
        os.mkfifo(folder / "worker-8.prom")
        (folder / "worker-9.prom").mkdir()
        (folder / "worker-6.sock").write_bytes(b"not a socket")
        os.mkfifo(folder / "worker-7.stats.json")
        (folder / "worker-8.stats.json").write_bytes(b"{not json")
        _infer(server.port)
        for _ in range(4):  # whichever worker answers
            conn = http.client.HTTPConnection(HOST, server.port, timeout=20)
            try:
                conn.request("GET", "/metrics")
                reply = conn.getresponse()
                body = reply.read()
            finally:
                conn.close()
            assert reply.status == 200, body[:500]
            assert set(re.findall(rb'worker="(\d+)"', body)) == {b"0", b"1"}
            status, _, stats = request(server.port, "GET", "/v2/models/conv/stats")
            assert status == 200, stats[:500]
            assert json.loads(stats)["model_stats"][0]["name"] == "conv"
        code, _, err = server.stop()
        assert code == 0, err
        for name in ("worker-7.prom", "worker-8.prom", "worker-9.prom"):
            assert re.search(rf"skipped .*{name}", err), (name, err[-3000:])


# ---- the pieces, without a server ------------------------------------------------------------
def test_the_worker_timeout_default_is_the_watchdogs() -> None:
    from gear_runtime.cli.serve import WORKER_TIMEOUT
    from gear_runtime.serving.workers import DEFAULT_TIMEOUT_S

    assert WORKER_TIMEOUT == DEFAULT_TIMEOUT_S


def test_a_worker_runs_the_parents_package_whatever_the_cwd(tmp_path) -> None:
    from gear_runtime.serving.workers import package_root, worker_command

    cmd = worker_command(["serve", "m.gear.onnx", "--workers", "2"], 0, 5, None, None)
    assert cmd[:2] == [sys.executable, "-c"] and cmd[3] == package_root()
    (tmp_path / "gear_runtime").mkdir()
    (tmp_path / "gear_runtime" / "__init__.py").write_text("raise SystemExit('decoy')\n")
    probe = cmd[2].replace("from gear_runtime.cli.app import main; sys.exit(main(sys.argv[1:]))",
                           "import gear_runtime; print(gear_runtime.__file__)")
    out = subprocess.run([sys.executable, "-c", probe, package_root()], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(package_root()), out.stdout


def test_without_the_death_signal_the_lifeline_stops_the_worker(tmp_path) -> None:
    """The portable fallback alone (as off Linux): EOF on the lifeline -> SIGTERM."""
    read, write = os.pipe()
    code = ("import sys, time; from gear_runtime.serving import workers; "
            "workers._death_signal = lambda s: False; "
            f"workers.watch_supervisor({read}, 30.0, 0); print('up', flush=True); "
            "time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(read,),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        os.close(read)
        assert proc.stdout.readline().strip() == "up"
        os.close(write)  # the parent is gone
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGTERM
        assert "its supervisor" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_merging_skips_what_is_not_an_exposition(caplog) -> None:
    from gear_runtime.serving.metrics import Metrics, merge_expositions

    good = Metrics("0")
    good.request("conv", "1", 0.001)
    with caplog.at_level("WARNING", "gear_runtime.serving"):
        merged = merge_expositions([good.exposition()[0], ("/x/worker-3.prom", b"\xff{{"),
                                    ("/x/worker-4.prom", None),
                                    ("/x/worker-5.prom", b"# TYPE gear_requests gauge\n"
                                                         b"gear_requests 1\n")])
    from prometheus_client.parser import text_string_to_metric_families

    samples = [(s.name, s.labels.get("worker"), s.value)
               for f in text_string_to_metric_families(merged.decode()) for s in f.samples]
    assert ("gear_requests_total", "0", 1.0) in samples
    assert "worker-3.prom" in caplog.text and "worker-5.prom" in caplog.text


def test_a_grpc_port_in_use_is_one_clear_error(files) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "gear_runtime.cli", "serve",
                               str(files["conv"]), "--port", "0", "--workers", "2",
                               "--grpc-port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"port {port}" in proc.stderr, proc.stderr
    assert "--grpc-port" in proc.stderr
