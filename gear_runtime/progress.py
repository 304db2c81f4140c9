"""Progress bars: the one rule for every long step (compile, load, bench, check-padding, plan).

A bar is drawn on stderr only when the caller asks for it AND stderr is a terminal. In a log
(stdout and stderr sent to one file, a pipe, a CI job) a bar's carriage returns and redraws
land in the middle of the lines, so nothing is written there at all.
"""

from __future__ import annotations

import sys
from typing import Any


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
    bytes). Use it as a context manager; ``update(n)``, ``n`` and ``set_postfix_str`` work
    either way."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024,
                file=sys.stderr, leave=False, disable=not progress or not stderr_is_terminal())


__all__ = ["progress_bar", "stderr_is_terminal"]
