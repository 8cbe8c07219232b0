"""The training batch search: the largest micro-batch whose whole step fits a memory budget, and the one with the
most samples/s, with trials placed by the predicted step memory and confirmed by real steps.

The prediction: what the process holds outside the step (the interpreter and libraries on a host, the CUDA context)
is read first. The step is counted (not run) at :data:`FIRST_SIZE` for a rough size of the room: what its forward
pass leaves for backward and its batch, per sample, into what the budget leaves beside the baseline, the parameters
and the optimiser state. It is counted again at that rough limit and at half of it, and these two counts give its
resident memory (parameters, optimiser state, the batch) and each phase's transient peak as lines in the batch size;
the step's peak is the resident line plus the highest phase line (the optimiser's temporaries may top the backward
pass's activations at small batches, the reverse at large ones; a peak's position in the step can change with the
batch size, so the lines are drawn where the search will look, not extrapolated from small sizes). The first trial runs the largest batch that line keeps within the usable budget. Each trial then
corrects the line with what it measured: one reading keeps the predicted slope through it, two or more are fitted
(:func:`rpx_plugins.batch_search.planner.fit_linear`). The next trial is the largest batch the corrected line
allows between the largest that fitted and the smallest that failed; when the line allows nothing larger than the
largest fitting batch, the search tries that batch plus ``resolution`` to confirm the limit (a failure ends it),
and after an out-of-memory error without a reading, or two failures in a row, it bisects. It stops when the
smallest failing batch is within ``resolution`` of the largest fitting one, at ``max_batch``, or at ``max_trials``. A
trial is never placed within half the resolution below a failed one: at the budget's edge a reading's noise (a
fraction of a MB of RSS) decides, and the line would keep placing trials just over it.

Best throughput: each fitting trial times back-to-back steps (samples/s of whole steps); trials left over probe the
largest batch's half and quarter, and the best is the fitting trial with the most samples/s.

A trial's memory is what the budget holds (``rpx_core.types.batch_search.used_bytes``: reserved, else allocated,
plus memory outside the allocator; the process's RSS on a host), its peak over one steady-state step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import attrs

from rpx_core.plugin import Backend, MemoryPeak, StageContext, UnsupportedError
from rpx_core.types.batch_search import BUDGET_HOLDS, parse_memory_amount, used_bytes
from rpx_core.types.training import TrainBatchSearchOptions, TrainBatchSearchResult, TrainTrial
from rpx_plugins.batch_search.planner import fit_linear
from rpx_plugins.batch_search.stage import drop_frames, timed_until
from rpx_plugins.measurement import gc_paused

#: The micro-batch size of the first, rough count.
FIRST_SIZE = 16
#: Fraction of the room kept free when the first trial is placed from the prediction alone (a step a little over it
#: costs a trial; one a little under still corrects the line).
PLACEMENT_MARGIN = 0.01
#: Failed trials in a row after which the search bisects instead of trusting the line.
BISECT_AFTER = 2


@attrs.frozen
class Line:
    """``bytes = intercept + per_sample x batch``."""

    intercept: float
    per_sample: float

    @classmethod
    def through(cls, first: tuple[int, float], second: tuple[int, float]) -> Line:
        (small, low), (large, high) = first, second
        slope = (high - low) / (large - small)
        return cls(low - slope * small, slope)

    def at(self, batch: float) -> float:
        return self.intercept + self.per_sample * batch

    def slope_at(self, batch: float) -> float:
        return self.per_sample

    def largest_within(self, usable: float) -> int:
        """The largest batch whose bytes stay within ``usable`` (0 when not even one fits)."""
        if self.per_sample <= 0:
            return 2**31 if self.intercept <= usable else 0
        return max(0, math.floor((usable - self.intercept) / self.per_sample + 1e-9))


@attrs.frozen
class Prediction:
    """The counted step's peak: the resident line plus the highest of the phases' transient lines."""

    resident: Line
    phases: tuple[Line, ...]

    def top(self, batch: float) -> Line:
        return max(self.phases, key=lambda line: line.at(batch))

    def at(self, batch: float) -> float:
        return self.resident.at(batch) + self.top(batch).at(batch)

    def slope_at(self, batch: float) -> float:
        return self.resident.per_sample + self.top(batch).per_sample

    def largest_within(self, usable: float) -> int:
        return min(Line(self.resident.intercept + line.intercept, self.resident.per_sample + line.per_sample)
                   .largest_within(usable) for line in self.phases)

    def shifted(self, offset: float) -> Prediction:
        return Prediction(Line(self.resident.intercept + offset, self.resident.per_sample), self.phases)


@attrs.frozen
class Outcome:
    """One trial's measurement: its peak over one step (None after an out-of-memory error) and its speed."""

    peak: MemoryPeak | None
    samples_per_s: float | None = None
    steps: int | None = None
    seconds: float | None = None
    error: str | None = None


