"""The seed's service: static models, resident state, out=, shared weights, and the tokens of
the built-in prefill + static decode pair against plain ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import gear_runtime as gr
from gear_runtime.errors import ClosedError, GearRuntimeError, InputError
from gear_runtime.examples import causal_lm
from gear_runtime.tools import generate
from tests.models import conv_model

SIZES = causal_lm.SMALL


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    return generate.build_pair(tmp_path_factory.mktemp("pair"), SIZES)


@pytest.fixture(scope="module")
def ort_pair(pair):
    return generate.ort_sessions(pair[0], pair[2])


def step_feeds(token: int, position: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.array([[token]], np.int64), "position": np.array([position])}


# ---- static models ---------------------------------------------------------------------------
def test_static_model_loads_with_one_gear_and_runs_exactly_its_shapes(pair, ort_pair) -> None:
    model = gr.load(str(pair[2]))
    assert model.gears == [()] and model.mode == "static"
    ex = model.create_executor()
    cache = np.random.default_rng(0).standard_normal(SIZES.cache_shape).astype(np.float32)
    feeds = {**step_feeds(7, 3), "past_kv": cache}
    got = ex.execute(feeds)
    want = ort_pair[1].run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(InputError, match=r"input 'past_kv' axis 4 is 128 but the model fixes "
                                         r"it to 256"):
        ex.execute({**feeds, "past_kv": cache[:, :, :, :, :128]})
    with pytest.raises(InputError, match="input_ids"):
        ex.execute({**feeds, "input_ids": np.zeros((1, 2), np.int64)})


def test_static_model_refuses_padding_to_another_shape(pair) -> None:
    ex = gr.load(str(pair[2])).create_executor()
    cache = np.zeros(SIZES.cache_shape, np.float32)
    with pytest.raises(GearRuntimeError, match="past_kv"):
        ex.execute({**step_feeds(1, 0), "past_kv": cache[:, :, :, :, :10]}, pad=True)


def test_dynamic_model_without_gears_is_refused_saying_to_compile(tmp_path) -> None:
    path = tmp_path / "dyn.onnx"
    onnx.save(conv_model(), path)
    with pytest.raises(GearRuntimeError, match="compile it"):
        gr.load(str(path))


# ---- state pairs checked when the executor is made ------------------------------------------
@pytest.mark.parametrize(("state", "match"), [
    ({"nope": "present_kv"}, "no input 'nope'"),
    ({"past_kv": "nope"}, "no output 'nope'"),
    ({"past_kv": "logits"}, "shape"),
    ({"input_ids": "present_kv"}, "shape"),
    ({}, "non-empty dict"),
    (["past_kv"], "non-empty dict"),
    ({"past_kv": 3}, "output names"),
])
def test_state_pairs_are_checked_at_creation(pair, state, match) -> None:
    model = gr.load(str(pair[2]))
    with pytest.raises(InputError, match=match):
        model.create_executor(state=state)


def test_state_pair_dtype_and_dynamic_input_are_refused(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)],
                              "g", [x], [y])
    path = tmp_path / "cast.onnx"
    # IR 8 as the other test models: the floor ORT (1.21) reads up to IR 10
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    with pytest.raises(InputError, match="float64.*float32|one dtype"):
        gr.load(str(path)).create_executor(state={"x": "y"})


def test_one_output_feeding_two_state_inputs_is_refused_naming_both(tmp_path) -> None:
    """Each output feeds ONE state input: feeding two, one of them would never advance (its
    buffers are never written), so create_executor refuses it, naming both inputs."""
    a, b = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b"))
    y, z = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("y", "z"))
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"]),
                               helper.make_node("Sub", ["a", "b"], ["z"])], "g", [a, b], [y, z])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    model = gr.load(str(path))
    with pytest.raises(InputError, match="output 'y' feeds two state inputs, 'a' and 'b'"):
        model.create_executor(state={"a": "y", "b": "y"})
    ex = model.create_executor(state={"a": "y", "b": "z"})  # one output each: both advance
    ex.set_state("a", np.ones(4, np.float32))
    ex.execute({})
    np.testing.assert_array_equal(ex.state["a"], np.ones(4, np.float32))
    np.testing.assert_array_equal(ex.state["b"], np.ones(4, np.float32))


def test_state_on_a_backend_without_it_is_refused(pair) -> None:
    pytest.importorskip("openvino")
    model = gr.load(str(pair[2]), backend="openvino")
    with pytest.raises(InputError, match="not built for the 'openvino' backend"):
        model.create_executor(state=causal_lm.STATE)


# ---- double buffering ------------------------------------------------------------------------
def test_execute_takes_and_returns_only_the_non_state_names(pair) -> None:
    ex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    assert ex.input_names == ["input_ids", "position"] and ex.output_names == ["logits"]
    assert ex.state_names == causal_lm.STATE and list(ex.state) == ["past_kv"]
    out = ex.execute(step_feeds(1, 0))
    assert len(out) == 1 and out[0].shape == (1, 1, SIZES.vocab)
    with pytest.raises(InputError, match="past_kv"):
        ex.execute({**step_feeds(1, 1), "past_kv": np.zeros(SIZES.cache_shape, np.float32)})


def test_state_advances_as_plain_ort_and_a_kept_view_is_not_written_by_the_next_run(
        pair, ort_pair) -> None:
    ex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    rng = np.random.default_rng(1)
    cache = rng.standard_normal(SIZES.cache_shape).astype(np.float32)
    ex.set_state("past_kv", cache)
    for t in range(3):
        kept = ex.state["past_kv"]
        before = kept.copy()
        (logits,) = ex.execute(step_feeds(5 + t, 10 + t))
        want_logits, cache = ort_pair[1].run(None, {**step_feeds(5 + t, 10 + t), "past_kv": cache})
        np.testing.assert_array_equal(logits, want_logits)
        np.testing.assert_array_equal(ex.state["past_kv"], cache)  # what the next run reads
        np.testing.assert_array_equal(kept, before)  # the run wrote the other buffer
        assert not np.shares_memory(kept, ex.state["past_kv"])


def test_a_failed_run_leaves_the_state_as_it_was(pair) -> None:
    ex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    ex.execute(step_feeds(3, 0))
    buffer, value = ex.state["past_kv"], ex.state["past_kv"].copy()
    with pytest.raises(GearRuntimeError):  # a token id past the vocabulary: Gather fails in ORT
        ex.execute(step_feeds(SIZES.vocab + 10, 1))
    assert ex.state["past_kv"] is not None and np.shares_memory(ex.state["past_kv"], buffer)
    np.testing.assert_array_equal(ex.state["past_kv"], value)


def test_set_state_and_reset_state(pair) -> None:
    ex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    ones = np.ones(SIZES.cache_shape, np.float32)
    ex.set_state("past_kv", ones)
    np.testing.assert_array_equal(ex.state["past_kv"], ones)
    ex.reset_state()
    assert not ex.state["past_kv"].any()
    with pytest.raises(InputError, match=r"set_state\('past_kv'\).*float32 \[2\]"):
        ex.set_state("past_kv", np.ones(2, np.float32))
    with pytest.raises(InputError, match="no state input"):
        ex.set_state("position", np.ones(1, np.int64))
    with pytest.raises(InputError, match="without state"):
        gr.load(str(pair[2])).create_executor().set_state("past_kv", ones)


def test_state_on_the_null_backend_commits_only_after_a_run(pair) -> None:
    model = gr.load(str(pair[2]), backend="null")
    ex = model.create_executor(state=causal_lm.STATE)
    ex.set_state("past_kv", np.ones(SIZES.cache_shape, np.float32))
    ex.execute(step_feeds(1, 0))
    calls = [c for c, _ in model.backend_model.calls]
    assert calls[-2:] == ["run_gear", "commit_state"]
    assert not ex.state["past_kv"].any()  # the null run wrote zeros into the other buffer


# ---- out= ------------------------------------------------------------------------------------
def test_out_writes_into_the_callers_array_by_address(pair, ort_pair) -> None:
    model = gr.load(str(pair[1]))
    ex = model.create_executor()
    ids = causal_lm.prompt(20, SIZES)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    buf = np.full(SIZES.cache_shape, np.nan, np.float32)
    logits, cache = ex.execute(feeds, pad=True, out={"present_kv": buf})
    assert cache is buf
    want = ort_pair[0].run(None, generate.padded_feeds(ids, 32))
    np.testing.assert_array_equal(logits, want[0])
    np.testing.assert_array_equal(buf, want[1])
    # bound, not copied: the executor's own output buffer for it was never written
    session = ex._session
    own = session._outputs[0][1]
    own.fill(-7)
    ex.execute(feeds, pad=True, out={"present_kv": buf})
    assert (own == -7).all()


@pytest.mark.parametrize(("bad", "match"), [
    (np.zeros((2, 2), np.float32), r"out\['present_kv'\] is float32 \[2, 2\]"),
    (np.zeros(SIZES.cache_shape, np.float64), "float64"),
    (np.zeros(SIZES.cache_shape[::-1], np.float32).T, "C-contiguous"),
    ([0.0], "must be a numpy array"),
])
def test_out_is_checked(pair, bad, match) -> None:
    ex = gr.load(str(pair[1])).create_executor()
    ids = causal_lm.prompt(20, SIZES)
    with pytest.raises(InputError, match=match):
        ex.execute({"input_ids": ids, "attention_mask": np.ones_like(ids)}, pad=True,
                   out={"present_kv": bad})


def test_out_refuses_read_only_unknown_and_state_outputs(pair) -> None:
    ex = gr.load(str(pair[1])).create_executor()
    ids = causal_lm.prompt(20, SIZES)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    frozen = np.zeros(SIZES.cache_shape, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InputError, match="writable"):
        ex.execute(feeds, pad=True, out={"present_kv": frozen})
    with pytest.raises(InputError, match="no output 'kv'"):
        ex.execute(feeds, pad=True, out={"kv": frozen})
    dex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    with pytest.raises(InputError, match="is a state output"):
        dex.execute(step_feeds(1, 0), out={"present_kv": np.zeros(SIZES.cache_shape, np.float32)})


def test_copy_true_outputs_of_a_stateful_executor_survive_the_next_step(pair) -> None:
    """execute(copy=True), the default, returns arrays the caller keeps: the next step of a
    stateful executor writes its own outputs, never the ones handed out before."""
    ex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    ex.set_state("past_kv", np.random.default_rng(2).standard_normal(SIZES.cache_shape)
                 .astype(np.float32))
    (first,) = ex.execute(step_feeds(1, 0))
    kept = first.copy()
    (second,) = ex.execute(step_feeds(2, 1))
    assert not np.array_equal(second, kept)  # the steps differ: an overwrite would show
    np.testing.assert_array_equal(first, kept)
    assert not np.shares_memory(first, second)


# ---- the handoff, shared weights, the tokens ---------------------------------------------------
def test_prefill_hands_its_cache_to_the_decode_state_with_no_copy(pair) -> None:
    gen = generate.Generator(pair[1], pair[2])
    state = gen.dex.state["past_kv"]
    ids = causal_lm.prompt(40, SIZES)
    cache = gen.pex.execute({"input_ids": ids, "attention_mask": np.ones_like(ids)}, pad=True,
                            out={"present_kv": state})[1]
    # ex.state hands out a view of its buffer each time: the same memory, not one object
    assert cache is state and np.shares_memory(gen.dex.state["past_kv"], state) and state.any()


def test_shared_weights_are_held_once(pair) -> None:
    decode = gr.load(str(pair[2]))
    prefill = gr.load(str(pair[1]), share_weights_with=decode)
    weights = causal_lm.make_weights(SIZES)
    big = [w for w in weights.values() if w.nbytes >= 1024]
    # every weight the prefill reads, found in the decode by bytes (its names differ)
    assert prefill.shared_weights == (len(big), sum(w.nbytes for w in big))
    assert decode.shared_weights == (0, 0)
    store = decode.backend_model.weight_store()
    ours = prefill.backend_model.shared_weights.values
    assert all(any(v is s for s in store.by_key.values()) for v in ours.values())
    # neither session prepacks the shared weights: a prepacked copy is private to its
    # session (+517 MiB on a 606 MiB decode), which would undo the sharing
    for model in (decode, prefill):
        options = model.backend_model.session.get_session_options()
        assert options.get_session_config_entry("session.disable_prepacking") == "1"


def test_share_weights_with_is_checked(pair) -> None:
    decode = gr.load(str(pair[2]))
    with pytest.raises(InputError, match="must be a GearModel"):
        gr.load(str(pair[1]), share_weights_with="decode.onnx")
    with pytest.raises(InputError, match=r"one backend that shares them \(onnxruntime, "
                       r"mindspore_lite\); "
                       "this one is on 'null', the other on 'onnxruntime'"):
        gr.load(str(pair[1]), backend="null", share_weights_with=decode)
    null_decode = gr.load(str(pair[2]), backend="null")
    with pytest.raises(InputError, match="this one is on 'null', the other on 'null'"):
        gr.load(str(pair[1]), backend="null", share_weights_with=null_decode)
    decode.close()
    with pytest.raises(ClosedError, match="share_weights_with: that model is closed"):
        gr.load(str(pair[1]), share_weights_with=decode)


def test_executors_made_before_sharing_keep_their_session(pair, ort_pair) -> None:
    """The order the contract shows: the decode's executor first, then the prefill shares
    its weights (the decode's session is rebuilt over them; the executor keeps the old)."""
    decode = gr.load(str(pair[2]))
    dex = decode.create_executor(state=causal_lm.STATE)
    dex.execute(step_feeds(2, 0))
    prefill = gr.load(str(pair[1]), share_weights_with=decode)
    assert prefill.shared_weights[0] > 0
    pex = prefill.create_executor()
    ids = causal_lm.prompt(40, SIZES, seed=3)
    dex.reset_state()
    logits = pex.execute({"input_ids": ids, "attention_mask": np.ones_like(ids)}, pad=True,
                         out={"present_kv": dex.state["past_kv"]})[0]
    tokens = [int(logits.argmax())]
    buf = np.empty((1, 1, SIZES.vocab), np.float32)
    for t in range(5):  # the old executor; out= makes new bindings: of ITS session
        tokens.append(int(dex.execute(step_feeds(tokens[-1], 40 + t), out={"logits": buf})[0]
                          .argmax()))
    assert tokens == generate.reference_tokens(*ort_pair, ids, 64, 6)
    fresh = decode.create_executor(state=causal_lm.STATE)  # on the rebuilt session
    fresh.set_state("past_kv", np.zeros(SIZES.cache_shape, np.float32))
    assert fresh.execute(step_feeds(1, 0))[0].shape == (1, 1, SIZES.vocab)


@pytest.mark.parametrize("length", [5, 32, 50, 128])
def test_greedy_tokens_of_the_pair_equal_plain_ort(pair, ort_pair, length) -> None:
    gen = generate.Generator(pair[1], pair[2])
    ids = causal_lm.prompt(length, SIZES, seed=length)
    gear = generate.covering_gear(length, SIZES.seq_gears)
    want = generate.reference_tokens(*ort_pair, ids, gear, 12)
    assert gen.generate(ids, 12) == want


def test_the_decode_continues_the_prefill(pair, ort_pair) -> None:
    """The example itself is right: prefill(L) then a decode step gives what prefill(L+1)
    gives for that token (to float rounding)."""
    prefill, decode = ort_pair
    ids = causal_lm.prompt(20, SIZES)
    _, cache = prefill.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    step, _ = decode.run(None, {**step_feeds(9, 20), "past_kv": cache})
    longer = np.concatenate([ids, [[9]]], axis=1)
    full, _ = prefill.run(None, {"input_ids": longer, "attention_mask": np.ones_like(longer)})
    np.testing.assert_allclose(step, full, atol=1e-5)


# ---- check-padding for a cache padded to a fixed length ------------------------------------
SAMPLES = [(5, 5), (40, 40), (100, 100)]


def test_check_padding_compares_a_padded_cache_over_its_valid_part(pair) -> None:
    plain = gr.check_padding(str(pair[1]), str(pair[0]), samples=SAMPLES)
    by_name = {o.name: o for o in plain.outputs}
    assert by_name["logits"].safe and not by_name["present_kv"].safe  # pad slots differ
    valid = gr.check_padding(str(pair[1]), str(pair[0]), samples=SAMPLES,
                             valid={"present_kv": 4})
    assert valid.safe and "valid part" in valid.outputs[1].verdict
    ignored = gr.check_padding(str(pair[1]), str(pair[0]), samples=SAMPLES,
                               ignore_outputs=["present_kv"])
    assert ignored.safe and ignored.outputs[1].verdict == "ignored (not compared)"
    # one axis further than the sequence: the pad slots are compared again
    wrong_axis = gr.check_padding(str(pair[1]), str(pair[0]), samples=SAMPLES,
                                  valid={"present_kv": 3})
    assert not wrong_axis.safe


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"valid": {"kv": 4}}, "no output 'kv'"),
    ({"valid": {"present_kv": 6}}, r"valid axis of 'present_kv' is 6; expected an integer in "
                                   r"\[0, 5\]"),
    ({"ignore_outputs": ["kv"]}, "no output 'kv'"),
])
def test_check_padding_valid_and_ignore_are_checked(pair, kwargs, match) -> None:
    with pytest.raises(InputError, match=match):
        gr.check_padding(str(pair[1]), str(pair[0]), samples=SAMPLES, **kwargs)


