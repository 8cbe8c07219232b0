"""The system card on this machine, checked against the OS's own files rather than against the code that reads them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
import tomllib
import torch

from rpx_core.context import Job, StageContext
from rpx_core.convert import converter
from rpx_core.results import to_data
from rpx_core.spec import InputSpec, ModelSpec
from rpx_core.system import SystemCard
from rpx_plugins import system_card
from rpx_plugins.cpu_backend import CpuBackend

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)")


def proc_value(path: str, key: str) -> str | None:
    file = Path(path)
    if not file.exists():
        return None
    for line in file.read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def test_cpu_is_named_not_just_the_architecture():
    card = system_card.machine_card("torch")
    expected = proc_value("/proc/cpuinfo", "model name")
    if expected is None:
        pytest.skip("no 'model name' in /proc/cpuinfo on this machine")
    assert card.host_processor_model_name == expected
    assert card.host_processor_model_name != platform.machine()


def test_host_counts_and_memory_match_the_os():
    card = system_card.machine_card("torch")
    assert card.host_processor_thread_count == os.cpu_count()
    assert 1 <= card.host_processor_core_count <= card.host_processor_thread_count
    mem_total = proc_value("/proc/meminfo", "MemTotal")
    if mem_total is not None:
        assert card.host_memory_capacity_gb == pytest.approx(int(mem_total.split()[0]) * 1024 / 1e9, abs=0.01)


def test_governor_and_frequency_are_read_or_listed_as_gaps():
    card = system_card.machine_card("torch")
    if system_card.GOVERNOR.exists():
        assert card.host_processor_governor == system_card.GOVERNOR.read_text().strip()
    else:
        assert card.host_processor_governor is None
        assert any(gap.startswith("CPU frequency governor") for gap in card.gaps)
    if card.host_processor_frequency_mhz is None:
        assert any(gap.startswith("CPU maximum frequency") for gap in card.gaps)


def test_torch_job_reports_torch_build_and_accelerators():
    card = system_card.machine_card("torch")
    assert card.framework_versions["torch"] == torch.__version__
    assert card.cuda_version == torch.version.cuda
    expected = (torch.cuda.device_count() if torch.cuda.is_available() else 0) + int(torch.backends.mps.is_available())
    assert card.accelerators_per_node == expected
    assert system_card.machine_card("torch") is card  # collected once per process


def test_card_without_torch_does_not_import_it():
    code = (
        "import sys; from rpx_plugins.system_card import machine_card; card = machine_card(); "
        "print('torch' in sys.modules, card.accelerators_per_node, any('not probed' in g for g in card.gaps))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split() == ["False", "None", "True"]


def test_clock_event_reasons_decode_nvml_bits():
    assert system_card.decode_clock_event_reasons(0) == ()
    assert system_card.decode_clock_event_reasons(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    assert system_card.decode_clock_event_reasons(0x1 | 0x1000) == ("gpu_idle", "unknown_0x1000")


def test_uuids_from_torch_and_nvml_normalise_alike():
    assert system_card.normalize_uuid(b"GPU-58F6EA4C-1234") == system_card.normalize_uuid("58f6ea4c-1234")


def test_stage_adds_the_job_settings_and_round_trips_through_toml():
    spec = ModelSpec(name="m", source="x:y", inputs=(InputSpec((1, 3, 32, 32)), InputSpec((1, 8), "int64", name="ids")))
    job = Job(spec, "cpu", "cpu", "bf16", ("system_card",), {}, (), (1, 8))
    card = system_card.rpx_system_card(StageContext(job, CpuBackend(), plugins=None, gpu_catalog=None))
    assert (card.precision, card.batch_sizes) == ("bf16", (1, 8))
    assert card.input_shapes == ("float32[1, 3, 32, 32]", "int64[1, 8] (ids)")
    assert card.threads["torch_intra_op"] == torch.get_num_threads()
    summary = card.summary()
    assert summary.startswith(card.host_processor_model_name) and "bf16" in summary
    assert f"torch {torch.__version__}" in summary
    assert converter.structure(tomllib.loads(tomli_w.dumps(to_data(card))), SystemCard) == card


@pytest.mark.cuda
@needs_cuda
def test_gpu_is_described_on_a_cuda_machine():
    card = system_card.machine_card("torch")
    first = card.accelerators[0]
    assert first.name == torch.cuda.get_device_name(0) == card.accelerator_model_name.split(", ")[0]
    major, minor = torch.cuda.get_device_capability(0)
    assert first.compute_capability == f"{major}.{minor}"
    assert card.accelerator_memory_capacity_gb == pytest.approx(torch.cuda.get_device_properties(0).total_memory / 1e9, abs=0.01)
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert any("nvidia-ml-py" in gap for gap in card.gaps)
    else:
        assert card.accelerator_driver_version and first.power_limit_w and first.sm_clock_max_mhz
