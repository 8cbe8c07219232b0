"""Training types: what ``train_step`` and ``train_batch_search`` are asked to do (options) and what they found.

A training step is one optimiser step: ``accumulation_steps`` micro-batches, each a forward pass with its loss and a
backward pass, then the optimiser's update and ``zero_grad(set_to_none=True)``. Conventions:

* FLOPs = 2 x MACs for matrix work plus the per-element table for the rest, as in every count of rpx; by phase:
  ``forward`` (model and loss, every micro-batch), ``backward`` (every micro-batch, gradient accumulation included)
  and ``optimizer`` (the update, loss-scaler work included).
* Bytes: element size x elements at each tensor's real dtype; 1 MB = 1e6 bytes, 1 GB = 1e9 bytes when shown so.
* Memory: ``resident`` is what lives between steps (parameters, buffers, optimiser state, the batch); ``transient``
  is what a step allocates on top of it (saved activations, gradients, temporaries) and frees by its end. The
  predicted peak is resident + the transient peak; the measured peak comes from the backend's read-out of one step
  (``MemoryPeak``), its increment from the step's start.
* Times: milliseconds (``_ms``), seconds (``_seconds``); percentiles as :mod:`rpx_core.stats` computes them.

Plain attrs classes without torch or jax, so results load and print without either.
"""

from __future__ import annotations

from typing import Any

import attrs

from rpx_core.convert import one_of
from rpx_core.errors import did_you_mean
from rpx_core.registry.backends import MemoryPeak
from rpx_core.spec.limits import seconds_validator
from rpx_core.types.batch_search import parse_memory_amount
from rpx_core.types.roofline import GPURoofline, SkippedRoofline

#: The phases of a step, in the order they run.
PHASES = ("forward", "backward", "optimizer")
#: Optimisers known by name (torch.optim / optax); anything else is an import path.
NAMED_OPTIMIZERS = ("sgd", "adam", "adamw")
#: Losses known by name; anything else is an import path.
NAMED_LOSSES = ("auto", "cross_entropy", "mse")

_positive = attrs.validators.gt(0)
_at_least_one = attrs.validators.ge(1)


def _choice_or_path(*names: str) -> Any:
    """A validator: one of ``names`` or an import path ``"module:callable"`` / ``"file.py:callable"``."""

    def check(_instance: Any, attribute: Any, value: str) -> None:
        if value not in names and ":" not in value:
            raise ValueError(f"{attribute.name} must be one of {', '.join(map(repr, names))} or an import path "
                             f"'package.module:name' / 'file.py:name'; got {value!r}{did_you_mean(value, names)}")

    return check


def _memory(allow_zero: bool) -> Any:
    """A validator: a memory amount as ``parse_memory_amount`` reads it, the error naming the option."""

    def check(_instance: Any, attribute: Any, value: int | float | str) -> None:
        try:
            parse_memory_amount(value, allow_zero=allow_zero)
        except ValueError as exc:
            raise ValueError(f"{attribute.name}: {exc}") from None

    return check


@attrs.frozen
class TrainStepOptions:
    """The spec's ``[options.train_step]`` table (``train_batch_search`` trains with it too)."""

    #: "sgd" (with momentum 0.9 unless set), "adam", "adamw", or an import path: torch, an optimiser class called as
    #: ``cls(params, **optimizer_settings)``; JAX, a function returning an optax GradientTransformation, called as
    #: ``fn(**optimizer_settings)``. None: a Flax TrainState's own ``tx``, else "adamw".
    optimizer: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        _choice_or_path(*NAMED_OPTIMIZERS)))
    #: Keyword arguments of the optimiser (lr, momentum, betas, weight_decay, ...), over rpx's defaults for a named one.
    optimizer_settings: dict[str, Any] = attrs.Factory(dict)
    #: "auto" (cross-entropy against random class targets for logits: a ``logits`` field or a 2-D [batch, classes]
    #: output; else mean squared error against a random target of the output's shape), "cross_entropy", "mse", or an
    #: import path to ``loss(outputs) -> scalar``.
    loss: str = attrs.field(default="auto", validator=_choice_or_path(*NAMED_LOSSES))
    #: At bf16 or fp16: "autocast" (fp32 parameters, the master weights, with matrix work at the low precision: torch
    #: autocast, and a GradScaler at fp16; JAX: parameters cast inside the step) or "pure" (parameters, gradients and
    #: optimiser state at the low precision). Ignored at fp32.
    precision_policy: str = attrs.field(default="autocast", validator=one_of("autocast", "pure"))
    #: Micro-batches per optimiser step; gradients accumulate across them (each of the job's batch size).
    accumulation_steps: int = attrs.field(default=1, validator=_at_least_one)
    #: Micro-batch size; None: the inputs as the spec writes them.
    batch_size: int | None = attrs.field(default=None, validator=attrs.validators.optional(_at_least_one))
    #: "contiguous" (tensors as made) or "channels_last" (the model and 4-D floating inputs in NHWC layout, the
    #: layout convolution kernels run natively on CPUs and tensor cores; torch only).
    memory_format: str = attrs.field(default="contiguous", validator=one_of("contiguous", "channels_last"))
    #: Where the step is counted: "meta" (torch: fake tensors of the job's device type, no memory allocated; JAX:
    #: abstract values), "device" (real tensors on the job's device), "auto" (meta, else the device).
    count_on: str = attrs.field(default="auto", validator=one_of("auto", "meta", "device"))
    #: Run real steps on the device: step time and measured peak memory beside the prediction. False: count and
    #: predict only (nothing executes).
    measure: bool = True
    warmup_steps: int = attrs.field(default=3, validator=_at_least_one)  # untimed steps first (optimiser state, caches)
    min_steps: int = attrs.field(default=10, validator=_at_least_one)  # timed steps wanted (each synchronised)
    #: Seconds the measured steps may take after the first warm-up step; timing stops when the median's interval is
    #: within ``target_relative_width`` or this passes (at least one step is always timed).
    max_seconds: float = attrs.field(default=30.0, validator=seconds_validator())
    target_relative_width: float = attrs.field(default=0.05, validator=_positive)
    interval_confidence: float = attrs.field(default=0.95, validator=[_positive, attrs.validators.lt(1)])
    top_k: int = attrs.field(default=10, validator=_at_least_one)  # operators listed per phase bound


