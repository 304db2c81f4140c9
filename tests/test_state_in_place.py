"""In-place state: ``create_executor(state=..., in_place_state=True)`` keeps ONE buffer per
pair where the graph is built for it (onnxruntime-genai's layout: GroupQueryAttention with a
shared past / present, :mod:`gear_runtime.examples.gqa_lm`), and refuses it where not.

One gear file holds the prompt gears and the static decode step; the executor keeps the
cache from the prefill through every step. Tokens are checked against plain ORT on the
source file with a mask that grows (how onnxruntime-genai runs it), and against
onnxruntime-genai itself where it is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import gear_runtime as gr
from gear_runtime.errors import InputError
from gear_runtime.examples import causal_lm, gqa_lm

SIZES = gqa_lm.SMALL
PAIRS = gqa_lm.state_pairs(SIZES)
KEY0 = "past_key_values.0.key"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    source, gear = gqa_lm.write_model(tmp_path_factory.mktemp("gqa"), SIZES)
    assert gear is not None
    return source, gear


def _generate(ex: Any, prompt: np.ndarray, new: int) -> list[int]:
    """Greedy tokens: the prompt right-padded to its gear, then static decode steps."""
    n = prompt.shape[1]
    (logits,) = ex.execute(gqa_lm.prompt_feeds(prompt, SIZES))
    out = [int(logits[0, n - 1].argmax())]
    for pos in range(n, n + new - 1):
        (logits,) = ex.execute(gqa_lm.step_feeds(out[-1], pos, SIZES))
        out.append(int(logits[0, 0].argmax()))
    return out


def _ort_tokens(source: Path, prompt: np.ndarray, new: int) -> list[int]:
    """Plain ORT on the source graph, unpadded, the mask growing with the sequence."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    cache = {n: np.zeros(SIZES.cache_shape, np.float32) for n in PAIRS}
    ids, out = prompt, []
    for _ in range(new):
        feeds = {"input_ids": ids,
                 "attention_mask": np.ones((1, prompt.shape[1] + len(out)), np.int64)}
        res = sess.run(None, {**feeds, **cache})
        out.append(int(res[0][0, -1].argmax()))
        cache = {n: res[names.index(o)] for n, o in PAIRS.items()}
        ids = np.array([[out[-1]]], np.int64)
    return out


@pytest.mark.parametrize("length", [5, 16, 40])
def test_in_place_tokens_equal_double_buffered_and_plain_ort(files, length: int) -> None:
    source, gear = files
    prompt = gqa_lm.prompt(length, SIZES, seed=length)
    want = _ort_tokens(source, prompt, 8)
    with gr.load(str(gear)) as model:
        assert model.gears[-1] == (1, SIZES.max_seq)  # prompt gears and the decode step
        ip = model.create_executor(state=PAIRS, in_place_state=True)
        db = model.create_executor(state=PAIRS)
        assert set(ip.state_modes.values()) == {"in place"}
        assert set(db.state_modes.values()) == {"double-buffered"}
        assert _generate(ip, prompt, 8) == want
        assert _generate(db, prompt, 8) == want
        ip.reset_state()  # a second generation on the same executor
        assert _generate(ip, prompt, 8) == want


def test_a_prompt_longer_than_every_prompt_gear_is_refused() -> None:
    with pytest.raises(ValueError, match="65 tokens is longer than the largest prompt gear 64"):
        gqa_lm.prompt_feeds(gqa_lm.prompt(65, SIZES), SIZES)


def test_in_place_runs_read_and_write_one_buffer(files) -> None:
    """The pair's one buffer is what the kernel writes: a kept ``state`` view sees a step's
    new key at its position (double-buffered, the kept view is the buffer the step read,
    left as it was)."""
    _, gear = files
    prompt = gqa_lm.prompt(10, SIZES)
    with gr.load(str(gear)) as model:
        for in_place in (True, False):
            ex = model.create_executor(state=PAIRS, in_place_state=in_place)
            _generate(ex, prompt, 1)  # the prefill: slots 0..15 written
            kept = ex.state[KEY0]
            before = kept.copy()
            mask = np.zeros((1, SIZES.max_seq), np.int64)
            mask[:, :11] = 1
            ex.execute({"input_ids": np.array([[3]], np.int64), "attention_mask": mask})
            changed = np.flatnonzero((kept != before).any(axis=(0, 1, 3)))
            if in_place:
                assert ex.state[KEY0] is kept or np.shares_memory(ex.state[KEY0], kept)
                assert changed.tolist() == [10]  # the step's slot, nothing else moved
            else:
                assert changed.size == 0 and not np.shares_memory(ex.state[KEY0], kept)
                assert (ex.state[KEY0][:, :, :10] == before[:, :, :10]).all()


