"""The batch planner on synthetic memory and throughput curves (no timing, no device): it must find what a direct
scan finds, in few trials, never re-test a failing or dominated combination, and fix the seed tracker's failures."""

from __future__ import annotations

import itertools
import threading
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpx_core.convert import structure
from rpx_core.errors import SpecError
from rpx_core.registry.backends import MemoryPeak
from rpx_core.types.batch_search import (
    BatchSearchOptions,
    BatchSearchResult,
    BatchTracker,
    format_table,
    parse_memory_amount,
)
from rpx_plugins.batch_search.planner import BatchPlanner, fit_linear

MB = 10**6
StageUsed = Callable[[int, int], int]  # (stage, batch) -> bytes used while that stage runs alone
Rate = Callable[[int, int], float]  # (stage, batch) -> raw samples per second


def simulate(planner: BatchPlanner, used: Callable, rate: Rate, hard_limit: int | None = None) -> BatchSearchResult:
    """Run the planner against synthetic curves. Sequential: ``used(stage, batch)``; concurrent: ``used(sizes)``.
    Above ``hard_limit`` a run is out of memory with no reading (as under an enforced CUDA budget). Checks on every
    step that no combination repeats and none is at or above an earlier failure."""
    tracker = BatchTracker(planner.fan_outs, planner.usable_bytes)
    while (sizes := planner.next_combination(tracker.trials)) is not None:
        assert len(tracker.trials) < 300, "the search does not end"
        assert all(1 <= size <= planner.max_batch for size in sizes)
        for trial in tracker.trials:
            assert sizes != trial.batch_sizes, f"{sizes} ran before"
            if not trial.ok:
                dominated = all(a >= b for a, b in zip(sizes, trial.batch_sizes))
                assert not dominated, f"{sizes} is dominated by failed {trial.batch_sizes}"
        tracker.begin_trial(sizes)
        if planner.concurrent:
            total = used(sizes)
            if hard_limit is not None and total > hard_limit:
                tracker.record_stage(0, failure="oom", error="SyntheticOOM: over the hard limit")
                tracker.end_trial(seconds=1.0)
                continue
            for stage, size in enumerate(sizes):
                tracker.record_stage(stage, calls=10, seconds=10 * size / rate(stage, size))
            tracker.end_trial(seconds=1.0, peak=MemoryPeak("synthetic", peak_bytes=total))
            continue
        for stage, size in enumerate(sizes):
            amount = used(stage, size)
            if hard_limit is not None and amount > hard_limit:
                tracker.record_stage(stage, failure="oom", error="SyntheticOOM: over the hard limit")
            else:
                peak = MemoryPeak("synthetic", peak_bytes=amount)
                tracker.record_stage(stage, calls=10, seconds=10 * size / rate(stage, size), peak=peak)
        tracker.end_trial(seconds=1.0)
    return planner.result(
        tracker.trials, budget_bytes=planner.usable_bytes, safety_margin_bytes=0, budget_enforced=False,
        memory_method="synthetic",
    )


def planner(usable: int, stages: int = 1, **kwargs) -> BatchPlanner:
    names = tuple(f"s{index}" for index in range(stages))
    defaults = dict(max_batch=256, gain_threshold=0.0, resolution=0.0, fan_outs=(1.0,) * stages)
    return BatchPlanner(names=names, usable_bytes=usable, **{**defaults, **kwargs})


def scan(used_at: Callable[[int], int], usable: int, max_batch: int) -> int | None:
    """Largest batch that fits, by trying every size (memory is monotone, so stop at the first failure)."""
    fitting = None
    for size in range(1, max_batch + 1):
        if used_at(size) > usable:
            break
        fitting = size
    return fitting


def overhead_rate(stage: int, size: int) -> float:
    """Per-call time 10 ms + 1 ms per sample: frames/s keep rising with batch size (no plateau)."""
    return size / (0.010 + 0.001 * size)