@attrs.frozen
class TrainBatchSearchOptions:
    """The spec's ``[options.train_batch_search]`` table: the training step is ``[options.train_step]``'s."""

    #: Bytes (int), a size with a unit ("6GB", "512MiB") or a fraction of the device's memory (0.8): what a step's
    #: whole peak may use (resident and transient; on the CPU, the process's RSS).
    memory_budget: int | float | str = attrs.field(default=0.8, validator=_memory(allow_zero=False))
    #: Kept free of the budget (same forms; a fraction is of the budget).
    safety_margin: int | float | str = attrs.field(default=0, validator=_memory(allow_zero=True))
    max_batch: int = attrs.field(default=4096, validator=_at_least_one)  # the largest micro-batch considered
    max_trials: int = attrs.field(default=8, validator=_at_least_one)  # real steps' trials at most
    #: Seconds of timed steps per fitting trial (after one untimed step), for its samples/s.
    trial_seconds: float = attrs.field(default=2.0, validator=seconds_validator())
    #: The search stops when the largest fitting and the smallest failing batch are within this fraction.
    resolution: float = attrs.field(default=0.05, validator=_positive)


@attrs.frozen
class PhaseCounts:
    """FLOPs and bytes of one phase of the step (or of the whole step)."""

    flops: int  # matrix + other FLOPs
    matrix_flops: int  # 2 x macs
    macs: int
    bytes_unfused: int  # every operator reads its inputs and writes its outputs
    #: Lower bound: what the phase must move at least (see TrainStepResult.assumptions for each phase).
    bytes_fused: int


@attrs.frozen
class MemoryItem:
    """One line of the itemised memory prediction."""

    name: str  # "parameters", "gradients", "optimizer_state", "saved_activations", ...
    bytes: int
    note: str = ""


@attrs.frozen
class PhaseMemory:
    """What one phase does to the transient memory (bytes above the resident set)."""

    phase: str
    peak_bytes: int  # the most transient bytes live at once during the phase
    allocated_bytes: int  # transient storages the phase allocated
    freed_bytes: int  # transient storages freed during the phase (allocated in it or before)
    live_at_end_bytes: int  # transient bytes live when the phase ends


@attrs.frozen
class CompilerMemory:
    """XLA's ``memory_analysis()`` of the compiled step (JAX), beside rpx's prediction."""

    argument_bytes: int  # parameters, optimiser state, batch (the step's arguments)
    output_bytes: int  # updated parameters and state, the loss
    alias_bytes: int  # outputs written into donated arguments
    temp_bytes: int  # scratch of the fused program
    peak_bytes: int  # argument + output - alias + temp: what the step holds at most
    source: str


@attrs.frozen
class MemoryPrediction:
    """Predicted memory of one steady-state step (the optimiser state already exists), itemised."""

    resident: tuple[MemoryItem, ...]  # held between steps
    resident_bytes: int
    at_peak: tuple[MemoryItem, ...]  # transient storages live at the peak, by kind
    transient_peak_bytes: int  # sum of at_peak
    peak_bytes: int  # resident_bytes + transient_peak_bytes
    peak_phase: str  # the phase in which the peak is reached
    peak_operator: str  # the operator whose output reached it, e.g. "aten.mm"
    peak_position: float  # how far into the step's counted operators (0 = first, 1 = last)
    phases: tuple[PhaseMemory, ...]  # what each phase allocates and frees, in order
    method: str  # how the prediction was made
    compiler: CompilerMemory | None = None  # XLA's own figure (JAX)


