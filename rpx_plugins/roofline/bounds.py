"""Roofline arithmetic: lower bounds on a forward pass's time from its FLOPs, its DRAM traffic and a GPU's peaks.

Plain numbers in, attrs results out (rpx_core.types.roofline, where the three bounds and the headline are explained); no torch,
so the arithmetic runs and is tested anywhere. A GPU without a peak for the requested precision is skipped with the
reason, never computed with another precision's peak.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import attrs

from rpx_core.plugin import GPUSpec, MissingPeakError, check_precision
from rpx_core.types.roofline import GPURoofline, OperatorTime, RooflineResult, SkippedRoofline

_non_negative = attrs.validators.ge(0)


class OpRecordLike(Protocol):
    """What the per-operator bound reads from a Tier 1 record: figures for ONE call, and how many identical calls."""

    @property
    def op(self) -> str: ...

    @property
    def count(self) -> int: ...

    @property
    def flops(self) -> float: ...

    @property
    def bytes_read(self) -> float: ...

    @property
    def bytes_written(self) -> float: ...


@attrs.frozen
class Workload:
    """One model's Tier 1 figures the roofline needs."""

    #: FLOPs of the counted pass (matrix + other; forward, or forward + backward when counted so), FLOPs = 2 x MACs.
    #: All of them are divided by the precision's (tensor-core) peak: optimistic for the non-matrix part.
    flops: float = attrs.field(validator=_non_negative)
    bytes_fused: float = attrs.field(validator=_non_negative)  # traffic lower bound: weights, inputs, outputs once
    bytes_unfused: float = attrs.field(validator=_non_negative)  # upper bound: every op reads inputs, writes outputs
    param_bytes: int = attrs.field(validator=_non_negative)  # every weight and buffer at the run's precision (resident)
    peak_activation_bytes: int = attrs.field(validator=_non_negative)  # peak of live activation bytes
    #: Per-operator records (one call's figures x count); None leaves the per-operator bound out.
    records: tuple[OpRecordLike, ...] | None = attrs.field(default=None, converter=attrs.converters.optional(tuple))


def compute_roofline(
    workload: Workload, gpus: Iterable[GPUSpec], precisions: Sequence[str], *, top_k: int = 10
) -> RooflineResult:
    """Bounds for every GPU at every precision; pairs whose pack has no peak are listed in ``skipped`` with the reason.

    An unknown precision name raises UnknownPrecisionError up front: a typo should not read as "no GPU supports it".
    """
    for precision in precisions:
        check_precision(precision)
    bounds: dict[str, dict[str, GPURoofline]] = {}
    skipped: list[SkippedRoofline] = []
    for gpu in gpus:
        for precision in precisions:
            try:
                bound = roofline(workload, gpu, precision, top_k=top_k)
            except MissingPeakError as exc:
                skipped.append(SkippedRoofline(gpu=gpu.name, precision=precision, reason=str(exc)))
            else:
                bounds.setdefault(gpu.name, {})[precision] = bound
    return RooflineResult(gpus=bounds, skipped=tuple(skipped))


def roofline(workload: Workload, gpu: GPUSpec, precision: str, *, top_k: int = 10) -> GPURoofline:
    """Bounds of ``workload`` on ``gpu`` at ``precision``; raises MissingPeakError if the pack has no such peak."""
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    peak = gpu.peak(precision)
    peak_flops = gpu.peak_flops(precision)
    bandwidth = gpu.bandwidth_bytes_s
    compute_s = workload.flops / peak_flops
    memory_fused_s = workload.bytes_fused / bandwidth
    memory_unfused_s = workload.bytes_unfused / bandwidth
    required_bytes = workload.param_bytes + workload.peak_activation_bytes
    per_operator = _OperatorBound() if workload.records is None else _per_operator(
        workload.records, peak_flops, bandwidth, top_k
    )
    return GPURoofline(
        gpu=gpu.name,
        precision=precision,
        peak_tflops=peak.tflops,
        peak_is_estimate=peak.estimate,
        bandwidth_gb_s=gpu.bandwidth_gb_s,
        machine_balance=peak_flops / bandwidth,
        compute_ms=compute_s * 1e3,
        memory_ms_fused=memory_fused_s * 1e3,
        memory_ms_unfused=memory_unfused_s * 1e3,
        bound_ms_fused=max(compute_s, memory_fused_s) * 1e3,
        bound_ms_unfused=max(compute_s, memory_unfused_s) * 1e3,
        bottleneck_fused=bottleneck(compute_s, memory_fused_s),
        bottleneck_unfused=bottleneck(compute_s, memory_unfused_s),
        required_bytes=required_bytes,
        capacity_bytes=gpu.memory_bytes,
        fits_in_memory=required_bytes <= gpu.memory_bytes,
        source=gpu.source,
        pack=gpu.pack,
        peak_note=peak.note,
        per_operator_ms=per_operator.per_operator_ms,
        memory_bound_share=per_operator.memory_bound_share,
        top_operators=per_operator.top_operators,
    )


class _OperatorBound(NamedTuple):
    """Bound (3) and what it shows; all empty when there are no operator records."""

    per_operator_ms: float | None = None
    memory_bound_share: float | None = None
    top_operators: tuple[OperatorTime, ...] = ()


def _per_operator(records: Sequence[OpRecordLike], peak_flops: float, bandwidth: float, top_k: int) -> _OperatorBound:
    """Sum over records of count x max(compute, memory) of one call, its memory-bound share, and the top-k records."""
    timed: list[tuple[OpRecordLike, float, str]] = []
    for record in records:
        compute_s, memory_s = call_seconds(record.flops, record.bytes_read + record.bytes_written, peak_flops, bandwidth)
        timed.append((record, record.count * max(compute_s, memory_s), bottleneck(compute_s, memory_s)))
    total_s = sum(seconds for _, seconds, _ in timed)
    memory_bound_s = sum(seconds for _, seconds, roof in timed if roof == "memory")
    largest = sorted((item for item in timed if item[1] > 0), key=lambda item: item[1], reverse=True)[:top_k]
    return _OperatorBound(
        per_operator_ms=total_s * 1e3,
        memory_bound_share=memory_bound_s / total_s if total_s > 0 else None,
        top_operators=tuple(
            OperatorTime(
                op=record.op, count=record.count, time_ms=seconds * 1e3, share=seconds / total_s, bottleneck=roof
            )
            for record, seconds, roof in largest
        ),
    )


def call_seconds(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> tuple[float, float]:
    """One operator call's compute time (FLOPs / peak FLOP/s) and memory time (bytes / bandwidth in bytes/s), in
    seconds: its own bound is the larger, under the roof ``bottleneck`` names."""
    return flops / peak_flops, nbytes / bandwidth


def bottleneck(compute_s: float, memory_s: float) -> str:
    """Which roof the bound sits under; a tie counts as compute."""
    return "memory" if memory_s > compute_s else "compute"
