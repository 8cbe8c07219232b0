"""The cuda backend: its logic on any machine (the real unavailable path here, TF32 switches included: torch lets
them be set without a GPU), and real GPU checks marked ``cuda`` that run where an NVIDIA GPU is present
(scripts/gpu_check.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rpx_core.errors import UnsupportedError
from rpx_core.execution.context import Job, StageContext
from rpx_core.spec.schema import InputSpec, ModelSpec
from rpx_core.types.latency import LatencyOptions
from rpx_plugins.latency import measure_latency
from rpx_plugins.torch import cuda as cuda_backend
from rpx_plugins.torch.backend import TorchBackend
from rpx_plugins.torch.cuda import (
    CudaBackend,
    budget_fraction,
    describe_devices,
    device_index,
)
from tests.fake_gpu import MB, TOKENS, FakeGpu, SimulatedModel

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


#: Reads every TF32 setting through torch's own getters ("refused" where torch raises because legacy and new
#: settings disagree), in a fresh interpreter per starting state: the settings are process-wide, and some starting
#: states are ones in which torch refuses to report them, which no other test should inherit.
TF32_PROBE = """
import json, sys, torch
from rpx_plugins.torch.cuda import TF32_SWITCHES

NEW_API = ("fp32_precision", "cuda.matmul.fp32_precision", "cudnn.fp32_precision", "cudnn.conv.fp32_precision",
           "cudnn.rnn.fp32_precision", "mkldnn.fp32_precision", "mkldnn.matmul.fp32_precision",
           "mkldnn.conv.fp32_precision", "mkldnn.rnn.fp32_precision")

def read(path):
    value = torch
    try:
        for part in path.split("."):
            value = getattr(value, part)
        return value() if callable(value) else value
    except RuntimeError:
        return "refused"

def snapshot():
    paths = ["get_float32_matmul_precision", "backends.cuda.matmul.allow_tf32", "backends.cudnn.allow_tf32"]
    if hasattr(torch.backends.cudnn, "conv"):
        paths += ["backends." + path for path in NEW_API]
    return {path: read(path) for path in paths}

exec(sys.argv[1])
found = {"before": snapshot()}
for enabled in (True, False):
    with TF32_SWITCHES.set(enabled):
        found[f"inside {enabled}"] = snapshot()
    found[f"after {enabled}"] = snapshot()
