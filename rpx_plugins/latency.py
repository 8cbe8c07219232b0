"""The built-in ``measure_latency`` stage: per-call latency at batch 1, throughput per batch size, peak memory.

Framework-agnostic: it uses only the backend contract (inputs, timer, synchronize, peak memory, out-of-memory
recognition) and the context's model. Model and inputs are built before any warm-up, so no tracing or counting runs in
a timed call. Latency samples are single synchronised calls at batch 1; throughput times many back-to-back calls at
each batch size as one region, with that size's inputs made for its row and dropped after it, so a row's peak memory
holds no other row's inputs. A batch's time is never divided into per-sample "latencies".

How long to sample: torch.utils.benchmark's ``adaptive_autorange`` stops once the IQR of its block means is within
a threshold of their median, a rule about the spread (a bimodal workload never meets it); pyperf calibrates, runs
several processes and warns when the spread looks unstable. rpx stops on what the result claims instead: once the
median's distribution-free confidence interval is within ``target_relative_width`` of it, and says "stable",
"noisy" or "too_few_samples" in the result and on the console. Single calls, not block means, so a descheduled call
is one outlier (counted, kept) instead of being averaged into every figure.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable

import attrs

from rpx_core.plugin import PROGRESS_INTERVAL, Backend, Deadline, StageContext, Timer, hookimpl, stats
from rpx_core.types.latency import LatencyOptions, LatencyResult, ThroughputResult
from rpx_plugins.measurement import gc_paused

#: Adaptive sampling judges the interval again once the sample count grew by this factor.
CHECK_GROWTH = 1.1


@attrs.frozen
class WarmUp:
    calls: int
    seconds: float  # host wall time of all warm-up calls
    median_call_seconds: float | None  # each call synchronised; None when no warm-up call was made


@attrs.frozen
class Sampling:
    samples_s: tuple[float, ...]  # one per call, backend clock, seconds
    seconds: float  # host wall time of the whole sampling loop
    stopped_by: str  # "min_samples", "target_width" or "max_seconds"


def model_call(backend: Backend, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """One forward call through ``backend.call_model``, bound once into a no-argument callable for the timing loops."""
    return functools.partial(backend.call_model, model, args, kwargs)


def warm_up(call: Callable[[], Any], synchronize: Callable[[], None], calls: int, seconds: float,
            deadline: Deadline = Deadline()) -> WarmUp:
    """Call until both ``calls`` calls were made and ``seconds`` passed, synchronising after each call; no call
    starts once ``deadline`` passed."""
    clock = time.perf_counter
    durations: list[float] = []
    started = clock()
    while (len(durations) < calls or clock() - started < seconds) and not deadline.expired():
        begin = clock()
        call()
        synchronize()
        durations.append(clock() - begin)
    median = stats.percentile(durations, 50) if durations else None
    return WarmUp(len(durations), clock() - started, median)


def sample_calls(call: Callable[[], Any], timer: Timer, min_samples: int, max_seconds: float,
                 deadline: Deadline = Deadline(), tight: Callable[[list[float]], bool] | None = None,
                 progress: Callable[..., None] = lambda *_: None) -> Sampling:
    """Time single calls until ``min_samples`` are taken (and, with ``tight``, until ``tight(samples)`` holds), or
    ``max_seconds`` or the stage's ``deadline`` passed (at least one is always taken). ``tight`` is asked at
    checkpoints growing by :data:`CHECK_GROWTH`, so judging the samples (a sort) costs O(log n) sorts in all.
    ``progress`` is told how far sampling got a few times a second, between timed calls."""
    clock = time.perf_counter
    start, stop = timer.start, timer.stop
    samples: list[float] = []
    append = samples.append
    began = next_report = clock()
    deadline_at = min(began + max_seconds, began + deadline.remaining())
    check_at = min_samples
    while True:
        start()
        call()
        append(stop())
        if len(samples) >= check_at:
            if tight is None:
                stopped_by = "min_samples"
                break
            if tight(samples):
                stopped_by = "target_width"
                break
            check_at = max(len(samples) + 1, math.ceil(len(samples) * CHECK_GROWTH))
        if (now := clock()) >= next_report:  # between timed calls, never inside one; a few times a second
            progress("latency sampling", len(samples), min_samples)
            next_report = now + PROGRESS_INTERVAL
        if now >= deadline_at:
            stopped_by = "max_seconds"
            break
    return Sampling(tuple(samples), clock() - began, stopped_by)


def sampling_seconds(options: LatencyOptions, batch_sizes: tuple[int, ...]) -> float:
    """The latency samples' share of ``max_seconds``: all of it without throughput rows to measure, else half, so
    adaptive sampling on a noisy machine leaves the throughput rows their time."""
    return options.max_seconds / 2 if options.adaptive and batch_sizes else options.max_seconds


def interval_is_tight(options: LatencyOptions) -> Callable[[list[float]], bool]:
    """Whether the median's interval at the options' confidence is within their target relative width."""
    def tight(samples: list[float]) -> bool:
        width = relative_width(stats.median_interval(samples, options.interval_confidence), samples)
        return width is not None and width <= options.target_relative_width
    return tight


def relative_width(interval: tuple[float, float] | None, samples) -> float | None:
    if interval is None:
        return None
    median = stats.percentile(samples, 50)
    return (interval[1] - interval[0]) / median if median > 0 else None


def time_calls(call: Callable[[], Any], timer: Timer, calls: int) -> float:
    """Seconds for ``calls`` back-to-back calls timed as one region."""
    timer.start()
    for _ in range(calls):
        call()
    return timer.stop()


def throughput_calls(options: LatencyOptions, median_call_seconds: float | None) -> int:
    """Enough calls to fill ``throughput_seconds`` at the warm-up's median call time, at least ``throughput_min_calls``."""
    if not median_call_seconds:
        return options.throughput_min_calls
    return max(options.throughput_min_calls, round(options.throughput_seconds / median_call_seconds))


