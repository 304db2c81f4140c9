"""The ONNX Runtime backend's device paths, checked on CPU.

No GPU here: the CUDA provider is faked where a path needs one (``fake_cuda``: ORT reports
the CUDA EP and each session is a CPU session that records the provider options it was given,
refusing graph capture the way ORT's inference_session.cc does when asked), and the device
staging runs its real ORT calls on host memory (``device=("cpu", 0)``): the arena, the views,
the one-copy-in / one-copy-out path and every binding are the code a GPU runs. Its bindings
copy an input the CUDA EP reads on the CPU when it is bound, as ORT does
(``ort_device_support.BindTimeCopies``), so a path binding before it copies fails here too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import (
    CONV_BATCH_SPEC,
    HEAVY_SPEC,
    control_flow_model,
    conv_model,
    heavy_model,
    random_inputs,
    run_model,
)
from onnx import TensorProto, helper
from ort_device_support import graph_ids, on_host_device

import gear_runtime as gr
from gear_runtime.backends import onnxruntime as ortb
from gear_runtime.backends import onnxruntime_cuda as cuda
from gear_runtime.backends.capture_check import capture_hazards

CUDA = "CUDAExecutionProvider"
ROOT = Path(__file__).resolve().parent.parent


# ---- item 1: the version floor ---------------------------------------------------------------
def _compiled(tmp_path: Path, model: onnx.ModelProto | None = None,
              spec: gr.GearSpec | None = None) -> str:
    model = model or conv_model()
    spec = spec or gr.GearSpec.from_atc(**CONV_BATCH_SPEC)
    return gr.compile(model, spec, str(tmp_path / "m.gear.onnx"), progress=False)


@pytest.mark.parametrize("old", ["1.20.1", "1.17.3", "1.18.0"])
def test_an_onnxruntime_below_the_floor_is_refused_at_load(tmp_path: Path, monkeypatch,
                                                           old: str) -> None:
    path = _compiled(tmp_path)
    monkeypatch.setattr(ort, "__version__", old)
    with pytest.raises(gr.BackendUnavailableError) as info:
        gr.load(path)
    message = str(info.value)
    assert f"onnxruntime {old} is installed" in message and ">= 1.21.0" in message


def test_the_floor_itself_loads(tmp_path: Path, monkeypatch) -> None:
    path = _compiled(tmp_path)
    monkeypatch.setattr(ort, "__version__", "1.21.0")
    assert gr.load(path).gear_count == 3


def test_version_parsing_reads_the_leading_numbers() -> None:
    assert ortb.version_tuple("1.22.0.dev20250101") == (1, 22, 0)
    assert ortb.version_tuple("1.21.0rc1") == (1, 21, 0)
    assert ortb.version_tuple("1.32.0") == (1, 32, 0)


def test_pyproject_and_the_gpu_install_state_the_same_floor() -> None:
    """pyproject's onnxruntime and the README's onnxruntime-gpu line (the GPU build replaces
    the CPU one: no extra names it) both say the floor the backend checks."""
    floor = ".".join(map(str, ortb.ORT_FLOOR))
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.findall(r'"onnxruntime(?:-gpu)?>=([0-9.]+)"', text) == [floor]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.findall(r'"onnxruntime-gpu>=([0-9.]+)"', readme) == [floor]


# ---- item 3: what CUDA graphs cannot run right -----------------------------------------------
def _value_fed_slice() -> onnx.ModelProto:
    """y = x[:, :k] with ``k`` an INPUT: its value decides a shape (Slice's ``ends``)."""
    n = helper.make_node
    graph = helper.make_graph(
        [n("Add", ["k", "zero"], ["end"], name="end"),
         n("Slice", ["x", "zero", "end", "one"], ["y"], name="cut")],
        "value_fed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                      helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "K"])],
        initializer=[onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
                     onnx.numpy_helper.from_array(np.array([1], np.int64), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_if_node_is_a_capture_hazard() -> None:
    hazards = capture_hazards(control_flow_model().graph)
    assert len(hazards) == 1 and "If node 'branch'" in hazards[0]


def test_an_input_value_feeding_a_shape_is_a_capture_hazard() -> None:
    hazards = capture_hazards(_value_fed_slice().graph)
    assert len(hazards) == 1
    assert "input 'k'" in hazards[0] and "Slice node 'cut'" in hazards[0]


def test_an_input_value_feeding_nonzero_is_a_capture_hazard() -> None:
    from models import nonzero_model

    assert "input 'x'" in capture_hazards(nonzero_model().graph)[0]


def test_a_contrib_kernels_cpu_input_fed_by_an_input_is_a_capture_hazard() -> None:
    """CUDA GroupQueryAttention takes total_sequence_length (input 6) on the CPU: fed from a
    graph input, a replay would keep the length seen at capture."""
    names = ["q", "k", "v", "pk", "pv", "seqlens_k", "total_len"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "pk_out", "pv_out"],
                            domain="com.microsoft", name="gqa", num_heads=2, kv_num_heads=2)
    graph = helper.make_graph(
        [node], "gqa", [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None)
                        for n in names[:5]]
        + [helper.make_tensor_value_info(n, TensorProto.INT32, None) for n in names[5:]],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None)
         for n in ("out", "pk_out", "pv_out")])
    hazards = capture_hazards(graph)
    assert len(hazards) == 1 and "input 'total_len'" in hazards[0] and "'gqa'" in hazards[0]
    graph.node[0].domain = ""  # an op of that name in another domain is not the contrib kernel
    assert capture_hazards(graph) == []


