"""The rows every benchmark script reports and the one table run_all.py prints of them.

A row is a dict: ``bench``, ``metric``, ``value``, ``unit``, ``target`` (text or None) and
``status``: ``"PASS"`` / ``"FAIL"`` against the target, ``"info"`` without one, ``"SKIP"``.

The bottom of the benchmarks' imports: ``bench_gears.py`` and ``bench_memory.py`` make their
rows here (``from bench_rows import row``) and ``run_all.py`` runs them, so that no script
imports the runner that imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Row = dict[str, Any]


def row(bench: str, metric: str, value: float | None, unit: str, target: str | None = None,
        passed: bool | None = None, status: str | None = None) -> Row:
    """One table row; ``passed`` None means no target (status "info") unless ``status``."""
    if status is None:
        status = "info" if passed is None else ("PASS" if passed else "FAIL")
    return {"bench": bench, "metric": metric, "value": value, "unit": unit, "target": target,
            "status": status}


def format_rows(rows: Sequence[Row]) -> str:
    """The rows as one fixed-width table."""
    cells = [["bench", "metric", "value", "target", "status"]]
    for r in rows:
        v = r["value"]
        if v is None:
            value = "-"
        elif isinstance(v, float):
            value = f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        else:
            value = str(v)
        cells.append([r["bench"], r["metric"], f"{value} {r['unit']}".strip(),
                      r["target"] or "", r["status"]])
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
             for line in cells]
    lines.insert(1, "-" * max(len(x) for x in lines))
    return "\n".join(lines)
