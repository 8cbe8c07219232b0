"""Memory of the measured call: every backend reports the usage at the region's start, the peak, and the region's
own increment (peak - start), with the method.

The check each time: hold a large buffer before the region, allocate a known temporary inside it, and the increment
is within 10% of the temporary while the start holds the buffer. The host is measured for real (both the VmHWM path
and the sampled fallback); CUDA and MPS run their real backends over the fake allocator of tests/fake_gpu.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from rpx_core.execution.context import Job, StageContext
from rpx_core.registry.backends import MemoryPeak, with_start
from rpx_core.spec.schema import InputSpec, ModelSpec
from rpx_core.types.latency import LatencyOptions
from rpx_plugins import host_memory
from rpx_plugins.latency import measure_latency
from rpx_plugins.torch.cpu import CpuBackend
from rpx_plugins.torch.cuda import CudaBackend
from rpx_plugins.torch.mps import MpsBackend
from tests.fake_gpu import FakeGpu

MB = 10**6
HELD, TEMPORARY = 300 * MB, 100 * MB


def touched(nbytes: int) -> torch.Tensor:
    """A tensor whose pages are all resident (ones, not empty: untouched pages add no RSS)."""
    return torch.ones(nbytes // 4, dtype=torch.float32)


def assert_region(peak: MemoryPeak, held: int, temporary: int) -> None:
    assert peak.start_bytes >= held, peak
    assert peak.increment_bytes == peak.peak_bytes - peak.start_bytes
    assert abs(peak.increment_bytes - temporary) <= 0.1 * temporary, peak
    assert "start:" in peak.method


@pytest.mark.parametrize("sampled", [False, True], ids=["vmhwm", "sampled"])
def test_host_region_increment_is_the_temporary(sampled):
    if not sampled and not host_memory.reset_peak_rss():
        pytest.skip("/proc/self/clear_refs is not writable here")
    tracker = host_memory.HostPeakTracker(force_sampling=sampled)
    held = touched(HELD)
    tracker.reset()
    temporary = touched(TEMPORARY)
    if sampled:
        time.sleep(0.05)  # the sampler reads every 1 ms
    del temporary
    peak = tracker.read()
    assert peak.sampled == sampled
    assert_region(peak, HELD, TEMPORARY)
    del held


def test_latency_region_reports_the_calls_own_need():
    """Through measure_latency: the model holds 300 MB of weights-like state and allocates 80 MB per call."""

    class Scratch(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.ones(HELD // 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scratch = torch.ones(80 * MB // 4)
            return x + scratch[:1]

    options = LatencyOptions(min_samples=5, adaptive=False, warmup_calls=1, warmup_seconds=0.0,
                             throughput_seconds=0.01, throughput_min_calls=1)
    spec = ModelSpec(name="scratch", source="tests:handmade", inputs=(InputSpec((1, 1)),))
    job = Job(spec, "cpu", "cpu", "fp32", ("measure_latency",), {"measure_latency": options}, (), (1,))
    result = measure_latency(StageContext(job, CpuBackend(), plugins=None, gpu_catalog=None, model_object=Scratch()))
    assert_region(result.peak_memory, HELD, 80 * MB)
    assert_region(result.throughput[0].peak_memory, HELD, 80 * MB)


def test_cuda_region_increment_over_the_fake_allocator(monkeypatch):
    gpu = FakeGpu("cuda", total_bytes=16 * 10**9, context_bytes=400 * MB).install(monkeypatch)
    backend = CudaBackend()
    held = gpu.buffer(1000 * MB)
    backend.reset_peak_memory("cuda:0")
    temporary = gpu.buffer(200 * MB)
    del temporary
    peak = backend.read_peak_memory("cuda:0")
    assert_region(peak, 1000 * MB, 200 * MB)
    assert peak.start_bytes == torch.cuda.memory_allocated(0)  # the held buffer, as the allocator counts it
    del held


def test_mps_region_increment_over_the_fake_allocator(monkeypatch):
    gpu = FakeGpu("mps", total_bytes=24 * 10**9, context_bytes=300 * MB, name="Apple M2 Max").install(monkeypatch)
    backend = MpsBackend()
    held = gpu.buffer(1000 * MB)
    backend.reset_peak_memory("mps")
    temporary = gpu.buffer(200 * MB)
    time.sleep(0.05)  # the region samples every 1 ms until its first timed call
    del temporary
    peak = backend.read_peak_memory("mps")
    assert peak.sampled
    assert_region(peak, 1000 * MB, 200 * MB)
    del held


def test_increment_is_absent_without_a_start_and_never_negative():
    assert with_start(MemoryPeak("m", peak_bytes=10), None).increment_bytes is None
    assert with_start(MemoryPeak("m"), 5).increment_bytes is None
    assert with_start(MemoryPeak("m", peak_bytes=10), 4).increment_bytes == 6
    assert with_start(MemoryPeak("m", peak_bytes=10), 12).increment_bytes == 0  # the region freed what it started with
