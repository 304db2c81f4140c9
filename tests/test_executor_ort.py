"""The executor on ONNX Runtime, end to end: compile -> load -> execute, checked against the
original dynamic model run by ONNX Runtime on the same inputs."""

from __future__ import annotations

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


def compiled(tmp_path: Path, case: str, **kw) -> tuple[onnx.ModelProto, gr.GearSpec, str]:
    build, args = CASES[case]
    model, spec = build(), gr.GearSpec.from_atc(**args)
    out = str(tmp_path / f"{case}.gear.onnx")
    gr.compile(model, spec, out, progress=False, **kw)
    return model, spec, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_gear_equals_the_original_model(tmp_path: Path, case: str) -> None:
    original, spec, path = compiled(tmp_path, case)
    model = gr.load(path)
    assert model.gears == list(spec.gears) and model.input_names == list(spec.input_names)
    ex = model.create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(original, spec.shapes(g), seed=g)
        out = ex.execute(feeds)
        assert ex.last_gear == g
        assert [o.shape for o in out] == [model.output_shape(g, k)
                                          for k in range(len(model.output_names))]
        assert_same(out, run_model(original, feeds))
        # list form, and with the dims set first (the ACL two-step)
        ex.set_dynamic_dims(spec.full_dims(g))
        assert_same(ex.execute([feeds[n] for n in spec.input_names]), run_model(original, feeds))
        ex.clear_dynamic_dims()


def test_out_of_gear_shapes_raise_with_the_legal_gears(tmp_path: Path) -> None:
    original, spec, path = compiled(tmp_path, "prefill")
    ex = gr.load(path).create_executor()
    feeds = random_inputs(original, {**spec.shapes(0)} | {
        "input_ids": (1, 9), "attention_mask": (1, 9), "position_ids": (4, 1, 9)})
    with pytest.raises(gr.GearMismatchError) as info:
        ex.execute(feeds)
    msg = str(info.value)
    assert info.value.code == "145013"
    assert "(9, 9, 9, 4)" in msg and "(8, 8, 8, 4)" in msg
    assert msg.index("(8, 8, 8, 4)") < msg.index("(64, 64, 64, 4)")  # nearest first
    feeds = random_inputs(original, spec.shapes(0))
    feeds["image_embeds"] = feeds["image_embeds"][:, :32].copy()  # static dim 64 -> 32
    with pytest.raises(gr.DynamicInputLengthError, match="image_embeds"):
        ex.execute(feeds)


def test_hybrid_serves_a_miss_with_the_dynamic_graph(tmp_path: Path) -> None:
    original, spec, path = compiled(tmp_path, "prefill", hybrid=True)
    model = gr.load(path)
    assert model.hybrid
    ex = model.create_executor()
    shapes = {**spec.shapes(0), "input_ids": (1, 12), "attention_mask": (1, 12),
              "position_ids": (4, 1, 12)}
    feeds = random_inputs(original, shapes, seed=7)
    assert_same(ex.execute(feeds), run_model(original, feeds))
    assert ex.last_gear is None and ex.last_dynamic_dims == (12, 12, 12, 4)
    hit = random_inputs(original, spec.shapes(2), seed=8)
    assert_same(ex.execute(hit), run_model(original, hit))
    assert ex.last_gear == 2


def test_sink_reads_the_device_dims_back(tmp_path: Path) -> None:
    original, spec, path = compiled(tmp_path, "conv_image", sink=True)
    model = gr.load(path)
    assert model.sink
    ex = model.create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(original, spec.shapes(g), seed=g)
        out = ex.execute(feeds)
        assert ex.last_dynamic_dims == spec.gears[g] and ex.last_gear == g
        assert_same(out, run_model(original, feeds))
    feeds = random_inputs(original, {"data": (1, 3, 20, 20)})
    with pytest.raises(gr.GearMismatchError, match="device"):
        ex.execute(feeds)
    assert ex.last_dynamic_dims == (20, 20) and ex.last_gear is None
    ex.set_dynamic_image_size(*spec.gears[1])
    with pytest.raises(gr.DynamicInputLengthError, match="computed on the device"):
        ex.execute(random_inputs(original, spec.shapes(0)))