@attrs.frozen
class MeasuredStep:
    """Real steps on the device: time per whole step and the peak of one step."""

    batch_size: int  # micro-batch
    samples_per_step: int  # batch_size x accumulation_steps
    warmup_steps: int
    steps: int  # timed steps
    p50_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    spread: float  # IQR / p50
    samples_per_s: float  # samples_per_step / p50 (s)
    stopped_by: str  # "target_width", "min_steps" or "max_seconds"
    clock: str
    percentile_method: str
    peak_memory: MemoryPeak  # one step after the timed ones, region started after zero_grad
    #: [low, high] of the median's distribution-free interval at interval_confidence; None with too few steps.
    p50_interval_ms: list[float] | None = None
    interval_confidence: float = 0.95
    verdict: str | None = None  # "stable", "noisy" or "too_few_samples", judged as latency's is
    verdict_reasons: tuple[str, ...] = ()  # why it is not "stable" (interval, spread, tail, drift, warm-up)
    memory_method: str = ""  # how the host's allocator was set for the memory step, where that matters


@attrs.frozen
class PredictedVsMeasured:
    """The prediction beside the measurement (ratios predicted / measured; 1.0 = exact; None: not comparable or no
    reading, as ``note`` says)."""

    note: str
    transient_ratio: float | None = None  # predicted transient peak / measured increment
    peak_ratio: float | None = None  # predicted peak / measured peak (where the device's peak counts tensors only)
    resident_ratio: float | None = None  # predicted resident / measured start of the step


@attrs.frozen
class TrainStepResult:
    """One training step of a model: counted and bounded by phase, its memory predicted and (optionally) measured."""

    framework: str  # "torch" or "jax"
    optimizer: str  # the optimiser that ran, e.g. "torch.optim.AdamW" or "optax adamw"
    optimizer_settings: dict[str, Any]
    loss: str  # the loss that ran, e.g. "cross_entropy (auto: logits [8, 10])"
    precision: str  # the spec's precision
    precision_policy: str  # "fp32", "autocast" or "pure"
    parameter_dtype: str  # e.g. "float32"
    compute_dtype: str  # what matrix work runs at, e.g. "bfloat16"
    batch_size: int  # micro-batch
    accumulation_steps: int
    samples_per_step: int
    counted_on: str  # "fake cpu", "fake cuda", "cpu", "abstract", ...
    phases: dict[str, PhaseCounts]  # forward, backward, optimizer
    step: PhaseCounts  # the whole step
    #: GPU -> phase ("forward", "backward", "optimizer", "step") -> bounds at the spec's precision.
    bounds: dict[str, dict[str, GPURoofline]]
    memory: MemoryPrediction
    uncounted_ops: dict[str, int]  # operators that ran without a FLOP formula, with their calls (not in the FLOPs)
    assumptions: tuple[str, ...]
    skipped_bounds: tuple[SkippedRoofline, ...] = ()
    measured: MeasuredStep | None = None
    comparison: PredictedVsMeasured | None = None
    not_measured: str | None = None  # why there is no measurement


@attrs.frozen
class TrainTrial:
    """One trial of the training batch search: real steps at one micro-batch size."""

    batch_size: int
    predicted_bytes: int  # the prediction that placed it (the whole peak, on the budget's scale)
    fits: bool
    used_bytes: int | None = None  # measured whole peak (what the budget holds), None after an out-of-memory error
    samples_per_s: float | None = None
    steps: int | None = None
    seconds: float | None = None
    error: str | None = None  # "out of memory: ..." or "over budget: ..."


@attrs.frozen
class TrainBatchSearchResult:
    """The largest and the fastest micro-batch whose training step fits the budget."""

    budget_bytes: int
    safety_margin_bytes: int
    usable_bytes: int
    trials: tuple[TrainTrial, ...]
    #: The prediction the trials were placed with: whole peak = intercept + per_sample x batch (bytes), from counted
    #: steps at two batch sizes, shifted by what the process holds outside the step.
    predicted_intercept_bytes: float
    predicted_per_sample_bytes: float
    memory_method: str
    stopped_by: str  # why the search ended
    budget_holds: str  # what the budget is compared with
    largest_batch: int | None = None  # the largest fitting batch found (None: not even batch 1 fits)
    best_batch: int | None = None  # the fitting trial with the most samples/s
    best_samples_per_s: float | None = None
