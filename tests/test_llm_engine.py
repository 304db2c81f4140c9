"""The LLM engine: every live sequence's decode step in one run of the covering batch gear.

The model is onnxruntime-genai's layout (GroupQueryAttention, the cache in place, a dynamic
batch: :func:`gear_runtime.examples.gqa_lm.write_genai_folder`); every sequence's greedy
tokens are checked against plain ONNX Runtime on the source graph, one sequence alone,
unpadded, the mask growing (what onnxruntime-genai does).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gear_runtime.errors import ClosedError, InputError
from gear_runtime.examples import gqa_lm
from gear_runtime.llm import Engine, EngineFullError

SIZES = gqa_lm.SMALL  # max_seq 128, vocab 512
PAIRS = gqa_lm.state_pairs(SIZES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gqa_lm.write_genai_folder(tmp_path_factory.mktemp("llm") / "model", SIZES,
                                     batch=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def engine(folder, cache):
    with Engine.from_folder(folder, max_sequences=4, prompt_gears=[16, 32, 64],
                            cache_dir=cache) as eng:
        yield eng


def _prompt(n: int, seed: int | None = None) -> list[int]:
    return gqa_lm.prompt(n, SIZES, seed=n if seed is None else seed)[0].tolist()


_REFERENCE: dict[tuple[int, ...], list[int]] = {}


def _solo(folder: Path, prompt: list[int], new: int, seed: int | None = None) -> list[int]:
    """Tokens of plain ORT on the source graph, one sequence alone, unpadded, the mask
    growing: greedy, or with ``seed`` sampled at temperature 1 (a row whose cache is wrong
    shows there even where its argmax would not: the small model's greedy tokens hardly
    depend on the cache)."""
    import onnxruntime as ort

    from gear_runtime.llm import SamplingParams, SequenceSampler, sample

    key = (*prompt, -1, new, -1 if seed is None else seed)
    if key in _REFERENCE:
        return _REFERENCE[key]
    sampler = None if seed is None else SequenceSampler(
        SamplingParams(new, temperature=1.0, seed=seed))
    sess = ort.InferenceSession(str(folder / "gqa_lm.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    cache = {n: np.zeros(SIZES.cache_shape, np.float32) for n in PAIRS}
    ids, out = np.array([prompt], np.int64), []
    for _ in range(new):
        res = sess.run(None, {"input_ids": ids, **cache,
                              "attention_mask": np.ones((1, len(prompt) + len(out)), np.int64)})
        row = res[0][:, -1]
        out.append(int(row[0].argmax()) if sampler is None else int(sample(row, [sampler])[0]))
        cache = {n: res[names.index(o)] for n, o in PAIRS.items()}
        ids = np.array([[out[-1]]], np.int64)
    _REFERENCE[key] = out
    return out


def test_every_sequence_of_a_batch_gets_its_solo_tokens(engine, folder) -> None:
    """Six prompts of 5-90 tokens (two longer than the largest prompt gear 64: chunked),
    four rows: all at once, each its solo greedy tokens; steps ran on batch gears."""
    prompts = [_prompt(n) for n in (5, 12, 90, 40, 70, 9)]
    with engine._cond:  # the engine waits on this lock: all six arrive in one turn
        streams = [engine.submit(p, 8, stop_token_ids=[]) for p in prompts]
    outs = [s.result() for s in streams]
    assert outs == [_solo(folder, p, 8) for p in prompts]
    stats = engine.stats
    assert stats.prompt_runs == 8  # 90 = 64 + 26 (gear 32), 70 = 64 + 6 (gear 16)
    assert set(stats.batch_gears) <= {1, 2, 4} and stats.batch_gears[4] > 0
    assert stats.generated_tokens == 48


def test_joins_and_leaves_mid_run_keep_every_sequences_tokens(engine, folder) -> None:
    """Sequences of different lengths finish at different steps (the last live row moves
    into each hole: counted), new ones join while others decode; each gets its solo
    tokens; a step's batch gear follows the live count."""
    first = [(_prompt(n), k) for n, k in ((7, 3), (20, 12), (33, 6), (11, 14))]
    with engine._cond:  # all four arrive in one turn: they decode together from the start
        streams = [engine.submit(p, k, stop_token_ids=[]) for p, k in first]
    streams[0].result()
    late = [(_prompt(n, seed=100 + n), k) for n, k in ((15, 5), (3, 9))]
    streams += [engine.submit(p, k, stop_token_ids=[]) for p, k in late]
    for s, (p, k) in zip(streams, first + late, strict=True):
        assert s.result() == _solo(folder, p, k)
        assert s.finish_reason == "length"
    assert engine.stats.row_copies >= 1
    assert engine.live == 0
    assert sum(engine.stats.batch_gears.values()) == engine.stats.steps


