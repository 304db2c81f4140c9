"""A stateful model served over Triton's sequence protocol: a client generates with
``tritonclient`` alone (HTTP and gRPC), the decode's KV cache resident on the server between
its requests, and gets the tokens a local executor with the same state gives.

The model is the example decode step (``examples/causal_lm.py``, static, past_kv ->
present_kv); the client feeds the prompt one token per request from sequence_start, then
its own greedy picks, ending with sequence_end."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serving_support import HOST, live, request  # noqa: E402

import gear_runtime as gr  # noqa: E402
from gear_runtime.examples import causal_lm  # noqa: E402
from gear_runtime.serving import ServeOptions, build_server  # noqa: E402

triton = pytest.importorskip("tritonclient.http")
tgrpc = pytest.importorskip("tritonclient.grpc")
STATE = tuple(causal_lm.STATE.items())
SIZES = causal_lm.SMALL


@pytest.fixture(scope="module")
def decode(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, decode = causal_lm.write_pair(tmp_path_factory.mktemp("lm"), SIZES)
    return decode


def _server(decode: Path, **kw):
    return build_server([str(decode)], options=ServeOptions(state=STATE, **kw))


def local_tokens(decode: Path, prompt: np.ndarray, new: int) -> list[int]:
    """The greedy tokens of a local executor with the cache resident: the reference."""
    ex = gr.load(str(decode)).create_executor(state=causal_lm.STATE)
    ids, out = list(prompt[0]), []
    for pos in range(len(ids) + new - 1):
        token = ids[pos] if pos < len(ids) else out[-1]
        (logits,) = ex.execute({"input_ids": np.array([[token]], np.int64),
                                "position": np.array([pos], np.int64)})
        if pos >= len(ids) - 1:
            out.append(int(logits[0, -1].argmax()))
    return out


def client_tokens(client, module, seq_id: int, prompt: np.ndarray, new: int) -> list[int]:
    """What a tritonclient user writes: one infer per token, the sequence flags set."""
    ids, out = list(prompt[0]), []
    last = len(ids) + new - 2
    for pos in range(last + 1):
        token = ids[pos] if pos < len(ids) else out[-1]
        inputs = [module.InferInput("input_ids", [1, 1], "INT64"),
                  module.InferInput("position", [1], "INT64")]
        inputs[0].set_data_from_numpy(np.array([[token]], np.int64))
        inputs[1].set_data_from_numpy(np.array([pos], np.int64))
        result = client.infer("decode", inputs, sequence_id=seq_id,
                              sequence_start=pos == 0, sequence_end=pos == last)
        if pos >= len(ids) - 1:
            out.append(int(result.as_numpy("logits")[0, -1].argmax()))
    return out


def test_a_client_generates_over_http_and_grpc_with_tritonclient_alone(decode) -> None:
    prompts = [causal_lm.prompt(n, SIZES, seed=n) for n in (5, 9)]
    want = [local_tokens(decode, p, 6) for p in prompts]
    server = _server(decode, max_sequences=1)  # the second sequence reuses the first's slot
    with live(server, grpc=True) as running:
        http = triton.InferenceServerClient(f"{HOST}:{running.port}")
        grpc = tgrpc.InferenceServerClient(f"{HOST}:{running.grpc_port}")
        assert client_tokens(http, triton, 11, prompts[0], 6) == want[0]
        assert client_tokens(grpc, tgrpc, 12, prompts[1], 6) == want[1]
        config = http.get_model_config("decode")
        state = config["sequence_batching"]["state"]
        assert [(s["input_name"], s["output_name"]) for s in state] == list(STATE)
        meta = http.get_model_metadata("decode")
        assert [i["name"] for i in meta["inputs"]] == ["input_ids", "position"]
        assert [o["name"] for o in meta["outputs"]] == ["logits"]


def test_interleaved_sequences_keep_their_own_caches(decode) -> None:
    """Two sequences stepped turn about on one server: each gets its own tokens (one cache
    per sequence, never the other's)."""
    a, b = causal_lm.prompt(6, SIZES, seed=1), causal_lm.prompt(4, SIZES, seed=2)
    want_a, want_b = local_tokens(decode, a, 3), local_tokens(decode, b, 3)
    server = _server(decode, max_sequences=2)
    with live(server) as running:
        client = triton.InferenceServerClient(f"{HOST}:{running.port}")
        steps = {1: (a, []), 2: (b, [])}
        lengths = {1: 6 + 3 - 1, 2: 4 + 3 - 1}
        for pos in range(max(lengths.values())):
            for seq, (p, out) in steps.items():
                if pos >= lengths[seq]:
                    continue
                token = p[0, pos] if pos < p.shape[1] else out[-1]
                inputs = [triton.InferInput("input_ids", [1, 1], "INT64"),
                          triton.InferInput("position", [1], "INT64")]
                inputs[0].set_data_from_numpy(np.array([[token]], np.int64))
                inputs[1].set_data_from_numpy(np.array([pos], np.int64))
                result = client.infer("decode", inputs, sequence_id=seq,
                                      sequence_start=pos == 0,
                                      sequence_end=pos == lengths[seq] - 1)
                if pos >= p.shape[1] - 1:
                    out.append(int(result.as_numpy("logits")[0, -1].argmax()))
    assert steps[1][1] == want_a and steps[2][1] == want_b


def _step(port: int, seq, pos: int, start=False, end=False, params=None) -> tuple[int, bytes]:
    import json
    body = {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]},
                       {"name": "position", "shape": [1], "datatype": "INT64", "data": [pos]}],
            "parameters": params if params is not None else
            {"sequence_id": seq, "sequence_start": start, "sequence_end": end}}
    status, _, answer = request(port, "POST", "/v2/models/decode/infer",
                                json.dumps(body).encode(), {"Content-Type": "application/json"})
    return status, answer


