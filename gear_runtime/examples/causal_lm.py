"""A causal LM as seed 004 serves it: a prefill at sequence gears and a STATIC decode.

The service this runtime exists for is two models that share their weights:

    prefill  input_ids int64 [1, S], attention_mask int64 [1, S]      (S: the seq gears)
             -> logits float32 [1, 1, V]      (the last valid row's: ``sum(mask) - 1``)
                present_kv float32 [L, 2, 1, NH, MAX, D]   (K and V padded to MAX)
    decode   input_ids int64 [1, 1], position int64 [1], past_kv [L, 2, 1, NH, MAX, D]
             -> logits float32 [1, 1, V], present_kv [L, 2, 1, NH, MAX, D]

The decode has no dynamic axis at all: it writes the new token's K and V at ``position``
(a one-hot blend, so every other slot keeps its bits) and attends to the slots up to it.
Its ``past_kv`` <- ``present_kv`` is the pair an executor keeps resident
(``create_executor(state={"past_kv": "present_kv"})``), and the prefill's ``present_kv``
has exactly that shape, so a prefill hands its cache over with ``out=``.

Built with ``onnx.helper`` from seeded weights (no download): pre-norm decoder layers with
multi-head causal attention and an MLP, learned positions, an untied LM head. The prompt is
right-padded to its gear (mask 0 at the pads): the causal mask keeps the valid rows from
seeing the pads and the decode masks the cache slots past ``position``, so padding changes
no token. Sizes are parameters: :data:`SMALL` for tests and the demo, :data:`BENCH` for a
167 M-parameter pair with a 64 MiB cache (``benchmarks/bench_generate.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization; supported by every ORT >= 1.14
_NEG = -1.0e4  # additive mask (finite: exp underflows to exactly 0 beside real scores)

PREFILL_INPUTS: tuple[str, ...] = ("input_ids", "attention_mask")
DECODE_INPUTS: tuple[str, ...] = ("input_ids", "position", "past_kv")
OUTPUTS: tuple[str, ...] = ("logits", "present_kv")
#: The decode's resident state: input name <- output name.
STATE: dict[str, str] = {"past_kv": "present_kv"}


@dataclass(frozen=True)
class Sizes:
    """The model's sizes; ``max_seq``: the cache length (every gear and position below it)."""

    vocab: int = 512
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    max_seq: int = 256
    seq_gears: tuple[int, ...] = (32, 64, 128)

    def __post_init__(self) -> None:
        if min(self.vocab, self.hidden, self.heads, self.layers, self.max_seq) <= 0 \
                or self.hidden % self.heads:
            raise ValueError(f"need positive sizes with hidden % heads == 0, got {self}")
        if not self.seq_gears or max(self.seq_gears) > self.max_seq or min(self.seq_gears) <= 0:
            raise ValueError(f"seq gears {self.seq_gears} must be in [1, max_seq={self.max_seq}]")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def cache_shape(self) -> tuple[int, ...]:
        return (self.layers, 2, 1, self.heads, self.max_seq, self.head_dim)

    @property
    def cache_nbytes(self) -> int:
        return int(np.prod(self.cache_shape)) * 4

    def parameters(self) -> int:
        h = self.hidden
        per_layer = 4 * h * h + 2 * 4 * h * h + 4 * h  # attention, MLP, two norms
        return 2 * self.vocab * h + self.max_seq * h + self.layers * per_layer + 2 * h

    def dynamic_dims(self) -> str:
        """atc's ``--dynamic_dims`` for the prefill (both inputs share the seq axis)."""
        return ";".join(f"{s},{s}" for s in self.seq_gears)

    def input_shape(self) -> str:
        return "input_ids:1,-1;attention_mask:1,-1"


SMALL = Sizes()
#: 167 M parameters (638 MiB of float32 weights), a 64 MiB KV cache.
BENCH = Sizes(vocab=32000, hidden=1024, heads=16, layers=8, max_seq=1024,
              seq_gears=(64, 128, 256, 512))


def make_weights(sizes: Sizes, seed: int = 0) -> dict[str, np.ndarray]:
    """The pair's weights by role name (seeded: the same bytes on every machine)."""
    rng = np.random.default_rng(seed)
    h, ff = sizes.hidden, 4 * sizes.hidden

    def normal(shape: tuple[int, ...], std: float | None = None) -> np.ndarray:
        std = 1.0 / np.sqrt(shape[0]) if std is None else std
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    w = {"embed_tokens": normal((sizes.vocab, h), 1.0),
         "embed_positions": normal((sizes.max_seq, h), 0.1),
         "final_norm": np.ones(h, np.float32), "lm_head": normal((h, sizes.vocab))}
    for i in range(sizes.layers):
        for name, shape in (("q", (h, h)), ("k", (h, h)), ("v", (h, h)), ("o", (h, h)),
                            ("up", (h, ff)), ("down", (ff, h))):
            w[f"layers.{i}.{name}"] = normal(shape)
        w[f"layers.{i}.norm1"] = np.ones(h, np.float32)
        w[f"layers.{i}.norm2"] = np.ones(h, np.float32)
    return w


