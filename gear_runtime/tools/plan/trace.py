"""Trace files: the requests a service saw, one per line."""

from __future__ import annotations

import os

from gear_runtime.errors import InputError


def read_trace(path: str | os.PathLike[str]) -> list[tuple[int, ...]]:
    """Requests from a trace file: CSV (one request per line, its values comma-separated;
    a header line is skipped) or JSON lines (an int, a list, or an object with "dims")."""
    import json

    out: list[tuple[int, ...]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                if line[0] in "[{":
                    item = json.loads(line)
                    item = item["dims"] if isinstance(item, dict) else item
                    out.append(tuple(int(v) for v in item))
                else:
                    out.append(tuple(int(v) for v in line.split(",")))
            except (ValueError, KeyError, TypeError) as exc:
                if n == 1 and not line[0].isdigit():
                    continue  # a CSV header
                raise InputError(f"{os.fspath(path)} line {n}: not a request ({exc})") from None
    if not out:
        raise InputError(f"{os.fspath(path)} holds no requests")
    return out
