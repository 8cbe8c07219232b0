"""The ``cuda`` backend: torch on NVIDIA GPUs, timed with CUDA events, peak memory from the caching allocator.

Precisions: fp32 (IEEE matmuls and convolutions: TF32 is switched off), tf32 (fp32 storage, TF32 tensor-core matmuls,
convolutions and RNNs), fp16, bf16. torch's TF32 switches are process-wide, so rpx sets them only while it runs the
model (``inference_context``, entered around timed calls) and puts back what it found on exit: a user's own later
work runs with the user's settings. Tier 1 counting runs no kernels and needs no switch.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import threading
from typing import Any, Callable, Iterator

import attrs

from rpx_core.plugin import (
    Availability,
    Backend,
    BackendUnavailable,
    MemoryPeak,
    Timer,
    UnsupportedError,
    hookimpl,
    with_start,
)
from rpx_plugins.host_memory import raised_for
from rpx_plugins.torch.backend import TorchBackend
from rpx_plugins.torch.build import torch_build

#: Messages of CUDA out-of-memory errors that reach us as plain RuntimeErrors: the runtime's own, and the CUDA
#: libraries' failures to allocate their handles and workspaces (cuBLAS, cuDNN, cuFFT, cuSOLVER, cuSPARSE status
#: names as torch's error messages quote them).
CUDA_OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
)
PEAK_METHOD = (
    "torch.cuda.max_memory_allocated / max_memory_reserved after reset_peak_memory_stats; outside the allocator: "
    "mem_get_info (total - free) - memory_reserved when read (CUDA context, library workspaces, other processes); "
    "start: torch.cuda.memory_allocated at the reset"
)


def device_index(device: str) -> int | None:
    """The index in "cuda:<index>"; None for plain "cuda" (torch's current device)."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise UnsupportedError(f"the cuda backend runs on 'cuda' or 'cuda:<index>' devices, got {device!r}")
    return int(index) if index else None


def resolved_index(device: str) -> int:
    """The device's index, torch's current device for plain "cuda": some torch calls
    (set_per_process_memory_fraction) refuse a device without one."""
    import torch

    index = device_index(device)
    return torch.cuda.current_device() if index is None else index


def memory_fraction(index: int) -> float:
    """The process's current allocator cap as a fraction of the device. torch before get_per_process_memory_fraction
    cannot say; a process starts uncapped (1.0), so that is what is assumed there."""
    import torch

    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return float(getter(index)) if getter is not None else 1.0


def budget_fraction(budget_bytes: int, total_bytes: int) -> float:
    """The share of the device that ``budget_bytes`` is, for torch.cuda.set_per_process_memory_fraction; a budget
    above the device's capacity is no limit beyond the device itself (1.0)."""
    if budget_bytes <= 0:
        raise ValueError(f"a memory budget must be > 0 bytes, got {budget_bytes}")
    return min(1.0, budget_bytes / total_bytes)


#: torch 2.9+ per-operation fp32 settings under ``torch.backends`` ("ieee", "tf32", "none": inherit from the level
#: above) that rpx writes, directly or through the legacy setters, parents first: writing a parent sets its
#: children, so they are put back after it ("" is torch.backends itself).
FP32_PRECISION_PATHS = ("", "cudnn", "mkldnn", "cuda.matmul", "mkldnn.matmul", "cudnn.conv", "cudnn.rnn")
MATMUL_PRECISIONS = ("highest", "high", "medium")


@attrs.frozen
class Tf32Settings:
    """torch's TF32 switches as rpx found them; None where torch refused to report one (torch 2.9+ refuses a legacy
    setting that disagrees with a setting made through its new API)."""

    matmul_precision: str | None  # torch.get_float32_matmul_precision(): "highest" (no TF32), "high" or "medium"
    cublas_allow_tf32: bool | None  # torch.backends.cuda.matmul.allow_tf32
    cudnn_allow_tf32: bool | None  # torch.backends.cudnn.allow_tf32
    fp32_precision: tuple[str, ...]  # torch 2.9+: the values at FP32_PRECISION_PATHS; () for older torch


def _fp32_precision_node(path: str) -> Any:
    import torch

    node = torch.backends
    for part in filter(None, path.split(".")):
        node = getattr(node, part)
    return node


def _has_fp32_precision_api() -> bool:
    import torch

    return hasattr(torch.backends.cudnn, "conv")  # torch 2.9+


def _reported(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except RuntimeError:  # torch 2.9+: "you have used mix of the legacy and new APIs"
        return None


def read_tf32_settings() -> Tf32Settings:
    import torch

    new_api = _has_fp32_precision_api()
    return Tf32Settings(
        matmul_precision=_reported(torch.get_float32_matmul_precision),
        cublas_allow_tf32=_reported(lambda: torch.backends.cuda.matmul.allow_tf32),
        cudnn_allow_tf32=_reported(lambda: torch.backends.cudnn.allow_tf32),
        fp32_precision=tuple(_fp32_precision_node(p).fp32_precision for p in FP32_PRECISION_PATHS) if new_api else (),
    )


def write_tf32(enabled: bool) -> None:
    """Allow TF32 tensor-core math for fp32 matmuls, cuDNN convolutions and RNNs, or forbid it (IEEE fp32). Legacy and
    new settings are written so that they agree: torch 2.9+ checks that they do before every cuBLAS matmul."""
    import torch

    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
    if _has_fp32_precision_api():  # the legacy cuDNN setter leaves "none" (inherit) when forbidding: be explicit
        for path in ("cudnn.conv", "cudnn.rnn"):
            _fp32_precision_node(path).fp32_precision = "tf32" if enabled else "ieee"


def restore_tf32_settings(saved: Tf32Settings) -> None:
    """Put back what :func:`read_tf32_settings` read, refusals included.

    torch 2.9+ keeps the legacy values (matmul precision, cuDNN flag) beside the per-operation ones and refuses to
    report a legacy value that disagrees with them, so a user who set the new API (e.g. only
    ``torch.backends.mkldnn.matmul.fp32_precision``) leaves a legacy value rpx cannot read. Writing the wrong one
    back would turn a setting torch reported into one it refuses. So each legacy value torch refused is found by
    trying the possible ones until every reading (refusals included) is what it was."""
    import torch

    precisions = MATMUL_PRECISIONS if saved.matmul_precision is None else (saved.matmul_precision,)
    cudnn_flags = (False, True) if saved.cudnn_allow_tf32 is None else (saved.cudnn_allow_tf32,)
    for precision in precisions:
        for cudnn in cudnn_flags:
            torch.set_float32_matmul_precision(precision)
            torch.backends.cudnn.allow_tf32 = cudnn
            for path, value in zip(FP32_PRECISION_PATHS, saved.fp32_precision):  # the legacy setters overwrite these
                node = _fp32_precision_node(path)
                if node.fp32_precision != value:
                    node.fp32_precision = value
            if read_tf32_settings() == saved:
                return


class Tf32Switches:
    """Sets torch's TF32 switches while at least one caller is inside :meth:`set`, and puts back what the first caller
    to enter found when the last one leaves: batch_search runs concurrent stages in one thread each, all inside."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._saved: Tf32Settings | None = None

    @contextlib.contextmanager
    def set(self, enabled: bool) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._saved = read_tf32_settings()
            self._inside += 1
            write_tf32(enabled)
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    restore_tf32_settings(self._saved)


#: One for the process, as the switches are.
TF32_SWITCHES = Tf32Switches()


def nvml_other_processes(uuid: str | None, index: int) -> tuple[str, ...] | None:
    """Processes other than this one with a compute context on the GPU (by UUID, else NVML's index), as "pid name";
    None when NVML is missing or refuses. In a container NVML reports the host's process ids, where this process's
    own id is not found: one of them is then this process, so all but one are listed (which one was this process
    cannot be told from here)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = (pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid is not None
                  else pynvml.nvmlDeviceGetHandleByIndex(index))
        pids = [process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    own = os.getpid()
    others = [pid for pid in pids if pid != own] if own in pids else sorted(pids)[1:]
    return tuple(f"{pid} {process_name(pid)}" for pid in others)


def process_name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return "(not visible from here)"


def describe_devices(names: list[str]) -> str:
    """E.g. "2 devices: NVIDIA H200" or "2 devices: NVIDIA H200, NVIDIA A100 80GB PCIe"."""
    distinct = ", ".join(dict.fromkeys(names))
    return f"{len(names)} device{'s' if len(names) != 1 else ''}: {distinct}"


class CudaEventTimer(Timer):
    """Elapsed time between two CUDA events recorded on the calling thread's current stream (GPU clock, ~0.5 us
    resolution).

    ``start`` first synchronises that stream so its earlier work is not counted; ``stop`` waits for the end event.
    Only the timer's own stream is waited for: concurrent batch_search stages time their own streams, and a
    device-wide synchronize from one stage would stall the others.
    """

    clock = "cuda events (torch.cuda.Event, enable_timing=True) on the calling thread's stream, that stream synchronised"

    def __init__(self, device: str) -> None:
        import torch

        self._stream = torch.cuda.current_stream(device)
        super().__init__(self._stream.synchronize)
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._synchronize()
        self._begin.record(self._stream)

    def stop(self) -> float:
        self._end.record(self._stream)
        self._end.synchronize()
        return self._begin.elapsed_time(self._end) / 1e3  # elapsed_time is in milliseconds


class CudaBackend(TorchBackend):
    name = "cuda"
    description = "PyTorch on NVIDIA GPUs (CUDA events for timing, caching-allocator peaks)"
    precisions = ("fp32", "tf32", "fp16", "bf16")

    def __init__(self) -> None:
        #: Whether the precision of the last model placed computes fp32 in TF32; None until a model is placed. One
        #: value, not one per device: the switches are process-wide, and a run has one precision.
        self._tf32: bool | None = None
        #: The allocator cap each device had before rpx set a budget on it, put back when the budget is lifted.
        self._fractions_before: dict[int, float] = {}
        #: Allocated bytes when each device's current region started (reset_peak_memory).
        self._region_start: dict[str, int] = {}

    def probe(self) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed")
        build = torch_build()  # read without importing torch: a build without CUDA needs no import to say so
        if build is not None and build.cuda is None:
            return Availability(False, f"CUDA build not installed (torch {build.version} was built without CUDA)")
        import torch

        if torch.version.cuda is None:
            return Availability(False, f"CUDA build not installed (torch {torch.__version__} was built without CUDA)")
        if not torch.cuda.is_available():
            return Availability(False, f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})")
        names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        return Availability(True, describe_devices(names))

    def default_device(self) -> str:
        return "cuda:0"

    def place_model(self, model: Any, precision: str, device: str) -> Any:
        self.check_device(device)
        placed = super().place_model(model, precision, device)
        self._tf32 = precision == "tf32"
        return placed

    @contextlib.contextmanager
    def inference_context(self) -> Iterator[None]:
        """Inference mode, with the TF32 switches of the last placed model's precision set on entry and put back on
        exit (left alone when no model was placed)."""
        switches = contextlib.nullcontext() if self._tf32 is None else TF32_SWITCHES.set(self._tf32)
        with switches, super().inference_context():
            yield

    def check_device(self, device: str) -> None:
        import torch

        index = device_index(device)
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            found = describe_devices([torch.cuda.get_device_name(i) for i in range(count)])
            raise BackendUnavailable(f"backend 'cuda': device {device!r} does not exist: this machine has {found}")

    def device_memory_bytes(self, device: str) -> int:
        import torch

        return torch.cuda.get_device_properties(torch.device(device)).total_memory

    def device_name(self, device: str) -> str | None:
        import torch

        return torch.cuda.get_device_name(torch.device(device))

    def synchronize(self, device: str) -> None:
        import torch

        torch.cuda.synchronize(device)

    def timer(self, device: str) -> Timer:
        return CudaEventTimer(device)

    def reset_peak_memory(self, device: str) -> None:
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        self._region_start[device] = torch.cuda.memory_allocated(device)

    def read_peak_memory(self, device: str) -> MemoryPeak:
        import torch

        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        peak = MemoryPeak(
            method=PEAK_METHOD,
            peak_bytes=torch.cuda.max_memory_allocated(device),
            reserved_bytes=torch.cuda.max_memory_reserved(device),
            outside_allocator_bytes=(total - free) - torch.cuda.memory_reserved(device),
        )
        return with_start(peak, self._region_start.get(device))

    def device_processes(self, device: str) -> tuple[str, ...] | None:
        """Other processes with a context on the device, from NVML (``nvidia-ml-py``); None without NVML."""
        import torch

        uuid = getattr(torch.cuda.get_device_properties(torch.device(device)), "uuid", None)
        return nvml_other_processes(None if uuid is None else f"GPU-{uuid}", resolved_index(device))

    def is_out_of_memory(self, exc: BaseException) -> bool:
        import torch

        return raised_for(exc, (torch.cuda.OutOfMemoryError,), CUDA_OOM_MESSAGES)

    def recover_from_oom(self, device: str) -> None:
        import torch

        gc.collect()
        torch.cuda.empty_cache()

    def release_cached_memory(self, device: str) -> None:
        """Empty the caching allocator: without it, ``max_memory_reserved`` after ``reset_peak_memory_stats`` starts
        from what earlier regions left cached, and a region's reserved peak is at least that."""
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()

    @contextlib.contextmanager
    def concurrent_worker(self, device: str) -> Iterator[None]:
        """A new stream for the calling thread: threads on the default stream would run one after another."""
        import torch

        with torch.cuda.stream(torch.cuda.Stream(device)):
            yield

    def set_memory_budget(self, device: str, budget_bytes: int | None) -> bool:
        """Cap this process's caching allocator at ``budget_bytes``; None puts back the cap the device had before
        rpx set one. Memory outside the allocator (CUDA context, workspaces) is not covered by the cap."""
        import torch

        index = resolved_index(device)
        if budget_bytes is None:
            if index in self._fractions_before:
                torch.cuda.set_per_process_memory_fraction(self._fractions_before.pop(index), index)
            return True
        self._fractions_before.setdefault(index, memory_fraction(index))
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(budget_fraction(budget_bytes, total), index)
        return True


@hookimpl
def rpx_register_backends() -> list[Backend]:
    return [CudaBackend()]
