"""Real training steps on the device: the time of whole steps (p50 with its interval, as latency reports it) and the
peak memory of one step, through the backend contract only (synchronise, timer, peak memory), so torch and JAX steps
are measured alike.

Each timed sample is one whole step (every micro-batch and the optimiser's update), synchronised on both ends by the
backend's timer; sampling stops once the median's distribution-free interval is within ``target_relative_width`` of
it, at ``max_seconds``, or after ``min_steps`` steps at the least (as :mod:`rpx_plugins.latency` samples calls). The
memory step runs after the warm-up steps, before the timed ones: its region starts after the previous step's
``zero_grad``, so its start holds the parameters, buffers, optimiser state and batch, and its increment is what the
step allocated on top. On a host device the allocator is set to give freed memory back before the step is built, and
set for speed after the memory step (:mod:`rpx_plugins.training.host_allocator`), with one more untimed step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from rpx_core.plugin import Backend, Deadline, LatencyOptions, MemoryPeak, StageContext, stats
from rpx_core.types.training import MeasuredStep, PredictedVsMeasured, TrainStepOptions
from rpx_plugins.latency import interval_is_tight, judge, relative_width, sample_calls, warm_up
from rpx_plugins.measurement import gc_paused
from rpx_plugins.training.host_allocator import MMAP_THRESHOLD, freed_memory_returned, settle_for_speed, trim

#: Steps before the memory step at least: the first makes the optimiser's state, the second is steady.
MEMORY_WARMUP = 2
PEAK_NOTE = "predicted / measured; the peak and the resident set too, as the device's allocator counts tensors alone"
HOST_NOTE = ("predicted transient peak / measured increment; no peak or resident ratio: on a host device the measured "
             "peak and start are the process's whole RSS (the interpreter and libraries included); tensors under "
             f"{MMAP_THRESHOLD // 1024} KiB come from the heap's free blocks, so a step made of small tensors shows less "
             "increment than it held (none: no ratio)")


def interval_options(options: TrainStepOptions) -> LatencyOptions:
    """The latency options that judge the median's interval, at the training options' width and confidence."""
    return LatencyOptions(target_relative_width=options.target_relative_width,
                          interval_confidence=options.interval_confidence)


def measure_steps(ctx: StageContext, build: Callable[[], Any], batch_size: int, samples_per_step: int,
                  options: TrainStepOptions, on_host: bool) -> MeasuredStep:
    """Warm up, measure one step's peak memory, then time whole steps. ``build()`` returns a no-argument step (a
    model, its optimiser and batch, built on the device)."""
    backend, device = ctx.backend, ctx.job.device
    with freed_memory_returned() if on_host else contextlib.nullcontext("") as memory_method:
        step = build()
        synchronize = lambda: backend.synchronize(device)  # noqa: E731
        deadline = Deadline.after(options.max_seconds)
        warm = warm_up(step, synchronize, max(options.warmup_steps, MEMORY_WARMUP), 0.0, deadline)
        peak = peak_of_one_step(backend, device, step, trim if on_host else no_preparation)
    if on_host:
        settle_for_speed()
        step()
    timer = backend.timer(device)
    with gc_paused():
        sampling = sample_calls(step, timer, options.min_steps, max(deadline.remaining(), 0.0), deadline,
                                interval_is_tight(interval_options(options)), ctx.progress)
    samples_ms = [seconds * 1e3 for seconds in sampling.samples_s]
    p50 = stats.percentile(samples_ms, 50)
    interval = stats.median_interval(samples_ms, options.interval_confidence)
    verdict, reasons = judge(tuple(samples_ms), relative_width(interval, samples_ms), interval_options(options), warm,
                             None)
    return MeasuredStep(
        batch_size=batch_size,
        samples_per_step=samples_per_step,
        warmup_steps=warm.calls,
        steps=len(samples_ms),
        p50_ms=p50,
        mean_ms=stats.mean(samples_ms),
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        spread=stats.spread(samples_ms),
        samples_per_s=samples_per_step / (p50 / 1e3),
        stopped_by=sampling.stopped_by.replace("min_samples", "min_steps"),
        clock=timer.clock,
        percentile_method=stats.PERCENTILE_METHOD,
        peak_memory=peak,
        p50_interval_ms=None if interval is None else list(interval),
        interval_confidence=options.interval_confidence,
        verdict=verdict,
        verdict_reasons=reasons,
        memory_method=memory_method,
    )


def no_preparation() -> None:
    """Nothing to do before a device's memory region (its allocator counts tensors, not pages)."""


def peak_of_one_step(backend: Backend, device: str, step: Callable[[], Any],
                     prepare: Callable[[], None] = no_preparation) -> MemoryPeak:
    """The backend's peak of one step, its region started with nothing cached by earlier steps."""
    with gc_paused():
        prepare()
        backend.release_cached_memory(device)
        backend.reset_peak_memory(device)
        step()
        return backend.read_peak_memory(device)


def compare(resident_bytes: int, transient_bytes: int, peak: MemoryPeak, on_host: bool) -> PredictedVsMeasured:
    """Predicted / measured for the increment, and where the device counts tensors alone for the peak and the step's
    start (None where a figure is missing or not comparable)."""

    def ratio(predicted: int, measured: int | None) -> float | None:
        return predicted / measured if measured and not on_host else None

    return PredictedVsMeasured(
        note=HOST_NOTE if on_host else PEAK_NOTE,
        transient_ratio=transient_bytes / peak.increment_bytes if peak.increment_bytes else None,
        peak_ratio=ratio(resident_bytes + transient_bytes, peak.peak_bytes),
        resident_ratio=ratio(resident_bytes, peak.start_bytes),
    )
