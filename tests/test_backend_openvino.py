"""The OpenVINO backend, for real (OpenVINO's CPU plugin, no double): every gear equal to
ONNX Runtime on the source model, padding, hybrid misses, errors, concurrent executors, the
weights mapped once and packed once, and the model cache."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import CASES, assert_same, heavy_model, random_inputs, run_model

import gear_runtime as gr
from gear_runtime.examples.encoder import build_encoder_model, encoder_inputs

ov = pytest.importorskip("openvino", reason="the OpenVINO tests need the [openvino] extra")
from gear_runtime.backends import openvino as ovb  # noqa: E402

ENCODER_SEQ_SPEC = {"input_shape": "input_ids:1,-1;attention_mask:1,-1",
                    "dynamic_dims": "8,8;16,16;32,32"}
ENCODER_BATCH_SPEC = {"input_shape": "input_ids:-1,16;attention_mask:-1,16",
                      "dynamic_batch_size": "1,2,4"}
MODES = [pytest.param(True, "source", id="shared-source"),
         pytest.param(False, "source", id="per_gear-source"),
         pytest.param(True, "branches", id="shared-branches"),
         pytest.param(False, "branches", id="per_gear-branches")]


def compiled(tmp_path: Path, model: onnx.ModelProto | str, spec_args: dict, name: str,
             **kw: object) -> tuple[gr.GearSpec, str]:
    spec = gr.GearSpec.from_atc(**spec_args)
    out = str(tmp_path / f"{name}.gear.onnx")
    gr.compile(model, spec, out, progress=False, **kw)
    return spec, out


def load(path: str, **kw: object) -> gr.GearModel:
    return gr.load(path, backend="openvino", progress=False, **kw)


@pytest.mark.parametrize("share, graphs", [MODES[0], MODES[3]])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_gear_equals_onnxruntime_on_the_source(tmp_path: Path, case: str, share: bool,
                                                     graphs: str) -> None:
    build, args = CASES[case]
    source = build()
    spec, path = compiled(tmp_path, source, args, case)
    model = load(path, share_weights=share, graphs=graphs)
    assert model.backend == "openvino" and model.gears == list(spec.gears)
    ex = model.create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(source, spec.shapes(g), seed=g)
        assert_same(ex.execute(feeds), run_model(source, feeds))
        assert ex.last_gear == g
        assert_same(ex.execute(feeds, copy=False), run_model(source, feeds))


@pytest.mark.parametrize("share, graphs", MODES[:2])
@pytest.mark.parametrize("spec_args", [ENCODER_SEQ_SPEC, ENCODER_BATCH_SPEC],
                         ids=["seq", "batch"])
def test_bert_like_encoder_with_weights_in_a_data_file(tmp_path: Path, spec_args: dict,
                                                       share: bool, graphs: str) -> None:
    source = build_encoder_model(hidden=64, layers=2, heads=4, vocab=256)
    spec, path = compiled(tmp_path, source, spec_args, "encoder", external_data=True)
    assert os.path.isfile(path + ".data")
    model = load(path, share_weights=share, graphs=graphs)
    ex = model.create_executor()
    for g in range(spec.gear_count):
        feeds = encoder_inputs(spec.shapes(g), seed=g, vocab=256, padded=2)
        got, want = ex.execute(feeds), run_model(source, feeds)
        assert [o.shape for o in got] == [model.output_shape(g, k) for k in range(2)]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_external_weights_are_one_map_of_the_data_file(tmp_path: Path) -> None:
    """Every gear's weights point into ONE read-only map of the data file (no copy)."""
    source = build_encoder_model(hidden=64, layers=2, heads=4, vocab=256)
    _, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder", external_data=True)
    gear_file = gr.gearfile.reader.read_gear_file(path)
    maps = ovb.WeightMaps(gear_file)
    core = ov.Core()
    graphs = [ovb.to_ov_model(ov, gear_file, gear_file.branches[g], maps, core)
              for g in range(gear_file.gear_count)]
    name = "embeddings.word"
    assert name in gear_file.external
    addresses = set()
    for graph in graphs:
        (const,) = [op for op in graph.get_ops() if op.get_friendly_name() == name]
        addresses.add(const.data.ctypes.data)
        assert not const.data.flags.writeable  # the map itself, read-only
    assert addresses == {maps.array(name).ctypes.data}