def measure_throughput(ctx: StageContext, batch_size: int, options: LatencyOptions, timer: Timer,
                       deadline: Deadline = Deadline()) -> ThroughputResult:
    """Warm up at ``batch_size``, then time back-to-back calls: samples/s = calls * batch_size / seconds.

    The inputs are made here and die with this frame, not cached in ``ctx`` (``ctx.inputs`` would keep every batch
    size's inputs, and each later row's peak memory would include all of them)."""
    backend, job = ctx.backend, ctx.job
    device = job.device
    inputs = backend.make_inputs(job.model, batch_size, job.precision, device)
    call = model_call(backend, ctx.model(), *inputs)
    warm = warm_up(call, lambda: backend.synchronize(device), options.warmup_calls, options.warmup_seconds, deadline)
    calls = throughput_calls(options, warm.median_call_seconds)
    if warm.median_call_seconds:  # no more calls than fit before the stage's deadline (at least one)
        calls = max(1, min(calls, int(deadline.remaining() / warm.median_call_seconds)))
    backend.reset_peak_memory(device)
    with gc_paused():
        seconds = time_calls(call, timer, calls)
    peak = backend.read_peak_memory(device)
    result = ThroughputResult(batch_size, calls, seconds, calls * batch_size / seconds, peak)
    if not backend.dispatches_asynchronously:
        return result
    with gc_paused():
        pipelined = time_pipelined(backend, ctx.model(), inputs, calls, device)
    return attrs.evolve(result, pipelined_seconds=pipelined, pipelined_samples_per_s=calls * batch_size / pipelined)


def time_pipelined(backend: Backend, model: Any, inputs: tuple[tuple[Any, ...], dict[str, Any]], calls: int,
                   device: str) -> float:
    """Seconds for ``calls`` dispatched back to back, waiting once on the last outputs (calls run in order)."""
    args, kwargs = inputs
    dispatch = backend.dispatch_model
    backend.wait_for(dispatch(model, args, kwargs), device)  # nothing queued before the clock starts
    started = time.perf_counter()
    for _ in range(calls):
        outputs = dispatch(model, args, kwargs)
    backend.wait_for(outputs, device)
    return time.perf_counter() - started


def measure_all_throughput(ctx: StageContext, options: LatencyOptions, timer: Timer,
                           deadline: Deadline = Deadline()) -> tuple[ThroughputResult, ...]:
    """Throughput at each of the job's batch sizes; one that runs out of memory is recorded, and larger ones skipped;
    none is started after ``deadline``."""
    results: list[ThroughputResult] = []
    smallest_failed: int | None = None
    for done, batch_size in enumerate(ctx.job.batch_sizes):
        ctx.progress("throughput", done, len(ctx.job.batch_sizes))
        if deadline.expired():
            results.append(ThroughputResult(batch_size, error=f"not measured: measure_latency's max_seconds "
                                            f"({options.max_seconds:g} s) was reached"))
            continue
        if smallest_failed is not None and batch_size >= smallest_failed:
            results.append(ThroughputResult(batch_size, error=f"not tried: batch size {smallest_failed} ran out of memory"))
            continue
        try:
            results.append(measure_throughput(ctx, batch_size, options, timer, deadline))
            continue
        except Exception as exc:
            if not ctx.backend.is_out_of_memory(exc):
                raise
            error = f"out of memory: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ctx.backend.recover_from_oom(ctx.job.device)  # after the except block, so the traceback's frames are gone
        smallest_failed = batch_size if smallest_failed is None else min(smallest_failed, batch_size)
        results.append(ThroughputResult(batch_size, error=error))
    return tuple(results)


