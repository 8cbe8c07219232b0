"""Trials batch_search needs to find the largest batch size that fits a memory budget (within 5%), next to a
power-of-two doubling-then-bisection search (Lightning's "binsearch" mode), on the same CPU workload in one run.

Workload: a real torch decoder block (conv at 64x64, 16x nearest upsampling to 8 x 1024 x 1024, relu, sigmoid) whose
peak RSS grows by about 67 MB per sample, on the cpu backend (peak RSS from VmHWM).

1. Real searches: both strategies run real trials (warm-up plus timed calls, peak RSS read per trial) for a few
   budgets; the true limit comes from a direct scan of every batch size up to the largest budget's limit.
2. Calibrated oracle sweep: the memory curve measured in the scan (every size 1..N; beyond N, the least-squares
   line through the scan) stands in for the model, for budgets whose limits span 3..250, so both strategies are
   compared over a wide range without running batch 250 on this machine.

Both stop refining once the largest fitting and smallest failing sizes are within 5% (rpx: ``resolution = 0.05``,
``gain_threshold = 0`` so throughput never stops it early). Target: rpx needs at most half the trials.
Run: python bench/bench_batch_search.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attrs  # noqa: E402
from machine import describe_machine  # noqa: E402

from rpx_core.execution.context import Job, RunContext, StageContext  # noqa: E402
from rpx_core.registry.backends import MemoryPeak  # noqa: E402
from rpx_core.spec.schema import InputSpec, ModelSpec  # noqa: E402
from rpx_core.types.batch_search import BatchSearchOptions, BatchTracker  # noqa: E402
from rpx_plugins.batch_search.planner import BatchPlanner, fit_linear  # noqa: E402
from rpx_plugins.batch_search.stage import TrialRunner, rpx_batch_search  # noqa: E402
from rpx_plugins.torch.cpu import CpuBackend  # noqa: E402

MB = 10**6
RESOLUTION = 0.05
MAX_BATCH = 256
SCAN_UP_TO = 20
REAL_LIMITS = (6, 19)  # budgets placed halfway between the scan's peaks at these sizes and the next
INPUT = (1, 8, 64, 64)


def decoder():
    import torch

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.up = torch.nn.Upsample(scale_factor=16)

        def forward(self, x):
            return torch.sigmoid(torch.relu(self.up(self.conv(x))))

    return Decoder().eval()


def stage_context(backend: CpuBackend, model) -> StageContext:
    spec = ModelSpec(name="decoder", source="bench:decoder", inputs=(InputSpec(INPUT),))
    job = Job(spec, "cpu", "cpu", "fp32", ("batch_search",), {}, (), (1,))
    return StageContext(job, backend, None, None, model_object=model)


def scan(backend: CpuBackend, model, sizes: range) -> dict[int, int]:
    """Peak RSS of one call at each size (after one warm-up call at batch 1), read directly from the backend."""
    import torch

    peaks = {}
    with torch.inference_mode():
        model(torch.randn(INPUT))
        for size in sizes:
            backend.reset_peak_memory("cpu")
            model(torch.randn(size, *INPUT[1:]))
            peaks[size] = backend.read_peak_memory("cpu").peak_bytes
    return peaks


def doubling_then_bisection(fits: Callable[[int], bool]) -> tuple[int | None, int]:
    """Lightning's binsearch: double from 1 until a failure, then bisect until within RESOLUTION. (found, trials)."""
    size, lo, hi, trials = 1, None, None, 0
    while hi is None:
        trials += 1
        if not fits(size):
            hi = size
        elif size >= MAX_BATCH:
            return size, trials
        else:
            lo, size = size, min(2 * size, MAX_BATCH)
    if lo is None:
        return None, trials
    while hi - lo > 1 and hi - 1 > lo * (1 + RESOLUTION):
        mid = (lo + hi) // 2
        trials += 1
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, trials


def rpx_on_oracle(used_at: Callable[[int], int], usable: int) -> tuple[int | None, int]:
    """The batch_search planner fed by the oracle curve (frames/s rise with batch size, so only memory stops it)."""
    planner = BatchPlanner(("decoder",), (1.0,), usable, MAX_BATCH, gain_threshold=0.0, resolution=RESOLUTION)
    tracker = BatchTracker((1.0,), usable)
    while (sizes := planner.next_combination(tracker.trials)) is not None:
        tracker.begin_trial(sizes)
        peak = MemoryPeak("oracle", peak_bytes=used_at(sizes[0]))
        tracker.record_stage(0, calls=1, seconds=0.01 + 0.001 * sizes[0], peak=peak)
        tracker.end_trial(seconds=0.0)
    result = planner.result(tracker.trials, budget_bytes=usable, safety_margin_bytes=0, budget_enforced=False, memory_method="")
    return result.stages[0].largest_fitting_batch, len(tracker.trials)


