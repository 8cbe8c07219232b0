"""The built-in ``system_card`` stage: facts about this machine, collected once per process, plus the job's settings."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

import attrs

from rpx_core.context import StageContext
from rpx_core.hookspecs import hookimpl
from rpx_core.system import SystemCard

FRAMEWORKS = ("torch", "numpy", "jax", "jaxlib", "flax")


def cpu_model_name() -> str:
    """The CPU's marketing name: /proc/cpuinfo on Linux, sysctl on macOS, platform.processor() elsewhere."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    if sys.platform == "darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def framework_versions() -> dict[str, str]:
    versions = {}
    for name in FRAMEWORKS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


@functools.cache
def machine_card() -> SystemCard:
    """The job-independent part, collected once per process."""
    import psutil

    return SystemCard(
        operating_system=platform.platform(),
        python_version=platform.python_version(),
        host_processor_model_name=cpu_model_name(),
        host_processor_architecture=platform.machine(),
        host_processor_core_count=psutil.cpu_count(logical=False),
        host_processor_thread_count=psutil.cpu_count(logical=True),
        host_memory_capacity_gb=round(psutil.virtual_memory().total / 1e9, 2),
        framework_versions=framework_versions(),
    )


def describe_inputs(ctx: StageContext) -> tuple[str, ...]:
    return tuple(f"{i.dtype}{list(i.shape)}" + (f" ({i.name})" if i.name else "") for i in ctx.job.model.inputs)


@hookimpl(trylast=True)
def rpx_system_card(ctx: StageContext) -> SystemCard:
    return attrs.evolve(
        machine_card(),
        precision=ctx.job.precision,
        batch_sizes=ctx.job.batch_sizes,
        input_shapes=describe_inputs(ctx),
    )
