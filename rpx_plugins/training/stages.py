"""The training stages, declared like every stage: ``train_step`` (one optimiser step counted and bounded by phase,
its memory predicted and itemised, real steps measured) and ``train_batch_search`` (the largest and the fastest
micro-batch whose step fits a memory budget). Their implementations are the torch and JAX hooks beside this module.

Summary fields (flat, table-friendly):

* ``train_step_gflop``: FLOPs of one whole step / 1e9 (FLOPs = 2 x MACs for matrix work), and
  ``train_<phase>_gflop`` for forward, backward and optimizer.
* ``train_predicted_peak_mb``: predicted resident + transient peak / 1e6; ``train_predicted_transient_mb`` the
  transient peak alone; ``train_peak_phase`` the phase it falls in.
* ``train_step_p50_ms`` (with ``train_step_p50_low_ms``/``_high_ms``, the median's interval),
  ``train_samples_per_s``: measured whole steps; ``train_measured_increment_mb`` the measured step's increment;
  ``train_transient_ratio``: predicted transient / measured increment.
* ``train_bound_<gpu>_ms``: the roofline bound (fused) of one step on each GPU asked for.
* ``train_largest_batch``, ``train_best_batch``, ``train_best_samples_per_s``, ``train_search_trials``: the
  training batch search.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rpx_core.plugin import Stage, hookimpl
from rpx_core.types.training import (
    TrainBatchSearchOptions,
    TrainBatchSearchResult,
    TrainStepOptions,
    TrainStepResult,
)

#: Precisions a training step runs at.
TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")
Fields = dict[str, float | str]


def gpu_key(name: str) -> str:
    """A GPU name as a field-name part: "H100-SXM" -> "h100_sxm"."""
    return name.lower().replace(" ", "_").replace("-", "_")


def train_step_fields(result: TrainStepResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"train_step_gflop": result.step.flops / 1e9}
    for phase, counts in result.phases.items():
        fields[f"train_{phase}_gflop"] = counts.flops / 1e9
    memory = result.memory
    fields["train_predicted_peak_mb"] = memory.peak_bytes / 1e6
    fields["train_predicted_transient_mb"] = memory.transient_peak_bytes / 1e6
    fields["train_peak_phase"] = memory.peak_phase
    for gpu, by_phase in result.bounds.items():
        fields[f"train_bound_{gpu_key(gpu)}_ms"] = by_phase["step"].bound_ms_fused
    measured = result.measured
    if measured is not None:
        fields["train_step_p50_ms"] = measured.p50_ms
        if measured.p50_interval_ms is not None:
            fields["train_step_p50_low_ms"], fields["train_step_p50_high_ms"] = measured.p50_interval_ms
        fields["train_samples_per_s"] = measured.samples_per_s
        if measured.peak_memory.increment_bytes is not None:
            fields["train_measured_increment_mb"] = measured.peak_memory.increment_bytes / 1e6
    if result.comparison is not None and result.comparison.transient_ratio is not None:
        fields["train_transient_ratio"] = result.comparison.transient_ratio
    return fields


def train_search_fields(result: TrainBatchSearchResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"train_search_trials": len(result.trials)}
    if result.largest_batch is not None:
        fields["train_largest_batch"] = result.largest_batch
    if result.best_batch is not None and result.best_samples_per_s is not None:
        fields["train_best_batch"] = result.best_batch
        fields["train_best_samples_per_s"] = result.best_samples_per_s
    return fields


def trainable_precision(spec: Any, options: Any) -> Iterable[str]:
    """A step runs at fp32, bf16 or fp16 (tf32, fp8 and int8 are counted for inference only)."""
    precisions = (spec.precision, *(spec.sweep.precision if spec.sweep is not None else ()))
    for precision in dict.fromkeys(precisions):
        if precision not in TRAINING_PRECISIONS:
            yield (f"precision: {precision!r} cannot train; the training stages run at "
                   f"{', '.join(TRAINING_PRECISIONS)}")


def step_executes(options: TrainStepOptions | None) -> bool:
    options = options or TrainStepOptions()
    return options.measure or options.count_on == "device"


def always(options: Any) -> bool:
    return True


TRAIN_STEP = Stage(
    "train_step",
    "one optimiser step: FLOPs and bounds by phase, itemised predicted memory, measured step time and peak",
    result=TrainStepResult,
    options=TrainStepOptions,
    executes=step_executes,
    measures=True,
    check=trainable_precision,
    summary=train_step_fields,
    doc="Count one training step (``ctx.options('train_step')``: optimiser, loss, precision policy, gradient "
    "accumulation) by phase, bound it on the spec's GPUs, predict its memory item by item, and measure real steps.",
)
TRAIN_BATCH_SEARCH = Stage(
    "train_batch_search",
    "the largest and the fastest training micro-batch under a memory budget, placed by predicted memory",
    result=TrainBatchSearchResult,
    options=TrainBatchSearchOptions,
    executes=always,
    measures=True,
    check=trainable_precision,
    summary=train_search_fields,
    doc="Search the micro-batch of ``[options.train_step]``'s step under ``[options.train_batch_search]``'s budget: "
    "trials placed by the predicted step memory, confirmed by real steps.",
)


@hookimpl
def rpx_register_stages() -> list[Stage]:
    return [TRAIN_STEP, TRAIN_BATCH_SEARCH]
