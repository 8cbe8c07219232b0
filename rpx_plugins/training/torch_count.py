"""A torch training step counted by the torch counter's dispatch mode: FLOPs and bytes by phase, and the liveness of
every storage the step allocates, from its first operator to ``zero_grad``.

Where it runs: on fake tensors of the job's device type (``FakeTensorMode``: shapes, dtypes and devices without
memory), so that autocast, which keys on the device, and the device's kernel choices (the CPU's flash attention,
cuDNN's batch norm) apply as on the device; or on real tensors on the device. A first step runs uncounted, so the
counted one is a steady-state step: the optimiser's state already exists, and its lazy creation is not counted.

Memory: the counter's ledger tracks each storage an operator allocates until its last reference dies (weak
references to storages), here through the backward pass and the optimiser too. Each tracked storage is an interval
(first and last operator, bytes, phase, kind); at the step's highest point the live intervals are sorted by kind:
gradients (storages that became a parameter's ``.grad``), activations saved by the forward pass (alive into
backward), autocast's low-precision weight copies (``_to_copy`` of a parameter in the forward), and the backward's
and optimiser's temporaries. Parameters, buffers, optimiser state and the batch are resident (allocated before the
step, not tracked).
"""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from rpx_core.types.counts import BACKWARD_MODULE
from rpx_core.types.training import PHASES, MemoryItem, PhaseMemory
from rpx_plugins.torch.counter.counting import CountingMode
from rpx_plugins.torch.counter.ledger import BACKWARD, FORWARD, Ledger
from rpx_plugins.torch.counter.pricing import ElementSizes, storage_key
from rpx_plugins.torch.counter.registry import resolve
from rpx_plugins.torch.counter.report import summarise
from rpx_plugins.training.report import StepCount

#: The ``module`` of the optimiser's operators (beside BACKWARD_MODULE for the backward pass's).
OPTIMIZER_MODULE = "(optimizer)"
OPTIMIZER = "optimizer"
WHERE = {"forward": ("", FORWARD), "backward": (BACKWARD_MODULE, BACKWARD), "optimizer": (OPTIMIZER_MODULE, OPTIMIZER)}

#: Kinds of transient storage at the peak, in the order they are listed.
KINDS = {
    "saved_activations": "allocated by the forward pass and alive at the peak: saved for backward (or still held)",
    "autocast_weight_copies": "low-precision copies of the parameters made by autocast in the forward pass",
    "gradients": "parameter gradients (.grad), held from their backward operator until zero_grad",
    "backward_temporaries": "allocated by the backward pass, not a gradient: gradients of activations, workspaces",
    "optimizer_temporaries": "allocated by the optimiser's update",
}


@attrs.define
class Interval:
    """One tracked storage's life: [start, end) in the ledger's events (each allocation and free is one), end None
    while alive."""

    start: int
    bytes: int
    phase: str
    kind: str  # "activation", "weight_copy", "backward" or "optimizer" until gradients are known
    key: int
    end: int | None = None
    freed_in: str | None = None  # the phase during which it was freed


class StepLedger(Ledger):
    """The counter's ledger, tracking liveness through the whole step and recording each storage's interval."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phase = "forward"
        self.ops = 0
        self.events = 0  # allocations and frees so far
        self.func: Any = None
        self.reads_weight = False
        self.intervals: list[Interval] = []
        self.slots: dict[int, int] = {}  # storage key -> index of its open interval
        self.top = 0  # highest live bytes of the step so far
        self.top_at: tuple[int, int, str, str] = (0, 0, "forward", "")  # (event, operator index, phase, operator)
        self.phase_top: dict[str, int] = defaultdict(int)
        self.phase_ends: dict[str, int] = {}

    def enter_phase(self, phase: str) -> None:
        if self.phase != phase:
            self.phase_ends[self.phase] = self.live_bytes
        self.phase = phase
        self.where = WHERE[phase]

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        self.ops += 1
        self.func = func
        self.reads_weight = func is torch.ops.aten._to_copy.default and storage_key(args[0]) in self.weight_bytes
        super().record(func, args, kwargs, out)

    def adopt(self, tensor: torch.Tensor, key: int | None = None) -> None:
        key = storage_key(tensor) if key is None else key
        super().adopt(tensor, key)
        kind = {"forward": "weight_copy" if self.reads_weight else "activation"}.get(self.phase, self.phase)
        self.events += 1
        self.slots[key] = len(self.intervals)
        self.intervals.append(Interval(self.events, self.live[key][1], self.phase, kind, key))
        self.phase_top[self.phase] = max(self.phase_top[self.phase], self.live_bytes)
        if self.live_bytes > self.top:
            self.top = self.live_bytes
            operator = str(self.func.overloadpacket) if self.func is not None else ""
            self.top_at = (self.events, self.ops, self.phase, operator)

    def _release(self, key: int, ref: Any) -> None:
        super()._release(key, ref)
        slot = self.slots.pop(key, None)
        if slot is not None:
            self.events += 1
            self.intervals[slot].end = self.events
            self.intervals[slot].freed_in = self.phase

    def stop_tracking(self) -> None:
        """The step goes on after the forward pass: keep tracking."""


def fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def faked(model: torch.nn.Module, mode: Any, device: str, dtype: torch.dtype,
          channels_last: bool = False) -> torch.nn.Module:
    """A copy of ``model`` (meta or real) whose parameters and buffers are fake tensors on ``device``, floating ones at
    ``dtype`` (4-D ones in channels-last layout if asked: a fake model cannot be converted after); tied parameters stay
    tied. The model itself is not changed."""
    memo: dict[int, Any] = {}

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        wanted = dtype if tensor.is_floating_point() else tensor.dtype
        with mode:
            if channels_last and tensor.dim() == 4:
                return torch.empty(tensor.shape, dtype=wanted, device=device, memory_format=torch.channels_last)
            return torch.empty_strided(tensor.shape, tensor.stride(), dtype=wanted, device=device)

    for param in model.parameters():
        memo[id(param)] = torch.nn.Parameter(fake(param), requires_grad=param.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = fake(buffer)
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def counting(ledger: StepLedger) -> Iterator[None]:
    """The counter's module hooks and dispatch mode around the counted step (never meta: fake or real tensors)."""
    with ledger.module_hooks(), CountingMode(ledger, on_meta=False):
        yield


