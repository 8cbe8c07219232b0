"""The ``mps`` backend: torch on Apple GPUs (Metal Performance Shaders).

MPS has no peak-memory counter, only the current figures, so a region's peaks are sampled on a background thread
and labelled ``sampled=True`` (a spike shorter than the interval can be missed). The sampler stops when the region's
first timed call starts: from then on memory is read at the start and end of each timed call, outside the timed
span, so no thread competes with the calls being timed. Timing is the host clock around ``torch.mps.synchronize()``.

A memory budget is enforced with ``torch.mps.set_per_process_memory_fraction`` (a fraction of the working set Metal
recommends, 0 to 2); lifting it puts back torch's starting cap, ``PYTORCH_MPS_HIGH_WATERMARK_RATIO`` (1.7 when
unset): torch cannot report a fraction the user set in the process, so that one cannot be put back.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import threading
from typing import Any

from rpx_core.plugin import Availability, Backend, MemoryPeak, Timer, UnsupportedError, hookimpl, with_start
from rpx_plugins.host_memory import SAMPLE_INTERVAL_S, MemorySampler, raised_for
from rpx_plugins.torch.backend import TorchBackend
from rpx_plugins.torch.build import torch_build

#: The MPS allocator's out-of-memory message, and Metal refusing one buffer larger than the device allows (a batch
#: too large for a single tensor: the same remedy, a smaller batch).
MPS_OOM_MESSAGES = ("MPS backend out of memory", "Invalid buffer size")
PEAK_METHOD = (
    f"max of torch.mps.current_allocated_memory (peak) and driver_allocated_memory (reserved), sampled every "
    f"{SAMPLE_INTERVAL_S * 1e3:g} ms on a background thread until the region's first timed call, then read at the "
    "start and end of each timed call (never sampled while a call is timed); start: the first sample"
)
#: torch's starting cap for the MPS allocator when PYTORCH_MPS_HIGH_WATERMARK_RATIO is unset.
DEFAULT_HIGH_WATERMARK_RATIO = 1.7
MAX_FRACTION = 2.0  # torch.mps.set_per_process_memory_fraction's range is 0 to 2


def mps_memory() -> tuple[int, int]:
    """(bytes held by live tensors, bytes the Metal driver allocated for this process)."""
    import torch

    return torch.mps.current_allocated_memory(), torch.mps.driver_allocated_memory()


def mps_device_name() -> str | None:
    """E.g. "Apple M2 Max 38-core GPU" (GPU core counts tell apart chips sold with several), from
    ``torch.backends.mps.get_name`` / ``get_core_count``; None on a torch without them (the system card then names
    the GPU after the host's chip)."""
    import torch

    mps = torch.backends.mps
    chip = mps.get_name() if hasattr(mps, "get_name") else None
    if not chip:
        return None
    cores = mps.get_core_count() if hasattr(mps, "get_core_count") else None
    return f"{chip} {cores}-core GPU" if cores else chip


def default_fraction() -> float:
    value = os.environ.get("PYTORCH_MPS_HIGH_WATERMARK_RATIO")
    return float(value) if value else DEFAULT_HIGH_WATERMARK_RATIO


class MpsRegion:
    """The peaks of one measured region: a background sampler until :meth:`pause_sampling`, then point readings."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sampler: MemorySampler | None = MemorySampler(mps_memory)
        self.start: tuple[int, ...] = self._sampler.start
        self._peak = (0, 0)

    def _merge(self, reading: tuple[int, ...]) -> None:
        with self._lock:
            self._peak = (max(self._peak[0], reading[0]), max(self._peak[1], reading[1]))

    def pause_sampling(self) -> None:
        """Stop the background thread (its last sample is kept) or, once stopped, take one reading."""
        sampler, self._sampler = self._sampler, None
        self._merge(sampler.stop() if sampler is not None else mps_memory())

    def observe(self) -> None:
        self._merge(mps_memory())

    def read(self) -> tuple[int, int]:
        self.pause_sampling()
        return self._peak


class MpsTimer(Timer):
    """The host clock around ``torch.mps.synchronize()``, with the region's memory read outside each timed span."""

    def __init__(self, backend: "MpsBackend", device: str) -> None:
        super().__init__(lambda: backend.synchronize(device))
        self._backend = backend

    def start(self) -> None:
        region = self._backend.region
        if region is not None:
            region.pause_sampling()
        super().start()

    def stop(self) -> float:
        elapsed = super().stop()
        region = self._backend.region
        if region is not None:
            region.observe()
        return elapsed


class MpsBackend(TorchBackend):
    name = "mps"
    description = "PyTorch on Apple GPUs (MPS); peak memory is sampled"
    precisions = ("fp32", "fp16", "bf16")

    def __init__(self) -> None:
        self.region: MpsRegion | None = None
        self._budget_set = False

    def probe(self) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed")
        build = torch_build()  # read without importing torch: only macOS builds have MPS
        if build is not None and sys.platform != "darwin":
            return Availability(False, f"torch {build.version} was built without MPS (MPS needs a macOS build)")
        import torch

        if not torch.backends.mps.is_built():
            return Availability(False, f"torch {torch.__version__} was built without MPS (MPS needs a macOS build)")
        if not torch.backends.mps.is_available():
            return Availability(False, "no MPS device (needs macOS 12.3 or later on Apple silicon or an AMD GPU)")
        return Availability(True, f"{mps_device_name() or 'Apple GPU'} through Metal Performance Shaders")

    def default_device(self) -> str:
        return "mps"

    def device_memory_bytes(self, device: str) -> int | None:
        """MPS shares unified memory; the budget is a fraction of the working set Metal recommends for this process
        (torch.mps.recommended_max_memory, torch 2.5+; None before)."""
        import torch

        recommended = getattr(torch.mps, "recommended_max_memory", None)
        return recommended() if recommended is not None else None

    def device_name(self, device: str) -> str | None:
        return mps_device_name()

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

    def timer(self, device: str) -> Timer:
        return MpsTimer(self, device)

    def reset_peak_memory(self, device: str) -> None:
        if self.region is not None:
            self.region.pause_sampling()
        self.region = MpsRegion()

    def read_peak_memory(self, device: str) -> MemoryPeak:
        if self.region is None:
            return MemoryPeak(method="not measured: reset_peak_memory was not called before the region", sampled=True)
        self.synchronize(device)
        allocated, driver = self.region.read()
        peak = MemoryPeak(method=PEAK_METHOD, peak_bytes=allocated, reserved_bytes=driver, sampled=True)
        return with_start(peak, self.region.start[0])

    def is_out_of_memory(self, exc: BaseException) -> bool:
        import torch

        error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch.OutOfMemoryError since 2.5
        return raised_for(exc, (error,), MPS_OOM_MESSAGES)

    def recover_from_oom(self, device: str) -> None:
        import torch

        if self.region is not None:  # the failed trial's region: no thread samples on after it
            self.region.pause_sampling()
        gc.collect()
        torch.mps.empty_cache()

    def release_cached_memory(self, device: str) -> None:
        import torch

        torch.mps.synchronize()
        torch.mps.empty_cache()

    def set_memory_budget(self, device: str, budget_bytes: int | None) -> bool:
        """Cap the MPS allocator at ``budget_bytes`` (at most twice the recommended working set, torch's limit);
        None puts back torch's starting cap. False where torch cannot report the recommended working set."""
        import torch

        whole = self.device_memory_bytes(device)
        if whole is None:
            return False
        if budget_bytes is None:
            if self._budget_set:
                torch.mps.set_per_process_memory_fraction(default_fraction())
                self._budget_set = False
            return True
        torch.mps.set_per_process_memory_fraction(min(MAX_FRACTION, budget_bytes / whole))
        self._budget_set = True
        return True


@hookimpl
def rpx_register_backends() -> list[Backend]:
    return [MpsBackend()]
