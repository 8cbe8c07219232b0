"""Serving types: a decoder as it is served (``serve``: a prefill and decode steps counted with a real KV cache, bounded
per GPU) and as it runs (``measure_serving``: the same steps timed on the backend, beside the bound).

Conventions (each result repeats them in ``conventions``):

* A prefill runs ``prompt`` tokens of each of ``batch_size`` sequences into an empty KV cache of ``prompt`` positions;
  a decode step runs one token of each sequence against a KV cache of ``context`` positions, the new token's included
  (the cache holds ``context - 1`` earlier tokens; the step attends over all ``context``).
* FLOPs = 2 x MACs for matrix work plus the per-element table's other FLOPs, counted by rpx's counter on the meta
  device over the model's own forward with a real KV cache object of that length (nothing is derived from a formula).
* Bytes: the serving lower bound on memory traffic, weights read once (embedding tables: the rows gathered), the KV
  cache read once over every position attended and written once for the new tokens, token ids and positions in and
  the outputs other than the cache (logits) out. 1 GB = 1e9 bytes.

Plain attrs classes without torch, so results load and print without importing heavy libraries.
"""

from __future__ import annotations

from typing import Any

import attrs

from rpx_core.convert import one_of
from rpx_core.spec.limits import seconds_validator
from rpx_core.types.roofline import SkippedRoofline

#: Weight formats besides the run's precision: weight-only integers (group-wise scales) and fp8 (one scale per tensor).
WEIGHT_FORMATS = ("int8", "int4", "fp8")
#: KV-cache formats besides the run's precision (one scale per cache tensor).
KV_CACHE_FORMATS = ("fp8", "int8")


def _positive_each(_: Any, attribute: attrs.Attribute, values: tuple[int, ...]) -> None:
    if any(not isinstance(value, int) or value < 1 for value in values):
        raise ValueError(f"every value must be an integer >= 1, got {list(values)}", attribute)


def _fraction(_: Any, attribute: attrs.Attribute, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {value}", attribute)


def _at_least(minimum: int) -> Any:
    def check(_: Any, attribute: attrs.Attribute, value: int | None) -> None:
        if value is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value}", attribute)

    return check


@attrs.frozen
class ServeOptions:
    """The spec's ``[options.serve]`` table: which steps to count, and the formats weights and KV cache are stored in."""

    #: Prompt length of the prefill; absent: the model input's sequence length (dimension 1 of its token ids).
    prompt: int | None = attrs.field(default=None, validator=_at_least(1))
    #: Context lengths of the decode steps (positions attended, the new token's included); absent: the prompt length.
    contexts: tuple[int, ...] = attrs.field(default=(), converter=tuple, validator=_positive_each)
    #: Batch sizes of the prefill and the decode steps; absent: the model input's batch size.
    batch_sizes: tuple[int, ...] = attrs.field(default=(), converter=tuple, validator=_positive_each)
    #: Weight format of the matrix weights (every 2-D weight except embedding tables and the output head); absent:
    #: the run's precision. "int8"/"int4": weight-only, dequantised to the run's precision (its peak applies);
    #: "fp8": 1 byte, with the run's precision's peak (``precision = "fp8"`` for fp8 weights and activations).
    weights: str | None = attrs.field(default=None, validator=one_of(*WEIGHT_FORMATS, absent="the run's precision"))
    #: int8/int4: weights per scale along the input dimension (a 2-byte scale per group); 0: one per output row.
    group_size: int = attrs.field(default=128, validator=_at_least(0))
    #: int8/int4: also a zero point per group (asymmetric formats such as AWQ's), at the weights' bits.
    zero_points: bool = False
    #: KV-cache format; absent: the run's precision. "fp8"/"int8": 1 byte per element, one fp32 scale per cache tensor.
    kv_cache: str | None = attrs.field(default=None, validator=one_of(*KV_CACHE_FORMATS, absent="the run's precision"))
    #: Share of a GPU's nominal memory weights, KV cache and activations may use (vLLM's gpu_memory_utilization);
    #: the rest is the runtime's own (CUDA context, allocator, communication buffers).
    memory_fraction: float = attrs.field(default=0.9, validator=_fraction)


@attrs.frozen
class ServeStep:
    """One counted pass: the prefill of a batch of prompts, or one decode step of a batch of sequences."""

    phase: str  # "prefill" or "decode"
    batch_size: int
    new_tokens: int  # tokens each sequence adds in this pass: the prompt (prefill) or 1 (decode)
    context: int  # positions each sequence's tokens attend over: the prompt (prefill) or the context (decode)
    flops: int  # counted FLOPs of the pass: matrix (2 x MACs) + other
    matrix_flops: int
    macs: int
    weight_bytes: int  # weights read once, at their stored formats (embedding tables: the rows gathered)
    kv_read_bytes: int  # every position the pass attends over, read once
    kv_written_bytes: int  # the new tokens' keys and values, written once
    io_bytes: int  # token ids and positions in, outputs other than the cache (logits) out
    bytes: int  # weight + kv_read + kv_written + io: the serving lower bound on memory traffic
    kv_cache_bytes: int  # the KV cache this pass runs against: every tensor of the cache object, at its format
    activation_peak_bytes: int  # counted peak of live activations during the pass (the cache is not one)
    uncounted_ops: dict[str, int] = attrs.Factory(dict)  # operators without a FLOP formula -> calls (not in flops)