@attrs.frozen
class RealRun:
    limit: int  # the scan's largest fitting size
    rpx_found: int | None
    rpx_trials: int
    rpx_seconds: float
    base_found: int | None
    base_trials: int
    base_seconds: float


def real_run(backend: CpuBackend, context: StageContext, budget: int, limit: int) -> RealRun:
    """Both strategies with real trials (warm-up, timed calls, peak RSS) under ``budget``."""
    options = BatchSearchOptions(
        memory_budget=budget, safety_margin=0, trial_seconds=0.01, gain_threshold=0.0, resolution=RESOLUTION,
        max_batch=MAX_BATCH,
    )
    started = time.perf_counter()
    result = rpx_batch_search(RunContext([context], options, backend, None, None))
    rpx_seconds = time.perf_counter() - started

    tracker = BatchTracker((1.0,), budget)
    runner = TrialRunner(backend, "cpu", [context], [context.model()], tracker, options.trial_seconds)

    def fits(size: int) -> bool:
        runner.run((size,), concurrent=False)
        return tracker.trials[-1].ok

    started = time.perf_counter()
    found, trials = doubling_then_bisection(fits)
    base_seconds = time.perf_counter() - started
    context.release()
    rpx_found = result.stages[0].largest_fitting_batch
    return RealRun(limit, rpx_found, result.trial_count, rpx_seconds, found, trials, base_seconds)


def oracle_sweep(used_at: Callable[[int], int]) -> tuple[list[int], list[int], list[tuple[int, int | None]]]:
    """Trials of both strategies for limits 3..250 (budgets halfway between two sizes); results off by over 5%."""
    rpx_trials, base_trials, misses = [], [], []
    for limit in range(3, 251):
        usable = (used_at(limit) + used_at(limit + 1)) // 2
        for found, trials, counts in (
            (*rpx_on_oracle(used_at, usable), rpx_trials),
            (*doubling_then_bisection(lambda size: used_at(size) <= usable), base_trials),
        ):
            counts.append(trials)
            if found is None or not limit / (1 + RESOLUTION) <= found <= limit:
                misses.append((limit, found))
    return rpx_trials, base_trials, misses


def main() -> None:
    print(describe_machine())
    backend = CpuBackend()
    model = decoder()
    started = time.perf_counter()
    peaks = scan(backend, model, range(1, SCAN_UP_TO + 1))
    line = fit_linear([(size,) for size in peaks], list(peaks.values()))
    print(f"scan 1..{SCAN_UP_TO} in {time.perf_counter() - started:.1f} s: peak RSS = {line.intercept / MB:.0f} MB + "
          f"{line.slopes[0] / MB:.1f} MB/sample (rms residual {line.rms_residual / MB:.1f} MB)")

    print("\n1. real trials on the cpu backend (true limit from the scan)")
    print(f"{'true':>5} {'rpx found':>9} {'trials':>6} {'s':>5}   {'binsearch found':>15} {'trials':>6} {'s':>5}   ratio")
    context = stage_context(backend, model)
    runs = [real_run(backend, context, (peaks[limit] + peaks[limit + 1]) // 2, limit) for limit in REAL_LIMITS]
    for r in runs:
        print(f"{r.limit:>5} {r.rpx_found:>9} {r.rpx_trials:>6} {r.rpx_seconds:>5.1f}   {r.base_found:>15} "
              f"{r.base_trials:>6} {r.base_seconds:>5.1f}   {r.rpx_trials / r.base_trials:.2f}")
    rpx_total, base_total = sum(r.rpx_trials for r in runs), sum(r.base_trials for r in runs)
    print(f"  all: {rpx_total} trials vs {base_total}: ratio {rpx_total / base_total:.2f}")

    def used_at(size: int) -> int:
        return peaks[size] if size in peaks else int(line.intercept + line.slopes[0] * size)

    rpx_trials, base_trials, misses = oracle_sweep(used_at)
    print(f"\n2. calibrated oracle (the scan's curve; its line beyond {SCAN_UP_TO}), limits 3..250, {len(rpx_trials)} budgets")
    for name, trials in (("rpx batch_search", rpx_trials), ("doubling+bisection", base_trials)):
        print(f"{name:>20}: mean {statistics.mean(trials):.2f} trials, median {statistics.median(trials)}, "
              f"max {max(trials)}")
    ratio = statistics.mean(rpx_trials) / statistics.mean(base_trials)
    print(f"ratio rpx / doubling+bisection: {ratio:.2f} (target <= 0.5); "
          f"results not within 5% at or below the true limit: {misses or 'none'}")


if __name__ == "__main__":
    main()
