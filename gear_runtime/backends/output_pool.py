"""Recycled output memory for ``execute()`` on the CPU: large outputs at ONNX Runtime's speed.

``execute()`` (copy=True) hands the caller arrays to keep. Bound to a fresh ``np.empty`` per
call, a large output is first-touched by ORT: above glibc's mmap threshold every fresh array
is a new mapping, so each page faults and is zeroed by the kernel on the run's critical path
(on LLM-sized logits, much of each call goes to system time: docs/benchmarks.md, "Figures
behind choices in the code"). ORT's own ``run`` does not pay it: its
CPU allocator is an arena (BFCArena, ``enable_cpu_mem_arena`` on by default) that keeps the
memory it once mapped, and its Python binding returns each output as a numpy array over the
arena's memory (the array's base is a capsule holding the OrtValue; no copy). When the caller
drops the array, the chunk goes back to the arena and the next run writes into pages that are
already resident (same address, no faults).

:class:`OutputPool` does the same for the arrays this runtime hands out: each one is a view of
a raw block the pool tracks, and numpy keeps the block as the ``base`` of every view derived
from it (views of views, slices, reshapes, ``np.frombuffer`` of a memoryview of it...). A
block is free again exactly when the pool holds the only reference to it, which
``sys.getrefcount`` tells in O(1). So a kept array is never written again, and a dropped one's
memory is reused at once. The pool holds at most ``budget`` bytes of blocks (the oldest are
forgotten first; a forgotten block is freed by numpy when its last array dies).

Not for free-threaded CPython builds, where reference counts are not exact: there the pool is
off and every call gets fresh memory (today's behaviour).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

#: ``execute(copy=True)`` on a CPU backend: outputs of at least this many bytes are written
#: straight into arrays the caller keeps, from the executor's :class:`OutputPool` (a copy of
#: large logits costs a share of the run itself: benchmarks/bench_scale.py); smaller ones are
#: copied. The one rule ONNX Runtime and OpenVINO share.
FRESH_OUTPUT_MIN_BYTES = 64 * 2**10


def _refs_when_free() -> int:
    """``sys.getrefcount`` of a block only the pool's list references, read exactly as
    :meth:`OutputPool.array` reads it (the count depends on the interpreter: measured, not
    assumed)."""
    blocks = [np.empty(1, np.uint8)]
    i = 0
    return sys.getrefcount(blocks[i])


#: A session's pool keeps at most this many times the bytes of its largest gear's pooled
#: outputs (:meth:`OutputPool.for_outputs`): room for the caller to keep one call's outputs
#: while the next is written.
POOL_BUDGET_FACTOR = 2

#: Alignment of the arrays handed out (bytes): ORT's CPU allocator aligns to 64, and
#: vectorised kernels store faster to aligned memory.
ALIGNMENT = 64
#: False on free-threaded builds (no GIL): reference counts are not exact there.
POOLING = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
_FREE = _refs_when_free()


class OutputPool:
    """Raw blocks for output arrays, reused once no array of theirs is alive.

    One per executor session, used under the executor's ownership (no lock of its own).
    ``budget``: the most bytes of blocks it keeps (free or handed out).
    """

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        # Parallel lists, oldest first: each block (the array that owns the memory: the base
        # of every view of it), the offset of its ALIGNMENT-aligned start, its address.
        self._blocks: list[np.ndarray] = []
        self._starts: list[int] = []
        self._addrs: list[int] = []
        self._held = 0
        #: blocks reused / newly allocated (for tests and benchmarks).
        self.reused = 0
        self.allocated = 0

    @classmethod
    def for_outputs(cls, views: Sequence[Sequence[np.ndarray]],
                    big: Sequence[Sequence[int]]) -> OutputPool:
        """The pool of a session whose gears have the outputs ``views`` (``[gear][output]``)
        and pool the outputs ``big[gear]`` (base.output_buffers gives both)."""
        largest = max((sum(outs[k].nbytes for k in b) for outs, b in zip(views, big, strict=True)),
                      default=0)
        return cls(POOL_BUDGET_FACTOR * largest)

    def array(self, shape: Sequence[int], dtype: np.dtype, nbytes: int | None = None
              ) -> tuple[np.ndarray, int]:
        """An array of ``shape`` / ``dtype`` (``nbytes`` of them, when the caller knows)
        that no live array shares memory with, and the address of its data
        (``ALIGNMENT``-aligned, as ORT's own allocations)."""
        dtype = np.dtype(dtype)
        if nbytes is None:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        count, size = nbytes // dtype.itemsize, nbytes + ALIGNMENT
        blocks = self._blocks
        for i in range(len(blocks)):  # a handful of blocks: a scan beats any index
            if blocks[i].nbytes == size and sys.getrefcount(blocks[i]) == _FREE:
                self.reused += 1
                # frombuffer + reshape: the cheapest typed view (its base is the block)
                return (np.frombuffer(blocks[i], dtype, count, self._starts[i]).reshape(shape),
                        self._addrs[i])
        block = np.empty(size, np.uint8)  # owns its data: the base of its views
        start = -block.ctypes.data % ALIGNMENT
        addr = block.ctypes.data + start
        self.allocated += 1
        if POOLING and size <= self.budget:
            while blocks and self._held + size > self.budget:  # the oldest go first
                self._held -= blocks.pop(0).nbytes  # its arrays, if any, keep it alive
                self._starts.pop(0)
                self._addrs.pop(0)
            blocks.append(block)
            self._starts.append(start)
            self._addrs.append(addr)
            self._held += size
        return np.frombuffer(block, dtype, count, start).reshape(shape), addr

    @property
    def held_bytes(self) -> int:
        """Bytes of the blocks the pool tracks (free or handed out)."""
        return self._held

    def clear(self) -> None:
        """Forget every block (handed-out arrays keep theirs)."""
        self._blocks, self._starts, self._addrs = [], [], []
        self._held = 0
