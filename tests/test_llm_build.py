"""NEEDS torch + transformers (skipped without): ``gear-runtime llm build`` end to end.

A Hugging Face Qwen3 checkpoint to a folder the engine serves.

A tiny random Qwen3 (``gear_runtime.examples.hf_qwen3``) goes through onnxruntime-genai's
model builder and the gear compile (the CLI, in a subprocess); the engine's greedy tokens
must equal transformers' ``generate(do_sample=False)`` on the checkpoint itself, and the
engine must load the gear file the build wrote (nothing compiled, nothing written).
Skipped without torch / transformers (the ``llm-build`` extra, torch CPU first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import assert_one_line_error, run_cli

for _module in ("torch", "transformers", "onnx_ir", "onnxruntime_genai"):
    pytest.importorskip(_module, reason=f"{_module} is missing: the llm-build extra (torch CPU "
                        "first, see docs/llm.md) runs these tests")

from gear_runtime.examples.hf_qwen3 import write_random_qwen3  # noqa: E402
from gear_runtime.llm import Engine  # noqa: E402
from gear_runtime.llm.gears import BUILT_DIR, GEAR_FILE, GEARS_CONFIG  # noqa: E402

#: prompts below, at and across the prompt gears (40 runs as chunks of 32 and 16)
PROMPT_LENGTHS = (3, 16, 21, 40)
NEW_TOKENS = 8
BUILD_FLAGS = ("--max-sequences", "4", "--prompt-gears", "16,32", "--max-length", "64")


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, mtime_ns)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``gear-runtime ARGS`` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "gear_runtime.cli", *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The checkpoint, its snapshot before the build, the built folder and the CLI's run."""
    root = tmp_path_factory.mktemp("llm_build")
    hf = write_random_qwen3(root / "hf", seed=3)
    before = _snapshot(hf)
    done = _cli("llm", "build", str(hf), "-o", str(root / "model"), *BUILD_FLAGS)
    assert done.returncode == 0, done.stderr
    return {"hf": hf, "before": before, "out": root / "model", "run": done}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    """The engine's cache, empty: a compile by the engine would land here."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GEAR_RUNTIME_LLM_CACHE", str(cache))
    return cache


def _prompts() -> list[list[int]]:
    return [[(7 * n + 13 * i) % 500 + 3 for i in range(n)] for n in PROMPT_LENGTHS]


def _transformers_greedy(hf: Path, prompts: list[list[int]]) -> list[list[int]]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    out = []
    for p in prompts:
        ids = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False)
        out.append(ids[0, len(p):].tolist())
    return out


def test_build_prints_stages_and_writes_the_folder(built) -> None:
    out, lines = built["out"], built["run"].stdout.splitlines()
    assert lines[0].startswith("builder ") and lines[0].endswith(" s"), lines
    assert any(line.startswith("gears ") and line.endswith(" s") for line in lines), lines
    for name in ("genai_config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    stored = json.loads((out / GEARS_CONFIG).read_text())
    assert stored == {"max_sequences": 4, "prompt_gears": [16, 32], "batch_gears": [1, 2, 4],
                      "max_length": 64}
    assert len(list((out / BUILT_DIR).glob(f"*/{GEAR_FILE}"))) == 1
    assert _snapshot(built["hf"]) == built["before"]  # the checkpoint is never written
    assert not [p for p in out.parent.iterdir() if ".building-" in p.name]


def test_engine_matches_transformers_greedy(built, empty_cache) -> None:
    prompts = _prompts()
    engine = Engine.from_folder(built["out"], max_sequences=4)
    try:
        assert (engine.gears.prompt, engine.gears.batch, engine.gears.max_length) == (
            (16, 32), (1, 2, 4), 64)  # the build's gears, from gear_runtime.json
        got = engine.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=[])
    finally:
        engine.close()
    assert got == _transformers_greedy(built["hf"], prompts)
    assert list(empty_cache.iterdir()) == []  # the build's gear file ran: nothing compiled


def test_second_load_reuses_the_gear_file(built, empty_cache) -> None:
    before = _snapshot(built["out"])
    for max_sequences in (None, 4, 2):  # none given: the build's 4, from gear_runtime.json
        engine = Engine.from_folder(built["out"], max_sequences)
        engine.close()
        assert engine.gears.batch == (1, 2, 4) and engine.gears.prompt == (16, 32)
    assert _snapshot(built["out"]) == before  # nothing rewritten: the same gear file
    assert list(empty_cache.iterdir()) == []


def test_trace_picks_prompt_gears_from_a_builder_folder(built, tmp_path, empty_cache) -> None:
    from gear_runtime.llm.build import build_folder

    trace = tmp_path / "lengths.txt"
    trace.write_text("\n".join(["5"] * 20 + ["20"] * 10 + ["45"] * 5 + ["300"]) + "\n")
    lines: list[str] = []
    out = build_folder(built["out"], tmp_path / "traced", max_sequences=2, max_length=64,
                       trace=trace, progress=lines.append)
    stored = json.loads((out / GEARS_CONFIG).read_text())
    assert stored["prompt_gears"] == [5, 20, 45, 63]  # 300 capped at max_length - 1
    assert stored["batch_gears"] == [1, 2]
    assert lines[0].startswith("copy ") and not any(x.startswith("builder ") for x in lines)
    engine = Engine.from_folder(out, max_sequences=2)
    try:
        assert engine.gears.prompt == (5, 20, 45, 63)
        assert engine.generate([[4, 5, 6]], max_new_tokens=2, stop_token_ids=[])[0]
    finally:
        engine.close()
    assert list(empty_cache.iterdir()) == []


def test_trace_of_prompts_is_tokenized(built, tmp_path) -> None:
    from tokenizers import Tokenizer

    from gear_runtime.llm.build import trace_lengths

    texts = ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "42"]
    trace = tmp_path / "prompts.txt"
    trace.write_text("\n".join(texts) + "\n\n")
    tokenizer = Tokenizer.from_file(str(built["out"] / "tokenizer.json"))
    assert trace_lengths(trace, built["out"] / "tokenizer.json") == [
        len(tokenizer.encode(t).ids) for t in texts]


def test_rebuild_of_a_built_folder_compiles_the_gears_alone(built, tmp_path, capsys) -> None:
    copy = tmp_path / "model"
    copy.mkdir()
    for path in built["out"].iterdir():  # a builder folder without the tokenizer files
        if path.is_file() and path.name not in (GEARS_CONFIG, "tokenizer.json",
                                                "tokenizer_config.json"):
            os.link(path, copy / path.name)
    code, stdout, err = run_cli(capsys, "llm", "build", built["hf"], "-o", copy,
                                "--max-length", "64", "--prompt-gears", "16",
                                "--batch-gears", "1,3", "--max-sequences", "3")
    assert code == 0, err
    assert stdout.startswith("builder skipped")
    assert "tokenizer: tokenizer.json copied" in stdout
    assert (copy / "tokenizer.json").read_bytes() == (built["hf"] / "tokenizer.json").read_bytes()
    assert json.loads((copy / GEARS_CONFIG).read_text())["batch_gears"] == [1, 3]


def test_gears_the_build_did_not_compile_go_to_the_cache(built, empty_cache) -> None:
    before = _snapshot(built["out"])
    engine = Engine.from_folder(built["out"], max_sequences=8)  # past the stored batch gears
    try:
        assert engine.gears.batch == (1, 2, 4, 8) and engine.gears.prompt == (16, 32)
    finally:
        engine.close()
    assert len(list(empty_cache.glob(f"*/{GEAR_FILE}"))) == 1
    assert _snapshot(built["out"]) == before  # the engine never writes the folder


def test_builder_failure_exits_2_with_its_last_lines(built, tmp_path) -> None:
    hf = tmp_path / "odd"
    hf.mkdir()
    config = json.loads((built["hf"] / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "architectures": ["OddForCausalLM"]}))
    done = _cli("llm", "build", str(hf), "-o", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert_one_line_error(done.stderr, "the model builder failed on", "OddForCausalLM")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd"]  # no half-built folder


def test_random_checkpoint_is_deterministic_for_a_seed(built, tmp_path) -> None:
    again = write_random_qwen3(tmp_path / "again", seed=3)
    other = write_random_qwen3(tmp_path / "other", seed=4)
    assert _bytes(again) == _bytes(built["hf"])
    assert _bytes(other)["model.safetensors"] != _bytes(again)["model.safetensors"]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize(("setup", "fragments"), [
    ("missing", ("HF folder", "is not a folder")),
    ("foreign", ("is not empty and is not a builder folder", "genai_config.json")),
    ("inside", ("inside the HF folder", "never written")),
    ("no_config", ("holds no config.json",)),
])
def test_bad_inputs_exit_2(built, tmp_path, capsys, setup, fragments) -> None:
    hf, out = built["hf"], tmp_path / "out"
    if setup == "missing":
        hf = tmp_path / "no_such_checkpoint"
    elif setup == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif setup == "inside":
        out = hf / "onnx"
    elif setup == "no_config":
        hf = tmp_path / "empty_checkpoint"
        hf.mkdir()
    code, stdout, err = run_cli(capsys, "llm", "build", hf, "-o", out)
    assert code == 2, (stdout, err)
    assert_one_line_error(err, *fragments)
    assert _snapshot(built["hf"]) == built["before"]
    if setup == "foreign":
        assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_trace_and_prompt_gears_together_exit_2(built, tmp_path, capsys) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("10\n")
    code, _, err = run_cli(capsys, "llm", "build", built["hf"], "-o", tmp_path / "o",
                           "--trace", trace, "--prompt-gears", "16")
    assert code == 2
    assert_one_line_error(err, "--trace", "--prompt-gears")
