"""A causal LM in onnxruntime-genai's layout: one graph for prefill and decode, its KV cache
updated in place by ONNX Runtime's GroupQueryAttention.

This is the graph onnxruntime-genai's model builder writes for a decoder (GQA with a
shared past / present buffer), built here with ``onnx.helper`` from seeded weights (no
download, no torch):

    input_ids int64 [1, S], attention_mask int64 [1, T],
    past_key_values.{i}.key / .value float32 [1, KVH, MAX, D]
    -> logits float32 [1, S, V], present.{i}.key / .value float32 [1, KVH, MAX, D]

GroupQueryAttention (com.microsoft) takes ``seqlens_k = sum(attention_mask) - 1`` and
``total_sequence_length = T`` (computed in the graph, as the builder's graph does) and
applies rotary embeddings itself (``do_rotary``). When ``past`` and ``present`` are ONE
buffer (same address, for both key and value), the kernel writes the new token's K / V at
its position and reads the cache where it is: no copy of the cache per token
(``past_present_share_buffer`` in genai's config). That is what
``create_executor(state=..., in_place_state=True)`` binds (gear_runtime/runtime/state/plan.py).

One gear file holds prefill and decode: dims gears (S, T) = (G, G) for each prompt gear G
(the prompt right-padded to G, the mask all ones: the pads come after every real token, so
causal attention keeps them out of the real rows) and (1, MAX) for a decode step (the mask
ones up to the step's position, zeros after). The cache slots a padded prefill filled past
the prompt are overwritten by the decode steps before any step attends to them.

:func:`write_genai_folder` writes the plain ONNX model with a ``genai_config.json`` so that
onnxruntime-genai runs the very same graph and weights (benchmarks/bench_generate.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from gear_runtime.compiler import compile_model
from gear_runtime.spec import GearSpec

OPSET = 17
MS_DOMAIN = "com.microsoft"
INPUTS: tuple[str, ...] = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class Sizes:
    """The model's sizes; ``max_seq``: the cache length; ``seq_gears``: the prompt gears."""

    vocab: int = 512
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    max_seq: int = 128
    seq_gears: tuple[int, ...] = (16, 32, 64)

    def __post_init__(self) -> None:
        if min(self.vocab, self.hidden, self.heads, self.kv_heads, self.layers,
               self.max_seq) <= 0 or self.hidden % self.heads or self.heads % self.kv_heads \
                or (self.hidden // self.heads) % 2:
            raise ValueError(f"need positive sizes, hidden % heads == 0, heads % kv_heads == 0 "
                             f"and an even head size, got {self}")
        if not self.seq_gears or max(self.seq_gears) > self.max_seq or min(self.seq_gears) <= 1:
            raise ValueError(f"seq_gears must lie in 2..max_seq ({self.max_seq}), got "
                             f"{self.seq_gears}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def cache_shape(self) -> tuple[int, int, int, int]:
        return (1, self.kv_heads, self.max_seq, self.head_dim)

    @property
    def cache_bytes(self) -> int:
        return 2 * self.layers * int(np.prod(self.cache_shape)) * 4


SMALL = Sizes()
#: 170 M parameters (650 MiB of float32 weights), a 32 MiB KV cache (8 KV heads of 128).
BENCH = Sizes(vocab=32000, hidden=1024, heads=8, kv_heads=8, layers=8, max_seq=512,
              seq_gears=(32, 64, 128, 256))


def state_pairs(sizes: Sizes) -> dict[str, str]:
    """The resident state: every layer's past key / value <- its present."""
    return {f"past_key_values.{i}.{kv}": f"present.{i}.{kv}"
            for i in range(sizes.layers) for kv in ("key", "value")}


def make_weights(sizes: Sizes, seed: int = 0) -> dict[str, np.ndarray]:
    """The weights by name (seeded: the same bytes on every machine)."""
    rng = np.random.default_rng(seed)
    h, kvd, ff = sizes.hidden, sizes.kv_heads * sizes.head_dim, 4 * sizes.hidden

    def normal(shape: tuple[int, ...], std: float | None = None) -> np.ndarray:
        std = 1.0 / np.sqrt(shape[0]) if std is None else std
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    w = {"embed_tokens": normal((sizes.vocab, h), 1.0), "final_norm": np.ones(h, np.float32),
         "lm_head": normal((h, sizes.vocab))}
    for i in range(sizes.layers):
        for name, shape in (("q", (h, h)), ("k", (h, kvd)), ("v", (h, kvd)), ("o", (h, h)),
                            ("up", (h, ff)), ("down", (ff, h))):
            w[f"layers.{i}.{name}"] = normal(shape)
        w[f"layers.{i}.norm1"] = np.ones(h, np.float32)
        w[f"layers.{i}.norm2"] = np.ones(h, np.float32)
    return w


def _rotary(sizes: Sizes) -> tuple[np.ndarray, np.ndarray]:
    """GQA's cos / sin caches [MAX, D / 2] (rotary base 10000)."""
    d = sizes.head_dim
    freq = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d))
    angles = np.outer(np.arange(sizes.max_seq, dtype=np.float64), freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    @overload
    def op(self, op_type: str, inputs: Sequence[str], outputs: Literal[1] = 1,
           domain: str = "", **attrs: Any) -> str: ...

    @overload
    def op(self, op_type: str, inputs: Sequence[str], outputs: int | Sequence[str],
           domain: str = "", **attrs: Any) -> str | list[str]: ...

    def op(self, op_type: str, inputs: Sequence[str], outputs: int | Sequence[str] = 1,
           domain: str = "", **attrs: Any) -> str | list[str]:
        self._n += 1
        outs = ([f"{op_type.lower()}_{self._n}_{k}" for k in range(outputs)]
                if isinstance(outputs, int) else list(outputs))
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"{op_type}_{self._n}",
                                           domain=domain or None, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def const(self, value: npt.ArrayLike, dtype: type = np.int64) -> str:
        self._n += 1
        return self.init(f"const_{self._n}", np.asarray(value, dtype=dtype))


def _rms(g: _Graph, x: str, weight: str) -> str:
    """RMS norm over the last axis (plain ONNX ops, epsilon 1e-6)."""
    mean = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
    scale = g.op("Div", [g.const([1.0], np.float32),
                         g.op("Sqrt", [g.op("Add", [mean, g.const([1e-6], np.float32)])])])
    return g.op("Mul", [g.op("Mul", [x, scale]), weight])


def build(sizes: Sizes = SMALL, weights: dict[str, np.ndarray] | None = None,
          batch: bool = False) -> onnx.ModelProto:
    """The graph (dynamic S and T; with ``batch``, a dynamic batch axis B too, as
    onnxruntime-genai's builder writes it), weights inline."""
    w = make_weights(sizes) if weights is None else weights
    g = _Graph()
    for name, value in w.items():
        g.init(name, value)
    cos, sin = _rotary(sizes)
    g.init("cos_cache", cos)
    g.init("sin_cache", sin)
    # seqlens_k = sum(mask) - 1 and total_sequence_length = T, as the builder's graph has them
    summed = g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=0)
    seqlens = g.op("Cast", [g.op("Sub", [summed, g.const([1])])], to=TensorProto.INT32)
    total = g.op("Cast", [g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(1)],
                               axis=0)], to=TensorProto.INT32)
    x = g.op("Gather", ["embed_tokens", "input_ids"], axis=0)  # [1, S, H]
    for i in range(sizes.layers):
        p = f"layers.{i}."
        n = _rms(g, x, p + "norm1")
        q, k, v = (g.op("MatMul", [n, p + r]) for r in ("q", "k", "v"))
        attn = g.op("GroupQueryAttention",
                    [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens,
                     total, "cos_cache", "sin_cache"],
                    [f"attn_{i}", f"present.{i}.key", f"present.{i}.value"], domain=MS_DOMAIN,
                    num_heads=sizes.heads, kv_num_heads=sizes.kv_heads, do_rotary=1,
                    scale=float(1.0 / np.sqrt(sizes.head_dim)))[0]
        x = g.op("Add", [x, g.op("MatMul", [attn, p + "o"])])
        up = g.op("MatMul", [_rms(g, x, p + "norm2"), p + "up"])
        x = g.op("Add", [x, g.op("MatMul", [g.op("Mul", [up, g.op("Sigmoid", [up])]),
                                            p + "down"])])
    g.op("MatMul", [_rms(g, x, "final_norm"), "lm_head"], ["logits"])
    b = "B" if batch else 1
    cache = [b, *sizes.cache_shape[1:]]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [b, "S"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [b, "T"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [b, "S", sizes.vocab])]
    for i in range(sizes.layers):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}",
                                                        TensorProto.FLOAT, cache))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", TensorProto.FLOAT,
                                                         cache))
    graph = helper.make_graph(g.nodes, "gqa_lm", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="gear_runtime.examples.gqa_lm")
    model.ir_version = 8
    return model


