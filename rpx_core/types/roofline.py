"""Tier 2 results: roofline lower bounds on the counted pass's time (forward, or forward + backward when counted so),
per GPU and precision.

Conventions: FLOPs = 2 x MACs (int8: integer ops), matrix and other FLOPs alike divided by the precision's peak;
traffic in bytes of DRAM reads + writes; peaks are the pack's dense figures for the stated precision, never another
precision's; bandwidth in GB/s with 1 GB = 1e9 bytes; times in ms; "fits" compares every weight (count_params, at the
run's precision) plus the peak of live activations with the GPU's nominal memory.

Three bounds, from most optimistic to most pessimistic (a max of sums never exceeds a sum of maxes):

1. whole model, fused traffic: max(FLOPs / peak, fused bytes / bandwidth);
2. whole model, unfused traffic: max(FLOPs / peak, unfused bytes / bandwidth);
3. per operator, unfused traffic: sum over operators of max(op FLOPs / peak, op bytes / bandwidth), at least (2)
   when the operator records add up to the model totals.

The headline ``latency_ms`` is bound (1): it is the only one no implementation can beat (every weight, input and
output crosses DRAM once and every FLOP runs at peak). Bound (3) assumes each operator is its own kernel round-tripping
DRAM, so fused kernels (flash attention, conv+bias+activation, torch.compile) can run faster than it; it is the better
estimate of eager execution and shows which operators are memory-bound.
"""

from __future__ import annotations

import attrs

from rpx_core.precision import PrecisionName


@attrs.frozen
class OperatorTime:
    """One operator record's share of the per-operator bound."""

    op: str  # operator name as the Tier 1 counter reports it (one entry per distinct call signature)
    count: int  # number of identical calls
    time_ms: float  # count x max(FLOPs / peak, bytes / bandwidth) of one call, in ms
    share: float  # fraction (0-1) of the per-operator bound spent in this record
    bottleneck: str  # "compute" or "memory" (ties count as compute)


@attrs.frozen
class GPURoofline:
    """Roofline bounds of one model on one GPU at one precision."""

    gpu: str  # canonical GPU name from its pack
    precision: str  # the precision whose peak was used
    peak_tflops: float  # dense peak used, 1e12 FLOP/s (TOPS for int8)
    peak_is_estimate: bool  # the pack marks this peak as derived or uncertain (see peak_note)
    bandwidth_gb_s: float  # peak DRAM bandwidth, 1 GB = 1e9 bytes
    machine_balance: float  # peak / bandwidth in FLOP per byte: operators below this intensity are memory-bound
    compute_ms: float  # FLOPs / peak
    memory_ms_fused: float  # fused (lower-bound) traffic / bandwidth
    memory_ms_unfused: float  # unfused (upper-bound) traffic / bandwidth
    bound_ms_fused: float  # max(compute_ms, memory_ms_fused): bound (1), the headline
    bound_ms_unfused: float  # max(compute_ms, memory_ms_unfused): bound (2)
    bottleneck_fused: str  # "compute" or "memory" for bound (1) (ties count as compute)
    bottleneck_unfused: str  # "compute" or "memory" for bound (2)
    required_bytes: int  # every parameter and buffer at the run's precision + peak activation bytes
    capacity_bytes: int  # the GPU's nominal memory, memory_gb x 1e9
    fits_in_memory: bool  # required_bytes <= capacity_bytes
    source: str  # where the GPU's figures come from
    pack: str | None = None  # the pack that supplied the figures, "name (provider)"
    peak_note: str | None = None  # the pack's note on this peak (derivation, accumulate precision)
    per_operator_ms: float | None = None  # bound (3); None when no operator records were given
    memory_bound_share: float | None = None  # fraction (0-1) of per_operator_ms spent in memory-bound operators
    top_operators: tuple[OperatorTime, ...] = ()  # the records with the largest time_ms, largest first

    @property
    def latency_ms(self) -> float:
        """The headline bound (1): whole model with fused traffic, the one no implementation can beat."""
        return self.bound_ms_fused


@attrs.frozen
class SkippedRoofline:
    """A (GPU, precision) pair that has no bound, and why (typically: the pack has no peak for that precision)."""

    gpu: str
    precision: str
    reason: str


@attrs.frozen
class RooflineResult:
    """The roofline stage's result: bounds per GPU and precision, and the pairs that could not be computed."""

    gpus: dict[str, dict[str, GPURoofline]]  # GPU name -> precision -> bounds
    skipped: tuple[SkippedRoofline, ...] = ()  # requested pairs without a bound, with the reason
    #: The GPU spec matching the device this job runs on (added even if the spec did not list it), so measured latency
    #: can be set against its bound; None on hosts or unknown devices.
    local_gpu: str | None = None


@attrs.frozen
class RooflineOptions:
    """Options of the ``roofline`` stage (``[options.roofline]``)."""

    #: Precisions to bound at; default: the spec's precision. Others are allowed only when they store tensors at the
    #: same element size as the counted one (fp16 <-> bf16, fp32 <-> tf32), so the counted bytes stay exact.
    precisions: tuple[PrecisionName, ...] = ()
    top_k: int = 10  # operator records listed per GPU and precision