def test_a_cancelled_sequence_frees_its_row_and_leaves_the_others_unchanged(
        engine, folder) -> None:
    prompts = [_prompt(n) for n in (6, 17, 25)]
    news = (30, 100, 30)  # the cancelled one could not finish before its cancel lands
    streams = [engine.submit(p, k, stop_token_ids=[]) for p, k in zip(prompts, news,
                                                                      strict=True)]
    it = iter(streams[1])
    next(it), next(it)
    streams[1].cancel()
    rest = list(it)
    assert streams[1].finish_reason == "cancelled" and len(rest) < 98
    for k in (0, 2):
        assert streams[k].result() == _solo(folder, prompts[k], 30)
    deadline = time.monotonic() + 30
    while engine.live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.live == 0


def test_a_stop_token_ends_the_sequence(engine, folder) -> None:
    prompt = _prompt(12)
    want = _solo(folder, prompt, 8)
    stop = want[3]
    got = engine.submit(prompt, 8, stop_token_ids=[stop]).result()
    assert got == want[:want.index(stop) + 1]


def test_the_state_runs_in_place_and_no_row_moves_at_steady_state(engine) -> None:
    """Four sequences decoding together: the cache is updated in place (one buffer per
    pair, the same address every step) and no row is copied until one finishes."""
    ex = engine._ex
    assert set(ex.state_modes.values()) == {"in place"}
    before = {n: ex.state[n].__array_interface__["data"][0] for n in PAIRS}
    with engine._cond:  # the engine waits on this lock: all four arrive in one turn
        streams = [engine.submit(_prompt(n), 10, stop_token_ids=[]) for n in (4, 8, 16, 30)]
    for s in streams:
        s.result()
    assert engine.stats.row_copies == 0  # all four ended at the same step
    assert {n: ex.state[n].__array_interface__["data"][0] for n in PAIRS} == before


def test_sampling_with_a_seed_repeats_whatever_runs_beside_it(engine) -> None:
    prompt = _prompt(9)
    kw = {"temperature": 0.8, "top_p": 0.9, "seed": 11, "stop_token_ids": []}
    alone = engine.submit(prompt, 12, **kw).result()
    crowd = [engine.submit(_prompt(n), 12, temperature=1.2, seed=n, stop_token_ids=[])
             for n in (5, 30)]
    again = engine.submit(prompt, 12, **kw).result()
    for s in crowd:
        s.result()
    assert again == alone
    assert engine.submit(prompt, 12, **{**kw, "seed": 12}).result() != alone


@pytest.mark.parametrize(("prompt", "kwargs", "message"), [
    ([], {}, "the prompt is empty"),
    ([1] * 120, {"max_new_tokens": 16}, r"a prompt of 120 tokens with max_new_tokens 16 does "
                                        r"not fit max_length 128: at most 112"),
    ([3, 512], {}, r"token id 512, outside the vocabulary \(0..511\)"),
    ([3], {"temperature": -1.0}, "temperature is -1.0"),
    ([3], {"stop_token_ids": [600]}, "stop_token_ids holds 600"),
    ("abc", {}, "a prompt is a list of token ids"),
])
def test_a_bad_request_is_refused_alone(engine, folder, prompt, kwargs, message) -> None:
    running = engine.submit(_prompt(10), 6, stop_token_ids=[])
    with pytest.raises(InputError, match=message):
        engine.submit(prompt, **kwargs)
    assert running.result() == _solo(folder, _prompt(10), 6)


def test_engine_options_are_checked(folder, cache) -> None:
    with pytest.raises(InputError, match="max_sequences 9 is above the largest batch gear 8"):
        Engine.from_folder(folder, max_sequences=9, batch_gears=[1, 2, 8], cache_dir=cache)
    with pytest.raises(InputError, match="prompt_gears .* must be below max_length 128"):
        Engine.from_folder(folder, prompt_gears=[16, 128], cache_dir=cache)
    with pytest.raises(InputError, match="max_length 200 is over the model's context_length"):
        Engine.from_folder(folder, max_length=200, cache_dir=cache)
    with pytest.raises(InputError, match="no genai_config.json"):
        Engine.from_folder(folder / "nowhere", cache_dir=cache)


def test_a_full_queue_refuses_and_close_ends_every_stream(folder, cache) -> None:
    eng = Engine.from_folder(folder, max_sequences=1, batch_gears=[1], cache_dir=cache,
                             max_waiting=2)
    streams = [eng.submit(_prompt(5), 100, stop_token_ids=[])]
    deadline = time.monotonic() + 30
    while eng.waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    with eng._cond:  # the engine takes no waiting request meanwhile: the queue is full
        streams += [eng.submit(_prompt(6), 5), eng.submit(_prompt(7), 5)]
        with pytest.raises(EngineFullError, match="max_waiting 2"):
            eng.submit(_prompt(8), 5)
    eng.close()  # every stream ends: cut off ("cancelled") unless it had finished
    assert all(s.finish_reason in ("cancelled", "length") for s in streams)
    assert all(s.finish_reason == "length" or len(s.tokens) < s.params.max_new_tokens
               for s in streams)
    with pytest.raises(ClosedError):
        eng.submit(_prompt(5), 5)


