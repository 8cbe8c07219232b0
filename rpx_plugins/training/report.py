"""A counted training step into ``TrainStepResult``: phases, bounds and the itemised memory prediction, the same for
torch and JAX (each counts its step into a :class:`StepCount`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from rpx_core.plugin import StageContext
from rpx_core.types.training import (
    CompilerMemory,
    MemoryItem,
    MemoryPrediction,
    PhaseMemory,
    TrainStepOptions,
    TrainStepResult,
)
from rpx_plugins.training.bounds import BOUND_ASSUMPTION, FUSED_ASSUMPTION, Sizes, gpus_asked, phase_counts, step_bounds

STEP_ASSUMPTIONS = (
    "one step: every micro-batch's forward (the model in train mode and the loss) and backward, then the "
    "optimizer's update and zero_grad(set_to_none=True); the model's outputs are dropped once the loss is computed; "
    "with several micro-batches the loss is divided by their number and gradients accumulate",
    "a steady-state step: one step ran first (uncounted), so the optimizer's state exists and its creation is not "
    "counted; FLOPs = 2 x MACs for matrix work plus the per-element table, by phase (forward: model and loss; "
    "backward; optimizer: the update, a loss scaler's unscale and update included)",
)


@attrs.frozen
class StepCount:
    """One counted step, as a framework's counter leaves it."""

    records: Sequence[Any]  # operator records (op, phase, count, flops, macs, bytes_read, bytes_written)
    uncounted_ops: dict[str, int]
    at_peak: tuple[MemoryItem, ...]  # transient storages live at the peak, by kind
    transient_peak_bytes: int
    peak_phase: str
    peak_operator: str
    peak_position: float  # 0..1 through the step's operators
    phases: tuple[PhaseMemory, ...]
    resident: dict[str, int]  # "parameters", "buffers", "optimizer_state", "batch" -> bytes
    gradient_bytes: int  # every trainable parameter's gradient, once


def resident_notes(policy: str, parameter_dtype: str, compute_dtype: str, optimizer: str) -> dict[str, str]:
    parameters = {
        "fp32": f"{parameter_dtype} parameters",
        "autocast": f"{parameter_dtype} parameters: the master weights (autocast computes with {compute_dtype} copies, "
                    "made in each forward pass)",
        "pure": f"{parameter_dtype} parameters, no fp32 master copy (updates are rounded to {parameter_dtype})",
    }[policy]
    return {
        "parameters": parameters,
        "buffers": "buffers (batch-norm statistics, ...)",
        "optimizer_state": f"{optimizer}'s state after its first step (momentum, moments, step counts)",
        "batch": "one micro-batch's inputs and the loss's targets",
    }


def memory_assumptions(policy: str) -> tuple[str, ...]:
    lines = [
        "resident: parameters, buffers, optimizer state and one micro-batch (inputs and targets), held between "
        "steps; transient: what a step allocates on top and frees by its end (zero_grad frees the gradients); the "
        "predicted peak is resident + the transient peak, the measured increment the measured peak less the step's "
        "start",
    ]
    if policy == "autocast":
        lines.append("autocast: the fp32 parameters are the master weights; the low-precision copies autocast makes "
                     "in the forward pass are transient (kept while the forward pass or backward needs them)")
    return tuple(lines)


def settings_text(settings: dict[str, Any]) -> dict[str, Any]:
    """Optimiser settings as results can hold them: numbers, strings, booleans and lists of them; anything else as
    its repr."""

    def plain(value: Any) -> Any:
        if isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            return list(value)
        return repr(value)

    return {name: plain(value) for name, value in settings.items()}


def prediction(count: StepCount, notes: dict[str, str], method: str,
               compiler: CompilerMemory | None = None) -> MemoryPrediction:
    resident = tuple(MemoryItem(kind, count.resident.get(kind, 0), notes[kind]) for kind in notes
                     if count.resident.get(kind))
    resident_bytes = sum(item.bytes for item in resident)
    return MemoryPrediction(
        resident=resident,
        resident_bytes=resident_bytes,
        at_peak=count.at_peak,
        transient_peak_bytes=count.transient_peak_bytes,
        peak_bytes=resident_bytes + count.transient_peak_bytes,
        peak_phase=count.peak_phase,
        peak_operator=count.peak_operator,
        peak_position=count.peak_position,
        phases=count.phases,
        method=method,
        compiler=compiler,
    )


def assemble(ctx: StageContext, options: TrainStepOptions, *, framework: str, count: StepCount, counted_on: str,
             optimizer: str, settings: dict[str, Any], loss: str, policy: str, parameter_dtype: str,
             compute_dtype: str, batch_size: int, notes: Sequence[str] = (),
             compiler: CompilerMemory | None = None) -> TrainStepResult:
    """The result without a measurement: counts by phase, bounds on the spec's GPUs, the memory prediction."""
    sizes = Sizes(parameters=count.resident.get("parameters", 0), gradients=count.gradient_bytes,
                  optimizer_state=count.resident.get("optimizer_state", 0), batch=count.resident.get("batch", 0),
                  micro_batches=options.accumulation_steps)
    phases, step = phase_counts(count.records, sizes)
    method = (f"a steady-state step counted on {counted_on}: the liveness of every storage its operators allocate, "
              "from the first operator of the step to zero_grad")
    memory = prediction(count, resident_notes(policy, parameter_dtype, compute_dtype, optimizer), method, compiler)
    bounds, skipped = step_bounds(phases, step, count.records, gpus_asked(ctx), ctx.job.precision,
                                  memory.resident_bytes, memory.transient_peak_bytes, options.top_k)
    return TrainStepResult(
        framework=framework,
        optimizer=optimizer,
        optimizer_settings=settings_text(settings),
        loss=loss,
        precision=ctx.job.precision,
        precision_policy=policy,
        parameter_dtype=parameter_dtype,
        compute_dtype=compute_dtype,
        batch_size=batch_size,
        accumulation_steps=options.accumulation_steps,
        samples_per_step=batch_size * options.accumulation_steps,
        counted_on=counted_on,
        phases=phases,
        step=step,
        bounds=bounds,
        memory=memory,
        uncounted_ops=dict(count.uncounted_ops),
        assumptions=(*STEP_ASSUMPTIONS, FUSED_ASSUMPTION, BOUND_ASSUMPTION, *notes),
        skipped_bounds=skipped,
    )