def test_a_random_op_is_a_capture_hazard() -> None:
    graph = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], ["n"], name="noise"),
         helper.make_node("Add", ["x", "n"], ["y"])], "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    hazards = capture_hazards(graph)
    assert len(hazards) == 1 and "RandomNormalLike node 'noise' draws random" in hazards[0]


def test_shapes_computed_from_input_shapes_are_no_hazard() -> None:
    from models import reshape_model

    # Shape -> Gather -> Mul -> Concat -> Reshape: static within a gear, safe to capture
    assert capture_hazards(reshape_model().graph) == []
    assert capture_hazards(conv_model().graph) == []


@pytest.fixture
def fake_cuda(monkeypatch):
    """ORT with a 'CUDA provider': sessions are CPU sessions recording their providers; with
    ``refuse[0]`` set, asking for graph capture fails the way ORT's session creation does."""
    real, created, refuse = ort.InferenceSession, [], [False]
    available = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *available])

    class Session(real):  # type: ignore[misc, valid-type]
        def __init__(self, model, so=None, providers=None, **kw):
            created.append(providers)
            wants = [o for p, o in (p if isinstance(p, tuple) else (p, {}) for p in providers)
                     if p == CUDA and o.get("enable_cuda_graph") == "1"]
            if wants and refuse[0]:  # the 1.32 binary's wording (inference_session.cc)
                raise RuntimeError("This session cannot use the graph capture feature as "
                                   "requested by the user  as all compute graph nodes have "
                                   "not been partitioned to the CUDAExecutionProvider")
            super().__init__(model, so, providers=["CPUExecutionProvider"], **kw)

    monkeypatch.setattr(ort, "InferenceSession", Session)
    return created, refuse


def _graphs_asked(providers) -> bool:
    return any(isinstance(p, tuple) and p[1].get("enable_cuda_graph") == "1" for p in providers)


def test_cuda_graph_on_a_model_with_control_flow_runs_without_graphs_and_says_why(
        tmp_path: Path, fake_cuda) -> None:
    created, _ = fake_cuda
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    path = _compiled(tmp_path, control_flow_model(), spec)
    with pytest.warns(RuntimeWarning, match="If node 'branch.*runs without CUDA graphs"):
        model = gr.load(path, providers=[CUDA], cuda_graph=True)
    backend = model.backend_model
    assert not backend.cuda_graph and "If node" in backend.cuda_graph_refused
    assert created and not any(_graphs_asked(p) for p in created)  # never even asked ORT


def test_cuda_graph_fallback_false_refuses_the_model(tmp_path: Path, fake_cuda) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    path = _compiled(tmp_path, control_flow_model(), spec)
    with pytest.raises(gr.BackendError, match="If node 'branch.*cuda_graph_fallback=False"):
        gr.load(path, providers=[CUDA], cuda_graph=True, cuda_graph_fallback=False)


