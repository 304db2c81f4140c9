"""Greedy generation with a prefill at gears and a static decode: the seed's service loop.

:class:`Generator` is the recipe as a service writes it: the decode loads as a static model
and keeps its KV cache resident (``state=``), the prefill shares its weights
(``share_weights_with=``), runs padded to its covering gear and writes its cache straight
into the decode's state (``out=``); every token after the first is one decode step that
copies nothing but its token and position. :func:`reference_tokens` is the same loop on
plain ONNX Runtime sessions of the same two files (the cache round-trips through numpy), what
the demo, the tests and ``benchmarks/bench_generate.py`` check the tokens against.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gear_runtime.examples import causal_lm
from gear_runtime.runtime.model import GearModel, load


def build_pair(directory: str | Path, sizes: causal_lm.Sizes = causal_lm.SMALL,
               seed: int = 0) -> tuple[Path, Path, Path]:
    """Write the example pair into ``directory`` and compile the prefill at
    ``sizes.seq_gears``: ``(prefill.onnx, prefill.gear.onnx, decode.onnx)``."""
    from gear_runtime.compiler import compile_model
    from gear_runtime.spec import GearSpec

    prefill, decode = causal_lm.write_pair(directory, sizes, seed)
    gear = Path(directory) / "prefill.gear.onnx"
    spec = GearSpec.from_atc(sizes.input_shape(), dynamic_dims=sizes.dynamic_dims())
    compile_model(str(prefill), spec, str(gear), progress=False)
    return prefill, gear, decode


class Generator:
    """A loaded prefill + decode pair and one executor of each (one sequence at a time)."""

    def __init__(self, prefill_gear: str | Path, decode: str | Path, *, share_weights: bool = True,
                 **options: Any) -> None:
        self.decode: GearModel = load(str(decode), **options)
        self.prefill: GearModel = load(str(prefill_gear), **options,
                                       share_weights_with=self.decode if share_weights else None)
        self.dex = self.decode.create_executor(state=causal_lm.STATE)
        self.pex = self.prefill.create_executor()

    def first_token(self, ids: np.ndarray) -> int:
        """Prefill ``ids`` [1, L] (padded to the covering gear), its cache written into the
        decode's state; the first generated token."""
        self.dex.reset_state()
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        logits = self.pex.execute(feeds, pad=True, copy=False,
                                  out={"present_kv": self.dex.state["past_kv"]})[0]
        return int(logits.argmax())

    def step(self, token: int, position: int) -> int:
        """One decode step: ``token`` at ``position``; the next token."""
        feeds = {"input_ids": np.array([[token]], np.int64),
                 "position": np.array([position], np.int64)}
        return int(self.dex.execute(feeds, copy=False)[0].argmax())  # read at once: no copy

    def generate(self, ids: np.ndarray, new_tokens: int) -> list[int]:
        """``new_tokens`` greedy tokens after the prompt ``ids`` [1, L]."""
        tokens = [self.first_token(ids)]
        for t in range(new_tokens - 1):
            tokens.append(self.step(tokens[-1], ids.shape[1] + t))
        return tokens

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()


def padded_feeds(ids: np.ndarray, gear: int) -> dict[str, np.ndarray]:
    """``ids`` right-padded (id 0, mask 0) to ``gear``: what a padded prefill run sees."""
    length = ids.shape[1]
    padded, mask = np.zeros((1, gear), np.int64), np.zeros((1, gear), np.int64)
    padded[:, :length], mask[:, :length] = ids, 1
    return {"input_ids": padded, "attention_mask": mask}


def reference_tokens(prefill: Any, decode: Any, ids: np.ndarray, gear: int,
                     new_tokens: int) -> list[int]:
    """The same greedy loop on plain ORT sessions ``prefill`` (of the dynamic source) and
    ``decode``: prefill at the padded ``gear``, the cache handed back in by numpy."""
    logits, cache = prefill.run(None, padded_feeds(ids, gear))
    tokens = [int(logits.argmax())]
    for t in range(new_tokens - 1):
        logits, cache = decode.run(None, {"input_ids": np.array([[tokens[-1]]], np.int64),
                                          "position": np.array([ids.shape[1] + t], np.int64),
                                          "past_kv": cache})
        tokens.append(int(logits.argmax()))
    return tokens


def ort_sessions(prefill: str | Path, decode: str | Path,
                 options: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """Plain ORT CPU sessions of the two source files."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # its errors come back as exceptions
    for key, value in (options or {}).items():
        setattr(so, key, value)
    return tuple(ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
                 for p in (prefill, decode))


def covering_gear(length: int, gears: tuple[int, ...]) -> int:
    """The smallest gear at least ``length`` long."""
    return min(g for g in gears if g >= length)
