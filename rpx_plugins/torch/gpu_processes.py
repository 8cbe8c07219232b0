"""Who is on a CUDA device: this process's own memory, apart from everyone else's, and the other processes there (a
measurement beside them is marked), from NVML's per-process list (``nvidia-ml-py``, imported as ``pynvml``: the
optional ``rpx[nvml]`` extra).

CUDA itself (``cudaMemGetInfo``) only says how much of the device is in use, by anyone. NVML lists the processes
using a device with the memory each holds (its CUDA context, everything its allocator reserved, library handles).
Where NVML is not installed, cannot start, or does not list this process (a container with its own PID namespace
lists the host's process ids; MIG devices report no per-process memory), the split is unknown and said to be.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import attrs


@attrs.frozen
class ProcessShare:
    """This process's bytes on one device; None with the reason when NVML cannot say."""

    this_process_bytes: int | None
    unknown_because: str | None = None


class ProcessMemory:
    """NVML started once, on first use, and each device's handle looked up once (by UUID: CUDA's and NVML's device
    orders may differ). Kept for the process's life: starting NVML costs milliseconds, a reading microseconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pynvml: Any = None
        self._problem: str | None = None
        self._started = False
        self._handles: dict[str, Any] = {}

    def share(self, uuid: str | None) -> ProcessShare:
        """This process's memory on the device with ``uuid`` (CUDA's form, with or without "GPU-")."""
        processes, problem = self._processes(uuid)
        if processes is None:
            return ProcessShare(None, problem)
        mine = [process for process in processes if process.pid == os.getpid()]
        if not mine:
            return ProcessShare(None, f"NVML does not list this process (pid {os.getpid()}; a container with its own "
                                      "process ids shows the host's)")
        used = [process.usedGpuMemory for process in mine]
        if any(not isinstance(value, int) or value < 0 or value >= 2**63 for value in used):
            return ProcessShare(None, "NVML reports no per-process memory for this device (MIG, or not supported)")
        return ProcessShare(sum(used))

    def others(self, uuid: str | None) -> tuple[str, ...] | None:
        """The other processes with a compute context on the device, as "pid name"; None when NVML cannot say. In a
        container NVML lists the host's process ids, where this process's own is not found: one of them is this
        process, so all but one are listed (which one cannot be told from here)."""
        processes, _ = self._processes(uuid)
        if processes is None:
            return None
        pids = [process.pid for process in processes]
        own = os.getpid()
        others = [pid for pid in pids if pid != own] if own in pids else sorted(pids)[1:]
        return tuple(f"{pid} {process_name(pid)}" for pid in others)

    def _processes(self, uuid: str | None) -> tuple[list[Any] | None, str | None]:
        """NVML's compute processes on the device, or None and why not."""
        with self._lock:
            pynvml = self._start()
            if pynvml is None:
                return None, self._problem
            if uuid is None:
                return None, "torch reports no UUID for the device, so NVML cannot find it"
            try:
                return list(pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle(pynvml, uuid))), None
            except pynvml.NVMLError as exc:
                return None, f"NVML could not list the device's processes: {exc}"

    def _start(self) -> Any:
        if not self._started:
            self._started = True
            try:
                import pynvml
            except ImportError:
                self._problem = "nvidia-ml-py is not installed (pip install 'rpx[nvml]')"
                return None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                self._problem = f"NVML could not start: {exc}"
                return None
            self._pynvml = pynvml
        return self._pynvml

    def _handle(self, pynvml: Any, uuid: str) -> Any:
        if uuid not in self._handles:
            self._handles[uuid] = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + str(uuid).removeprefix("GPU-"))
        return self._handles[uuid]


def process_name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return "(not visible from here)"
