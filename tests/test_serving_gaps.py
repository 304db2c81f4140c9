"""What a Triton user meets at the edges: unimplemented gRPC calls answer UNIMPLEMENTED (no
traceback), --replicas without --ray is refused, a Triton-layout repository is refused with
what to do and an empty one is warned about, --pad warns to run check-padding."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli_support import run_cli  # noqa: E402
from serving_support import HOST, compile_models, live  # noqa: E402

from gear_runtime.cli import serve as serve_cli  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402

tgrpc = pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    return compile_models(tmp_path_factory.mktemp("m"))


def test_unimplemented_grpc_calls_answer_unimplemented(files, caplog) -> None:
    from tritonclient.utils import InferenceServerException
    server = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    with caplog.at_level(logging.INFO, "gear_runtime.serving"), live(server, grpc=True) as r:
        client = tgrpc.InferenceServerClient(f"{HOST}:{r.grpc_port}")
        for call in (client.get_system_shared_memory_status, client.get_log_settings,
                     client.get_cuda_shared_memory_status, client.get_trace_settings):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert "StatusCode.UNIMPLEMENTED" in str(info.value.status())
            assert "not implemented by gear_runtime" in info.value.message()
    assert not [rec for rec in caplog.records if rec.exc_info]  # no traceback logged


def test_replicas_without_ray_are_refused(files, capsys) -> None:
    code, _, err = run_cli(capsys, "serve", str(files["conv"]), "--replicas", "2")
    assert code == 2 and "--replicas 2 needs --ray" in err


def test_a_triton_layout_model_that_is_no_gear_file_is_refused_with_what_to_do(
        tmp_path, capsys) -> None:
    """Triton's layout is served (tests/test_serving_repository.py); a model.onnx the loader
    cannot read is refused naming it, with the compile line that makes it a gear file."""
    (tmp_path / "bert" / "1").mkdir(parents=True)
    (tmp_path / "bert" / "1" / "model.onnx").write_bytes(b"x")
    (tmp_path / "bert" / "config.pbtxt").write_text('name: "bert"\n')
    code, _, err = run_cli(capsys, "serve", "--model-repository", str(tmp_path), "--port",
                           "0")
    assert code == 2 and f"{tmp_path}/bert/1/model.onnx" in err
    assert f"gear-runtime compile {tmp_path}/bert/1/model.onnx" in err


def test_an_empty_repository_and_pad_are_warned_about(tmp_path, files, capsys,
                                                      monkeypatch) -> None:
    monkeypatch.setattr(serve_cli, "serve_from_args", lambda args: 0)
    code, _, err = run_cli(capsys, "serve", "--model-repository", str(tmp_path))
    assert code == 0 and "has no model (NAME.gear.onnx, or a folder" in err
    assert "serving no model until one is loaded" in err
    code, _, err = run_cli(capsys, "serve", str(files["prefill"]), "--pad")
    assert code == 0 and "run gear-runtime check-padding" in err
    code, _, err = run_cli(capsys, "serve", str(files["prefill"]), "--pad",
                           "--padding-checked")
    assert code == 0 and "check-padding" not in err


# ---- serve --workers: processes on one port, supervised ------------------------------------------
def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _ready_workers(port: int, want: set[str], timeout: float = 60) -> set[str]:
    """The workers seen answering /metrics (new connections land on any of them)."""
    import re
    import time

    from serving_support import request
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while not want <= seen and time.monotonic() < deadline:
        try:
            status, _, body = request(port, "GET", "/metrics")
        except OSError:
            time.sleep(0.2)
            continue
        if status == 200:
            seen |= {x.decode() for x in re.findall(rb'worker="(\d+)"', body)}
    return seen


def test_workers_share_the_port_label_their_metrics_and_are_restarted(files) -> None:
    import os
    import signal
    import time

    import numpy as np
    import tritonclient.http as thttp
    from serving_support import ServeProcess

    server = ServeProcess([str(files["conv"]), "--workers", "2", "--executors", "1"])
    try:
        assert _ready_workers(server.port, {"0", "1"}) >= {"0", "1"}
        x = thttp.InferInput("data", [1, 3, 8, 8], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
        for _ in range(10):  # a fresh connection each: any worker answers
            client = thttp.InferenceServerClient(f"{HOST}:{server.port}")
            assert client.infer("conv", [x]).as_numpy("logits").shape[0] == 1
            client.close()
        workers = _children(server.proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)  # a worker dies: the parent starts another
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = _children(server.proc.pid)
            if len(now) == 2 and workers[0] not in now:
                break
            time.sleep(0.2)
        assert len(now) == 2 and workers[0] not in now
        assert _ready_workers(server.port, {"0", "1"}) >= {"0", "1"}
        code, out, err = server.stop()
        assert code == 0, err
        assert "worker 0 exited" in err and "server stopped (all workers)" in out
    finally:
        server.kill()


def test_one_scrape_reports_every_worker_and_the_counts_add_up(files) -> None:
    """N requests spread over 2 workers: ONE scrape, whichever worker answers it, has both
    workers' series, and gear_requests_total summed over them is N; the statistics
    endpoint (HTTP and gRPC) counts N too."""
    import json
    import re
    import time

    import numpy as np
    import tritonclient.http as thttp
    from serving_support import ServeProcess, request

    from gear_runtime.serving.metrics import SNAPSHOT_S

    server = ServeProcess([str(files["conv"]), "--workers", "2", "--executors", "1"])
    try:
        assert _ready_workers(server.port, {"0", "1"}) >= {"0", "1"}
        x = thttp.InferInput("data", [1, 3, 8, 8], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
        n = 24
        for _ in range(n):  # a fresh connection each: both workers answer some
            client = thttp.InferenceServerClient(f"{HOST}:{server.port}")
            client.infer("conv", [x])
            client.close()
        time.sleep(2.5 * SNAPSHOT_S)  # every worker's snapshot has caught up
        for _ in range(4):  # whichever worker answers: the whole server
            status, _, body = request(server.port, "GET", "/metrics")
            assert status == 200
            counts = {w.decode(): float(v) for w, v in re.findall(
                rb'^gear_requests_total\{[^}]*worker="(\d+)"[^}]*\} (\S+)$', body, re.M)}
            assert set(counts) == {"0", "1"}, body[:2000]
            assert sum(counts.values()) == n, counts
            assert body.count(b"# TYPE gear_requests_total counter") == 1
            # each worker's own process metrics (its registry's ProcessCollector)
            memory = re.findall(rb'^process_resident_memory_bytes\{worker="(\d+)"\} ', body,
                                re.M)
            assert sorted(memory) == [b"0", b"1"], body[:2000]
            status, _, body = request(server.port, "GET", "/v2/models/conv/stats")
            (stats,) = json.loads(body)["model_stats"]
            assert (stats["inference_count"], stats["inference_stats"]["success"]["count"]) \
                == (n, n)
        code, _, err = server.stop()
        assert code == 0, err
    finally:
        server.kill()


def test_merged_expositions_keep_one_family_each() -> None:
    """Two workers' expositions merged: each family once (HELP / TYPE), every sample kept,
    and the result parses as Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    from gear_runtime.serving.metrics import Metrics, merge_expositions

    bodies = []
    for w, count in (("0", 3), ("1", 5)):
        m = Metrics(w)
        for _ in range(count):
            m.request("conv", "1", 0.001)
        bodies.append(m.exposition()[0])
    merged = merge_expositions(bodies)
    families = {f.name: f for f in text_string_to_metric_families(merged.decode())}
    totals = {s.labels["worker"]: s.value for s in families["gear_requests"].samples
              if s.name == "gear_requests_total"}
    assert totals == {"0": 3.0, "1": 5.0}
    assert merged.count(b"# HELP gear_request_latency_seconds ") == 1
    buckets = [s for s in families["gear_request_latency_seconds"].samples
               if s.name.endswith("_count")]
    assert sorted(s.value for s in buckets) == [3.0, 5.0]


