"""What the command-line tests share: running ``gear-runtime`` in process and the one-line
error check (the ``figures`` fixture of the plot tests is in conftest.py)."""

from __future__ import annotations

from gear_runtime.cli import app as cli


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``gear-runtime ARGV`` in process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    """The CLI's error rule: one line on stderr, ``gear-runtime: error:``, with ``fragments``."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gear-runtime: error:"), err
    for f in fragments:
        assert f in lines[0], (f, err)
