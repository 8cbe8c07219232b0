"""A GPU that exists only in memory, installed over the ``torch.cuda`` / ``torch.mps`` API surface, so the real cuda and
mps backends (and batch_search, latency above them) run unchanged on a CPU-only machine.

What it models, after torch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``):

* **allocated vs reserved.** Requests are rounded up to 512 bytes and carved out of *segments* the allocator reserves
  from the device: 2 MiB segments for requests up to 1 MiB, 20 MiB for requests under 10 MiB, else the request
  rounded up to 2 MiB. A freed block goes back to its segment's free list (merged with free neighbours) and the
  segment stays reserved: ``memory_reserved`` keeps what ``memory_allocated`` gave back.
* **a cache kept across regions.** ``reset_peak_memory_stats`` sets both peaks to the *current* values, so a region
  measured after another starts from whatever the earlier one left cached. Only ``empty_cache`` (or an allocation
  that cannot otherwise be met) returns unused segments to the device.
* **a hard cap.** ``set_per_process_memory_fraction`` caps reserved bytes at ``fraction x total``; a new segment
  that would cross the cap (or the device's free memory, which also loses ``context_bytes`` to the CUDA context)
  first frees every unused cached segment, and if it still does not fit the request fails with torch's
  out-of-memory error and message.
* **per-stream pools.** A block freed on one stream is reused only by requests on that stream, as in torch.
* **streams and events.** Each stream has a virtual clock: a kernel launched on a stream advances that stream's
  clock by its modelled duration; an event records its stream's clock, and ``elapsed_time`` is the difference.
  Streams are ideal (fully concurrent), so a stage that shares a stream with another sees the other's kernels in its
  own timing. Which stream each kernel ran on, and which threads synchronised the whole device, is logged.

The MPS variant uses the same allocator: ``current_allocated_memory`` is allocated bytes, ``driver_allocated_memory``
reserved bytes plus ``context_bytes``; its cap is ``fraction x recommended_max_memory`` (1.7 by default, torch's
high-watermark ratio); one request above ``max_buffer_bytes`` fails with Metal's "Invalid buffer size".

Models and inputs on the fake device are :class:`SimulatedModel` and :class:`DeviceBuffer`: their memory lives in
the fake allocator and their kernels on the fake streams, with sizes and durations given per sample. For a model
counted as a real torch module and run on the fake device, :class:`DeviceLinear` takes :class:`DeviceTensor` inputs,
which torch's own tensor factories make once :meth:`FakeGpu.install_tensor_factories` is in place (rpx makes inputs
from shapes with them), and runs at a given fraction of a given peak.
"""

from __future__ import annotations

import contextlib
import math
import threading
import types
from typing import Any, Callable, Iterator

import attrs
import torch

MIB = 2**20
MB = 10**6
MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB  # requests up to this size come from the small pool
SMALL_BUFFER = 2 * MIB  # segment size of the small pool
MIN_LARGE_ALLOC = 10 * MIB  # below this, large requests get a LARGE_BUFFER segment
LARGE_BUFFER = 20 * MIB
ROUND_LARGE = 2 * MIB
MPS_DEFAULT_FRACTION = 1.7  # torch's default PYTORCH_MPS_HIGH_WATERMARK_RATIO


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@attrs.define(eq=False)
class Block:
    size: int
    segment: "Segment"
    free: bool = True


@attrs.define(eq=False)
class Segment:
    size: int
    stream: "FakeStream"
    small: bool
    blocks: list[Block] = attrs.Factory(list)

    @property
    def unused(self) -> bool:
        return all(block.free for block in self.blocks)


