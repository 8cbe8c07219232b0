"""The ``mps`` backend: torch on Apple GPUs (Metal Performance Shaders).

MPS has no peak-memory counter, only the current figures, so peaks are sampled on a background thread and labelled
``sampled=True`` (a spike shorter than the interval can be missed). Timing is the host clock around
``torch.mps.synchronize()``.
"""

from __future__ import annotations

import gc
import importlib.util
from typing import Any

from rpx_core.backends import Availability, Backend, MemoryPeak
from rpx_core.errors import UnsupportedError
from rpx_core.hookspecs import hookimpl
from rpx_plugins.host_memory import SAMPLE_INTERVAL_S, MemorySampler, raised_for
from rpx_plugins.torch.backend import TorchBackend

MPS_OOM_MESSAGES = ("MPS backend out of memory",)
PEAK_METHOD = (
    f"max of torch.mps.current_allocated_memory (peak) and driver_allocated_memory (reserved) sampled every "
    f"{SAMPLE_INTERVAL_S * 1e3:g} ms on a background thread"
)


def mps_memory() -> tuple[int, int]:
    """(bytes held by live tensors, bytes the Metal driver allocated for this process)."""
    import torch

    return torch.mps.current_allocated_memory(), torch.mps.driver_allocated_memory()


class MpsBackend(TorchBackend):
    name = "mps"
    description = "PyTorch on Apple GPUs (MPS); peak memory is sampled"
    precisions = ("fp32", "fp16", "bf16")

    def __init__(self) -> None:
        self._sampler: MemorySampler | None = None

    def probe(self) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed")
        import torch

        if not torch.backends.mps.is_built():
            return Availability(False, f"torch {torch.__version__} was built without MPS (MPS needs a macOS build)")
        if not torch.backends.mps.is_available():
            return Availability(False, "no MPS device (needs macOS 12.3 or later on Apple silicon or an AMD GPU)")
        return Availability(True, "Apple GPU through Metal Performance Shaders")

    def default_device(self) -> str:
        return "mps"

    def device_memory_bytes(self, device: str) -> int:
        """MPS shares unified memory; the budget is a fraction of the working set Metal recommends for this process."""
        import torch

        return torch.mps.recommended_max_memory()

    def place_model(self, model: Any, precision: str, device: str) -> Any:
        if precision == "bf16":
            self.check_bf16(device)
        return super().place_model(model, precision, device)

    def check_bf16(self, device: str) -> None:
        """bf16 needs macOS 14 or later; older systems reject the dtype on the device."""
        import torch

        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError) as exc:
            raise UnsupportedError(f"bf16 is not supported by MPS on this system: {exc}") from None

    def synchronize(self, device: str) -> None:
        import torch

        torch.mps.synchronize()

    def reset_peak_memory(self, device: str) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        self._sampler = MemorySampler(mps_memory)

    def read_peak_memory(self, device: str) -> MemoryPeak:
        if self._sampler is None:
            return MemoryPeak(method="not measured: reset_peak_memory was not called before the region", sampled=True)
        self.synchronize(device)
        allocated, driver = self._sampler.stop()
        return MemoryPeak(method=PEAK_METHOD, peak_bytes=allocated, reserved_bytes=driver, sampled=True)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        import torch

        return raised_for(exc, (torch.cuda.OutOfMemoryError,), MPS_OOM_MESSAGES)  # torch.OutOfMemoryError since 2.5

    def recover_from_oom(self, device: str) -> None:
        import torch

        gc.collect()
        torch.mps.empty_cache()


@hookimpl
def rpx_register_backends() -> list[Backend]:
    return [MpsBackend()]
