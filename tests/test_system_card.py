"""The system card on this machine, checked against the OS's own files rather than against the code that reads them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import psutil
import pytest
import tomli_w
import torch

from rpx_core.convert import converter
from rpx_core.registry.backends import Backend
from rpx_core.results.records import to_data
from rpx_core.spec.schema import ModelSpec
from rpx_core.testing import make_context, run_stage
from rpx_core.types.system_card import SystemCard
from rpx_plugins import system_card
from rpx_plugins.torch.cpu import CpuBackend
from tests.fake_gpu import FakeGpu

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


def lscpu_value(key: str) -> int | None:
    """A count lscpu (util-linux) reports, e.g. "Socket(s)"; None where lscpu is missing or does not say."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key and value.strip().isdigit():
            return int(value.strip())
    return None


def test_host_counts_and_memory_match_the_os():
    card = system_card.machine_card("torch")
    assert card.host_processor_thread_count == os.cpu_count()
    sockets, per_socket = lscpu_value("Socket(s)"), lscpu_value("Core(s) per socket")
    if sockets is not None and per_socket is not None:
        # MLPerf's host_processor_core_count is per processor (socket), as lscpu's "Core(s) per socket"
        assert (card.host_processors_per_node, card.host_processor_core_count) == (sockets, per_socket)
        assert f"{per_socket} cores" in card.summary()
    elif card.host_processor_core_count is not None:  # no lscpu: at least consistent with the total psutil counts
        assert card.host_processors_per_node * card.host_processor_core_count == psutil.cpu_count(logical=False)
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
    assert card.cuda_build_version == torch.version.cuda
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


def test_cores_per_processor_is_said_missing_rather_than_guessed():
    assert system_card.cores_per_processor(16, 2) == (8, ())
    for physical, sockets, gap in [(None, 1, "does not report"), (16, None, "socket count is unknown"), (15, 2, "divide")]:
        cores, gaps = system_card.cores_per_processor(physical, sockets)
        assert cores is None and len(gaps) == 1 and gap in gaps[0]


def dtypes_made(backend: object, spec: ModelSpec, precision: str, device: str) -> list[str]:
    """The dtypes of the inputs the backend really creates, by name (positional first), as numpy/torch spell them."""
    args, kwargs = backend.make_inputs(spec, None, precision, device)
    return [str(value.dtype).removeprefix("torch.") for value in (*args, *kwargs.values())]


INPUTS = [{"shape": [1, 3, 32, 32]}, {"shape": [1, 8], "dtype": "int64", "name": "ids"}]


def test_stage_adds_the_job_settings_and_round_trips_through_toml():
    ctx = make_context("x:y", inputs=INPUTS, precision="bf16", stages=["system_card"], batch_sizes=[1, 8])
    card = run_stage("system_card", ctx)
    assert (card.precision, card.batch_sizes) == ("bf16", (1, 8))
    # what runs, not what the spec wrote: the float32 input runs as bfloat16, the token ids stay int64
    floating, ids = dtypes_made(CpuBackend(), ctx.job.model, "bf16", "cpu")
    assert (floating, ids) == ("bfloat16", "int64")
    assert card.input_shapes == (f"{floating}[1, 3, 32, 32]", f"{ids}[1, 8] (ids)")
    assert card.threads["torch_intra_op"] == torch.get_num_threads()
    summary = card.summary()
    assert summary.startswith(card.host_processor_model_name) and "bf16" in summary
    assert f"torch {torch.__version__}" in summary
    assert converter.structure(tomllib.loads(tomli_w.dumps(to_data(card))), SystemCard) == card


def test_inputs_of_a_jax_job_are_described_as_jax_makes_them():
    from rpx_plugins.jax.backend import JaxBackend

    ctx = make_context("x:y", inputs=INPUTS, backend=JaxBackend(), precision="fp16", stages=["system_card"])
    card = run_stage("system_card", ctx)
    floating, ids = dtypes_made(JaxBackend(), ctx.job.model, "fp16", ctx.job.device)  # int64 ids: int32 without x64
    assert card.input_shapes == (f"{floating}[1, 3, 32, 32]", f"{ids}[1, 8] (ids)")


def test_inputs_of_an_unknown_framework_or_a_factory_are_not_guessed():
    class OtherBackend(Backend):
        name, framework = "other", "onnx"

    described = system_card.describe_inputs(make_context("x:y", inputs=INPUTS, backend=OtherBackend(), precision="fp16"))
    assert described == ("float32[1, 3, 32, 32] (dtype as written)", "int64[1, 8] (ids) (dtype as written)")
    made = make_context("x:y", precision="fp16", model_keys={"input_factory": "pkg.inputs:make"})
    described = system_card.describe_inputs(made)
    assert described == ("made by input_factory pkg.inputs:make",)


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


def test_cuda_version_is_the_drivers_and_the_build_is_separate(monkeypatch):
    """On the fake GPU (tests/fake_gpu.py) torch reports a CUDA 12.4 build; the driver is another matter: with no
    driver library here its version is a gap, never torch's build version."""
    FakeGpu("cuda").install(monkeypatch)
    monkeypatch.setattr(system_card, "libcuda_driver_version", lambda: None)
    found = system_card.torch_accelerators()
    assert (found.cuda_build_version, found.cuda_version) == ("12.4", None)
    assert any(gap.startswith("CUDA driver version") for gap in found.gaps)
    assert found.cards[0].name == "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(system_card, "libcuda_driver_version", lambda: 12080)
    assert system_card.torch_accelerators().cuda_version == "12.8"


def test_nvml_gives_the_drivers_cuda_version(monkeypatch):
    class NVMLError(Exception):
        pass

    fake_nvml = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 0,
        nvmlSystemGetDriverVersion=lambda: b"570.86.15", nvmlSystemGetCudaDriverVersion_v2=lambda: 12080,
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)  # NVML cannot exist without an NVIDIA driver
    found = system_card.with_nvml(system_card.Accelerators(probed=True, cuda_build_version="12.4",
                                                          gaps=("CUDA driver version: not loaded",)))
    assert (found.driver_version, found.cuda_version, found.cuda_build_version) == ("570.86.15", "12.8", "12.4")
    assert found.gaps == ()
    assert system_card.format_cuda_version(12040) == "12.4" and system_card.format_cuda_version(11080) == "11.8"
