"""A step's figures by phase and its roofline bounds per phase, from the counted operator records.

Framework-neutral: torch and JAX counts both arrive as operator records (one call's FLOPs and bytes x its count,
with its phase), and the bounds are the roofline stage's arithmetic (:func:`rpx_plugins.roofline.bounds.roofline`)
applied to each phase and to the whole step.

Fused lower bounds (what a phase must move however well it is fused; activations are excluded since a step may
recompute them instead of saving them):

* forward: the parameters and the batch, once per micro-batch;
* backward: the parameters read and the gradients written, once per micro-batch;
* optimizer: parameters read and written, gradients read, optimiser state read and written, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from rpx_core.plugin import GPUSpec, MissingPeakError, check_precision
from rpx_core.types.roofline import GPURoofline, SkippedRoofline
from rpx_core.types.training import PHASES, PhaseCounts
from rpx_plugins.roofline.bounds import Workload, roofline

STEP = "step"
FUSED_ASSUMPTION = (
    "fused lower bounds per phase: forward reads the parameters and the batch once per micro-batch; backward reads "
    "the parameters and writes the gradients once per micro-batch; the optimizer reads and writes the parameters and "
    "its state and reads the gradients once; activations are left out (a step may recompute them)"
)
BOUND_ASSUMPTION = (
    "bounds per phase and per step: max(FLOPs / peak, bytes / bandwidth) with the fused (headline) or unfused bytes, "
    "and the per-operator sum; every FLOP at the spec precision's peak (under autocast the optimizer's and the "
    "norms' fp32 work too, so optimistic for them); 'fits' compares the predicted step peak with the GPU's memory"
)


@attrs.frozen
class Sizes:
    """What the fused bounds are made of, in bytes."""

    parameters: int
    gradients: int
    optimizer_state: int
    batch: int
    micro_batches: int

    def fused(self) -> dict[str, int]:
        per_micro = self.micro_batches
        return {
            "forward": per_micro * (self.parameters + self.batch),
            "backward": per_micro * (self.parameters + self.gradients),
            "optimizer": 2 * self.parameters + self.gradients + 2 * self.optimizer_state,
        }


def phase_counts(records: Iterable[Any], sizes: Sizes) -> tuple[dict[str, PhaseCounts], PhaseCounts]:
    """Per phase and for the whole step: FLOPs, MACs and unfused bytes summed over ``records``, fused bytes from
    ``sizes``. A record's phase must be one of PHASES."""
    totals = {phase: [0, 0, 0] for phase in PHASES}  # flops, macs, unfused bytes
    for record in records:
        row = totals[record.phase]
        row[0] += record.count * record.flops
        row[1] += record.count * record.macs
        row[2] += record.count * (record.bytes_read + record.bytes_written)
    fused = sizes.fused()
    phases = {phase: PhaseCounts(flops, 2 * macs, macs, unfused, fused[phase])
              for phase, (flops, macs, unfused) in totals.items()}
    step = PhaseCounts(*(sum(getattr(p, field) for p in phases.values()) for field in attrs.fields_dict(PhaseCounts)))
    return phases, step


def step_bounds(phases: dict[str, PhaseCounts], step: PhaseCounts, records: Sequence[Any], gpus: Iterable[GPUSpec],
                precision: str, resident_bytes: int, transient_bytes: int, top_k: int = 10,
                ) -> tuple[dict[str, dict[str, GPURoofline]], tuple[SkippedRoofline, ...]]:
    """GPU -> phase (and "step") -> bounds at ``precision``; a GPU without that peak is skipped with the reason."""
    check_precision(precision)
    by_phase = {phase: [r for r in records if r.phase == phase] for phase in PHASES}
    workloads = {
        name: Workload(flops=counts.flops, bytes_fused=counts.bytes_fused, bytes_unfused=counts.bytes_unfused,
                       param_bytes=resident_bytes, peak_activation_bytes=transient_bytes,
                       records=by_phase.get(name, records))
        for name, counts in {**phases, STEP: step}.items()
    }
    bounds: dict[str, dict[str, GPURoofline]] = {}
    skipped = []
    for gpu in gpus:
        try:
            bounds[gpu.name] = {name: roofline(work, gpu, precision, top_k=top_k) for name, work in workloads.items()}
        except MissingPeakError as exc:
            skipped.append(SkippedRoofline(gpu=gpu.name, precision=precision, reason=str(exc)))
    return bounds, tuple(skipped)


def gpus_asked(ctx: Any) -> list[GPUSpec]:
    """The spec's GPUs ("all": every GPU of the catalogue)."""
    if "all" in ctx.job.gpus:
        return list(ctx.gpu_catalog.all())
    return [ctx.gpu_catalog.get(name) for name in ctx.job.gpus]
