"""The system card: an MLPerf-style description of the machine and run settings attached to every measured result.

Field names follow MLPerf's system description where they overlap (``host_processor_model_name``,
``host_processor_core_count``, ``host_memory_capacity``, ``accelerator_model_name``, ...). Absent facts are omitted, never
guessed.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class SystemCard:
    """The machine a result was measured on, and the settings it was measured with."""

    operating_system: str  # e.g. "Linux-6.1.0-x86_64-with-glibc2.36"
    python_version: str
    host_processor_model_name: str  # the CPU's marketing name, not just the architecture
    host_processor_architecture: str
    host_processor_core_count: int | None = None  # physical cores
    host_processor_thread_count: int | None = None  # logical CPUs
    host_memory_capacity_gb: float | None = None  # total RAM, GB = 1e9 bytes
    framework_versions: dict[str, str] = attrs.Factory(dict)  # distribution -> version (torch, numpy, jax, ...)
    precision: str | None = None
    batch_sizes: tuple[int, ...] = ()
    input_shapes: tuple[str, ...] = ()  # e.g. "float32[1, 3, 224, 224]"

    def summary(self) -> str:
        """One line for table footers."""
        parts = [self.host_processor_model_name]
        if self.host_processor_core_count:
            parts.append(f"{self.host_processor_core_count} cores")
        if self.host_memory_capacity_gb:
            parts.append(f"{self.host_memory_capacity_gb:.0f} GB RAM")
        parts.extend(f"{name} {version}" for name, version in self.framework_versions.items() if name in ("torch", "jax"))
        if self.precision:
            parts.append(self.precision)
        return " | ".join(parts)
