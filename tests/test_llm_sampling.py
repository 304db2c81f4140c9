"""Per-sequence sampling (gear_runtime.llm.sampling): greedy is argmax, a seed repeats its
tokens whatever shares the step, top-k / top-p keep exactly their candidates, temperature
follows the softmax, and bad parameters are refused naming the value and the limit."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gear_runtime.errors import InputError
from gear_runtime.llm import SamplingParams, SequenceSampler, sample
from gear_runtime.llm.sampling import NUCLEUS_CANDIDATES


def _rows(n: int, vocab: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, vocab)).astype(np.float32) * 3


def _draws(row: np.ndarray, params: SamplingParams, n: int) -> list[int]:
    s = SequenceSampler(params)
    return [int(sample(row[None], [s])[0]) for _ in range(n)]


def test_greedy_rows_are_argmax() -> None:
    logits = _rows(5)
    samplers = [SequenceSampler(SamplingParams()) for _ in range(5)]
    assert sample(logits, samplers).tolist() == logits.argmax(axis=1).tolist()


def test_a_seed_repeats_its_tokens_whatever_shares_the_step() -> None:
    """Row 0 under seed 7 draws the same tokens alone and beside other sampled rows."""
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    steps = [_rows(3, seed=k) for k in range(20)]
    alone = SequenceSampler(params)
    crowd = [SequenceSampler(params), SequenceSampler(SamplingParams(temperature=1.5, seed=1)),
             SequenceSampler(SamplingParams())]
    got_alone = [int(sample(s[:1], [alone])[0]) for s in steps]
    got_crowd = [int(sample(s, crowd)[0]) for s in steps]
    assert got_alone == got_crowd
    other = SequenceSampler(SamplingParams(temperature=0.9, top_p=0.95, seed=8))
    assert [int(sample(s[:1], [other])[0]) for s in steps] != got_alone


def test_top_k_keeps_its_k_candidates() -> None:
    row = _rows(1)[0]
    top = set(np.argsort(-row)[:5].tolist())
    got = _draws(row, SamplingParams(temperature=5.0, top_k=5, seed=0), 400)
    assert set(got) == top
    assert set(_draws(row, SamplingParams(temperature=5.0, top_k=1, seed=0), 20)) == \
        {int(row.argmax())}


def test_top_p_keeps_the_nucleus() -> None:
    """Two tokens hold 90% of the mass: top_p 0.85 draws only them; a flat row's nucleus is
    wider than the first candidates looked at, and is still drawn from whole."""
    row = np.full(1000, -10.0, np.float32)
    row[[3, 9]] = [2.0, 1.5]
    got = _draws(row, SamplingParams(temperature=1.0, top_p=0.85, seed=1), 300)
    assert set(got) == {3, 9}
    flat = np.zeros(2000, np.float32)
    wide = set(_draws(flat, SamplingParams(temperature=1.0, top_p=0.9, seed=2), 3000))
    assert len(wide) > NUCLEUS_CANDIDATES * 2


def test_temperature_follows_the_softmax() -> None:
    row = np.array([1.0, 0.0, -1.0, 0.5], np.float32)
    t = 0.7
    want = np.exp(row / t) / np.exp(row / t).sum()
    counts = Counter(_draws(row, SamplingParams(temperature=t, seed=3), 6000))
    got = np.array([counts[i] for i in range(4)]) / 6000
    np.testing.assert_allclose(got, want, atol=0.03)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -1.0}, "temperature is -1.0: it must be 0"),
    ({"top_p": 0.0}, "top_p is 0"),
    ({"top_p": 1.5}, r"top_p is 1.5: it must be in \(0, 1\]"),
    ({"top_k": -2}, "top_k is -2: it must be 0 or more"),
    ({"max_new_tokens": 0}, "max_new_tokens is 0: it must be 1 or more"),
    ({"seed": -1}, "seed is -1"),
    ({"seed": True}, "seed must be an integer"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"stop_token_ids": 5}, "stop_token_ids must be a list"),
])
def test_bad_parameters_are_refused(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        SamplingParams(**kwargs)


def test_a_stop_token_outside_the_vocabulary_is_refused() -> None:
    params = SamplingParams(stop_token_ids=[2, 700])
    assert params.stop_token_ids == (2, 700)
    params.check_vocab(701)
    with pytest.raises(InputError, match="stop_token_ids holds 700, outside the vocabulary"):
        params.check_vocab(512)
