"""The per-gear benchmark engine: statistics, gear selection, comparison columns, JSON, plot."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from models import CONV_BATCH_SPEC, HEAVY_SPEC, conv_model, heavy_model

import gear_runtime as gr
from gear_runtime import progress as progress_mod
from gear_runtime.errors import BackendUnavailableError, InputError
from gear_runtime.examples import prefill
from gear_runtime.tools.bench import compare as bench_compare
from gear_runtime.tools.bench import context as bench_context
from gear_runtime.tools.bench import engine as bench
from gear_runtime.tools.bench import plot as bench_plot
from gear_runtime.tools.bench import report as bench_report
from gear_runtime.tools.bench import result as bench_result


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("bench")
    model_path, config_path = prefill.write_example(d)
    spec = gr.GearSpec.from_config(str(config_path))
    gear, hybrid = d / "prefill.gear.onnx", d / "prefill.hybrid.onnx"
    gr.compile(str(model_path), spec, str(gear), progress=False)
    gr.compile(str(model_path), spec, str(hybrid), hybrid=True, progress=False)
    return SimpleNamespace(model=model_path, spec=spec, gear=gear, hybrid=hybrid)


def example_inputs(model, gear: int) -> dict[str, np.ndarray]:
    return prefill.example_inputs(model.spec, gear, seed=gear)


def test_stats_percentiles_of_known_samples() -> None:
    s = bench_report.Stats.of_ns([i * 1_000_000 for i in range(1, 101)])  # 1 .. 100 ms
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert (s.mean, s.min) == (pytest.approx(50.5), 1.0)


def test_parse_gears() -> None:
    assert bench.parse_gears("all", 4) == [0, 1, 2, 3]
    assert bench.parse_gears(None, 2) == [0, 1]
    assert bench.parse_gears("2, 0,2", 4) == [2, 0]
    assert bench.parse_gears([1], 4) == [1]
    with pytest.raises(InputError, match=r"index 4 is out of range.*0\.\.3"):
        bench.parse_gears("4", 4)
    with pytest.raises(InputError, match="'x' is not a gear index"):
        bench.parse_gears("0,x", 4)
    with pytest.raises(InputError, match="no gear"):
        bench.parse_gears(",", 4)
    assert bench.parse_gears(np.array([3, 1]), 4) == [3, 1]  # numpy integers are indices


@pytest.mark.parametrize("gears, match", [
    ([1.5], "1.5 is not a gear index"), (["1.5"], "'1.5' is not a gear index"),
    ([True], "True is not a gear index"), (2, "2 is not a gear list"),
])
def test_parse_gears_never_truncates_to_another_gear(gears, match) -> None:
    with pytest.raises(InputError, match=match):
        bench.parse_gears(gears, 4)


@pytest.fixture
def spy_runs(monkeypatch):
    """Counts, per runner, the calls the benchmark makes: execute (and its copy flag), the
    backend's bare run, and ORT session.run on the model's own session (naive) and on any
    other session (the reference: dynamic)."""
    import onnxruntime as ort

    from gear_runtime.backends.onnxruntime import OrtSession
    from gear_runtime.runtime.executor import Executor

    calls: dict[str, list] = {"execute": [], "bare": [], "session.run": [], "order": []}

    def wrap(cls, name, key, record):
        real = getattr(cls, name)

        def spy(self, *args, **kwargs):
            calls[key].append(record(self, args, kwargs))
            calls["order"].append(key if key == "execute" else ("session.run", id(self)))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, spy)

    wrap(Executor, "execute", "execute", lambda self, a, kw: kw.get("copy", True))
    wrap(ort.InferenceSession, "run", "session.run", lambda self, a, kw: id(self))
    real_handles = bench._backend_handles

    def handles(model, executor):  # the bare column's run (execute calls run_bound too)
        h = real_handles(model, executor)
        assert h.bare_run.__func__ is OrtSession.run_bound  # the session's public run_bound
        run = h.bare_run
        h.bare_run = lambda g: (calls["bare"].append(g), calls["order"].append("bare"),
                                run(g))[2]
        return h

    monkeypatch.setattr(bench, "_backend_handles", handles)
    return calls


def test_every_gear_with_all_comparison_columns(example, spy_runs) -> None:
    """Every column runs what it says, once per iteration (plus warm-up), and its figures
    are the statistics of its own per-iteration times."""
    iterations, warmup = 5, 1
    report = bench.bench_model(str(example.gear), iterations=iterations, warmup=warmup,
                               threads=1, reference=str(example.model), inputs=example_inputs,
                               progress=False)
    assert [r.gear for r in report.gears] == [0, 1, 2, 3]
    assert [r.dims for r in report.gears] == list(example.spec.gears)
    runs = warmup + iterations
    # execute: one check run + every iteration, per gear; bare: every iteration of gear g
    assert len(spy_runs["execute"]) == 4 * (runs + 1) and all(spy_runs["execute"])
    assert spy_runs["bare"] == [g for g in range(4) for _ in range(runs)]
    per_session = {s: spy_runs["session.run"].count(s) for s in set(spy_runs["session.run"])}
    # naive: every iteration; dynamic (the reference): a check run + every iteration
    assert sorted(per_session.values()) == [4 * runs, 4 * (runs + 1)]
    for r in report.gears:
        assert set(r.samples_ns) == {"execute", "bare", "naive", "dynamic"}
        for name in r.samples_ns:
            assert len(r.samples_ns[name]) == iterations
            assert getattr(r, name) == bench_report.Stats.of_ns(r.samples_ns[name])
        diffs = np.subtract(r.samples_ns["execute"], r.samples_ns["bare"])
        assert r.overhead_us == pytest.approx(float(np.median(diffs)) / 1e3)
        assert r.speedup_vs_dynamic == pytest.approx(r.dynamic.p50 / r.execute.p50)
        assert r.speedup_vs_naive == pytest.approx(r.naive.p50 / r.execute.p50)
        assert r.throughput_unit == "runs/s"  # dims mode: no batch dim
        assert r.throughput == pytest.approx(1e3 / r.execute.mean)
        s = r.dims[0]
        assert r.output_bytes == s * prefill.VOCAB * 4 + s * 8  # logits f32 + next_token i64
    assert report.reference == str(example.model)
    assert report.rss_after_load_bytes and report.rss_after_load_bytes > 0
    assert report.staging_bytes > 0 and report.output_buffer_bytes > 0
    data = json.loads(json.dumps(report.to_dict()))
    assert [g["gear"] for g in data["gears"]] == [0, 1, 2, 3]
    assert data["gears"][0]["dynamic_ms"]["p50"] == pytest.approx(report.gears[0].dynamic.p50)
    table = report.table().splitlines()
    assert table[0].split()[:5] == ["gear", "dims", "p50", "ms", "p90"]
    assert table[2].startswith("0") and "32,32,32,16" in table[2]


def test_the_runner_order_is_shuffled_every_iteration(example, spy_runs) -> None:
    """No runner always runs first or right after another (warm caches, a spinning thread
    pool would favour it): over 40 iterations each of the 4 runners leads at least once and
    the orders differ."""
    iterations = 40
    bench.bench_model(str(example.gear), gears="1", iterations=iterations, warmup=0,
                      threads=1, reference=str(example.model), inputs=example_inputs,
                      progress=False)
    order = spy_runs["order"][2:]  # after the check runs of execute and of the reference
    assert len(order) == 4 * iterations
    rounds = [tuple(order[4 * i:4 * i + 4]) for i in range(iterations)]
    assert all(len(set(r)) == 4 for r in rounds)  # each runner once per iteration
    assert len({r[0] for r in rounds}) == 4
    assert len(set(rounds)) > iterations // 4


def test_json_carries_its_context_and_each_figure_once(example, spy_runs) -> None:
    report = bench.bench_model(str(example.gear), gears="0,2", iterations=4, warmup=1,
                               threads=1, inputs=example_inputs, progress=False, copy=False)
    assert spy_runs["execute"] and not any(spy_runs["execute"])  # timed as it says: copy=False
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema"] == bench_report.SCHEMA
    assert set(data) == {"schema", "context", "memory", "gears"}  # the setup only in context
    ctx = data["context"]
    machine = ctx["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and machine["usable_cores"] >= 1
    assert len(machine["load_average"]) == 3
    assert ctx["settings"] == {"backend": "onnxruntime", "providers": ["CPUExecutionProvider"],
                               "threads": 1, "warmup": 1, "iterations": 4, "copy": False,
                               "seed": 0, "gears": [0, 2], "reference": None, "pad": False,
                               "fill": "inputs=", "state": None, "in_place_state": False,
                               "request": None}
    import onnxruntime

    assert ctx["versions"] == {"gear_runtime": gr.__version__, "numpy": np.__version__,
                               "onnxruntime": onnxruntime.__version__,
                               "python": ".".join(map(str, sys.version_info[:3]))}
    model = ctx["model"]
    assert model["path"] == str(example.gear.resolve())
    assert model["files"] == [str(example.gear.resolve())]
    assert model["bytes"] == example.gear.stat().st_size
    assert model["digest"] == bench_context.files_digest([str(example.gear)])
    assert model["mode"] == "dims" and model["gears"] == [list(g) for g in example.spec.gears]
    for g, r in zip(data["gears"], report.gears, strict=True):
        # every figure once: no copy of execute's statistics at the top level
        assert "p50" not in g and "latency_ms" not in g
        assert g["execute_ms"] == r.execute.to_dict()
        assert g["samples_ns"]["execute"] == r.samples_ns["execute"]
        assert all(len(v) == 4 and all(isinstance(x, int) and x > 0 for x in v)
                   for v in g["samples_ns"].values())
    assert "execute(copy=False)" in report.table()


def test_model_context_counts_the_data_file(tmp_path) -> None:
    """Size and digest cover the gear file AND its data file: changed weights change them."""
    path = tmp_path / "heavy.gear.onnx"
    gr.compile(heavy_model(), gr.GearSpec.from_atc(**HEAVY_SPEC), str(path),
               progress=False, external_data=True)
    with gr.load(str(path), backend="null") as model:
        ctx = bench_context.model_context(str(path), model)
    data = Path(f"{path}.data")
    assert ctx["files"] == [str(path), str(data)]
    assert ctx["bytes"] == path.stat().st_size + data.stat().st_size
    blob = bytearray(data.read_bytes())
    blob[-1] ^= 1
    data.write_bytes(bytes(blob))
    assert bench_context.files_digest(ctx["files"]) != ctx["digest"]


def test_progress_bar_only_on_a_terminal(example, capsys, monkeypatch) -> None:
    """Logs never get a bar (stderr not a terminal), even when progress is asked for."""
    run = dict(gears="0", iterations=2, warmup=0, backend="null", progress=True)
    bench.bench_model(str(example.gear), **run)
    assert "bench" not in capsys.readouterr().err
    monkeypatch.setattr(progress_mod, "stderr_is_terminal", lambda: True)
    bench.bench_model(str(example.gear), **run)
    assert "bench" in capsys.readouterr().err


def test_bare_and_naive_columns_compute_the_gear(example) -> None:
    """The bare run recomputes gear g's outputs into the executor's buffers from what execute
    staged (cleared buffers come back right: a bare run that does nothing fails here), and
    the naive run gives the same outputs from the model's own session."""
    with gr.load(str(example.gear)) as model, model.create_executor() as ex:
        handles = bench._backend_handles(model, ex)
        assert handles.bare_run is not None and handles.naive_run is not None
        for g in range(model.gear_count):
            feeds = example_inputs(model, g)
            want = ex.execute(feeds)  # arrays of our own
            views = ex.execute(feeds, copy=False)  # the executor's buffers
            for v in views:
                v[...] = -7
            handles.bare_run(g)
            for got, w in zip(views, want, strict=True):
                np.testing.assert_array_equal(got, w)
            for got, w in zip(handles.naive_run(feeds), want, strict=True):
                np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_naive_column_runs_the_models_own_session(example) -> None:
    report = bench.bench_model(str(example.hybrid), gears="0", iterations=3, warmup=0,
                               inputs=example_inputs, progress=False)
    assert report.reference is None and report.gears[0].dynamic is None
    assert report.gears[0].naive is not None and report.gears[0].bare is not None