print(json.dumps(found))
"""
NEW_TF32_API = hasattr(torch.backends.cudnn, "conv")  # torch 2.9+: per-operation fp32_precision settings


@pytest.mark.parametrize(
    "setup",
    [
        "",  # torch's defaults: IEEE matmuls, TF32 cuDNN convolutions
        "torch.set_float32_matmul_precision('medium')",  # a value the legacy allow_tf32 flag cannot express
        "torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = False",
        pytest.param(
            "torch.backends.cuda.matmul.fp32_precision = 'tf32'; torch.backends.cudnn.conv.fp32_precision = 'ieee'",
            marks=pytest.mark.skipif(not NEW_TF32_API, reason="torch before 2.9 has no fp32_precision settings"),
        ),
        pytest.param(  # the legacy matmul precision is then refused, though cuBLAS's allow_tf32 still reads
            "torch.backends.mkldnn.matmul.fp32_precision = 'tf32'",
            marks=pytest.mark.skipif(not NEW_TF32_API, reason="torch before 2.9 has no fp32_precision settings"),
        ),
        pytest.param(
            "torch.backends.cuda.matmul.fp32_precision = 'ieee'; torch.backends.fp32_precision = 'tf32'",
            marks=pytest.mark.skipif(not NEW_TF32_API, reason="torch before 2.9 has no fp32_precision settings"),
        ),
    ],
    ids=["defaults", "medium matmul precision", "legacy flags", "new API", "new API, oneDNN only", "new API, nested"],
)
def test_tf32_switches_are_set_inside_and_put_back_after(setup):
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", TF32_PROBE, setup], capture_output=True, text=True, check=True, cwd=root)
    found = json.loads(out.stdout)
    before = found["before"]
    for enabled in (True, False):
        inside = found[f"inside {enabled}"]
        # torch's checked getters answer (legacy and new settings agree, as cuBLAS requires) and say what was asked
        assert inside["backends.cuda.matmul.allow_tf32"] is enabled
        assert inside["backends.cudnn.allow_tf32"] is enabled
        assert inside["get_float32_matmul_precision"] == ("high" if enabled else "highest")
        if NEW_TF32_API:
            for op in ("cuda.matmul", "cudnn.conv", "cudnn.rnn"):
                assert inside[f"backends.{op}.fp32_precision"] == ("tf32" if enabled else "ieee")
        after = found[f"after {enabled}"]
        # everything torch reported before is back; a legacy setting it refused to report stays as rpx set it
        assert {key: value for key, value in after.items() if before[key] != "refused"} == {
            key: value for key, value in before.items() if value != "refused"
        }
        assert after == before  # refusals included: nothing torch reported is refused afterwards, nor the reverse
    if "cudnn.conv" in setup:
        assert before["backends.cuda.matmul.allow_tf32"] == "refused"  # the premise: the mixed state torch refuses
    if "mkldnn" in setup:  # the premise: a legacy value rpx cannot read, beside one it can
        assert before["get_float32_matmul_precision"] == "refused" and before["backends.cuda.matmul.allow_tf32"] is False


def test_switches_are_put_back_when_the_last_of_overlapping_users_leaves():
    """Concurrent batch_search stages enter from their own threads; the entries overlap without nesting."""
    before = cuda_backend.read_tf32_settings()
    first, second = cuda_backend.TF32_SWITCHES.set(True), cuda_backend.TF32_SWITCHES.set(True)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # the second still runs
    second.__exit__(None, None, None)
    assert cuda_backend.read_tf32_settings() == before


def test_cuda_backend_sets_tf32_only_inside_its_inference_context(monkeypatch):
    """Placement records the precision and changes no switch; the context sets and restores them, even when the
    model raises. Placement itself is stubbed: it needs a GPU, and only the switches are under test."""
    monkeypatch.setattr(CudaBackend, "check_device", lambda self, device: None)
    monkeypatch.setattr(TorchBackend, "place_model", lambda self, model, precision, device: model)
    backend = CudaBackend()
    before = cuda_backend.read_tf32_settings()
    with backend.inference_context():
        assert cuda_backend.read_tf32_settings() == before  # no model placed yet: nothing to set
    for precision, tf32 in (("tf32", True), ("fp32", False), ("fp16", False)):
        backend.place_model(torch.nn.Identity(), precision, "cuda:0")
        assert cuda_backend.read_tf32_settings() == before
        with pytest.raises(ValueError, match="the model failed"), backend.inference_context():
            assert torch.is_inference_mode_enabled()
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
            raise ValueError("the model failed")
        assert cuda_backend.read_tf32_settings() == before and not torch.is_inference_mode_enabled()


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


def test_cuda_library_allocation_failures_are_out_of_memory():
    backend = CudaBackend()
    for message in (
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "cuFFT error: CUFFT_ALLOC_FAILED",
        "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
    ):
        assert backend.is_out_of_memory(RuntimeError(message)), message
    assert not backend.is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED"))


# -- logic against the fake GPU (tests/fake_gpu.py): torch.cuda's API is the fake's, everything above is rpx's -------


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    return FakeGpu("cuda", total_bytes=16 * 10**9, context_bytes=400 * MB).install(monkeypatch)


def test_budget_on_a_device_without_an_index(gpu):
    """``device = "cuda"``: torch's set_per_process_memory_fraction refuses a device without an index."""
    backend = CudaBackend()
    assert backend.set_memory_budget("cuda", 4 * 10**9)
    assert gpu.allocator.cap_bytes == 4 * 10**9
    assert backend.set_memory_budget("cuda", None)
    assert gpu.allocator.cap_bytes == gpu.allocator.total_bytes


def test_lifting_the_budget_puts_back_the_users_cap(gpu):
    torch.cuda.set_per_process_memory_fraction(0.5, 0)  # the user's own cap, set before rpx runs
    backend = CudaBackend()
    backend.set_memory_budget("cuda:0", 2 * 10**9)
    backend.set_memory_budget("cuda:0", 3 * 10**9)  # a second budget: the user's cap is still the one to put back
    backend.set_memory_budget("cuda:0", None)
    assert torch.cuda.get_per_process_memory_fraction(0) == 0.5


def test_budget_is_a_real_out_of_memory_that_recovery_clears(gpu):
    backend = CudaBackend()
    backend.set_memory_budget("cuda:0", 2 * 10**9)
    kept = gpu.buffer(1500 * MB)
    with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
        gpu.buffer(1000 * MB)  # 2.5 GB reserved would cross the 2 GB cap
    assert backend.is_out_of_memory(caught.value)
    del kept
    assert torch.cuda.memory_reserved(0) > 0  # freed into the cache, still reserved
    backend.recover_from_oom("cuda:0")
    assert torch.cuda.memory_reserved(0) == 0
    gpu.buffer(1900 * MB)  # fits once the cache is gone


