"""A BERT-like encoder built with ``onnx.helper`` (seeded weights, no download).

The shape of Hugging Face's ``BertModel`` as ``torch.onnx.export`` writes it, with dynamic
batch and sequence axes::

    input_ids       int64   [B, S]
    attention_mask  int64   [B, S]
    ->
    last_hidden_state float32 [B, S, H]
    pooler_output     float32 [B, H]

Word + position embeddings, LayerNorm, ``layers`` post-norm encoder layers (multi-head
self-attention with the additive padding mask, GELU MLP of width ``4 * hidden``), and the
pooler (Tanh of a dense layer over the first token). :func:`bert_base` gives BERT-base's sizes
(110M parameters, 438 MB of float32 weights): what the OpenVINO benchmark runs at realistic
size; the tests use a tiny one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from gear_runtime.examples.prefill import _Graph

INPUT_NAMES: tuple[str, ...] = ("input_ids", "attention_mask")
OUTPUT_NAMES: tuple[str, ...] = ("last_hidden_state", "pooler_output")
OPSET = 17  # LayerNormalization
_NEG = -1.0e4  # additive mask value of a padded key (HF BERT's finfo.min, kept finite)


def build_encoder_model(hidden: int = 64, layers: int = 2, heads: int = 4, vocab: int = 512,
                        max_positions: int = 512, seed: int = 0) -> onnx.ModelProto:
    """The encoder with dynamic ``batch`` and ``seq_len`` axes (see the module doc).

    Deterministic for given arguments; ``hidden`` must be divisible by ``heads``. Valid
    inputs: ids in [0, vocab), at most ``max_positions`` tokens, a mask of 0/1
    (:func:`encoder_inputs`).
    """
    if min(hidden, layers, heads, vocab, max_positions) <= 0 or hidden % heads:
        raise ValueError(f"need positive sizes with hidden % heads == 0, got hidden={hidden}, "
                         f"layers={layers}, heads={heads}, vocab={vocab}")
    g = _Graph(seed)
    head_dim = hidden // heads
    ids, mask = INPUT_NAMES
    i64 = np.int64

    # As torch.onnx.export writes HF's BertModel: positions sliced from a [1, P] buffer by
    # the input's shape, heads split and merged by shapes computed at run time (Shape ->
    # Slice -> Concat -> Reshape). A dynamic-shape runtime evaluates those per run; a static
    # gear folds them away.
    seq = g.op("Shape", [ids], start=1, end=2)  # [1]: S
    zero1 = g.const("zero1", np.array([0], i64))
    positions = g.op("Slice", [g.const("position_ids", np.arange(max_positions, dtype=i64)[None]),
                               zero1, seq, g.const("axis1", np.array([1], i64))])  # [1, S]
    x = g.op("Add", [g.op("Gather", [g.weight("embeddings.word", (vocab, hidden), 0.5), ids]),
                     g.op("Gather", [g.weight("embeddings.position", (max_positions, hidden),
                                              0.1), positions])])

    def norm(v: str, name: str) -> str:
        gamma = g.const(f"{name}.weight", np.ones(hidden, np.float32))
        beta = g.const(f"{name}.bias", np.zeros(hidden, np.float32))
        return g.op("LayerNormalization", [v, gamma, beta], axis=-1, epsilon=1e-12)

    def dense(v: str, name: str, n_in: int, n_out: int) -> str:
        bias = g.const(f"{name}.bias", np.zeros(n_out, np.float32))
        return g.op("Add", [g.op("MatMul", [v, g.weight(f"{name}.weight", (n_in, n_out))]),
                            bias])

    x = norm(x, "embeddings.norm")
    one = g.const("one_f", np.array(1.0, np.float32))
    # [B, 1, 1, S]: 0 where a key is a token, -1e4 where it is padding
    keep = g.op("Cast", [mask], to=TensorProto.FLOAT)
    additive = g.op("Mul", [g.op("Sub", [one, keep]), g.const("neg", np.array(_NEG, np.float32))])
    attn_mask = g.op("Unsqueeze", [additive, g.const("axes12", np.array([1, 2], i64))])
    head_shape = g.const("head_shape", np.array([heads, head_dim], i64))
    hidden_shape = g.const("hidden_shape", np.array([hidden], i64))
    two = g.const("two", np.array([2], i64))
    scale = g.const("attn_scale", np.array(1.0 / np.sqrt(head_dim), np.float32))
    half = g.const("half", np.array(0.5, np.float32))
    inv_sqrt2 = g.const("inv_sqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))

    def leading(v: str) -> str:  # v.size()[:2]: [B, S]
        return g.op("Slice", [g.op("Shape", [v]), zero1, two])

    def heads_of(v: str, perm: list[int]) -> str:
        shape = g.op("Concat", [leading(v), head_shape], axis=0)  # [B, S, nh, hd]
        return g.op("Transpose", [g.op("Reshape", [v, shape])], perm=perm)

    for layer in range(layers):
        p = f"encoder.layer.{layer}"
        q = heads_of(dense(x, f"{p}.attention.query", hidden, hidden), [0, 2, 1, 3])
        k_t = heads_of(dense(x, f"{p}.attention.key", hidden, hidden), [0, 2, 3, 1])
        v = heads_of(dense(x, f"{p}.attention.value", hidden, hidden), [0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k_t]), scale]), attn_mask])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])  # [B, nh, S, hd]
        ctx = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])  # [B, S, nh, hd]
        ctx = g.op("Reshape", [ctx, g.op("Concat", [leading(ctx), hidden_shape], axis=0)])
        x = norm(g.op("Add", [x, dense(ctx, f"{p}.attention.output", hidden, hidden)]),
                 f"{p}.attention.norm")
        up = dense(x, f"{p}.intermediate", hidden, 4 * hidden)
        gelu = g.op("Mul", [g.op("Mul", [up, half]),  # exact GELU, as torch exports it
                            g.op("Add", [one, g.op("Erf", [g.op("Mul", [up, inv_sqrt2])])])])
        x = norm(g.op("Add", [x, dense(gelu, f"{p}.output", 4 * hidden, hidden)]),
                 f"{p}.output.norm")

    g.op("Identity", [x], name="last_hidden_state")
    first = g.op("Gather", [x, g.const("first_token", np.array(0, i64))], axis=1)  # [B, H]
    g.op("Tanh", [dense(first, "pooler", hidden, hidden)], name="pooler_output")

    graph = helper.make_graph(
        g.nodes, "gear_runtime_example_encoder",
        inputs=[helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq_len"])
                for n in INPUT_NAMES],
        outputs=[helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                               ["batch", "seq_len", hidden]),
                 helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT,
                                               ["batch", hidden])],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gear_runtime.examples.encoder")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def bert_base(seed: int = 0) -> onnx.ModelProto:
    """The encoder at BERT-base's sizes: hidden 768, 12 layers, 12 heads, vocab 30522, 512
    positions (109.5M parameters, 438 MB float32)."""
    return build_encoder_model(hidden=768, layers=12, heads=12, vocab=30522,
                               max_positions=512, seed=seed)


def encoder_inputs(shapes: Mapping[str, Sequence[int]], seed: int = 0, vocab: int = 512,
                   padded: int = 0) -> dict[str, np.ndarray]:
    """Valid inputs for the given ``{name: shape}`` (seeded): ids in [0, vocab), a mask of
    ones whose last ``padded`` positions of every row are 0."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in shapes["input_ids"])
    mask = np.ones(tuple(int(d) for d in shapes["attention_mask"]), np.int64)
    if padded:
        mask[..., -padded:] = 0
    return {"input_ids": rng.integers(0, vocab, size=shape, dtype=np.int64),
            "attention_mask": mask}


__all__ = ["INPUT_NAMES", "OUTPUT_NAMES", "bert_base", "build_encoder_model", "encoder_inputs"]