# -- finding the memory limit ------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(100 * MB, 2000 * MB),
    slope=st.integers(1 * MB, 300 * MB),
    limit=st.integers(1, 400),
    frac=st.floats(0.05, 0.95),
    max_batch=st.integers(1, 256),
)
def test_linear_memory_exact_limit_in_few_trials(base, slope, limit, frac, max_batch):
    usable = int(base + slope * (limit + frac))
    result = simulate(planner(usable, max_batch=max_batch), lambda _, b: base + slope * b, overhead_rate)
    expected = scan(lambda b: base + slope * b, usable, max_batch)
    assert result.stages[0].largest_fitting_batch == expected
    assert result.chosen_batch_sizes == (expected,)  # frames/s rise with size, so the largest is the best
    assert result.trial_count <= 5


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(100 * MB, 1000 * MB),
    slope=st.integers(1 * MB, 100 * MB),
    curve=st.integers(0, 2 * MB),
    step_at=st.integers(1, 300),
    step=st.integers(0, 500 * MB),
    budget=st.integers(200 * MB, 20_000 * MB),
    hard=st.booleans(),
)
def test_monotone_nonlinear_memory_matches_direct_scan(base, slope, curve, step_at, step, budget, hard):
    """Convex curves and steps break the line: the planner must still land exactly where a direct scan does."""

    def used_at(size: int) -> int:
        return base + slope * size + curve * size * size // 10 + (step if size >= step_at else 0)

    result = simulate(planner(budget), lambda _, b: used_at(b), overhead_rate, hard_limit=budget if hard else None)
    expected = scan(used_at, budget, 256)
    assert result.stages[0].largest_fitting_batch == expected
    assert result.feasible == (expected is not None)
    assert result.trial_count <= 20


def test_resolution_stops_refining_within_the_fraction():
    base, slope, true_max = 500 * MB, 1 * MB, 200

    def used_at(size: int) -> int:  # a convex bump after 120 makes the line over-predict
        return base + slope * size + (size > 120) * (size - 120) ** 2 * 20_000

    usable = used_at(true_max)
    result = simulate(planner(usable, resolution=0.05), lambda _, b: used_at(b), overhead_rate, hard_limit=usable)
    exact = scan(used_at, usable, 256)
    found = result.stages[0].largest_fitting_batch
    assert exact == true_max
    assert exact / 1.05 <= found <= exact


def test_fit_recovers_the_line_and_shares_the_baseline():
    single = fit_linear([(1,), (2,), (4,)], [110, 120, 140])
    assert single.intercept == pytest.approx(100) and single.slopes == (pytest.approx(10),)
    rows = [(1, 1), (2, 1), (4, 1), (4, 2), (4, 4)]
    shared = fit_linear(rows, [1000 + 30 * a + 7 * b for a, b in rows])
    assert shared.intercept == pytest.approx(1000) and shared.slopes == (pytest.approx(30), pytest.approx(7))
    assert fit_linear([(2, 1), (2, 1)], [5, 5]) is None  # one distinct point: no line
    constant_column = fit_linear([(1, 3), (2, 3)], [10, 20])
    assert constant_column.slopes[1] is None  # a stage whose size never varied has no slope of its own


# -- the seed tracker's failure cases ----------------------------------------------------------------------------------


def test_batch_one_not_fitting_is_reported_not_a_crash():
    usable = 1000 * MB
    sizes = {0: (200 * MB, 10 * MB), 1: (1200 * MB, 10 * MB)}  # stage 1 ("s1") needs 1210 MB at batch 1
    p = planner(usable, stages=2)
    result = simulate(p, lambda stage, b: sizes[stage][0] + sizes[stage][1] * b, overhead_rate)
    assert result.trial_count == 1 and not result.feasible
    assert result.chosen_batch_sizes is None and result.last_failed
    assert "stage 's1' does not fit at batch 1: 1210 MB used, over the usable 1000 MB" in result.reason
    assert result.stages[1].stopped_by == "infeasible"
    assert p.exhausted(result.trials)


def test_batch_one_out_of_memory_under_a_hard_limit_names_the_error():
    p = planner(1000 * MB, concurrent=True, stages=2)
    result = simulate(p, lambda sizes: 2000 * MB, overhead_rate, hard_limit=1000 * MB)
    assert not result.feasible and result.trial_count == 1
    assert "the stages together ran out of memory at batch 1" in result.reason and "SyntheticOOM" in result.reason


def test_one_stage_limit_does_not_end_the_others_search():
    usable = 2000 * MB
    curves = {0: (1700 * MB, 100 * MB), 1: (1000 * MB, 25 * MB)}  # limits: stage 0 at 3, stage 1 at 40
    result = simulate(planner(usable, stages=2), lambda s, b: curves[s][0] + curves[s][1] * b, overhead_rate)
    assert [stage.largest_fitting_batch for stage in result.stages] == [3, 40]
    assert result.chosen_batch_sizes == (3, 40)
    assert result.trial_count <= 7  # the seed needs about 17 for two stages


