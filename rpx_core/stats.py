"""Summary statistics of latency samples: percentiles, whether there are enough samples to claim them, and spread.

Pure Python (no numpy), so the figures can be checked against numpy independently and loading results stays light.

Percentile convention: linear interpolation between the two nearest order statistics, identical to
``numpy.percentile(samples, q, method="linear")`` (numpy's default): with the sorted samples ``x[0..n-1]`` and
``h = (n - 1) * q / 100``, the percentile is ``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``.
MLPerf LoadGen instead reports the order statistic ``x[floor(n * q / 100)]`` (never interpolated, biased upwards);
rpx does not use it, and states its own method in every result.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

PERCENTILE_METHOD = "numpy.percentile method='linear' (interpolated between the two nearest sorted samples)"

#: The percentiles rpx reports, with the least number of samples needed to claim each. p90/p95/p99 follow MLPerf
#: LoadGen's minimum query counts (64, 130, 662); the median needs only one sample.
MIN_SAMPLES: dict[int, int] = {50: 1, 90: 64, 95: 130, 99: 662}


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) by linear interpolation; see the module docstring."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


def claimable(q: int, samples_count: int) -> bool:
    """Whether ``samples_count`` samples are enough to report the ``q``-th percentile (see :data:`MIN_SAMPLES`)."""
    return samples_count >= MIN_SAMPLES[q]


def unclaimed(samples_count: int) -> tuple[str, ...]:
    """Names ("p99", ...) of the reported percentiles that ``samples_count`` samples cannot claim."""
    return tuple(f"p{q}" for q in MIN_SAMPLES if not claimable(q, samples_count))


def interquartile_range(samples: Sequence[float]) -> float:
    """p75 - p25, both by linear interpolation."""
    return percentile(samples, 75) - percentile(samples, 25)


def spread(samples: Sequence[float]) -> float:
    """Relative dispersion: interquartile range / median (dimensionless; 0.1 means the middle half spans 10%)."""
    median = percentile(samples, 50)
    if median <= 0:
        raise ValueError(f"spread needs a positive median, got {median}")
    return interquartile_range(samples) / median


def mean(samples: Sequence[float]) -> float:
    return statistics.fmean(samples)


def std(samples: Sequence[float]) -> float:
    """Population standard deviation (ddof=0, like ``numpy.std``'s default); 0 for a single sample."""
    return statistics.pstdev(samples)


# -- the median's uncertainty -------------------------------------------------------------------------------------------

INTERVAL_METHOD = (
    "distribution-free order-statistic interval of the median: [x(j), x(n+1-j)] of the sorted samples with the "
    "largest j whose Binomial(n, 1/2) coverage is at least the stated confidence"
)
#: Tukey's "far out" fences: a sample beyond 3 interquartile ranges from the quartiles is an outlier (a descheduled
#: or interrupted call). Outliers are counted and kept in every percentile; they are never dropped.
OUTLIER_FENCE_IQRS = 3.0
OUTLIER_RULE = f"outside [p25 - {OUTLIER_FENCE_IQRS:g} IQR, p75 + {OUTLIER_FENCE_IQRS:g} IQR] (Tukey's far-out fences)"


def median_interval_ranks(count: int, confidence: float) -> tuple[int, int] | None:
    """0-based ranks ``(j, count - 1 - j)`` of the sorted samples bounding the median with at least ``confidence``.

    For any continuous distribution, the number of samples below the true median is Binomial(n, 1/2), so
    P(x(j) <= median <= x(n-1-j)) = 1 - 2 * P(Binomial(n, 1/2) <= j) (0-based ranks). The largest such ``j`` gives
    the shortest symmetric interval. None when even [min, max] covers less than ``confidence`` (n < 6 at 95%).
    Binomial probabilities from ``math.lgamma`` in floating point (exact to ~1e-12, at any n)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    allowed = (1 - confidence) / 2  # the probability each tail may hold
    log_half = count * math.log(2)
    tail, rank = 0.0, -1  # tail = P(Binomial(n, 1/2) <= rank)
    while rank + 1 < count:
        i = rank + 1
        term = math.exp(math.lgamma(count + 1) - math.lgamma(i + 1) - math.lgamma(count - i + 1) - log_half)
        if tail + term > allowed:
            break
        tail += term
        rank = i
    if rank < 0:
        return None
    return rank, count - 1 - rank


def median_interval(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The median's distribution-free confidence interval (see :func:`median_interval_ranks`); None with too few
    samples for ``confidence``."""
    ranks = median_interval_ranks(len(samples), confidence)
    if ranks is None:
        return None
    ordered = sorted(samples)
    return ordered[ranks[0]], ordered[ranks[1]]


def outliers(samples: Sequence[float]) -> int:
    """How many samples lie beyond :data:`OUTLIER_RULE`'s fences (none with fewer than 4 samples: no quartiles)."""
    if len(samples) < 4:
        return 0
    low, high = percentile(samples, 25), percentile(samples, 75)
    reach = OUTLIER_FENCE_IQRS * (high - low)
    return sum(1 for value in samples if value < low - reach or value > high + reach)
