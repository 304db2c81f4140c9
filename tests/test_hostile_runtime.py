"""The runtime under misuse and hostile values: one executor in many threads, closed objects,
list inputs that do not fit, spec values the file cannot hold, gears too large to allocate.

Each test asserts the promised behaviour (a GearRuntimeError naming what is wrong, or correct
outputs), never just "no crash".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models import RESHAPE_SPEC, reshape_model

import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.errors import ClosedError, ExecutorBusyError
from gear_runtime.runtime.model import MAX_BUFFER_BYTES_ENV, GearModel

#: Seconds each thread count hammers one executor in CI; set it higher for a long run.
HAMMER_SECONDS = float(os.environ.get("GEAR_RUNTIME_HAMMER_SECONDS", "0.5"))

# Run in a subprocess so that a crash (segfault) fails the test instead of killing pytest.
# argv: gear file (or "echo" for the null-backend double below), seconds, the core ("native",
# or the folder of tests/oracle.py to run the executor on the oracle instead), thread counts.
# Prints one JSON line per thread count: calls that returned the expected outputs, calls
# refused with ExecutorBusyError, calls that returned other outputs, anything else raised.
HAMMER = r'''
import json, sys, threading, time
import numpy as np
import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.errors import ExecutorBusyError
from gear_runtime.runtime.model import GearModel


class EchoSession(null.NullSession):
    """Doubles what was staged into a reused output buffer, yielding the GIL meanwhile: the
    staging -> run -> output buffer sequence a real backend has, with a wide race window."""

    def run_gear(self, gear):
        off, n = self.layout.offset(gear, 0), self.layout.nbytes(gear, 0)
        out = self._outputs[gear][0].reshape(-1)
        time.sleep(0)  # another thread may stage now
        np.multiply(self.staging[off:off + n].view(np.float32), 2, out=out)
        time.sleep(0)  # or write the output buffer now
        return self._outputs[gear]


class EchoModel(null.NullModel):
    def create_session(self, layout):
        return EchoSession(self, layout)


def load(what):
    if what != "echo":
        return gr.load(what, intra_op_num_threads=1)
    spec = gr.GearSpec.from_atc(input_shape="x:-1,64", dynamic_batch_size="1,2,4")
    info = null.open_model(None, spec=spec, outputs={"y": [(1, 64), (2, 64), (4, 64)]}).info
    return GearModel(EchoModel(info))


def hammer(model, threads, seconds):
    ex = model.create_executor()
    rng = np.random.default_rng(threads)
    cases = []  # per thread, per gear: inputs and the outputs of a serial run
    for t in range(threads):
        row = []
        for g in range(model.gear_count):
            feeds = {n: rng.standard_normal(s).astype(dt) for (n, s), dt in
                     zip(model.spec.shapes(g).items(), model.info.input_dtypes)}
            row.append((feeds, ex.execute(feeds)))
        cases.append(row)
    counts = {"ok": 0, "busy": 0, "wrong": 0, "other": []}
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker(t):
        ok = busy = wrong = 0
        other = []
        i = t
        while time.perf_counter() < deadline:
            feeds, want = cases[t][i % model.gear_count]
            i += 1
            try:
                got = ex.execute(feeds)
            except ExecutorBusyError:
                busy += 1
                continue
            except Exception as exc:
                other.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            same = len(got) == len(want) and all(
                a.shape == b.shape and np.array_equal(a, b) for a, b in zip(got, want))
            ok, wrong = ok + same, wrong + (not same)
        with lock:
            counts["ok"] += ok
            counts["busy"] += busy
            counts["wrong"] += wrong
            counts["other"] += other[:5]

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    counts["threads"] = threads
    return counts


sys.setswitchinterval(1e-5)  # switch threads often: more interleavings, more progress
if sys.argv[3] != "native":  # the executor on the oracle: other timing, other interleavings
    sys.path.insert(0, sys.argv[3])
    import oracle
    import gear_runtime.runtime.core
    import gear_runtime.runtime.dispatch as dispatch_mod

    native_table = dispatch_mod._table

    class Table:  # the model's C++ table, with what the oracle builds its own core from
        def __init__(self, spec, inputs, costs):
            self.native = native_table(spec, inputs, costs)
            index = {i: j for j, i in enumerate(inputs)}
            self.args = ([spec.input_names[i] for i in inputs],
                         [list(spec.input_shapes[i]) for i in inputs],
                         [[index[i], a, k] for i, a, k in spec.dynamic_positions if i in index],
                         [list(g) for g in spec.gears])

        def __getattr__(self, name):
            return getattr(self.native, name)

    class OracleCore(oracle.ExecutorCore):  # ExecutorCore(dispatch, dtypes, layout, staging)
        def __init__(self, dispatch, dtypes, layout, staging):
            self._table_costs = list(dispatch.costs)  # set_padding runs inside __init__
            super().__init__(*dispatch.args, dtypes, layout, staging)

        def set_padding(self, pad_values=None, costs=None):
            super().set_padding(pad_values, self._table_costs if costs is None else costs)

    dispatch_mod._table = Table
    gear_runtime.runtime.core.ExecutorCore = OracleCore
model = load(sys.argv[1])
for n in sys.argv[4:]:
    print(json.dumps(hammer(model, int(n), float(sys.argv[2]))), flush=True)
'''


def run_hammers(what: str, tmp_path: Path) -> dict[str, list[dict]]:
    """Hammer on the C++ core and, at the same time, on the oracle (tests/oracle.py); 2 then
    8 threads each. Returns the counts per implementation; fails on a crash."""
    script = tmp_path / "hammer.py"
    script.write_text(HAMMER)
    procs = {}
    for impl, core in (("native", "native"), ("oracle", str(Path(__file__).parent))):
        procs[impl] = subprocess.Popen(
            [sys.executable, str(script), what, str(HAMMER_SECONDS), core, "2", "8"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for impl, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{impl}: the hammer died (rc {proc.returncode}): {err}"
        results[impl] = [json.loads(line) for line in out.splitlines()]
    return results


def assert_every_call_right_or_refused(results: dict[str, list[dict]]) -> None:
    for impl, runs in results.items():
        assert [r["threads"] for r in runs] == [2, 8], (impl, runs)
        for r in runs:
            where = f"{impl}, {r['threads']} threads: {r}"
            assert r["wrong"] == 0, f"outputs of another call returned ({where})"
            assert r["other"] == [], f"not ExecutorBusyError ({where})"
            assert r["ok"] > 0, where
            assert r["busy"] > 0, f"no contention happened ({where})"


@pytest.fixture(scope="module")
def reshape_gear_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("hostile") / "reshape.gear.onnx")
    gr.compile(reshape_model(), gr.GearSpec.from_atc(**RESHAPE_SPEC), out, progress=False)
    return out


# ---- one executor, many threads ----------------------------------------------------------
def test_one_executor_hammered_by_threads_on_onnxruntime(reshape_gear_file: str,
                                                         tmp_path: Path) -> None:
    assert_every_call_right_or_refused(run_hammers(reshape_gear_file, tmp_path))


def test_one_executor_hammered_by_threads_on_a_backend_double(tmp_path: Path) -> None:
    """Same rule without ONNX Runtime: a double that reads the staging buffer into a reused
    output buffer (as real backends do) with the GIL released in between."""
    assert_every_call_right_or_refused(run_hammers("echo", tmp_path))


class GateSession(null.NullSession):
    """run_gear blocks until ``release`` is set: holds a call inside the executor."""

    def __init__(self, model: null.NullModel, layout: object) -> None:
        super().__init__(model, layout)
        self.entered, self.release = threading.Event(), threading.Event()

    def run_gear(self, gear: int) -> list[np.ndarray]:
        self.entered.set()
        assert self.release.wait(10)
        return super().run_gear(gear)


class GateModel(null.NullModel):
    def create_session(self, layout: object) -> GateSession:
        return GateSession(self, layout)


def _call_in_flight(rows: int) -> tuple[GearModel, Any, threading.Thread, list[object]]:
    """A gated model's executor with an execute of ``rows`` rows held inside the backend run:
    (model, executor, the thread running it, the list its result lands in)."""
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    model = GearModel(GateModel(null.open_model(None, spec=spec).info))
    ex = model.create_executor()
    result: list[object] = []
    inflight = threading.Thread(
        target=lambda: result.append(ex.execute([np.ones((rows, 4), np.float32)])))
    inflight.start()
    assert ex._session.entered.wait(10)
    return model, ex, inflight, result


def test_every_entry_is_refused_at_once_while_a_call_is_in_flight() -> None:
    model, ex, inflight, result = _call_in_flight(rows=2)
    refused = {
        "execute": lambda: ex.execute([np.ones((1, 4), np.float32)]),
        "set_dynamic_batch_size": lambda: ex.set_dynamic_batch_size(1),
        "set_dynamic_dims": lambda: ex.set_dynamic_dims([1, 4]),
        "clear_dynamic_dims": ex.clear_dynamic_dims,
    }
    for call, enter in refused.items():
        with pytest.raises(ExecutorBusyError, match=f"{call}: this executor is in use"):
            enter()
    ex._session.release.set()
    inflight.join(10)
    assert ex.last_gear == 1 and ex.dynamic_dims is None  # the refused calls changed nothing
    assert [o.shape for o in result[0]] == [(1,)]  # type: ignore[index]
    ex.set_dynamic_batch_size(1)  # free again
    assert ex.dynamic_dims == (1,)


# ---- closed models and executors ---------------------------------------------------------
@pytest.mark.parametrize("backend", ["onnxruntime", "null"])
def test_closed_models_and_executors_refuse_every_use(reshape_gear_file: str,
                                                      backend: str) -> None:
    model = gr.load(reshape_gear_file, backend=backend)
    feeds = {"x": np.ones(model.spec.shapes(0)["x"], np.float32)}
    ex, other = model.create_executor(), model.create_executor()
    ex.execute(feeds)
    ex.close()
    ex.close()  # idempotent
    assert ex.closed
    for use in (lambda: ex.execute(feeds), lambda: ex.set_dynamic_dims(model.gears[0]),
                ex.clear_dynamic_dims):
        with pytest.raises(ClosedError, match="closed executor") as info:
            use()
        assert info.value.code == "145003"
    model.close()
    model.close()  # idempotent
    assert model.closed and other.closed  # the model closed its executors
    with pytest.raises(ClosedError, match="closed executor"):
        other.execute(feeds)
    with pytest.raises(ClosedError, match="create_executor on a closed model") as info:
        model.create_executor()
    assert info.value.code == "145003"
    assert model.output_shape(0, 0)  # what the model is stays readable


def test_executor_close_waits_for_the_call_in_flight() -> None:
    model, ex, inflight, result = _call_in_flight(rows=1)
    closer = threading.Thread(target=ex.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close did not wait for the call in flight"
    assert ex.closed  # close has begun: every later call is refused as closed, not busy
    with pytest.raises(ClosedError):
        ex.execute([np.ones((1, 4), np.float32)])
    ex._session.release.set()
    closer.join(10)
    inflight.join(10)
    assert ex.closed and len(result) == 1
    with pytest.raises(ClosedError):
        ex.execute([np.ones((1, 4), np.float32)])


# ---- list inputs follow the array rules ---------------------------------------------------
@pytest.fixture
def int_and_float_model() -> GearModel:
    spec = gr.GearSpec.from_atc(input_shape="input_ids:1,-1;scale:1,-1",
                                dynamic_dims="4,4;8,8")
    return GearModel(null.open_model(None, spec=spec, input_dtypes=[np.int64, np.float32]))


def test_list_inputs_are_refused_where_the_same_array_is(int_and_float_model: GearModel) -> None:
    ex = int_and_float_model.create_executor()
    ids, scale = np.arange(4, dtype=np.int64).reshape(1, 4), np.ones((1, 4), np.float32)
    bad = {
        "float values into int64": ((ids + 0.7).tolist(), scale, "input 'input_ids' holds "
                                    "float values (first: 0.7); the model's input is int64"),
        "an int float32 cannot hold": (ids, [[1, 2, 3, 2**24 + 1]], "input 'scale' holds the "
                                       "integer 16777217"),
        "bool values into int64": ([[True] * 4], scale, "input 'input_ids' holds bool values"),
        "strings": ([["1"] * 4], scale, "input 'input_ids' holds string values"),
        "out of int64 range": ([[2**63, 0, 0, 0]], scale, "holds the value 9223372036854775808"),
        "float32 overflow": (ids, [[1e39, 0.0, 0.0, 0.0]], "out of range for the model's "
                             "float32 input"),
        "ragged": ([[1, 2], [3]], scale, "input 'input_ids' cannot be read as a int64 array"),
    }
    for why, (a, b, message) in bad.items():
        with pytest.raises(gr.InputError) as info:
            ex.execute([a, b])
        assert message in str(info.value), why
    with pytest.raises(gr.InputError, match="has dtype float64"):  # the array rule itself
        ex.execute([ids + 0.7, scale])


def test_list_inputs_of_the_right_kind_stage_as_their_arrays(
        int_and_float_model: GearModel) -> None:
    ex = int_and_float_model.create_executor()
    ids, scale = [[1, 2, 3, 2**40]], [[0.5, 0.7, 1.0, -2.0]]
    ex.execute({"input_ids": ids, "scale": scale})
    layout, staging = int_and_float_model.layout, ex._session.staging
    for i, want in enumerate([np.asarray(ids, np.int64), np.asarray(scale, np.float32)]):
        off = layout.offset(0, i)
        assert bytes(staging[off:off + want.nbytes]) == want.tobytes()


# ---- spec values the file cannot hold ----------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: gr.GearSpec.from_atc(input_shape="x:-1,16", dynamic_dims="2147483648;16"),
    lambda: gr.GearSpec.from_atc(input_shape="x:-1,16", dynamic_batch_size="1,2147483648"),
    lambda: gr.GearSpec.from_ge_options({"ge.inputShape": "x:-1,16",
                                         "ge.dynamicDims": "16;2147483648"}),
    lambda: gr.GearSpec("dims", ("x",), ((-1, 16),), ((16,), (2**31,))),
], ids=["atc dims", "atc batch", "ge options", "direct"])
def test_gear_values_above_int32_are_refused_by_the_spec(make) -> None:
    with pytest.raises(gr.GearSpecError, match="2147483648, out of range") as info:
        make()
    assert info.value.code == "E10013"
    assert "int32" in str(info.value)


def test_the_largest_int32_gear_value_and_int64_static_dims_are_accepted() -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,16", dynamic_dims="2147483647;16")
    assert spec.gears == ((2147483647,), (16,))
    assert gr.GearSpec("dims", ("x",), ((-1, 2**40),), ((1,), (2,))).input_shapes[0][1] == 2**40
    with pytest.raises(gr.GearSpecError, match="out of int64 range") as info:
        gr.GearSpec("dims", ("x",), ((-1, 2**63),), ((1,), (2,)))
    assert info.value.code == "E10013"


def test_cli_compile_reports_an_int32_overflow_without_a_traceback(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(reshape_model().SerializeToString())
    proc = subprocess.run(
        [sys.executable, "-m", "gear_runtime.cli", "compile", str(model), "-o",
         str(tmp_path / "m.gear.onnx"), "--input-shape", "x:-1,-1,8",
         "--dynamic-dims", "2147483648,4;2,8"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "E10013" in proc.stderr + proc.stdout


# ---- gears too large to allocate ---------------------------------------------------------
def huge_model(**kw) -> GearModel:
    """A gear of seq 2**30: 256 GiB of float32 output [1, 2**30, 64]."""
    spec = gr.GearSpec.from_atc(input_shape="ids:1,-1", dynamic_dims="16;1073741824")
    return GearModel(null.open_model(None, spec=spec, input_dtypes=[np.int64],
                                     outputs={"y": [(1, 16, 64), (1, 2**30, 64)]}), **kw)


def test_a_gear_buffer_above_the_limit_is_refused_at_load() -> None:
    with pytest.raises(gr.GearFileError) as info:
        huge_model()
    message = str(info.value)
    assert "gear 1 (1073741824,)" in message and "output 'y'" in message
    assert str(2**30 * 64 * 4) in message  # the size asked
    assert MAX_BUFFER_BYTES_ENV in message


def test_the_buffer_limit_is_a_keyword_and_an_environment_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = gr.GearSpec.from_atc(input_shape="ids:1,-1", dynamic_dims="16;4096")
    info = null.open_model(None, spec=spec, input_dtypes=[np.int64]).info
    total = GearModel(null.NullModel(info), max_buffer_bytes=10**6).layout.total_bytes
    GearModel(null.NullModel(info), max_buffer_bytes=total)  # exactly at the limit: fine
    with pytest.raises(gr.GearFileError, match=f"the staging buffer .* needs {total} bytes"):
        GearModel(null.NullModel(info), max_buffer_bytes=total - 1)
    with pytest.raises(gr.GearFileError, match=r"gear 1 \(4096,\): input 'ids' of shape "
                                               r"\(1, 4096\) needs 32768 bytes"):
        GearModel(null.NullModel(info), max_buffer_bytes=4096 * 8 - 1)
    monkeypatch.setenv(MAX_BUFFER_BYTES_ENV, "1000")
    with pytest.raises(gr.GearFileError, match="gear 1"):
        GearModel(null.NullModel(info))
    assert GearModel(null.NullModel(info), max_buffer_bytes=10**6).max_buffer_bytes == 10**6
    monkeypatch.setenv(MAX_BUFFER_BYTES_ENV, "lots")
    with pytest.raises(gr.InputError, match=f"{MAX_BUFFER_BYTES_ENV} must be a positive"):
        GearModel(null.NullModel(info))
    monkeypatch.delenv(MAX_BUFFER_BYTES_ENV)
    with pytest.raises(gr.InputError, match="max_buffer_bytes must be a positive integer"):
        GearModel(null.NullModel(info), max_buffer_bytes=0)
    assert huge_model(max_buffer_bytes=2**40).max_buffer_bytes == 2**40  # raised on purpose


def test_load_takes_the_buffer_limit(reshape_gear_file: str) -> None:
    with pytest.raises(gr.GearFileError, match="more than the limit of 64 bytes"):
        gr.load(reshape_gear_file, backend="null", max_buffer_bytes=64)