def test_throughput_plateau_stops_growing():
    def flat(stage: int, size: int) -> float:  # the per-sample cost dominates from batch 1
        return 1000.0 * size / (size + 0.02)

    def used(stage: int, size: int) -> int:  # room for 190
        return 100 * MB + 10 * MB * size

    stopping = simulate(planner(2000 * MB, gain_threshold=0.05), used, flat)
    # calibration (1, 2, 4) never declares a plateau; the fitted limit (190) gained under 5% over 4 (a 4x span);
    # a peak could hide inside that jump, so its geometric midpoint (28) is looked at once
    assert [trial.batch_sizes for trial in stopping.trials] == [(1,), (2,), (4,), (190,), (28,)]
    assert stopping.stages[0].stopped_by == "plateau"
    exhaustive = simulate(planner(2000 * MB, gain_threshold=0.0), used, flat)
    assert exhaustive.stages[0].largest_fitting_batch == 190
    rising = simulate(planner(2000 * MB, gain_threshold=0.05), used, overhead_rate)
    assert rising.stages[0].largest_fitting_batch == 190  # gains above 5% per doubling keep it growing


def test_confirms_the_combination_of_per_stage_bests_once():
    """Stage 0 is fastest at small sizes and slower at large ones (cache effects); stage 1 keeps improving up to its
    limit. Their best sizes come from different trials, so the pair is run once more, as the last trial (a
    memory-only search: gain_threshold 0 does no refining; with it, see test_batch_best)."""

    def peaked(stage: int, size: int) -> float:
        return 100.0 * size / (1 + 0.02 * abs(size - 8) * size) if stage == 0 else overhead_rate(stage, size)

    curves = {0: (100 * MB, 10 * MB), 1: (100 * MB, 20 * MB)}
    result = simulate(planner(1000 * MB, stages=2), lambda s, b: curves[s][0] + curves[s][1] * b, peaked)
    tried = {trial.batch_sizes[0] for trial in result.trials}
    assert result.chosen_batch_sizes == (max(tried, key=lambda size: peaked(0, size)), 45)
    assert result.trials[-1].batch_sizes == result.chosen_batch_sizes
    assert result.chosen_batch_sizes not in [trial.batch_sizes for trial in result.trials[:-1]]
    refined = simulate(planner(1000 * MB, stages=2, gain_threshold=0.05),
                       lambda s, b: curves[s][0] + curves[s][1] * b, peaked)
    assert [trial.batch_sizes for trial in refined.trials].count(refined.chosen_batch_sizes) == 1
    assert peaked(0, refined.chosen_batch_sizes[0]) >= 0.9 * max(peaked(0, size) for size in range(1, 91))


# -- concurrent stages share the budget --------------------------------------------------------------------------------


@pytest.mark.parametrize("fan_out", [1.0, 3.0])
@pytest.mark.parametrize("usable", [1100 * MB, 2000 * MB, 3000 * MB])
@pytest.mark.parametrize("hard", [False, True])
def test_concurrent_stages_share_the_budget_close_to_the_best_combination(fan_out, usable, hard):
    """Checked against a brute-force search over every combination (the budget is tight at 1100 MB: the
    bottleneck-first growth overshoots there and the rebalancing step must give memory back)."""
    base, slopes, max_batch = 800 * MB, (30 * MB, 12 * MB), 64
    per_call = ((0.020, 0.004), (0.004, 0.002))  # fixed and per-sample seconds per call

    def rate(stage: int, size: int) -> float:
        fixed, per_sample = per_call[stage]
        return size / (fixed + per_sample * size)

    def used(sizes) -> int:
        return base + sum(slope * size for slope, size in zip(slopes, sizes))

    p = planner(usable, stages=2, concurrent=True, max_batch=max_batch, fan_outs=(fan_out, 1.0), gain_threshold=0.05)
    result = simulate(p, used, rate, hard_limit=usable if hard else None)
    best = max(
        (min(rate(0, a), rate(1, b) / fan_out) for a, b in itertools.product(range(1, max_batch + 1), repeat=2)
         if used((a, b)) <= usable)
    )  # fmt: skip
    assert used(result.chosen_batch_sizes) <= usable
    assert result.frames_per_second >= 0.97 * best
    assert result.trial_count <= 12
    assert result.stages[0].memory_fit.slope_bytes_per_sample == pytest.approx(slopes[0])
    # The baseline is counted once; a stage whose size never varied is part of it at that size.
    constant = [stage for stage in (0, 1) if len({t.batch_sizes[stage] for t in result.trials if t.used_bytes}) == 1]
    expected_intercept = base + sum(slopes[stage] * result.trials[0].batch_sizes[stage] for stage in constant)
    assert result.stages[0].memory_fit.intercept_bytes == pytest.approx(expected_intercept)


