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
    of request values (an optimal gear takes each value from some request)."""
    width = requests.shape[1]
    grid = [tuple(g) for g in itertools.product(*[np.unique(requests[:, v]).tolist()
                                                  for v in range(width)])]
    best = np.inf
    for k in range(1, max_gears + 1):
        for gears in itertools.combinations(grid, k):
            plan = evaluate(gears, requests, cost)
            if plan.uncovered == 0:
                best = min(best, plan.mean_cost * len(requests))
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
    assert plan.to_atc().startswith("--dynamic_dims=") and ",16;" in plan.to_atc()
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
