"""The measure_latency stage on real torch models on the CPU, with a hand-built StageContext.

Models that sleep a known time make the expected figures computable: a call that sleeps 2 ms has a 2 ms latency at
batch 1 whatever the batch sizes, and processes ``batch / 2 ms`` samples per second. A sleep never ends early, so
those are hard bounds on one side; on the other, a loaded machine (two busy cores in CI) can stretch a 2 ms sleep
many times over, so upper bounds on time are generous and only catch a different order of magnitude (per-sample
instead of per-call figures, a loop that does not stop).
"""

from __future__ import annotations

import time
import tomllib

import numpy as np
import pytest
import tomli_w
import torch

from rpx_core import stats
from rpx_core.convert import converter, structure
from rpx_core.errors import SpecError
from rpx_core.execution.context import Job, StageContext
from rpx_core.registry.backends import Timer
from rpx_core.results.records import to_data
from rpx_core.spec.schema import InputSpec, ModelSpec
from rpx_core.types.latency import LatencyOptions, LatencyResult
from rpx_plugins import latency
from rpx_plugins.system_card import machine_card
from rpx_plugins.torch.cpu import CpuBackend

FAST = dict(warmup_calls=2, warmup_seconds=0.0, throughput_seconds=0.05, throughput_min_calls=3,
            adaptive=False)  # a fixed sample count: adaptive sampling is tested with a deterministic clock elsewhere


class Sleeper(torch.nn.Module):
    """Sleeps ``seconds`` per call whatever the batch size; fails like a real allocator from ``oom_from`` on."""

    def __init__(self, seconds: float, oom_from: int | None = None, error_from: int | None = None) -> None:
        super().__init__()
        self.seconds, self.oom_from, self.error_from = seconds, oom_from, error_from
        self.inference_mode_seen: set[bool] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inference_mode_seen.add(torch.is_inference_mode_enabled())
        if self.oom_from is not None and x.shape[0] >= self.oom_from:
            torch.empty(10**15, dtype=torch.uint8)  # the CPU allocator's real out-of-memory error
        if self.error_from is not None and x.shape[0] >= self.error_from:
            raise ValueError("a bug in the model, not a lack of memory")
        time.sleep(self.seconds)
        return x * 2


def context(model: torch.nn.Module, options: LatencyOptions, batch_sizes: tuple[int, ...] = (1,), features: int = 16) -> StageContext:
    spec = ModelSpec(name="m", source="tests:handmade", inputs=(InputSpec((1, features)),))
    job = Job(spec, "cpu", "cpu", "fp32", ("measure_latency",), {"measure_latency": options}, (), batch_sizes)
    return StageContext(job, CpuBackend(), plugins=None, gpu_catalog=None, model_object=model)


def test_latency_is_per_call_at_batch_1_and_throughput_is_per_batch():
    model = Sleeper(0.002)
    options = LatencyOptions(min_samples=64, keep_samples=True, **FAST)
    ctx = context(model, options, batch_sizes=(1, 8))
    result = latency.measure_latency(ctx)
    assert result.samples_count == 64 and result.stopped_by == "min_samples" and result.measured_batch_size == 1
    assert 2.0 <= result.p50_ms < 50.0  # one call (never under the 2 ms sleep), not 2 ms / 8 = 0.25 ms
    # every summary figure is what numpy computes from the kept samples
    samples = np.array(result.samples_ms)
    assert len(samples) == 64
    assert result.p50_ms == pytest.approx(float(np.percentile(samples, 50)), rel=1e-12)
    assert result.p90_ms == pytest.approx(float(np.percentile(samples, 90)), rel=1e-12)
    assert result.mean_ms == pytest.approx(float(samples.mean()), rel=1e-12)
    assert result.std_ms == pytest.approx(float(samples.std()), rel=1e-9)
    assert (result.min_ms, result.max_ms) == (samples.min(), samples.max())
    assert result.iqr_ms == pytest.approx(float(np.subtract(*np.percentile(samples, [75, 25]))), rel=1e-12)
    assert result.spread == pytest.approx(result.iqr_ms / result.p50_ms)
    # 64 samples claim p90 but not p95/p99: those are absent and listed, not zero
    assert result.p95_ms is None and result.p99_ms is None
    assert result.unclaimed_percentiles == ("p95", "p99")
    one, eight = result.throughput
    for row in (one, eight):
        assert row.samples_per_s == pytest.approx(row.calls * row.batch_size / row.seconds, rel=1e-12)
        assert row.calls >= 3 and row.peak_memory is not None and row.error is None
    assert 8 / 0.05 < eight.samples_per_s <= 8 / 0.002  # batch / call time, and a call takes at least 2 ms
    assert 1 / 0.05 < one.samples_per_s <= 1 / 0.002
    assert ctx.model().inference_mode_seen == {True}  # the placed copy of the model is what ran