def test_sink_outputs_are_checked_against_the_gear_map(tmp_path: Path, monkeypatch) -> None:
    """GetNext-sink: the device computes the dims and the outputs in one run. Outputs whose
    shape is not what the gear map says for the dims read back (a mis-routed sink graph:
    dims of gear 2, batch 8, with outputs of batch 4) are a BackendError naming the output
    and both shapes, never handed out as gear 2's."""
    original, spec, path = compiled(tmp_path, "conv_batch", sink=True)
    ex = gr.load(path).create_executor()
    feeds = random_inputs(original, spec.shapes(1), seed=1)  # batch 4: gear 1
    real = ex._session.run_sink

    def misrouted(arrays):
        outputs, _ = real(arrays)
        return outputs, (8,)

    monkeypatch.setattr(ex._session, "run_sink", misrouted)
    for copy in (True, False):
        with pytest.raises(gr.BackendError, match=r"output 'logits' of gear 2 has shape "
                                                  r"\(4, 10\), the gear map says \(8, 10\)"):
            ex.execute(feeds, copy=copy)
        assert ex.last_gear is None and ex.last_dynamic_dims == (8,)
    monkeypatch.setattr(ex._session, "run_sink", real)
    assert_same(ex.execute(feeds), run_model(original, feeds))
    assert ex.last_gear == 1


def test_eight_threads_each_with_its_own_executor(tmp_path: Path) -> None:
    original, spec, path = compiled(tmp_path, "reshape")
    model = gr.load(path, intra_op_num_threads=1)
    cases = []
    for g in range(spec.gear_count):
        for s in range(3):
            feeds = random_inputs(original, spec.shapes(g), seed=10 * g + s)
            cases.append((g, feeds, run_model(original, feeds)))
    errors: list[BaseException] = []
    counts = [0] * 8

    def worker(t: int) -> None:
        try:
            ex = model.create_executor()
            rng = np.random.default_rng(t)
            for _ in range(500):
                g, feeds, want = cases[int(rng.integers(len(cases)))]
                got = ex.execute(feeds)
                assert ex.last_gear == g
                assert_same(got, want)
                counts[t] += 1
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert counts == [500] * 8


MEMORY_PROBE = """
import json, sys, gc, psutil
import numpy as np
import gear_runtime as gr
proc = psutil.Process()
gc.collect(); before = proc.memory_info().rss
model = gr.load(sys.argv[1])
ex = model.create_executor()
ex.execute({"x": np.ones((1, 1024), np.float32)})
gc.collect(); after = proc.memory_info().rss
print(json.dumps({"delta": after - before}))
"""