def test_the_sequence_rules(decode) -> None:
    server = _server(decode, max_sequences=2, sequence_idle_s=0.3)
    with live(server) as running:
        port = running.port
        status, answer = _step(port, None, 0, params={})
        assert status == 400 and b"sequence_id" in answer
        status, answer = _step(port, 5, 0)  # no start for a sequence that is not live
        assert status == 400 and b"sequence 5" in answer and b"sequence_start" in answer
        status, answer = _step(port, 5, 0, params={"sequence_id": 5, "sequence_start": "yes"})
        assert status == 400 and b"sequence_start" in answer
        assert _step(port, 1, 0, start=True)[0] == 200
        assert _step(port, 2, 0, start=True)[0] == 200
        status, answer = _step(port, 3, 0, start=True)  # both slots held
        assert status == 503 and b"sequences_full" in answer
        assert _step(port, 1, 1, end=True)[0] == 200  # ends sequence 1: its slot is free
        assert _step(port, 1, 2)[0] == 400
        assert _step(port, 3, 0, start=True)[0] == 200
        time.sleep(0.5)  # sequence 2 and 3 idle past 0.3 s: a new start may take their slot
        assert _step(port, 4, 0, start=True)[0] == 200
        assert _step(port, 6, 0, start=True)[0] == 200
        status, _ = _step(port, 2, 1)  # freed while idle
        assert status == 400
        status, answer = _step(port, 6, 1, params={"sequence_id": 6, "dynamic_dims": [1]})
        assert status == 400
        _, _, text = request(port, "GET", "/metrics")
        text = text.decode()
        def value(name: str, **labels: str) -> float:
            import re
            for line in text.splitlines():
                m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
                if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
                    return float(m.group(2))
            raise AssertionError(f"no {name} {labels} in the metrics")
        assert value("gear_sequences_total", model="decode", event="started") == 5
        assert value("gear_sequences_total", model="decode", event="ended") == 1
        assert value("gear_sequences_total", model="decode", event="expired") == 2
        assert value("gear_sequences_live", model="decode") == 2


def test_serve_cli_takes_the_state_flags(decode, capsys) -> None:
    from gear_runtime.cli.app import build_parser
    from gear_runtime.cli.serve import options_from_args
    args = build_parser().parse_args(["serve", str(decode), "--state", "past_kv=present_kv",
                                      "--max-sequences", "3", "--sequence-idle-seconds", "5"])
    options = options_from_args(args)
    assert options.state == STATE and options.max_sequences == 3
    assert options.sequence_idle_s == 5
    bad = build_parser().parse_args(["serve", str(decode), "--state", "past_kv"])
    with pytest.raises(Exception, match="INPUT=OUTPUT"):
        options_from_args(bad)


class _FakeExecutor:
    def __init__(self) -> None:
        self.resets, self.runs, self.closed = 0, 0, False

    def reset_state(self) -> None:
        self.resets += 1

    def close(self) -> None:
        self.closed = True


class _FakeModel:
    def __init__(self) -> None:
        self.made: list[_FakeExecutor] = []

    def create_executor(self, state=None, in_place_state=False) -> _FakeExecutor:
        assert state == {"past_kv": "present_kv"} and in_place_state is False
        self.made.append(_FakeExecutor())
        return self.made[-1]


