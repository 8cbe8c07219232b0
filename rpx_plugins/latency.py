"""The built-in ``measure_latency`` stage: per-call latency of the job's inputs, throughput per batch size, peak
memory.

One job, one input: latency times the call the job describes, its inputs as written (after a sweep set their shapes),
the very call count_flops counted and the roofline bounded; ``batch_sizes`` add throughput rows and nothing else.
Framework-agnostic: it uses only the backend contract (inputs, timer, synchronize, peak memory, out-of-memory
recognition) and the context's model. Model and inputs are built before any warm-up, so no tracing or counting runs
in a timed call. Latency samples are single synchronised calls; throughput times many back-to-back calls at each
batch size, with that size's inputs made for its row and dropped after it, so a row's peak memory holds no other
row's inputs. A batch's time is never divided into per-sample "latencies".

Warm-up ends when the timings settle (:func:`warm_up`), not after a fixed count. How long to sample:
torch.utils.benchmark's ``adaptive_autorange`` stops once the IQR of its block means is within a threshold of their
median, a rule about the spread (a bimodal workload never meets it); pyperf calibrates, runs several processes and
warns when the spread looks unstable. rpx stops on what the result claims instead: once the median's
distribution-free confidence interval is within ``target_relative_width`` of it. Single calls, not block means, so a
descheduled call is one outlier (counted, kept) instead of being averaged into every figure. The verdict then
describes the whole distribution and the machine (:func:`judge`): "stable" only when the interval is tight, the
spread, tail and drift are moderate, the warm-up settled and no other work competed.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable

import attrs

from rpx_core.plugin import PROGRESS_INTERVAL, Backend, Deadline, StageContext, Timer, hookimpl, stats
from rpx_core.types.counts import inputs_text
from rpx_core.types.latency import Contention, LatencyOptions, LatencyResult, ThroughputResult
from rpx_plugins.contention import ContentionMeter
from rpx_plugins.measurement import gc_paused

#: Adaptive sampling judges the interval again once the sample count grew by this factor.
CHECK_GROWTH = 1.1
#: Throughput rows time their calls in chunks of about this many seconds, checking max_seconds between chunks.
CHUNK_SECONDS = 0.05
#: The fewest samples whose two halves' medians are compared for drift.
DRIFT_MIN_SAMPLES = 20


@attrs.frozen
class WarmUp:
    calls: int
    seconds: float  # host wall time of all warm-up calls
    median_call_seconds: float | None  # each call synchronised; None when no warm-up call was made
    #: Whether the last two windows' medians agreed within the tolerance (None: no warm-up was asked for).
    settled: bool | None = None
    window_medians_s: tuple[float, ...] = ()  # the median call of each window, in order
    first_call_seconds: float | None = None  # the first call alone (compilation, allocation, autotuning)


@attrs.frozen
class Sampling:
    samples_s: tuple[float, ...]  # one per call, backend clock, seconds
    seconds: float  # host wall time of the whole sampling loop
    stopped_by: str  # "min_samples", "target_width" or "max_seconds"


def model_call(backend: Backend, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """One forward call through ``backend.call_model``, bound once into a no-argument callable for the timing loops."""
    return functools.partial(backend.call_model, model, args, kwargs)


def warm_up(call: Callable[[], Any], synchronize: Callable[[], None], calls: int = 1, seconds: float = 0.0,
            deadline: Deadline = Deadline(), *, tolerance: float = 0.05, max_seconds: float = math.inf,
            clock: Callable[[], float] = time.perf_counter) -> WarmUp:
    """Call until the timings settle: in windows of 1, 2, 4, ... calls (each synchronised and timed by ``clock``),
    until the medians of the last two windows differ by at most ``tolerance`` of the last, once at least ``calls``
    calls were made and ``seconds`` passed. Doubling windows see a slow drift (clocks ramping up, caches filling) that
    two equal windows side by side would miss. No call starts ``max_seconds`` after the first call ended (the first
    pays for compilation, however long that takes) or after the ``deadline``; then the warm-up ends unsettled.
    ``max_seconds = 0`` makes no call (no warm-up)."""
    durations: list[float] = []
    medians: list[float] = []
    started = clock()
    size = 1

    def may_call() -> bool:
        if deadline.expired():
            return False
        return not durations or clock() - (started + durations[0]) < max_seconds

    if max_seconds <= 0:
        return WarmUp(0, 0.0, None)
    settled = False
    while may_call():
        window = []
        while len(window) < size and may_call():
            begin = clock()
            call()
            synchronize()
            window.append(clock() - begin)
        durations += window
        if len(window) < size:  # cut short: not a whole window to judge
            break
        medians.append(stats.percentile(window, 50))
        enough = len(durations) >= calls and clock() - started >= seconds
        if enough and len(medians) >= 2 and abs(medians[-1] - medians[-2]) <= tolerance * medians[-1]:
            settled = True
            break
        size *= 2
    median = stats.percentile(durations, 50) if durations else None
    return WarmUp(len(durations), clock() - started, median, settled, tuple(medians),
                  durations[0] if durations else None)


def warm_up_for(options: LatencyOptions, call: Callable[[], Any], synchronize: Callable[[], None],
                deadline: Deadline) -> WarmUp:
    """:func:`warm_up` with the stage's options (its cap: ``warmup_max_seconds``, else a quarter of ``max_seconds``)."""
    cap = options.warmup_max_seconds if options.warmup_max_seconds is not None else options.max_seconds / 4
    return warm_up(call, synchronize, options.warmup_calls, options.warmup_seconds, deadline,
                   tolerance=options.warmup_tolerance, max_seconds=cap)


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