def rough_limit(count: Any, size: int, room: int, max_batch: int) -> int:
    """A rough largest batch from one counted step (:class:`~rpx_plugins.training.report.StepCount`) at ``size``:
    ``room`` (budget less baseline) less the parameters and optimiser state, over the saved activations and batch
    per sample (at least twice FIRST_SIZE, at most max_batch)."""
    fixed = count.resident.get("parameters", 0) + count.resident.get("buffers", 0) + count.resident.get(
        "optimizer_state", 0)
    forward = next((phase for phase in count.phases if phase.phase == "forward"), None)
    per_sample = ((forward.live_at_end_bytes if forward else count.transient_peak_bytes)
                  + count.resident.get("batch", 0)) / size
    estimate = (room - fixed) / per_sample if per_sample > 0 else max_batch
    return int(min(max_batch, max(2 * FIRST_SIZE, estimate)))


def prediction_through(small: tuple[int, Any], large: tuple[int, Any]) -> Prediction:
    """The prediction through two counted steps, each (batch size, StepCount): the resident line and each phase's
    transient-peak line."""
    (first, a), (second, b) = small, large
    resident = Line.through((first, sum(a.resident.values())), (second, sum(b.resident.values())))
    phases = tuple(Line.through((first, x.peak_bytes), (second, y.peak_bytes)) for x, y in zip(a.phases, b.phases))
    return Prediction(resident, phases)


