"""Progress bars: the one rule for every long step (compile, load, bench, check-padding, plan).

A bar is drawn on stderr only when the caller asks for it AND stderr is a terminal AND the
process is not silenced (``gear-runtime -q``: :func:`silence`). In a log (stdout and stderr
sent to one file, a pipe, a CI job) a bar's carriage returns and redraws land in the middle of
the lines, so nothing is written there at all.
"""

from __future__ import annotations

import sys
from typing import Any

#: Set by :func:`silence`: no bar in this process, whatever a caller asks.
_silenced = False


def silence(silenced: bool = True) -> None:
    """Draw no bar anywhere in this process (``True``), or as callers ask again (``False``).
    Process-wide on purpose: ``-q`` must reach the bars deep in the tools and backends without
    a flag threaded through every call; the command line sets it on every run."""
    global _silenced
    _silenced = silenced


def silenced() -> bool:
    """Whether :func:`silence` turned the bars off."""
    return _silenced


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (a log file, a pipe, a closed or missing stream is not)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def progress_bar(total: int, desc: str, progress: bool, unit: str = "it",
                 scale: bool = False) -> Any:
    """A tqdm bar of ``total`` steps on stderr, disabled (it writes nothing) unless
    ``progress`` and stderr is a terminal. ``scale``: counts shown in K / M / G of 1024 (for
    bytes). Silenced (:func:`silence`), it is disabled too. Use it as a context manager;
    ``update(n)``, ``n`` and ``set_postfix_str`` work either way."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024,
                file=sys.stderr, leave=False,
                disable=not progress or _silenced or not stderr_is_terminal())


__all__ = ["progress_bar", "silence", "silenced", "stderr_is_terminal"]
