"""Memory helpers every backend shares: the host's peak memory over one region (cpu, and jax on the CPU), the
background :class:`MemorySampler` (also behind the mps backend's sampled peaks), and out-of-memory recognition:
:func:`raised_for` follows an exception's cause/context chain for a runtime's error types or messages (cpu, cuda and
mps all use it, since libraries wrap a runtime's out-of-memory error in their own).

Host peak on Linux: writing "5" to ``/proc/self/clear_refs`` resets the kernel's peak-RSS counter (VmHWM in
``/proc/self/status``) to the current RSS, so VmHWM read after the region is the region's peak, exact to the page, with
no thread running beside the measured code. Where that file is not writable (macOS, locked-down containers) a
background thread samples RSS every millisecond and the result says ``sampled=True``: a spike shorter than the
interval can be missed. Either way the peak is the process's whole RSS during the region (model and inputs included),
never the peak since start. Beside it, the RSS at the region's start and the increment (peak - start): the
region's own need, without what the process held before it, and the host's available memory when read.

The C heap keeps what the program freed for its next requests instead of unmapping it, so a region's RSS starts
from whatever earlier regions left in it: :func:`trim_heap` gives that back first (glibc's ``malloc_trim``), as
``torch.cuda.empty_cache`` does for the CUDA allocator. Without it, a batch-search trial after a large one read
tens of MB more than the same trial alone.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Callable, Iterable

from rpx_core.plugin import MemoryPeak, with_start

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
SAMPLE_INTERVAL_S = 0.001
FREE_METHOD = "free: the host's available memory (psutil) when read"
HWM_METHOD = f"VmHWM (peak RSS) after writing 5 to /proc/self/clear_refs; start: VmRSS right after the reset; {FREE_METHOD}"
SAMPLED_RSS_METHOD = (f"max RSS (psutil) sampled every {SAMPLE_INTERVAL_S * 1e3:g} ms on a background thread; start: "
                      f"the first sample; {FREE_METHOD}")
#: Message of torch's CPU allocator failure (a plain RuntimeError) and of the OS refusing memory.
HOST_OOM_MESSAGES = ("can't allocate memory", "Cannot allocate memory")


def read_status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (e.g. "VmHWM", "VmRSS") in bytes (1 kB = 1024 bytes), None if absent."""
    try:
        lines = STATUS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key == field:
            number, _, unit = value.strip().partition(" ")
            return int(number) * 1024 if unit == "kB" else int(number)
    return None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel interface is missing or not writable."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return read_status_bytes("VmHWM") is not None


def trim_heap() -> bool:
    """Return the C heap's free memory to the OS (glibc's ``malloc_trim(0)``); False where the C library has no
    such call (macOS, musl)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


def available_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


def current_rss() -> tuple[int]:
    import psutil

    return (psutil.Process().memory_info().rss,)


class MemorySampler:
    """Element-wise maximum of ``read()`` on a background thread; the region's start and end are always sampled."""

    def __init__(self, read: Callable[[], tuple[int, ...]], interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._read = read
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._failure: Exception | None = None
        self._peak = self.start = read()
        self._thread = threading.Thread(target=self._run, name="rpx-memory-sampler", daemon=True)
        self._thread.start()

    def _observe(self) -> None:
        self._peak = tuple(max(old, new) for old, new in zip(self._peak, self._read()))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._observe()
            except Exception as exc:  # a reading failed: stop sampling; stop() raises it, so no peak is short
                self._failure = exc
                return

    def stop(self) -> tuple[int, ...]:
        """Stop sampling (idempotent) and return the peaks."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            if self._failure is not None:
                raise self._failure
            self._observe()
        return self._peak


class HostPeakTracker:
    """The reset/read pair behind the cpu backend's peak-memory methods (one region at a time)."""

    def __init__(self, force_sampling: bool = False) -> None:
        self._force_sampling = force_sampling  # tests use it to exercise the fallback where clear_refs works
        self._sampler: MemorySampler | None = None
        self._start: int | None = None

    def reset(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        if self._force_sampling or not reset_peak_rss():
            self._sampler = MemorySampler(current_rss)
            (self._start,) = self._sampler.start
        else:
            self._start = read_status_bytes("VmRSS")

    def read(self) -> MemoryPeak:
        """Peak RSS since the last ``reset`` (without one: VmHWM since process start, which Linux reports as is)."""
        if self._sampler is not None:
            (peak,) = self._sampler.stop()
            read = MemoryPeak(method=SAMPLED_RSS_METHOD, peak_bytes=peak, sampled=True, device_free_bytes=available_bytes())
            return with_start(read, self._start)
        read = MemoryPeak(method=HWM_METHOD, peak_bytes=read_status_bytes("VmHWM"), device_free_bytes=available_bytes())
        return with_start(read, self._start)


def raised_for(exc: BaseException, types: tuple[type[BaseException], ...], messages: Iterable[str]) -> bool:
    """True when ``exc`` or an exception it was raised from/during is one of ``types`` or mentions one of
    ``messages`` (libraries often wrap a runtime's out-of-memory error in their own)."""
    messages = tuple(messages)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, types) or any(message in str(current) for message in messages):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_host_out_of_memory(exc: BaseException) -> bool:
    """Python's MemoryError, or torch's CPU allocator failing ("DefaultCPUAllocator: can't allocate memory")."""
    return raised_for(exc, (MemoryError,), HOST_OOM_MESSAGES)