def test_complete_result_for_a_small_mlp_round_trips_through_toml():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ctx = context(model, LatencyOptions(max_seconds=120.0, **FAST), batch_sizes=(1, 4), features=64)  # 662 samples
    ctx.results["system_card"] = machine_card("torch")
    result = latency.measure_latency(ctx)
    assert result.samples_count == 662 and result.unclaimed_percentiles == ()
    assert 0 < result.min_ms <= result.p50_ms <= result.p90_ms <= result.p95_ms <= result.p99_ms <= result.max_ms
    assert result.percentile_method == stats.PERCENTILE_METHOD
    assert result.clock == Timer.clock
    assert result.threads == {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads()}
    assert result.peak_memory.peak_bytes > 0 and result.peak_memory.method
    assert result.warmup_calls >= 2 and result.samples_ms is None
    assert result.system_summary == machine_card("torch").summary()
    assert [row.batch_size for row in result.throughput] == [1, 4]
    text = tomli_w.dumps(to_data(result))
    assert converter.structure(tomllib.loads(text), LatencyResult) == result


def test_time_cap_stops_sampling_and_says_so():
    options = LatencyOptions(min_samples=10_000, max_seconds=0.2, keep_samples=True, **FAST)
    result = latency.measure_latency(context(Sleeper(0.01), options))
    assert result.stopped_by == "max_seconds"
    # max_seconds bounds warm-up and sampling together: never stopped before the cap; a stuck loop would run to 10_000
    assert 0.2 <= result.warmup_seconds + result.sampling_seconds < 2.0
    # every call takes at least 10 ms, so the cap is reached after 0.2 s / 10 ms = 20 calls at most (+1 for rounding)
    assert result.min_ms >= 10.0
    assert result.samples_count <= 21
    assert sum(result.samples_ms) / 1e3 <= result.sampling_seconds
    assert result.unclaimed_percentiles == ("p90", "p95", "p99")
    assert result.p90_ms is None


def test_one_sample_is_always_taken():
    sampling = latency.sample_calls(lambda: time.sleep(0.02), Timer(lambda: None), min_samples=100, max_seconds=0.001)
    assert len(sampling.samples_s) == 1 and sampling.stopped_by == "max_seconds"
    assert sampling.samples_s[0] >= 0.02


def test_warm_up_meets_both_its_minimum_count_and_time():
    by_time = latency.warm_up(lambda: time.sleep(0.001), lambda: None, calls=1, seconds=0.2)
    assert by_time.seconds >= 0.2 and by_time.calls > 1  # the time kept it going after the count was met
    assert by_time.median_call_seconds >= 0.001
    by_count = latency.warm_up(lambda: None, lambda: None, calls=30, seconds=0.0, tolerance=10.0)
    assert by_count.calls == 31 and by_count.settled  # windows 1 + 2 + 4 + 8 + 16: the one that reached 30
    none = latency.warm_up(lambda: None, lambda: None, calls=0, seconds=0.0, max_seconds=0.0)
    assert none.calls == 0 and none.median_call_seconds is None and none.settled is None


