"""A source that uses ONNX Runtime's own default-domain kernels compiles and runs.

onnxruntime-genai's model builder writes SimplifiedLayerNormalization (an RMSNorm) in the
default ONNX domain: ONNX Runtime registers that kernel there, onnx has no schema for it, so
onnx.checker refuses any file holding it ("No Op registered for ..."). The compiler's own
check of its output must not turn that into an "internal error" for a model ORT runs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import gear_runtime as gr


def rms_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [8],
                               np.linspace(0.5, 1.5, 8, dtype=np.float32))
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"],
                            axis=-1, epsilon=1e-6, stash_type=1)
    graph = helper.make_graph([node], "rms", [x], [y], [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_source_with_ort_default_domain_kernels_compiles_and_runs(tmp_path) -> None:
    source = tmp_path / "rms.onnx"
    onnx.save(rms_model(), source)
    spec = gr.GearSpec.from_atc(input_shape="x:-1,8", dynamic_batch_size="1,4")
    out = gr.compile(str(source), spec, str(tmp_path / "rms.gear.onnx"), progress=False)
    ex = gr.load(str(out)).create_executor()
    plain = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        (got,) = ex.execute({"x": x})
        np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0])