def test_worker_statistics_merge_by_model_and_batch_size() -> None:
    from gear_runtime.serving.stats import ModelStats, RunTiming, merge_statistics

    docs = []
    for rows in ((1, 4), (4,)):
        stats = ModelStats("conv", "1")
        for r in rows:
            timing = RunTiming(0, r, 0.0, 0.001, 0.002, 0.001)
            stats.executed(timing)
            stats.succeeded(r, 0.0, 0.01, 0.0, timing)
        docs.append({"model_stats": [stats.snapshot()]})
    (m,) = merge_statistics(docs)["model_stats"]
    assert (m["inference_count"], m["execution_count"]) == (9, 3)
    assert m["inference_stats"]["success"]["count"] == 3
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in m["batch_stats"]] == [
        (1, 1), (4, 2)]
    assert docs[0]["model_stats"][0]["inference_count"] == 5  # the inputs are not changed


def _doc(model: str, last: int, rows: int, runs: int, ns: int,
         batches: dict[int, int]) -> dict:
    """One worker's statistics document: every duration ``{count: rows, ns: ns}``, each
    batch size's durations ``{count: n, ns: ns}``."""
    kinds = ("compute_input", "compute_infer", "compute_output")
    return {"model_stats": [{
        "name": model, "version": "1", "last_inference": last, "inference_count": rows,
        "execution_count": runs,
        "inference_stats": {k: {"count": rows, "ns": ns} for k in ("success", "queue", *kinds)},
        "batch_stats": [{"batch_size": b, **{k: {"count": n, "ns": ns} for k in kinds}}
                        for b, n in batches.items()]}]}


