"""Latency statistics checked against numpy (an independent implementation) and MLPerf's sample-count rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpx_core import stats

QS = (0, 1, 25, 50, 75, 90, 95, 99, 100)
KNOWN_SAMPLES = {
    "one": [3.5],
    "two": [1.0, 2.0],
    "ties": [1.0, 1.0, 1.0, 2.0, 2.0, 9.0],
    "unsorted": [5.0, 0.25, 3.0, 7.5, 0.5, 2.0, 11.0],
    "lognormal": list(np.random.default_rng(7).lognormal(mean=0.0, sigma=0.5, size=1000)),
}


@pytest.mark.parametrize("name", KNOWN_SAMPLES)
@pytest.mark.parametrize("q", QS)
def test_percentile_matches_numpy_linear(name, q):
    samples = KNOWN_SAMPLES[name]
    expected = float(np.percentile(samples, q, method="linear"))
    assert stats.percentile(samples, q) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_percentile_by_hand():
    # h = (n - 1) * q = 3 * 0.9 = 2.7 -> x[2] + 0.7 * (x[3] - x[2]) = 3.7 (MLPerf's x[floor(4 * 0.9)] would be 4)
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False), min_size=1, max_size=300),
    st.floats(min_value=0, max_value=100),
)
def test_percentile_matches_numpy_on_any_samples(samples, q):
    expected = float(np.percentile(samples, q))
    assert stats.percentile(samples, q) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_mean_std_iqr_spread_match_numpy():
    samples = KNOWN_SAMPLES["lognormal"]
    p25, p50, p75 = np.percentile(samples, [25, 50, 75])
    assert stats.mean(samples) == pytest.approx(float(np.mean(samples)), rel=1e-12)
    assert stats.std(samples) == pytest.approx(float(np.std(samples)), rel=1e-9)  # population, ddof=0
    assert stats.interquartile_range(samples) == pytest.approx(float(p75 - p25), rel=1e-12)
    assert stats.spread(samples) == pytest.approx(float((p75 - p25) / p50), rel=1e-12)
    assert stats.std([2.0]) == 0.0


@pytest.mark.parametrize(
    ("count", "unclaimed"),
    [
        (1, ("p90", "p95", "p99")),
        (63, ("p90", "p95", "p99")),
        (64, ("p95", "p99")),
        (129, ("p95", "p99")),
        (130, ("p99",)),
        (661, ("p99",)),
        (662, ()),
        (10_000, ()),
    ],
)
def test_sufficiency_follows_mlperf_minimums(count, unclaimed):
    assert stats.unclaimed(count) == unclaimed
    for q in (90, 95, 99):
        assert stats.claimable(q, count) == (f"p{q}" not in unclaimed)
    assert stats.claimable(50, count)


def test_invalid_input_is_refused():
    with pytest.raises(ValueError, match="no samples"):
        stats.percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        stats.percentile([1.0], 101)
    with pytest.raises(ValueError, match="positive median"):
        stats.spread([0.0, 0.0])
