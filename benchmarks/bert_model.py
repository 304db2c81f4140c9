"""A BERT-shaped encoder built with onnx.helper (no download, random weights): token and
position embeddings, LayerNorm, ``layers`` x (multi-head self-attention with the attention
mask, residual + LayerNorm, GELU feed-forward, residual + LayerNorm). Inputs ``input_ids`` and
``attention_mask`` int64 [N, seq]; output ``last_hidden_state`` float32 [N, seq, hidden].

BERT-base's shape is the default (12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522:
~110 M parameters, 0.44 GB); ``bert_tiny`` is BERT-tiny's (2 layers, hidden 128, 2 heads).
It computes what BERT computes, with made-up weights: for throughput and latency, not answers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def bert_model(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int | None = None,
               vocab: int = 30522, seq: int = 128, seed: int = 0) -> onnx.ModelProto:
    """The encoder (see the module docstring); batch axis ``N`` symbolic, ``seq`` fixed."""
    ffn = ffn or 4 * hidden
    head = hidden // heads
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, *shape: int, scale: float = 0.02) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name: str, values, dtype=np.int64) -> str:
        inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def layer_norm(x: str, prefix: str) -> str:
        inits.append(numpy_helper.from_array(np.ones(hidden, np.float32), f"{prefix}.g"))
        inits.append(numpy_helper.from_array(np.zeros(hidden, np.float32), f"{prefix}.b"))
        return node("LayerNormalization", [x, f"{prefix}.g", f"{prefix}.b"], f"{prefix}.out",
                    axis=-1, epsilon=1e-12)

    def dense(x: str, prefix: str, n_in: int, n_out: int) -> str:
        y = node("MatMul", [x, weight(f"{prefix}.w", n_in, n_out)], f"{prefix}.mm")
        return node("Add", [y, weight(f"{prefix}.bias", n_out, scale=0.0)], f"{prefix}.out")

    const("heads_shape", [0, seq, heads, head])
    const("merge_shape", [0, seq, hidden])
    const("mask_axes", [1, 2])
    inits.append(numpy_helper.from_array(np.array(-10000.0, np.float32), "mask_neg"))
    inits.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(head), np.float32), "scale"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(2), np.float32), "rsqrt2"))
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    words = node("Gather", [weight("word_embeddings", vocab, hidden), "input_ids"], "words")
    x = node("Add", [words, weight("position_embeddings", 1, seq, hidden)], "embedded")
    x = layer_norm(x, "emb_ln")
    # mask: (1 - mask) * -10000, broadcast to [N, 1, 1, seq]
    m = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    m = node("Sub", ["one", m], "mask_inv")
    m = node("Mul", [m, "mask_neg"], "mask_add")
    m = node("Unsqueeze", [m, "mask_axes"], "mask_b")
    for i in range(layers):
        p = f"l{i}"
        q, k, v = (node("Transpose", [node("Reshape", [dense(x, f"{p}.{n}", hidden, hidden),
                                                       "heads_shape"], f"{p}.{n}.r")],
                        f"{p}.{n}.t", perm=perm)
                   for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]),
                                   ("v", [0, 2, 1, 3])))
        scores = node("Mul", [node("MatMul", [q, k], f"{p}.qk"), "scale"], f"{p}.scaled")
        probs = node("Softmax", [node("Add", [scores, m], f"{p}.masked")], f"{p}.probs",
                     axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"{p}.ctx")], f"{p}.ctx.t",
                   perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "merge_shape"], f"{p}.ctx.m")
        x = layer_norm(node("Add", [dense(ctx, f"{p}.o", hidden, hidden), x], f"{p}.res1"),
                       f"{p}.ln1")
        h = dense(x, f"{p}.ffn1", hidden, ffn)
        # GELU(h) = 0.5 h (1 + erf(h / sqrt 2))
        erf = node("Erf", [node("Mul", [h, "rsqrt2"], f"{p}.gs")], f"{p}.erf")
        gelu = node("Mul", [node("Mul", [h, "half"], f"{p}.gh"),
                            node("Add", [erf, "one"], f"{p}.g1")], f"{p}.gelu")
        x = layer_norm(node("Add", [dense(gelu, f"{p}.ffn2", ffn, hidden), x], f"{p}.res2"),
                       f"{p}.ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="out"))
    graph = helper.make_graph(
        nodes, "bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", seq])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["N", seq, hidden])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def bert_tiny(seq: int = 128, seed: int = 0) -> onnx.ModelProto:
    """BERT-tiny's shape: 2 layers, hidden 128, 2 heads, FFN 512 (~4.4 M parameters)."""
    return bert_model(layers=2, hidden=128, heads=2, seq=seq, seed=seed)
