"""Round 3's F3: a client that pipelines requests without reading its answers holds at most
what one read brought (reading pauses until its queue is answered), and answering a long
pipeline yields to other connections between answers. Measured here before the fix: 13,296
requests queued from one unread connection (all it could push in 3 s), another client's
health check waiting 1.04 s; after: a few reads' worth, 0.15-0.20 s."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serving_support import HOST, compile_models, live, request  # noqa: E402

from gear_runtime.serving import ServeOptions, build_server  # noqa: E402
from gear_runtime.serving import http as http_module  # noqa: E402

GET = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    return compile_models(tmp_path_factory.mktemp("m"))


@pytest.fixture
def server(files):  # a drained server is not ready again: one per test
    return build_server([str(files["conv"])], options=ServeOptions(executors=1))


def test_an_unread_pipeline_stops_being_read(server, monkeypatch) -> None:
    longest = [0]
    append = http_module._Connection.on_message_complete

    def watch(self) -> None:
        append(self)
        longest[0] = max(longest[0], len(self.queue))

    monkeypatch.setattr(http_module._Connection, "on_message_complete", watch)
    with live(server) as running:
        s = socket.create_connection((HOST, running.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its answers back up at once
        s.setblocking(False)
        sent, deadline = 0, time.monotonic() + 3
        while time.monotonic() < deadline:  # push until the server stops reading
            try:
                sent += s.send(GET * 64)
            except BlockingIOError:
                time.sleep(0.01)
        s.close()
        assert request(running.port, "GET", "/v2/health/ready")[0] == 200
    # the server read only as far as its queue was answered: a few reads' worth, not all
    assert sent > 0 and longest[0] * len(GET) < 300_000, (sent, longest[0])


def test_a_long_pipeline_does_not_stall_other_clients(server) -> None:
    with live(server) as running:
        s = socket.create_connection((HOST, running.port))
        done = threading.Event()

        def reader() -> None:
            got = 0
            while got < 20_000 * 38:  # every answer, read as fast as it comes
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                got += len(chunk)
            done.set()

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        s.sendall(GET * 20_000)
        worst = 0.0
        while not done.is_set():
            start = time.monotonic()
            status, _, body = request(running.port, "GET", "/v2/health/ready")
            assert status == 200, body
            worst = max(worst, time.monotonic() - start)
        t.join(30)
        s.close()
    assert worst < 0.6, f"another client waited {worst:.2f} s"
