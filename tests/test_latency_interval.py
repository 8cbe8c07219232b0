"""The median's confidence interval, adaptive sampling and the verdict, driven by a deterministic noisy clock.

The clock is a Timer whose ``stop()`` returns the next duration of a seeded generator instead of reading time: calls
take 10 ms times a log-normal factor, and some fraction are "descheduled" (an extra 40-140 ms), as on a busy
machine. The distribution's true median follows from its definition (below), so coverage is checked against a
number computed independently of the samples.
"""

from __future__ import annotations

import math
import random
import statistics
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace as NS

import attrs
import pytest
import torch

from rpx_core import stats
from rpx_core.execution.context import Job, StageContext
from rpx_core.registry.backends import MemoryPeak, Timer
from rpx_core.results.records import ModelResult, StageRecord
from rpx_core.results.summary import summarise
from rpx_core.show import units
from rpx_core.spec.schema import InputSpec, ModelSpec
from rpx_core.types.latency import LatencyOptions
from rpx_plugins import latency
from rpx_plugins.contention import ContentionMeter, CpuTimes
from rpx_plugins.stages import BUILTIN_STAGES
from rpx_plugins.stages.latency import interval_text
from rpx_plugins.torch.cpu import CpuBackend
from tests.conftest import console_text

BASE_MS, SIGMA = 10.0, 0.2


class NoisyClock(Timer):
    """Each timed call lasts a drawn duration: BASE_MS * exp(N(0, SIGMA)), plus 40-140 ms with ``p_stall``."""

    clock = "deterministic noisy test clock"

    def __init__(self, seed: int, p_stall: float = 0.1, sigma: float = SIGMA) -> None:
        super().__init__(lambda: None)
        self.random, self.p_stall, self.sigma = random.Random(seed), p_stall, sigma

    def start(self) -> None:
        pass

    def stop(self) -> float:
        ms = BASE_MS * math.exp(self.random.gauss(0.0, self.sigma))
        if self.random.random() < self.p_stall:
            ms += self.random.uniform(40.0, 140.0)
        return ms / 1e3


def true_median_ms(p_stall: float) -> float:
    """Every stall lands above 50 ms (beyond any unstalled call's mass that matters), so the median m solves
    (1 - p_stall) * Phi(ln(m / BASE_MS) / SIGMA) = 1/2."""
    return BASE_MS * math.exp(SIGMA * statistics.NormalDist().inv_cdf(0.5 / (1 - p_stall)))


def exact_coverage(n: int, rank: int) -> Fraction:
    """P(x(rank) <= median <= x(n-1-rank)) for 0-based ranks, exactly: 1 - 2 * P(Binomial(n, 1/2) <= rank)."""
    return 1 - 2 * Fraction(sum(math.comb(n, i) for i in range(rank + 1)), 2**n)


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_interval_ranks_are_the_tightest_with_the_stated_coverage(confidence):
    for n in range(1, 120):
        ranks = stats.median_interval_ranks(n, confidence)
        if ranks is None:  # even [min, max] covers too little
            assert exact_coverage(n, 0) < confidence, n
            continue
        low, high = ranks
        assert high == n - 1 - low
        assert exact_coverage(n, low) >= confidence, n
        assert low + 1 > (n - 1) / 2 or exact_coverage(n, low + 1) < confidence, n  # one rank tighter falls short


def test_known_table_values():
    # Conover's table of the median's 95% interval (1-based ranks): n=10 -> (2, 9), n=100 -> (40, 61)
    assert stats.median_interval_ranks(10, 0.95) == (1, 8)
    assert stats.median_interval_ranks(100, 0.95) == (39, 60)
    assert stats.median_interval_ranks(5, 0.95) is None and stats.median_interval_ranks(6, 0.95) == (0, 5)


def test_outliers_are_counted_by_the_far_out_fences():
    samples = [10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0, 100.0]
    q1, q3 = stats.percentile(samples, 25), stats.percentile(samples, 75)
    expected = sum(1 for x in samples if x < q1 - 3 * (q3 - q1) or x > q3 + 3 * (q3 - q1))
    assert stats.outliers(samples) == expected == 1
    assert stats.outliers([1.0, 2.0, 900.0]) == 0  # no quartiles from 3 samples


def sample(seed: int, options: LatencyOptions, p_stall: float = 0.1, contention=None,
           sigma: float = SIGMA) -> latency.LatencyResult:
    timer = NoisyClock(seed, p_stall, sigma)
    tight = latency.interval_is_tight(options) if options.adaptive else None
    sampling = latency.sample_calls(lambda: None, timer, options.min_samples, 60.0, tight=tight)
    return latency.summarize(sampling, latency.WarmUp(0, 0.0, None), options, contention,
                             clock=timer.clock, peak_memory=MemoryPeak("none"))


def quiet_meter() -> ContentionMeter:
    """A 2-core machine where nothing else runs: between start and stop (1 s), rpx kept one core busy and the machine
    counted just that."""
    busy, own, clock = iter([0.0, 1.0]), iter([0.0, 1.0]), iter([0.0, 1.0])
    return ContentionMeter(0.1, cpu_times=lambda: CpuTimes(next(busy), 0.0, 2.0), own_seconds=lambda: next(own),
                           cores=2, clock=lambda: next(clock), load=lambda: 1.0)