def test_eight_gears_cost_little_more_memory_than_one(tmp_path: Path) -> None:
    """Weights are shared: 8 gears within 1.3x the resident memory of 1 gear."""
    heavy = heavy_model(width=1024, layers=8)  # 32 MB of weights
    paths = {}
    for n in (1, 8):
        spec = gr.GearSpec("batch", ("x",), ((-1, 1024),), tuple((1 << i,) for i in range(n)))
        paths[n] = str(tmp_path / f"heavy{n}.gear.onnx")
        gr.compile(heavy, spec, paths[n], progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    delta = {n: json.loads(subprocess.run([sys.executable, "-c", MEMORY_PROBE, p], env=env,
                                          check=True, capture_output=True, text=True
                                          ).stdout)["delta"] for n, p in paths.items()}
    assert delta[8] <= 1.3 * delta[1], delta


def test_asking_for_a_missing_provider_names_what_to_install(tmp_path: Path) -> None:
    _, _, path = compiled(tmp_path, "conv_batch")
    with pytest.raises(gr.BackendError, match="NoSuchExecutionProvider") as info:
        gr.load(path, providers=["NoSuchExecutionProvider"])
    assert "onnxruntime-gpu" in str(info.value)
    with pytest.raises(gr.BackendError, match="cuda_graph"):
        gr.load(path, cuda_graph=True)


def test_every_gear_and_executor_runs_on_one_prepacked_session(tmp_path: Path) -> None:
    """One ORT session per model, weight prepacking left ON (one copy, prepacked once)."""
    original, spec, path = compiled(tmp_path, "prefill")
    model = gr.load(path)
    session = model._backend.session
    config = session.get_session_options().get_session_config_entry
    with pytest.raises(Exception, match="does not have configuration"):  # ORT: prepack on
        config("session.disable_prepacking")
    a, b = model.create_executor(), model.create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(original, spec.shapes(g), seed=g)
        want = run_model(original, feeds)
        assert_same(a.execute(feeds), want)
        assert_same(b.execute(feeds), want)
    assert a._session.model.session is b._session.model.session is session


def test_copy_true_runs_into_fresh_arrays_and_the_binding_returns_to_its_buffers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gear_runtime.backends import onnxruntime as ort_backend

    monkeypatch.setattr(ort_backend, "FRESH_OUTPUT_MIN_BYTES", 0)  # every output, fresh
    original, spec, path = compiled(tmp_path, "prefill")
    ex = gr.load(path).create_executor()
    session = ex._session
    feeds = [random_inputs(original, spec.shapes(g), seed=g) for g in range(spec.gear_count)]
    want = [run_model(original, f) for f in feeds]
    owned = ex.execute(feeds[1])
    assert_same(owned, want[1])
    assert not any(np.shares_memory(o, b) for o in owned for b in session._out_buffers)
    assert_same(ex.execute(feeds[1], copy=False), want[1])  # the executor's buffers again
    assert_same(ex.execute(feeds[2], copy=False), want[2])
    again = ex.execute(feeds[1])  # stages gear 1 again (gears share the staging buffer)
    session._outputs[1][0][...] = 0
    session.run_bound(1)  # the bare run writes the executor's buffers, never `owned`
    assert_same(session._outputs[1], want[1])
    assert_same(owned, want[1])
    assert_same(again, want[1])


@pytest.mark.parametrize("fresh_from", [None, 1024, 0], ids=["copied", "mixed", "pooled"])
def test_copy_true_gives_the_caller_every_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fresh_from: int | None) -> None:
    """execute() (copy=True, the default) returns arrays the caller keeps: EVERY output, the
    ones ORT writes into pooled memory and the small ones copied alike (the example's logits
    are below the default threshold: ``mixed`` lowers it so logits are pooled and next_token
    copied). Later executes of the same gear (with other inputs) change none of them."""
    from gear_runtime.backends import onnxruntime as ort_backend

    if fresh_from is not None:
        monkeypatch.setattr(ort_backend, "FRESH_OUTPUT_MIN_BYTES", fresh_from)
    original, spec, path = compiled(tmp_path, "prefill")
    ex = gr.load(path).create_executor()
    g = 1
    first, second = (random_inputs(original, spec.shapes(g), seed=s) for s in (3, 4))
    want = run_model(original, first)
    kept = ex.execute(first)
    assert len(kept) > 1 and kept[0].nbytes != kept[1].nbytes  # a big and a small output
    for _ in range(3):
        ex.execute(second)
        ex.execute(second, copy=False)
    assert_same(kept, want)
    buffers = ex._session._out_buffers
    assert not any(np.shares_memory(o, b) for o in kept for b in buffers)


def test_copy_true_copies_a_single_small_output(tmp_path: Path) -> None:
    """A one-output model (``reshape``: one small float32 ``y``): execute() still hands the
    caller its own array, never the executor's buffer, whatever runs next."""
    from gear_runtime.backends import onnxruntime as ort_backend

    original, spec, path = compiled(tmp_path, "reshape")
    ex = gr.load(path).create_executor()
    first, second = (random_inputs(original, spec.shapes(1), seed=s) for s in (1, 2))
    (kept,) = ex.execute(first)
    assert kept.nbytes < ort_backend.FRESH_OUTPUT_MIN_BYTES  # copied, not pooled
    ex.execute(second)
    ex.execute(second, copy=False)
    assert_same([kept], run_model(original, first))
    assert not any(np.shares_memory(kept, b) for b in ex._session._out_buffers)