def test_a_regions_reserved_peak_is_its_own_after_releasing_the_cache(gpu):
    """The caching allocator keeps what an earlier region freed: without releasing it, the next region's reserved peak
    starts there."""
    backend = CudaBackend()
    earlier = gpu.buffer(3000 * MB)
    del earlier
    backend.reset_peak_memory("cuda:0")
    gpu.buffer(100 * MB)
    assert backend.read_peak_memory("cuda:0").reserved_bytes >= 3000 * MB  # the premise: the cache counts
    earlier = gpu.buffer(3000 * MB)
    del earlier
    backend.release_cached_memory("cuda:0")
    backend.reset_peak_memory("cuda:0")
    region = gpu.buffer(100 * MB)
    peak = backend.read_peak_memory("cuda:0")
    # 100 MB in a segment rounded up to 2 MiB; the 0.66 MB left is under 1 MiB, too small to split off
    assert peak.peak_bytes == peak.reserved_bytes == 48 * 2**21 > region.nbytes
    assert peak.outside_allocator_bytes == 400 * MB  # the context


def test_timer_waits_for_its_own_stream_only(gpu):
    backend = CudaBackend()
    model = SimulatedModel(gpu, 10 * MB, (1 * MB,), seconds_per_call=2e-3, seconds_per_sample=0)
    with backend.concurrent_worker("cuda:0"):
        stream = torch.cuda.current_stream()
        timer = backend.timer("cuda:0")
        x = TOKENS(batch_size=1, device="cuda:0", dtype=None)
        timer.start()
        for _ in range(5):
            model(x)
        assert timer.stop() == pytest.approx(5 * 2e-3)  # the kernels' modelled device time, from the events
    assert stream is not gpu.default_stream
    assert gpu.device_syncs("MainThread") == 0
    assert gpu.kernel_streams("MainThread") == {"MainThread": {stream.name}}


def test_latency_on_the_fake_gpu_is_the_modelled_kernel_time(gpu):
    """The real latency stage on the cuda backend: each sample is one call's device time between two events."""
    model = SimulatedModel(gpu, 50 * MB, (2 * MB, 2 * MB), seconds_per_call=3e-3, seconds_per_sample=1e-4)
    spec = ModelSpec(name="sim", source="tests:fake", input_factory="tests.fake_gpu:TOKENS")
    options = LatencyOptions(warmup_calls=3, warmup_seconds=0.0, min_samples=64, throughput_seconds=0.01)
    job = Job(spec, "cuda", "cuda:0", "fp16", ("measure_latency",), {"measure_latency": options}, (), (1, 8))
    result = measure_latency(StageContext(job, CudaBackend(), plugins=None, gpu_catalog=None, model_object=model))
    assert result.p50_ms == pytest.approx(3.1) and result.min_ms == pytest.approx(result.max_ms)
    assert result.throughput[1].samples_per_s == pytest.approx(8 / (3e-3 + 8e-4))
    peak = result.peak_memory
    assert peak.peak_bytes >= 50 * MB and peak.outside_allocator_bytes == 400 * MB and not peak.sampled


def test_on_a_torch_without_get_per_process_memory_fraction(gpu, monkeypatch):
    """Older torch cannot report the cap; a process starts uncapped, so lifting the budget puts back 1.0."""
    monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction")
    backend = CudaBackend()
    backend.set_memory_budget("cuda:0", 4 * 10**9)
    backend.set_memory_budget("cuda:0", None)
    assert gpu.fractions == [4 * 10**9 / gpu.allocator.total_bytes, 1.0]


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
    seen = set()  # the TF32 switches during each call (the hook is shared by the copy rpx places)
    model.register_forward_pre_hook(lambda *_: seen.add((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)))
    spec = ModelSpec(name="mlp", source="tests:handmade", inputs=(InputSpec((1, 1024)),))
    options = LatencyOptions(warmup_seconds=0.2, min_samples=200, throughput_seconds=0.2, adaptive=False)
    job = Job(spec, "cuda", "cuda:0", precision, ("measure_latency",), {"measure_latency": options}, (), (1, 64))
    before = cuda_backend.read_tf32_settings()
    result = measure_latency(StageContext(job, CudaBackend(), plugins=None, gpu_catalog=None, model_object=model))
    assert seen == {(precision == "tf32",) * 2}
    assert cuda_backend.read_tf32_settings() == before
    assert result.clock == cuda_backend.CudaEventTimer.clock
    assert 0 < result.p50_ms < 50 and result.unclaimed_percentiles == ("p99",)
    assert result.peak_memory.peak_bytes > 0 and not result.peak_memory.sampled
    assert result.throughput[1].samples_per_s > result.throughput[0].samples_per_s

