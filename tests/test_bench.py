"""The per-gear benchmark engine: statistics, gear selection, comparison columns, JSON, plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from models import CONV_BATCH_SPEC, conv_model

import gear_runtime as gr
from gear_runtime import bench
from gear_runtime.errors import BackendUnavailableError, InputError
from gear_runtime.examples import prefill


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
    s = bench.Stats.of_ns([i * 1_000_000 for i in range(1, 101)])  # 1 .. 100 ms
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


def test_every_gear_with_all_comparison_columns(example) -> None:
    report = bench.bench_model(str(example.gear), iterations=5, warmup=1, threads=1,
                               reference=str(example.model), inputs=example_inputs,
                               progress=False)
    assert [r.gear for r in report.gears] == [0, 1, 2, 3]
    assert [r.dims for r in report.gears] == list(example.spec.gears)
    for r in report.gears:
        for s in (r.execute, r.bare, r.naive, r.dynamic):
            assert s is not None and 0 < s.min <= s.p50 <= s.p90 <= s.p99
        assert r.overhead_us is not None and np.isfinite(r.overhead_us)
        assert r.speedup_vs_dynamic == pytest.approx(r.dynamic.p50 / r.execute.p50)
        assert r.throughput_unit == "runs/s"  # dims mode: no batch dim
        assert r.throughput == pytest.approx(1e3 / r.execute.mean)
        s = r.dims[0]
        assert r.output_bytes == s * prefill.VOCAB * 4 + s * 8  # logits f32 + next_token i64
    assert report.reference == str(example.model)
    assert report.rss_after_load_bytes and report.rss_after_load_bytes > 0
    assert report.staging_bytes > 0 and report.output_buffer_bytes > 0
    data = json.loads(json.dumps(report.to_dict()))
    assert [g["gear"] for g in data["gears"]] == [0, 1, 2, 3]
    assert all({"p50", "p90", "p99"} <= set(g) for g in data["gears"])
    assert data["gears"][0]["dynamic_ms"]["p50"] == pytest.approx(report.gears[0].dynamic.p50)
    table = report.table().splitlines()
    assert table[0].split()[:5] == ["gear", "dims", "p50", "ms", "p90"]
    assert table[2].startswith("0") and "32,32,32,16" in table[2]


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


@pytest.mark.parametrize("given", ["path", "model"])
def test_closes_what_it_opened(example, monkeypatch, given) -> None:
    """The executor it creates is closed; the model only when it loaded it (the caller's
    model stays open for the caller)."""
    from gear_runtime.executor import Executor
    from gear_runtime.model import GearModel

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


def test_plot_writes_a_png(example, tmp_path) -> None:
    report = bench.bench_model(str(example.gear), gears="0,1", iterations=2, warmup=0,
                               reference=str(example.model), inputs=example_inputs,
                               progress=False)
    out = bench.plot_report(report, tmp_path / "latency.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_package(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(BackendUnavailableError, match="pip install matplotlib"):
        bench.check_plotting()


def test_rss_is_measured() -> None:
    assert (bench.rss_bytes() or 0) > 10 * 1024 * 1024  # a Python with numpy is above 10 MB


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
    rows = scripts.gears.run(iterations=3, warmup=0)
    speedups = [r for r in rows if "speed-up vs ORT dynamic" in r["metric"]]
    assert len(speedups) == 4 and all(r["value"] > 0 for r in speedups)  # 4 gears
    table = scripts.run_all.format_rows(rows)
    assert table.splitlines()[0].split() == ["bench", "metric", "value", "target", "status"]


def test_bench_memory_small_model(scripts) -> None:
    rows = scripts.memory.run(width=256, layers=2, repeats=1)
    ratio = next(r for r in rows if r["metric"] == "8-gear / 1-gear load RSS")
    assert ratio["value"] > 0 and ratio["status"] in ("PASS", "FAIL")
