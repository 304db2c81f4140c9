"""Small ONNX models built with ``onnx.helper`` for the tests (no downloads, seeded weights).

Every builder returns a fresh, checked ``onnx.ModelProto`` whose dynamic axes are symbolic
(``dim_param``), the way exporters write them, plus the matching ATC-style spec strings where
the model has a natural one (``*_SPEC`` constants below). Weights are float32, drawn from a
seeded ``numpy.random.default_rng`` so two calls with the same arguments give the same model.

Also here, used across test files: :data:`CASES` (every builder with the spec the tests
compile it for), :func:`random_inputs` (seeded random feeds of a given shape set),
:func:`run_model` (run a ModelProto on ONNX Runtime's CPU provider) and :func:`assert_same`
(outputs equal to a reference run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: ai.onnx opset of every builder unless told otherwise. 17 keeps ``axes`` an attribute of
#: ReduceMean/ReduceMin (inputs only from 18) while ReduceSum already takes an input: the
#: compiler must get both forms right.
OPSET = 17
IR_VERSION = 8

#: ATC arguments matching the builders (``GearSpec.from_atc(**CONV_BATCH_SPEC)``).
CONV_BATCH_SPEC = {"input_shape": "data:-1,3,32,32", "dynamic_batch_size": "1,4,8"}
CONV_IMAGE_SPEC = {"input_shape": "data:1,3,-1,-1", "dynamic_image_size": "16,16;32,32;48,64"}
PREFILL_SPEC = {
    "input_shape": "input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,64",
    "dynamic_dims": "8,8,8,4;16,16,16,4;32,32,32,4;64,64,64,4",
}
RESHAPE_SPEC = {"input_shape": "x:-1,-1,8", "dynamic_dims": "1,4;2,8;4,16"}
HEAVY_SPEC = {"input_shape": "x:-1,512", "dynamic_batch_size": "1,2,4,8"}


def _weight(rng: np.random.Generator, name: str, shape: Sequence[int],
            scale: float = 0.1) -> TensorProto:
    """A seeded float32 initializer."""
    data = (rng.standard_normal(shape) * scale).astype(np.float32)
    return numpy_helper.from_array(data, name)


def _const(name: str, values: Sequence[int] | np.ndarray, dtype: type = np.int64) -> TensorProto:
    """A small constant initializer (shape tensors, axes)."""
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _finish(graph: onnx.GraphProto, opset: int = OPSET) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="gear_runtime.tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def conv_model(channels: int = 3, hidden: int = 8, classes: int = 10,
               seed: int = 0, opset: int = OPSET) -> onnx.ModelProto:
    """Conv(3x3, pad 1) + Relu + GlobalAveragePool + Flatten + Gemm.

    Input ``data`` float32 [N, channels, H, W] with N, H, W symbolic; output ``logits``
    float32 [N, classes]. Fits both batch mode (:data:`CONV_BATCH_SPEC`) and image-size mode
    (:data:`CONV_IMAGE_SPEC`). Valid for every ``opset`` from 11 on.
    """
    rng = np.random.default_rng(seed)
    inits = [
        _weight(rng, "conv.weight", (hidden, channels, 3, 3)),
        _weight(rng, "conv.bias", (hidden,)),
        _weight(rng, "fc.weight", (classes, hidden)),
        _weight(rng, "fc.bias", (classes,)),
    ]
    nodes = [
        helper.make_node("Conv", ["data", "conv.weight", "conv.bias"], ["conv_out"],
                         name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu_out"], ["pool_out"], name="pool"),
        helper.make_node("Flatten", ["pool_out"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="fc",
                         transB=1),
    ]
    graph = helper.make_graph(
        nodes, "conv_model",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", channels, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializer=inits)
    return _finish(graph, opset)


def prefill_model(hidden: int = 64, vocab: int = 128, max_positions: int = 256,
                  seed: int = 0) -> onnx.ModelProto:
    """A prefill-like block with the four inputs of a Qwen prefill service's config.

    Inputs: ``input_ids`` int64 [1, S], ``attention_mask`` int64 [1, S], ``position_ids`` int64
    [4, 1, S] (4 rope sections), ``image_embeds`` float32 [T, hidden]. Token and position
    embeddings (Gather; the 4 position sections averaged) are concatenated with the image
    embeddings along the sequence (L = S + T), then one single-head attention (MatMul,
    Softmax, additive mask from ``attention_mask`` with ones for the image rows), a residual
    and an LM head. Outputs: ``logits`` float32 [1, L, vocab] and ``next_token`` int64 [1, L]
    (ArgMax of the logits: an integer output, compared exactly).
    Spec: :data:`PREFILL_SPEC` (hidden must be 64 for it).
    """
    rng = np.random.default_rng(seed)
    h = hidden
    inits = [
        _weight(rng, "embed.weight", (vocab, h), 0.5),
        _weight(rng, "pos.weight", (max_positions, h), 0.5),
        _weight(rng, "q.weight", (h, h)),
        _weight(rng, "k.weight", (h, h)),
        _weight(rng, "v.weight", (h, h)),
        _weight(rng, "o.weight", (h, h)),
        _weight(rng, "lm_head.weight", (h, vocab)),
        _const("one_row", [1]),
        _const("axes0", [0]),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(h), np.float32), "scale"),
        numpy_helper.from_array(np.array(1.0, np.float32), "f_one"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "neg_big"),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["embed.weight", "input_ids"], ["tok"], name="embed"),           # [1,S,h]
        n("Gather", ["pos.weight", "position_ids"], ["pos4"], name="pos_embed"),     # [4,1,S,h]
        n("ReduceMean", ["pos4"], ["pos"], name="pos_mean", axes=[0], keepdims=0),   # [1,S,h]
        n("Add", ["tok", "pos"], ["text"], name="text_add"),
        n("Unsqueeze", ["image_embeds", "axes0"], ["img"], name="img_unsq"),         # [1,T,h]
        n("Concat", ["text", "img"], ["x"], name="seq_concat", axis=1),              # [1,L,h]
        n("MatMul", ["x", "q.weight"], ["q"], name="q_proj"),
        n("MatMul", ["x", "k.weight"], ["k"], name="k_proj"),
        n("MatMul", ["x", "v.weight"], ["v"], name="v_proj"),
        n("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["qk"], name="qk"),                                 # [1,L,L]
        n("Mul", ["qk", "scale"], ["scores"], name="scale_mul"),
        # mask: [attention_mask, ones(T)] -> (1 - m) * -1e4, broadcast over query rows
        n("Shape", ["image_embeds"], ["t_len"], name="t_shape", start=0, end=1),     # [T]
        n("Concat", ["one_row", "t_len"], ["ones_shape"], name="ones_shape", axis=0),
        n("ConstantOfShape", ["ones_shape"], ["img_mask"], name="img_mask",
          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),            # [1,T]
        n("Cast", ["attention_mask"], ["text_mask"], name="mask_cast", to=TensorProto.FLOAT),
        n("Concat", ["text_mask", "img_mask"], ["mask"], name="mask_concat", axis=1),  # [1,L]
        n("Sub", ["f_one", "mask"], ["inv_mask"], name="inv_mask"),
        n("Mul", ["inv_mask", "neg_big"], ["bias"], name="mask_bias"),
        n("Unsqueeze", ["bias", "one_row"], ["bias3"], name="bias_unsq"),            # [1,1,L]
        n("Add", ["scores", "bias3"], ["masked"], name="mask_add"),
        n("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        n("MatMul", ["probs", "v"], ["ctx"], name="attn_v"),
        n("MatMul", ["ctx", "o.weight"], ["attn_out"], name="o_proj"),
        n("Add", ["attn_out", "x"], ["hidden_states"], name="residual"),
        n("MatMul", ["hidden_states", "lm_head.weight"], ["logits"], name="lm_head"),
        n("ArgMax", ["logits"], ["next_token"], name="argmax", axis=-1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "prefill_model",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "S"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "S"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, [4, 1, "S"]),
         helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["T", h])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "L", vocab]),
         helper.make_tensor_value_info("next_token", TensorProto.INT64, [1, "L"])],
        initializer=inits)
    return _finish(graph)


def reshape_model(depth: int = 8, out: int = 16, seed: int = 0) -> onnx.ModelProto:
    """An output shape that only becomes static once the dims are fixed.

    Input ``x`` float32 [B, S, depth]; ``Shape -> Gather -> Mul/Concat -> Reshape`` flattens it
    to [B*S, depth], a MatMul maps it to [B*S, out], and a second computed Reshape gives the
    output ``y`` float32 [B, S*out]. Spec: :data:`RESHAPE_SPEC` (depth 8).
    """
    rng = np.random.default_rng(seed)
    inits = [
        _weight(rng, "w", (depth, out)),
        _const("i0", [0]),
        _const("i1", [1]),
        _const("depth", [depth]),
        _const("out", [out]),
    ]
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["x_shape"], name="shape"),
        n("Gather", ["x_shape", "i0"], ["b"], name="get_b", axis=0),
        n("Gather", ["x_shape", "i1"], ["s"], name="get_s", axis=0),
        n("Mul", ["b", "s"], ["bs"], name="bs"),
        n("Concat", ["bs", "depth"], ["flat_shape"], name="flat_shape", axis=0),
        n("Reshape", ["x", "flat_shape"], ["flat"], name="flatten"),
        n("MatMul", ["flat", "w"], ["proj"], name="proj"),
        n("Mul", ["s", "out"], ["s_out"], name="s_out"),
        n("Concat", ["b", "s_out"], ["y_shape"], name="y_shape", axis=0),
        n("Reshape", ["proj", "y_shape"], ["y"], name="unflatten"),
    ]
    graph = helper.make_graph(
        nodes, "reshape_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", depth])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "Y"])],
        initializer=inits)
    return _finish(graph)


def heavy_model(width: int = 512, layers: int = 4, seed: int = 0) -> onnx.ModelProto:
    """Weight-heavy MLP: ``layers`` MatMuls of [width, width] float32 with Relu between.

    4 x 512 x 512 x 4 bytes = 4 MiB of weights by default. Input ``x`` float32 [N, width],
    output ``y`` float32 [N, width]. Spec: :data:`HEAVY_SPEC`.
    """
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, f"w{k}", (width, width), 1.0 / np.sqrt(width)) for k in range(layers)]
    nodes = []
    cur = "x"
    for k in range(layers):
        nxt = "y" if k == layers - 1 else f"h{k}"
        mm = nxt if k == layers - 1 else f"mm{k}"
        nodes.append(helper.make_node("MatMul", [cur, f"w{k}"], [mm], name=f"matmul{k}"))
        if k != layers - 1:
            nodes.append(helper.make_node("Relu", [mm], [nxt], name=f"relu{k}"))
        cur = nxt
    graph = helper.make_graph(
        nodes, "heavy_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        initializer=inits)
    return _finish(graph)


def sqrt_slice_model() -> onnx.ModelProto:
    """An output shape static shape inference cannot find: ``y = x[:, :floor(sqrt(S))]``.

    Input ``x`` float32 [N, S]; the slice end goes through Cast/Sqrt/Floor, which ONNX data
    propagation does not follow, so the compiler must run the branch to learn ``y``'s shape
    [N, floor(sqrt(S))]. No weights, only two index constants.
    """
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["x_shape"], name="shape"),
        n("Gather", ["x_shape", "one"], ["s"], name="get_s", axis=0),
        n("Cast", ["s"], ["s_f"], name="to_float", to=TensorProto.FLOAT),
        n("Sqrt", ["s_f"], ["root"], name="sqrt"),
        n("Floor", ["root"], ["root_floor"], name="floor"),
        n("Cast", ["root_floor"], ["k"], name="to_int", to=TensorProto.INT64),
        n("Slice", ["x", "zero", "k", "one"], ["y"], name="slice"),
    ]
    graph = helper.make_graph(
        nodes, "sqrt_slice_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "K"])],
        initializer=[_const("one", [1]), _const("zero", [0])])
    return _finish(graph)


def custom_op_model() -> onnx.ModelProto:
    """``y = Foo(x)`` with ``Foo`` from an unknown domain: neither shape inference nor ONNX
    Runtime can give ``y``'s shape (the compiler must refuse it). Input ``x`` float32 [N, 4]."""
    node = helper.make_node("Foo", ["x"], ["y"], name="foo", domain="com.example.unknown")
    graph = helper.make_graph(
        [node], "custom_op_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", OPSET), helper.make_opsetid("com.example.unknown", 1)])
    model.ir_version = IR_VERSION
    return model