def test_the_cuda_provider_always_gets_the_device_id() -> None:
    """The CUDA EP defaults to device 0; an input bound on another device would be copied at
    bind time and read stale afterwards, so device_id is always explicit, conflicts refused."""
    from gear_runtime.backends.onnxruntime import provider_list

    assert provider_list(["CUDAExecutionProvider", "CPUExecutionProvider"], 1, False) == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0"}), "CPUExecutionProvider"]
    assert provider_list([("CUDAExecutionProvider", {"arena_extend_strategy": "x"})], 2,
                         True) == [("CUDAExecutionProvider", {
                             "arena_extend_strategy": "x", "device_id": "2",
                             "enable_cuda_graph": "1", "use_tf32": "0"})]
    with pytest.raises(gr.BackendError, match="device_id=0.*device_id=3"):
        provider_list([("CUDAExecutionProvider", {"device_id": "0"})], 3, False)
    assert provider_list(None, 0, False) == ["CPUExecutionProvider"]


def test_weights_reach_ort_through_the_model_never_add_initializer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's add_initializer refuses a buffer ORT owns ("must be owned by the user", which
    is what every CUDA OrtValue made from numpy is): the backend hands the weights to ORT as
    part of the model (external data), so the same code path holds on CUDA."""
    import onnxruntime as ort

    def refuse(self: object, name: str, value: object) -> None:
        raise RuntimeError("Buffer containing the initializer must be owned by the user")

    monkeypatch.setattr(ort.SessionOptions, "add_initializer", refuse)
    original = heavy_model()  # 1 MiB weights, in a data file
    spec = gr.GearSpec.from_atc(input_shape="x:-1,512", dynamic_batch_size="1,4")
    path = str(tmp_path / "h.gear.onnx")
    gr.compile(original, spec, path, progress=False, external_data=True)
    ex = gr.load(path).create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(original, spec.shapes(g), seed=g)
        assert_same(ex.execute(feeds), run_model(original, feeds))


# ---- ORT's private run call: probed once per session, the public one where it does not fit ---
class _FakeSession:
    """What private_run looks at: ``_sess.run_with_iobinding`` and ``io_binding()``."""

    def __init__(self, call) -> None:
        import types
        self._sess = types.SimpleNamespace(run_with_iobinding=call) if call else object()

    def io_binding(self):
        import types
        return types.SimpleNamespace(_iobinding=object())


def test_the_private_run_is_taken_only_when_it_takes_a_binding_and_run_options() -> None:
    from gear_runtime.backends.onnxruntime import private_run

    def refuses(binding, options):  # what ORT does with a binding that binds nothing
        raise RuntimeError("At least one output should be requested.")

    def changed(binding, options, extra):  # a future signature
        raise AssertionError("never reached")

    assert private_run(_FakeSession(refuses)) is refuses
    assert private_run(_FakeSession(lambda *a: (_ for _ in ()).throw(TypeError("x")))) is None
    assert private_run(_FakeSession(None)) is None  # the name is gone
    assert private_run(_FakeSession(changed)) is None  # TypeError from the call itself


def test_an_ort_whose_private_run_does_not_fit_runs_through_the_public_one(
        tmp_path: Path, monkeypatch) -> None:
    import onnxruntime as ort

    from gear_runtime.backends import onnxruntime as ortb
    original, spec, path = compiled(tmp_path, "prefill")
    monkeypatch.setattr(ortb, "private_run", lambda session: None)
    public: list[int] = []
    real = ort.InferenceSession.run_with_iobinding
    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding",
                        lambda self, b, o=None: public.append(1) or real(self, b, o))
    ex = gr.load(path).create_executor()
    for g in range(spec.gear_count):
        feeds = random_inputs(original, spec.shapes(g), seed=g)
        assert_same(ex.execute(feeds), run_model(original, feeds))
        assert_same(ex.execute(feeds, copy=True), run_model(original, feeds))
    assert len(public) == 2 * spec.gear_count


def test_the_real_ort_takes_the_private_run(tmp_path: Path) -> None:
    import onnxruntime as ort

    from gear_runtime.backends.onnxruntime import private_run
    _, _, path = compiled(tmp_path, "prefill")
    ex = gr.load(path).create_executor()
    session = ex.session._ort
    assert private_run(session) is not None, f"onnxruntime {ort.__version__}"
    assert ex.session._c_bindings[0] is not ex.session._bindings[0]  # the C binding's form
