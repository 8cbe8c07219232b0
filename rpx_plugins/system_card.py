"""The built-in ``system_card`` stage: facts about this machine, collected once per process, plus the job's settings.

Runtimes are consulted only when the job uses them or they are already loaded: importing torch costs seconds, and
initialising JAX on a GPU would reserve most of its memory before anything is measured. NVML (``pip install
nvidia-ml-py``, imported as ``pynvml``) is optional; without it the driver version, clocks and power limits are
omitted and the card's ``gaps`` says so.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs

from rpx_core.plugin import StageContext, hookimpl
from rpx_core.types.system_card import AcceleratorCard, SystemCard

FRAMEWORKS = ("torch", "numpy", "jax", "jaxlib", "flax")
THREAD_ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
SYSFS_CPUS = Path("/sys/devices/system/cpu")
GOVERNOR = SYSFS_CPUS / "cpu0/cpufreq/scaling_governor"
CPUINFO = Path("/proc/cpuinfo")
#: NVML clock event ("throttle") reason bits, as nvml.h defines nvmlClocksEventReason* / nvmlClocksThrottleReason*.
NVML_CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


# -- host ----------------------------------------------------------------------------------------------------------------


def cpuinfo_values(*keys: str) -> list[str]:
    """Values of the given keys in /proc/cpuinfo, one per matching line (empty where the file does not exist)."""
    if not CPUINFO.exists():
        return []
    values = []
    for line in CPUINFO.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys and value.strip():
            values.append(value.strip())
    return values


def sysctl(name: str) -> str | None:
    """A macOS sysctl value; None elsewhere or where it cannot be read."""
    if sys.platform != "darwin":
        return None
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model_name() -> str:
    """The CPU's marketing name: /proc/cpuinfo on Linux, sysctl on macOS, platform.processor() elsewhere."""
    names = cpuinfo_values("model name", "Model", "Hardware")
    if names:
        return names[0]
    return sysctl("machdep.cpu.brand_string") or platform.processor() or platform.machine()


def cpu_sockets() -> int | None:
    """CPU sockets (physical packages): distinct "physical id" in /proc/cpuinfo, else distinct physical_package_id in
    sysfs (Linux on ARM has no "physical id"), else sysctl hw.packages (macOS); None where none says."""
    ids = set(cpuinfo_values("physical id"))
    if not ids:
        for topology in SYSFS_CPUS.glob("cpu[0-9]*/topology/physical_package_id"):
            try:
                ids.add(topology.read_text().strip())
            except OSError:
                continue
    if ids:
        return len(ids)
    packages = sysctl("hw.packages")
    return int(packages) if packages and packages.isdigit() else None


def cores_per_processor(physical_cores: int | None, sockets: int | None) -> tuple[int | None, tuple[str, ...]]:
    """MLPerf's host_processor_core_count: physical cores per socket (all sockets of a node hold the same CPU), with
    the gap that explains a missing figure."""
    if physical_cores is None:
        return None, ("CPU cores per processor: the OS does not report physical cores",)
    if sockets is None:
        return None, (f"CPU cores per processor: {physical_cores} physical cores, but the socket count is unknown",)
    if physical_cores % sockets:
        return None, (f"CPU cores per processor: {physical_cores} physical cores do not divide among {sockets} sockets",)
    return physical_cores // sockets, ()


def cpu_governor() -> str | None:
    try:
        return GOVERNOR.read_text().strip() or None
    except OSError:
        return None


def cpu_frequency_mhz() -> tuple[float | None, float | None]:
    """(nominal maximum, current) in MHz from psutil; a value the OS reports as 0 is unknown, not zero."""
    import psutil

    try:
        frequency = psutil.cpu_freq()
    except (OSError, NotImplementedError):  # some VMs and containers expose no cpufreq at all
        return None, None
    if frequency is None:
        return None, None
    return (frequency.max or None), (round(frequency.current, 1) or None)


def framework_versions() -> dict[str, str]:
    versions = {}
    for name in FRAMEWORKS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def thread_environment() -> dict[str, str]:
    return {name: os.environ[name] for name in THREAD_ENVIRONMENT if name in os.environ}


def uses(runtime: str, framework: str | None) -> bool:
    """Whether the card may consult ``runtime``: the job's framework, or already imported by someone else."""
    return framework == runtime or runtime in sys.modules


# -- accelerators --------------------------------------------------------------------------------------------------------