def time_chunked(call: Callable[[], Any], timer: Timer, calls: int,
                 deadline: Deadline = Deadline()) -> tuple[int, float]:
    """(calls made, seconds) of up to ``calls`` back-to-back calls, timed in chunks (each one region, synchronised at
    its ends): one call first, to learn how long calls take now, then chunks of about :data:`CHUNK_SECONDS` at the
    rate measured so far, none started that would not end before ``deadline`` at that rate (at least one call is
    always made). On a busy machine calls slow down: the chunks follow what they measure, so the row stops near the
    deadline instead of finishing a count planned when the machine was quieter."""
    made, seconds = 0, 0.0
    while made < calls:
        if made:
            per_call = seconds / made
            fits = int(deadline.remaining() / per_call) if per_call > 0 else calls
            if fits < 1:
                break
            chunk = max(1, min(calls - made, int(CHUNK_SECONDS / per_call) if per_call > 0 else calls, fits))
        else:
            chunk = 1
        seconds += time_calls(call, timer, chunk)
        made += chunk
    return made, seconds


def throughput_calls(options: LatencyOptions, median_call_seconds: float | None) -> int:
    """Enough calls to fill ``throughput_seconds`` at the warm-up's median call time, at least ``throughput_min_calls``."""
    if not median_call_seconds:
        return options.throughput_min_calls
    return max(options.throughput_min_calls, round(options.throughput_seconds / median_call_seconds))