def test_worker_statistics_merge_every_field() -> None:
    """serve --workers: the statistics of every worker merged field by field, as one
    server's: counts and durations (count and ns) summed, per batch size too,
    last_inference the latest of any worker, models in the order first seen."""
    from gear_runtime.serving.stats import merge_statistics

    docs = [_doc("conv", 200, 3, 2, 10, {1: 1, 2: 1}), _doc("conv", 500, 4, 1, 20, {4: 1}),
            _doc("other", 50, 1, 1, 7, {1: 1}), _doc("conv", 300, 5, 5, 40, {1: 5})]
    kinds = ("compute_input", "compute_infer", "compute_output")
    conv, other = merge_statistics(docs)["model_stats"]
    assert conv["last_inference"] == 500 and other["last_inference"] == 50
    assert (conv["inference_count"], conv["execution_count"]) == (12, 8)
    assert conv["inference_stats"] == {k: {"count": 12, "ns": 70}
                                       for k in ("success", "queue", *kinds)}
    assert conv["batch_stats"] == [
        {"batch_size": 1, **{k: {"count": 6, "ns": 50} for k in kinds}},
        {"batch_size": 2, **{k: {"count": 1, "ns": 10} for k in kinds}},
        {"batch_size": 4, **{k: {"count": 1, "ns": 20} for k in kinds}}]
    assert other == docs[2]["model_stats"][0] and other is not docs[2]["model_stats"][0]
    assert docs[0]["model_stats"][0]["inference_count"] == 3  # the inputs are not changed


def test_a_workers_scrape_merges_its_own_series_with_the_others(tmp_path) -> None:
    """serve --workers: a scrape on any worker reports each worker's series once, its own
    included, every sample labelled with its worker (so ``sum without(worker)`` is the
    server's count), whether it asks the others afresh (scrape) or reads their snapshot
    files (exposition); its own snapshot file is never added to its own series."""
    import asyncio

    from prometheus_client.parser import text_string_to_metric_families

    from gear_runtime.serving.metrics import Metrics

    zero, one = Metrics("0", str(tmp_path)), Metrics("1", str(tmp_path))
    for metrics, count in ((zero, 2), (one, 3)):
        for _ in range(count):
            metrics.request("conv", "1", 0.001)
    one.exposition()  # worker 1's snapshot file (it has no socket: the scrape reads that)

    def totals(body: bytes) -> list[tuple[str | None, float]]:
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        return sorted((s.labels.get("worker"), s.value) for s in families["gear_requests"].samples
                      if s.name == "gear_requests_total")

    for _ in range(2):  # the second time worker 0's own snapshot is in the folder too
        assert totals(zero.exposition()[0]) == [("0", 2.0), ("1", 3.0)]
        assert totals(asyncio.run(zero.scrape())[0]) == [("0", 2.0), ("1", 3.0)]
    assert totals((tmp_path / "worker-0.prom").read_bytes()) == [("0", 2.0)]
    own, _ = asyncio.run(zero.scrape({"x-gear-scrape": "own"}))  # what a peer asks for
    assert totals(own) == [("0", 2.0)]


