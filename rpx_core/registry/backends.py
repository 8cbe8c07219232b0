"""The backend contract: what a runtime (CPU, CUDA, MPS, JAX, ...) must provide so stages can run and measure on it.

A backend is a registration object returned by a plugin's ``rpx_register_backends`` hook. Stages never branch on device
names: they ask the backend to place the model, make inputs, synchronise, time, and read peak memory. Nothing here imports
torch; concrete backends import their runtime inside methods so ``rpx backends`` stays fast.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import attrs

if TYPE_CHECKING:
    from rpx_core.spec.schema import InputSpec, ModelSpec



@attrs.frozen
class Availability:
    """Whether a backend can run here and, if not, why (shown by ``rpx backends`` and in errors)."""

    available: bool
    reason: str = ""  # why it is unavailable, or a short description of what was found (e.g. "2 devices: NVIDIA H200")


@attrs.frozen
class MemoryPeak:
    """Peak memory of a measured region, in bytes (1 MB = 1e6 bytes when shown as MB).

    ``method`` states how the figure was obtained (e.g. "VmHWM after clear_refs", "torch.cuda.max_memory_allocated",
    "sampled driver memory every 1 ms") because the methods are not equivalent; absent figures are None, never zero.
    ``start_bytes`` is the same figure as ``peak_bytes`` read when the region started, so ``increment_bytes`` (peak
    minus start) is what the measured region itself added on top of what was held before it (model, earlier
    buffers, the interpreter); ``method`` says how the start was read too.
    """

    method: str
    peak_bytes: int | None = None  # peak of the region: RSS on CPU, allocated by the framework allocator on devices
    reserved_bytes: int | None = None  # peak reserved by the allocator's caching pool (CUDA)
    outside_allocator_bytes: int | None = None  # device memory used outside the framework allocator (context, libraries)
    sampled: bool = False  # True when the peak is the max of periodic samples, so a short spike may be missed
    start_bytes: int | None = None  # peak_bytes's figure at the region's start
    increment_bytes: int | None = None  # peak_bytes - start_bytes: the region's own need


def with_start(peak: MemoryPeak, start_bytes: int | None) -> MemoryPeak:
    """``peak`` with the region's start and its increment (peak - start, never below 0) filled in."""
    if start_bytes is None or peak.peak_bytes is None:
        return attrs.evolve(peak, start_bytes=start_bytes)
    return attrs.evolve(peak, start_bytes=start_bytes, increment_bytes=max(0, peak.peak_bytes - start_bytes))


class Timer:
    """A host monotonic clock with synchronisation on both ends; backends with device events override it."""

    clock: ClassVar[str] = "time.perf_counter, synchronize() before start and stop"  # recorded with every measurement

    def __init__(self, synchronize: Callable[[], None]) -> None:
        self._synchronize = synchronize
        self._started = 0.0

    def start(self) -> None:
        self._synchronize()
        self._started = time.perf_counter()

    def stop(self) -> float:
        """Seconds since ``start``, after the device finished the queued work."""
        self._synchronize()
        return time.perf_counter() - self._started