def test_without_reference_there_is_no_dynamic_column(example) -> None:
    report = bench.bench_model(str(example.gear), gears="1,3", iterations=3, warmup=0,
                               progress=False)  # default inputs: ints 1, floats normal
    assert [r.gear for r in report.gears] == [1, 3]
    assert all(r.dynamic is None and r.speedup_vs_dynamic is None for r in report.gears)
    assert "not known: pass --reference" in report.table()


def test_inputs_of_another_gear_are_refused(example) -> None:
    with pytest.raises(InputError, match="selected gear 0"):
        bench.bench_model(str(example.gear), gears="2", iterations=1, progress=False,
                          inputs=lambda m, g: example_inputs(m, 0))


@pytest.mark.parametrize("kwargs, match", [
    ({"iterations": 0}, "iterations"), ({"warmup": -1}, "warmup"), ({"threads": 0}, "threads"),
    ({"reference": "/nonexistent/model.onnx"}, "does not exist"),
])
def test_bad_arguments(example, kwargs, match) -> None:
    with pytest.raises(InputError, match=match):
        bench.bench_model(str(example.gear), progress=False, **kwargs)


def test_batch_mode_counts_items(tmp_path) -> None:
    path = tmp_path / "conv.gear.onnx"
    gr.compile(conv_model(), gr.GearSpec.from_atc(**CONV_BATCH_SPEC), str(path), progress=False)
    report = bench.bench_model(str(path), iterations=3, warmup=0, progress=False)
    assert [r.items for r in report.gears] == [1, 4, 8]
    r = report.gears[2]
    assert r.throughput_unit == "items/s"
    assert r.throughput == pytest.approx(8 * 1e3 / r.execute.mean)