class CachingAllocator:
    """The allocator's accounting (see the module docstring); thread-safe."""

    def __init__(self, total_bytes: int, context_bytes: int, out_of_memory: Callable[..., BaseException]) -> None:
        self.total_bytes = total_bytes
        self.context_bytes = context_bytes  # device memory outside the allocator (CUDA context, Metal framework)
        self.out_of_memory = out_of_memory
        self.cap_bytes: int | None = None
        self.segments: list[Segment] = []
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.ooms = 0
        self._lock = threading.RLock()

    def malloc(self, nbytes: int, stream: "FakeStream") -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        with self._lock:
            block = self._cached_block(size, small, stream)
            if block is None:
                wanted = segment_size(size)
                if not self._room_for(wanted):
                    self.empty_cache()
                if not self._room_for(wanted):
                    self.ooms += 1
                    raise self.out_of_memory(size, self)
                segment = Segment(wanted, stream, small)
                block = Block(wanted, segment)
                segment.blocks.append(block)
                self.segments.append(segment)
                self.reserved += wanted
            self._split(block, size, small)
            block.free = False
            self.allocated += block.size
            self.peak_allocated = max(self.peak_allocated, self.allocated)
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            return block

    def free(self, block: Block) -> None:
        with self._lock:
            block.free = True
            self.allocated -= block.size
            blocks = block.segment.blocks
            merged: list[Block] = []
            for each in blocks:  # merge runs of free neighbours
                if merged and merged[-1].free and each.free:
                    merged[-1].size += each.size
                else:
                    merged.append(each)
            blocks[:] = merged

    def empty_cache(self) -> None:
        with self._lock:
            unused = [segment for segment in self.segments if segment.unused]
            self.segments = [segment for segment in self.segments if not segment.unused]
            self.reserved -= sum(segment.size for segment in unused)

    def reset_peaks(self) -> None:
        with self._lock:
            self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def free_device_bytes(self) -> int:
        return self.total_bytes - self.context_bytes - self.reserved

    def _room_for(self, size: int) -> bool:
        within_cap = self.cap_bytes is None or self.reserved + size <= self.cap_bytes
        return within_cap and size <= self.free_device_bytes()

    def _cached_block(self, size: int, small: bool, stream: "FakeStream") -> Block | None:
        candidates = [
            block
            for segment in self.segments
            if segment.small == small and segment.stream is stream
            for block in segment.blocks
            if block.free and block.size >= size
        ]
        return min(candidates, key=lambda block: block.size, default=None)  # best fit

    @staticmethod
    def _split(block: Block, size: int, small: bool) -> None:
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            blocks = block.segment.blocks
            blocks.insert(blocks.index(block) + 1, Block(remaining, block.segment))
            block.size = size


# -- streams and events ------------------------------------------------------------------------------------------------


class FakeStream:
    """A queue of kernels with a virtual clock (seconds of device time)."""

    def __init__(self, gpu: "FakeGpu", name: str) -> None:
        self.gpu, self.name, self.clock = gpu, name, 0.0

    def synchronize(self) -> None:
        self.gpu.log.append(("stream sync", threading.current_thread().name, self.name))

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"


class FakeEvent:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.time: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream if stream is not None else ACTIVE.current_stream()
        self.time = stream.clock

    def synchronize(self) -> None:
        pass  # the virtual clock has already "run" every kernel launched

    def elapsed_time(self, end: "FakeEvent") -> float:
        if self.time is None or end.time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.time - self.time) * 1e3  # milliseconds, as torch


# -- the device --------------------------------------------------------------------------------------------------------


def cuda_oom(size: int, allocator: CachingAllocator) -> BaseException:
    gib = 2**30
    return torch.cuda.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {size / MIB:.2f} MiB. GPU 0 has a total capacity of "
        f"{allocator.total_bytes / gib:.2f} GiB of which {allocator.free_device_bytes() / MIB:.2f} MiB is free. "
        f"Of the allocated memory {allocator.allocated / gib:.2f} GiB is allocated by PyTorch, and "
        f"{(allocator.reserved - allocator.allocated) / MIB:.2f} MiB is reserved by PyTorch but unallocated."
    )


def mps_oom(size: int, allocator: CachingAllocator) -> BaseException:
    gb = 2**30
    error = getattr(torch, "OutOfMemoryError", RuntimeError)
    return error(
        f"MPS backend out of memory (MPS allocated: {allocator.reserved / gb:.2f} GB, other allocations: "
        f"{allocator.context_bytes / gb:.2f} GB, max allowed: {(allocator.cap_bytes or 0) / gb:.2f} GB). Tried to "
        f"allocate {size / MIB:.2f} MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper "
        "limit for memory allocations (may cause system failure)."
    )