class SettlingClock:
    """A clock that only moves when the model is called: call i takes ``1 + 20 * 0.7**i`` ms (slow first calls that
    settle towards 1 ms, as caches fill and clocks ramp up), or whatever ``durations`` says."""

    def __init__(self, durations=None) -> None:
        self.now = 0.0
        self.calls = 0
        self.durations = durations or (lambda i: (1 + 20 * 0.7**i) / 1e3)

    def __call__(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += self.durations(self.calls)
        self.calls += 1


def test_warm_up_runs_until_the_timings_settle_and_records_how_long():
    clock = SettlingClock()
    warm = latency.warm_up(clock.call, lambda: None, calls=1, tolerance=0.05, clock=clock)
    # windows of 1, 2, 4, ..., 32 calls: the medians fall 21 -> 12.6 -> 5.1 -> 1.5 -> 1.02 -> 1.0003 ms, and only the
    # last two agree within 5%; computed here from the durations, independently of the loop
    durations = [clock.durations(i) for i in range(63)]
    windows = [durations[2**k - 1:2**(k + 1) - 1] for k in range(6)]
    medians = [float(np.median(window)) for window in windows]
    assert [abs(b - a) <= 0.05 * b for a, b in zip(medians, medians[1:])] == [False] * 4 + [True]
    assert warm.settled and warm.calls == clock.calls == 63
    assert warm.window_medians_s == pytest.approx(medians, rel=1e-12)
    assert warm.seconds == pytest.approx(sum(durations), rel=1e-12)  # how long it took, on the injected clock
    # a fixed count would have stopped inside the slow part: the old default, 10 calls, ends at 1.8 ms calls
    assert clock.durations(10) > 1.5e-3


def test_a_warm_up_that_never_settles_stops_at_its_cap_and_says_so():
    """Calls growing slower by 0.01 ms each: every window's median is further from the last than 1% (doubling windows
    see a slow ramp that two equal windows side by side would call settled), so only the cap ends it."""
    ramp = SettlingClock(lambda i: (1 + i / 100) / 1e3)
    warm = latency.warm_up(ramp.call, lambda: None, calls=1, tolerance=0.01, max_seconds=0.5, clock=ramp)
    assert warm.settled is False and warm.seconds >= 0.5
    first, last = ramp.durations(0), ramp.durations(warm.calls - 1)
    assert warm.seconds - last < first + 0.5  # no call started after the cap (counted from the first call's end)
    medians = warm.window_medians_s
    assert all(abs(b - a) > 0.01 * b for a, b in zip(medians, medians[1:]))


def test_a_throughput_row_stops_at_the_deadline_when_calls_slow_down():
    """The warm-up measured 1 ms calls, so 1,000 calls were planned for a second; then the machine got busy and every
    call takes 20 ms: timed in chunks at the rate measured, the row stops near its 0.3 s deadline (a count planned
    on the quiet machine would have run 20 s) and says how many calls it made."""
    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.02)

    deadline = latency.Deadline.after(0.3)
    started = time.perf_counter()
    made, seconds = latency.time_chunked(slow, Timer(lambda: None), 1000, deadline)
    elapsed = time.perf_counter() - started
    assert made == len(calls) < 1000 and seconds == pytest.approx(elapsed, abs=0.05)
    assert 0.3 - 0.05 <= elapsed < 0.3 + 0.25  # a chunk (a few calls) past it at most, even if sleeps stretch
    assert latency.time_chunked(slow, Timer(lambda: None), 5, latency.Deadline.after(0))[0] == 1  # one always


def test_throughput_call_count_fills_the_time_asked_for():
    options = LatencyOptions(throughput_seconds=1.0, throughput_min_calls=10)
    assert latency.throughput_calls(options, 0.01) == 100
    assert latency.throughput_calls(options, 0.5) == 10
    assert latency.throughput_calls(options, None) == 10


