"""Requests as an array, and their structure: which values stay constant and which move
together (are *tied*) in every request, found in the trace itself (seed-style
``seq,seq,seq`` requests are planned as one value)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gear_runtime.errors import InputError


def as_requests(requests: Any) -> np.ndarray:
    """Requests as an int64 array [n, values]: ints (one value) or value tuples."""
    arr = np.asarray(requests)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.dtype.kind not in "iu":
        raise InputError("requests must be a non-empty list of ints or of equal-length integer "
                         f"tuples, got an array of shape {arr.shape} and dtype {arr.dtype}")
    if (arr < 0).any():
        raise InputError("request values must be >= 0")
    return arr.astype(np.int64)


@dataclass(frozen=True)
class Structure:
    """Which values are constant, and which move together (tied groups), in every request."""

    width: int
    constant: dict[int, int]
    groups: list[list[int]]  # each group's first index is its representative

    def expand(self, free: Sequence[int]) -> tuple[int, ...]:
        """A full value tuple from one value per group."""
        out = [0] * self.width
        for v, c in self.constant.items():
            out[v] = c
        for group, value in zip(self.groups, free, strict=True):
            for v in group:
                out[v] = int(value)
        return tuple(out)


def structure_of(reqs: np.ndarray) -> Structure:
    width = reqs.shape[1]
    constant = {v: int(reqs[0, v]) for v in range(width) if (reqs[:, v] == reqs[0, v]).all()}
    groups: list[list[int]] = []
    for v in range(width):
        if v in constant:
            continue
        for g in groups:
            if (reqs[:, g[0]] == reqs[:, v]).all():
                g.append(v)
                break
        else:
            groups.append([v])
    return Structure(width, constant, groups)
