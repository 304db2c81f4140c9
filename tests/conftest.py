"""Fixtures shared by several test modules, and the rule on skips under CI."""

from __future__ import annotations

import os

import pytest

#: Under CI (``CI=true``: .ci/run) a test may skip only for these reasons: hardware or tools
#: the CI machine does not have. A test that skips for anything else there (an extra that
#: .ci/run installs, missing) fails: a feature's tests must not pass by not running.
CI_SKIP_REASONS = ("NVIDIA GPU", "Ascend", "zsh is not installed", "fish is not installed",
                   "ORT < 1.26", "this onnxruntime has CUDA")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _no_unexpected_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _no_unexpected_skip(outcome.get_result())


def _no_unexpected_skip(report) -> None:
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr)
    if not any(allowed in reason for allowed in CI_SKIP_REASONS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where what it needs is installed: {reason}"


@pytest.fixture
def figures(monkeypatch):
    """The figures the bench and compare plots save (captured before they are closed)."""
    pytest.importorskip("matplotlib")
    from gear_runtime.tools.bench import compare, plot

    saved = []
    real = plot.save_figure

    def capture(plt, fig, path):
        saved.append(fig)
        return real(plt, fig, path)

    monkeypatch.setattr(plot, "save_figure", capture)
    monkeypatch.setattr(compare, "save_figure", capture)
    return saved