def test_a_start_resets_the_slots_state_and_nothing_else_does() -> None:
    """The example decode masks every cache slot past its position, so a stale cache cannot
    change its tokens: the reset is checked here on the slots themselves."""
    import asyncio

    from gear_runtime.serving.sequences import SequenceControl, SequenceSlots
    model = _FakeModel()
    slots = SequenceSlots(model, causal_lm.STATE, 1, "m")

    async def main() -> None:
        def run(ex):
            ex.runs += 1
            return ex
        ex = await slots.call(SequenceControl(1, True, False), run)
        await slots.call(SequenceControl(1, False, False), run)
        assert (ex.resets, ex.runs) == (1, 2)
        await slots.call(SequenceControl(1, True, True), run)  # a start over, then the end
        assert (ex.resets, ex.runs, slots.live) == (2, 3, 0)
        await slots.call(SequenceControl("next", True, False), run)  # the slot reused
        assert ex.resets == 3 and slots.live == 1

    asyncio.run(main())
    slots.close()
    assert [e.closed for e in model.made] == [True]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    from gear_runtime.tools import generate
    return generate.build_pair(tmp_path_factory.mktemp("pair"), SIZES)


def test_a_start_model_takes_the_prompt_in_one_request(pair) -> None:
    """serve --sequence-start prefill.gear.onnx: the prompt goes in ONE start request (the
    prefill at its covering gear writes the cache straight into the new sequence's state),
    then one request per token: the tokens of the in-process prefill -> decode pipeline."""
    from gear_runtime.tools import generate
    _, prefill_gear, decode = pair
    prompt = causal_lm.prompt(40, SIZES, seed=3)  # gear 1 of the prefill (seq 64), not 0
    gen = generate.Generator(prefill_gear, decode)
    want = gen.generate(prompt, 8)
    gen.close()
    server = build_server([str(decode)], options=ServeOptions(
        state=STATE, max_sequences=2, sequence_start=str(prefill_gear)))
    for kind in ("http", "grpc"):
        with live(server if kind == "http" else build_server([str(decode)], options=ServeOptions(
                state=STATE, max_sequences=2, sequence_start=str(prefill_gear))),
                grpc=kind == "grpc") as running:
            module = triton if kind == "http" else tgrpc
            client = module.InferenceServerClient(
                f"{HOST}:{running.port if kind == 'http' else running.grpc_port}")
            first = [module.InferInput("input_ids", list(prompt.shape), "INT64"),
                     module.InferInput("attention_mask", list(prompt.shape), "INT64")]
            first[0].set_data_from_numpy(prompt)
            first[1].set_data_from_numpy(np.ones_like(prompt))
            result = client.infer("decode", first, sequence_id=21, sequence_start=True)
            tokens = [int(result.as_numpy("logits").argmax())]
            for t in range(7):
                step = [module.InferInput("input_ids", [1, 1], "INT64"),
                        module.InferInput("position", [1], "INT64")]
                step[0].set_data_from_numpy(np.array([[tokens[-1]]], np.int64))
                step[1].set_data_from_numpy(np.array([prompt.shape[1] + t], np.int64))
                result = client.infer("decode", step, sequence_id=21, sequence_end=t == 6)
                tokens.append(int(result.as_numpy("logits").argmax()))
            assert tokens == want, kind
            # the metadata and /config say what the start request carries
            meta = json.loads(request(running.port, "GET", "/v2/models/decode")[2])
            start = meta["parameters"]["sequences"]["start"]
            assert [(i["name"], i["datatype"], i["shape"]) for i in start["inputs"]] == [
                ("input_ids", "INT64", [1, -1]), ("attention_mask", "INT64", [1, -1])]
            config = json.loads(request(running.port, "GET", "/v2/models/decode/config")[2])
            assert json.loads(config["parameters"]["sequence_start"]["string_value"]) == start
            status, _, text = request(running.port, "GET", "/metrics")
            assert 'gear="start:64,64"' in text.decode()  # the start model's gear, labelled


def test_a_start_model_without_the_state_output_is_refused(pair, tmp_path) -> None:
    from models import heavy_model
    _, _, decode = pair
    other = str(tmp_path / "other.gear.onnx")
    gr.compile(heavy_model(width=8, layers=1), gr.GearSpec.from_atc(
        "x:-1,8", dynamic_batch_size="1,2"), other, progress=False)
    with pytest.raises(gr.InputError, match="has no output 'present_kv' to start the state "
                                            "'past_kv'"):
        build_server([str(decode)], options=ServeOptions(state=STATE, sequence_start=other))