def test_other_backends_get_no_comparison_columns(example) -> None:
    report = bench.bench_model(str(example.gear), backend="null", iterations=2, warmup=0,
                               progress=False)
    assert all(r.bare is None and r.naive is None and r.overhead_us is None
               for r in report.gears)
    assert report.backend == "null"


def test_bench_hooks_are_an_optional_protocol_only_ort_offers(example) -> None:
    """The backend interface carries no benchmark hooks; the ORT backend offers them as the
    protocols of backends/bench_hooks.py, which the bench checks with isinstance."""
    from gear_runtime.backends.base import BackendModel, BackendSession
    from gear_runtime.backends.bench_hooks import BenchModel, BenchSession

    hooks = {"run_bound", "has_bare_run", "output_nbytes", "naive_run", "has_naive_run",
             "execution_providers", "gear_file_path"}
    assert not hooks & (set(dir(BackendModel)) | set(dir(BackendSession)))
    with gr.load(str(example.gear)) as model, model.create_executor() as ex:
        assert isinstance(model.backend_model, BenchModel)
        assert isinstance(ex.session, BenchSession)
    with gr.load(str(example.gear), backend="null") as model, model.create_executor() as ex:
        assert not isinstance(model.backend_model, BenchModel)
        assert not isinstance(ex.session, BenchSession)


