"""The command line on the seed's stateful pair (#54): ``run`` / ``bench`` with ``--state`` and
``--in-place-state``, ``inspect`` and ``bench`` of a static model, and the 145013 error of a
request between the gears. In process (``cli.main``), on the shipped example builders."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_support import assert_one_line_error, run_cli

import gear_runtime as gr
from gear_runtime.examples import causal_lm, gqa_lm, prefill
from gear_runtime.tools import generate

SIZES = causal_lm.SMALL
STATE = ["--state", "past_kv=present_kv"]
#: a prompt of 100 tokens: between the example prefill's gears 64 and 128
SHAPES_100 = "input_ids:1x100,attention_mask:1x100,position_ids:4x1x100,image_embeds:16x64"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> SimpleNamespace:
    """The seed's pair: prefill.onnx, its gear file and the static decode.onnx."""
    d = tmp_path_factory.mktemp("pair")
    source, gear, decode = generate.build_pair(d, SIZES)
    return SimpleNamespace(dir=d, source=source, gear=gear, decode=decode)


def _step_files(d: Path, token: int, position: int, cache: np.ndarray) -> list[str]:
    """``--input`` flags of one decode step whose state starts at ``cache``."""
    np.save(d / "ids.npy", np.array([[token]], np.int64))
    np.save(d / "pos.npy", np.array([position], np.int64))
    np.save(d / "cache.npy", cache)
    return ["--input", f"input_ids={d / 'ids.npy'}", "--input", f"position={d / 'pos.npy'}",
            "--input", f"past_kv={d / 'cache.npy'}"]


# ---- run --state ------------------------------------------------------------------------------
def test_run_with_state_runs_steps_with_the_cache_resident(capsys, pair, tmp_path) -> None:
    """Two steps (--loop 2) from a given cache: the logits are the second step's of an
    executor keeping the same state, only the non-state output is saved, and the document
    names the state and what the steps were fed."""
    cache = np.random.default_rng(0).standard_normal(SIZES.cache_shape).astype(np.float32)
    flags = _step_files(tmp_path, 7, 3, cache)
    out = tmp_path / "out"
    code, text, err = run_cli(capsys, "run", pair.decode, *STATE, *flags, "--loop", "2",
                              "--output-dir", out, "--json", tmp_path / "run.json")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["logits.npy"]
    assert "state past_kv <- present_kv" in text and "resident (double-buffered" in text
    ex = gr.load(str(pair.decode)).create_executor(state=causal_lm.STATE)
    ex.set_state("past_kv", cache)
    feeds = {"input_ids": np.array([[7]], np.int64), "position": np.array([3], np.int64)}
    ex.execute(feeds)
    (want,) = ex.execute(feeds)  # the second step reads what the first wrote
    np.testing.assert_array_equal(np.load(out / "logits.npy"), want)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [i["name"] for i in doc["inputs"]] == ["input_ids", "position"]
    assert [o["name"] for o in doc["outputs"]] == ["logits"]
    assert doc["state"] == [{"input": "past_kv", "output": "present_kv",
                             "mode": "double-buffered", "dtype": "float32",
                             "shape": list(SIZES.cache_shape),
                             "file": str(tmp_path / "cache.npy")}]


@pytest.mark.parametrize(("state", "fragments"), [
    ("nope=present_kv", ["--state nope=present_kv", "no input 'nope'"]),
    ("past_kv=nope", ["--state past_kv=nope", "no output 'nope'"]),
])
@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_state_name_the_model_lacks_is_named_with_its_inputs_and_outputs(
        capsys, pair, command, state, fragments) -> None:
    code, _, err = run_cli(capsys, command, pair.decode, "--state", state)
    assert code == 2
    assert_one_line_error(err, *fragments, "its inputs: input_ids, position, past_kv",
                          "its outputs: logits, present_kv")


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--in-place-state"], "--in-place-state needs --state IN=OUT"),
    (["--state", "past_kv"], "expected INPUT=OUTPUT"),
    ([*STATE, "--in-place-state"], "cannot run in place"),  # no GroupQueryAttention here
    ([*STATE, "--shapes", "past_kv:1x1"], "a resident state (--state)"),
])
def test_state_flags_that_cannot_work_are_one_line_errors(capsys, pair, flags,
                                                          fragment) -> None:
    code, _, err = run_cli(capsys, "run", pair.decode, *flags)
    assert code == 2
    assert_one_line_error(err, fragment)


def test_run_and_bench_keep_a_gqa_cache_in_place(capsys, tmp_path) -> None:
    """onnxruntime-genai's layout: every layer's key and value in place, one decode step."""
    _, gear = gqa_lm.write_model(tmp_path, gqa_lm.SMALL)
    flags = [f for i, o in gqa_lm.state_pairs(gqa_lm.SMALL).items()
             for f in ("--state", f"{i}={o}")] + ["--in-place-state"]
    step = ["--dynamic-dims", f"1,{gqa_lm.SMALL.max_seq}"]
    code, text, err = run_cli(capsys, "run", gear, *flags, *step, "--output-dir", tmp_path,
                              "--json", "-")
    assert code == 0, err
    doc = json.loads(text)
    assert [o["name"] for o in doc["outputs"]] == ["logits"]
    assert {s["mode"] for s in doc["state"]} == {"in place"} and len(doc["state"]) == 4
    code, text, err = run_cli(capsys, "bench", gear, *flags, *step, "--iterations", "3",
                              "--warmup", "1", "--no-progress", "--json", "-")
    assert code == 0, err
    assert json.loads(text)["context"]["settings"]["in_place_state"] is True