def _static_start(path: Path, outputs: dict[str, tuple[int, ...]]) -> str:
    """A static start model taking ``input_ids`` [1, 4], answering zeros as ``outputs``
    (name -> shape, float32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Constant", [], [name],
                              value=numpy_helper.from_array(np.zeros(shape, np.float32)))
             for name, shape in outputs.items()]
    graph = helper.make_graph(
        nodes, "start", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    return str(path)


def test_a_start_model_that_does_not_fit_the_step_model_is_refused_at_load(
        decode, tmp_path) -> None:
    """A --sequence-start model whose state output has another shape than the step model's
    state, or that answers other outputs than the step model, is refused when the server
    loads, naming both: never found at the first start request."""
    import asyncio

    logits, cache = (1, 1, SIZES.vocab), tuple(SIZES.cache_shape)
    short = _static_start(tmp_path / "short.onnx",
                          {"logits": logits, "present_kv": (*cache[:-1], cache[-1] // 2)})
    with pytest.raises(gr.InputError, match=r"output 'present_kv' is float32 .*, the state "
                                            r"'past_kv' is float32"):
        _server(decode, sequence_start=short)
    other = _static_start(tmp_path / "other.onnx", {"scores": logits, "present_kv": cache})
    with pytest.raises(gr.InputError, match=r"answers \['scores'\], the step model "
                                            r"\['logits'\]"):
        _server(decode, sequence_start=other)
    fits = _static_start(tmp_path / "fits.onnx", {"logits": logits, "present_kv": cache})
    server = _server(decode, sequence_start=fits)  # the same kind of model, fitting: served
    asyncio.run(server.close())


def test_onnxruntime_genais_graph_is_served_with_its_cache_in_place(tmp_path, capsys) -> None:
    """``serve --state ... --in-place-state`` on the one-file GQA model: the sequence_start
    request is the padded prompt (its gear), each step one token with the static mask; the
    tokens are a local in-place executor's, and the slots' pairs run in place. A model
    whose graph does not update its state in place is refused at start, naming the pair."""
    from cli_support import run_cli

    from gear_runtime.errors import InputError
    from gear_runtime.examples import gqa_lm

    sizes = gqa_lm.SMALL
    _, gear = gqa_lm.write_model(tmp_path, sizes)
    pairs = tuple(gqa_lm.state_pairs(sizes).items())
    prompt = gqa_lm.prompt(11, sizes, seed=5)
    n = prompt.shape[1]

    def feeds(step: int, token: int) -> tuple[np.ndarray, np.ndarray]:
        """Step 0: the padded prompt; then one token at position n + step - 1."""
        f = (gqa_lm.prompt_feeds(prompt, sizes) if step == 0
             else gqa_lm.step_feeds(token, n + step - 1, sizes))
        return f["input_ids"], f["attention_mask"]

    ex = gr.load(str(gear)).create_executor(state=dict(pairs), in_place_state=True)
    want: list[int] = []
    for step in range(6):
        ids, mask = feeds(step, want[-1] if want else 0)
        (logits,) = ex.execute({"input_ids": ids, "attention_mask": mask})
        want.append(int(logits[0, n - 1 if step == 0 else 0].argmax()))
    server = build_server([str(gear)], options=ServeOptions(state=pairs, in_place_state=True,
                                                            max_sequences=1))
    modes = {m for slot in server.models["gqa_lm"].sequences._slots
             for m in slot.executor.state_modes.values()}
    assert modes == {"in place"}
    with live(server) as running:
        client = triton.InferenceServerClient(f"{HOST}:{running.port}")
        got: list[int] = []
        for step in range(6):
            ids, mask = feeds(step, got[-1] if got else 0)
            inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"),
                      triton.InferInput("attention_mask", list(mask.shape), "INT64")]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(mask)
            result = client.infer("gqa_lm", inputs, sequence_id=77, sequence_start=step == 0,
                                  sequence_end=step == 5)
            got.append(int(result.as_numpy("logits")[0, n - 1 if step == 0 else 0].argmax()))
    assert got == want
    _, decode = causal_lm.write_pair(tmp_path / "pair", SIZES)
    with pytest.raises(InputError, match="'past_kv' <- 'present_kv' cannot run in place"):
        build_server([str(decode)], options=ServeOptions(state=STATE, in_place_state=True))
    code, _, err = run_cli(capsys, "serve", str(decode), "--in-place-state")
    assert code == 2 and "--in-place-state needs --state" in err