class Mean(torch.nn.Module):
    """Reads its whole input and returns one number, so its inputs are nearly all the memory a call holds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean()


def test_a_throughput_row_holds_only_its_own_inputs():
    features = 2**19  # float32: 2 MiB per sample, so 128 MiB at batch 64 (big tensors are returned to the OS on free)
    options = LatencyOptions(min_samples=5, **FAST)
    result = latency.measure_latency(context(Mean(), options, batch_sizes=(64, 1), features=features))
    big, small = result.throughput
    assert (big.batch_size, small.batch_size) == (64, 1)
    # the batch-64 inputs were freed before the batch-1 row: its peak is lower by their size, less batch 1's
    difference = big.peak_memory.peak_bytes - small.peak_memory.peak_bytes
    assert difference == pytest.approx((64 - 1) * features * 4, abs=20 * 10**6)  # RSS noise as in test_host_memory


def test_out_of_memory_at_a_batch_size_is_recorded_and_larger_ones_skipped():
    model = Sleeper(0.0005, oom_from=16)
    result = latency.measure_latency(context(model, LatencyOptions(min_samples=10, **FAST), batch_sizes=(1, 16, 32, 4)))
    rows = {row.batch_size: row for row in result.throughput}
    assert rows[1].samples_per_s and rows[4].samples_per_s
    assert rows[16].error.startswith("out of memory: RuntimeError") and rows[16].samples_per_s is None
    assert rows[32].error == "not tried: batch size 16 ran out of memory" and rows[32].calls is None


def test_other_errors_of_a_throughput_row_are_recorded_and_the_latency_kept():
    model = Sleeper(0.0, error_from=4)
    result = latency.measure_latency(context(model, LatencyOptions(min_samples=10, **FAST), batch_sizes=(1, 4, 8, 2)))
    rows = {row.batch_size: row for row in result.throughput}
    assert result.samples_count == 10 and rows[1].samples_per_s and rows[2].samples_per_s
    for size in (4, 8):  # not an out-of-memory error: nothing larger is skipped for it, each size says what failed
        assert rows[size].error == "failed: ValueError: a bug in the model, not a lack of memory"


def test_noise_warning_names_the_spread():
    assert latency.noise_warning(0.05, 0.1) is None
    assert "spans 23% of the median (threshold 10%)" in latency.noise_warning(0.23, 0.1)


def test_options_are_validated():
    with pytest.raises(ValueError, match="'min_samples' must be > 0: 0"):
        LatencyOptions(min_samples=0)
    with pytest.raises(ValueError, match="must be >= 0: -1"):
        LatencyOptions(warmup_seconds=-1)
    where = {"where": "s.toml", "base_path": "options.measure_latency"}
    assert structure({"min_samples": 130, "keep_samples": True}, LatencyOptions, **where) == LatencyOptions(min_samples=130, keep_samples=True)
    with pytest.raises(SpecError, match="options.measure_latency: unknown key 'min_sample'; did you mean 'min_samples'"):
        structure({"min_sample": 130}, LatencyOptions, **where)
    with pytest.raises(SpecError, match="options.measure_latency.max_seconds: must be > 0: 0"):
        structure({"max_seconds": 0}, LatencyOptions, **where)


def test_builtin_hook_is_registered_last():
    assert latency.rpx_measure_latency.rpx_impl["trylast"] is True


def test_a_timeout_signal_during_the_collection_is_held_until_it_ends():
    """An in-process stage timeout (SIGALRM) that fires while gc.collect() runs finalizers would raise inside a
    ``__del__``, where Python ignores it, and the stage would run on: it is delivered after the collection instead."""
    import os
    import signal

    from rpx_plugins.measurement import alarm_held

    class Fired(BaseException):
        pass

    def fire(signum, frame):
        raise Fired()

    previous = signal.signal(signal.SIGALRM, fire)
    reached = []
    try:
        with pytest.raises(Fired):
            with alarm_held():
                os.kill(os.getpid(), signal.SIGALRM)
                time.sleep(0.05)  # the handler has run by now, whichever thread the kernel gave the signal to
                reached.append("inside")  # the signal waited
            reached.append("after")  # not reached: it is handed to the stage's handler as the block ends
        assert reached == ["inside"] and signal.getsignal(signal.SIGALRM) is fire
    finally:
        signal.signal(signal.SIGALRM, previous)