# ---- bench --state ----------------------------------------------------------------------------
def test_bench_times_the_step_with_the_cache_resident(capsys, pair, tmp_path) -> None:
    """The executor stages the step's inputs alone (the cache is not copied in), the naive
    column feeds and returns the cache every run, and the report says so."""
    out = tmp_path / "b.json"
    code, text, err = run_cli(capsys, "bench", pair.decode, *STATE, "--iterations", "3",
                              "--warmup", "1", "--no-progress", "--json", out)
    assert code == 0, err
    cache_bytes = int(np.prod(SIZES.cache_shape)) * 4
    doc = json.loads(out.read_text())
    assert doc["context"]["settings"]["state"] == causal_lm.STATE
    assert doc["memory"]["executor_state_bytes"] == cache_bytes
    assert doc["memory"]["executor_staging_bytes"] < cache_bytes  # ids and position alone
    assert doc["gears"][0]["input_bytes"] < 64 and doc["gears"][0]["naive_ms"] is not None
    assert "past_kv <- present_kv (double-buffered) stays resident" in text
    assert "the state inputs too: copied in and out every run" in text
    code, text, err = run_cli(capsys, "bench", pair.decode, *STATE, "--shapes",
                              "input_ids:1x1,position:1", "--iterations", "2", "--warmup", "0",
                              "--no-progress")
    assert code == 0, err


# ---- a static model: inspect and bench --------------------------------------------------------
def test_inspect_says_plainly_a_static_model_is_one(capsys, pair) -> None:
    code, text, err = run_cli(capsys, "inspect", pair.decode)
    assert code == 0, err
    assert text.startswith(f"static model  {pair.decode}")
    assert "runs as one gear (gear 0)" in text
    for gear_file_fact in ("gear file", "format", "kind case", "1 gears", "not a gear file",
                           "dims"):
        assert gear_file_fact not in text, gear_file_fact
    assert "past_kv    float32  [2,2,1,4,256,16]" in text
    assert "present_kv  float32  [2,2,1,4,256,16]" in text
    code, text, _ = run_cli(capsys, "inspect", pair.decode, "--json", "-")
    doc = json.loads(text)
    assert (doc["format"], doc["kind"], doc["mode"]) == (None, "static", "static")


def test_inspect_of_a_gear_file_is_unchanged(capsys, pair) -> None:
    code, text, err = run_cli(capsys, "inspect", pair.gear)
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0] == f"gear file   {pair.gear}"
    assert lines[1] == "format      2, kind case"
    assert lines[2] == "mode        dims (dynamic_type dims), 3 gears, 2 value(s) per gear"
    assert "  2     128,128  input_ids[1,128] attention_mask[1,128]" in text
    assert text.rstrip().splitlines()[-3].startswith("files:")


def test_bench_of_a_static_model_says_static_and_suggests_no_reference(capsys, pair) -> None:
    code, text, err = run_cli(capsys, "bench", pair.decode, "--iterations", "2", "--warmup",
                              "0", "--no-progress")
    assert code == 0, err
    assert "(dims )" not in text and "--reference" not in text
    assert text.splitlines()[2].split()[:2] == ["0", "static"]
    assert "of gear 0 (a static model)" in text
    code, text, err = run_cli(capsys, "bench", pair.gear, "--gears", "0", "--iterations", "2",
                              "--warmup", "0", "--no-progress")
    assert code == 0, err
    assert "not known: pass --reference" in text and "of gear 0 (dims 32,32)" in text


# ---- 145013: a request between the gears ------------------------------------------------------
@pytest.fixture(scope="module")
def four_gears(tmp_path_factory) -> Path:
    """The example prefill at seq gears 32, 64, 128 and 256."""
    d = tmp_path_factory.mktemp("gears")
    model_path, config_path = prefill.write_example(d)
    gear = d / "prefill.gear.onnx"
    gr.compile(str(model_path), gr.GearSpec.from_config(str(config_path)), str(gear),
               progress=False)
    return gear


def test_a_request_between_gears_names_the_gear_pad_runs_it_on(capsys, four_gears) -> None:
    """The covering gear and --pad / pad=True are named; the legal gears come by L1 distance
    of the dynamic values (100 is 28 from 128, 36 from 64, 68 from 32, 156 from 256)."""
    code, _, err = run_cli(capsys, "run", four_gears, "--shapes", SHAPES_100)
    assert code == 2
    assert_one_line_error(
        err, "[145013]", "the cheapest gear holding them is gear 2 (128, 128, 128, 16)",
        "execute(pad=True) (gear-runtime run / bench: --pad) runs them there",
        "legal gears, nearest first: (128, 128, 128, 16), (64, 64, 64, 16), "
        "(32, 32, 32, 16), (256, 256, 256, 16)")
    code, _, err = run_cli(capsys, "run", four_gears, "--shapes", SHAPES_100, "--pad",
                           "--output-dir", four_gears.parent)
    assert code == 0, err


def test_a_request_no_gear_holds_names_no_gear_to_pad_to(four_gears) -> None:
    ex = gr.load(str(four_gears)).create_executor()
    with pytest.raises(gr.GearMismatchError) as info:
        ex.set_dynamic_dims([300, 300, 300, 16])
    assert "cheapest gear holding" not in info.value.message
    assert "legal gears, nearest first: (256, 256, 256, 16)" in info.value.message
