"""Per-sequence sampling over a batch of logits rows: greedy, temperature, top-k, top-p, seeds.

One call picks the next token of every row of a step (``[batch, vocab]`` logits), each row
under its own :class:`SamplingParams` and its own random stream, so a sequence's tokens never
depend on which other sequences share its step (same seed, same tokens). Greedy rows (the
default, ``temperature == 0``) are one vectorised argmax. A sampled row looks only at its
candidates: the ``top_k`` largest logits found with a partition (O(vocab), never a full sort
of the vocabulary), or for ``top_p`` alone the :data:`NUCLEUS_CANDIDATES` largest, widened to
the whole row only when their mass falls short of ``top_p``; then one uniform draw from the
sequence's generator picks a candidate by its cumulative probability.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from gear_runtime.errors import InputError

#: Candidates a top-p row looks at first (its nucleus is almost always among them).
NUCLEUS_CANDIDATES = 256


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its tokens and when it stops.

    ``temperature`` 0 is greedy (argmax; ``top_k`` / ``top_p`` / ``seed`` then change
    nothing); ``top_k`` 0 and ``top_p`` 1.0 are off; ``seed`` None draws a fresh seed;
    ``stop_token_ids``: a generated token among them ends the sequence (it is returned);
    ``max_new_tokens``: at most that many tokens are generated."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        _integer("max_new_tokens", self.max_new_tokens, 1)
        _integer("top_k", self.top_k, 0)
        _real("temperature", self.temperature, 0.0, math.inf, "0 (greedy) or more")
        _real("top_p", self.top_p, 0.0, 1.0, "in (0, 1]")
        if self.top_p == 0.0:
            raise InputError("top_p is 0: it must be in (0, 1] (1.0: off)")
        if self.seed is not None:
            _integer("seed", self.seed, 0)
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", _token_tuple(self.stop_token_ids))
        for t in self.stop_token_ids:
            _integer("stop_token_ids", t, 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check_vocab(self, vocab: int) -> None:
        """InputError when a stop token is outside the vocabulary ``[0, vocab)``."""
        for t in self.stop_token_ids:
            if t >= vocab:
                raise InputError(f"stop_token_ids holds {t}, outside the vocabulary "
                                 f"(token ids 0..{vocab - 1})")


def _token_tuple(values: object) -> tuple[int, ...]:
    try:
        # a non-iterable raises the TypeError caught below; the caller checks each id
        return tuple(cast(Iterable[int], values))
    except TypeError:
        raise InputError(f"stop_token_ids must be a list of token ids, got {values!r}") from None


def _integer(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if operator.index(value) < low:
        raise InputError(f"{name} is {value}: it must be {low} or more")


def _real(name: str, value: object, low: float, high: float, want: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise InputError(f"{name} must be a number, got {value!r}")
    if not (low <= float(value) <= high):
        raise InputError(f"{name} is {value}: it must be {want}")


class SequenceSampler:
    """One sequence's sampling state: its params and its own random generator (seeded by
    ``params.seed``, so the same seed gives the same tokens whatever else runs)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.Generator(np.random.PCG64(params.seed))


def sample(logits: np.ndarray, samplers: Sequence[SequenceSampler]) -> np.ndarray:
    """The next token of each row of ``logits`` ([rows, vocab], float) under its sampler
    (``samplers[i]`` for row i); int64 [rows]. Greedy rows are argmax; the others draw once
    from their own generator."""
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"logits {logits.shape} for {len(samplers)} samplers")
    tokens = np.argmax(logits, axis=1).astype(np.int64)
    for i, s in enumerate(samplers):
        if not s.params.greedy:
            tokens[i] = _draw(logits[i], s)
    return tokens


def _draw(row: np.ndarray, sampler: SequenceSampler) -> int:
    """One token of one row: its candidates (largest first), softmax at the temperature, the
    nucleus cut (top-p over the renormalised candidates, as vLLM applies top-k then top-p),
    one uniform draw through the cumulative probabilities."""
    p = sampler.params
    ids = _candidates(row, p)
    probs = _softmax(row[ids].astype(np.float64) / p.temperature)
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
        ids, probs = ids[:keep], probs[:keep]
    cumulative = np.cumsum(probs)
    pick = int(np.searchsorted(cumulative, sampler.rng.random() * cumulative[-1], side="right"))
    return int(ids[min(pick, len(ids) - 1)])


def _candidates(row: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The token ids a sampled row can pick: its top-k, largest first; for top-p alone the
    :data:`NUCLEUS_CANDIDATES` largest when they hold the nucleus, else all sorted; for
    temperature alone, every id in order."""
    vocab = row.shape[0]
    if 0 < p.top_k < vocab:
        return _largest(row, p.top_k)
    if p.top_p == 1.0:
        return np.arange(vocab)  # temperature alone: every token, in any order
    if vocab > NUCLEUS_CANDIDATES:
        ids = _largest(row, NUCLEUS_CANDIDATES)
        if _nucleus_inside(row, ids, p):
            return ids
    return np.argsort(-row, kind="stable")


def _largest(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values of ``row``, largest first (ties: lower index)."""
    part = np.argpartition(-row, k - 1)[:k]
    return part[np.lexsort((part, -row[part]))]


def _nucleus_inside(row: np.ndarray, ids: np.ndarray, p: SamplingParams) -> bool:
    """Whether the candidates ``ids`` hold at least ``top_p`` of the whole row's mass."""
    scaled = row.astype(np.float64) / p.temperature
    top = scaled.max()
    total = np.exp(scaled - top).sum()
    return float(np.exp(scaled[ids] - top).sum() / total) >= p.top_p


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


__all__ = ["NUCLEUS_CANDIDATES", "SamplingParams", "SequenceSampler", "sample"]
