"""Reading the files a user names (specs, GPU packs, results files, model sources read for their names): regular
files only, and never more than a stated cap, so ``rpx show /dev/zero`` or ``rpx show`` on a FIFO is one line at
once, never a hang or a machine out of memory.

The caps: :data:`RESULTS_LIMIT` = 512 MiB for a results file (a 1,000-job sweep of ResNet-50 with every Tier 1 and
Tier 2 stage, rooflines on four GPUs and measured latency is about 47 MB: 47 kB a job, measured), and
:data:`TEXT_LIMIT` = 16 MiB for a spec, a GPU pack or a model's source file (a spec with a thousand models is
about 100 kB).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rpx_core.results.safe_write import kind_of

MiB = 1 << 20
RESULTS_LIMIT = 512 * MiB
TEXT_LIMIT = 16 * MiB


class NotReadable(OSError):
    """A file rpx will not read: not a regular file, or larger than its cap. An OSError, so each reader's own
    "cannot read the spec / the pack / the results file" message says it."""


def read_bytes(path: str | Path, limit: int = TEXT_LIMIT) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes. Opened without blocking (a FIFO with no writer
    cannot hold rpx) and checked before any byte is read; a file that grows past the cap while read is refused too."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotReadable(f"it is {kind_of(info.st_mode)}, not a regular file; rpx reads only regular files")
        if info.st_size > limit:
            raise NotReadable(too_large(limit))
        chunks, total = [], 0
        while chunk := os.read(fd, min(MiB, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise NotReadable(too_large(limit))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | Path, limit: int = TEXT_LIMIT) -> str:
    """:func:`read_bytes` as UTF-8 text (UnicodeDecodeError for anything else)."""
    return read_bytes(path, limit).decode("utf-8")


def too_large(limit: int) -> str:
    return f"it is larger than the {limit // MiB} MiB rpx reads of such a file"