def storage_bytes(tensors: list[torch.Tensor], device_type: str) -> int:
    """Bytes of the distinct storages of ``tensors`` on ``device_type`` (a CPU step counter of a CUDA optimiser is
    not device memory)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor.device.type == device_type and (key := storage_key(tensor)) is not None:
            seen[key] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def count_step(step: Any, device_type: str, formulas: Any = (), top_k: int | None = 20, depth: int = 3) -> StepCount:
    """Run one uncounted step (the optimiser's state is made), then count one whole step."""
    step(lambda phase: None)
    resident = {kind: storage_bytes(tensors, device_type) for kind, tensors in step.resident_tensors().items()}
    ledger = StepLedger(step.model, ElementSizes(), resolve(formulas), {})
    grad_intervals: set[int] = set()  # indices of the intervals that are .grad storages

    def on_phase(phase: str) -> None:
        if phase == "optimizer":  # every gradient exists now
            keys = {storage_key(p.grad) for p in step.model.parameters() if p.grad is not None}
            grad_intervals.update(ledger.slots[key] for key in keys if key in ledger.slots)
        ledger.enter_phase(phase)

    with torch.enable_grad(), counting(ledger):
        step(on_phase)
    ledger.phase_ends[ledger.phase] = ledger.live_bytes
    report = summarise(ledger, step.args, step.kwargs, None, backward=True, device=device_type, top_k=top_k,
                       depth=depth)
    event, index, phase, operator = ledger.top_at
    trained = [p for p in step.model.parameters() if p.requires_grad]
    return StepCount(
        records=report.traffic.op_records,
        uncounted_ops=report.flops.uncounted_ops,
        at_peak=items_at(ledger, event, grad_intervals),
        transient_peak_bytes=ledger.top,
        peak_phase=phase,
        peak_operator=operator,
        peak_position=index / max(ledger.ops, 1),
        phases=phase_memory(ledger),
        resident=resident,
        gradient_bytes=sum(p.numel() * p.element_size() for p in trained),
    )


def items_at(ledger: StepLedger, event: int, gradients: set[int]) -> tuple[MemoryItem, ...]:
    """The storages alive at ``event``, by kind (KINDS); ``gradients`` are the intervals of .grad storages."""
    names = {"activation": "saved_activations", "weight_copy": "autocast_weight_copies",
             "backward": "backward_temporaries", "optimizer": "optimizer_temporaries"}
    totals: dict[str, int] = defaultdict(int)
    for index, interval in enumerate(ledger.intervals):
        if not interval.start <= event < (interval.end or event + 1):
            continue
        kind = "gradients" if index in gradients else names[interval.kind]
        totals[kind] += interval.bytes
    return tuple(MemoryItem(kind, totals[kind], KINDS[kind]) for kind in KINDS if totals.get(kind))


def phase_memory(ledger: StepLedger) -> tuple[PhaseMemory, ...]:
    """Per phase (micro-batches summed): its highest transient bytes, what it allocated and freed, what is live at
    its (last) end."""
    allocated: dict[str, int] = defaultdict(int)
    freed: dict[str, int] = defaultdict(int)
    for interval in ledger.intervals:
        allocated[interval.phase] += interval.bytes
        if interval.freed_in is not None:
            freed[interval.freed_in] += interval.bytes
    return tuple(
        PhaseMemory(phase, ledger.phase_top.get(phase, 0), allocated[phase], freed[phase], ledger.phase_ends.get(phase, 0))
        for phase in PHASES
    )