def test_the_graph_must_be_built_for_it(files, tmp_path) -> None:
    """In place is refused, naming the pair and why: a graph whose state is read by plain
    ops (the built-in causal LM), half a GQA node's buffers, a state input another node also
    reads, unknown names, a backend that cannot show its graph."""
    _, gear = files
    decode = causal_lm.write_pair(tmp_path / "pair")[1]
    with gr.load(str(decode)) as model:
        with pytest.raises(InputError, match="'past_kv' <- 'present_kv' cannot run in place: "
                                             "'past_kv' is read by"):
            model.create_executor(state=causal_lm.STATE, in_place_state=True)
        model.create_executor(state=causal_lm.STATE)  # double-buffered: fine
    with gr.load(str(gear)) as model:
        with pytest.raises(InputError, match="shares its buffers all together or none: "
                                             "'past_key_values.0.value'"):
            model.create_executor(state=PAIRS, in_place_state=[KEY0])
        with pytest.raises(InputError, match="'nope' is no state input"):
            model.create_executor(state=PAIRS, in_place_state=["nope"])
        for bad in (KEY0, [[KEY0]], 3):
            with pytest.raises(InputError, match="must be True, False or state input names"):
                model.create_executor(state=PAIRS, in_place_state=bad)
        with pytest.raises(InputError, match="give state= too"):
            model.create_executor(in_place_state=True)
        ex = model.create_executor(state=PAIRS, in_place_state=[])  # none asked: all doubled
        assert set(ex.state_modes.values()) == {"double-buffered"}
        keys = {k: v for k, v in PAIRS.items() if ".0." in k}  # layer 0 alone in place is fine
        ex = model.create_executor(state=PAIRS, in_place_state=list(keys))
        assert [m for k, m in ex.state_modes.items() if k in keys] == ["in place"] * 2
        assert {m for k, m in ex.state_modes.items() if k not in keys} == {"double-buffered"}
    with gr.load(str(gear), backend="null") as model, \
            pytest.raises(InputError, match="needs a backend whose graph can be checked"):
        model.create_executor(state=PAIRS, in_place_state=True)


def test_a_state_another_node_also_reads_is_refused(tmp_path) -> None:
    """Layer 0's past key also summed into an extra output: that reader could run after the
    kernel wrote the buffer, so the pair is refused (its double-buffered run is fine)."""
    from onnx import TensorProto, helper

    model = gqa_lm.build(SIZES)
    model.graph.node.append(helper.make_node("ReduceSum", [KEY0], ["peek"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("peek", TensorProto.FLOAT, []))
    _refused_in_place_only(model, tmp_path / "peek", f"'{KEY0}' is read by 2 nodes")


def _refused_in_place_only(model, stem, message: str) -> None:
    """``model`` compiled at gqa_lm's gears: its state is refused in place with ``message``
    and taken double-buffered."""
    onnx.save(model, f"{stem}.onnx")
    shape, dims = gqa_lm.gear_text(SIZES)
    out = gr.compile(f"{stem}.onnx", gr.GearSpec.from_atc(input_shape=shape, dynamic_dims=dims),
                     f"{stem}.gear.onnx", progress=False)
    with gr.load(str(out)) as m:
        with pytest.raises(InputError, match=message):
            m.create_executor(state=PAIRS, in_place_state=True)
        m.create_executor(state=PAIRS)


def test_in_place_through_the_wrong_output_is_refused_naming_it(files) -> None:
    """A pair whose output is not the one its kernel writes at the past slot's present slot
    (the key fed from the value's present: same shape, so double buffering takes it) is
    refused in place, naming the pair and the output the kernel does write."""
    _, gear = files
    value0 = KEY0.replace(".key", ".value")
    swapped = {**PAIRS, KEY0: PAIRS[value0], value0: PAIRS[KEY0]}
    with gr.load(str(gear)) as model:
        with pytest.raises(InputError, match=f"'{KEY0}' <- '{PAIRS[value0]}' cannot run in "
                                             f"place: .* does not write '{KEY0}'\\'s slot to "
                                             f"'{PAIRS[value0]}'"):
            model.create_executor(state=swapped, in_place_state=True)
        model.create_executor(state=swapped)  # double-buffered: the user's pairing, taken


def test_a_state_that_is_also_a_graph_output_is_not_run_in_place(tmp_path) -> None:
    """Layer 0's past key also returned as a graph output: in place, that output would be
    the buffer the kernel writes, so the pair is refused (double-buffered is fine)."""
    from onnx import helper

    model = gqa_lm.build(SIZES)
    (past,) = [i for i in model.graph.input if i.name == KEY0]
    model.graph.output.append(helper.make_tensor_value_info(
        KEY0, past.type.tensor_type.elem_type,
        [d.dim_value or d.dim_param for d in past.type.tensor_type.shape.dim]))
    _refused_in_place_only(model, tmp_path / "echo", f"'{KEY0}' is also a graph output")


def test_onnxruntime_genai_on_the_same_file_gives_the_same_tokens(files, tmp_path) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    source, gear = files
    folder = gqa_lm.write_genai_folder(tmp_path / "genai", SIZES)
    model = og.Model(str(folder))
    prompt = gqa_lm.prompt(12, SIZES, seed=3)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=20, min_length=20, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    got = []
    while not gen.is_done():
        gen.generate_next_token()
        got.append(int(gen.get_next_tokens()[0]))
    with gr.load(str(gear)) as m:
        ex = m.create_executor(state=PAIRS, in_place_state=True)
        assert _generate(ex, prompt, 8) == got
