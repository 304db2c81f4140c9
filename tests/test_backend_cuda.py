"""ONNX Runtime on CUDA: merged device staging and one CUDA graph per gear.

Needs onnxruntime-gpu and an NVIDIA GPU; skipped cleanly otherwise (CI has neither).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from models import CONV_BATCH_SPEC, conv_model, random_inputs, run_model

import gear_runtime as gr
from gear_runtime.backends.onnxruntime import cuda_available, gpu_present

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (cuda_available() and gpu_present()),
                       reason="needs onnxruntime-gpu and an NVIDIA GPU"),
]

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_every_gear_on_cuda_equals_the_cpu_reference(tmp_path: Path, cuda_graph: bool) -> None:
    original, spec = conv_model(), gr.GearSpec.from_atc(**CONV_BATCH_SPEC)
    path = str(tmp_path / "conv.gear.onnx")
    gr.compile(original, spec, path, progress=False)
    ex = gr.load(path, providers=CUDA, cuda_graph=cuda_graph).create_executor()
    for _ in range(2):  # the second pass replays the captured graphs
        for g in range(spec.gear_count):
            feeds = random_inputs(original, spec.shapes(g), seed=g)
            got = ex.execute(feeds)
            for a, b in zip(got, run_model(original, feeds), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)