def nonzero_model(width: int = 4) -> onnx.ModelProto:
    """An output shape that depends on the input VALUES: ``y = NonZero(x)``, int64 [2, K] with
    K the count of non-zero entries of ``x`` float32 [N, width] (no gear can fix it: the
    compiler must refuse it)."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["y"], name="nonzero")], "nonzero_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "K"])])
    return _finish(graph)


def control_flow_model(width: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A model with its own ``If`` whose branches read outer values (an intermediate ``h``
    and the weight ``w``): renaming a branch must follow references into subgraphs.

    Input ``x`` float32 [N, width]; ``h = Relu(x)``; if ``sum(x) > 0`` then ``y = h * w``
    else ``y = h + w``. Output ``y`` float32 [N, width].
    """
    rng = np.random.default_rng(seed)
    n = helper.make_node
    then_g = helper.make_graph([n("Mul", ["h", "w"], ["t_out"], name="then_mul")], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([n("Add", ["h", "w"], ["e_out"], name="else_add")], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [
        n("Relu", ["x"], ["h"], name="relu"),
        n("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        n("Greater", ["total", "zero_f"], ["positive"], name="positive"),
        n("If", ["positive"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes, "control_flow_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        initializer=[_weight(rng, "w", (width,), 1.0),
                     numpy_helper.from_array(np.array(0.0, np.float32), "zero_f")])
    return _finish(graph)


def passthrough_model(width: int = 4, seed: int = 0) -> onnx.ModelProto:
    """Outputs that are not computed: ``x`` itself and the weight ``w`` next to ``y = Relu(x)``.

    Input ``x`` float32 [N, width]; outputs ``y`` [N, width], ``x`` [N, width], ``w`` [width].
    """
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "passthrough_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [width])],
        initializer=[_weight(rng, "w", (width,), 1.0)])
    return _finish(graph)


def sum_model(width: int = 4) -> onnx.ModelProto:
    """A scalar output: ``total = sum(x)`` (rank 0) next to ``y = Relu(x)``.

    Input ``x`` float32 [N, width]; outputs ``y`` [N, width] and ``total`` [] (a scalar cannot
    be empty, so a sink miss returns it with shape [0]).
    """
    n = helper.make_node
    graph = helper.make_graph(
        [n("Relu", ["x"], ["y"], name="relu"), n("ReduceSum", ["x"], ["total"], name="sum",
                                                keepdims=0)],
        "sum_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])])
    return _finish(graph)


def two_batch_model(width: int = 4) -> onnx.ModelProto:
    """Two inputs sharing the batch axis: ``y = a + b``, ``a`` and ``b`` float32 [N, width].

    Batch mode spec ``a:-1,4;b:-1,4``: both -1 take the one batch value, so inputs whose batch
    sizes disagree match no gear.
    """
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")], "two_batch_model",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", width]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])])
    return _finish(graph)