class _Graph:
    """Unique node names, named initializers (``prefix`` + role), int64 constants."""

    def __init__(self, weights: Mapping[str, np.ndarray], prefix: str) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._weights, self._prefix = weights, prefix
        self._used: set[str] = set()
        self._n = 0

    def op(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=f"{op_type}_{self._n}", **attrs))
        return out

    def w(self, role: str) -> str:
        name = self._prefix + role
        if name not in self._used:
            self._used.add(name)
            self.inits.append(numpy_helper.from_array(self._weights[role], name))
        return name

    def const(self, value: npt.ArrayLike, dtype: type = np.int64) -> str:
        self._n += 1
        name = f"const_{self._n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


def _layer(g: _Graph, sizes: Sizes, i: int, x: str,
           kv: Callable[[str, str], tuple[str, str]], bias: str) -> tuple[str, str, str]:
    """One pre-norm decoder layer over ``x`` [1, T, H]; ``kv(k, v)`` turns this step's K / V
    [1, NH, T, D] into the ones attended to (the decode blends them into the cache).
    Returns (x, K, V) with K / V as attended."""
    nh, d, h = sizes.heads, sizes.head_dim, sizes.hidden
    p = f"layers.{i}."
    norm = g.op("LayerNormalization", [x, g.w(p + "norm1"), g.const(np.zeros(h), np.float32)],
                axis=-1, epsilon=1e-5)

    def heads(role: str) -> str:
        y = g.op("Reshape", [g.op("MatMul", [norm, g.w(p + role)]), g.const([1, -1, nh, d])])
        return g.op("Transpose", [y], perm=[0, 2, 1, 3])  # [1, NH, T, D]

    q = heads("q")
    k, v = kv(heads("k"), heads("v"))
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.op("Add", [g.op("Mul", [scores, g.const([1.0 / np.sqrt(d)], np.float32)]), bias])
    attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    attn = g.op("Reshape", [g.op("Transpose", [attn], perm=[0, 2, 1, 3]), g.const([1, -1, h])])
    x = g.op("Add", [x, g.op("MatMul", [attn, g.w(p + "o")])])
    norm2 = g.op("LayerNormalization", [x, g.w(p + "norm2"), g.const(np.zeros(h), np.float32)],
                 axis=-1, epsilon=1e-5)
    up = g.op("Relu", [g.op("MatMul", [norm2, g.w(p + "up")])])
    return g.op("Add", [x, g.op("MatMul", [up, g.w(p + "down")])]), k, v


def _stack_cache(g: _Graph, kvs: Sequence[tuple[str, ...]]) -> str:
    """Per layer (K, V) [1, NH, MAX, D] -> present_kv [L, 2, 1, NH, MAX, D]."""
    layers = [g.op("Concat", [g.op("Unsqueeze", [t, g.const([0, 1])]) for t in kv], axis=1)
              for kv in kvs]
    return g.op("Concat", layers, axis=0) if len(layers) > 1 else layers[0]


def _head(g: _Graph, x: str) -> str:
    h = g.op("LayerNormalization", [x, g.w("final_norm"), g.const(np.zeros(
        g._weights["final_norm"].shape), np.float32)], axis=-1, epsilon=1e-5)
    return g.op("MatMul", [h, g.w("lm_head")])


def _finish(g: _Graph, name: str, inputs: list[onnx.ValueInfoProto], logits: str, cache: str,
            sizes: Sizes) -> onnx.ModelProto:
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits_out"))
    g.nodes.append(helper.make_node("Identity", [cache], ["present_kv"], name="cache_out"))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, sizes.vocab]),
               helper.make_tensor_value_info("present_kv", TensorProto.FLOAT,
                                             list(sizes.cache_shape))]
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gear_runtime.examples.causal_lm")
    model.ir_version = 8
    return model


