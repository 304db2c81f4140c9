"""Long steps show progress on a terminal and nothing on a log (gear_runtime/progress.py).

Each command runs in a child process twice: stderr a pipe (what a log or a CI job is) and
stderr a pseudo-terminal (what a user at a shell is). The pipe gets nothing at all; the
terminal gets the command's bar. ``--no-progress`` silences the terminal too.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import onnx
import pytest

import gear_runtime as gr
from gear_runtime.examples.prefill import build_prefill_model

TIMEOUT = 300
PREFILL_SHAPE = "input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,64"


def run_cli(args: list[str], terminal: bool, cwd: Path) -> tuple[int, str]:
    """(exit code, everything written to stderr) of ``gear-runtime ARGS`` in a child process
    whose stderr is a pseudo-terminal (``terminal``) or a pipe; stdout goes to a pipe."""
    cmd = [sys.executable, "-m", "gear_runtime.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if not terminal:
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=TIMEOUT,
                             stdin=subprocess.DEVNULL)
        return out.returncode, out.stderr.decode(errors="replace")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError as e:  # EIO: every writer of the terminal has closed it
                if e.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
    proc.communicate(timeout=TIMEOUT)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def prefill(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The built-in prefill example and its gear file (seq 4/8/16, 16 image tokens)."""
    folder = tmp_path_factory.mktemp("progress")
    source = folder / "prefill.onnx"
    onnx.save(build_prefill_model(), str(source))
    gear = folder / "prefill.gear.onnx"
    spec = gr.GearSpec.from_atc(input_shape=PREFILL_SHAPE,
                                dynamic_dims="4,4,4,16;8,8,8,16;16,16,16,16")
    gr.compile(str(source), spec, str(gear), progress=False)
    return source, gear


def _compile_args(source: Path, out: str) -> list[str]:
    return ["compile", str(source), "--input-shape", PREFILL_SHAPE, "--dynamic-dims",
            "4,4,4,16;8,8,8,16", "-o", out]


def _assert_bar(stderr: str, desc: str) -> None:
    """A tqdm bar was drawn: its description and a carriage return (its redraw)."""
    assert f"{desc}:" in stderr and "\r" in stderr, repr(stderr[:400])


def test_compile(prefill: tuple[Path, Path]) -> None:
    source, _ = prefill
    folder = source.parent
    code, err = run_cli(_compile_args(source, "log.gear.onnx"), False, folder)
    assert (code, err) == (0, "")
    code, err = run_cli([*_compile_args(source, "tty.gear.onnx"), "--external-data", "yes"],
                        True, folder)
    assert code == 0
    _assert_bar(err, "compile")
    assert "reading the source" in err and "checking and writing" in err  # every long step
    _assert_bar(err, "writing weights")  # the data file's bytes: a multi-GB model's longest
    code, err = run_cli([*_compile_args(source, "quiet.gear.onnx"), "--no-progress"], True,
                        folder)
    assert (code, err) == (0, "")


def test_check_padding(prefill: tuple[Path, Path]) -> None:
    source, gear = prefill
    args = ["check-padding", str(gear), str(source), "--pad-value", "attention_mask=0",
            "--samples", "3;5;12"]
    code, err = run_cli(args, False, source.parent)
    assert (code, err) == (0, "")
    code, err = run_cli(args, True, source.parent)
    assert code == 0
    _assert_bar(err, "check-padding")
    assert "loading the source" in err  # the loads are steps of the bar, not before it
    code, err = run_cli([*args, "--no-progress"], True, source.parent)
    assert (code, err) == (0, "")


def test_plan_cost_measured(prefill: tuple[Path, Path]) -> None:
    source, _ = prefill
    trace = source.parent / "trace.txt"
    rng = np.random.default_rng(0)
    trace.write_text("\n".join(str(int(v)) for v in rng.integers(1, 17, 50)) + "\n")
    args = ["plan", str(source), "--input-shape", PREFILL_SHAPE.replace("-1,64", "16,64"),
            "--trace", str(trace), "--max-gears", "2", "--cost", "measured", "--ladder", "3",
            "--iterations", "2"]
    code, err = run_cli(args, False, source.parent)
    assert (code, err) == (0, "")
    code, err = run_cli(args, True, source.parent)
    assert code == 0
    _assert_bar(err, "compile")  # the ladder's compile
    _assert_bar(err, "bench")  # and its benchmark
    code, err = run_cli([*args, "--no-progress"], True, source.parent)
    assert (code, err) == (0, "")


class _Bar:
    """A bar that records what it was told (in place of tqdm)."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n, self.steps = total, desc, 0, []

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, k: int = 1) -> None:
        self.n += k

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.steps.append(text)


def test_the_compile_bars_count_every_step_and_byte(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile bar ends at its total (reading, each gear, building, writing) and the
    weights bar counts every byte of the data file."""
    from gear_runtime.compiler import build

    bars: dict[str, _Bar] = {}

    def record(total: int, desc: str, progress: bool, **_: object) -> _Bar:
        bars[desc] = _Bar(total, desc)
        return bars[desc]

    monkeypatch.setattr(build, "progress_bar", record)
    spec = gr.GearSpec.from_atc(input_shape=PREFILL_SHAPE,
                                dynamic_dims="4,4,4,16;8,8,8,16;16,16,16,16")
    report = build.compile_gears(build_prefill_model(), spec, tmp_path / "p.gear.onnx",
                                 external_data=True)
    assert bars["compile"].n == bars["compile"].total == spec.gear_count + 3
    assert bars["compile"].steps[0] == "reading the source"
    assert bars["compile"].steps[1:4] == ["gear 4,4,4,16", "gear 8,8,8,16", "gear 16,16,16,16"]
    weights = bars["writing weights"]  # the tensors' bytes (the data file adds alignment)
    assert 0.99 * report.data_bytes < weights.n == weights.total <= report.data_bytes