def test_check_padding_cli_valid_and_ignore_output(pair, capsys) -> None:
    from tests.cli_support import assert_one_line_error, run_cli

    args = ("check-padding", str(pair[1]), str(pair[0]), "--samples", "5,5;40,40",
            "--no-progress")
    assert run_cli(capsys, *args)[0] == 1
    code, out, _ = run_cli(capsys, *args, "--valid", "present_kv:4")
    assert code == 0 and "padding is SAFE" in out
    assert run_cli(capsys, *args, "--ignore-output", "present_kv")[0] == 0
    code, _, err = run_cli(capsys, *args, "--valid", "present_kv")
    assert code != 0
    assert_one_line_error(err, "--valid 'present_kv'", "NAME:AXIS")


def test_every_command_takes_a_static_model(pair, capsys, tmp_path) -> None:
    from tests.cli_support import run_cli

    code, out, _ = run_cli(capsys, "inspect", str(pair[2]))
    assert code == 0 and out.startswith("static model") and "runs as one gear" in out
    code, out, _ = run_cli(capsys, "run", str(pair[2]), "--output-dir", str(tmp_path))
    assert code == 0 and "a static model (its one gear)" in out
    assert np.load(tmp_path / "present_kv.npy").shape == SIZES.cache_shape
    code, out, _ = run_cli(capsys, "bench", str(pair[2]), "--iterations", "2", "--warmup", "1")
    assert code == 0 and "static mode" in out