class Backend:
    """Base class for backends; override what your runtime does differently.

    Subclasses set ``name`` and ``precisions`` and implement ``probe``. The defaults describe a synchronous host runtime
    with no peak-memory API, so a backend that forgets to implement memory read-out says so instead of reporting zero.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    #: The model families this backend can run ("torch", "jax", ...): a model factory's object must fit one.
    framework: ClassVar[str] = "torch"
    #: Modules rpx's worker processes import once, before they are forked, so no job pays for importing them
    #: (the framework, and what its stages import lazily on first use).
    worker_preload: ClassVar[tuple[str, ...]] = ()

    @functools.cached_property
    def availability(self) -> Availability:
        """Probe once per process; a probe that raises is reported as unavailable with the exception text."""
        try:
            return self.probe()
        except Exception as exc:  # a broken runtime must not take the CLI down
            return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")

    def probe(self) -> Availability:
        raise NotImplementedError

    def default_device(self) -> str:
        return self.name

    def check_device(self, device: str) -> None:
        """Raise BackendUnavailable naming the device and the reason if ``device`` cannot be used (called before any
        model is built)."""

    def device_problem(self, device: str) -> str | None:
        """Why ``device`` is not a device name of this backend, by its form alone (no runtime is started); None if
        it may be one. The default cannot tell; backends that know their names say so."""
        return None

    def device_memory_bytes(self, device: str) -> int | None:
        """Total memory of ``device`` in bytes (what a fractional memory budget is a fraction of); None if unknown."""
        return None

    def device_name(self, device: str) -> str | None:
        """The accelerator's marketing name (e.g. "NVIDIA H100 80GB HBM3") so a GPU spec can be matched; None for hosts."""
        return None

    def thread_settings(self) -> dict[str, int]:
        """The runtime's thread settings in effect (recorded with measurements and in the system card)."""
        return {}

    def input_dtype_name(self, spec_input: InputSpec, precision: str) -> str | None:
        """The dtype ``spec_input`` is created with at ``precision`` by this backend (e.g. "float16" for a float32
        input of an fp16 job); None when the backend does not say."""
        return None

    def object_precision(self, model: Any) -> str | None:
        """The precision a live model object holds (``rpx.profile`` counts at it when no precision is given);
        None when the backend cannot tell, and the spec's default applies."""
        return None

    def place_model(self, model: Any, precision: str, device: str) -> Any:
        """Move/cast the model for execution at ``precision`` on ``device``; return the placed model."""
        raise NotImplementedError(f"backend {self.name!r} cannot place models")

    def make_inputs(
        self, model: ModelSpec, batch_size: int | None, precision: str, device: str
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Create ``model``'s inputs at ``batch_size`` (None: the shapes as written) on ``device``: positional args
        and keyword args."""
        raise NotImplementedError(f"backend {self.name!r} cannot create inputs")

    def inference_context(self) -> contextlib.AbstractContextManager:
        """Entered once around all timed calls (torch: ``torch.inference_mode()``), not per call: entering costs ~1 us."""
        return contextlib.nullcontext()

    def call_model(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One forward call, the unit that latency measures. Runtimes with lazy results (JAX) block on them here;
        torch backends run under inference mode. The timer's synchronisation covers queued device work."""
        return model(*args, **kwargs)

    #: True when calls return before the device has finished (JAX's async dispatch): throughput is then measured
    #: twice, blocking on every call and pipelined (``dispatch_model`` back to back, one ``wait_for`` at the end).
    dispatches_asynchronously: ClassVar[bool] = False

    def dispatch_model(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call that may return before the device finishes it (default: ``call_model``)."""
        return self.call_model(model, args, kwargs)

    def wait_for(self, outputs: Any, device: str) -> None:
        """Block until ``outputs`` of dispatched calls exist (default: ``synchronize``)."""
        self.synchronize(device)

    def synchronize(self, device: str) -> None:
        """Block until all queued work on ``device`` finished (no-op for synchronous runtimes)."""

    def timer(self, device: str) -> Timer:
        return Timer(lambda: self.synchronize(device))

    def reset_peak_memory(self, device: str) -> None:
        """Start a new measured region for ``read_peak_memory``."""

    def release_cached_memory(self, device: str) -> None:
        """Give back memory the runtime's allocator caches but no live object uses, so that the next region's
        reserved peak is its own and not what an earlier region left cached (batch_search calls it before each
        trial; latency does not, as a timed call must not pay for re-allocating)."""

    def concurrent_worker(self, device: str) -> contextlib.AbstractContextManager:
        """Entered by each thread of a region whose threads should run at the same time on the device (concurrent
        batch_search stages): CUDA gives the thread a stream of its own; the default does nothing."""
        return contextlib.nullcontext()

    def read_peak_memory(self, device: str) -> MemoryPeak:
        return MemoryPeak(method=f"unsupported: backend {self.name!r} has no peak-memory read-out")

    def device_processes(self, device: str) -> tuple[str, ...] | None:
        """Other processes using ``device`` now, as "pid name" (a measurement beside them is marked); None when the
        runtime cannot tell (the default, and host devices, whose competition the CPU times show)."""
        return None

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """True when ``exc`` is this runtime's out-of-memory error."""
        return isinstance(exc, MemoryError)

    def recover_from_oom(self, device: str) -> None:
        """Free what an out-of-memory error left behind so the next trial starts clean."""
        import gc

        gc.collect()

    def set_memory_budget(self, device: str, budget_bytes: int | None) -> bool:
        """Make ``budget_bytes`` a hard limit for this process if the runtime can; return whether it did."""
        return False
