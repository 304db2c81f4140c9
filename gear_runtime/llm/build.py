"""A Hugging Face checkpoint folder to a folder the engine serves (``gear-runtime llm build``).

Three stages, each one progress line with its seconds:

1. **builder**: onnxruntime-genai's model builder (``python -m
   onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu``) in a subprocess, into a
   temporary folder beside ``OUT`` renamed to ``OUT`` once it succeeded (a failed build
   leaves nothing that a later build would take for a finished one); its cache folder is
   temporary. Skipped when ``OUT`` already holds ``genai_config.json`` (the gears alone are
   compiled again); when the input is itself a builder folder, its files are linked (or
   copied) into ``OUT`` instead.
2. **tokenizer**: ``tokenizer.json`` / ``tokenizer_config.json`` copied from the checkpoint
   where the builder did not write them (a line only when one is copied).
3. **gears**: the engine's gear file compiled into ``OUT/gears/<key>/``
   (:data:`gear_runtime.llm.gears.BUILT_DIR`, the key the engine computes) and the gears
   written to ``OUT/gear_runtime.json`` (:data:`~gear_runtime.llm.gears.GEARS_CONFIG`), so
   ``Engine.from_folder(OUT)`` loads that file and compiles nothing. A trace of prompts (or
   of their lengths) picks the prompt gears with the gear planner.

The checkpoint folder is never written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gear_runtime.errors import BackendUnavailableError, CompileError, InputError
from gear_runtime.llm.folder import CONFIG, read_folder
from gear_runtime.llm.gears import (
    BUILT_DIR,
    GEARS_CONFIG,
    EngineGears,
    choose_gears,
    gear_file,
)

#: what the builder needs besides onnxruntime-genai (the ``llm-build`` extra, torch apart)
BUILDER_MODULES = ("onnxruntime_genai", "torch", "transformers", "onnx_ir")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: the most prompt gears the planner picks from a trace
TRACE_PROMPT_GEARS = 8
INSTALL_HINT = ("pip install torch --index-url https://download.pytorch.org/whl/cpu, then "
                "pip install 'gear_runtime[llm-build]'")

T = TypeVar("T")


def build_folder(hf_dir: str | Path, out_dir: str | Path, *, max_sequences: int = 8,
                 prompt_gears: Sequence[int] | None = None,
                 batch_gears: Sequence[int] | None = None, max_length: int | None = None,
                 trace: str | Path | None = None,
                 progress: Callable[[str], Any] | None = print) -> Path:
    """``out_dir`` built from the checkpoint ``hf_dir`` (see the module doc); returns it.

    ``hf_dir``: a Hugging Face checkpoint (``config.json`` + weights) or a builder folder
    (``genai_config.json``). ``out_dir``: missing, empty, or a builder folder (then only the
    gears are compiled); never ``hf_dir`` or inside it. The gears: as
    :func:`~gear_runtime.llm.gears.choose_gears` picks them from ``max_sequences``,
    ``prompt_gears``, ``batch_gears``, ``max_length``; ``trace`` (a text file: one prompt
    length in tokens per line, or one prompt per line, tokenized with the folder's
    ``tokenizer.json``) picks the prompt gears instead (not with ``prompt_gears``).
    ``progress``: called with one line per stage. InputError naming the path or value for
    bad input; BackendUnavailableError when the builder's packages are missing;
    CompileError with the builder's last lines when it fails."""
    hf, out = _check_paths(hf_dir, out_dir)
    if trace is not None and prompt_gears is not None:
        raise InputError("give prompt_gears or a trace, not both (the trace picks the prompt "
                         "gears)")
    say = progress or (lambda _line: None)
    if (out / CONFIG).is_file():
        say(f"builder skipped: {out} already holds {CONFIG} (delete it to run the builder "
            "again)")
    elif (hf / CONFIG).is_file():
        _timed(say, "copy", lambda: _copy_builder_folder(hf, out))
    else:
        _timed(say, "builder", lambda: run_builder(hf, out))
    for name in _copy_tokenizer(hf, out):
        say(f"tokenizer: {name} copied from {hf}")
    gears = _timed(say, "gears", lambda: compile_gears(
        out, max_sequences, prompt_gears, batch_gears, max_length, trace))
    say(f"wrote {out}: prompt gears {list(gears.prompt)}, batch gears {list(gears.batch)}, "
        f"max_length {gears.max_length}")
    return out


