"""Peak RSS of a region, measured for real: memory freed before the region is not counted, memory used inside is.

Tolerance: RSS moves in 4 KiB pages and the interpreter itself allocates a little between reading the baseline and
closing the region (a few MB at most), so figures are checked to within 20 MB: 10% of the 200 MB buffer, and far below
the 400 MB that a peak-since-start method (the seed's defect) would add.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import psutil
import pytest
import torch

from rpx_plugins import host_memory
from rpx_plugins.host_memory import (
    HostPeakTracker,
    MemorySampler,
    is_host_out_of_memory,
    raised_for,
    read_status_bytes,
)
from rpx_plugins.torch.cpu import CpuBackend

MB = 1_000_000
TOLERANCE = 20 * MB
needs_clear_refs = pytest.mark.skipif(
    not host_memory.reset_peak_rss(), reason="/proc/self/clear_refs is not writable here (the sampled path is tested)"
)


def touched_buffer(size: int) -> np.ndarray:
    """``size`` bytes that are really resident (np.ones writes every page)."""
    return np.ones(size, dtype=np.uint8)


def rss() -> int:
    return psutil.Process().memory_info().rss


@needs_clear_refs
def test_memory_freed_before_the_region_is_not_counted():
    before = touched_buffer(400 * MB)
    del before
    peak_so_far = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux; what the seed reported
    tracker = HostPeakTracker()
    tracker.reset()
    baseline = rss()
    peak = tracker.read()
    assert peak.method == host_memory.HWM_METHOD and not peak.sampled
    assert peak.peak_bytes - baseline < TOLERANCE
    assert peak_so_far >= baseline + 400 * MB - TOLERANCE


@needs_clear_refs
def test_memory_used_inside_the_region_is_counted():
    tracker = HostPeakTracker()
    tracker.reset()
    baseline = rss()
    inside = touched_buffer(200 * MB)
    del inside
    peak = tracker.read()
    assert abs(peak.peak_bytes - (baseline + 200 * MB)) < TOLERANCE


def test_sampled_fallback_sees_a_held_allocation():
    tracker = HostPeakTracker(force_sampling=True)
    tracker.reset()
    baseline = rss()
    inside = touched_buffer(200 * MB)
    time.sleep(0.3)  # held for 300 sampling intervals: the sampler thread runs even on a loaded machine
    del inside
    peak = tracker.read()
    assert peak.sampled and peak.method == host_memory.SAMPLED_RSS_METHOD
    assert abs(peak.peak_bytes - (baseline + 200 * MB)) < TOLERANCE
    assert tracker.read() == peak  # reading again does not restart or lose the region


def test_cpu_backend_measures_its_region():
    backend = CpuBackend()
    backend.reset_peak_memory("cpu")
    baseline = rss()
    inside = touched_buffer(100 * MB)
    del inside
    peak = backend.read_peak_memory("cpu")
    assert peak.peak_bytes >= baseline + 100 * MB - TOLERANCE


def test_status_fields_agree_with_psutil():
    status_rss = read_status_bytes("VmRSS")
    if status_rss is None:
        pytest.skip("no /proc/self/status on this OS")
    assert abs(status_rss - rss()) < TOLERANCE
    assert read_status_bytes("NoSuchField") is None


def test_real_cpu_allocator_failure_is_out_of_memory():
    with pytest.raises(RuntimeError) as caught:
        torch.empty(10**15, dtype=torch.uint8)  # 1 PB: refused immediately by the allocator
    assert is_host_out_of_memory(caught.value)
    assert CpuBackend().is_out_of_memory(caught.value)
    assert is_host_out_of_memory(MemoryError())
    assert not is_host_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_wrapped_errors_are_followed_through_their_cause():
    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise ValueError("the library's own wrapper") from inner
    except ValueError as outer:
        assert is_host_out_of_memory(outer)
    looped = RuntimeError("a")
    looped.__context__ = looped
    assert not raised_for(looped, (MemoryError,), ("out of memory",))


def test_a_reading_that_fails_on_the_sampling_thread_is_raised_by_stop_not_lost():
    calls = []

    def read() -> tuple[int]:  # the start, then one failed reading, then readings again (a transient fault)
        calls.append(None)
        if len(calls) == 2:
            raise RuntimeError("device gone")
        return (len(calls),)

    sampler = MemorySampler(read, interval_s=0.001)
    deadline = time.monotonic() + 5
    while sampler._thread.is_alive() and time.monotonic() < deadline:  # the thread ends at the failed reading
        time.sleep(0.01)
    assert not sampler._thread.is_alive()
    with pytest.raises(RuntimeError, match="device gone"):
        sampler.stop()