def gear_text(sizes: Sizes) -> tuple[str, str]:
    """(input_shape, dynamic_dims) in atc's syntax: the prompt gears (G, G) and the decode
    step (1, MAX)."""
    cache = ",".join(map(str, sizes.cache_shape))
    shape = ";".join(["input_ids:1,-1", "attention_mask:1,-1"]
                     + [f"{name}:{cache}" for name in state_pairs(sizes)])
    dims = ";".join([f"{s},{s}" for s in sizes.seq_gears] + [f"1,{sizes.max_seq}"])
    return shape, dims


def write_model(directory: str | Path, sizes: Sizes = SMALL, seed: int = 0,
                compile_gears: bool = True, batch: bool = False) -> tuple[Path, Path | None]:
    """Write ``gqa_lm.onnx`` (weights in ``gqa_lm.onnx.data``; ``batch``: with a dynamic
    batch axis) and, with ``compile_gears``, its gear file ``gqa_lm.gear.onnx`` (batch 1);
    their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "gqa_lm.onnx"
    onnx.save(build(sizes, make_weights(sizes, seed), batch), str(source),
              save_as_external_data=True,
              all_tensors_to_one_file=True, location="gqa_lm.onnx.data", size_threshold=1024)
    if not compile_gears:
        return source, None
    shape, dims = gear_text(sizes)
    out = compile_model(str(source), GearSpec.from_atc(input_shape=shape, dynamic_dims=dims),
                        str(directory / "gqa_lm.gear.onnx"), progress=False)
    return source, Path(out)


def write_genai_folder(directory: str | Path, sizes: Sizes = SMALL, seed: int = 0,
                       batch: bool = False) -> Path:
    """A folder onnxruntime-genai opens (``og.Model(folder)``): the model (``batch``: with a
    dynamic batch axis, as the builder writes it), its ``genai_config.json``
    (:func:`write_genai_config`) and a tokenizer of ``sizes.vocab`` ids whose id 0 is the
    end of sequence (:func:`gear_runtime.examples.tokenizer.write_tokenizer`)."""
    from gear_runtime.examples.tokenizer import write_tokenizer

    directory = Path(directory)
    write_model(directory, sizes, seed, compile_gears=False, batch=batch)
    write_genai_config(directory, sizes)
    write_tokenizer(directory, sizes.vocab, model_max_length=sizes.max_seq)
    return directory


def write_genai_config(directory: str | Path, sizes: Sizes = SMALL) -> Path:
    """``genai_config.json`` for ``gqa_lm.onnx`` in ``directory``: the decoder's I/O names, a
    shared past / present buffer of ``max_seq``, greedy search. Token 0 (the pad id, in no
    prompt) stands as EOS: give ``min_length`` to run a fixed number of tokens."""
    directory = Path(directory)
    config = {"model": {
        "type": "llama", "context_length": sizes.max_seq, "vocab_size": sizes.vocab,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        "decoder": {
            "filename": "gqa_lm.onnx", "head_size": sizes.head_dim,
            "hidden_size": sizes.hidden, "num_attention_heads": sizes.heads,
            "num_key_value_heads": sizes.kv_heads, "num_hidden_layers": sizes.layers,
            "session_options": {"log_id": "gear_runtime", "provider_options": []},
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                       "past_key_names": "past_key_values.%d.key",
                       "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "num_beams": 1, "max_length": sizes.max_seq,
                   "min_length": 0, "past_present_share_buffer": True, "top_k": 1}}
    path = directory / "genai_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def prompt_feeds(ids: np.ndarray, sizes: Sizes = SMALL) -> dict[str, np.ndarray]:
    """The prefill request of prompt ``ids`` [1, n]: right-padded with id 0 to its covering
    prompt gear, the mask all ones (the pads follow every real token, so causal attention
    keeps them out of the real rows; the logits of the last token are row n - 1)."""
    n = ids.shape[1]
    gear = min((g for g in sizes.seq_gears if g >= n), default=None)
    if gear is None:
        raise ValueError(f"a prompt of {n} tokens is longer than the largest prompt gear "
                         f"{max(sizes.seq_gears)}")
    padded = np.zeros((1, gear), np.int64)
    padded[:, :n] = ids
    return {"input_ids": padded, "attention_mask": np.ones((1, gear), np.int64)}


def step_feeds(token: int, position: int, sizes: Sizes = SMALL) -> dict[str, np.ndarray]:
    """The decode step of ``token`` at ``position``: the static mask [1, max_seq], ones up
    to and with the position."""
    mask = np.zeros((1, sizes.max_seq), np.int64)
    mask[:, :position + 1] = 1
    return {"input_ids": np.array([[token]], np.int64), "attention_mask": mask}


def prompt(length: int, sizes: Sizes = SMALL, seed: int = 0) -> np.ndarray:
    """A seeded prompt of ``length`` token ids, [1, length] int64 (no id 0: the pad id)."""
    return np.random.default_rng(seed).integers(1, sizes.vocab, (1, length), dtype=np.int64)


__all__ = ["BENCH", "INPUTS", "SMALL", "Sizes", "build", "gear_text", "make_weights",
           "prompt", "prompt_feeds", "state_pairs", "step_feeds", "write_genai_config",
           "write_genai_folder", "write_model"]
