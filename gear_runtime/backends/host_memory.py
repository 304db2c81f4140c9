"""Aligned host memory, the one allocation rule of the backends' host buffers (staging, CPU
outputs, a CPU backend's resident state); re-exported by :mod:`gear_runtime.backends.base`."""

from __future__ import annotations

import numpy as np


def aligned_buffer(nbytes: int, alignment: int = 64) -> np.ndarray:
    """A zeroed uint8 host buffer of ``nbytes`` whose data pointer is ``alignment``-aligned
    (what pinned allocators give; the staging layout's offsets assume it)."""
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    # an explicit offset, not raw[start:start + nbytes]: numpy gives an EMPTY slice the base
    # array's (unaligned) address, so a 0-byte buffer would break the promise
    return np.ndarray((nbytes,), np.uint8, buffer=raw, offset=start)
