"""A small transformer-prefill-like model with the four inputs of a Qwen3.5 prefill export.

A MindSpore Lite Qwen3.5 prefill export served on Ascend has four inputs, each with one
dynamic axis, and a converter config that allows four sequence gears::

    input_ids       int64   [1, S]
    attention_mask  int64   [1, S]
    position_ids    int64   [4, 1, S]     (M-RoPE: four position sections)
    image_embeds    float32 [T, H]        (T = 16 image tokens in every gear)

This module builds a scaled-down model with the same interface (H = 64, gears S = 32 / 64 /
128 / 256, T = 16) entirely with ``onnx.helper`` and seeded weights, so it costs no download
and gives the same bytes on every machine. The graph is a real (tiny) prefill: token and
position embeddings, two pre-norm decoder layers whose multi-head attention reads the image
tokens and the causally masked text tokens, an MLP, and a language-model head (the mean image token
is also added to every text token). Outputs:
``logits`` float32 [1, S, V] and ``next_token`` int64 [1, S] (an exact-integer output, so
checks cover both float and int comparison).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec

#: Defaults of the built-in example (kept small so the demo finishes fast on 2 cores).
HIDDEN = 64
VOCAB = 512
HEADS = 4
LAYERS = 2
IMAGE_TOKENS = 16
SEQ_GEARS: tuple[int, ...] = (32, 64, 128, 256)
#: Rows of the position table: positions must stay below this.
MAX_POSITIONS = 1024
OPSET = 17  # LayerNormalization and Trilu; supported by every ORT >= 1.14

INPUT_NAMES: tuple[str, ...] = ("input_ids", "attention_mask", "position_ids", "image_embeds")
OUTPUT_NAMES: tuple[str, ...] = ("logits", "next_token")

_NEG = -1.0e4  # additive mask value (finite: a fully masked row still softmaxes to numbers)


def prefill_config(hidden: int = HIDDEN, seq_gears: Sequence[int] = SEQ_GEARS,
                   image_tokens: int = IMAGE_TOKENS) -> str:
    """The converter config of the example, in a prefill service's ``[acl_build_options]``
    form.

    Four -1 in input_shape (the three sequence axes and the image-token count), one gear per
    sequence length, each gear ``S,S,S,T`` in input_shape order (GE's
    ParserDataToDynamicInfo).
    """
    dims = ";".join(f"{s},{s},{s},{image_tokens}" for s in seq_gears)
    return (
        "[acl_init_options]\n"
        "ge.exec.precision_mode=force_fp32\n"
        "\n"
        "[acl_build_options]\n"
        'input_format="ND"\n'
        f'input_shape="input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;'
        f'image_embeds:-1,{hidden}"\n'
        f'ge.dynamicDims="{dims}"\n'
    )


#: The config text of the default example (what ``write_example`` writes).
PREFILL_CONFIG: str = prefill_config()


class _Graph:
    """Tiny builder: unique node names, seeded initializers, constant int64 tensors."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None,
           **attrs: Any) -> str:
        self._n += 1
        out = name or f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=f"{op_type}_{self._n}", **attrs))
        return out

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        # 1/sqrt(fan_in) keeps activations O(1) through the layers (readable logits).
        std = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        value = (self.rng.standard_normal(shape) * std).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name


