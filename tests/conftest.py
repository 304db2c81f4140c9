"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


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