# -- tracking, fan-out, the seed's queries -----------------------------------------------------------------------------


def test_fan_out_adjusts_downstream_throughput_to_frames():
    tracker = BatchTracker(fan_outs=(2.0, 3.0, 1.0), usable_bytes=10**12)
    tracker.begin_trial((4, 8, 16))
    for stage, (calls, seconds) in enumerate([(10, 2.0), (5, 1.0), (3, 0.5)]):
        tracker.record_stage(stage, calls=calls, seconds=seconds, peak=MemoryPeak("synthetic", peak_bytes=100 + stage))
    trial = tracker.end_trial(seconds=4.0)
    raw = [10 * 4 / 2.0, 5 * 8 / 1.0, 3 * 16 / 0.5]
    assert [s.samples_per_second for s in trial.stages] == pytest.approx(raw)
    assert [s.frames_per_second for s in trial.stages] == pytest.approx([raw[0], raw[1] / 2, raw[2] / 6])
    assert trial.frames_per_second == pytest.approx(min(raw[0], raw[1] / 2, raw[2] / 6))
    assert trial.used_bytes == 102 and trial.ok


def test_over_budget_and_outside_allocator_memory_count_as_failure():
    tracker = BatchTracker(fan_outs=(1.0,), usable_bytes=1000)
    tracker.begin_trial((2,))
    peak = MemoryPeak("synthetic", peak_bytes=600, reserved_bytes=800, outside_allocator_bytes=300)
    tracker.record_stage(0, calls=1, seconds=1.0, peak=peak)
    trial = tracker.end_trial(seconds=1.0)
    assert trial.used_bytes == 1100 and trial.failure == "over_budget" and trial.frames_per_second is None
    assert trial.stages[0].samples_per_second is None and tracker.last_failed


def test_record_stage_is_thread_safe():
    stages = 16
    tracker = BatchTracker(fan_outs=(1.0,) * stages, usable_bytes=10**12)
    tracker.begin_trial((1,) * stages)
    start = threading.Barrier(stages)

    def report(stage: int) -> None:
        start.wait()
        tracker.record_stage(stage, calls=stage + 1, seconds=1.0)

    threads = [threading.Thread(target=report, args=(stage,)) for stage in range(stages)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trial = tracker.end_trial(seconds=1.0, peak=MemoryPeak("synthetic", peak_bytes=1))
    assert [s.calls for s in trial.stages] == list(range(1, stages + 1))


def test_seed_queries_on_the_result():
    def used(stage: int, size: int) -> int:  # stage 1 jumps by 200 MB from batch 8: the line's prediction misses
        return 100 * MB + (10 * MB * size if stage == 0 else 40 * MB * size + 200 * MB * (size >= 8))

    p = planner(500 * MB, stages=2, fan_outs=(2.0, 1.0), max_batch=16)
    result = simulate(p, used, overhead_rate)
    ok = [t for t in result.trials if t.ok]
    assert result.batch_sizes == [t.batch_sizes for t in ok]
    assert result.samples() == [[s.samples_per_second for s in t.stages] for t in ok]
    assert result.samples(0, adjusted=True) == [ok[0].stages[0].frames_per_second, ok[0].stages[1].frames_per_second]
    assert result.samples(0, adjusted=True)[1] == pytest.approx(result.samples(0)[1] / 2.0)
    assert result.samples_stats("min", 1, adjusted=True) == min(result.samples(1, adjusted=True))
    assert result.samples_stats("mean") == [sum(row) / 2 for row in result.samples()]
    assert result.memory_peaks == [(t.peak_bytes, t.reserved_bytes) for t in result.trials]
    assert result.last_failed == (not result.trials[-1].ok)
    assert p.exhausted(result.trials)
    table = format_table(result)
    assert len(table.splitlines()) == result.trial_count + 2
    assert f"*{result.chosen_trial}" in table and "over_budget" in table


# -- options -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bytes_", "fraction"),
    [
        (6_000_000_000, 6 * 10**9, None),  # an integer is bytes
        (2**20, 2**20, None),  # the smallest integer taken: 1 MiB
        ("6GB", 6 * 10**9, None),  # a string with a unit: decimal...
        ("512MiB", 512 * 2**20, None),  # ... or binary, case-insensitive, spaces allowed
        ("1.5 gb", 15 * 10**8, None),
        ("512B", 512, None),  # a unit says what was meant, however small
        ("0.8", None, 0.8),  # a float or a string with a decimal point is a fraction
        (0.8, None, 0.8),
        ("1.0", None, 1.0),
        (1.0, None, 1.0),
        (".5", None, 0.5),
    ],
)
def test_memory_amounts(value, bytes_, fraction):
    amount = parse_memory_amount(value)
    assert (amount.bytes, amount.fraction) == (bytes_, fraction)
    assert amount.resolve(lambda: 10_000) == (bytes_ if bytes_ is not None else int(fraction * 10_000))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1, "1 is below the 1 MiB \\(1048576\\) minimum, .* missing unit: .*\"1GB\""),  # 1 byte is never meant
        (512, "512 is below the 1 MiB"),
        (2**20 - 1, "1048575 is below the 1 MiB"),
        ("1", "'1' has no unit: write a size with a unit \\(1GB, 1MiB\\)"),  # bytes? gigabytes? the whole device?
        ("512", "'512' has no unit"),
        ("4096", "'4096' has no unit"),
        ("1.5", "a fraction must be in \\(0, 1\\], got 1.5"),
        (1.5, "a fraction must be in \\(0, 1\\], got 1.5"),
        (6e9, "a fraction must be in"),  # TOML's 6e9 is a float: not taken as bytes
        ("-3GB", "is not a memory amount"),
        ("12 parsecs", "unknown unit 'parsecs'"),
        ("", "is not a memory amount"),
        (0, "must be > 0 bytes, got 0"),
        (-1, "must be > 0 bytes, got -1"),
        ("0GB", "must be > 0 bytes"),
        (True, "expected bytes, a size with a unit or a fraction"),
    ],
)
def test_bad_memory_amounts_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        parse_memory_amount(value)