def build_prefill_model(hidden: int = HIDDEN, vocab: int = VOCAB, seed: int = 0, *,
                        heads: int = HEADS, layers: int = LAYERS,
                        max_positions: int = MAX_POSITIONS) -> onnx.ModelProto:
    """The example prefill model with dynamic ``seq_len`` and ``num_image_tokens`` axes.

    Deterministic for a given (hidden, vocab, seed, heads, layers, max_positions). ``hidden``
    must be divisible by ``heads``. Valid inputs: ids in [0, vocab), positions in
    [0, max_positions); see :func:`inputs_for_shapes`.
    """
    if hidden <= 0 or vocab <= 0 or heads <= 0 or layers <= 0 or hidden % heads:
        raise ValueError(f"need positive sizes with hidden % heads == 0, got hidden={hidden}, "
                         f"vocab={vocab}, heads={heads}, layers={layers}")
    g = _Graph(seed)
    head_dim = hidden // heads
    ids, mask, pos, img = INPUT_NAMES

    # Embeddings: tokens + four M-RoPE-like position sections, each with its own scale.
    tok = g.op("Gather", [g.weight("embed_tokens", (vocab, hidden), 1.0), ids])
    pos_all = g.op("Gather", [g.weight("embed_positions", (max_positions, hidden), 0.1), pos])
    pos_scaled = g.op("Mul", [pos_all, g.weight("position_sections", (4, 1, 1, hidden), 1.0)])
    pos_emb = g.op("ReduceSum", [pos_scaled, g.const("axis0", np.array([0], np.int64))],
                   keepdims=0)
    image = g.op("Unsqueeze", [g.op("MatMul", [img, g.weight("image_proj", (hidden, hidden))]),
                               g.const("unsq0", np.array([0], np.int64))])  # [1, T, H]
    # Every text token also gets the mean image token. Opset 17 has ReduceMean's axes as an
    # ATTRIBUTE and ReduceSum's (above) as an INPUT: the model carries both forms on purpose.
    image_mean = g.op("ReduceMean", [image], axes=[1], keepdims=1)  # [1, 1, H]
    x = g.op("Add", [g.op("Add", [tok, pos_emb]), image_mean])  # [1, S, H]

    # Additive attention mask [1, 1, S, T + S]: image keys always visible; text keys causal
    # and padded by attention_mask. Built from the inputs' shapes, so it is dynamic.
    seq = g.op("Shape", [ids], start=1, end=2)
    n_img = g.op("Shape", [img], start=0, end=1)
    ones = g.op("ConstantOfShape", [g.op("Concat", [seq, seq], axis=0)],
                value=numpy_helper.from_array(np.array([1.0], np.float32)))
    neg = g.const("neg", np.array(_NEG, np.float32))
    one = g.const("one", np.array(1.0, np.float32))
    causal = g.op("Mul", [g.op("Sub", [one, g.op("Trilu", [ones], upper=0)]), neg])  # [S, S]
    mask_f = g.op("Cast", [mask], to=TensorProto.FLOAT)  # [1, S]
    padding = g.op("Unsqueeze", [g.op("Mul", [g.op("Sub", [one, mask_f]), neg]),
                                 g.const("unsq1", np.array([1], np.int64))])  # [1, 1, S]
    text_mask = g.op("Add", [causal, padding])  # [1, S, S]
    image_mask = g.op("ConstantOfShape", [g.op("Concat", [g.const("one_i", np.array([1], np.int64)),
                                                         seq, n_img], axis=0)],
                      value=numpy_helper.from_array(np.array([0.0], np.float32)))  # [1, S, T]
    attn_mask = g.op("Unsqueeze", [g.op("Concat", [image_mask, text_mask], axis=-1),
                                   g.const("unsq1b", np.array([1], np.int64))])  # [1,1,S,T+S]

    split_heads = g.const("split_heads", np.array([0, 0, heads, head_dim], np.int64))
    merge_heads = g.const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = g.const("attn_scale", np.array(1.0 / np.sqrt(head_dim), np.float32))

    def norm(v: str, name: str) -> str:
        gamma = g.const(f"{name}.weight", np.ones(hidden, np.float32))
        beta = g.const(f"{name}.bias", np.zeros(hidden, np.float32))
        return g.op("LayerNormalization", [v, gamma, beta], axis=-1, epsilon=1e-5)

    def heads_of(v: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [v, split_heads])], perm=perm)

    for layer in range(layers):
        p = f"layers.{layer}"
        h = norm(x, f"{p}.attn_norm")
        kv = g.op("Concat", [image, h], axis=1)  # [1, T + S, H]
        q = heads_of(g.op("MatMul", [h, g.weight(f"{p}.q", (hidden, hidden))]), [0, 2, 1, 3])
        k_t = heads_of(g.op("MatMul", [kv, g.weight(f"{p}.k", (hidden, hidden))]), [0, 2, 3, 1])
        v = heads_of(g.op("MatMul", [kv, g.weight(f"{p}.v", (hidden, hidden))]), [0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k_t]), scale]), attn_mask])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])  # [1, nh, S, hd]
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_heads])
        x = g.op("Add", [x, g.op("MatMul", [ctx, g.weight(f"{p}.o", (hidden, hidden))])])
        h = norm(x, f"{p}.mlp_norm")
        up = g.op("MatMul", [h, g.weight(f"{p}.up", (hidden, 4 * hidden))])
        act = g.op("Mul", [up, g.op("Sigmoid", [up])])  # SiLU
        x = g.op("Add", [x, g.op("MatMul", [act, g.weight(f"{p}.down", (4 * hidden, hidden))])])

    final = norm(x, "final_norm")
    logits = g.op("MatMul", [final, g.weight("lm_head", (hidden, vocab))], name="logits")
    g.op("ArgMax", [logits], name="next_token", axis=-1, keepdims=0)

    graph = helper.make_graph(
        g.nodes, "gear_runtime_example_prefill",
        inputs=[
            helper.make_tensor_value_info(ids, TensorProto.INT64, [1, "seq_len"]),
            helper.make_tensor_value_info(mask, TensorProto.INT64, [1, "seq_len"]),
            helper.make_tensor_value_info(pos, TensorProto.INT64, [4, 1, "seq_len"]),
            helper.make_tensor_value_info(img, TensorProto.FLOAT,
                                          ["num_image_tokens", hidden]),
        ],
        outputs=[
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq_len", vocab]),
            helper.make_tensor_value_info("next_token", TensorProto.INT64, [1, "seq_len"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gear_runtime.examples.prefill")
    # the weights go in last, each copied into the model and dropped at once: make_graph and
    # make_model copy every weight (passing them there held several copies of the weights
    # at once while built and saved: docs/benchmarks.md, "Figures behind choices in the code")
    g.inits.reverse()
    while g.inits:
        model.graph.initializer.append(g.inits.pop())
    model.ir_version = 8  # readable by every onnxruntime >= 1.14 (pyproject allows 1.17)
    if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:  # beyond, the checker takes a path
        onnx.checker.check_model(model, full_check=True)
    return model


def example_shapes(seq_len: int, image_tokens: int = IMAGE_TOKENS,
                   hidden: int = HIDDEN) -> dict[str, tuple[int, ...]]:
    """The four inputs' shapes for any sequence length (a gear's or not)."""
    return {"input_ids": (1, seq_len), "attention_mask": (1, seq_len),
            "position_ids": (4, 1, seq_len), "image_embeds": (image_tokens, hidden)}


def inputs_for_shapes(shapes: Mapping[str, Sequence[int]], seed: int = 0,
                      vocab: int = VOCAB) -> dict[str, np.ndarray]:
    """Valid random inputs of the example for the given shapes (seeded, deterministic).

    ids uniform in [0, vocab), a mask of ones, positions 0..S-1 in every section (must stay
    below the model's ``max_positions``), image embeddings standard normal.
    Raises InputError for a name the example does not have.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        shape = tuple(int(d) for d in shape)
        if name == "input_ids":
            out[name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif name == "attention_mask":
            out[name] = np.ones(shape, dtype=np.int64)
        elif name == "position_ids":
            positions = np.arange(shape[-1], dtype=np.int64)
            out[name] = np.ascontiguousarray(np.broadcast_to(positions, shape))
        elif name == "image_embeds":
            out[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            raise InputError(f"input {name!r} is not an input of the prefill example; "
                             f"its inputs are {', '.join(INPUT_NAMES)}")
    return out


def example_inputs(spec: GearSpec, gear: int, seed: int = 0,
                   vocab: int = VOCAB) -> dict[str, np.ndarray]:
    """Valid random inputs for gear ``gear`` of ``spec`` (a GearSpec of the example)."""
    return inputs_for_shapes(spec.shapes(gear), seed=seed, vocab=vocab)


def write_example(directory: str | Path) -> tuple[Path, Path]:
    """Write the default example model and its config into ``directory`` (created if needed).

    Returns ``(model_path, config_path)``: ``prefill.onnx`` and ``config_prefill.ini``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_path = directory / "prefill.onnx"
    config_path = directory / "config_prefill.ini"
    onnx.save(build_prefill_model(), str(model_path))
    config_path.write_text(PREFILL_CONFIG, encoding="utf-8")
    return model_path, config_path


__all__ = [
    "HIDDEN",
    "IMAGE_TOKENS",
    "INPUT_NAMES",
    "OUTPUT_NAMES",
    "PREFILL_CONFIG",
    "SEQ_GEARS",
    "VOCAB",
    "build_prefill_model",
    "example_inputs",
    "example_shapes",
    "inputs_for_shapes",
    "prefill_config",
    "write_example",
]
