"""An attention mask can never make GroupQueryAttention read or write outside its KV cache.

ONNX Runtime's GQA turns ``sum(attention_mask) - 1`` into the row's write offset in unsigned
arithmetic and, before 1.25, never bounded it: an all-zero mask wrote outside the cache
(random logits on 1.21, NaN on 1.24, a crash in some runs).
:mod:`gear_runtime.gearfile.kernel_guards` checks the lengths the kernel will see on every
path (plain, padded, resident state in place and double-buffered, ``out=``, the server)
before the run, on every ORT version (CI runs this file on the floor release too);
compile's probe feeds valid masks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.errors import InputError
from gear_runtime.examples import gqa_lm

SIZES = gqa_lm.SMALL
PAIRS = gqa_lm.state_pairs(SIZES)
MAX = SIZES.max_seq


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The GQA LM with the prompt gears, a 4-token chunk gear (4, MAX) and the decode step."""
    folder = tmp_path_factory.mktemp("gqa_guard")
    source, _ = gqa_lm.write_model(folder, SIZES, compile_gears=False)
    shape, dims = gqa_lm.gear_text(SIZES)
    gear = gr.compile(str(source), gr.GearSpec.from_atc(
        input_shape=shape, dynamic_dims=f"{dims};4,{MAX}"), str(folder / "g.gear.onnx"),
        progress=False)
    return source, Path(gear)


def _mask(ones: int, length: int = MAX, value: int = 1) -> np.ndarray:
    mask = np.zeros((1, length), np.int64)
    mask[:, :ones] = value
    return mask


def _step(mask: np.ndarray, tokens: int = 1) -> dict[str, np.ndarray]:
    return {"input_ids": np.full((1, tokens), 7, np.int64), "attention_mask": mask}


def test_the_guard_finds_the_mask_the_cache_and_the_step(files) -> None:
    model = gr.load(str(files[1]))
    guard = model.guard
    assert guard is not None and guard.inputs == ("attention_mask",)
    assert len(guard.attentions) == SIZES.layers
    att = guard.attentions[0]
    assert att.rows == ("past_key_values.0.key", 2) and att.tokens == ("input_ids", 1)
    assert att.rotary_rows == MAX


@pytest.mark.parametrize("state", ["none", "double-buffered", "in place"])
@pytest.mark.parametrize("bad", ["all zeros", "over long", "shorter than the step"])
def test_a_mask_outside_the_cache_is_refused_before_the_run(files, state, bad) -> None:
    """Refused with InputError naming the mask and the bounds, on every executor kind; the
    state is left as it was (the run never happened); the next right step runs."""
    model = gr.load(str(files[1]))
    kwargs = {} if state == "none" else {"state": PAIRS,
                                          "in_place_state": state == "in place"}
    ex = model.create_executor(**kwargs)
    extra = {} if state != "none" else {
        n: np.zeros(SIZES.cache_shape, np.float32) for n in PAIRS}
    if state != "none":
        ex.execute(gqa_lm.prompt_feeds(gqa_lm.prompt(9, SIZES), SIZES))
        before = {n: np.array(ex.state[n]) for n in PAIRS}
    feeds = {"all zeros": _step(_mask(0)),
             "over long": _step(_mask(MAX, value=2)),
             "shorter than the step": _step(_mask(3), tokens=4)}[bad]
    with pytest.raises(InputError, match=r"attention_mask: row 0 .* length of \d+ .* must "
                                         r"be \d+\.\.128") as caught:
        ex.execute({**feeds, **extra})
    assert caught.value.code == "145000"
    if state != "none":
        for n in PAIRS:
            np.testing.assert_array_equal(np.asarray(ex.state[n]), before[n])
    logits = ex.execute({**gqa_lm.step_feeds(5, 9, SIZES), **extra})[0]
    assert np.isfinite(logits).all()


def test_padding_is_checked_as_the_kernel_sees_it(files) -> None:
    """pad=True: the mask is padded with its pad value before the check, so a request
    whose mask is all zeros is refused on the gear it was padded to; a real prompt runs."""
    ex = gr.load(str(files[1])).create_executor(state=PAIRS, in_place_state=True)
    with pytest.raises(InputError, match="attention_mask: row 0"):
        ex.execute({"input_ids": np.ones((1, 10), np.int64),
                    "attention_mask": np.zeros((1, 10), np.int64)}, pad=True)
    prompt = gqa_lm.prompt(10, SIZES)
    (logits,) = ex.execute({"input_ids": prompt, "attention_mask": np.ones_like(prompt)},
                           pad=True)
    assert logits.shape == (1, 10, SIZES.vocab) and np.isfinite(logits).all()