def test_workers_refuse_ray(files, capsys) -> None:
    code, _, err = run_cli(capsys, "serve", str(files["conv"]), "--workers", "2", "--ray")
    assert code == 2 and "--ray has its replicas" in err


def _fresh_step(port: int, grpc_port: int, seq: int, token: int, pos: int, start: bool,
                end: bool, use_grpc: bool) -> int:
    """One decode step on a NEW connection (the kernel gives it to any worker); the greedy
    token."""
    import numpy as np
    import tritonclient.http as thttp

    module = tgrpc if use_grpc else thttp
    client = (tgrpc.InferenceServerClient(f"{HOST}:{grpc_port}") if use_grpc
              else thttp.InferenceServerClient(f"{HOST}:{port}"))
    inputs = [module.InferInput("input_ids", [1, 1], "INT64"),
              module.InferInput("position", [1], "INT64")]
    inputs[0].set_data_from_numpy(np.array([[token]], np.int64))
    inputs[1].set_data_from_numpy(np.array([pos], np.int64))
    try:
        result = client.infer("decode", inputs, sequence_id=seq, sequence_start=start,
                              sequence_end=end)
    finally:
        client.close()
    return int(result.as_numpy("logits")[0, -1].argmax())


def _attack_the_worker_sockets(parent: int) -> None:
    """What any local process may send on a worker's Unix socket (the workers' folder is
    the server user's): garbage, an endless header, a body larger than any model takes, an
    unknown model, a request of a sequence that is not live. Each is answered as the TCP
    port answers it, or the connection is dropped; the worker keeps serving."""
    import contextlib
    import socket

    sockets = []
    for pid in _children(parent):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        folder = argv[argv.index(b"--worker-dir") + 1].decode()
        index = argv[argv.index(b"--worker-index") + 1].decode()
        sockets.append(f"{folder}/worker-{index}.sock")
    assert len(sockets) == 2
    body = b'{"inputs": [], "parameters": {"sequence_id": 4242}}'
    attacks = {
        b"garbage\r\n\r\n": b"400",
        b"GET / HTTP/1.1\r\nx: " + b"a" * 200_000 + b"\r\n\r\n": b"431",
        b"POST /v2/models/decode/infer HTTP/1.1\r\ncontent-length: 99999999999\r\n\r\n":
            b"413",
        b"POST /v2/models/nope/infer HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}": b"404",
        b"POST /v2/models/decode/infer HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body): b"400",
    }
    for path in sockets:
        for attack, status in attacks.items():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(path)
                # the server may answer and close before it has read it all
                with contextlib.suppress(OSError):
                    s.sendall(attack)
                reply = s.recv(4096)
            assert reply.split(b" ")[1:2] == [status], (attack[:60], reply[:200])


