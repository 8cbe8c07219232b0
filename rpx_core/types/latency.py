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
    """The spec's ``[options.measure_latency]`` table. Warm-up ends only when both its count and its time are met."""

    #: Untimed calls before measuring, at every batch size (first calls pay for allocation, compilation, autotuning).
    warmup_calls: int = attrs.field(default=10, validator=_non_negative)
    #: ... and at least this many seconds of them.
    warmup_seconds: float = attrs.field(default=0.5, validator=seconds_validator(allow_zero=True))
    #: Timed batch-1 calls wanted; 662 is MLPerf's minimum to claim p99 (130 for p95, 64 for p90).
    min_samples: int = attrs.field(default=662, validator=_positive)
    #: Seconds the stage may take once the model is built: warm-up, sampling and throughput start no call after it (sampling stops
    #: even if ``min_samples`` is not reached, and the result lists the percentiles it cannot claim; throughput rows
    #: not reached say so). At least one sample is always taken.
    max_seconds: float = attrs.field(default=10.0, validator=seconds_validator())
    #: Timed seconds aimed for per throughput batch size (the call count is set from the warm-up's median call time).
    throughput_seconds: float = attrs.field(default=1.0, validator=seconds_validator())
    #: ... but never fewer calls than this.
    throughput_min_calls: int = attrs.field(default=10, validator=_positive)
    #: Write every latency sample (ms) to the results.
    keep_samples: bool = False
    #: Spread (IQR / median) above which the result carries a noisy-machine warning.
    noise_threshold: float = attrs.field(default=0.1, validator=_positive)
    #: The median's confidence interval counts as tight when (high - low) / p50 is at most this: the verdict is
    #: "stable" then, else "noisy".
    target_relative_width: float = attrs.field(default=0.05, validator=_positive)
    #: Confidence of the median's interval (distribution-free, from order statistics; see rpx_core.stats).
    interval_confidence: float = attrs.field(default=0.95, validator=[_positive, attrs.validators.lt(1)])
    #: Keep sampling past ``min_samples`` until the interval is tight or the sampling's share of ``max_seconds``
    #: passed (all of it, or half when throughput batch sizes are to be measured too); false: stop at
    #: ``min_samples`` whatever the interval (the verdict still says how tight it is).
    adaptive: bool = True


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


@attrs.frozen
class LatencyResult:
    """Per-call latency at batch 1 (``measured_batch_size``), throughput per batch size, and peak memory.

    Percentiles use linear interpolation (``numpy.percentile method='linear'``), not MLPerf's floor(n*p) order
    statistic; a percentile is reported only with enough samples to claim it (64 for p90, 130 for p95, 662 for p99).
    """

    percentile_method: str
    clock: str  # how each call was timed ("perf_counter", "cuda events", ...), synchronised on both ends
    samples_count: int  # timed batch-1 calls
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
    warmup_calls: int  # untimed batch-1 calls actually made before sampling
    warmup_seconds: float  # host wall time they took
    peak_memory: MemoryPeak  # peak of the timed batch-1 region (after warm-up), as the backend measures it
    p90_ms: float | None = None  # None when fewer than 64 samples
    p95_ms: float | None = None  # None when fewer than 130 samples
    p99_ms: float | None = None  # None when fewer than 662 samples
    unclaimed_percentiles: tuple[str, ...] = ()  # e.g. ("p99",): too few samples to claim them
    noisy_warning: str | None = None  # set when spread exceeds the noise threshold
    threads: dict[str, int] = attrs.Factory(dict)  # runtime thread settings in effect (e.g. torch intra/inter-op)
    throughput: tuple[ThroughputResult, ...] = ()  # one per batch size of the job, in the job's order
    samples_ms: tuple[float, ...] | None = None  # every sample in order, when keep_samples = true
    measured_batch_size: int = 1  # latency is always per call at batch 1
    system_summary: str | None = None  # the system card's one-line summary, when system_card ran
    #: [low, high] of the median's distribution-free confidence interval (ms); None with too few samples for one.
    #: Results written before rpx recorded it lack it, and the fields below, too.
    p50_interval_ms: list[float] | None = None
    interval_confidence: float = 0.95
    interval_method: str | None = None
    #: (high - low) / p50 of the interval; None without one.
    interval_relative_width: float | None = None
    target_relative_width: float | None = None
    #: "stable" (interval within target_relative_width), "noisy" (wider), "too_few_samples" (no interval at the
    #: confidence: fewer than 6 samples at 95%).
    verdict: str | None = None
    outliers: int | None = None  # samples beyond outlier_rule's fences: counted, and kept in every figure above
    outlier_rule: str | None = None
