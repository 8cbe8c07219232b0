"""Serving arithmetic on one GPU: lower-bound step times, tokens/s, what fits beside the weights, how many GPUs a
step needs, and the batch from which a decode step is compute-bound.

Plain numbers in (counted steps, a GPU's peaks), attrs results out; no torch. A step's FLOPs and bytes are exact
counts at the batch sizes counted; what fits and where decode turns compute-bound need them at any batch, so they are
taken affine in batch through the two smallest batch sizes counted at that context (weights once, cache and
activations per sequence: exact for FLOPs, traffic and the cache, the activation peak's stated approximation), in
exact rational arithmetic so a floor is never off by one from rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from rpx_core.plugin import GPUSpec
from rpx_core.types.serving import ContextCapacity, GPUServing, ServeStep, StepBound


def gpu_serving(gpu: GPUSpec, precision: str, prefill: Sequence[ServeStep], decode: Sequence[ServeStep],
                resident_bytes: int, memory_fraction: float) -> GPUServing:
    """Every step bounded on ``gpu`` at ``precision``'s peak (MissingPeakError when its pack has none), and what fits
    at each decode context."""
    peak = gpu.peak(precision)
    machine = Machine(Fraction(gpu.peak_flops(precision)), Fraction(gpu.bandwidth_bytes_s),
                      math.floor(Fraction(gpu.memory_bytes) * Fraction(memory_fraction)))
    contexts = sorted({step.context for step in decode})
    return GPUServing(
        gpu=gpu.name,
        precision=precision,
        peak_tflops=peak.tflops,
        peak_is_estimate=peak.estimate,
        bandwidth_gb_s=gpu.bandwidth_gb_s,
        capacity_bytes=gpu.memory_bytes,
        usable_bytes=machine.usable,
        prefill=tuple(step_bound(step, machine, resident_bytes) for step in prefill),
        decode=tuple(step_bound(step, machine, resident_bytes) for step in decode),
        capacities=tuple(capacity([s for s in decode if s.context == context], machine, resident_bytes)
                         for context in contexts),
        pack=gpu.pack,
    )


class Machine:
    """A GPU's figures as exact numbers: peak FLOP/s, bandwidth in bytes/s, usable bytes."""

    def __init__(self, peak: Fraction, bandwidth: Fraction, usable: int) -> None:
        self.peak, self.bandwidth, self.usable = peak, bandwidth, usable

    def gpus_for(self, required: int) -> int:
        """Smallest power of two n with required / n <= usable (an even split over n GPUs)."""
        gpus = 1
        while required > gpus * self.usable:
            gpus *= 2
        return gpus


def step_bound(step: ServeStep, machine: Machine, resident_bytes: int) -> StepBound:
    compute = Fraction(step.flops) / machine.peak
    memory = Fraction(step.bytes) / machine.bandwidth
    bound = max(compute, memory)
    required = resident_bytes + step.kv_cache_bytes + step.activation_peak_bytes
    gpus = machine.gpus_for(required)
    return StepBound(
        phase=step.phase,
        batch_size=step.batch_size,
        context=step.context,
        compute_ms=float(compute * 1000),
        memory_ms=float(memory * 1000),
        bound_ms=float(bound * 1000),
        bottleneck="memory" if memory > compute else "compute",
        tokens_per_s=float(step.batch_size * step.new_tokens / bound) if bound else math.inf,
        tokens_per_s_per_sequence=float(step.new_tokens / bound) if bound else math.inf,
        required_bytes=required,
        fits=required <= machine.usable,
        gpus_needed=gpus,
        bound_ms_on_gpus_needed=float(bound * 1000 / gpus),
    )


def affine(steps: Sequence[ServeStep], figure: str) -> tuple[Fraction, Fraction]:
    """(fixed, per sequence) of ``figure`` through the two smallest batch sizes of ``steps``."""
    first, second = sorted(steps, key=lambda step: step.batch_size)[:2]
    per = Fraction(getattr(second, figure) - getattr(first, figure), second.batch_size - first.batch_size)
    return getattr(first, figure) - per * first.batch_size, per


def capacity(steps: Sequence[ServeStep], machine: Machine, resident_bytes: int) -> ContextCapacity:
    """The largest batch that fits at one context, and the batch from which its decode step is compute-bound."""
    kv_fixed, kv_per = affine(steps, "kv_cache_bytes")
    act_fixed, act_per = affine(steps, "activation_peak_bytes")
    room = machine.usable - resident_bytes - kv_fixed - act_fixed
    max_batch = max(0, math.floor(room / (kv_per + act_per)))
    notes = []
    if max_batch == 0:
        notes.append(f"not one sequence fits: weights {resident_bytes / 1e9:.3g} GB, one sequence's KV cache and "
                     f"activations {(kv_per + act_per + kv_fixed + act_fixed) / 1e9:.3g} GB, usable "
                     f"{machine.usable / 1e9:.3g} GB; split over GPUs (gpus_needed) or store weights smaller")
    crossover, why = compute_bound_from(steps, machine)
    if why:
        notes.append(why)
    elif crossover is not None and crossover > max_batch:
        notes.append(f"decode turns compute-bound at batch {crossover}, beyond the {max_batch} that fit on one GPU")
    return ContextCapacity(
        context=steps[0].context,
        kv_bytes_per_sequence=int(kv_per),
        activation_bytes_per_sequence=float(act_per),
        activation_bytes_fixed=float(act_fixed),
        max_batch=max_batch,
        compute_bound_from_batch=crossover,
        note="; ".join(notes) or None,
    )


def compute_bound_from(steps: Sequence[ServeStep], machine: Machine) -> tuple[int | None, str | None]:
    """Smallest batch b with FLOPs(b) / peak >= bytes(b) / bandwidth, or None and why not."""
    flops_fixed, flops_per = affine(steps, "flops")
    bytes_fixed, bytes_per = affine(steps, "bytes")
    gain = flops_per / machine.peak - bytes_per / machine.bandwidth  # compute time less memory time, per sequence
    if gain <= 0:
        return None, (f"memory-bound at every batch: each sequence adds {float(bytes_per) / 1e6:.3g} MB of traffic "
                      f"(mostly its KV cache) for {float(flops_per) / 1e9:.3g} GFLOP, below the GPU's "
                      f"{float(machine.peak / machine.bandwidth):.0f} FLOP/B")
    deficit = bytes_fixed / machine.bandwidth - flops_fixed / machine.peak
    return max(1, math.ceil(deficit / gain)), None
