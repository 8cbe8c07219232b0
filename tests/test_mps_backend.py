"""The mps backend's logic on any machine: its sampled peak memory, with the memory counters replaced by a scripted
sequence of readings (torch.mps has current figures only, so the peak is the maximum of samples), its out-of-memory
recognition, and the real unavailable path where there is no Apple GPU."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import torch

from rpx_core.execution.context import Job, StageContext
from rpx_core.registry.gpus import GPUCatalog, load_pack
from rpx_core.spec.schema import ModelSpec
from rpx_core.types.latency import LatencyOptions
from rpx_plugins.latency import measure_latency
from rpx_plugins.reference_gpus import reference_pack_path
from rpx_plugins.torch import mps as mps_backend
from rpx_plugins.torch.mps import MpsBackend
from tests.fake_gpu import MB, FakeGpu, SimulatedModel


class ScriptedMemory:
    """Stands in for ``mps_memory``: (allocated, driver) readings in order, then the last one for ever."""

    def __init__(self, *readings: tuple[int, int]) -> None:
        self.readings = list(readings)
        self.calls = 0
        self.all_read = threading.Event()

    def __call__(self) -> tuple[int, int]:
        readings = self.readings  # once: a test may replace the list while the sampler thread reads
        reading = readings[min(self.calls, len(readings) - 1)]
        self.calls += 1
        if self.calls >= len(readings):
            self.all_read.set()
        return reading


@pytest.fixture
def backend(monkeypatch) -> MpsBackend:
    monkeypatch.setattr(MpsBackend, "synchronize", lambda self, device: None)  # torch.mps needs an Apple GPU
    return MpsBackend()


def test_peak_is_the_maximum_of_each_figure_over_the_samples(backend, monkeypatch):
    readings = [(100, 1_000), (500, 1_200), (300, 3_000), (200, 1_500)]
    memory = ScriptedMemory(*readings)
    monkeypatch.setattr(mps_backend, "mps_memory", memory)
    backend.reset_peak_memory("mps")
    assert memory.all_read.wait(timeout=60)  # the background thread took every sample
    peak = backend.read_peak_memory("mps")
    # allocated and driver peaks come from different samples: each is its own maximum
    assert (peak.peak_bytes, peak.reserved_bytes) == (max(r[0] for r in readings), max(r[1] for r in readings))
    assert peak.sampled and peak.method == mps_backend.PEAK_METHOD
    assert backend.read_peak_memory("mps") == peak  # reading again neither restarts nor loses the region


def test_the_region_start_and_end_are_always_sampled(backend, monkeypatch):
    # an hour between samples: the region's start and end are the only ones
    monkeypatch.setattr(mps_backend, "MemorySampler", functools.partial(mps_backend.MemorySampler, interval_s=3600))
    memory = ScriptedMemory((700, 50))
    monkeypatch.setattr(mps_backend, "mps_memory", memory)
    backend.reset_peak_memory("mps")
    memory.readings = [(100, 900)]
    peak = backend.read_peak_memory("mps")
    assert (peak.peak_bytes, peak.reserved_bytes) == (700, 900) and memory.calls == 2


def test_a_new_region_forgets_the_previous_one(backend, monkeypatch):
    memory = ScriptedMemory((900, 900))
    monkeypatch.setattr(mps_backend, "mps_memory", memory)
    backend.reset_peak_memory("mps")
    memory.readings = [(10, 20)]
    backend.reset_peak_memory("mps")  # without reading the first region
    peak = backend.read_peak_memory("mps")
    assert (peak.peak_bytes, peak.reserved_bytes) == (10, 20)


def test_peak_without_a_region_is_not_a_number():
    peak = MpsBackend().read_peak_memory("mps")
    assert peak.peak_bytes is None and peak.sampled and peak.method.startswith("not measured")


def test_out_of_memory_is_recognised_by_its_message():
    backend = MpsBackend()
    assert backend.is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB)"))
    assert not backend.is_out_of_memory(RuntimeError("Placeholder storage has not been allocated on MPS device!"))


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has an MPS device")
def test_unavailable_mps_says_why():
    availability = MpsBackend().availability
    assert not availability.available
    if not torch.backends.mps.is_built():
        assert "built without MPS" in availability.reason
    else:
        assert availability.reason.startswith("no MPS device")


def test_metal_buffer_size_refusal_is_out_of_memory():
    assert MpsBackend().is_out_of_memory(RuntimeError("Invalid buffer size: 24.00 GB"))


# -- against the fake GPU (tests/fake_gpu.py): torch.mps's API is the fake's, everything above is rpx's ------------------


@pytest.fixture
def mps(monkeypatch) -> FakeGpu:
    return FakeGpu("mps", total_bytes=24 * 10**9, context_bytes=300 * MB, name="Apple M2 Max").install(monkeypatch)


def test_device_is_named_so_the_catalogue_matches_it(mps):
    backend = MpsBackend()
    assert backend.device_name("mps") == "Apple M2 Max 38-core GPU"
    catalog = GPUCatalog([load_pack(reference_pack_path(), provider="rpx")])
    assert catalog.find_by_device_name(backend.device_name("mps")).name == "Apple-M2-Max-38c"
    assert backend.availability.reason.startswith("Apple M2 Max 38-core GPU")


def test_memory_is_never_sampled_while_a_call_is_timed(mps, monkeypatch):
    """The real latency stage on the mps backend, with each call lasting 3 ms of host time: the sampler thread used
    to read torch.mps's counters every millisecond during the timed calls."""
    reads_inside: list[str] = []
    inside = threading.Event()
    counters = torch.mps.current_allocated_memory

    def counted() -> int:
        if inside.is_set():
            reads_inside.append(threading.current_thread().name)
        return counters()

    class Slow(SimulatedModel):
        def forward(self, x):
            inside.set()
            time.sleep(0.003)
            out = super().forward(x)
            inside.clear()
            return out

    monkeypatch.setattr(torch.mps, "current_allocated_memory", counted)
    model = Slow(mps, 50 * MB, (2 * MB,))
    spec = ModelSpec(name="sim", source="tests:fake", input_factory="tests.fake_gpu:TOKENS")
    options = LatencyOptions(warmup_calls=2, warmup_seconds=0.0, min_samples=20, throughput_seconds=0.03,
                             adaptive=False)
    job = Job(spec, "mps", "mps", "fp32", ("measure_latency",), {"measure_latency": options}, (), (1, 4))
    result = measure_latency(StageContext(job, MpsBackend(), plugins=None, gpu_catalog=None, model_object=model))
    assert result.samples_count == 20 and result.peak_memory.sampled
    assert result.peak_memory.peak_bytes >= 50 * MB and result.peak_memory.method == mps_backend.PEAK_METHOD
    assert reads_inside == []


def test_on_a_torch_without_the_newer_mps_calls(mps, monkeypatch):
    """torch before 2.5 has no recommended_max_memory (and older ones no get_name/get_core_count): budgets are then
    not enforced, and fractional budgets cannot be resolved, rather than failing on a missing attribute."""
    for name in ("recommended_max_memory",):
        monkeypatch.delattr(torch.mps, name)
    for name in ("get_name", "get_core_count"):
        monkeypatch.delattr(torch.backends.mps, name)
    backend = MpsBackend()
    assert backend.device_memory_bytes("mps") is None
    assert backend.set_memory_budget("mps", 10**9) is False and mps.fractions == []
    assert backend.device_name("mps") is None  # no name rather than a guess
