"""The gear planner: exact DP (vs brute force), the heuristic (vs the exact optimum), the CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.cli import main
from gear_runtime.errors import InputError
from gear_runtime.tools.plan import LatencyCurve, evaluate, plan_gears, structure_of
from gear_runtime.tools.plan import search as planner


def brute_force(requests: np.ndarray, max_gears: int, cost) -> float:
    """The least total cost over every gear set of at most max_gears gears drawn from the grid
    of request values (an optimal gear takes each value from some request): each request on
    its cheapest covering gear, a set that leaves one uncovered costs inf."""
    width = requests.shape[1]
    grid = np.array(list(itertools.product(*[np.unique(requests[:, v]).tolist()
                                             for v in range(width)])))
    gear_cost = np.array([cost(tuple(int(x) for x in g)) for g in grid])
    covers = (grid[:, None, :] >= requests[None, :, :]).all(axis=2)  # [gear, request]
    weighted = np.where(covers, gear_cost[:, None], np.inf)
    best = np.inf
    for k in range(1, max_gears + 1):
        for gears in itertools.combinations(range(len(grid)), k):
            best = min(best, float(weighted[list(gears)].min(axis=0).sum()))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_dp_equals_brute_force_on_one_value(seed: int) -> None:
    rng = np.random.default_rng(seed)
    requests = rng.integers(1, 40, size=int(rng.integers(3, 30)))
    k = int(rng.integers(1, 4))
    power = float(rng.uniform(0.5, 2.0))
    cost = (lambda g: 5.0 + g[0] ** power) if seed % 2 else "elements"
    plan = plan_gears(requests.tolist(), k, cost)
    fn = cost if callable(cost) else (lambda g: float(g[0]))
    assert plan.exact and len(plan.gears) <= k and plan.uncovered == 0
    assert plan.gears[-1] == (int(requests.max()),)
    assert plan.mean_cost * len(requests) == pytest.approx(brute_force(requests[:, None], k, fn))


def test_tied_values_are_planned_as_one_and_constants_stay() -> None:
    rng = np.random.default_rng(1)
    seq = rng.integers(1, 300, size=200)
    requests = [(int(s), int(s), int(s), 16) for s in seq]
    assert structure_of(np.array(requests)).groups == [[0, 1, 2]]
    plan = plan_gears(requests, 3, "elements")
    assert plan.exact and all(g[0] == g[1] == g[2] and g[3] == 16 for g in plan.gears)
    assert plan.to_atc().startswith('--dynamic_dims="') and ",16;" in plan.to_atc()
    assert plan.to_config()[0].startswith('ge.dynamicDims="')
    assert plan.to_config()[2].startswith("dynamic_dims=[")


@pytest.mark.parametrize("greedy", [False, True], ids=["enumerated", "greedy"])
def test_several_values_against_the_exact_answer(greedy: bool, monkeypatch) -> None:
    if greedy:  # the search used beyond ENUMERATE_LIMIT gear sets
        monkeypatch.setattr(planner, "ENUMERATE_LIMIT", 0)
    ratios = []
    for seed in range(30):
        rng = np.random.default_rng(100 + seed)
        requests = np.stack([rng.integers(1, 7, 12), rng.integers(1, 7, 12)], axis=1)
        k = int(rng.integers(1, 4))
        plan = plan_gears(requests, k, "elements")
        assert not plan.exact and plan.uncovered == 0 and len(plan.gears) <= k
        exact = brute_force(requests, k, lambda g: float(g[0] * g[1]))
        ratios.append(plan.mean_cost * len(requests) / exact)
    if greedy:
        assert max(ratios) <= 1.4 and np.mean(np.isclose(ratios, 1.0)) >= 0.5
    else:
        assert np.allclose(ratios, 1.0)  # the small grid is enumerated: the optimum


def test_max_gear_caps_the_plan_and_reports_uncovered() -> None:
    plan = plan_gears([1, 2, 3, 50, 60, 100], 2, "elements", max_gear=64)
    assert plan.gears[-1] == (60,) and plan.uncovered == pytest.approx(1 / 6)


def test_max_gear_is_inclusive() -> None:
    """A request of exactly max_gear is covered (the cap is the largest gear ALLOWED), with one
    value (the DP) and with several (the heuristic: every value at most the cap)."""
    plan = plan_gears([1, 2, 3, 50, 60, 100], 2, "elements", max_gear=60)
    assert plan.gears[-1] == (60,) and plan.uncovered_count == 1  # 100 alone
    plan = plan_gears([60, 60], 1, "elements", max_gear=60)
    assert plan.gears == [(60,)] and plan.uncovered_count == 0
    plan = plan_gears([(60, 1), (2, 60), (61, 1)], 2, "elements", max_gear=60)
    assert plan.uncovered_count == 1 and all(max(g) <= 60 for g in plan.gears)
    assert evaluate(plan.gears, [(60, 1), (2, 60)], lambda g: 1.0, "x").uncovered_count == 0
    with pytest.raises(InputError, match="no request is within max_gear=59"):
        plan_gears([60, 61], 1, "elements", max_gear=59)


def test_measured_cost_follows_the_curve() -> None:
    curve = LatencyCurve((1, 100, 200), (1.0, 1.0, 10.0))  # flat, then steep
    plan = plan_gears(list(range(1, 201)), 2, "measured", curve=curve)
    assert plan.cost_unit == "ms" and plan.gears[-1] == (200,)
    assert plan.gears[0][0] >= 99  # padding to 100 is free on this curve
    with pytest.raises(InputError, match="latency curve"):
        plan_gears([1, 2], 1, "measured")


def test_plan_cli(tmp_path, capsys) -> None:
    from gear_runtime.examples import prefill

    source, _ = prefill.write_example(tmp_path)
    trace = tmp_path / "trace.jsonl"
    rng = np.random.default_rng(0)
    trace.write_text("\n".join(json.dumps({"dims": [int(s)] * 3 + [16]})
                               for s in rng.integers(1, 250, 300)))
    shape = "input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,64"
    plot = tmp_path / "plan.png"
    assert main(["plan", str(source), "--input-shape", shape, "--trace", str(trace),
                 "--max-gears", "3", "--current", "32;64;128;256", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "planned (exact)" in out and "--dynamic_dims=" in out and "current: gears" in out
    assert plot.stat().st_size > 0
    assert main(["plan", str(source), "--input-shape", shape, "--trace", str(trace),
                 "--max-gears", "2", "--cost", "measured", "--ladder", "3",
                 "--iterations", "2"]) == 0
    assert "latency curve" in capsys.readouterr().out
    assert gr.plan_gears is plan_gears


# ---- coverage: every request counts ---------------------------------------------------------
def test_uncovered_requests_are_counted_at_their_own_size_and_shown() -> None:
    requests = [10] * 50 + [100] * 45 + [600] * 5  # 5% above the largest current gear
    now = evaluate([(32,), (128,)], requests, lambda g: float(g[0]), "elements")
    assert now.uncovered_count == 5 and now.coverage == pytest.approx(0.95)
    assert now.mean_cost == pytest.approx((50 * 32 + 45 * 128 + 5 * 600) / 100)
    assert now.covered_mean_cost == pytest.approx((50 * 32 + 45 * 128) / 95)
    assert now.p99_cost == pytest.approx(600)
    text = now.summary()
    assert "coverage 95.00%" in text and "5 uncovered counted at their own size" in text
    plan = plan_gears(requests, 2, "elements")
    assert plan.coverage == 1.0 and plan.uncovered_count == 0 and "coverage 100.00%" in (
        plan.summary())
    capped = plan_gears(requests, 2, "elements", max_gear=128)
    assert capped.uncovered_count == 5 and capped.mean_cost > capped.covered_mean_cost


def test_the_dp_stays_fast_with_thousands_of_sizes_and_gears() -> None:
    import time

    sizes = list(range(1, 3001))
    start = time.perf_counter()
    every = plan_gears(sizes, 3000, "elements")  # a gear per size: nothing to search
    assert len(every.gears) == 3000 and every.waste == 0
    some = plan_gears(sizes, 400, "elements")  # divide and conquer per DP row
    assert len(some.gears) == 400 and some.exact
    assert time.perf_counter() - start < 60  # was O(K m^2): about 82 s for the first alone
    with pytest.raises(InputError, match="DP cells"):
        plan_gears(list(range(1, 200_001)), 200, "elements")


@pytest.mark.parametrize("seed", range(6))
def test_divide_and_conquer_rows_equal_the_plain_recurrence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(20, 120))
    c = np.sort(rng.uniform(1, 100, m))  # a cost that never falls
    prefix = np.concatenate([[0], np.cumsum(rng.integers(1, 9, m))]).astype(float)
    row_plain = row_dc = np.concatenate([[0.0], np.full(m, np.inf)])
    for k in range(1, 6):
        row_plain, _ = planner._row_plain(row_plain, c, prefix, k)
        row_dc, _ = planner._row_dc(row_dc, c, prefix, k)
        np.testing.assert_allclose(row_dc[k:], row_plain[k:])


def test_a_cost_that_falls_is_planned_but_not_called_exact() -> None:
    dips = lambda g: 10.0 if g[0] == 64 else float(g[0])  # noqa: E731 (64 cheaper than 63)
    plan = plan_gears([1, 30, 63, 64, 100], 2, dips)
    assert not plan.exact and plan.uncovered == 0


def test_several_values_with_more_gears_than_candidates_is_bounded() -> None:
    import time

    rng = np.random.default_rng(3)
    requests = np.stack([rng.integers(1, 30, 400), rng.integers(1, 30, 400)], axis=1)
    start = time.perf_counter()
    plan = plan_gears(requests, 3000, "elements")
    assert plan.uncovered == 0 and plan.waste == 0  # a gear per distinct request
    assert all(n > 0 for n in plan.served)  # no idle gear is reported
    assert time.perf_counter() - start < 60


# ---- the command line ---------------------------------------------------------------------------
def _hf_trace(tmp_path, lines) -> tuple[str, str, str]:
    import onnx
    from test_plan_trace import HF_SHAPE, hf_prefill

    model = tmp_path / "hf.onnx"
    onnx.save(hf_prefill(), str(model))
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(model), str(trace), HF_SHAPE


def test_plan_json_carries_the_schema_and_both_plans(tmp_path, capsys) -> None:
    model, trace, shape = _hf_trace(tmp_path, [str(v) for v in [10] * 50 + [100] * 45 + [600] * 5])
    out = tmp_path / "plan.json"
    assert main(["plan", model, "--input-shape", shape, "--trace", trace, "--max-gears", "3",
                 "--current", "32;128", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "current: gears 32,32,32; 128,128,128: coverage 95.00%" in text
    data = json.loads(out.read_text())
    assert data["schema"] == "gear-runtime-plan/1" and data["requests"] == 100
    assert data["planned"]["coverage"] == 1.0 and data["current"]["uncovered_requests"] == 5
    assert data["planned"]["gears"][-1] == [600, 600, 600]
    assert data["dynamic_values"] == ["input_ids[1]", "attention_mask[1]", "position_ids[1]"]
    assert main(["plan", model, "--input-shape", shape, "--trace", trace, "--max-gears", "2",
                 "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["current"] is None  # stdout: the JSON alone


def test_plan_without_matplotlib_still_prints_the_plan(tmp_path, capsys, monkeypatch) -> None:
    from gear_runtime.errors import BackendUnavailableError
    from gear_runtime.tools.bench import plot

    def missing() -> None:
        raise BackendUnavailableError("plots need matplotlib: pip install 'gear_runtime[plot]'")

    monkeypatch.setattr(plot, "check_plotting", missing)
    model, trace, shape = _hf_trace(tmp_path, ["5", "9", "17"])
    assert main(["plan", model, "--input-shape", shape, "--trace", trace, "--max-gears", "2",
                 "--plot", str(tmp_path / "p.png")]) == 2
    captured = capsys.readouterr()
    assert "planned (exact)" in captured.out and not (tmp_path / "p.png").exists()
    assert captured.err.count("\n") == 1 and "--plot: plots need matplotlib" in captured.err


def test_plans_atc_line_pastes_into_bash_and_its_block_is_complete(tmp_path, capsys) -> None:
    """The printed line is one shell word per flag (unquoted, bash ran the compile with the
    first gear and then '116,116: command not found'); a batch axis gets
    --dynamic_batch_size; the [ascend_context] block has the input shape and reads back; a
    line compares the plan with --current."""
    import shlex
    import subprocess

    import onnx
    from models import heavy_model

    from gear_runtime.spec import GearSpec
    source = tmp_path / "m.onnx"
    onnx.save(heavy_model(width=16, layers=1), source)
    trace = tmp_path / "t.jsonl"
    rng = np.random.default_rng(0)
    trace.write_text("\n".join(json.dumps({"dims": [int(s)]}) for s in rng.integers(1, 64, 200)))
    assert main(["plan", str(source), "--input-shape", "x:-1,16", "--trace", str(trace),
                 "--max-gears", "3", "--current", "16;32;64"]) == 0
    out = capsys.readouterr().out
    line = next(x.split("atc: ", 1)[1] for x in out.splitlines() if "atc: " in x)
    echoed = subprocess.run(["bash", "-c", f"printf '%s\\n' {line}"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert len(echoed) == 2 and echoed[0] == "--input_shape=x:-1,16"
    assert echoed[1].startswith("--dynamic_batch_size=")
    flags = dict(a.lstrip("-").split("=", 1) for a in shlex.split(line))
    spec = GearSpec.from_atc(**flags)
    assert spec.mode == "batch" and spec.gear_count == 3
    block = out[out.index("[ascend_context]"):].splitlines()[:3]
    ini = tmp_path / "c.ini"
    ini.write_text("\n".join(block) + "\n")
    assert GearSpec.from_config(ini).gears == spec.gears
    assert "planned vs current: mean" in out and "padding waste" in out