class FakeGpu:
    """One fake device of ``kind`` "cuda" or "mps"; :meth:`install` puts it behind torch's API (monkeypatch)."""

    def __init__(
        self,
        kind: str = "cuda",
        total_bytes: int = 80 * 10**9,
        context_bytes: int = 500 * MIB,
        name: str = "NVIDIA H100 80GB HBM3",
        max_buffer_bytes: int | None = None,
    ) -> None:
        self.kind, self.name = kind, name
        self.allocator = CachingAllocator(total_bytes, context_bytes, cuda_oom if kind == "cuda" else mps_oom)
        self.default_stream = FakeStream(self, "default")
        self.max_buffer_bytes = max_buffer_bytes
        self.fraction = 1.0 if kind == "cuda" else MPS_DEFAULT_FRACTION
        self.fractions: list[float] = []  # every fraction set through torch's API, in order
        self.log: list[tuple[str, ...]] = []  # ("kernel", thread, stream), ("device sync", thread), ...
        self._local = threading.local()
        self._streams = 0
        if kind == "mps":
            self._set_cap(self.fraction)

    def __deepcopy__(self, memo: dict) -> "FakeGpu":
        return self  # models copied by rpx (StageContext.build_model) stay on this device

    # -- what models and inputs use --

    def current_stream(self) -> FakeStream:
        stack = getattr(self._local, "streams", None)
        return stack[-1] if stack else self.default_stream

    def buffer(self, nbytes: int) -> "DeviceBuffer":
        if self.max_buffer_bytes is not None and nbytes > self.max_buffer_bytes:
            raise RuntimeError(f"Invalid buffer size: {nbytes / 2**30:.2f} GB")
        return DeviceBuffer(self, nbytes)

    def launch(self, seconds: float) -> None:
        """A kernel of ``seconds`` device time on the calling thread's current stream."""
        stream = self.current_stream()
        stream.clock += seconds
        self.log.append(("kernel", threading.current_thread().name, stream.name))

    def kernel_streams(self, thread_prefix: str) -> dict[str, set[str]]:
        """The streams each thread whose name starts with ``thread_prefix`` launched kernels on."""
        found: dict[str, set[str]] = {}
        for entry in list(self.log):
            if entry[0] == "kernel" and entry[1].startswith(thread_prefix):
                found.setdefault(entry[1], set()).add(entry[2])
        return found

    def device_syncs(self, thread_prefix: str) -> int:
        return sum(1 for entry in list(self.log) if entry[0] == "device sync" and entry[1].startswith(thread_prefix))

    # -- torch.cuda --

    def _device_index(self, device: Any, optional: bool) -> int:
        """torch's own rule (``torch.cuda._utils._get_device_index``): a device without an index is refused unless
        ``optional``, as set_per_process_memory_fraction does."""
        from torch.cuda._utils import _get_device_index

        index = _get_device_index(device, optional=optional)
        if index != 0:
            raise RuntimeError(f"invalid device ordinal {index}: the fake machine has one GPU")
        return index

    def _set_cap(self, fraction: float) -> None:
        self.fraction = fraction
        whole = self.allocator.total_bytes
        self.allocator.cap_bytes = None if self.kind == "mps" and fraction == 0 else int(fraction * whole)

    def _cuda_api(self) -> dict[str, Any]:
        alloc = self.allocator

        def stats(read: Callable[[], int]) -> Callable[..., int]:
            def getter(device: Any = None) -> int:
                self._device_index(device, optional=True)
                return read()

            return getter

        def set_fraction(fraction: float, device: Any = None) -> None:
            self._device_index(torch.cuda.current_device() if device is None else device, optional=False)
            if not isinstance(fraction, float):
                raise TypeError("Invalid type for fraction argument, must be `float`")
            if not 0 <= fraction <= 1:
                raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
            self.fractions.append(fraction)
            self._set_cap(fraction)

        def get_fraction(device: Any = None) -> float:
            self._device_index(torch.cuda.current_device() if device is None else device, optional=False)
            return self.fraction

        def reset_peaks(device: Any = None) -> None:
            self._device_index(device, optional=True)
            alloc.reset_peaks()

        def synchronize(device: Any = None) -> None:
            self._device_index(device, optional=True)
            self.log.append(("device sync", threading.current_thread().name))

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            self._device_index(device, optional=True)
            return alloc.free_device_bytes(), alloc.total_bytes

        def properties(device: Any = None) -> Any:
            self._device_index(device, optional=True)
            return types.SimpleNamespace(
                name=self.name, total_memory=alloc.total_bytes, major=9, minor=0, multi_processor_count=132,
                uuid="58f6ea4c-0000-0000-0000-000000000000",
            )  # fmt: skip

        def new_stream(device: Any = None, priority: int = 0, **_: Any) -> FakeStream:
            self._streams += 1
            return FakeStream(self, f"stream-{self._streams}")

        def current_stream(device: Any = None) -> FakeStream:
            self._device_index(device, optional=True)
            return self.current_stream()

        return {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "get_device_name": lambda device=None: properties(device).name,
            "get_device_properties": properties,
            "memory_allocated": stats(lambda: alloc.allocated),
            "memory_reserved": stats(lambda: alloc.reserved),
            "max_memory_allocated": stats(lambda: alloc.peak_allocated),
            "max_memory_reserved": stats(lambda: alloc.peak_reserved),
            "reset_peak_memory_stats": reset_peaks,
            "empty_cache": alloc.empty_cache,
            "mem_get_info": mem_get_info,
            "set_per_process_memory_fraction": set_fraction,
            "get_per_process_memory_fraction": get_fraction,
            "synchronize": synchronize,
            "Stream": new_stream,
            "Event": FakeEvent,
            "current_stream": current_stream,
            "default_stream": lambda device=None: self.default_stream,
            "stream": self._stream_context,
        }

    @contextlib.contextmanager
    def _stream_context(self, stream: FakeStream | None) -> Iterator[None]:
        if stream is None:
            yield
            return
        stack = self._local.__dict__.setdefault("streams", [])
        stack.append(stream)
        try:
            yield
        finally:
            stack.pop()

    # -- torch.mps --

    def _mps_api(self) -> dict[str, Any]:
        alloc = self.allocator

        def set_fraction(fraction: float) -> None:
            if not isinstance(fraction, float):
                raise TypeError("Invalid type for fraction argument, must be `float`")
            if not 0 <= fraction <= 2:
                raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~2")
            self.fractions.append(fraction)
            self._set_cap(fraction)

        def synchronize() -> None:
            self.log.append(("device sync", threading.current_thread().name))

        return {
            "current_allocated_memory": lambda: alloc.allocated,
            "driver_allocated_memory": lambda: alloc.reserved + alloc.context_bytes,
            "recommended_max_memory": lambda: alloc.total_bytes,
            "set_per_process_memory_fraction": set_fraction,
            "empty_cache": alloc.empty_cache,
            "synchronize": synchronize,
        }

    def install(self, monkeypatch: Any) -> "FakeGpu":
        """Replace torch's API for this device with the fake (undone by the monkeypatch fixture)."""
        monkeypatch.setitem(globals(), "ACTIVE", self)
        if self.kind == "cuda":
            monkeypatch.setattr(torch.version, "cuda", "12.4")
            for name, value in self._cuda_api().items():
                monkeypatch.setattr(torch.cuda, name, value)
        else:
            for name, value in self._mps_api().items():
                monkeypatch.setattr(torch.mps, name, value)
            monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
            monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
            monkeypatch.setattr(torch.backends.mps, "get_name", lambda: self.name, raising=False)
            monkeypatch.setattr(torch.backends.mps, "get_core_count", lambda: 38, raising=False)
        return self

    def install_tensor_factories(self, monkeypatch: Any) -> "FakeGpu":
        """Make torch's tensor factories (``randn``, ``randint``, ``zeros``, ``empty``) give a :class:`DeviceTensor`
        for this device, so inputs rpx makes from shapes land on it; other devices keep torch's own factories."""
        for name in ("randn", "randint", "zeros", "empty"):
            monkeypatch.setattr(torch, name, self._factory(getattr(torch, name)))
        return self

    def _factory(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> Any:
            if str(kwargs.get("device", "")).split(":")[0] != self.kind:
                return original(*args, **kwargs)
            shape = args[-1] if original is torch.randint else args[0]  # randint(low, high, size, ...)
            return DeviceTensor(self, tuple(shape), kwargs.get("dtype") or torch.get_default_dtype())

        return make


#: The fake currently installed (for events recorded without a stream and for input factories).
ACTIVE: FakeGpu | None = None


# -- what runs on it ---------------------------------------------------------------------------------------------------


class DeviceBuffer:
    """A tensor's memory on the fake device, given back when the last reference goes (as a CUDA tensor's)."""

    def __init__(self, gpu: FakeGpu, nbytes: int, batch: int = 0) -> None:
        self.gpu, self.nbytes, self.batch = gpu, nbytes, batch
        self._block = gpu.allocator.malloc(nbytes, gpu.current_stream())

    def __del__(self) -> None:
        block = getattr(self, "_block", None)
        if block is not None:
            self.gpu.allocator.free(block)


@attrs.frozen
class DeviceInputs:
    """An ``input_factory`` for models on the fake device: one input of ``bytes_per_sample`` per sample."""

    bytes_per_sample: int

    def __call__(self, batch_size: int, device: str, dtype: Any) -> DeviceBuffer:
        buffer = ACTIVE.buffer(self.bytes_per_sample * batch_size)
        buffer.batch = batch_size
        return buffer


class DeviceTensor:
    """A tensor on the fake device from torch's own factories (:meth:`FakeGpu.install_tensor_factories`): its shape
    and dtype, its memory in the fake allocator."""

    def __init__(self, gpu: FakeGpu, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.shape, self.dtype = torch.Size(shape), dtype
        self.buffer = gpu.buffer(max(1, math.prod(shape)) * dtype.itemsize)


class DeviceLinear(torch.nn.Linear):
    """``nn.Linear`` without a bias that runs on the fake device at ``efficiency`` of ``peak_flop_s``: a call on a
    :class:`DeviceTensor` of ``rows`` rows is one kernel of 2 x rows x in x out / (efficiency x peak) seconds. On
    real tensors (the meta device rpx counts on, the CPU) it is the real layer."""

    def __init__(self, gpu: FakeGpu, features: int, peak_flop_s: float, efficiency: float) -> None:
        super().__init__(features, features, bias=False)
        self.gpu, self.peak_flop_s, self.efficiency = gpu, peak_flop_s, efficiency
        self.weights: DeviceBuffer | None = None

    def to(self, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device = kwargs.get("device", args[0] if args else None)
        if device is None or str(device).split(":")[0] != self.gpu.kind:
            return super().to(*args, **kwargs)
        dtype = kwargs.get("dtype") or self.weight.dtype
        self.weights = self.weights or self.gpu.buffer(self.weight.numel() * dtype.itemsize)
        return self

    def forward(self, x: Any) -> Any:
        if not isinstance(x, DeviceTensor):
            return super().forward(x)
        rows = math.prod(x.shape[:-1])
        self.gpu.launch(2 * rows * self.in_features * self.out_features / (self.efficiency * self.peak_flop_s))
        return DeviceTensor(self.gpu, (*x.shape[:-1], self.out_features), x.dtype)


class SimulatedModel(torch.nn.Module):
    """A model whose weights and activations live on the fake device.

    Placing it (``.to(device=...)``) reserves ``weight_bytes``. A call runs ``len(layers)`` layers: layer i
    allocates ``layers[i] x batch`` bytes while the previous layer's output is still alive, launches a kernel of
    ``seconds_per_call + seconds_per_sample x batch`` divided among the layers, then frees the previous output; the
    last layer's output is returned. So the peak of one call is the largest sum of two neighbouring layers.
    """

    def __init__(
        self,
        gpu: FakeGpu,
        weight_bytes: int,
        layers: tuple[int, ...],
        seconds_per_call: float = 1e-3,
        seconds_per_sample: float = 1e-4,
    ) -> None:
        super().__init__()
        self.gpu, self.weight_bytes, self.layers = gpu, weight_bytes, layers
        self.seconds_per_call, self.seconds_per_sample = seconds_per_call, seconds_per_sample
        self.weights: DeviceBuffer | None = None

    def to(self, *args: Any, **kwargs: Any) -> "SimulatedModel":
        device = kwargs.get("device", args[0] if args else None)
        if device is not None and str(device).split(":")[0] in ("cuda", "mps") and self.weights is None:
            self.weights = self.gpu.buffer(self.weight_bytes)
        return self

    def peak_bytes_per_sample(self) -> int:
        return max(a + b for a, b in zip((0, *self.layers), self.layers))

    def forward(self, x: DeviceBuffer) -> DeviceBuffer:
        batch = x.batch
        seconds = (self.seconds_per_call + self.seconds_per_sample * batch) / len(self.layers)
        previous = None
        for layer_bytes in self.layers:
            current = self.gpu.buffer(layer_bytes * batch)
            self.gpu.launch(seconds)
            previous = current  # the older output is freed here
        return previous


#: Inputs of 3 x 224 x 224 fp32 images (602,112 bytes a sample).
IMAGE = DeviceInputs(3 * 224 * 224 * 4)
#: Inputs of 128 int64 token ids (1,024 bytes a sample).
TOKENS = DeviceInputs(128 * 8)
