"""Padding never silently corrupts a state (issue 53): check-padding records its verdict in
the gear file, and a model recorded (or declared) UNSAFE is never padded -- a request that
needs padding is refused naming why, a request of a gear's exact shape still runs.

The unsafe model is a stateful prefill like a linear-attention layer's: its state output is
a decayed sum over ALL positions, ``state = sum_t a^(S-1-t) x_t``, so a pad position still
decays the state (Qwen3.5's gated delta net). The safe one decays over the attention mask's
length only and masks the pads out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import gear_runtime as gr
from gear_runtime.cli import main
from gear_runtime.gearfile.padding import META_PADDING, recorded_verdict

sys.path.insert(0, str(Path(__file__).parent))


def decay_prefill(masked: bool) -> onnx.ModelProto:
    """x [1, S, 4], attention_mask [1, S] -> y = 2x [1, S, 4] (safe) and the recurrent
    state [1, 4] = sum_t a^(L-1-t) m_t x_t: L = S and m = 1 unless ``masked`` (then L the
    mask's sum, the pads masked out: padding-safe)."""
    n = h.make_node
    nodes = [n("Mul", ["x", "two"], ["y"]), n("Cast", ["attention_mask"], ["m"], to=T.FLOAT),
             n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "i1"], ["s_i"], axis=0),
             n("Cast", ["s_i"], ["S"], to=T.FLOAT), n("Range", ["zero", "S", "one"], ["t"]),
             n("ReduceSum", ["m"], ["mask_len"], keepdims=0),
             n("Identity", ["mask_len" if masked else "S"], ["L"]),
             n("Sub", ["L", "one"], ["last"]), n("Sub", ["last", "t"], ["e"]),
             n("Pow", ["a", "e"], ["w0"]),
             n("Mul", ["w0", "m"], ["w1"]) if masked else n("Unsqueeze", ["w0", "ax0"], ["w1"]),
             n("Unsqueeze", ["w1", "ax2"], ["w"]), n("Mul", ["x", "w"], ["xw"]),
             n("ReduceSum", ["xw", "ax1"], ["state"], keepdims=0)]
    inits = [h.make_tensor("two", T.FLOAT, [], [2.0]), h.make_tensor("one", T.FLOAT, [], [1.0]),
             h.make_tensor("zero", T.FLOAT, [], [0.0]), h.make_tensor("a", T.FLOAT, [], [0.5]),
             h.make_tensor("i1", T.INT64, [], [1]), h.make_tensor("ax0", T.INT64, [1], [0]),
             h.make_tensor("ax1", T.INT64, [1], [1]), h.make_tensor("ax2", T.INT64, [1], [2])]
    graph = h.make_graph(nodes, "decay", [
        h.make_tensor_value_info("x", T.FLOAT, [1, "S", 4]),
        h.make_tensor_value_info("attention_mask", T.INT64, [1, "S"])], [
        h.make_tensor_value_info("y", T.FLOAT, [1, "S", 4]),
        h.make_tensor_value_info("state", T.FLOAT, [1, 4])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


SPEC = dict(input_shape="x:1,-1,4;attention_mask:1,-1", dynamic_dims="4,4;8,8")


def compiled(tmp_path: Path, masked: bool, **kw) -> tuple[str, str]:
    source, gear = str(tmp_path / f"d{int(masked)}.onnx"), str(tmp_path / f"d{int(masked)}.gear")
    onnx.save(decay_prefill(masked), source)
    gr.compile(source, gr.GearSpec.from_atc(**SPEC), gear, progress=False, **kw)
    return source, gear


def feeds(length: int) -> dict[str, np.ndarray]:
    x = np.arange(length * 4, dtype=np.float32).reshape(1, length, 4) / 7
    return {"x": x, "attention_mask": np.ones((1, length), np.int64)}


def exact_state(length: int) -> np.ndarray:
    x = feeds(length)["x"][0]
    return (x * 0.5 ** np.arange(length - 1, -1, -1, dtype=np.float32)[:, None]).sum(0)


def test_check_padding_records_unsafe_and_the_model_is_never_padded(tmp_path) -> None:
    source, gear = compiled(tmp_path, masked=False)
    assert recorded_verdict(gear) is None and gr.load(gear).pad_safe is None
    report = gr.check_padding(gear, source, record=True)
    assert not report.safe
    verdict = recorded_verdict(gear)
    assert verdict is not None and not verdict.safe and verdict.unsafe_outputs == ("state",)
    model = gr.load(gear)  # the resealed file loads: its digest holds
    assert model.pad_safe is False and model.padding_verdict == verdict
    ex = model.create_executor()
    with pytest.raises(gr.PaddingUnsafeError, match=r"padding verdict UNSAFE .*output\(s\) "
                       r"state change with padding.*matches no gear exactly") as info:
        ex.execute(feeds(3), pad=True)
    assert gear in info.value.message and "pad_safe=True" in info.value.message
    assert info.value.code == "145013" and isinstance(info.value, gr.GearMismatchError)
    y, state = ex.execute(feeds(8), pad=True)  # a gear's exact shape: runs, unpadded
    np.testing.assert_allclose(state[0], exact_state(8), rtol=1e-5)
    # the declaration overrides the record: padded again (and wrong, as check-padding said)
    padded = gr.load(gear, pad_safe=True).create_executor().execute(feeds(3), pad=True)[1]
    assert not np.allclose(padded[0], exact_state(3))
    assert model.create_executor(pad_safe=True).execute(feeds(3), pad=True)[1].shape == (1, 4)
    # re-checking pads whatever the record says, and replaces the record
    assert not gr.check_padding(gear, source, record=True).safe
    assert [p.key for p in onnx.load(gear).metadata_props].count(META_PADDING) == 1


def test_a_safe_prefill_records_safe_and_pads_as_before(tmp_path) -> None:
    source, gear = compiled(tmp_path, masked=True, check_padding=True)  # checked at compile
    verdict = recorded_verdict(gear)
    assert verdict is not None and verdict.safe
    model = gr.load(gear)
    assert model.pad_safe is True
    (y, state) = model.create_executor().execute(feeds(3), pad=True)
    np.testing.assert_allclose(state[0], exact_state(3), rtol=1e-5)
    assert y.shape == (1, 3, 4)
    # declared unsafe: not padded, whatever the record
    for ex in (gr.load(gear, pad_safe=False).create_executor(),
               model.create_executor(pad_safe=False)):
        with pytest.raises(gr.PaddingUnsafeError, match="declared pad_safe=False"):
            ex.execute(feeds(3), pad=True)
        assert ex.execute(feeds(4), pad=True)[1].shape == (1, 4)


def test_compile_check_padding_records_unsafe(tmp_path) -> None:
    _, gear = compiled(tmp_path, masked=False, check_padding=True)
    with pytest.raises(gr.PaddingUnsafeError):
        gr.load(gear).create_executor().execute(feeds(5), pad=True)


def test_cli_record(tmp_path, capsys) -> None:
    source, gear = compiled(tmp_path, masked=False)
    assert main(["check-padding", gear, source, "--no-progress"]) == 1
    assert recorded_verdict(gear) is None  # without --record nothing is written
    assert main(["check-padding", gear, source, "--no-progress", "--record"]) == 1
    assert "recorded in" in capsys.readouterr().out
    verdict = recorded_verdict(gear)
    assert verdict is not None and not verdict.safe


def test_serve_warns_of_unchecked_padding_and_notes_unsafe(tmp_path, capsys) -> None:
    from gear_runtime.cli.serve import _warn_padding

    source, gear = compiled(tmp_path, masked=False)
    args = argparse.Namespace(files=[], pad=False, padding_checked=False, sequence_start=gear)
    _warn_padding(args)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and f"--sequence-start pads requests of {gear}" in err
    gr.check_padding(gear, source, record=True)
    _warn_padding(argparse.Namespace(files=[gear], pad=True, padding_checked=False,
                                     sequence_start=None))
    err = capsys.readouterr().err
    assert "warning" not in err and "UNSAFE" in err and "never pads it" in err


def test_serve_sequence_start_refuses_a_prompt_that_needs_padding(tmp_path) -> None:
    """A prefill recorded UNSAFE behind serve --sequence-start: a prompt that needs padding
    is answered 400 naming the verdict, a prompt of a gear's exact length starts the
    sequence (the example prefill is in fact safe: the verdict is recorded by hand here)."""
    triton = pytest.importorskip("tritonclient.http")
    from serving_support import HOST, live

    from gear_runtime.examples import causal_lm
    from gear_runtime.gearfile.padding import PaddingVerdict, record_verdict
    from gear_runtime.serving import ServeOptions, build_server
    from gear_runtime.tools import generate

    sizes = causal_lm.SMALL
    _, prefill_gear, decode = generate.build_pair(tmp_path, sizes)
    record_verdict(prefill_gear, PaddingVerdict(safe=False, unsafe_outputs=("present_kv",)))
    server = build_server([str(decode)], options=ServeOptions(
        state=tuple(causal_lm.STATE.items()), max_sequences=2,
        sequence_start=str(prefill_gear)))
    exact = gr.load(str(prefill_gear)).gears[0][0]
    with live(server) as running:
        client = triton.InferenceServerClient(f"{HOST}:{running.port}")

        def start(length: int, seq: int):
            prompt = causal_lm.prompt(length, sizes, seed=3)
            first = [triton.InferInput("input_ids", list(prompt.shape), "INT64"),
                     triton.InferInput("attention_mask", list(prompt.shape), "INT64")]
            first[0].set_data_from_numpy(prompt)
            first[1].set_data_from_numpy(np.ones_like(prompt))
            return client.infer("decode", first, sequence_id=seq, sequence_start=True,
                                sequence_end=True)

        with pytest.raises(Exception, match=r"(?s)400.*padding verdict UNSAFE|padding "
                                            r"verdict UNSAFE.*") as info:
            start(exact - 1, 31)
        assert "never padded" in str(info.value)
        assert start(exact, 32).as_numpy("logits").shape[-1] == sizes.vocab