def test_ort_refusing_graph_capture_itself_falls_back_the_same_way(tmp_path: Path,
                                                                    fake_cuda) -> None:
    created, refuse = fake_cuda
    refuse[0] = True  # a model whose hazard only ORT's partitioning finds (Memcpy nodes)
    path = _compiled(tmp_path)
    created.clear()  # the compile's own check ran the source on a CPU session
    with pytest.warns(RuntimeWarning, match="onnxruntime refused graph capture"):
        model = gr.load(path, providers=[CUDA], cuda_graph=True)
    assert not model.backend_model.cuda_graph
    assert [_graphs_asked(p) for p in created] == [True, False]
    with pytest.raises(gr.BackendError, match="refused graph capture"):
        gr.load(path, providers=[CUDA], cuda_graph=True, cuda_graph_fallback=False)


def test_a_clean_model_keeps_its_graphs(tmp_path: Path, fake_cuda) -> None:
    created, _ = fake_cuda
    model = gr.load(_compiled(tmp_path), providers=[CUDA], cuda_graph=True)
    assert model.backend_model.cuda_graph and _graphs_asked(created[-1])


# ---- items 4-6: the device staging, on host memory --------------------------------------------
def _heavy(tmp_path: Path) -> tuple[onnx.ModelProto, gr.GearSpec, str]:
    original = heavy_model(width=64, layers=2)
    spec = gr.GearSpec.from_atc(input_shape="x:-1,64",
                                dynamic_batch_size=HEAVY_SPEC["dynamic_batch_size"])
    return original, spec, _compiled(tmp_path, original, spec)


def test_one_arena_per_executor_sized_to_its_largest_gear(tmp_path: Path, monkeypatch) -> None:
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path)
    on_host_device(model)
    allocated: list[int] = []
    real = ort.OrtValue.ortvalue_from_shape_and_type

    def spy(shape, element_type, *args, **kw):  # every device allocation goes through it
        allocated.append(int(np.prod(shape)) * np.dtype(element_type).itemsize)
        return real(shape, element_type, *args, **kw)

    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type", staticmethod(spy))
    ex = model.create_executor()
    staging = ex.session._device
    layout, info = model.layout, model.backend_model.info
    largest_out = max(info.output_size(g, 0) for g in range(spec.gear_count))
    assert ex.session.output_nbytes() == cuda._aligned(largest_out)
    per_gear = sum(layout.nbytes(g, 0) + info.output_size(g, 0) for g in range(spec.gear_count))
    if not hasattr(ort.OrtValue, "from_dlpack"):  # ORT < 1.26: no views, regions of their own
        assert not staging.inputs.shared
        assert allocated[0] == layout.total_bytes and len(allocated) == spec.gear_count + 2
        return
    assert staging.inputs.shared  # ORT makes working views on this build
    assert allocated == [layout.total_bytes, cuda._aligned(largest_out)]
    assert staging.nbytes < per_gear  # the sum over gears is what each gear owning buffers costs


def test_every_gear_runs_right_over_the_shared_arena(tmp_path: Path, monkeypatch) -> None:
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path)
    on_host_device(model)
    ex = model.create_executor()
    reads: list[int] = []
    real_numpy = ort.OrtValue.numpy
    monkeypatch.setattr(ort.OrtValue, "numpy", lambda v: reads.append(1) or real_numpy(v))
    for rnd in range(2):  # gears alternate over the same addresses
        for g in reversed(range(spec.gear_count)):
            feeds = random_inputs(original, spec.shapes(g), seed=10 * rnd + g)
            reads.clear()
            got = ex.execute(feeds)
            assert len(reads) == 1  # ONE device-to-host copy per output...
            # ... and no host copy after it: on host memory that read IS the arena's bytes
            assert got[0].ctypes.data == ex.session._device.output_ptr(0)
            np.testing.assert_allclose(got[0], run_model(original, feeds)[0], rtol=1e-5,
                                       atol=1e-5)
    owned = ex.execute(feeds, copy=True)  # fresh already: no copy on top
    assert owned[0].shape == spec.shapes(g)["x"]


