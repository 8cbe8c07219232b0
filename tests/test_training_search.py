"""train_batch_search: the largest training micro-batch under a memory budget, trials placed by the predicted step
memory; against a direct bisection of real steps on the same model, budget and measurement
(``tests/training_search_check.py``, run in a process of its own: the host allocator's setting stays there)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rpx_core.types.training import TrainBatchSearchOptions
from rpx_plugins.training.search import Line, Outcome, Prediction, Search
from tests.conftest import REPO


@pytest.mark.slow
def test_the_largest_batch_is_within_5_percent_of_a_direct_bisection_in_8_trials_or_fewer():
    done = subprocess.run([sys.executable, "-m", "tests.training_search_check", "32"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["largest"] == pytest.approx(found["direct"], rel=0.05), found
    assert found["trials"] <= 8 < found["direct_trials"], found
    assert found["best"] is not None


class Curve:
    """A step whose whole peak is ``base + per_sample x batch`` bytes, over budget beyond ``usable``."""

    def __init__(self, base: int, per_sample: int) -> None:
        self.base, self.per_sample, self.tried = base, per_sample, []

    def __call__(self, batch: int) -> Outcome:
        from rpx_core.plugin import MemoryPeak

        self.tried.append(batch)
        return Outcome(MemoryPeak("test", peak_bytes=self.base + self.per_sample * batch), samples_per_s=float(batch))


def search_on(curve: Curve, predicted: Prediction, usable: int, **options) -> Search:
    from rpx_plugins.training.search import run_search

    search = Search(predicted, 0, usable, TrainBatchSearchOptions(**options))
    run_search(search, curve, lambda *_: None)
    return search


def test_an_exact_prediction_finds_the_limit_in_two_trials_then_probes_for_throughput():
    curve = Curve(100_000_000, 10_000)  # the limit of 1_000_000_000 usable bytes: batch 90_000
    exact = Prediction(Line(100_000_000, 0), (Line(0, 10_000),))
    search = search_on(curve, exact, 1_000_000_000, max_batch=10**6)
    assert curve.tried[:2] == [89_100, 90_000]  # 1% of the room kept free, then the corrected line's limit
    assert search.largest_fitting == 90_000 and curve.tried[2] == 94_500  # + 5%: fails, and the search stops
    assert curve.tried[3:] == [45_000, 22_500]  # half and a quarter of the largest, for samples/s


def test_a_prediction_a_third_low_is_corrected_by_the_first_reading():
    curve = Curve(100_000_000, 15_000)  # limit 60_000
    low = Prediction(Line(100_000_000, 0), (Line(0, 10_000),))
    search = search_on(curve, low, 1_000_000_000, max_batch=10**6, max_trials=8)
    assert search.largest_fitting == pytest.approx(60_000, rel=0.05)
    assert len(search.trials) <= 8


def test_the_highest_phase_line_makes_the_peak():
    """At small batches the optimiser's temporaries top the activations, at large ones the reverse."""
    prediction = Prediction(Line(1000, 10), (Line(0, 100), Line(50_000, 1)))  # forward/backward, optimizer
    assert prediction.at(10) == 1000 + 100 + 50_000 + 10
    assert prediction.at(10_000) == 1000 + 100_000 + 1_000_000
    assert prediction.largest_within(1_000_000) == min((1_000_000 - 1000) // 110, (1_000_000 - 51_000) // 11)


def test_batch_1_over_budget_ends_the_search():
    curve = Curve(2_000_000_000, 10)
    search = search_on(curve, Prediction(Line(0, 0), (Line(0, 10),)), 1_000_000_000)
    assert search.largest_fitting is None and search.stopped_by == "batch 1 does not fit"


def test_a_reading_just_over_the_budget_moves_the_next_trial_half_the_resolution_down():
    """At the budget's edge a reading's noise decides: the line through it would place the next trial just over
    again; the search steps half its resolution below the failure instead, and that fitting trial ends it."""
    curve = Curve(100_000_000, 10_000)
    curve.base += 10_000_000  # readings 10 MB above the prediction: the first trial (1% of the room kept) fails
    exact = Prediction(Line(100_000_000, 0), (Line(0, 10_000),))
    search = search_on(curve, exact, 1_000_000_000, max_batch=10**6)
    first = curve.tried[0]
    assert not search.trials[0].fits
    assert curve.tried[1] == int(first * (1 - 0.05 / 2)) and search.trials[1].fits
    assert search.largest_fitting == curve.tried[1] and len(search.trials) == 4  # then the two probes