class Search:
    """The search's state and policy; ``trial(batch)`` runs real steps, ``predicted`` is the counted line."""

    def __init__(self, predicted: Prediction, baseline: int, usable: int, options: TrainBatchSearchOptions) -> None:
        self.predicted, self.baseline, self.usable, self.options = predicted, baseline, usable, options
        self.trials: list[TrainTrial] = []
        self.stopped_by = ""

    # -- what the trials say -----------------------------------------------------------------------------------------

    @property
    def largest_fitting(self) -> int | None:
        return max((t.batch_size for t in self.trials if t.fits), default=None)

    @property
    def smallest_failing(self) -> int:
        return min((t.batch_size for t in self.trials if not t.fits), default=self.options.max_batch + 1)

    def corrected(self) -> Line | Prediction:
        """The prediction corrected by the readings: through the latest reading with the predicted slope there, or
        a line fitted through two or more; before any reading, the prediction plus the baseline."""
        readings = [(t.batch_size, t.used_bytes) for t in self.trials if t.used_bytes is not None]
        if len({batch for batch, _ in readings}) >= 2:
            fit = fit_linear([(batch,) for batch, _ in readings], [used for _, used in readings])
            if fit is not None and fit.slopes[0] and fit.slopes[0] > 0:
                return Line(fit.intercept, fit.slopes[0])
        if readings:
            batch, used = readings[-1]
            slope = self.predicted.slope_at(batch)
            return Line(used - slope * batch, slope)
        return self.predicted.shifted(self.baseline)

    def misses(self) -> int:
        count = 0
        for trial in reversed(self.trials):
            if trial.fits:
                break
            count += 1
        return count

    # -- the policy --------------------------------------------------------------------------------------------------

    def next_batch(self) -> int | None:
        lo, hi, options = self.largest_fitting, self.smallest_failing, self.options
        if len(self.trials) >= options.max_trials:
            self.stopped_by = f"max_trials ({options.max_trials})"
            return None
        if hi == 1:
            self.stopped_by = "batch 1 does not fit"
            return None
        if lo is not None and (lo >= options.max_batch or hi <= max(lo + 1, lo * (1 + options.resolution))):
            self.stopped_by = ("max_batch" if lo >= options.max_batch else
                               f"the smallest failing batch ({hi}) is within {options.resolution:.0%} of the largest "
                               f"fitting one ({lo})")
            return None
        floor = lo or 0
        unread_miss = bool(self.trials) and self.trials[-1].used_bytes is None and not self.trials[-1].fits
        if unread_miss or self.misses() >= BISECT_AFTER:
            return max(floor + 1, (floor + hi) // 2)
        line = self.corrected()
        margin = PLACEMENT_MARGIN * (self.usable - line.at(0)) if not self.trials else 0
        candidate = line.largest_within(self.usable - margin)
        if hi <= options.max_batch:  # near a failure, readings are noise: stay half the resolution below it
            candidate = min(candidate, math.floor(hi * (1 - options.resolution / 2)))
        if lo is not None and candidate <= lo:
            candidate = math.ceil(lo * (1 + options.resolution))  # the line allows no more: confirm the limit
        return max(floor + 1, min(candidate, hi - 1, options.max_batch))

    def probes(self) -> list[int]:
        """Smaller batches to time for the best samples/s, with the trials left over."""
        lo = self.largest_fitting
        tried = {t.batch_size for t in self.trials}
        wanted = [size for size in (lo // 2, lo // 4) if size >= 1 and size not in tried] if lo else []
        return wanted[: max(0, self.options.max_trials - len(self.trials))]

    def record(self, batch: int, outcome: Outcome) -> None:
        used = used_bytes(outcome.peak) if outcome.peak is not None else None
        fits = outcome.error is None and used is not None and used <= self.usable
        error = outcome.error
        if error is None and not fits and used is not None:
            error = f"over budget: {used / 1e6:.1f} MB used, {self.usable / 1e6:.1f} MB usable"
        self.trials.append(TrainTrial(batch, int(self.corrected().at(batch)), fits, used,
                                      outcome.samples_per_s if fits else None, outcome.steps, outcome.seconds, error))


def run_search(search: Search, trial: Callable[[int], Outcome], progress: Callable[..., None]) -> None:
    """Trials until the search stops, then the probes for throughput."""
    while (batch := search.next_batch()) is not None:
        progress("training batch-search trials", len(search.trials))
        search.record(batch, trial(batch))
    stopped = search.stopped_by
    for batch in search.probes():
        progress("training batch-search trials", len(search.trials))
        search.record(batch, trial(batch))
    search.stopped_by = stopped


def result(search: Search, budget: int, margin: int, method: str) -> TrainBatchSearchResult:
    fitting = [t for t in search.trials if t.fits and t.samples_per_s is not None]
    best = max(fitting, key=lambda t: (t.samples_per_s, -t.batch_size), default=None)
    return TrainBatchSearchResult(
        budget_bytes=budget,
        safety_margin_bytes=margin,
        usable_bytes=search.usable,
        largest_batch=search.largest_fitting,
        best_batch=best.batch_size if best else None,
        best_samples_per_s=best.samples_per_s if best else None,
        trials=tuple(search.trials),
        predicted_intercept_bytes=search.predicted.at(0) + search.baseline,
        predicted_per_sample_bytes=search.predicted.slope_at(search.largest_fitting or 1),
        memory_method=method,
        stopped_by=search.stopped_by,
        budget_holds=BUDGET_HOLDS,
    )


def budget_of(backend: Backend, device: str, options: TrainBatchSearchOptions) -> tuple[int, int]:
    """(budget, safety margin) in bytes; a fractional budget is of the device's memory."""

    def whole() -> int:
        total = backend.device_memory_bytes(device)
        if total is None:
            raise UnsupportedError(f"a fractional memory_budget needs device {device!r}'s memory size, which backend "
                                   f"{backend.name!r} cannot report; give bytes or a size with a unit")
        return total

    budget = parse_memory_amount(options.memory_budget).resolve(whole)
    margin = parse_memory_amount(options.safety_margin, allow_zero=True).resolve(lambda: budget)
    if margin >= budget:
        raise UnsupportedError(f"options.train_batch_search.safety_margin: {margin} bytes leaves nothing of the "
                               f"{budget}-byte budget")
    return budget, margin


def baseline(backend: Backend, device: str) -> tuple[int, str]:
    """What the process holds before any trial, as the budget counts it (an empty region's reading), and how the
    backend reads it."""
    backend.reset_peak_memory(device)
    reading = backend.read_peak_memory(device)
    used = used_bytes(reading)
    if used is None:
        raise UnsupportedError(f"train_batch_search needs peak-memory readings; backend {backend.name!r} has none "
                               f"({reading.method})")
    return used, reading.method


def trial_runner(ctx: StageContext, build: Callable[[int], Callable[[], Any]], samples_per_step: Callable[[int], int],
                 options: TrainBatchSearchOptions, prepare: Callable[[], None]) -> Callable[[int], Outcome]:
    """``trial(batch)``: a fresh step at ``batch`` (``build``), two untimed steps (the optimiser's state, then a
    steady step), one step's peak, then back-to-back steps for ``trial_seconds``; an out-of-memory error is a
    failure without a reading, and the backend recovers before the next trial."""
    backend, device = ctx.backend, ctx.job.device

    def trial(batch: int) -> Outcome:
        started = time.perf_counter()
        try:
            with gc_paused():
                step = build(batch)
                step()
                step()
                prepare()
                backend.release_cached_memory(device)
                backend.reset_peak_memory(device)
                step()
                peak = backend.read_peak_memory(device)
                timed = timed_until(step, backend.timer(device), options.trial_seconds)
            del step
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            error = f"out of memory: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            drop_frames(exc)
        else:
            rate = timed.calls * samples_per_step(batch) / timed.seconds if timed.seconds > 0 else None
            return Outcome(peak, rate, timed.calls, time.perf_counter() - started)
        backend.recover_from_oom(device)
        return Outcome(None, error=error, seconds=time.perf_counter() - started)

    return trial