def test_each_view_owns_its_struct_until_ort_releases_it(tmp_path: Path) -> None:
    """A view's DLPack struct lives exactly as long as the view: ORT's deleter reads it when
    the view dies, so freeing it with the arena's other attributes was a use-after-free."""
    if not hasattr(ort.OrtValue, "from_dlpack"):
        pytest.skip("ORT < 1.26 makes no views")
    before = len(cuda._LIVE)
    arena = cuda._Arena(4096, ("cpu", 0))
    assert arena.shared and len(cuda._LIVE) == before  # the probe view died: released
    views = [arena.region(256 * k, 64) for k in range(4)]
    assert len(cuda._LIVE) == before + 4
    del arena  # the owner first, its views after: the order that read freed memory
    views.pop().update_inplace(np.zeros(64, np.uint8))
    assert len(cuda._LIVE) == before + 3
    views.clear()
    assert len(cuda._LIVE) == before


def test_executor_teardown_is_clean_under_the_debug_allocator(tmp_path: Path) -> None:
    """The device staging torn down in every order under PYTHONMALLOC=debug, which poisons
    freed memory: the keep-list version of the views crashed here (rc 139)."""
    _, _, path = _heavy(tmp_path)
    script = f"""
import gc, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import gear_runtime as gr
from ort_device_support import on_host_device
for order in range(3):
    model = gr.load({path!r})
    on_host_device(model)
    ex = [model.create_executor() for _ in range(2)]
    if order == 0:
        ex[0].close(); del ex
    elif order == 1:
        staging = ex[1].session._device; del ex; del staging
    else:
        del model, ex
    gc.collect()
print("clean")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONMALLOC": "debug"},
                          timeout=120)
    assert done.returncode == 0 and "clean" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_the_device_path_runs_through_the_public_run_api(tmp_path: Path, monkeypatch) -> None:
    original, spec, path = _heavy(tmp_path)
    calls = graph_ids(monkeypatch)
    model = gr.load(path)
    on_host_device(model)
    ex = model.create_executor()
    ex.execute(random_inputs(original, spec.shapes(0)))
    assert calls == ["-1"]  # named: the public wrapper's lookup of a missing key is slow


def test_graph_executor_bare_run_keeps_the_thread_rule(tmp_path: Path) -> None:
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path)
    on_host_device(model, graphs=True)
    ex = model.create_executor()
    ex.session.run_bound(0)  # the creating thread may
    errors: list[BaseException] = []

    def other() -> None:
        try:
            ex.session.run_bound(0)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and "thread that created it" in str(errors[0])
    assert ex.session.thread_bound  # what the server reads before lending it (run_here)
    model.backend_model.cuda_graph = False
    assert not ex.session.thread_bound


def _overlap(path: str, graphs: bool, monkeypatch) -> int:
    """The most runs in flight at once on one model's session, two executors each running on
    its own thread (the thread that made it, as graphs need), plus the naive run."""
    model = gr.load(path)
    on_host_device(model, graphs=graphs)
    original = heavy_model(width=64, layers=2)
    spec = model.backend_model.info.spec
    in_flight, most, lock = [0], [0], threading.Lock()
    started = threading.Barrier(3)

    def counted(call):
        def run(*args):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            try:
                time.sleep(0.002)  # long enough for the other thread to come in
                return call(*args)
            finally:
                with lock:
                    in_flight[0] -= 1
        return run

    real_run = ort.InferenceSession.run
    monkeypatch.setattr(ort.InferenceSession, "run",
                        lambda self, *a, **k: counted(real_run)(self, *a, **k))
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            ex = model.create_executor()
            ex.session._run_c = counted(ex.session._run_c)
            started.wait()
            for k in range(30):
                ex.execute(random_inputs(original, spec.shapes(k % spec.gear_count), seed=k))
            ex.close()
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait()
    for k in range(15):
        model.backend_model.naive_run(random_inputs(original, spec.shapes(0), seed=k))
    for t in threads:
        t.join()
    assert not errors, errors
    return most[0]


def test_runs_on_a_cuda_graph_session_never_overlap(tmp_path: Path, monkeypatch) -> None:
    """ORT forbids concurrent Run() on a session with CUDA graphs: two executors' runs and
    the naive run take turns; without graphs they overlap (what shows the count can see it)."""
    _, _, path = _heavy(tmp_path)
    assert _overlap(path, graphs=True, monkeypatch=monkeypatch) == 1
    assert _overlap(path, graphs=False, monkeypatch=monkeypatch) > 1


def test_graphs_are_released_only_on_their_thread(tmp_path: Path, monkeypatch) -> None:
    original, spec, path = _heavy(tmp_path)
    released: list[int] = []
    monkeypatch.setattr(ort.InferenceSession, "release_captured_graph",
                        lambda self, graph_id=0: released.append(graph_id), raising=False)
    model = gr.load(path)
    on_host_device(model, graphs=True)
    mine, theirs = model.create_executor(), model.create_executor()
    ids = list(mine.session._graph_ids)
    mine.close()
    assert released == ids and len(ids) == spec.gear_count
    t = threading.Thread(target=theirs.close)
    t.start()
    t.join()
    assert released == ids  # another thread's release would free nothing: left to the session
    assert theirs.session.graphs_left == spec.gear_count


def test_naive_run_under_graphs_is_never_captured(tmp_path: Path, monkeypatch) -> None:
    original, spec, path = _heavy(tmp_path)
    model = gr.load(path)
    backend = model.backend_model
    seen: list[str] = []
    real = ort.InferenceSession.run

    def spy(self, output_names, feeds, run_options=None):
        seen.append(run_options.get_run_config_entry("gpu_graph_id"))
        return real(self, output_names, feeds, run_options)

    monkeypatch.setattr(ort.InferenceSession, "run", spy)
    backend.naive_run(random_inputs(original, spec.shapes(0)))
    assert seen == ["-1"]


def test_a_waiting_capture_is_not_starved_by_new_runs() -> None:
    gate = cuda._CaptureGate()
    order: list[str] = []
    first_run, capture_waiting = threading.Event(), threading.Event()

    def runner(tag: str, hold: threading.Event | None = None) -> None:
        with gate.run():
            order.append(tag)
            if hold is not None:
                first_run.set()
                hold.wait(5)

    release_first = threading.Event()
    a = threading.Thread(target=runner, args=("run-a", release_first))
    a.start()
    first_run.wait(5)

    def capturer() -> None:
        capture_waiting.set()
        with gate.capture():
            order.append("capture")

    c = threading.Thread(target=capturer)
    c.start()
    capture_waiting.wait(5)
    while not gate._waiting:  # the capture is queued behind run-a
        threading.Event().wait(0.001)
    b = threading.Thread(target=runner, args=("run-b",))
    b.start()
    b.join(0.2)
    assert b.is_alive()  # run-b waits behind the capture, not in front of it
    release_first.set()
    for t in (a, c, b):
        t.join(5)
    assert order == ["run-a", "capture", "run-b"]


def test_pinned_staging_is_taken_from_the_cuda_devices_host_accessible_memory(
        monkeypatch) -> None:
    """ORT 1.28+: a CUDA EP device's HOST_ACCESSIBLE memory info allocates pinned memory that
    numpy views without a copy. A fake EP device list; the allocation is a CPU OrtValue."""
    if not hasattr(ort, "OrtDeviceMemoryType"):  # before 1.24: nothing to ask, pageable
        assert cuda.pinned_staging(1000, device_id=0) is None
        return
    kinds = ort.OrtDeviceMemoryType
    asked: list[object] = []

    class Device:
        def __init__(self, name: str, ordinal: int) -> None:
            self.ep_name, self._ordinal = name, ordinal

        def memory_info(self, kind):
            asked.append((self.ep_name, self._ordinal, kind))
            return type("Info", (), {"device_id": self._ordinal})()

    monkeypatch.setattr(ort, "get_ep_devices",
                        lambda: [Device("CPUExecutionProvider", 0), Device(CUDA, 0),
                                 Device(CUDA, 1)])
    real = ort.OrtValue.ortvalue_from_shape_and_type

    def alloc(shape, element_type, *args, memory_info=None, **kw):
        assert memory_info is not None and memory_info.device_id == 1
        return real([shape[0] + 64], element_type)  # host memory, like pinned memory

    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type", staticmethod(alloc))
    got = cuda.pinned_staging(1000, device_id=1)
    assert got is not None
    view, owner = got
    assert view.nbytes == 1000 and view.ctypes.data == owner.data_ptr()
    assert (CUDA, 1, kinds.HOST_ACCESSIBLE) in asked
    monkeypatch.setattr(ort, "get_ep_devices", lambda: [Device("CPUExecutionProvider", 0)])
    assert cuda.pinned_staging(1000, device_id=0) is None  # no CUDA device: pageable
