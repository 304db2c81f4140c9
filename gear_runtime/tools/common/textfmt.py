"""Text for people: byte sizes and fixed-width tables, one way everywhere (``gear-runtime
inspect``, ``bench``, ``bench --compare``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: int | None, digits: int = 1, exact: bool = False) -> str:
    """``n`` bytes in the largest binary unit it reaches (``"1.5 MiB"``; ``"n/a"`` for None);
    ``exact`` adds the byte count (``"1.50 MiB (1572864 bytes)"``)."""
    if n is None:
        return "n/a"
    for unit, scale in _UNITS:
        if n >= scale:
            text = f"{n / scale:.{digits}f} {unit}"
            return f"{text} ({n} bytes)" if exact else text
    return f"{n} bytes" if exact else f"{n} B"


def format_table(rows: Sequence[Sequence[str]], right: Callable[[int], bool] = lambda c: False,
                 indent: str = "", rule: bool = False) -> list[str]:
    """``rows`` (the first is the header) as fixed-width lines: columns two spaces apart,
    column ``c`` right-aligned when ``right(c)``, else left; ``rule``: a line of dashes under
    the header, as wide as it."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [indent + "  ".join(cell.rjust(w) if right(c) else cell.ljust(w)
                                for c, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    if rule:
        lines.insert(1, "-" * len(lines[0]))
    return lines