def test_options_from_a_spec_table():
    table = {"pipeline": ["det", "emb"], "memory_budget": "6GB", "concurrent": True}
    options = structure(table, BatchSearchOptions, where="s.toml", base_path="options.batch_search")
    assert options.pipeline == ("det", "emb") and options.memory_budget == "6GB" and options.concurrent
    assert [parse_memory_amount(zero, allow_zero=True).bytes for zero in (0, 0.0, "0", "0MB")] == [0, 0, 0, 0]
    with pytest.raises(SpecError, match="options.batch_search: unknown key 'memory_budjet'.*memory_budget"):
        structure({"memory_budjet": "6GB"}, BatchSearchOptions, where="s.toml", base_path="options.batch_search")
    with pytest.raises(SpecError, match="options.batch_search.memory_budget: unknown unit 'parsecs'"):
        structure({"memory_budget": "6 parsecs"}, BatchSearchOptions, where="s.toml", base_path="options.batch_search")
    with pytest.raises(SpecError, match="options.batch_search.gain_threshold: must be in"):
        structure({"gain_threshold": 1.5}, BatchSearchOptions, where="s.toml", base_path="options.batch_search")
    with pytest.raises(SpecError, match="options.batch_search.memory_budget: '8' has no unit"):
        structure({"memory_budget": "8"}, BatchSearchOptions, where="s.toml", base_path="options.batch_search")
    with pytest.raises(SpecError, match="options.batch_search.safety_margin: an integer is a number of bytes, and 512 is below"):
        structure({"safety_margin": 512}, BatchSearchOptions, where="s.toml", base_path="options.batch_search")
    with pytest.raises(SpecError, match="options.batch_search.max_batch: must be at least 1"):
        structure({"max_batch": 0}, BatchSearchOptions, where="s.toml", base_path="options.batch_search")


def test_result_round_trips_through_toml():
    import tomllib

    import tomli_w

    from rpx_core.results.records import converter, to_data

    def used(stage: int, size: int) -> int:  # a step at 8 makes an over-budget trial
        return 100 * MB + 40 * MB * size + 200 * MB * (size >= 8)

    result = simulate(planner(500 * MB, stages=2, fan_outs=(2.0, 1.0), max_batch=16), used, overhead_rate)
    assert not all(trial.ok for trial in result.trials)
    text = tomli_w.dumps(to_data(result))
    assert converter.structure(tomllib.loads(text), BatchSearchResult) == result