def _timed(say: Callable[[str], Any], stage: str, step: Callable[[], T]) -> T:
    """``step()``, then the line ``"<stage> <seconds> s"``."""
    start = time.perf_counter()
    result = step()
    say(f"{stage} {time.perf_counter() - start:.1f} s")
    return result


# ---- paths ----------------------------------------------------------------------------------
def _check_paths(hf_dir: str | Path, out_dir: str | Path) -> tuple[Path, Path]:
    """(hf, out) when the build may run; InputError naming the path and what was expected
    otherwise (checked before anything is written)."""
    hf, out = Path(hf_dir), Path(out_dir)
    if not hf.is_dir():
        raise InputError(f"HF folder {str(hf)!r} is not a folder (expected a Hugging Face "
                         "checkpoint: config.json and its weights)")
    builder_folder = (hf / CONFIG).is_file()
    if not builder_folder and not (hf / "config.json").is_file():
        raise InputError(f"HF folder {str(hf)!r} holds no config.json (expected a Hugging "
                         f"Face checkpoint, or a builder folder with {CONFIG})")
    if out.exists() and not out.is_dir():
        raise InputError(f"output {str(out)!r} is a file; expected a new or empty folder")
    inside = out.resolve() == hf.resolve() or hf.resolve() in out.resolve().parents
    if inside and not (builder_folder and out.resolve() == hf.resolve()):
        raise InputError(f"output {str(out)!r} is inside the HF folder {str(hf)!r}: the "
                         "checkpoint is never written; give a folder outside it")
    if out.is_dir() and any(out.iterdir()) and not (out / CONFIG).is_file():
        raise InputError(f"output {str(out)!r} is not empty and is not a builder folder (no "
                         f"{CONFIG}); give a new or empty folder")
    return hf, out


def _copy_builder_folder(src: Path, out: Path) -> None:
    """The builder folder ``src``'s files linked (across file systems: copied) into
    ``out``; its gears and gear defaults are not taken (they are compiled anew)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.name != GEARS_CONFIG:
            try:
                os.link(path, out / path.name)
            except OSError:
                shutil.copy2(path, out / path.name)


def _copy_tokenizer(hf: Path, out: Path) -> list[str]:
    """The tokenizer files the builder did not write, copied from ``hf``; their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if not (out / name).is_file() and (hf / name).is_file():
            shutil.copy2(hf / name, out / name)
            copied.append(name)
    return copied


