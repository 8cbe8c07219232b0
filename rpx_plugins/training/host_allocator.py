"""The host's allocator, set so that a region's peak RSS is what the region itself held at once.

Why: glibc's malloc serves allocations above its mmap threshold with mmap (returned to the OS on free), but the
threshold rises to the size of every such block freed (up to 32 MiB, the trim threshold to twice that), after which
blocks of that size come from the heap and stay resident when freed. After a few training steps the heap holds the
earlier steps' freed activations: the next step's RSS increment is then near zero, or reflects how freed blocks
happened to fit, not what the step held. And any free block already in the heap serves an allocation of any size
before an mmap is tried (a worker forked from rpx's zygote inherits its parent's free blocks).

So, before the model is built (:func:`freed_memory_returned`): the mmap threshold is fixed at :data:`MMAP_THRESHOLD`
(``mallopt``, which also stops it moving) and the trim threshold set back to glibc's initial 128 KiB; the heap's
free blocks are taken by placeholder blocks of the threshold's size (their pages given back by ``malloc_trim``, so
they hold almost nothing), until an allocation of that size is an mmap; every tensor of at least that size is then
an mmap of its own, and RSS follows the live tensors to the page. Before the measured step, ``malloc_trim(0)`` gives
back the pages of the heap's free blocks again. Afterwards the placeholders are freed and the thresholds set where
glibc's own rule ends after large frees (:func:`settle_for_speed`), so timed steps reuse heap blocks as a training
loop does. Where the C library is not glibc (or lacks ``mallinfo2``), nothing is changed, and the method says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

#: M_TRIM_THRESHOLD and M_MMAP_THRESHOLD in glibc's malloc.h.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks at least this large get an mmap of their own: 64 KiB (glibc's default is 128 KiB, before it moves).
MMAP_THRESHOLD = 64 * 1024
#: A heap's free top beyond this is given back: glibc's initial value.
TRIM_THRESHOLD = 128 * 1024
#: glibc's dynamic rule stops at 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), the trim threshold at twice that.
SPEED_MMAP_THRESHOLD = 32 * 2**20
#: At most this many placeholders (64 KiB each: 4 GiB of free heap blocks).
MAX_PLACEHOLDERS = 65536
SET = (f"glibc malloc: mmap threshold fixed at {MMAP_THRESHOLD // 1024} KiB, the heap's free blocks taken by "
       "placeholders and its free pages trimmed before the model was built and before the step, so every tensor of "
       "at least 64 KiB is an mmap of its own and leaves the RSS when freed; timed steps after it at glibc's own "
       "32 MiB ceiling")
UNSET = "the C library is not glibc (2.33+): its allocator was left as it was (freed memory may stay in the RSS)"


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    library = ctypes.CDLL(name)
    if not all(hasattr(library, symbol) for symbol in ("mallopt", "malloc_trim", "mallinfo2")):
        return None
    library.mallinfo2.restype = MallInfo2
    library.malloc.restype = ctypes.c_void_p
    library.malloc.argtypes = [ctypes.c_size_t]
    library.free.argtypes = [ctypes.c_void_p]
    return library


def placeholders(libc: ctypes.CDLL) -> list[int]:
    """Blocks of the threshold's size taken from the heap's free blocks, until the next one would be an mmap."""
    taken: list[int] = []
    for _ in range(MAX_PLACEHOLDERS):
        mapped = libc.mallinfo2().hblks
        block = libc.malloc(MMAP_THRESHOLD)
        if not block:
            break
        if libc.mallinfo2().hblks > mapped:  # no free heap block was left to serve it
            libc.free(block)
            break
        taken.append(block)
    return taken


@contextlib.contextmanager
def freed_memory_returned() -> Iterator[str]:
    """While active, tensors of at least MMAP_THRESHOLD bytes are mmaps of their own (glibc); yields the method."""
    libc = _glibc()
    if libc is None:
        yield UNSET
        return
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    taken = placeholders(libc)
    libc.malloc_trim(0)
    try:
        yield SET
    finally:
        for block in taken:
            libc.free(block)


def trim() -> None:
    """Give back the pages of the heap's free blocks (glibc), so reusing them shows in the RSS."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def settle_for_speed() -> None:
    """Thresholds where glibc's dynamic rule ends after large frees: blocks up to 32 MiB reused from the heap."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, SPEED_MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * SPEED_MMAP_THRESHOLD)
