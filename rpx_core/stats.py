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