@pytest.mark.parametrize("given", ["path", "model"])
def test_closes_what_it_opened(example, monkeypatch, given) -> None:
    """The executor it creates is closed; the model only when it loaded it (the caller's
    model stays open for the caller)."""
    from gear_runtime.runtime.executor import Executor
    from gear_runtime.runtime.model import GearModel

    closed: list[str] = []

    def record_close(cls: type) -> None:
        real = cls.close

        def close(self) -> None:
            closed.append(cls.__name__)
            real(self)

        monkeypatch.setattr(cls, "close", close)

    record_close(GearModel)
    record_close(Executor)
    model = str(example.gear) if given == "path" else gr.load(str(example.gear), backend="null")
    bench.bench_model(model, backend="null", iterations=1, warmup=0, progress=False)
    # GearModel.close closes the model's executors again (idempotent): the executor is
    # closed first, by bench itself, and the caller's model stays open.
    assert closed[0] == "Executor"
    assert closed.count("GearModel") == (1 if given == "path" else 0)


def test_plot_shows_percentiles_and_distributions_on_log_scales(example, tmp_path,
                                                                figures) -> None:
    report = bench.bench_model(str(example.gear), gears="0,1", iterations=6, warmup=0,
                               reference=str(example.model), inputs=example_inputs,
                               progress=False)
    out = bench_plot.plot_report(report, tmp_path / "latency.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = figures
    left, right = fig.axes
    assert left.get_yscale() == right.get_yscale() == "log"
    # left: per runner its p50, p90 and p99 markers at the statistics' values
    for name in bench_report.RUNNERS:
        lines = [ln for ln in left.get_lines()
                 if ln.get_color() == bench_plot.RUNNER_COLORS[name] or ln.get_label() == name]
        ys = sorted(float(y) for ln in lines for y in ln.get_ydata())
        stats = [getattr(r, name) for r in report.gears]
        want = sorted(getattr(s, q) for s in stats for q in ("p50", "p90", "p99"))
        assert ys == pytest.approx(want), name
    # right: one box per gear and runner, its median the median of the raw times
    assert len(right.patches) == 2 * len(bench_report.RUNNERS)
    medians = sorted(float(ln.get_ydata()[0]) for ln in right.get_lines()
                     if ln.get_gid() == "median")
    want = sorted(float(np.median(r.samples_ns[n])) / 1e6 for r in report.gears
                  for n in bench_report.RUNNERS)
    assert medians == pytest.approx(want)


def test_plot_without_matplotlib_names_the_package(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(BackendUnavailableError, match="pip install matplotlib"):
        bench_plot.check_plotting()


def test_rss_is_measured() -> None:
    assert (bench_context.rss_bytes() or 0) > 10 * 1024 * 1024  # a Python with numpy is above 10 MB


# ---- the benchmark scripts (benchmarks/, outside pytest collection) ---------------------------
@pytest.fixture
def scripts(monkeypatch):
    """benchmarks/ importable as run_all, bench_gears, bench_memory."""
    here = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(here))
    import bench_gears
    import bench_memory
    import run_all

    return SimpleNamespace(dir=here, run_all=run_all, gears=bench_gears, memory=bench_memory)


def test_run_all_reads_bench_core_table(scripts) -> None:
    proc = subprocess.run([sys.executable, str(scripts.dir / "bench_core.py"), "--quick",
                           "--repeats", "1"], capture_output=True, text=True, timeout=120)
    rows = scripts.run_all._core_rows(proc.stdout)
    assert len(rows) >= 5, proc.stdout
    assert all(r["bench"] == "core" and r["value"] > 0 for r in rows)
    assert {r["status"] for r in rows} <= {"PASS", "FAIL", "info"}
    assert any(r["target"] for r in rows)


def test_bench_gears_rows(scripts) -> None:
    rows = scripts.gears.run(iterations=3, warmup=0, repeats=1)
    speedups = [r for r in rows if "speed-up vs ORT dynamic" in r["metric"]]
    assert len(speedups) == 4 and all(r["value"] > 0 for r in speedups)  # 4 gears
    assert len([r for r in rows if "(copy=False)" in r["metric"]]) == 4  # both copy modes
    table = scripts.run_all.format_rows(rows)
    assert table.splitlines()[0].split() == ["bench", "metric", "value", "target", "status"]


def test_bench_memory_small_model(scripts) -> None:
    rows = scripts.memory.run(width=256, layers=2, repeats=1)
    ratio = next(r for r in rows if r["metric"] == "8-gear / 1-gear load RSS")
    # the weights are stored once: 8 gears load in about the memory of 1
    assert 0 < ratio["value"] <= scripts.memory.MAX_RATIO and ratio["status"] == "PASS", rows


# ---- comparing two runs -------------------------------------------------------------------------
def steady_times(median_ns: float, n: int, seed: int) -> list[int]:
    """Per-iteration times shaped like this machine's (a tight lognormal body, 5% of them
    slowed 20x by the scheduler), seeded: verdict tests must not depend on how busy the
    machine happens to be while the suite runs."""
    rng = np.random.default_rng(seed)
    times = rng.lognormal(np.log(median_ns), 0.05, n)
    times[rng.random(n) < 0.05] *= 20
    return times.astype(np.int64).tolist()


@pytest.fixture(scope="module")
def result(example) -> dict:
    """A real run of gears 0 and 1 as its JSON holds it, its execute times made steady."""
    report = bench.bench_model(str(example.gear), gears="0,1", iterations=40, warmup=2,
                               threads=1, inputs=example_inputs, progress=False)
    data = json.loads(json.dumps(report.to_dict()))
    for k, g in enumerate(data["gears"]):
        g["samples_ns"]["execute"] = steady_times(2e5 * (k + 1), 40, seed=k)
    return data


def slowed(data: dict, gear_index: int, factor: float) -> dict:
    out = copy.deepcopy(data)
    g = out["gears"][gear_index]
    g["samples_ns"]["execute"] = [int(v * factor) for v in g["samples_ns"]["execute"]]
    return out


def test_compare_flags_an_injected_30_percent_slowdown(result) -> None:
    cmp = bench_compare.compare_results(result, slowed(result, 1, 1.3))
    assert [d.verdict for d in cmp.gears] == ["within noise", "slower"]
    slow = cmp.gears[1]
    assert slow.ratio == pytest.approx(1.3, rel=0.01) and 1.05 < slow.low <= 1.3 <= slow.high
    assert slow.bare_ratio == 1.0  # the backend alone did not move: the runtime did
    assert [d.gear for d in cmp.regressions(10)] == [1] and cmp.regressions(40) == []
    faster = bench_compare.compare_results(slowed(result, 1, 1.3), result)
    assert [d.verdict for d in faster.gears] == ["within noise", "faster"]
    table = cmp.table().splitlines()
    assert table[0].split()[:2] == ["gear", "dims"] and "slower" in table[3]


def test_compare_calls_identical_runs_within_noise(result) -> None:
    same = bench_compare.compare_results(result, copy.deepcopy(result))
    assert [d.verdict for d in same.gears] == ["within noise"] * 2
    assert all(d.ratio == 1.0 and d.low <= 1.0 <= d.high for d in same.gears)
    # two draws of the same (skewed, outlier-prone) distribution: within noise too
    rng = np.random.default_rng(1)
    a, b = copy.deepcopy(result), copy.deepcopy(result)
    for data in (a, b):
        for g in data["gears"]:
            g["samples_ns"]["execute"] = (rng.lognormal(np.log(2e5), 0.3, 200)).astype(int)\
                .tolist()
    assert [d.verdict for d in bench_compare.compare_results(a, b).gears] == \
        ["within noise"] * 2


def test_a_drift_inside_the_noise_band_is_within_noise(result) -> None:
    """3% slower with a tight interval: the machine's run-to-run drift, not a change, under
    the default 5% band; a change when the band is 0 (the interval alone)."""
    drift = slowed(result, 1, 1.03)
    assert bench_compare.compare_results(result, drift).gears[1].verdict == "within noise"
    gear = bench_compare.compare_results(result, drift, noise=0).gears[1]
    assert gear.low > 1 and gear.verdict == "slower"


def wide(result: dict, gear_index: int, factor: float, sigma: float = 0.5) -> tuple[dict, dict]:
    """Two runs whose gear ``gear_index`` has widely spread times (40 iterations, lognormal
    sigma ``sigma``), the second the first times ``factor`` exactly."""
    a = copy.deepcopy(result)
    times = np.random.default_rng(5).lognormal(np.log(2e5), sigma, 40)
    a["gears"][gear_index]["samples_ns"]["execute"] = times.astype(np.int64).tolist()
    return a, slowed(a, gear_index, factor)


@pytest.mark.parametrize("factor", [1.08, 0.92])
def test_the_verdict_is_the_interval_not_the_point_ratio(result, factor) -> None:
    """8% slower (or faster) medians, beyond the 5% band as a point, but the interval of
    so spread a run reaches inside the band: within noise. (A verdict from the point ratio
    would call it slower / faster.)"""
    before, after = wide(result, 1, factor)
    gear = bench_compare.compare_results(before, after).gears[1]
    assert gear.ratio == pytest.approx(factor, rel=1e-3)
    assert not 1 / 1.05 <= gear.ratio <= 1.05  # the point alone is beyond the band
    assert gear.low < 1.05 and gear.high > 1 / 1.05  # the interval is not
    assert gear.verdict == "within noise"


def test_a_machine_that_moved_is_marked_and_never_a_regression(result) -> None:
    """execute and the bare backend run both 45% faster: the machine (or the backend)
    changed; the verdict says so, the warning names the gear, the normalised ratio is ~1,
    and --fail-on-regression does not count it."""
    before = copy.deepcopy(result)
    for k, g in enumerate(before["gears"]):  # steady bare times too: the machine is busy
        g["samples_ns"]["bare"] = steady_times(1.5e5 * (k + 1), 40, seed=10 + k)
    after = copy.deepcopy(before)
    for runner in ("execute", "bare"):
        g = after["gears"][1]["samples_ns"]
        g[runner] = [int(v * 0.55) for v in g[runner]]
    cmp = bench_compare.compare_results(before, after)
    gear = cmp.gears[1]
    assert gear.verdict == "machine changed" and gear.bare_ratio == pytest.approx(0.55, rel=0.01)
    assert gear.bare_high < 1 / 1.05 and gear.normalised_ratio == pytest.approx(1.0, rel=0.02)
    assert any(w.startswith("gear 1: the bare run") for w in cmp.warnings)
    assert cmp.gears[0].verdict == "within noise" and cmp.regressions(0) == []
    assert "machine changed" in cmp.table()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, -5, "1", None, True])
