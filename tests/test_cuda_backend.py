"""The cuda and mps backends: their logic on any machine (the real unavailable path here), and real GPU checks marked
``cuda`` that run where an NVIDIA GPU is present (scripts/gpu_check.sh)."""

from __future__ import annotations

import time

import pytest
import torch

from rpx_core.context import Job, StageContext
from rpx_core.errors import UnsupportedError
from rpx_core.spec import InputSpec, ModelSpec
from rpx_core.tier3 import LatencyOptions
from rpx_plugins import cuda_backend, mps_backend
from rpx_plugins.cuda_backend import (
    CudaBackend,
    budget_fraction,
    describe_devices,
    device_index,
)
from rpx_plugins.latency import measure_latency
from rpx_plugins.mps_backend import MpsBackend

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")
MIB = 1024 * 1024


# -- logic, on any machine ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_unavailable_cuda_says_why():
    availability = CudaBackend().availability
    assert not availability.available
    if torch.version.cuda is None:
        assert availability.reason.startswith("CUDA build not installed")
    else:
        assert availability.reason.startswith("no CUDA device")


def test_device_list_description():
    assert describe_devices(["NVIDIA H200", "NVIDIA H200"]) == "2 devices: NVIDIA H200"
    assert describe_devices(["NVIDIA H200"]) == "1 device: NVIDIA H200"
    assert describe_devices(["NVIDIA H200", "NVIDIA A100"]) == "2 devices: NVIDIA H200, NVIDIA A100"


def test_device_selection_by_index():
    assert device_index("cuda") is None
    assert device_index("cuda:1") == 1
    for bad in ("cpu", "cuda:x", "mps:0"):
        with pytest.raises(UnsupportedError, match="'cuda' or 'cuda:<index>'"):
            device_index(bad)


def test_budget_becomes_a_fraction_of_the_device():
    total = 80 * 1024**3
    assert budget_fraction(20 * 1024**3, total) == 0.25
    assert budget_fraction(total, total) == 1.0
    assert budget_fraction(2 * total, total) == 1.0  # no limit beyond the device itself
    with pytest.raises(ValueError, match="> 0 bytes"):
        budget_fraction(0, total)


def test_tf32_switches_follow_the_precision():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        cuda_backend.set_tf32(True)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
        cuda_backend.set_tf32(False)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_cuda_out_of_memory_is_recognised_directly_and_wrapped():
    backend = CudaBackend()
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert backend.is_out_of_memory(oom)
    assert backend.is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    try:
        try:
            raise oom
        except torch.cuda.OutOfMemoryError as inner:
            raise RuntimeError("the library's wrapper") from inner
    except RuntimeError as outer:
        assert backend.is_out_of_memory(outer)
    assert not backend.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError) as cpu_oom:
        torch.empty(10**15, dtype=torch.uint8)
    assert not backend.is_out_of_memory(cpu_oom.value)  # the host ran out, not the GPU


def test_backends_register_with_their_precisions():
    (cuda,) = cuda_backend.rpx_register_backends()
    (mps,) = mps_backend.rpx_register_backends()
    assert (cuda.name, cuda.precisions) == ("cuda", ("fp32", "tf32", "fp16", "bf16"))
    assert (mps.name, mps.precisions) == ("mps", ("fp32", "fp16", "bf16"))


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has an MPS device")
def test_unavailable_mps_says_why():
    availability = MpsBackend().availability
    assert not availability.available
    if not torch.backends.mps.is_built():
        assert "built without MPS" in availability.reason
    else:
        assert availability.reason.startswith("no MPS device")


def test_mps_out_of_memory_is_recognised_by_its_message():
    backend = MpsBackend()
    assert backend.is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB)"))
    assert not backend.is_out_of_memory(RuntimeError("Placeholder storage has not been allocated on MPS device!"))


def test_mps_peak_without_a_region_is_not_a_number():
    peak = MpsBackend().read_peak_memory("mps")
    assert peak.peak_bytes is None and peak.method.startswith("not measured")


# -- real GPU ------------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_event_timer_agrees_with_the_host_clock():
    backend = CudaBackend()
    timer = backend.timer("cuda:0")
    torch.cuda._sleep(1_000_000)  # warm the kernel
    backend.synchronize("cuda:0")
    began = time.perf_counter()
    timer.start()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles at ~2 GHz
    events = timer.stop()
    host = time.perf_counter() - began
    assert events > 0.01
    assert events == pytest.approx(host, rel=0.1)


@pytest.mark.cuda
@needs_cuda
def test_peak_memory_counts_the_region_only():
    backend = CudaBackend()
    before = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda:0")
    del before
    backend.reset_peak_memory("cuda:0")
    start = torch.cuda.memory_allocated("cuda:0")
    inside = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda:0")
    del inside
    peak = backend.read_peak_memory("cuda:0")
    assert peak.peak_bytes - start == 256 * MIB  # the caching allocator's own accounting is exact
    assert peak.reserved_bytes >= peak.peak_bytes
    assert peak.outside_allocator_bytes > 0  # at least the CUDA context


@pytest.mark.cuda
@needs_cuda
def test_budget_turns_into_a_real_out_of_memory():
    backend = CudaBackend()
    backend.recover_from_oom("cuda:0")
    assert backend.set_memory_budget("cuda:0", 1024 * MIB)
    try:
        with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
            torch.empty(2048 * MIB, dtype=torch.uint8, device="cuda:0")
        assert backend.is_out_of_memory(caught.value)
    finally:
        assert backend.set_memory_budget("cuda:0", None)
        backend.recover_from_oom("cuda:0")
    torch.empty(2048 * MIB, dtype=torch.uint8, device="cuda:0")  # lifted


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_latency_stage_on_the_gpu(precision):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    spec = ModelSpec(name="mlp", source="tests:handmade", inputs=(InputSpec((1, 1024)),))
    options = LatencyOptions(warmup_seconds=0.2, min_samples=200, throughput_seconds=0.2)
    job = Job(spec, "cuda", "cuda:0", precision, ("measure_latency",), {"measure_latency": options}, (), (1, 64))
    result = measure_latency(StageContext(job, CudaBackend(), plugins=None, gpu_catalog=None, model_object=model))
    assert torch.backends.cuda.matmul.allow_tf32 == (precision == "tf32")
    assert result.clock == cuda_backend.CudaEventTimer.clock
    assert 0 < result.p50_ms < 50 and result.unclaimed_percentiles == ("p99",)
    assert result.peak_memory.peak_bytes > 0 and not result.peak_memory.sampled
    assert result.throughput[1].samples_per_s > result.throughput[0].samples_per_s