def measure_throughput(ctx: StageContext, batch_size: int, options: LatencyOptions, timer: Timer,
                       deadline: Deadline = Deadline()) -> tuple[ThroughputResult, WarmUp]:
    """Warm up at ``batch_size``, then time back-to-back calls: samples/s = calls * batch_size / seconds; a row
    max_seconds cuts short says how many calls it made of how many. Returns the row and its warm-up.

    The inputs are made here and die with this frame, not cached in ``ctx`` (``ctx.inputs`` would keep every batch
    size's inputs, and each later row's peak memory would include all of them)."""
    backend, device = ctx.backend, ctx.job.device
    inputs = ctx.fresh_inputs(batch_size)
    call = model_call(backend, ctx.model(), *inputs)
    warm = warm_up_for(options, call, lambda: backend.synchronize(device), deadline)
    planned = throughput_calls(options, warm.median_call_seconds)
    backend.reset_peak_memory(device)
    calls, seconds = time_chunked(call, timer, planned, deadline)
    peak = backend.read_peak_memory(device)
    cut = None if calls == planned else (f"{calls} of {planned} calls: measure_latency's max_seconds "
                                         f"({options.max_seconds:g} s) was reached")
    result = ThroughputResult(batch_size, calls, seconds, calls * batch_size / seconds, peak, cut_short=cut,
                              warmup_calls=warm.calls, warmup_settled=warm.settled)
    if not backend.dispatches_asynchronously:
        return result, warm
    if deadline.remaining() < seconds:
        skipped = f"pipelined calls not timed: measure_latency's max_seconds ({options.max_seconds:g} s) was reached"
        return attrs.evolve(result, cut_short="; ".join(filter(None, (cut, skipped)))), warm
    pipelined = time_pipelined(backend, ctx.model(), inputs, calls, device)
    return attrs.evolve(result, pipelined_seconds=pipelined, pipelined_samples_per_s=calls * batch_size / pipelined), warm


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
                           deadline: Deadline = Deadline(), first_call_s: float | None = None,
                           ) -> tuple[ThroughputResult, ...]:
    """Throughput at each of the job's batch sizes. A row starts only while the time left can hold its first call,
    estimated by the last first call seen (``first_call_s``: at a new shape JAX compiles again, as it did for the
    latency's first call), so a stage does not overrun max_seconds by a compilation it could see coming. A size that
    runs out of memory is recorded and larger ones skipped; a size the model fails at otherwise (a batch a sharded
    program cannot split) is recorded with its error, and the others still run: the latency measured before is never
    lost to a throughput row."""
    results: list[ThroughputResult] = []
    smallest_failed: int | None = None
    for done, batch_size in enumerate(ctx.job.batch_sizes):
        ctx.progress("throughput", done, len(ctx.job.batch_sizes))
        left = deadline.remaining()
        if left <= 0 or (first_call_s is not None and left < first_call_s):
            held = "" if left <= 0 else (f": the {left:.2g} s left could not hold a first call at a new shape (the "
                                         f"last one took {first_call_s:.2g} s)")
            results.append(ThroughputResult(batch_size, error=f"not measured: measure_latency's max_seconds "
                                            f"({options.max_seconds:g} s) was reached{held}"))
            continue
        if smallest_failed is not None and batch_size >= smallest_failed:
            results.append(ThroughputResult(batch_size, error=f"not tried: batch size {smallest_failed} ran out of memory"))
            continue
        try:
            row, warm = measure_throughput(ctx, batch_size, options, timer, deadline)
            results.append(row)
            first_call_s = warm.first_call_seconds or first_call_s
            continue
        except Exception as exc:
            out_of_memory = ctx.backend.is_out_of_memory(exc)
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            error = f"{'out of memory' if out_of_memory else 'failed'}: {type(exc).__name__}: {first_line}"
        if out_of_memory:
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


def drift(samples_ms: tuple[float, ...]) -> float | None:
    """The median of the second half of the samples over that of the first, less 1; None with too few samples."""
    if len(samples_ms) < DRIFT_MIN_SAMPLES:
        return None
    half = len(samples_ms) // 2
    return stats.percentile(samples_ms[half:], 50) / stats.percentile(samples_ms[:half], 50) - 1


def halves_disagree(samples_ms: tuple[float, ...], confidence: float) -> bool:
    """Whether the medians' confidence intervals of the first and the second half of the samples are disjoint: the
    timings changed while they were taken (independent samples of one distribution rarely do that)."""
    if len(samples_ms) < DRIFT_MIN_SAMPLES:
        return False
    half = len(samples_ms) // 2
    first, second = (stats.median_interval(part, confidence) for part in (samples_ms[:half], samples_ms[half:]))
    return first is not None and second is not None and (first[1] < second[0] or second[1] < first[0])


def judge(samples_ms: tuple[float, ...], width: float | None, options: LatencyOptions, warm: WarmUp,
          contention: Contention | None) -> tuple[str, tuple[str, ...]]:
    """The verdict and why it is not "stable": "too_few_samples" without an interval; "noisy" when the interval is
    wider than its target, the spread above the noise threshold, the mean or the p90 further above the median than
    the tail threshold, the two halves' medians' intervals disjoint (drift), the warm-up unsettled, or other work
    competed; otherwise "stable"."""
    confidence = f"{options.interval_confidence:.0%}"
    if width is None:
        return "too_few_samples", (f"{len(samples_ms)} samples give no {confidence} interval of the median",)
    median, mean, target = stats.percentile(samples_ms, 50), stats.mean(samples_ms), options.target_relative_width
    reasons = []
    if width > target:
        reasons.append(f"the median's {confidence} interval spans {width:.1%} of it (target {target:.0%})")
    if (spread := stats.spread(samples_ms)) > options.noise_threshold:
        reasons.append(f"the middle half of the samples spans {spread:.0%} of the median (threshold "
                       f"{options.noise_threshold:.0%})")
    tails = {"mean": mean, **({"p90": stats.percentile(samples_ms, 90)} if stats.claimable(90, len(samples_ms)) else {})}
    for name, value in tails.items():
        if value / median - 1 > options.tail_threshold:
            reasons.append(f"the {name} is {value / median:.3g}x the median (tail threshold "
                           f"{1 + options.tail_threshold:g}x)")
    if halves_disagree(samples_ms, options.interval_confidence):
        reasons.append(f"the second half's median is {drift(samples_ms):+.1%} from the first half's, beyond both "
                       "intervals: the timings were still changing")
    if warm.settled is False:
        reasons.append(f"the warm-up did not settle in {warm.calls} calls ({warm.seconds:.3g} s)")
    if contention is not None and contention.problem:
        reasons.append(f"other work competed: {contention.problem}")
    return ("noisy" if reasons else "stable"), tuple(reasons)


