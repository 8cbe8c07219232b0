"""The system card: an MLPerf-style description of the machine and run settings attached to every measured result.

Field names follow MLPerf's system description where they overlap (``host_processor_model_name``,
``host_processor_core_count``, ``host_memory_capacity``, ``accelerator_model_name``, ``accelerators_per_node``,
``accelerator_memory_capacity``, ``host_processor_frequency``, ...), with the unit appended. Absent facts are omitted,
never guessed; what could not be collected is listed in ``gaps``. GB = 1e9 bytes, MHz = 1e6 Hz, W = watts.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class AcceleratorCard:
    """One accelerator as the runtime and (for NVIDIA GPUs, when nvidia-ml-py is installed) NVML describe it.

    Clocks, power limit and clock-event reasons are read once when the card is collected, not during the run.
    """

    kind: str  # "cuda" or "mps"
    index: int  # the runtime's device index (cuda:<index>)
    name: str  # e.g. "NVIDIA H200"
    memory_capacity_gb: float | None = None  # device memory; MPS: the recommended maximum working set (unified memory)
    compute_capability: str | None = None  # CUDA "major.minor", e.g. "9.0"
    multiprocessor_count: int | None = None  # streaming multiprocessors (CUDA)
    uuid: str | None = None
    sm_clock_max_mhz: int | None = None  # NVML maximum SM clock
    sm_clock_mhz: int | None = None  # NVML SM clock when collected
    memory_clock_max_mhz: int | None = None  # NVML maximum memory clock
    power_limit_w: float | None = None  # NVML enforced power limit
    clock_event_reasons: tuple[str, ...] | None = None  # NVML reasons clocks were held back when collected; () = none


@attrs.frozen
class SystemCard:
    """The machine a result was measured on, and the settings it was measured with."""

    operating_system: str  # e.g. "Linux-6.1.0-x86_64-with-glibc2.36"
    python_version: str
    host_processor_model_name: str  # the CPU's marketing name, not just the architecture
    host_processor_architecture: str
    host_processors_per_node: int | None = None  # CPU sockets (physical packages)
    #: Physical cores per processor (socket), as MLPerf's field of that name: all sockets' cores are
    #: host_processors_per_node x this. None (with a gap) where the socket count is unknown.
    host_processor_core_count: int | None = None
    host_processor_thread_count: int | None = None  # logical CPUs, all sockets
    host_processor_frequency_mhz: float | None = None  # nominal maximum (psutil.cpu_freq().max) when the OS reports it
    host_processor_frequency_current_mhz: float | None = None  # when collected
    host_processor_governor: str | None = None  # cpufreq scaling governor of cpu0 (Linux), e.g. "performance"
    host_memory_capacity_gb: float | None = None  # total RAM
    framework_versions: dict[str, str] = attrs.Factory(dict)  # distribution -> version (torch, numpy, jax, ...)
    #: The newest CUDA the installed NVIDIA driver supports (NVML, else the driver's cuDriverGetVersion), e.g. "12.4";
    #: it must be at least ``cuda_build_version`` (or in its minor-version compatible range) for torch to run.
    cuda_version: str | None = None
    cuda_build_version: str | None = None  # the CUDA torch was built with (torch.version.cuda)
    cudnn_version: str | None = None  # as torch.backends.cudnn.version() reports it, e.g. "90100" for 9.1.0
    accelerator_driver_version: str | None = None  # NVIDIA driver (NVML)
    accelerator_model_name: str | None = None  # distinct accelerator names, joined with ", "
    accelerators_per_node: int | None = None  # number of accelerators; None when not probed (framework not loaded)
    accelerator_memory_capacity_gb: float | None = None  # of the first accelerator
    accelerators: tuple[AcceleratorCard, ...] = ()
    jax_devices: tuple[str, ...] = ()  # "platform:id device_kind" of every JAX device, when JAX is in use
    threads: dict[str, int] = attrs.Factory(dict)  # runtime thread settings, e.g. torch intra-op / inter-op
    thread_environment: dict[str, str] = attrs.Factory(dict)  # OMP_NUM_THREADS and friends, when set
    gaps: tuple[str, ...] = ()  # facts that could not be collected, and why
    precision: str | None = None
    batch_sizes: tuple[int, ...] = ()
    #: Each input as it runs: the dtype it is created with at ``precision`` (a float32 input of an fp16 job runs as
    #: float16) and its shape as written, e.g. "float16[1, 3, 224, 224]".
    input_shapes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for table footers."""
        parts = [self.host_processor_model_name]
        cores, sockets = self.host_processor_core_count, self.host_processors_per_node
        if cores:
            parts.append(f"{sockets}x {cores} cores" if sockets and sockets > 1 else f"{cores} cores")
        if self.host_memory_capacity_gb:
            parts.append(f"{self.host_memory_capacity_gb:.0f} GB RAM")
        if self.accelerators_per_node and self.accelerator_model_name:
            memory = f" {self.accelerator_memory_capacity_gb:.0f} GB" if self.accelerator_memory_capacity_gb else ""
            parts.append(f"{self.accelerators_per_node}x {self.accelerator_model_name}{memory}")
        if self.accelerator_driver_version:
            parts.append(f"driver {self.accelerator_driver_version}")
        parts.extend(f"{name} {version}" for name, version in self.framework_versions.items() if name in ("torch", "jax"))
        if self.cuda_version or self.cuda_build_version:
            built = f" (torch built with {self.cuda_build_version})" if self.cuda_build_version else ""
            parts.append(f"CUDA {self.cuda_version or 'driver unknown'}{built}")
        if self.precision:
            parts.append(self.precision)
        if "torch_intra_op" in self.threads:
            parts.append(f"{self.threads['torch_intra_op']} threads")
        return " | ".join(parts)
