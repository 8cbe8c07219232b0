"""Tier 3 types: what ``measure_latency`` is asked to do (options) and what it measured (results).

Every time is milliseconds (suffix ``_ms``) or seconds (suffix ``_seconds``/``seconds``) of the backend's clock; every
percentile uses the method named in ``percentile_method`` (see :mod:`rpx_core.stats`). Figures that could not be
claimed are absent (None, dropped from TOML) and listed, never zero.
"""

from __future__ import annotations

import attrs

from rpx_core.registry.backends import MemoryPeak
from rpx_core.spec.limits import seconds_validator

_positive = attrs.validators.gt(0)
_non_negative = attrs.validators.ge(0)


@attrs.frozen
class LatencyOptions:
    """The spec's ``[options.measure_latency]`` table.

    Warm-up ends when the timings settle: untimed calls in windows, each twice the calls of the one before, until the
    medians of two consecutive windows agree within ``warmup_tolerance`` (and the minimums below are met), or
    ``warmup_max_seconds`` passed (the result then says it did not settle)."""

    #: Warm-up calls made at least, at every batch size (first calls pay for allocation, compilation, autotuning).
    warmup_calls: int = attrs.field(default=1, validator=_non_negative)
    #: ... and at least this many seconds of them.
    warmup_seconds: float = attrs.field(default=0.0, validator=seconds_validator(allow_zero=True))
    #: Settled: the medians of the last two warm-up windows differ by at most this fraction of the last.
    warmup_tolerance: float = attrs.field(default=0.05, validator=_positive)
    #: The most seconds warm-up may take after its first call (which pays for compilation, however long) before
    #: sampling starts anyway; default a quarter of ``max_seconds``.
    warmup_max_seconds: float | None = attrs.field(default=None, validator=attrs.validators.optional(
        seconds_validator(allow_zero=True)))
    #: Timed calls wanted; 662 is MLPerf's minimum to claim p99 (130 for p95, 64 for p90).
    min_samples: int = attrs.field(default=662, validator=_positive)
    #: Seconds the stage may take once the model is built: warm-up, sampling and throughput start no call after it
    #: (sampling stops even if ``min_samples`` is not reached, and the result lists the percentiles it cannot claim;
    #: throughput rows cut short or not reached say so). At least one sample is always taken, so the stage ends
    #: within max_seconds plus one call plus rpx's own bookkeeping (:data:`OVERRUN_SLACK_SECONDS`).
    max_seconds: float = attrs.field(default=10.0, validator=seconds_validator())
    #: Timed seconds aimed for per throughput batch size (the call count is set from the warm-up's median call time).
    throughput_seconds: float = attrs.field(default=1.0, validator=seconds_validator())
    #: ... but never fewer calls than this.
    throughput_min_calls: int = attrs.field(default=10, validator=_positive)
    #: Write every latency sample (ms) to the results.
    keep_samples: bool = False
    #: Spread (IQR / median) above which the result carries a noisy-machine warning and is not "stable".
    noise_threshold: float = attrs.field(default=0.1, validator=_positive)
    #: The tail is moderate when the mean and the p90 (once claimable) exceed the p50 by at most this fraction.
    tail_threshold: float = attrs.field(default=0.5, validator=_positive)
    #: The median's confidence interval counts as tight when (high - low) / p50 is at most this; the medians of the
    #: first and second half of the samples must not drift apart (their own intervals must overlap).
    target_relative_width: float = attrs.field(default=0.05, validator=_positive)
    #: Other processes competed for the cores when, while rpx sampled, they used more than this share of the
    #: machine's cores and, with rpx's own use, more than 90% of them (or the hypervisor stole more than 2%).
    contention_threshold: float = attrs.field(default=0.1, validator=_positive)
    #: Confidence of the median's interval (distribution-free, from order statistics; see rpx_core.stats).
    interval_confidence: float = attrs.field(default=0.95, validator=[_positive, attrs.validators.lt(1)])
    #: Keep sampling past ``min_samples`` until the interval is tight or the sampling's share of ``max_seconds``
    #: passed (all of it, or half when throughput batch sizes are to be measured too); false: stop at
    #: ``min_samples`` whatever the interval (the verdict still says how tight it is).
    adaptive: bool = True


#: What the stage may overrun ``max_seconds`` by, beyond its one longest call: rpx's own work after the last call
#: starts (a garbage collection, peak-memory read-outs, the summary). bench/bench_latency_limits.py measures it under
#: four busy background processes.
OVERRUN_SLACK_SECONDS = 0.5


@attrs.frozen
class Contention:
    """Whether other work competed with rpx while it sampled: CPU time the rest of the machine used (from
    ``/proc/stat``, less rpx's own process time), time the hypervisor stole, and other processes on the device.

    Figures are averages over the sampling region in cores (1.0 = one core busy all the time); None where the
    platform does not say. ``problem`` names what competed, None when nothing did (or nothing could be read)."""

    method: str
    cores: int | None = None  # logical CPUs of the machine
    seconds: float | None = None  # wall time of the region the figures average over
    own_cores: float | None = None  # rpx's process (all its threads)
    other_cores: float | None = None  # every other process of the machine
    steal_share: float | None = None  # share of CPU time the hypervisor gave to other virtual machines
    load_average: float | None = None  # the 1-minute load average at the region's end
    device_processes: tuple[str, ...] | None = None  # other processes on the measured device ("pid name"); None: unknown
    problem: str | None = None