#: name -> (builder, ATC arguments): the models whose every gear the tests compile and check
#: against the original (a test file picks the names it runs).
CASES: dict[str, tuple[Callable[[], onnx.ModelProto], dict[str, str]]] = {
    "conv_batch": (conv_model, CONV_BATCH_SPEC),
    "conv_image": (conv_model, CONV_IMAGE_SPEC),
    "prefill": (prefill_model, PREFILL_SPEC),
    "reshape": (reshape_model, RESHAPE_SPEC),
    "heavy": (heavy_model, HEAVY_SPEC),
    "control_flow": (control_flow_model, {"input_shape": "x:-1,4", "dynamic_batch_size": "1,3"}),
    "sqrt_slice": (sqrt_slice_model, {"input_shape": "x:2,-1", "dynamic_dims": "4;9;17"}),
    "passthrough": (passthrough_model, {"input_shape": "x:-1,4", "dynamic_batch_size": "2,5"}),
}


def random_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                  seed: int = 0, int_high: int = 8) -> dict[str, np.ndarray]:
    """Seeded random feeds for ``model``'s inputs with the given static shapes.

    Floats: standard normal. Integers: uniform in [0, int_high) (keep it below every table
    the ints index: vocab, positions). Bools: random. The dtype comes from the model input.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = tuple(shapes[vi.name])
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[vi.name] = rng.integers(0, int_high, shape).astype(dtype)
    return feeds


def run_model(model: onnx.ModelProto | bytes, feeds: Mapping[str, np.ndarray],
              output_names: Sequence[str] | None = None,
              folder: str | None = None) -> list[np.ndarray]:
    """Run ``model`` once on ONNX Runtime's CPU provider and return its outputs; external
    data is resolved against ``folder``."""
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else model.SerializeToString()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if folder is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                      folder)
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    return sess.run(list(output_names) if output_names else None, dict(feeds))


def assert_same(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> None:
    """Same count, shapes and dtypes; exact for integers, allclose 1e-5 for floats."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)