def summarize(sampling: Sampling, warm: WarmUp, options: LatencyOptions, contention: Contention | None = None,
              **measured: Any) -> LatencyResult:
    """Turn samples into the result: every percentile only if claimable, the others listed; the median's interval,
    the verdict with its reasons and the outliers counted (kept in every figure)."""
    samples_ms = tuple(seconds * 1e3 for seconds in sampling.samples_s)
    count = len(samples_ms)
    claimed = {f"p{q}_ms": stats.percentile(samples_ms, q) for q in stats.MIN_SAMPLES if stats.claimable(q, count)}
    spread = stats.spread(samples_ms)
    interval = stats.median_interval(samples_ms, options.interval_confidence)
    width = relative_width(interval, samples_ms)
    verdict, reasons = judge(samples_ms, width, options, warm, contention)
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
        warmup_settled=warm.settled,
        warmup_window_medians_ms=tuple(seconds * 1e3 for seconds in warm.window_medians_s),
        samples_ms=samples_ms if options.keep_samples else None,
        p50_interval_ms=None if interval is None else list(interval),
        interval_confidence=options.interval_confidence,
        interval_method=stats.INTERVAL_METHOD,
        interval_relative_width=width,
        target_relative_width=options.target_relative_width,
        verdict=verdict,
        verdict_reasons=reasons,
        drift=drift(samples_ms),
        contention=contention,
        outliers=stats.outliers(samples_ms),
        outlier_rule=stats.OUTLIER_RULE,
        **claimed,
        **measured,
    )


def measure_latency(ctx: StageContext, meter: ContentionMeter | None = None) -> LatencyResult:
    """Warm up until settled, sample calls of the job's inputs as written with the region's peak memory, then
    throughput per batch size, all within ``max_seconds`` (no call starts after it; the one sample always taken
    excepted). ``meter`` reads what else ran on the machine (default: the real machine and the backend's device)."""
    options = ctx.options("measure_latency") or LatencyOptions()
    backend, device, job = ctx.backend, ctx.job.device, ctx.job
    args, kwargs = ctx.inputs(None)
    call = model_call(backend, ctx.model(), args, kwargs)  # built and placed before anything is timed
    timer = backend.timer(device)
    meter = meter or ContentionMeter(options.contention_threshold, lambda: backend.device_processes(device))
    with backend.inference_context(), gc_paused(collect=False):  # no collection until the stage ends, none before
        deadline = Deadline.after(options.max_seconds)  # building the model is bounded by the stage_timeout only
        meter.start()
        warm = warm_up_for(options, call, lambda: backend.synchronize(device), deadline)
        backend.reset_peak_memory(device)
        sampling = sample_calls(call, timer, options.min_samples, sampling_seconds(options, job.batch_sizes),
                                deadline, interval_is_tight(options) if options.adaptive else None, ctx.progress)
        contention = meter.stop()
        peak = backend.read_peak_memory(device)
        throughput = measure_all_throughput(ctx, options, timer, deadline, warm.first_call_seconds)
    card = ctx.results.get("system_card")
    return summarize(
        sampling,
        warm,
        options,
        contention,
        clock=timer.clock,
        peak_memory=peak,
        threads=backend.thread_settings(),
        throughput=throughput,
        system_summary=card.summary() if card is not None else None,
        precision=job.precision,
        measured_inputs=inputs_text(args, kwargs),
        measured_batch_size=job.model.batch_size(),
    )


@hookimpl(trylast=True)
def rpx_measure_latency(ctx: StageContext) -> LatencyResult:
    return measure_latency(ctx)