def test_compare_refuses_timings_that_are_not_positive_finite(result, bad) -> None:
    """A NaN would make every verdict 'within noise' (and --fail-on-regression pass)."""
    after = copy.deepcopy(result)
    after["gears"][1]["samples_ns"]["execute"][3] = bad
    with pytest.raises(InputError, match=r"gears\[1\]\.samples_ns\.execute: sample 3"):
        bench_compare.compare_results(result, after)


def test_the_bootstrap_memory_is_bounded_and_its_draws_unchanged(monkeypatch) -> None:
    """Drawn in blocks: the same interval as one draw of everything, whatever the block."""
    rng = np.random.default_rng(3)
    before, after = rng.lognormal(0, 0.2, 300), rng.lognormal(0.1, 0.2, 300)
    whole = bench_compare.bootstrap_ratio_interval(before, after, np.random.default_rng(9))
    monkeypatch.setattr(bench_compare, "BOOTSTRAP_BLOCK", 1000)  # 3 rows of 300 per block
    blocks = bench_compare.bootstrap_ratio_interval(before, after, np.random.default_rng(9))
    assert blocks == whole


def test_bootstrap_interval_covers_the_true_ratio() -> None:
    rng = np.random.default_rng(2)
    before = rng.lognormal(0, 0.2, 300)
    low, high = bench_compare.bootstrap_ratio_interval(before, before * 1.1, rng)
    assert low < 1.1 < high and high - low < 0.15