def test_adaptive_sampling_stops_at_the_target_width_and_the_interval_covers_the_true_median():
    options = LatencyOptions(min_samples=20, target_relative_width=0.05)
    truth = true_median_ms(0.1)
    covered = 0
    runs = [sample(seed, options) for seed in range(200)]
    for result in runs:
        low, high = result.p50_interval_ms
        assert result.stopped_by == "target_width"
        # the median is pinned down, but a tenth of the calls stalled: the tail keeps the verdict from "stable"
        assert result.verdict == "noisy" and any(reason.startswith("the mean is") for reason in result.verdict_reasons)
        assert not any("interval spans" in reason for reason in result.verdict_reasons)
        assert (high - low) / result.p50_ms == result.interval_relative_width <= 0.05
        assert result.samples_count > 20  # 20 samples cannot give a 5% interval with this noise
        assert result.outliers > 0 and result.outlier_rule == stats.OUTLIER_RULE  # the stalls are counted ...
        assert result.max_ms > 50  # ... and kept
        covered += low <= truth <= high
    # 95% intervals: 200 runs cover the truth about 190 times (binomial sd ~3); adaptive stopping costs a little
    assert covered >= 180, covered


def test_without_adaptive_sampling_the_count_is_fixed_and_the_verdict_says_noisy():
    result = sample(0, LatencyOptions(min_samples=30, adaptive=False, target_relative_width=0.05))
    assert result.samples_count == 30 and result.stopped_by == "min_samples"
    assert result.verdict == "noisy" and result.interval_relative_width > 0.05


def test_three_noisy_samples_are_too_few_and_the_console_says_so():
    result = sample(3, LatencyOptions(min_samples=3, adaptive=False), p_stall=0.5)
    assert result.samples_count == 3 and result.verdict == "too_few_samples" and result.p50_interval_ms is None
    stages = {stage.name: stage for stage in BUILTIN_STAGES}
    records = {"measure_latency": StageRecord("ok", seconds=0.1, result=result)}
    model = ModelResult("bert", "x:y", "cpu", "cpu", "fp32", "now", stages=records, summary=summarise(records, stages))
    text = console_text(NS(models=[model], run_stages={}))
    assert units.milliseconds(result.p50_ms) in text and "too_few_samples" in text
    assert "bert: latency p50 from 3 samples has no 95% confidence interval: do not trust it" in text


def test_a_stable_result_shows_its_interval_beside_the_p50():
    result = sample(1, LatencyOptions(min_samples=20), p_stall=0.0, sigma=0.02)  # a quiet machine: 2% jitter
    assert result.verdict == "stable" and result.verdict_reasons == ()
    stages = {stage.name: stage for stage in BUILTIN_STAGES}
    records = {"measure_latency": StageRecord("ok", seconds=0.1, result=result)}
    model = ModelResult("m", "x:y", "cpu", "cpu", "fp32", "now", stages=records, summary=summarise(records, stages))
    text = console_text(NS(models=[model], run_stages={}))
    assert interval_text(result) in text and "stable" in text


def test_measure_latency_with_a_real_model_and_the_noisy_clock():
    """The stage end to end on a real torch model, only the clock injected (the machine's own noise must not decide
    the count)."""

    class NoisyCpu(CpuBackend):
        def timer(self, device: str) -> Timer:
            return NoisyClock(7)

    options = LatencyOptions(min_samples=10, warmup_calls=1, warmup_seconds=0.0, throughput_seconds=0.01,
                             throughput_min_calls=1, max_seconds=30.0)
    spec = ModelSpec(name="m", source="tests:handmade", inputs=(InputSpec((1, 8)),))
    job = Job(spec, "cpu", "cpu", "fp32", ("measure_latency",), {"measure_latency": options}, (), (1,))
    ctx = StageContext(job, NoisyCpu(), plugins=None, gpu_catalog=None, model_object=torch.nn.Linear(8, 8))
    result = latency.measure_latency(ctx, meter=quiet_meter())
    assert result.clock == "deterministic noisy test clock"
    assert result.stopped_by == "target_width" and result.verdict == "noisy"
    assert result.contention.problem is None and result.contention.other_cores == 0.0
    # the same samples as the stage-free path above with the same clock (coverage is checked there, over many seeds)
    alone = sample(7, options)
    assert (result.samples_count, result.p50_interval_ms) == (alone.samples_count, alone.p50_interval_ms)
    assert abs(result.p50_ms - true_median_ms(0.1)) < 0.05 * result.p50_ms


def test_a_heavy_tailed_clock_is_noisy_on_the_console_in_the_report_and_to_compare():
    """A tenth of the calls stalled (the median pinned down to 5%, the mean 1.9x it): every surface says "noisy" with
    the reason, and rpx compare calls no change between two such measurements."""
    from rpx_core.api import load_results
    from rpx_core.show import report
    from rpx_core.show.compare import compare
    from tests.conftest import builtin_stages

    result = sample(0, LatencyOptions(min_samples=20))
    assert result.verdict == "noisy" and result.stopped_by == "target_width"
    tail = next(reason for reason in result.verdict_reasons if reason.startswith("the mean is"))
    run = load_results(Path(__file__).parent / "data" / "run_a_results.toml")
    model = run.models[0]
    records = {**model.stages, "measure_latency": attrs.evolve(model.stages["measure_latency"], result=result)}
    stages = {stage.name: stage for stage in BUILTIN_STAGES}
    noisy = attrs.evolve(run, models=(attrs.evolve(model, stages=records, summary=summarise(records, stages)),))
    text = console_text(noisy)
    assert f"{units.milliseconds(result.p50_ms)}~" in text and "noisy" in text and tail in text
    html = report.render([("a", noisy)], builtin_stages())
    assert "noisy" in html and tail in html
    slower = attrs.evolve(noisy, models=(attrs.evolve(noisy.models[0], stages={**records, "measure_latency": attrs.evolve(
        records["measure_latency"], result=attrs.evolve(result, p50_ms=2 * result.p50_ms))}),))
    table = compare([("a", noisy), ("b", slower)], builtin_stages())
    row = next(row for row in table.rows if row[1].text == "latency p50")
    assert row[-1].text == "not comparable: noisy"