def test_out_path_is_guarded(files) -> None:
    """execute(out=...) checks too (it stages and runs through its own path)."""
    model = gr.load(str(files[1]))
    ex = model.create_executor()
    cache = {n: np.zeros(SIZES.cache_shape, np.float32) for n in PAIRS}
    out = {"logits": np.empty((1, 1, SIZES.vocab), np.float32)}
    with pytest.raises(InputError, match="attention_mask"):
        ex.execute({**_step(_mask(0)), **cache}, out=out)
    ex.execute({**_step(_mask(1)), **cache}, out=out)
    assert np.isfinite(out["logits"]).all()


def test_right_requests_give_the_unguarded_results(files) -> None:
    """The guard changes no result: greedy tokens equal plain ORT's on the source graph."""
    import onnxruntime as ort

    source, gear = files
    ex = gr.load(str(gear)).create_executor(state=PAIRS, in_place_state=True)
    prompt = gqa_lm.prompt(12, SIZES, seed=3)
    n = prompt.shape[1]
    (logits,) = ex.execute(gqa_lm.prompt_feeds(prompt, SIZES))
    got = [int(logits[0, n - 1].argmax())]
    for pos in range(n, n + 4):
        (logits,) = ex.execute(gqa_lm.step_feeds(got[-1], pos, SIZES))
        got.append(int(logits[0, 0].argmax()))
    sess = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    cache = {k: np.zeros(SIZES.cache_shape, np.float32) for k in PAIRS}
    ids, want = prompt, []
    for _ in range(5):
        res = sess.run(None, {"input_ids": ids, **cache,
                              "attention_mask": np.ones((1, n + len(want)), np.int64)})
        want.append(int(res[0][0, -1].argmax()))
        cache = {k: res[names.index(o)] for k, o in PAIRS.items()}
        ids = np.array([[want[-1]]], np.int64)
    assert got == want


def test_compiles_probe_feeds_a_valid_mask(files) -> None:
    """compile runs the source to find output shapes: the mask it feeds is ones, never the
    zeros that write outside the cache on the floor release."""
    import onnx

    from gear_runtime.compiler.check import Source
    from gear_runtime.compiler.outputs import ShapeRunner

    source = files[0]
    runner = ShapeRunner(Source(onnx.load(str(source), load_external_data=False),
                                str(source.parent)), info=None)  # type: ignore[arg-type]
    feeds = runner._valid({"input_ids": np.zeros((1, 4), np.int64),
                           "attention_mask": np.zeros((1, 4), np.int64)})
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1]]
    assert feeds["input_ids"].tolist() == [[0, 0, 0, 0]]


def test_a_served_request_with_a_bad_mask_is_a_400_and_fails_alone(files) -> None:
    """Over Triton's sequence protocol: the bad step is a 400 naming the mask; the
    sequence goes on with its next right step."""
    import tritonclient.http as triton
    from serving_support import HOST, live

    from gear_runtime.serving import ServeOptions, build_server

    server = build_server([str(files[1])], options=ServeOptions(
        state=tuple(PAIRS.items()), in_place_state=True, max_sequences=1))
    name = next(iter(server.models))

    def infer(client, feeds, **kw):
        inputs = []
        for key, value in feeds.items():
            inputs.append(triton.InferInput(key, list(value.shape), "INT64"))
            inputs[-1].set_data_from_numpy(value)
        return client.infer(name, inputs, sequence_id=3, **kw)

    with live(server) as running:
        client = triton.InferenceServerClient(f"{HOST}:{running.port}")
        infer(client, gqa_lm.prompt_feeds(gqa_lm.prompt(6, SIZES), SIZES),
              sequence_start=True)
        with pytest.raises(triton.InferenceServerException, match="attention_mask") as bad:
            infer(client, _step(_mask(0)))
        assert bad.value.status() == "400"
        result = infer(client, gqa_lm.step_feeds(4, 6, SIZES), sequence_end=True)
        assert np.isfinite(result.as_numpy("logits")).all()