def test_sequences_over_two_workers_run_on_the_worker_that_holds_their_state(tmp_path) -> None:
    """serve --workers 2 --state: six sequences stepped turn about, every request on a new
    connection (so both workers receive requests of every sequence), over HTTP and gRPC:
    each gets the tokens of a local executor (its cache stays on its owner, which runs
    every step), and the owner counts each request once: per worker, the requests of the
    sequences it owns."""
    import re
    import time

    import numpy as np
    from serving_support import ServeProcess, request
    from test_serving_sequences import local_tokens

    from gear_runtime.examples import causal_lm
    from gear_runtime.serving.metrics import SNAPSHOT_S
    from gear_runtime.serving.peers import owner_of

    _, decode = causal_lm.write_pair(tmp_path, causal_lm.SMALL)
    prompts = {seq: causal_lm.prompt(3 + seq % 4, causal_lm.SMALL, seed=seq)
               for seq in range(101, 107)}
    new = 3
    want = {seq: local_tokens(decode, p, new) for seq, p in prompts.items()}
    server = ServeProcess([str(decode), "--state", "past_kv=present_kv", "--workers", "2",
                           "--executors", "1", "--grpc-port", "0", "--max-sequences", "6"])
    try:
        assert _ready_workers(server.port, {"0", "1"}) >= {"0", "1"}
        got: dict[int, list[int]] = {seq: [] for seq in prompts}
        last = {seq: p.shape[1] + new - 2 for seq, p in prompts.items()}
        for pos in range(max(last.values()) + 1):
            for seq, p in prompts.items():
                if pos > last[seq]:
                    continue
                token = int(p[0, pos]) if pos < p.shape[1] else got[seq][-1]
                pick = _fresh_step(server.port, server.grpc_port, seq, token, pos,
                                   pos == 0, pos == last[seq], use_grpc=(seq + pos) % 2 == 1)
                if pos >= p.shape[1] - 1:
                    got[seq].append(pick)
        assert got == want
        from tritonclient.utils import InferenceServerException
        for use_grpc in (False, True, False, True):  # the owner's error, passed on as it is
            with pytest.raises(InferenceServerException, match="is not live"):
                _fresh_step(server.port, server.grpc_port, 999, 1, 0, False, False, use_grpc)
        owned = {"0": 0, "1": 0}
        for seq in prompts:
            owned[str(owner_of(seq, 2))] += last[seq] + 1
        assert all(owned.values()), owned  # both workers own some: forwarding was needed
        time.sleep(2.5 * SNAPSHOT_S)
        status, _, body = request(server.port, "GET", "/metrics")
        counts = {w.decode(): float(v) for w, v in re.findall(
            rb'^gear_requests_total\{[^}]*worker="(\d+)"[^}]*\} (\S+)$', body, re.M)}
        assert counts == {w: float(n) for w, n in owned.items()}, (counts, owned)
        _attack_the_worker_sockets(server.proc.pid)
        # still serving, and forwarding: a fresh sequence on both transports
        for use_grpc in (False, True):
            assert _fresh_step(server.port, server.grpc_port, 200 + use_grpc, 5, 0, True,
                               True, use_grpc) == local_tokens(
                decode, np.array([[5]], np.int64), 1)[0]
        code, _, err = server.stop()
        assert code == 0, err
    finally:
        server.kill()