def test_compare_refuses_different_models_and_gear_sets(result) -> None:
    other = copy.deepcopy(result)
    other["context"]["model"]["digest"] = f"{bench_context.FILES_DIGEST}:" + "0" * 32
    with pytest.raises(InputError, match="measured different models.*same gear file"):
        bench_compare.compare_results(result, other)
    fewer = copy.deepcopy(result)
    fewer["gears"] = fewer["gears"][:1]
    with pytest.raises(InputError, match=r"different gear sets: \[0: 32.*1: 64.*\] vs \[0: 32"):
        bench_compare.compare_results(result, fewer)


def test_compare_warns_when_machines_or_settings_differ(result) -> None:
    other = copy.deepcopy(result)
    other["context"]["machine"]["cpu"] = "Another CPU"
    other["context"]["settings"]["threads"] = 4
    other["context"]["machine"]["load_average"] = [50.0, 1.0, 1.0]
    warnings = bench_compare.compare_results(result, other).warnings
    assert any("different machines: cpu" in w and "Another CPU" in w for w in warnings)
    assert any("different settings: threads 1 vs 4" in w for w in warnings)
    assert any("after started on a busy machine: load average 50.00" in w for w in warnings)
    same = bench_compare.compare_results(result, result).warnings
    assert all("busy" in w for w in same)  # the machine may be busy; nothing else differs


def test_compare_refuses_an_old_or_foreign_json(tmp_path, result) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"model": "m", "gears": [{"gear": 0, "p50": 1.0}]}))
    with pytest.raises(InputError, match="older gear-runtime.*bench --json again"):
        bench_result.load_result(old)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        bench_result.load_result(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(result))
    assert bench_result.load_result(good) == result


def test_comparison_plot(result, tmp_path, figures) -> None:
    after = slowed(result, 1, 1.3)
    cmp = bench_compare.compare_results(result, after)
    out = bench_compare.plot_comparison(cmp, result, after, tmp_path / "cmp.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    ratios, dists = fig.axes
    assert dists.get_yscale() == "log" and len(dists.patches) == 4  # before/after per gear
    points = [float(ln.get_ydata()[0]) for ln in ratios.get_lines() if ln.get_marker() == "o"]
    assert points == pytest.approx([d.ratio for d in cmp.gears])