# ---- the builder ------------------------------------------------------------------------------
def run_builder(hf: Path, out: Path) -> None:
    """onnxruntime-genai's builder, fp32 for the CPU, from ``hf`` into ``out`` (which must
    be missing or empty): written into a temporary folder beside ``out`` and renamed to it
    on success. BackendUnavailableError when its packages are missing; CompileError
    quoting the builder's last lines when it fails."""
    missing = [m for m in BUILDER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendUnavailableError(f"the model builder needs {', '.join(missing)}: "
                                      f"{INSTALL_HINT}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="gear-runtime-builder-") as cache:
            _run_builder_process(hf, staging, Path(cache))
        if out.is_dir():
            out.rmdir()  # empty, checked before: the rename needs it gone
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run_builder_process(hf: Path, out: Path, cache: Path) -> None:
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
               "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(cache)]
    # offline: a local checkpoint needs nothing from the hub, and a lookup there could hang
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not (out / CONFIG).is_file():
        raise CompileError(f"the model builder failed on {hf} (architectures "
                           f"{_architectures(hf)}, exit {done.returncode}): "
                           f"{_last_line(done.stdout + done.stderr)}")


def _architectures(hf: Path) -> object:
    """config.json's ``architectures`` (what the builder picks its builder by), or '?'."""
    try:
        return json.loads((hf / "config.json").read_text(encoding="utf-8"))["architectures"]
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def _last_line(text: str) -> str:
    """The builder's last non-empty line: a traceback's exception (an error is one line)."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# ---- the gears --------------------------------------------------------------------------------
def compile_gears(out: Path, max_sequences: int, prompt_gears: Sequence[int] | None,
                  batch_gears: Sequence[int] | None, max_length: int | None,
                  trace: str | Path | None) -> EngineGears:
    """The builder folder ``out``'s gears chosen (from the arguments alone, not from a
    previous build's :data:`GEARS_CONFIG`), compiled into ``out/gears/<key>`` and recorded
    in :data:`GEARS_CONFIG`; gear files of earlier builds removed. The gears."""
    folder = read_folder(out)
    if trace is not None:
        length = max_length if max_length is not None else folder.context_length
        prompt_gears = trace_prompt_gears(trace, out / "tokenizer.json", length)
    gears = choose_gears(folder, max_sequences, prompt_gears, batch_gears, max_length,
                         stored=False)
    built = gear_file(folder, gears, cache_dir=out / BUILT_DIR)
    for old in (out / BUILT_DIR).iterdir():
        if old.is_dir() and old != built.parent:
            shutil.rmtree(old)
    (out / GEARS_CONFIG).write_text(json.dumps(
        {"max_sequences": max_sequences, "prompt_gears": list(gears.prompt),
         "batch_gears": list(gears.batch), "max_length": gears.max_length}, indent=2) + "\n",
        encoding="utf-8")
    return gears


def trace_prompt_gears(trace: str | Path, tokenizer_file: Path, max_length: int) -> list[int]:
    """The prompt gears the planner picks (at most :data:`TRACE_PROMPT_GEARS`, the fewest
    padded tokens) for the trace's prompt lengths, each length capped at ``max_length - 1``
    (a longer prompt runs in chunks of the largest gear)."""
    from gear_runtime.tools.plan import plan_gears

    lengths = [min(n, max_length - 1) for n in trace_lengths(trace, tokenizer_file)]
    plan = plan_gears(lengths, TRACE_PROMPT_GEARS, "elements")
    return [g[0] for g in plan.gears]


def trace_lengths(trace: str | Path, tokenizer_file: Path) -> list[int]:
    """The prompt lengths of ``trace``: its lines (blank ones skipped) as positive integers
    when every line is one, else each line a prompt, tokenized with ``tokenizer_file``
    (the ``tokenizers`` library). InputError naming the file for an unreadable or empty one,
    or a length below 1."""
    path = Path(trace)
    try:
        lines = [s.strip() for s in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"trace {str(path)!r} cannot be read: {exc}") from None
    lines = [s for s in lines if s]
    if not lines:
        raise InputError(f"trace {str(path)!r} holds no lines; expected one prompt, or one "
                         "prompt length in tokens, per line")
    if all(s.lstrip("-").isdigit() for s in lines):
        lengths = [int(s) for s in lines]
        bad = next((n for n in lengths if n < 1), None)
        if bad is not None:
            raise InputError(f"trace {str(path)!r}: prompt length {bad}; expected lengths "
                             ">= 1")
        return lengths
    return _token_counts(lines, tokenizer_file)


def _token_counts(prompts: list[str], tokenizer_file: Path) -> list[int]:
    """Each prompt's tokens (at least 1) under the tokenizer in ``tokenizer_file``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise BackendUnavailableError(f"a trace of prompts is tokenized with tokenizers: "
                                      f"{INSTALL_HINT}") from None
    if not tokenizer_file.is_file():
        raise InputError(f"a trace of prompts needs {tokenizer_file} to count their tokens; "
                         "give prompt lengths instead")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return [max(1, len(e.ids)) for e in tokenizer.encode_batch(prompts)]


__all__ = ["BUILDER_MODULES", "TRACE_PROMPT_GEARS", "build_folder", "compile_gears",
           "run_builder", "trace_lengths", "trace_prompt_gears"]
