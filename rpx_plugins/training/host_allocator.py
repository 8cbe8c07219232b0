"""The host's allocator, set so that a region's peak RSS is what the region itself held at once.

Why: glibc's malloc serves allocations above its mmap threshold with mmap (returned to the OS on free), but the
threshold rises to the size of every such block freed (up to 32 MiB), after which blocks of that size come from the
heap and stay resident when freed. After a few training steps the heap holds the earlier steps' freed activations:
the next step's RSS increment is then near zero, or reflects how freed blocks happened to fit, not what the step
held. Fixing the threshold (``mallopt(M_MMAP_THRESHOLD)``, which also stops it moving) makes every block of at least
:data:`MMAP_THRESHOLD` bytes an mmap of its own, so RSS follows the live tensors to the page; ``malloc_trim(0)``
first gives back what the heap holds free. The setting stays for the process (a measured job has its own worker), so
the measured steps come after the timed ones. Where the C library is not glibc, nothing is changed, and the method
says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: M_TRIM_THRESHOLD and M_MMAP_THRESHOLD in glibc's malloc.h.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks at least this large get an mmap of their own: 64 KiB (glibc's default is 128 KiB, before it moves).
MMAP_THRESHOLD = 64 * 1024
#: glibc's dynamic rule stops at 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), the trim threshold at twice that.
SPEED_MMAP_THRESHOLD = 32 * 2**20
SET = (f"glibc malloc: mmap threshold fixed at {MMAP_THRESHOLD // 1024} KiB (mallopt) and malloc_trim(0) before the "
       "model was built, so freed tensors leave the RSS; timed steps after it at 32 MiB (glibc's own ceiling)")
UNSET = "the C library is not glibc: its allocator was left as it was (freed memory may stay in the RSS)"


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    library = ctypes.CDLL(name)
    return library if hasattr(library, "mallopt") and hasattr(library, "malloc_trim") else None


def return_freed_memory() -> str:
    """Fix the mmap threshold and trim the heap (glibc); the method in words, for the measured peak."""
    libc = _glibc()
    if libc is None:
        return UNSET
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.malloc_trim(0)
    return SET


def settle_for_speed() -> None:
    """Thresholds where glibc's dynamic rule ends after large frees: blocks up to 32 MiB reused from the heap."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, SPEED_MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * SPEED_MMAP_THRESHOLD)
