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



def _heavy(tmp_path: Path, hybrid: bool = False) -> tuple:
    """A weight-heavy model (4 x 1 MiB weights) with its weights in a data file: the weights
    reach the GPU through ORT's external-data loader, as a real model's do."""
    from models import heavy_model

    original = heavy_model()
    spec = gr.GearSpec.from_atc(input_shape="x:-1,512", dynamic_batch_size="1,4,8")
    path = str(tmp_path / "heavy.gear.onnx")
    gr.compile(original, spec, path, hybrid=hybrid, progress=False, external_data=True)
    return original, spec, path


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_weight_heavy_model_two_executors_replay_their_own_graphs(tmp_path: Path,
                                                                  cuda_graph: bool) -> None:
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path, providers=CUDA, cuda_graph=cuda_graph)
    executors = [model.create_executor(), model.create_executor()]
    for rnd in range(3):  # later rounds replay; each executor has its own graphs
        for g in range(spec.gear_count):
            for k, ex in enumerate(executors):
                feeds = random_inputs(original, spec.shapes(g), seed=100 * rnd + 10 * g + k)
                for a, b in zip(ex.execute(feeds), run_model(original, feeds), strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    for ex in executors:
        ex.close()
    model.close()


def test_a_hybrid_miss_under_cuda_graphs_is_never_captured(tmp_path: Path) -> None:
    original, spec, path = _heavy(tmp_path, hybrid=True)
    ex = gr.load(path, providers=CUDA, cuda_graph=True).create_executor()
    for seed in range(3):  # a captured miss would replay the first inputs
        feeds = random_inputs(original, {"x": (3, 512)}, seed=seed)
        for a, b in zip(ex.execute(feeds), run_model(original, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def test_a_graph_executor_refuses_another_thread(tmp_path: Path) -> None:
    import threading

    original, spec, path = _heavy(tmp_path)
    ex = gr.load(path, providers=CUDA, cuda_graph=True).create_executor()
    feeds = random_inputs(original, spec.shapes(0))
    errors: list[BaseException] = []

    def other() -> None:
        try:
            ex.execute(feeds)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], gr.BackendError)
    assert "thread that created it" in str(errors[0])


def test_an_executor_holds_one_arena_of_its_largest_gear_on_the_gpu(tmp_path: Path) -> None:
    """The inputs' device arena is views of ONE allocation on this ORT (else each gear would
    get buffers of its own: correct, but memory would be the sum over gears)."""
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path, providers=CUDA, cuda_graph=True)
    ex = model.create_executor()
    staging = ex.session._device
    assert staging.inputs.shared, "OrtValue.from_dlpack views do not work on this ORT"
    assert staging.inputs.nbytes == model.layout.total_bytes
    for g in range(spec.gear_count):  # every gear's graph reads the same addresses
        feeds = random_inputs(original, spec.shapes(g), seed=g)
        for a, b in zip(ex.execute(feeds), run_model(original, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def test_pinned_staging_where_the_provider_offers_it(tmp_path: Path) -> None:
    import onnxruntime as ort

    original, spec, path = _heavy(tmp_path)
    ex = gr.load(path, providers=CUDA).create_executor()
    offers = hasattr(ort, "OrtDeviceMemoryType") and any(
        d.ep_name == "CUDAExecutionProvider" for d in ort.get_ep_devices())
    assert ex.session.staging_pinned == offers
    assert ex.session.staging.ctypes.data % 64 == 0
    feeds = random_inputs(original, spec.shapes(1), seed=1)
    for a, b in zip(ex.execute(feeds), run_model(original, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def test_control_flow_under_cuda_graph_runs_without_graphs_and_right(tmp_path: Path) -> None:
    from models import control_flow_model

    original = control_flow_model()
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    path = gr.compile(original, spec, str(tmp_path / "cf.gear.onnx"), progress=False)
    with pytest.warns(RuntimeWarning, match="runs without CUDA graphs"):
        model = gr.load(path, providers=CUDA, cuda_graph=True)
    ex = model.create_executor()
    for seed in range(3):
        feeds = random_inputs(original, spec.shapes(1), seed=seed)
        for a, b in zip(ex.execute(feeds), run_model(original, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_graphs_closed_on_their_thread_are_released(tmp_path: Path) -> None:
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path, providers=CUDA, cuda_graph=True)
    ex = model.create_executor()
    ex.close()
    assert ex.session.graphs_left == 0
    again = model.create_executor()  # new ids, captured anew after the release
    feeds = random_inputs(original, spec.shapes(0))
    for a, b in zip(again.execute(feeds), run_model(original, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_the_seeds_pair_keeps_its_cache_on_the_gpu(tmp_path: Path, cuda_graph: bool) -> None:
    """The prefill's cache bound into the decode's state OrtValues on the GPU, greedy tokens
    close to plain ORT CPU's (TF32 is off; kernels may still differ in the last bits, so the
    logits are compared, not only the tokens)."""
    from gear_runtime.examples import causal_lm
    from gear_runtime.tools import generate

    prefill, gear, decode = generate.build_pair(tmp_path, causal_lm.SMALL)
    dec = gr.load(str(decode), providers=CUDA, cuda_graph=cuda_graph)
    pre = gr.load(str(gear), providers=CUDA)
    dex, pex = dec.create_executor(state=causal_lm.STATE), pre.create_executor()
    ort_pre, ort_dec = generate.ort_sessions(prefill, decode)
    ids = np.arange(3, 14, dtype=np.int64)[None]
    g = generate.covering_gear(ids.shape[1], causal_lm.SMALL.seq_gears)
    logits = pex.execute({"input_ids": ids, "attention_mask": np.ones_like(ids)}, pad=True,
                         out={"present_kv": dex.state["past_kv"]})[0]
    want, cache = ort_pre.run(None, generate.padded_feeds(ids, g))
    np.testing.assert_allclose(logits, want, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(dex.state["past_kv"].numpy(), cache, rtol=1e-3, atol=1e-3)
    token = int(want.argmax())
    for t in range(4):
        feeds = {"input_ids": np.array([[token]], np.int64),
                 "position": np.array([ids.shape[1] + t], np.int64)}
        (got,) = dex.execute(feeds)
        want, cache = ort_dec.run(None, {**feeds, "past_kv": cache})
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        token = int(want.argmax())
