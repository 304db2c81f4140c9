"""The text routes: OpenAI's completions and chat (with the real ``openai`` client),
Triton's generate over plain HTTP, served through the engine (serving/generation.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gear_runtime.examples import gqa_lm

openai = pytest.importorskip("openai")
pytest.importorskip("httptools")

from serving_support import HOST, ServeProcess, live, metrics, request  # noqa: E402

from gear_runtime.serving.app import build_server  # noqa: E402
from gear_runtime.serving.options import ServeOptions  # noqa: E402

SIZES = gqa_lm.SMALL  # max_seq 128, vocab 512


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gqa_lm.write_genai_folder(tmp_path_factory.mktemp("llm") / "tiny", SIZES, batch=True)


@pytest.fixture(scope="module", autouse=True)
def gear_cache(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GEAR_RUNTIME_LLM_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def served(folder):
    server = build_server([str(folder)], None, ServeOptions(max_sequences=4, max_queue=64))
    with live(server) as running:
        yield server, running


@pytest.fixture
def client(served):
    _, running = served
    return openai.OpenAI(base_url=f"http://{HOST}:{running.port}/v1", api_key="none",
                         max_retries=0, timeout=60)


def _engine(served):
    return served[0].llms["tiny"].engine


def _reference(served, prompt_ids: list[int], max_tokens: int) -> str:
    """What the engine makes of ``prompt_ids`` in process (greedy), decoded."""
    llm = served[0].llms["tiny"]
    tokens = llm.engine.generate([prompt_ids], max_tokens, stop_token_ids=llm.stop_ids)[0]
    return llm.tokenizer.decode(tokens)


def _ids(served, text: str) -> list[int]:
    return list(served[0].llms["tiny"].encode(text))


PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog",
           "Gears are fixed shapes", "café 中文 😀", "a", "One two three four five six",
           "Servers serve", "Zebra"]


def test_models_lists_the_folder(client) -> None:
    (model,) = client.models.list().data
    assert model.id == "tiny" and model.owned_by == "gear_runtime"


def test_a_completion_is_the_engines_greedy_text(client, served) -> None:
    out = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=12,
                                    temperature=0)
    (choice,) = out.choices
    assert choice.text == _reference(served, _ids(served, PROMPTS[1]), 12)
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(_ids(served, PROMPTS[1]))
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_token_ids_in_and_out(client, served) -> None:
    ids = gqa_lm.prompt(20, SIZES, seed=3)[0].tolist()
    llm = served[0].llms["tiny"]
    want = llm.engine.generate([ids], 6, stop_token_ids=llm.stop_ids)[0]
    out = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert out.choices[0].text == llm.tokenizer.decode(want)
    assert out.choices[0].token_ids == want
    chunks = list(client.completions.create(model="tiny", prompt=ids, max_tokens=6,
                                            temperature=0, stream=True,
                                            extra_body={"return_token_ids": True}))
    assert [t for c in chunks for t in c.choices[0].token_ids] == want


def test_a_streamed_completion_is_the_same_text_chunk_by_chunk(client, served) -> None:
    want = _reference(served, _ids(served, PROMPTS[0]), 20)
    chunks = list(client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices


def test_chat_renders_the_template_streamed_and_not(client, served) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a gear."}]
    llm = served[0].llms["tiny"]
    rendered = llm.tokenizer.apply_chat_template(messages)
    assert rendered.endswith("<|im_start|>assistant\n")
    ids = llm.tokenizer.encode(rendered, add_special_tokens=False)
    want = _reference(served, ids, 10)
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                         temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == want
    assert out.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages,
                                                 max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_eight_concurrent_streams_each_get_their_own_text(client, served) -> None:
    lengths = [5, 9, 14, 20, 7, 11, 16, 3]
    want = [_reference(served, _ids(served, p), n) for p, n in zip(PROMPTS, lengths, strict=True)]
    steps = _engine(served).stats.steps

    def stream(k: int) -> str:
        return "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=PROMPTS[k], max_tokens=lengths[k], temperature=0,
            stream=True))

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(stream, range(8)))
    assert got == want
    stats = _engine(served).stats
    assert stats.steps - steps < sum(lengths)  # steps were shared, not one per token


def test_a_stop_string_ends_the_text_before_it(client, served) -> None:
    full = _reference(served, _ids(served, PROMPTS[2]), 24)
    clean = [i for i in range(4, len(full) - 2) if "\ufffd" not in full[i:i + 2]]
    assert clean, full
    stop = full[clean[0]:clean[0] + 2]
    want = full[:full.index(stop)]
    for stream in (False, True):
        out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=24,
                                        temperature=0, stop=[stop], stream=stream)
        chunks = list(out) if stream else [out]
        assert "".join(c.choices[0].text for c in chunks) == want
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_ignore_eos_runs_past_the_end_of_sequence(client, served) -> None:
    llm = served[0].llms["tiny"]
    ids = next(_ids(served, p) for p in ("Hi", "Hello", "a", "Zebra", "ok")
               if len(llm.engine.generate([_ids(served, p)], 120,
                                          stop_token_ids=llm.stop_ids)[0]) < 120)
    ended = client.completions.create(model="tiny", prompt=ids, max_tokens=120,
                                      temperature=0)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 120
    out = client.completions.create(model="tiny", prompt=ids, max_tokens=120, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 120


def test_a_seed_repeats_a_sampled_completion(client) -> None:
    def sampled(seed: int) -> str:
        return client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=12,
                                         temperature=0.9, top_p=0.9, seed=seed,
                                         extra_body={"top_k": 50}).choices[0].text
    assert sampled(7) == sampled(7)


@pytest.mark.parametrize("body, status, words", [
    ({"model": "nope", "prompt": "x"}, 404, "does not exist"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 1000}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x " * 200}, 400, "max_length"),
    ({"model": "tiny", "prompt": "x", "n": 2}, 400, '"n"'),
    ({"model": "tiny", "prompt": [1, 2, 99999]}, 400, "99999"),
    ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "logprobs": 3}, 400, "logprobs"),
    ({"model": "tiny", "prompt": ""}, 400, "empty"),
    ({"model": "tiny"}, 400, "prompt"),
    ({"prompt": "x"}, 400, "model"),
])
def test_a_bad_request_gets_a_4xx_in_openais_shape(served, body, status, words) -> None:
    port = served[1].port
    got, _, raw = request(port, "POST", "/v1/completions", json.dumps(body).encode(),
                          {"content-type": "application/json"})
    assert got == status, raw
    error = json.loads(raw)["error"]
    assert words in error["message"] and {"type", "param", "code"} <= set(error)


def test_a_malformed_body_and_a_bad_request_fail_alone(client, served) -> None:
    port = served[1].port
    stream = client.completions.create(model="tiny", prompt=PROMPTS[5], max_tokens=15,
                                       temperature=0, stream=True)
    got, _, raw = request(port, "POST", "/v1/completions", b"{not json",
                          {"content-type": "application/json"})
    assert got == 400 and "JSON" in json.loads(raw)["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=3)
    text = "".join(c.choices[0].text for c in stream)
    assert text == _reference(served, _ids(served, PROMPTS[5]), 15)


def _raw_stream(port: int, max_tokens: int) -> socket.socket:
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    sock = socket.create_connection((HOST, port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
    sock.settimeout(30)
    data = b""
    while b"data: {" not in data:  # the first event: the sequence holds its row
        data += sock.recv(4096)
    return sock


def test_a_client_that_hangs_up_mid_stream_frees_its_row(folder) -> None:
    server = build_server([str(folder)], None, ServeOptions(max_sequences=1, max_queue=4))
    with live(server) as running:
        engine = server.llms["tiny"].engine
        sock = _raw_stream(running.port, 120)
        assert engine.live == 1
        sock.close()
        deadline = time.monotonic() + 10
        while engine.live:
            assert time.monotonic() < deadline, "the row was never freed"
            time.sleep(0.01)
        assert engine.stats.generated_tokens < 120
        client = openai.OpenAI(base_url=f"http://{HOST}:{running.port}/v1", api_key="x",
                               max_retries=0)
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=3,
                                         temperature=0).usage.completion_tokens == 3


def test_a_full_queue_answers_503_with_retry_after(folder) -> None:
    server = build_server([str(folder)], None, ServeOptions(max_sequences=1, max_queue=1))
    with live(server) as running:
        holding = [_raw_stream(running.port, 120)]  # the one row
        engine = server.llms["tiny"].engine
        body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 2}).encode()
        waiting = socket.create_connection((HOST, running.port))
        waiting.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: "
                        b"%d\r\n\r\n%b" % (len(body), body))
        deadline = time.monotonic() + 10
        while engine.waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, headers, raw = request(running.port, "POST", "/v1/completions", body)
        assert status == 503 and headers["retry-after"]
        assert "retry later" in json.loads(raw)["error"]["message"]
        for s in (*holding, waiting):
            s.close()


def test_past_the_drain_deadline_streams_end_with_abort_never_half_an_event(folder) -> None:
    server = build_server([str(folder)], None, ServeOptions(max_sequences=2))
    with live(server) as running:
        client = openai.OpenAI(base_url=f"http://{HOST}:{running.port}/v1", api_key="x",
                               max_retries=0)
        chunks: list = []

        def read() -> None:
            for c in client.completions.create(model="tiny", prompt="Hi", max_tokens=120,
                                               temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}):
                chunks.append(c)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 10
        while not chunks:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        running.call(server.refuse_waiting)
        reader.join(30)
        assert not reader.is_alive()
        assert chunks[-1].choices[0].finish_reason == "abort"
        assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1


def test_triton_generate_and_generate_stream(served) -> None:
    port = served[1].port
    want = _reference(served, _ids(served, PROMPTS[6]), 9)
    body = {"text_input": PROMPTS[6], "parameters": {"max_tokens": 9, "temperature": 0}}
    status, _, raw = request(port, "POST", "/v2/models/tiny/generate",
                             json.dumps(body).encode())
    assert status == 200
    doc = json.loads(raw)
    assert doc["text_output"] == want and doc["model_name"] == "tiny"
    status, headers, raw = request(port, "POST", "/v2/models/tiny/generate_stream",
                                   json.dumps({**body, "parameters": {}, "max_tokens": 9,
                                               "temperature": 0}).encode())
    assert status == 200 and headers["content-type"] == "text/event-stream"
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line]
    assert "".join(e["text_output"] for e in events) == want
    assert events[-1]["finish_reason"] == "length"
    status, _, raw = request(port, "POST", "/v2/models/tiny/generate",
                             json.dumps({"parameters": {}}).encode())
    assert status == 400 and "text_input" in json.loads(raw)["error"]
    status, _, _ = request(port, "POST", "/v2/models/nope/generate",
                           json.dumps(body).encode())
    assert status == 404
    status, _, raw = request(port, "GET", "/v2/models/tiny")
    assert status == 200 and json.loads(raw)["inputs"][0]["name"] == "text_input"


def test_the_vllm_metrics_count_what_was_served(client, served) -> None:
    port = served[1].port
    label = (("model_name", "tiny"),)
    before = metrics(port)
    out = client.completions.create(model="tiny", prompt=PROMPTS[7], max_tokens=5,
                                    temperature=0)
    after = metrics(port)

    def grew(name: str) -> float:
        return after.get((name, label), 0) - before.get((name, label), 0)

    assert grew("vllm:prompt_tokens_total") == out.usage.prompt_tokens
    assert grew("vllm:generation_tokens_total") == 5
    assert grew("vllm:time_to_first_token_seconds_count") == 1
    assert grew("vllm:inter_token_latency_seconds_count") == 4
    assert grew("vllm:e2e_request_latency_seconds_count") == 1
    assert ("vllm:num_requests_running", label) in after
    assert after[("vllm:request_success_total",
                  (("finished_reason", "length"), ("model_name", "tiny")))] >= 1


def test_serve_a_model_folder_from_the_command_line(folder, tmp_path) -> None:
    proc = ServeProcess([str(folder), "--max-sequences", "2"], timeout=120)
    try:
        client = openai.OpenAI(base_url=f"http://{HOST}:{proc.port}/v1", api_key="x",
                               max_retries=0)
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            temperature=0)
        assert out.usage.completion_tokens == 4
    finally:
        code, _, err = proc.stop()
    assert code == 0, err


def test_serve_refuses_a_folder_that_is_not_a_model(tmp_path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gear_runtime.cli", "serve", str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert done.returncode == 2 and "genai_config.json" in done.stderr


def test_the_asgi_app_streams_and_a_disconnect_frees_the_row(folder) -> None:
    """``GearServer.app`` (Ray Serve's replicas): the same events, and a client that
    disconnects mid-stream ends its sequence."""
    import asyncio

    server = build_server([str(folder)], None, ServeOptions(max_sequences=2))
    engine = server.llms["tiny"].engine

    def call(body: dict, hang_up_after: int | None) -> list[dict]:
        sent: list[dict] = []

        async def run() -> None:
            gone = asyncio.Event()
            messages = [{"type": "http.request", "body": json.dumps(body).encode()}]

            async def receive() -> dict:
                if messages:
                    return messages.pop()
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict) -> None:
                sent.append(message)
                pieces = [m for m in sent if m.get("body")]
                if hang_up_after is not None and len(pieces) >= hang_up_after:
                    gone.set()

            scope = {"type": "http", "method": "POST", "path": "/v1/completions",
                     "headers": [(b"content-type", b"application/json")]}
            await server.app(scope, receive, send)

        asyncio.run(run())
        return sent

    try:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0,
                "stream": True}
        sent = call(body, None)
        assert sent[0]["status"] == 200
        text = b"".join(m.get("body", b"") for m in sent[1:]).decode()
        events = [e[6:] for e in text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        got = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        llm = server.llms["tiny"]
        assert got == llm.tokenizer.decode(llm.engine.generate(
            [list(llm.encode("Hello"))], 8, stop_token_ids=llm.stop_ids)[0])
        before = engine.stats.generated_tokens
        call({**body, "max_tokens": 120, "ignore_eos": True}, hang_up_after=1)
        deadline = time.monotonic() + 10
        while engine.live:
            assert time.monotonic() < deadline, "the row was never freed"
            time.sleep(0.01)
        assert engine.stats.generated_tokens - before < 120  # cut off, not run out
    finally:
        engine.close()


def test_a_generation_closed_before_it_is_read_ends_its_sequence(served) -> None:
    """A client gone before its streamed reply started: the reply's stream is closed
    unread, and its sequence must still leave the engine (never run to max_tokens)."""
    import asyncio

    from gear_runtime.serving.generation import TextRequest

    llm = served[0].llms["tiny"]
    request = TextRequest(tuple(_ids(served, "Hello")), 100, 0.0, ignore_eos=True)

    async def start_and_close():
        generation = llm.start(request)
        await generation.aclose()
        return generation

    generation = asyncio.run(start_and_close())
    assert len(generation.stream.result()) < 100
    assert generation.stream.finish_reason == "cancelled"
    assert generation not in llm.running