def test_compile_refuses_a_static_spec(pair, tmp_path) -> None:
    spec = gr.GearSpec.static(["input_ids", "position", "past_kv"],
                              [[1, 1], [1], list(SIZES.cache_shape)])
    with pytest.raises(gr.CompileError, match="static spec has no gears to compile"):
        gr.compile(str(pair[2]), spec, str(tmp_path / "x.gear.onnx"))


def test_a_static_model_is_served(pair) -> None:
    """The static decode served as it is (one request = one step, the cache in and out)."""
    import sys
    from pathlib import Path

    import tritonclient.http as triton

    sys.path.insert(0, str(Path(__file__).parent))
    from serving_support import HOST, live

    from gear_runtime.serving import ServeOptions, build_server

    server = build_server([str(pair[2])], options=ServeOptions(executors=1))
    cache = np.random.default_rng(2).standard_normal(SIZES.cache_shape).astype(np.float32)
    feeds = {**step_feeds(4, 7), "past_kv": cache}
    want = gr.load(str(pair[2])).create_executor().execute(feeds)
    with live(server) as running:
        c = triton.InferenceServerClient(f"{HOST}:{running.port}", network_timeout=60)
        inputs = []
        for name, a in feeds.items():
            t = triton.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
            t.set_data_from_numpy(a, binary_data=True)
            inputs.append(t)
        result = c.infer("decode", inputs)
        np.testing.assert_array_equal(result.as_numpy("logits"), want[0])
        np.testing.assert_array_equal(result.as_numpy("present_kv"), want[1])