def build_prefill(sizes: Sizes = SMALL, weights: Mapping[str, np.ndarray] | None = None,
                  prefix: str = "") -> onnx.ModelProto:
    """The prefill with a dynamic ``seq`` axis (compile it at ``sizes.seq_gears``)."""
    weights = make_weights(sizes) if weights is None else weights
    g = _Graph(weights, prefix)
    ids, mask = PREFILL_INPUTS
    seq = g.op("Shape", [ids], start=1, end=2)  # [1]
    positions = g.op("Range", [g.const(0), g.op("Squeeze", [seq, g.const([0])]), g.const(1)])
    x = g.op("Add", [g.op("Gather", [g.w("embed_tokens"), ids]),
                     g.op("Unsqueeze", [g.op("Gather", [g.w("embed_positions"), positions]),
                                        g.const([0])])])
    # bias [1, 1, S, S]: -1e4 where a key is later than the query (causal) or is a pad
    later = g.op("Greater", [g.op("Unsqueeze", [positions, g.const([0])]),
                             g.op("Unsqueeze", [positions, g.const([1])])])
    causal = g.op("Mul", [g.op("Cast", [later], to=TensorProto.FLOAT),
                          g.const([_NEG], np.float32)])
    pads = g.op("Mul", [g.op("Sub", [g.const([1.0], np.float32),
                                     g.op("Cast", [mask], to=TensorProto.FLOAT)]),
                        g.const([_NEG], np.float32)])
    bias = g.op("Add", [causal, g.op("Unsqueeze", [pads, g.const([1, 2])])])
    # K / V padded along the sequence to max_seq: pads [0,0,0,0, 0,0,MAX-S,0]
    pad_to = g.op("Concat", [g.const([0] * 6), g.op("Sub", [g.const([sizes.max_seq]), seq]),
                             g.const([0])], axis=0)
    kvs = []
    for i in range(sizes.layers):
        x, k, v = _layer(g, sizes, i, x, lambda k, v: (k, v), bias)
        kvs.append(tuple(g.op("Pad", [t, pad_to], mode="constant") for t in (k, v)))
    # the last valid row's logits only: [1, 1, V] (not [1, S, V])
    last = g.op("Sub", [g.op("ReduceSum", [mask], keepdims=1), g.const([[1]])])  # [1, 1]
    logits = _head(g, g.op("Gather", [x, g.op("Reshape", [last, g.const([1])])], axis=1))
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, "seq"])
              for n in PREFILL_INPUTS]
    return _finish(g, "causal_lm_prefill", inputs, logits, _stack_cache(g, kvs), sizes)


def build_decode(sizes: Sizes = SMALL, weights: Mapping[str, np.ndarray] | None = None,
                 prefix: str = "") -> onnx.ModelProto:
    """The static decode: one token at ``position``, the whole cache in and out."""
    weights = make_weights(sizes) if weights is None else weights
    g = _Graph(weights, prefix)
    ids, position, past = DECODE_INPUTS
    x = g.op("Add", [g.op("Gather", [g.w("embed_tokens"), ids]),
                     g.op("Gather", [g.w("embed_positions"),
                                     g.op("Reshape", [position, g.const([1, 1])])])])
    slots = g.const(np.arange(sizes.max_seq))
    here = g.op("Reshape", [g.op("Cast", [g.op("Equal", [slots, position])],
                                 to=TensorProto.FLOAT), g.const([1, 1, -1, 1])])
    keep = g.op("Sub", [g.const([1.0], np.float32), here])
    later = g.op("Cast", [g.op("Greater", [slots, position])], to=TensorProto.FLOAT)
    bias = g.op("Reshape", [g.op("Mul", [later, g.const([_NEG], np.float32)]),
                            g.const([1, 1, 1, -1])])
    kvs = []
    for i in range(sizes.layers):
        layer = g.op("Gather", [past, g.const(i)], axis=0)  # [2, 1, NH, MAX, D]

        def blend(k: str, v: str, layer: str = layer) -> tuple[str, str]:
            # slot `position` takes this token's K / V, every other slot keeps its bits
            def mix(j: int, t: str) -> str:
                return g.op("Add", [g.op("Mul", [g.op("Gather", [layer, g.const(j)], axis=0),
                                                 keep]),
                                    g.op("Mul", [t, here])])

            return mix(0, k), mix(1, v)

        x, k, v = _layer(g, sizes, i, x, blend, bias)
        kvs.append((k, v))
    inputs = [helper.make_tensor_value_info(ids, TensorProto.INT64, [1, 1]),
              helper.make_tensor_value_info(position, TensorProto.INT64, [1]),
              helper.make_tensor_value_info(past, TensorProto.FLOAT, list(sizes.cache_shape))]
    return _finish(g, "causal_lm_decode", inputs, _head(g, x), _stack_cache(g, kvs), sizes)


def prompt(length: int, sizes: Sizes = SMALL, seed: int = 0) -> np.ndarray:
    """A seeded prompt of ``length`` token ids, int64 [1, length]."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, sizes.vocab, size=(1, length), dtype=np.int64)


def write_pair(directory: str | Path, sizes: Sizes = SMALL, seed: int = 0,
               decode_prefix: str = "decode.") -> tuple[Path, Path]:
    """Write ``prefill.onnx`` (dynamic seq) and ``decode.onnx`` (static) into ``directory``.

    The decode's weights carry ``decode_prefix`` in their names (two exports name them
    differently): sharing them (``load(..., share_weights_with=)``) goes by their bytes. Big
    models keep their weights in one external data file each (``<model>.data``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = make_weights(sizes, seed)
    paths = directory / "prefill.onnx", directory / "decode.onnx"
    external = sizes.parameters() * 4 >= 256 * 2**20
    for path, model in zip(paths, (build_prefill(sizes, weights),
                                   build_decode(sizes, weights, decode_prefix)), strict=True):
        if external:
            onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                      location=path.name + ".data", size_threshold=1024)
        else:
            onnx.save(model, str(path))
    return paths


__all__ = [
    "BENCH",
    "DECODE_INPUTS",
    "OUTPUTS",
    "PREFILL_INPUTS",
    "SMALL",
    "STATE",
    "Sizes",
    "build_decode",
    "build_prefill",
    "make_weights",
    "prompt",
    "write_pair",
]