def test_the_compiled_gears_are_cached_and_the_users_folder_untouched(folder,
                                                                      tmp_path) -> None:
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())
    first = Engine.from_folder(folder, max_sequences=2, cache_dir=tmp_path)
    first.close()
    files = list(tmp_path.rglob("engine.gear.onnx"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    second = Engine.from_folder(folder, max_sequences=2, cache_dir=tmp_path)
    second.close()
    assert files[0].stat().st_mtime_ns == stamp
    assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir()) == listing
    assert second.gears.batch == (1, 2) and second.gears.prompt == (16, 32, 48, 64, 96)


def test_submit_from_many_threads(engine, folder) -> None:
    """Streams submitted from eight threads at once: each its solo tokens."""
    prompts = [_prompt(n, seed=200 + n) for n in range(3, 11)]
    results: dict[int, list[int]] = {}

    def run(k: int) -> None:
        results[k] = engine.submit(prompts[k], 5, stop_token_ids=[]).result()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[k] for k in range(8)] == [_solo(folder, p, 5) for p in prompts]


def test_a_prompt_fills_its_row_a_chunk_between_steps(folder, cache) -> None:
    """While sequences decode, a long prompt fills the next free row 16 tokens at a time
    between steps (its row a padding row of the steps on gear 4); another sequence leaves
    meanwhile, so the filled row moves down once whole. Every sequence gets its solo
    sampled tokens (sampling shows a wrong cache where the argmax would not)."""
    with Engine.from_folder(folder, max_sequences=4, prompt_gears=[16, 32, 64],
                            cache_dir=cache, prefill_chunk=16) as eng:
        kw = {"temperature": 1.0, "stop_token_ids": []}
        later: list = []

        def join_now() -> None:  # on the engine's thread, at the first token: rows 0, 1
            if first[0].tokens and not later:  # decode when b and c are taken, however
                later.append(eng.submit(_prompt(9), 5, seed=2, **kw))  # slow this thread
                later.append(eng.submit(_prompt(100), 20, seed=3, **kw))

        with eng._cond:
            first = [eng.submit(_prompt(n), 40, seed=n, **kw) for n in (6, 7)]
            first[0].on_update(join_now)
        first[0].result()
        b, c = later  # b fills row 2 at once, leaves soon; c's row 3 pads the gear-4 steps
        for stream, n in zip(first, (6, 7), strict=True):
            assert stream.result() == _solo(folder, _prompt(n), 40, seed=n)
        assert b.result() == _solo(folder, _prompt(9), 5, seed=2)
        assert c.result() == _solo(folder, _prompt(100), 20, seed=3)
        stats = eng.stats
        assert stats.prompt_runs >= 2 + 1 + 7  # c: 100 tokens in chunks of 16
        assert stats.batch_gears[4] > 0
        assert stats.row_copies >= 1


def test_prefill_chunk_is_checked(folder, cache) -> None:
    with pytest.raises(InputError, match="prefill_chunk must be a positive integer, got 0"):
        Engine.from_folder(folder, cache_dir=cache, prefill_chunk=0)


def test_generate_returns_every_prompts_tokens_in_order(engine, folder) -> None:
    prompts = [_prompt(n, seed=300 + n) for n in (14, 3, 27)]
    assert engine.generate(prompts, max_new_tokens=5, stop_token_ids=[]) == \
        [_solo(folder, p, 5) for p in prompts]
    steps = engine.stats.steps
    with pytest.raises(InputError, match="the prompt is empty"):
        engine.generate([prompts[0], []], max_new_tokens=5)
    assert engine.stats.steps == steps  # a batch holding a bad prompt runs nothing


def test_prompts_arriving_together_take_their_first_tokens_together(engine) -> None:
    """No sequence waits between its first and second token for the prompts that came
    with it: when the first stream has its first token, every prompt has run."""
    runs_at_first_token: list[int] = []
    prompts = [_prompt(n) for n in (30, 50, 20)]

    def first_token() -> None:
        if streams[0].tokens and not runs_at_first_token:
            runs_at_first_token.append(engine.stats.prompt_runs)

    with engine._cond:  # one turn: the three are taken together
        streams = [engine.submit(p, 4, stop_token_ids=[]) for p in prompts]
        streams[0].on_update(first_token)
    outs = [s.result() for s in streams]
    assert runs_at_first_token == [3]
    assert outs == engine.generate(prompts, 4, stop_token_ids=[])


def test_processes_loading_a_folder_at_once_compile_it_once(folder, tmp_path) -> None:
    """serve --workers: every worker loads the folder into the same empty cache at once;
    each must get the whole gear file (one compiles, the others wait for it)."""
    import os
    import subprocess
    import sys

    code = ("import sys; from gear_runtime.llm import Engine; "
            "e = Engine.from_folder(sys.argv[1], max_sequences=2, prompt_gears=[16]); "
            "print(e.generate([[5, 6, 7]], 3, stop_token_ids=[])); e.close()")
    env = {**os.environ, "GEAR_RUNTIME_LLM_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(folder)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    assert len({out for out, _ in outs}) == 1
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 1