def test_padding_runs_the_covering_gear_and_trims(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder")
    ex = load(path).create_executor(pad_values={"input_ids": 0, "attention_mask": 0})
    feeds = encoder_inputs({"input_ids": (1, 11), "attention_mask": (1, 11)}, vocab=128)
    out = ex.execute(feeds, pad=True)
    assert ex.last_gear == 1 and ex.last_request_dims == (11, 11)
    assert out[0].shape == (1, 11, 32)
    # masked padding keys change nothing: the trimmed states equal the source at size 11
    np.testing.assert_allclose(out[0], run_model(source, feeds)[0], rtol=1e-5, atol=1e-5)


def test_hybrid_miss_runs_the_dynamic_graph(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder", hybrid=True)
    model = load(path)
    assert model.backend_model.dynamic is not None
    ex = model.create_executor()
    feeds = encoder_inputs({"input_ids": (1, 11), "attention_mask": (1, 11)}, vocab=128)
    out = ex.execute(feeds)
    assert ex.last_gear is None and ex.last_dynamic_dims == (11, 11)
    for a, b in zip(out, run_model(source, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_shared_weights_is_one_compiled_model_routed_by_the_gear_index(tmp_path: Path) -> None:
    _, path = compiled(tmp_path, heavy_model(), CASES["heavy"][1], "heavy")
    shared, per_gear = load(path).backend_model, load(path, share_weights=False).backend_model
    assert shared.gears is not None and shared.per_gear == []
    names = {i.get_any_name() for i in shared.gears.inputs}
    assert ovb.GEAR_INDEX in names and {f"x:g{g}" for g in range(4)} <= names
    assert per_gear.gears is None and len(per_gear.per_gear) == 4
    for compiled_gear, n in zip(per_gear.per_gear, (1, 2, 4, 8), strict=True):
        assert compiled_gear.inputs[0].get_partial_shape().is_static
        assert compiled_gear.inputs[0].get_shape()[0] == n


_RSS_CHILD = """
import json, sys
import numpy as np
import gear_runtime as gr
import openvino as ov
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
path, what = sys.argv[1], sys.argv[2]
before = rss()
if what == "dynamic":
    core = ov.Core()
    compiled = core.compile_model(core.read_model(sys.argv[3]), "CPU", {"INFERENCE_NUM_THREADS": 1})
    for n in (1, 2, 4, 8):
        compiled({"x": np.ones((n, 2048), np.float32)})
else:
    model = gr.load(path, backend="openvino", progress=False, num_threads=1,
                    share_weights=what == "shared")
    ex = model.create_executor()
    for n in (1, 2, 4, 8):
        ex.execute({"x": np.ones((n, 2048), np.float32)})
print(json.dumps(rss() - before))
"""


@pytest.mark.slow
def test_four_gears_hold_the_weights_of_one_dynamic_model(tmp_path: Path) -> None:
    """RSS in fresh processes, 64 MB of weights: four shared gears within 1.5x of ONE
    OpenVINO dynamic model; four separately compiled gears pack the weights four times."""
    source = heavy_model(width=2048, layers=4)
    src = str(tmp_path / "heavy.onnx")
    onnx.save(source, src, save_as_external_data=True, location="heavy.onnx.data")
    spec_args = {"input_shape": "x:-1,2048", "dynamic_batch_size": "1,2,4,8"}
    _, path = compiled(tmp_path, src, spec_args, "heavy", external_data=True)

    def rss(what: str) -> int:
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, path, what, src],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    dynamic, shared, per_gear = rss("dynamic"), rss("shared"), rss("per_gear")
    weights = 4 * 2048 * 2048 * 4
    assert shared <= 1.5 * dynamic, (shared, dynamic)
    assert per_gear >= shared + 2 * weights, (per_gear, shared)  # 3 more packed copies


def test_concurrent_executors_each_get_their_own_gear(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder")
    model = load(path)
    feeds = [encoder_inputs(spec.shapes(g), seed=g, vocab=128) for g in range(spec.gear_count)]
    want = [run_model(source, f) for f in feeds]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            ex = model.create_executor()
            order = np.random.default_rng(seed).integers(0, spec.gear_count, 40)
            for g in order:
                out = ex.execute(feeds[g])
                assert ex.last_gear == g
                np.testing.assert_allclose(out[0], want[g][0], rtol=1e-5, atol=1e-5)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_miss_and_bad_inputs_are_the_executors_errors(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder")
    ex = load(path).create_executor()
    with pytest.raises(gr.GearMismatchError) as info:
        ex.execute(encoder_inputs({"input_ids": (1, 9), "attention_mask": (1, 9)}))
    assert info.value.code == "145013" and "(8, 8)" in str(info.value)
    bad = encoder_inputs(spec.shapes(0))
    bad["input_ids"] = bad["input_ids"].astype(np.int32)
    with pytest.raises(gr.InputError, match="int32"):
        ex.execute(bad)


def test_options_and_devices_are_checked(tmp_path: Path) -> None:
    _, path = compiled(tmp_path, heavy_model(), CASES["heavy"][1], "heavy")
    with pytest.raises(gr.BackendError, match="no device 'NPU'.*available: CPU"):
        load(path, device="NPU")
    with pytest.raises(gr.InputError, match="graphs must be one of source, branches"):
        load(path, graphs="case")
    with pytest.raises(gr.InputError, match="num_threads must be an integer >= 1"):
        load(path, num_threads=0)
    with pytest.raises(gr.InputError, match="performance_hint"):
        load(path, performance_hint="FAST")
    with pytest.raises(gr.InputError, match="does not take these options"):
        load(path, providers=["CPUExecutionProvider"])


def test_a_gear_openvino_shapes_differently_is_refused_at_load(tmp_path: Path) -> None:
    _, path = compiled(tmp_path, heavy_model(), CASES["heavy"][1], "heavy")
    gear_file = gr.gearfile.reader.read_gear_file(path)
    shapes = [list(s) for s in gear_file.output_shapes]
    shapes[2] = [(3, 512)]
    wrong = dataclasses.replace(gear_file, output_shapes=tuple(tuple(s) for s in shapes))
    with pytest.raises(gr.BackendError, match=r"output 'y' of gear 2 \(4,\) as \[4,512\], "
                                              r"the gear map says \(3, 512\)"):
        ovb.OvModel(wrong, device="CPU", share_weights=True, graphs="source", num_threads=None,
                    performance_hint="LATENCY", cache_dir=None, config=None, progress=False)


def test_a_sink_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    _, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder", sink=True)
    with pytest.raises(gr.BackendError, match="without sink=True"):
        load(path)


def test_closed_model_and_executor(tmp_path: Path) -> None:
    _, path = compiled(tmp_path, heavy_model(), CASES["heavy"][1], "heavy")
    model = load(path)
    ex = model.create_executor()
    model.close()
    with pytest.raises(gr.ClosedError):
        ex.execute({"x": np.ones((1, 512), np.float32)})
    with pytest.raises(gr.ClosedError):
        model.create_executor()


def test_the_model_cache_makes_a_second_load_an_import(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder", external_data=True)
    cache = tmp_path / "cache"
    first = load(path, cache_dir=str(cache)).backend_model
    assert first.loaded_from_cache == [False] and any(cache.iterdir())
    second = load(path, cache_dir=str(cache))
    assert second.backend_model.loaded_from_cache == [True]
    feeds = encoder_inputs(spec.shapes(2), vocab=128)
    np.testing.assert_allclose(second.create_executor().execute(feeds)[0],
                               run_model(source, feeds)[0], rtol=1e-5, atol=1e-5)


def test_naive_run_is_openvinos_dynamic_model(tmp_path: Path) -> None:
    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder")
    backend = load(path).backend_model
    assert backend.has_naive_run and backend.dynamic is None  # compiled on first use
    feeds = encoder_inputs({"input_ids": (1, 11), "attention_mask": (1, 11)}, vocab=128)
    out = backend.naive_run(feeds)
    assert backend.dynamic is not None
    assert not backend.dynamic.inputs[0].get_partial_shape().is_static
    np.testing.assert_allclose(out[0], run_model(source, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per_gear"])
def test_outputs_are_written_in_place(tmp_path: Path, share: bool) -> None:
    """OpenVINO writes into the session's buffers (copy=False: views of them), and a big
    output of execute(copy=True) straight into a fresh array the caller keeps."""
    source = build_encoder_model(hidden=256, layers=1, heads=4, vocab=128)
    spec_args = {"input_shape": "input_ids:1,-1;attention_mask:1,-1",
                 "dynamic_dims": "8,8;64,64"}
    spec, path = compiled(tmp_path, source, spec_args, "encoder")
    ex = load(path, share_weights=share).create_executor()
    buffers = ex.session._out_buffers
    feeds = [encoder_inputs(spec.shapes(g), seed=g, vocab=128) for g in range(2)]
    views = ex.execute(feeds[1], copy=False)
    assert all(np.shares_memory(v, b) for v, b in zip(views, buffers, strict=True))
    kept = ex.execute(feeds[1])  # last_hidden_state: 64 KiB, bound fresh for this run
    assert kept[0].nbytes >= 64 * 2**10
    assert not any(np.shares_memory(k, b) for k in kept for b in buffers)
    want = run_model(source, feeds[1])
    ex.execute(feeds[0])  # another gear into the same buffers: what was kept stays
    for a, b in zip(kept, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_large_outputs_come_from_the_pool(tmp_path: Path) -> None:
    """execute(copy=True) on OpenVINO takes its large outputs from the session's pool, as on
    ONNX Runtime (output_pool.py): a dropped array's memory is reused (no fresh pages for
    OpenVINO to fault in), a kept one is never written again."""
    import gc

    source = build_encoder_model(hidden=256, layers=1, heads=4, vocab=128)
    spec, path = compiled(tmp_path, source, {
        "input_shape": "input_ids:1,-1;attention_mask:1,-1", "dynamic_dims": "64,64;128,128"},
        "encoder")
    ex = load(path).create_executor()
    pool = ex.session._pool
    feeds = [encoder_inputs(spec.shapes(g), seed=g, vocab=128) for g in range(2)]
    kept = ex.execute(feeds[1])[0]  # last_hidden_state [1, 128, 256]: 128 KiB, pooled
    snapshot, address = kept.copy(), kept.ctypes.data
    assert pool.allocated == 1 and kept.ctypes.data % 64 == 0
    other = ex.execute(feeds[1])[0]
    assert not np.shares_memory(kept, other)  # the kept array's block is not free
    freed = {address, other.ctypes.data}
    np.testing.assert_array_equal(kept, snapshot)
    del kept, other
    gc.collect()
    again = ex.execute(feeds[1])[0]
    assert pool.reused == 1 and again.ctypes.data in freed
    np.testing.assert_allclose(again, run_model(source, feeds[1])[0], rtol=1e-5, atol=1e-5)


def test_served_on_openvino_with_batching_equals_onnxruntime(tmp_path: Path) -> None:
    """`gear-runtime serve --backend openvino`: tritonclient requests of batch 1 and 3,
    batched into the batch gears on OpenVINO, answer what ONNX Runtime computes."""
    pytest.importorskip("httptools")
    triton = pytest.importorskip("tritonclient.http")
    from serving_support import CONV_SPEC, HOST, live

    from gear_runtime.serving import ServeOptions, build_server

    source = CASES["conv_batch"][0]()
    _, path = compiled(tmp_path, source, CONV_SPEC, "conv")
    server = build_server([path], options=ServeOptions(backend="openvino", executors=2,
                                                       max_batch_delay_ms=5))
    rng = np.random.default_rng(0)
    with live(server) as running:
        c = triton.InferenceServerClient(f"{HOST}:{running.port}", network_timeout=60)
        for batch in (1, 3, 8):
            x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
            given = triton.InferInput("data", list(x.shape), "FP32")
            given.set_data_from_numpy(x, binary_data=True)
            result = c.infer("conv", [given], outputs=[
                triton.InferRequestedOutput("logits", binary_data=True)])
            np.testing.assert_allclose(result.as_numpy("logits"),
                                       run_model(source, {"data": x})[0], rtol=1e-5, atol=1e-5)


def test_a_bench_profile_from_openvino_steers_padding(tmp_path: Path) -> None:
    """bench on openvino gives a profile (with the OpenVINO-dynamic naive column); a profile
    decides which covering gear execute(pad=True) runs."""
    from gear_runtime.tools.bench.engine import bench_model

    source = build_encoder_model(hidden=32, layers=1, heads=2, vocab=128)
    spec, path = compiled(tmp_path, source, ENCODER_SEQ_SPEC, "encoder")
    model = load(path, num_threads=1)
    report = bench_model(model, iterations=3, warmup=1, progress=False,
                         inputs=lambda m, g: encoder_inputs(m.spec.shapes(g), vocab=128))
    assert report.backend == "openvino" and all(r.naive is not None for r in report.gears)
    model.attach_profile(report)
    assert model.profile == tuple(r.execute.p50 for r in report.gears)
    model.attach_profile([5.0, 1.0, 9.0])  # gear (16, 16) the cheapest, whatever was timed
    ex = model.create_executor()
    ex.execute(encoder_inputs({"input_ids": (1, 5), "attention_mask": (1, 5)}, vocab=128),
               pad=True)
    assert ex.last_gear == 1


def test_bench_threads_reach_openvino(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    from gear_runtime.tools.bench.engine import bench_model

    _, path = compiled(tmp_path, heavy_model(), CASES["heavy"][1], "heavy")
    seen: list[dict] = []
    real = ovb.open_model

    @functools.wraps(real)
    def spy(*args: object, **kw: object) -> ovb.OvModel:
        seen.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(ovb, "open_model", spy)
    bench_model(path, backend="openvino", threads=1, iterations=2, warmup=0, progress=False)
    assert seen == [{"num_threads": 1}]
