"""The ``cpu`` backend (torch on the host): the default, always available when torch imports."""

from __future__ import annotations

import importlib.util

from rpx_core.plugin import Availability, Backend, MemoryPeak, ModelAdapter, hookimpl
from rpx_plugins.host_memory import HostPeakTracker, is_host_out_of_memory, trim_heap
from rpx_plugins.torch.backend import TorchBackend


class CpuBackend(TorchBackend):
    name = "cpu"
    description = "PyTorch on the host CPU"
    precisions = ("fp32", "bf16", "fp16")

    def __init__(self) -> None:
        self._peak = HostPeakTracker()

    def probe(self) -> Availability:
        # find_spec, not import: the probe must stay cheap for `rpx backends`.
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed")
        return Availability(True, "torch on the host CPU")

    def default_device(self) -> str:
        return "cpu"

    def device_memory_bytes(self, device: str) -> int:
        import psutil

        return psutil.virtual_memory().total

    def reset_peak_memory(self, device: str) -> None:
        """Start a region whose peak RSS ``read_peak_memory`` reports (see rpx_plugins.host_memory)."""
        self._peak.reset()

    def read_peak_memory(self, device: str) -> MemoryPeak:
        return self._peak.read()

    def release_cached_memory(self, device: str) -> None:
        """Give the C heap's free memory back to the OS, so a region's RSS is not what earlier ones left behind."""
        trim_heap()

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return is_host_out_of_memory(exc)


@hookimpl
def rpx_register_backends() -> list[Backend]:
    return [CpuBackend()]


def is_torch_module(model: object) -> bool:
    """A torch.nn.Module; torch is only consulted when already imported, since a module object implies it."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


@hookimpl
def rpx_register_model_adapters() -> list[ModelAdapter]:
    """torch.nn.Module models run as they are on the torch backends (cpu, cuda, mps)."""
    return [ModelAdapter("torch-module", "torch", "torch.nn.Module", is_torch_module, lambda model: model)]