@attrs.frozen
class ThroughputResult:
    """Samples per second at one batch size: ``calls`` back-to-back calls timed as one region (one synchronisation at
    the end), so asynchronous devices overlap calls as they would in a serving loop. Not a latency."""

    batch_size: int
    calls: int | None = None  # timed calls (after warm-up); None when this batch size could not run
    seconds: float | None = None  # elapsed seconds of the whole region, backend clock
    samples_per_s: float | None = None  # calls * batch_size / seconds
    peak_memory: MemoryPeak | None = None  # peak of the timed region at this batch size
    error: str | None = None  # why there is no figure (e.g. out of memory)
    #: Backends that dispatch asynchronously (JAX): ``calls`` dispatched back to back without waiting for each, one
    #: wait on the last outputs at the end, so host dispatch overlaps device work as in a serving loop; the figures
    #: above block on every call. None for synchronous backends.
    pipelined_seconds: float | None = None
    pipelined_samples_per_s: float | None = None
    #: Set when max_seconds cut the row short: what was skipped and why (the figures above are for the calls made).
    cut_short: str | None = None
    warmup_calls: int | None = None  # untimed calls at this batch size before the timed ones
    warmup_settled: bool | None = None  # whether that warm-up settled (see LatencyOptions)


@attrs.frozen
class LatencyResult:
    """Per-call latency of the job's inputs as written (``measured_inputs``), throughput per batch size, and peak
    memory.

    Percentiles use linear interpolation (``numpy.percentile method='linear'``), not MLPerf's floor(n*p) order
    statistic; a percentile is reported only with enough samples to claim it (64 for p90, 130 for p95, 662 for p99).
    """

    percentile_method: str
    clock: str  # how each call was timed ("perf_counter", "cuda events", ...), synchronised on both ends
    samples_count: int  # timed calls
    sampling_seconds: float  # host wall time spent taking them
    #: "target_width" (min_samples taken and the median's interval tight), "min_samples" (adaptive = false) or
    #: "max_seconds" (time cap reached first)
    stopped_by: str
    p50_ms: float  # median of the per-call samples
    mean_ms: float
    std_ms: float  # population standard deviation (ddof=0)
    min_ms: float
    max_ms: float
    iqr_ms: float  # p75 - p25, linear interpolation
    spread: float  # iqr_ms / p50_ms (dimensionless)
    warmup_calls: int  # untimed calls actually made before sampling
    warmup_seconds: float  # host wall time they took
    peak_memory: MemoryPeak  # peak of the timed region (after warm-up), as the backend measures it
    p90_ms: float | None = None  # None when fewer than 64 samples
    p95_ms: float | None = None  # None when fewer than 130 samples
    p99_ms: float | None = None  # None when fewer than 662 samples
    unclaimed_percentiles: tuple[str, ...] = ()  # e.g. ("p99",): too few samples to claim them
    noisy_warning: str | None = None  # set when spread exceeds the noise threshold
    threads: dict[str, int] = attrs.Factory(dict)  # runtime thread settings in effect (e.g. torch intra/inter-op)
    throughput: tuple[ThroughputResult, ...] = ()  # one per batch size of the job, in the job's order
    samples_ms: tuple[float, ...] | None = None  # every sample in order, when keep_samples = true
    #: The batch size of the measured call (its inputs' batch dimension as written); None when no input has one.
    #: Results written before rpx measured the job's own inputs say 1: they were measured at batch 1.
    measured_batch_size: int | None = None
    system_summary: str | None = None  # the system card's one-line summary, when system_card ran
    #: [low, high] of the median's distribution-free confidence interval (ms); None with too few samples for one.
    #: Results written before rpx recorded it lack it, and the fields below, too.
    p50_interval_ms: list[float] | None = None
    interval_confidence: float = 0.95
    interval_method: str | None = None
    #: (high - low) / p50 of the interval; None without one.
    interval_relative_width: float | None = None
    target_relative_width: float | None = None
    #: "stable": the interval is within target_relative_width, the spread, the tail and the drift are moderate, the
    #: warm-up settled and no other work competed; "noisy": any of those failed (``verdict_reasons`` says which);
    #: "too_few_samples": no interval at the confidence (fewer than 6 samples at 95%).
    verdict: str | None = None
    outliers: int | None = None  # samples beyond outlier_rule's fences: counted, and kept in every figure above
    outlier_rule: str | None = None
    #: Why the verdict is not "stable", one reason each (empty when it is).
    verdict_reasons: tuple[str, ...] = ()
    #: The precision the model ran at, and each input of the measured call as "float32[1,3,224,224]"
    #: (positional, then "name=..." for keyword inputs): the same normal form as count_flops' counted_inputs.
    precision: str | None = None
    measured_inputs: tuple[str, ...] = ()
    #: The median of the second half of the samples / that of the first half, less 1: timings still changing.
    drift: float | None = None
    warmup_settled: bool | None = None  # whether the warm-up's timings settled before sampling started
    warmup_window_medians_ms: tuple[float, ...] = ()  # the median of each warm-up window, in order
    contention: Contention | None = None  # other work on the machine while sampling


@attrs.frozen
class Efficiency:
    """The measured p50 against the roofline bound of the GPU it ran on, at its precision, for the same work.

    ``fraction`` = bound / measured, in (0, 1] (1.0: at the roofline). It is None, with ``problem`` saying why, when
    the two figures do not describe the same call (inputs, precision, a counted backward pass) or when the fraction
    would exceed 1: a measured time below the bound means one of its inputs is wrong, and ``problem`` says which."""

    gpu: str
    precision: str
    bound_ms: float
    measured_ms: float
    fraction: float | None = None
    problem: str | None = None