def noise_warning(spread: float, threshold: float) -> str | None:
    if spread <= threshold:
        return None
    return (
        f"noisy machine: the middle half of the latency samples spans {spread:.0%} of the median (threshold "
        f"{threshold:.0%}); close other programs, fix the CPU governor or GPU clocks, or take more samples"
    )


def verdict(interval_width: float | None, target: float) -> str:
    """"too_few_samples" without an interval, "stable" when it is within ``target`` of the median, else "noisy"."""
    if interval_width is None:
        return "too_few_samples"
    return "stable" if interval_width <= target else "noisy"


def summarize(sampling: Sampling, warm: WarmUp, options: LatencyOptions, **measured: Any) -> LatencyResult:
    """Turn batch-1 samples into the result: every percentile only if claimable, the others listed; the median's
    interval, its verdict and the outliers counted (kept in every figure)."""
    samples_ms = tuple(seconds * 1e3 for seconds in sampling.samples_s)
    count = len(samples_ms)
    claimed = {f"p{q}_ms": stats.percentile(samples_ms, q) for q in stats.MIN_SAMPLES if stats.claimable(q, count)}
    spread = stats.spread(samples_ms)
    interval = stats.median_interval(samples_ms, options.interval_confidence)
    width = relative_width(interval, samples_ms)
    return LatencyResult(
        percentile_method=stats.PERCENTILE_METHOD,
        samples_count=count,
        sampling_seconds=sampling.seconds,
        stopped_by=sampling.stopped_by,
        mean_ms=stats.mean(samples_ms),
        std_ms=stats.std(samples_ms),
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        iqr_ms=stats.interquartile_range(samples_ms),
        spread=spread,
        unclaimed_percentiles=stats.unclaimed(count),
        noisy_warning=noise_warning(spread, options.noise_threshold),
        warmup_calls=warm.calls,
        warmup_seconds=warm.seconds,
        samples_ms=samples_ms if options.keep_samples else None,
        p50_interval_ms=None if interval is None else list(interval),
        interval_confidence=options.interval_confidence,
        interval_method=stats.INTERVAL_METHOD,
        interval_relative_width=width,
        target_relative_width=options.target_relative_width,
        verdict=verdict(width, options.target_relative_width),
        outliers=stats.outliers(samples_ms),
        outlier_rule=stats.OUTLIER_RULE,
        **claimed,
        **measured,
    )


def measure_latency(ctx: StageContext) -> LatencyResult:
    """Warm up, sample batch-1 calls with the region's peak memory, then throughput per batch size, all within
    ``max_seconds`` (no call starts after it; the one sample always taken excepted)."""
    options = ctx.options("measure_latency") or LatencyOptions()
    backend, device = ctx.backend, ctx.job.device
    call = model_call(backend, ctx.model(), *ctx.inputs(1))  # built and placed before anything is timed
    deadline = Deadline.after(options.max_seconds)  # building the model is bounded by the stage_timeout only
    timer = backend.timer(device)
    with backend.inference_context():
        warm = warm_up(call, lambda: backend.synchronize(device), options.warmup_calls, options.warmup_seconds,
                       deadline)
        paused = time.monotonic()
        backend.reset_peak_memory(device)
        with gc_paused():  # rpx's own collection and reset are not the model's time: the deadline moves past them
            deadline = deadline.extended(time.monotonic() - paused)
            sampling = sample_calls(call, timer, options.min_samples, sampling_seconds(options, ctx.job.batch_sizes),
                                    deadline, interval_is_tight(options) if options.adaptive else None, ctx.progress)
        peak = backend.read_peak_memory(device)
        throughput = measure_all_throughput(ctx, options, timer, deadline)
    card = ctx.results.get("system_card")
    return summarize(
        sampling,
        warm,
        options,
        clock=timer.clock,
        peak_memory=peak,
        threads=ctx.backend.thread_settings(),
        throughput=throughput,
        system_summary=card.summary() if card is not None else None,
    )


@hookimpl(trylast=True)
def rpx_measure_latency(ctx: StageContext) -> LatencyResult:
    return measure_latency(ctx)
