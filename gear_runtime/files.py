"""Reading a file a user names: the one rule for every reader (gear files, config files).

Only a regular file of bounded size is read, and that is known before the first byte is
read: ``/dev/zero`` would never end, a FIFO would block, a directory has no bytes and a huge
file would exhaust memory. The caller turns the OSError into its own error type, naming the
file as the user gave it.
"""

from __future__ import annotations

import os
import stat


class FileTooLargeError(OSError):
    """The file is larger than the reader's limit (``size`` bytes)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(0, f"it is {size} bytes, more than the limit of {limit}")
        self.size = size


def read_regular_file(path: str | bytes, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    OSError whose ``strerror`` says why otherwise: it does not exist or cannot be opened,
    "it is a directory", "it is not a regular file", "it is N bytes, more than the limit of
    L" (:class:`FileTooLargeError`, also when it grows past the limit while read). A NUL
    character in ``path`` is an OSError too (not Python's ValueError)."""
    if "\0" in os.fsdecode(path):
        raise OSError(0, "the path holds a NUL character")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise OSError(0, f"it is {what}")
        if st.st_size > limit:
            raise FileTooLargeError(st.st_size, limit)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while read
        raise FileTooLargeError(len(data), limit)
    return data


def reason(exc: OSError) -> str:
    """What an OSError from :func:`read_regular_file` says, without errno's number."""
    return exc.strerror or str(exc)


__all__ = ["FileTooLargeError", "read_regular_file", "reason"]