def test_workers_that_cannot_start_stop_the_server_at_once(files) -> None:
    """A bad ``--state`` is found by each worker as it loads: the server stops with the
    worker's exit code and its error, once, instead of restarting workers that fail the
    same way."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "gear_runtime.cli", "serve", str(files["conv"]), "--port", "0",
         "--workers", "2", "--state", "no_such_input=logits"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no_such_input" in proc.stderr
    assert "could not start (code 2): stopping the server" in proc.stderr
    assert "starting it again" not in proc.stderr and "keeps exiting" not in proc.stderr


def test_serve_profile_gives_the_batcher_measured_costs(files, tmp_path, capsys) -> None:
    """``serve --profile BENCH.json``: the model's own bench result makes the batcher's costs
    measured ones (then a batch takes the waiting requests that run most rows per second:
    tests/test_batcher.py); another model's result, or a file that is not one, is refused
    naming the file."""
    from gear_runtime.errors import InputError

    result = tmp_path / "conv.json"
    code, _, err = run_cli(capsys, "bench", str(files["conv"]), "--iterations", "2",
                           "--warmup", "0", "--no-progress", "--json", str(result))
    assert code == 0, err
    server = build_server([str(files["conv"])], options=ServeOptions(
        executors=1, profile=str(result)))
    try:
        plan = server.models["conv"].batcher.plan
        assert plan.measured and plan.dispatcher.cost_source == "profile"
    finally:
        import asyncio

        asyncio.run(server.close())
    plain = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    assert not plain.models["conv"].batcher.plan.measured
    import asyncio

    asyncio.run(plain.close())
    other = next(p for k, p in files.items() if k != "conv" and str(p).endswith(".gear.onnx"))
    with pytest.raises(InputError, match="measured on another model"):
        build_server([str(other)], options=ServeOptions(executors=1, profile=str(result)))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="--profile: .*bad.json.* is not a"):
        build_server([str(files["conv"])], options=ServeOptions(profile=str(tmp_path /
                                                                            "bad.json")))


def test_serve_workers_check_the_profile_once_in_the_parent(files, tmp_path, capsys,
                                                             monkeypatch) -> None:
    """``serve --workers 2 --profile``: the parent hashes the model's files against the
    profile once (a mismatch stops it before any worker starts) and tells the workers so
    (``--profile-checked``): they do not hash them again."""
    import subprocess

    from gear_runtime.tools.bench import context

    result = tmp_path / "conv.json"
    code, _, err = run_cli(capsys, "bench", str(files["conv"]), "--iterations", "2",
                           "--warmup", "0", "--no-progress", "--json", str(result))
    assert code == 0, err
    other = next(p for k, p in files.items() if k != "conv" and str(p).endswith(".gear.onnx"))
    proc = subprocess.run(
        [sys.executable, "-m", "gear_runtime.cli", "serve", str(other), "--port", "0",
         "--workers", "2", "--profile", str(result)], capture_output=True, text=True,
        timeout=120)
    assert proc.returncode != 0 and "measured on another model" in proc.stderr
    assert "could not start" not in proc.stderr and "serving with" not in proc.stdout

    from gear_runtime.serving import workers

    seen: list[list[str]] = []
    monkeypatch.setattr(workers, "serve_workers",
                        lambda argv, *rest: seen.append(list(argv)) or 0)
    code, _, err = run_cli(capsys, "serve", str(files["conv"]), "--port", "0", "--workers",
                           "2", "--profile", str(result))
    assert code == 0, err
    assert seen[0][-1] == "--profile-checked"  # what every worker's command line carries

    def no_hashing(files: object) -> str:
        raise AssertionError("a worker hashed the model's files again")

    monkeypatch.setattr(context, "files_digest", no_hashing)
    server = build_server([str(files["conv"])], options=ServeOptions(
        executors=1, profile=str(result), profile_checked=True))
    try:
        assert server.models["conv"].batcher.plan.measured
    finally:
        import asyncio

        asyncio.run(server.close())
    with pytest.raises(AssertionError, match="hashed"):  # unchecked: hashed, as before
        build_server([str(files["conv"])], options=ServeOptions(executors=1,
                                                                profile=str(result)))


def test_workers_sharing_a_socket_take_its_connections_in_turn(files) -> None:
    """Two servers accepting on one listening socket (as two workers do): each connection
    goes to the one holding fewer, so four keep-alive clients connecting one after another
    are two and two, and each answers. asyncio's own accept (the single-process path) takes
    every connection that waits, so whichever woke first could hold them all."""
    import asyncio
    import socket

    from gear_runtime.serving.http import HttpServer, listen

    app = build_server([str(files["conv"])], options=ServeOptions(executors=1))

    async def main() -> list[int]:
        sock = listen(HOST, 0)
        port = sock.getsockname()[1]
        servers = [HttpServer(app), HttpServer(app)]
        dups = [sock.dup() for _ in servers]  # a descriptor each, as each worker inherits
        for s, d in zip(servers, dups, strict=True):
            await s.start(d, shared=True)
        clients = []
        try:
            for k in range(4):
                c = socket.create_connection((HOST, port))
                clients.append(c)
                for _ in range(200):  # until a server holds it
                    if sum(len(s.connections) for s in servers) == k + 1:
                        break
                    await asyncio.sleep(0.005)
            counts = [len(s.connections) for s in servers]
            for c in clients:  # each connection is served
                c.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
            replies = await asyncio.gather(*(asyncio.to_thread(c.recv, 4096) for c in clients))
            assert all(r.startswith(b"HTTP/1.1 200") for r in replies), replies
            return counts
        finally:
            for c in clients:
                c.close()
            for s in servers:
                s.close_now()
            for d in (*dups, sock):
                d.close()
            await app.close()

    assert asyncio.run(main()) == [2, 2]


def test_workers_are_ready_only_once_every_worker_serves(files, tmp_path) -> None:
    """A worker answers ready only when every worker has marked itself started: a client
    connecting earlier would land on the few serving, and a keep-alive connection stays
    there. Once all have served, a worker's restart (its mark removed) does not flip it."""
    import asyncio

    from gear_runtime.serving.workers import mark_started, started_path

    server = build_server([str(files["conv"])], options=ServeOptions(
        executors=1, worker=0, workers=2, worker_dir=str(tmp_path)))
    try:
        mark_started(str(tmp_path), 0)
        model = server.models["conv"]
        assert not server.is_ready() and not server.model_is_ready(model)
        mark_started(str(tmp_path), 1)
        assert server.is_ready() and server.model_is_ready(model)
        Path(started_path(str(tmp_path), 1)).unlink()  # worker 1 restarting
        assert server.is_ready()
    finally:
        asyncio.run(server.close())
    alone = build_server([str(files["conv"])], options=ServeOptions(executors=1))
    assert alone.is_ready()
    asyncio.run(alone.close())