@attrs.frozen
class StepBound:
    """One step's lower-bound time on one GPU, and whether it fits."""

    phase: str
    batch_size: int
    context: int
    compute_ms: float  # flops / peak
    memory_ms: float  # bytes / bandwidth
    bound_ms: float  # max(compute_ms, memory_ms): prefill: time to first token; decode: time per output token
    bottleneck: str  # "compute" or "memory" (a tie counts as compute)
    tokens_per_s: float  # batch_size x new_tokens / bound: every sequence together
    tokens_per_s_per_sequence: float  # new_tokens / bound: what one sequence sees
    required_bytes: int  # resident weights + this step's KV cache + its activation peak
    fits: bool  # required_bytes <= the GPU's usable memory
    #: Smallest power of two n with required_bytes / n <= usable memory (tensor parallelism as an even split of
    #: weights, KV cache and activations; replicated norms and communication buffers not counted).
    gpus_needed: int
    bound_ms_on_gpus_needed: float  # bound_ms / gpus_needed: work and traffic split evenly, communication not counted


@attrs.frozen
class ContextCapacity:
    """What fits at one decode context on one GPU, and where decode turns compute-bound."""

    context: int
    kv_bytes_per_sequence: int  # the KV cache of one sequence at this context
    #: Activation peak of a decode step, taken affine in batch through the two smallest counted batches:
    #: fixed + per_sequence x batch.
    activation_bytes_per_sequence: float
    activation_bytes_fixed: float
    #: Largest batch whose weights + KV cache + activations fit the usable memory of one GPU; 0 when not even one
    #: sequence fits (``note`` says why).
    max_batch: int
    #: Smallest batch at which the decode step's compute time reaches its memory time (FLOPs and bytes are affine in
    #: batch: weights once, the rest per sequence); None when it never does (``note`` says why).
    compute_bound_from_batch: int | None = None
    note: str | None = None


@attrs.frozen
class GPUServing:
    """A served decoder on one GPU at one precision."""

    gpu: str
    precision: str  # the precision whose peak is used (the activations')
    peak_tflops: float
    peak_is_estimate: bool
    bandwidth_gb_s: float
    capacity_bytes: int  # nominal memory, memory_gb x 1e9
    usable_bytes: int  # capacity_bytes x memory_fraction
    prefill: tuple[StepBound, ...]
    decode: tuple[StepBound, ...]
    capacities: tuple[ContextCapacity, ...]  # one per decode context
    pack: str | None = None


@attrs.frozen
class ServeResult:
    """The ``serve`` stage's result: prefill and decode steps counted, then bounded on each GPU."""

    prompt: int
    contexts: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    precision: str  # activations and compute: the peak that applies
    weight_format: str  # e.g. "bf16", "int4 (groups of 128 along the input, fp16 scales)"
    kv_cache_format: str  # e.g. "bf16", "fp8 (one fp32 scale per cache tensor)"
    weight_bytes: int  # resident: every parameter and buffer once, at its format, scales included
    weight_bytes_at_precision: int  # the same weights, every floating one at the run's precision
    quantised_weight_elements: int  # elements of the weights stored in ``weights``' format (0 without one)
    kv_bytes_per_token: float  # KV-cache bytes per sequence per position, at the longest context counted
    prefill: tuple[ServeStep, ...]
    decode: tuple[ServeStep, ...]
    conventions: tuple[str, ...]  # every convention behind these figures, in words
    gpus: dict[str, GPUServing] = attrs.Factory(dict)
    skipped: tuple[SkippedRoofline, ...] = ()  # GPUs without a peak for the precision, and why
    local_gpu: str | None = None  # the catalogue's GPU this job runs on (bounded even when not asked for)
    notes: tuple[str, ...] = ()


@attrs.frozen
class MeasureServingOptions:
    """The spec's ``[options.measure_serving]`` table. The steps measured are ``serve``'s."""

    warmup_calls: int = attrs.field(default=3, validator=_at_least(0))  # untimed calls per step before sampling
    min_samples: int = attrs.field(default=20, validator=_at_least(1))  # timed calls wanted per step
    #: Seconds the whole stage may sample for, shared evenly by the steps (filling a step's cache and its warm-up
    #: are not sampling; at least one sample per step is always taken).
    max_seconds: float = attrs.field(default=30.0, validator=seconds_validator())
    interval_confidence: float = attrs.field(default=0.95, validator=[attrs.validators.gt(0), attrs.validators.lt(1)])


@attrs.frozen
class MeasuredStep:
    """One step timed on the backend: single synchronised calls against a KV cache filled to its length."""

    phase: str
    batch_size: int
    context: int
    samples: int
    p50_ms: float
    min_ms: float
    #: [low, high] of the median's distribution-free confidence interval (ms); None with too few samples.
    p50_interval_ms: list[float] | None = None
    tokens_per_s: float = 0.0  # batch_size x new tokens / p50
    bound_ms: float | None = None  # serve's bound for this step on the GPU it ran on; None on a host or unknown GPU
    efficiency: float | None = None  # bound_ms / p50_ms: the share of the roofline reached (1.0 = at the bound)


@attrs.frozen
class MeasureServingResult:
    """The ``measure_serving`` stage's result: serve's steps as the backend runs them."""

    clock: str  # how each call was timed, synchronised on both ends
    percentile_method: str
    interval_method: str
    steps: tuple[MeasuredStep, ...]
    gpu: str | None = None  # the catalogue's GPU the steps ran on, whose bounds they are set against
    conventions: tuple[str, ...] = ()
    system_summary: str | None = None