def test_out_must_be_a_dict_of_names(pair) -> None:
    ex = gr.load(str(pair[1])).create_executor()
    ids = causal_lm.prompt(20, SIZES)
    with pytest.raises(InputError, match="out must be a dict output name -> numpy array, got "
                                         "list"):
        ex.execute({"input_ids": ids, "attention_mask": np.ones_like(ids)}, pad=True,
                   out=[np.zeros(SIZES.cache_shape, np.float32)])


def test_check_padding_valid_axis_must_be_an_int(pair) -> None:
    with pytest.raises(InputError, match="valid axis of 'present_kv' is True"):
        gr.check_padding(str(pair[1]), str(pair[0]), samples=SAMPLES,
                         valid={"present_kv": True})


@pytest.mark.parametrize("value", ["-1", "fast"])
def test_serve_refuses_a_bad_min_body_rate(pair, capsys, value) -> None:
    from tests.cli_support import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "serve", str(pair[2]), "--min-body-rate", value)
    assert code == 2
    assert_one_line_error(err, "--min-body-rate", repr(value))


def test_the_state_view_is_a_mapping_of_the_state_inputs(pair) -> None:
    ex = gr.load(str(pair[2])).create_executor(state=causal_lm.STATE)
    assert "past_kv" in ex.state and "position" not in ex.state
    assert dict(ex.state).keys() == {"past_kv"}
    with pytest.raises(KeyError, match="'position' is no state input"):
        ex.state["position"]
    assert len(gr.load(str(pair[2])).create_executor().state) == 0
