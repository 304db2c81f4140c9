"""Running ONNX Runtime's CUDA device path on host memory, and watching its runs: the helpers
tests/test_backend_ort_device.py and tests/test_device_state.py share."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import gear_runtime as gr


def on_host_device(model: gr.GearModel, graphs: bool = False) -> gr.GearModel:
    """Run ``model``'s device path on the CPU: the executor takes DeviceStaging and the public
    run API as on CUDA, with device ("cpu", 0) in every ORT call; ``graphs``: as under CUDA
    graphs (graph ids per gear)."""
    backend = model.backend_model
    backend.on_cuda, backend.device, backend.cuda_graph = True, ("cpu", 0), graphs
    return model


def graph_ids(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``gpu_graph_id`` of every ``InferenceSession.run_with_iobinding`` from now on, in
    order (the public run API the device path uses; "-1": no graph)."""
    seen: list[str] = []
    real = ort.InferenceSession.run_with_iobinding

    def spy(self, binding, run_options=None):
        seen.append(run_options.get_run_config_entry("gpu_graph_id"))
        return real(self, binding, run_options)

    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", spy)
    return seen