@attrs.frozen
class Accelerators:
    cards: tuple[AcceleratorCard, ...] = ()
    probed: bool = False  # False when no runtime or NVML was asked, so "no accelerator" is unknown rather than known
    cuda_version: str | None = None  # the newest CUDA the installed driver supports
    cuda_build_version: str | None = None  # the CUDA torch was built with
    cudnn_version: str | None = None
    driver_version: str | None = None
    gaps: tuple[str, ...] = ()


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """NVML's clock event bitmask as names; unknown bits are kept as hex so nothing is silently dropped."""
    names = [name for bit, name in NVML_CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(NVML_CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return tuple(names)


def normalize_uuid(uuid: Any) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.lower().removeprefix("gpu-")


def format_cuda_version(version: int) -> str:
    """CUDA's integer version (1000 x major + 10 x minor, e.g. 12040) as "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def libcuda_driver_version() -> int | None:
    """``cuDriverGetVersion`` from the NVIDIA driver's own library (no NVML, no CUDA context needed); None where the
    library is not installed."""
    import ctypes
    import ctypes.util

    for name in ("libcuda.so.1", "libcuda.dylib", "nvcuda.dll", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int()
        if library.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value
    return None


def torch_accelerators() -> Accelerators:
    """CUDA devices (with the CUDA torch was built with and the CUDA the driver supports) and the MPS device, as torch
    sees them."""
    import torch

    cards = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            uuid = getattr(props, "uuid", None)
            cards.append(
                AcceleratorCard(
                    kind="cuda",
                    index=index,
                    name=props.name,
                    memory_capacity_gb=round(props.total_memory / 1e9, 2),
                    compute_capability=f"{props.major}.{props.minor}",
                    multiprocessor_count=props.multi_processor_count,
                    uuid=normalize_uuid(uuid) if uuid is not None else None,
                )
            )
    if torch.backends.mps.is_available():
        from rpx_plugins.torch.mps import MpsBackend, mps_device_name

        memory = MpsBackend().device_memory_bytes("mps")
        cards.append(AcceleratorCard(
            kind="mps", index=0, name=mps_device_name() or f"{cpu_model_name()} GPU",
            memory_capacity_gb=round(memory / 1e9, 2) if memory is not None else None,
        ))  # fmt: skip
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gaps = ()
    driver_cuda = None
    if torch.version.cuda is not None:
        found = libcuda_driver_version()
        driver_cuda = format_cuda_version(found) if found is not None else None
        if driver_cuda is None:
            gaps = ("CUDA driver version: the NVIDIA driver library (libcuda) could not be loaded",)
    return Accelerators(
        tuple(cards), True, driver_cuda, torch.version.cuda, str(cudnn) if cudnn else None, gaps=gaps
    )


def nvml_device(pynvml: Any, handle: Any) -> dict[str, Any]:
    """AcceleratorCard fields NVML knows for one device; a query the device refuses leaves its field out."""

    def query(function: str, *args: Any) -> Any:
        try:
            return getattr(pynvml, function)(handle, *args)
        except (pynvml.NVMLError, AttributeError):
            return None

    fields: dict[str, Any] = {
        "uuid": query("nvmlDeviceGetUUID"),
        "name": query("nvmlDeviceGetName"),
        "sm_clock_max_mhz": query("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
        "sm_clock_mhz": query("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
        "memory_clock_max_mhz": query("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM),
    }
    memory = query("nvmlDeviceGetMemoryInfo")
    capability = query("nvmlDeviceGetCudaComputeCapability")
    power_mw = query("nvmlDeviceGetEnforcedPowerLimit")
    reasons = query("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:  # nvidia-ml-py before 12.535 only has the older name
        reasons = query("nvmlDeviceGetCurrentClocksThrottleReasons")
    fields.update(
        memory_capacity_gb=round(memory.total / 1e9, 2) if memory is not None else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability is not None else None,
        power_limit_w=power_mw / 1000 if power_mw is not None else None,
        clock_event_reasons=decode_clock_event_reasons(reasons) if reasons is not None else None,
    )
    if isinstance(fields["name"], bytes):
        fields["name"] = fields["name"].decode()
    if fields["uuid"] is not None:
        fields["uuid"] = normalize_uuid(fields["uuid"])
    return {key: value for key, value in fields.items() if value is not None}


def nvml_devices() -> tuple[str | None, str | None, list[dict[str, Any]], str | None]:
    """(driver version, the CUDA version the driver supports, per-device fields in NVML order, why NVML could not be
    read or None)."""
    try:
        import pynvml
    except ImportError:
        return None, None, [], "nvidia-ml-py is not installed (pip install nvidia-ml-py): driver version, clocks and power limits omitted"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, None, [], f"NVML could not start: {exc}"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        devices = [nvml_device(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
        cuda = getattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", None) or pynvml.nvmlSystemGetCudaDriverVersion
        try:
            driver_cuda = format_cuda_version(cuda())
        except pynvml.NVMLError:
            driver_cuda = None
    finally:
        pynvml.nvmlShutdown()
    return (driver.decode() if isinstance(driver, bytes) else driver), driver_cuda, devices, None


def with_nvml(found: Accelerators) -> Accelerators:
    """Add NVML's driver version, clocks and power limits, matching devices by UUID (CUDA and NVML order may differ)."""
    driver, driver_cuda, devices, problem = nvml_devices()
    if problem is not None:
        needed = any(card.kind == "cuda" for card in found.cards)
        return attrs.evolve(found, gaps=(*found.gaps, problem)) if needed else found
    if driver_cuda is not None:  # NVML's answer wins; the libcuda gap, if any, no longer applies
        gaps = tuple(gap for gap in found.gaps if not gap.startswith("CUDA driver version"))
        found = attrs.evolve(found, cuda_version=driver_cuda, gaps=gaps)
    by_uuid = {device.get("uuid"): device for device in devices}
    if not found.probed:  # no CUDA runtime asked: NVML's own list, in NVML's order
        cards = tuple(AcceleratorCard(kind="cuda", index=i, **fields) for i, fields in enumerate(devices) if "name" in fields)
        return attrs.evolve(found, cards=cards, probed=True, driver_version=driver)
    extra = ("sm_clock_max_mhz", "sm_clock_mhz", "memory_clock_max_mhz", "power_limit_w", "clock_event_reasons")
    cards = []
    for card in found.cards:
        nvml = by_uuid.get(card.uuid, {}) if card.kind == "cuda" else {}
        cards.append(attrs.evolve(card, **{key: nvml[key] for key in extra if key in nvml}))
    return attrs.evolve(found, cards=tuple(cards), driver_version=driver)


def accelerators(framework: str | None) -> Accelerators:
    found = with_nvml(torch_accelerators() if uses("torch", framework) else Accelerators())
    if not found.probed:
        reason = "accelerators: not probed (torch is neither the job's framework nor loaded, and NVML is unavailable)"
        return attrs.evolve(found, gaps=(*found.gaps, reason))
    return found


def jax_devices(framework: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """("platform:id device_kind" per JAX device, gaps); JAX only when the job uses it or it is already loaded."""
    if not uses("jax", framework):
        return (), ()
    try:
        import jax

        return tuple(f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()), ()
    except Exception as exc:  # a broken JAX install must not lose the rest of the card
        return (), (f"JAX devices could not be listed: {type(exc).__name__}: {exc}",)


# -- the card ------------------------------------------------------------------------------------------------------------


def host_gaps(governor: str | None, max_mhz: float | None) -> tuple[str, ...]:
    gaps = []
    if governor is None:
        gaps.append("CPU frequency governor: not exposed by this OS or VM (no cpufreq scaling_governor)")
    if max_mhz is None:
        gaps.append("CPU maximum frequency: not reported by the OS")
    return tuple(gaps)


@functools.cache
def machine_card(framework: str | None = None) -> SystemCard:
    """The job-independent part, collected once per process (per framework asked for)."""
    import psutil

    governor = cpu_governor()
    max_mhz, current_mhz = cpu_frequency_mhz()
    sockets = cpu_sockets()
    cores, core_gaps = cores_per_processor(psutil.cpu_count(logical=False), sockets)
    found = accelerators(framework)
    jax_listed, jax_gaps = jax_devices(framework)
    return SystemCard(
        operating_system=platform.platform(),
        python_version=platform.python_version(),
        host_processor_model_name=cpu_model_name(),
        host_processor_architecture=platform.machine(),
        host_processors_per_node=sockets,
        host_processor_core_count=cores,
        host_processor_thread_count=psutil.cpu_count(logical=True),
        host_processor_frequency_mhz=max_mhz,
        host_processor_frequency_current_mhz=current_mhz,
        host_processor_governor=governor,
        host_memory_capacity_gb=round(psutil.virtual_memory().total / 1e9, 2),
        framework_versions=framework_versions(),
        cuda_version=found.cuda_version,
        cuda_build_version=found.cuda_build_version,
        cudnn_version=found.cudnn_version,
        accelerator_driver_version=found.driver_version,
        accelerator_model_name=", ".join(dict.fromkeys(card.name for card in found.cards)) or None,
        accelerators_per_node=len(found.cards) if found.probed else None,
        accelerator_memory_capacity_gb=found.cards[0].memory_capacity_gb if found.cards else None,
        accelerators=found.cards,
        jax_devices=jax_listed,
        gaps=host_gaps(governor, max_mhz) + core_gaps + found.gaps + jax_gaps,
    )


def describe_inputs(ctx: StageContext) -> tuple[str, ...]:
    """Each input as it runs, e.g. "float16[1, 3, 224, 224]" for a float32 input of an fp16 job; "(dtype as written)"
    where the backend's framework is not one whose rule rpx knows."""
    model, precision = ctx.job.model, ctx.job.precision
    if model.input_factory:
        return (f"made by input_factory {model.input_factory}",)
    described = []
    for spec_input in model.inputs:
        dtype = ctx.backend.input_dtype_name(spec_input, precision)
        text = f"{dtype or spec_input.dtype}{list(spec_input.shape)}"
        text += f" ({spec_input.name})" if spec_input.name else ""
        described.append(text + (" (dtype as written)" if dtype is None else ""))
    return tuple(described)


@hookimpl(trylast=True)
def rpx_system_card(ctx: StageContext) -> SystemCard:
    return attrs.evolve(
        machine_card(ctx.backend.framework),
        threads=ctx.backend.thread_settings(),
        thread_environment=thread_environment(),
        precision=ctx.job.precision,
        batch_sizes=ctx.job.batch_sizes,
        input_shapes=describe_inputs(ctx),
    )
