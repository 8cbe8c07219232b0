"""Which combination of batch sizes to try next, given the trials so far, and which one to choose: pure logic with
no timing and no device, so it is tested on synthetic memory and throughput curves.

Interface (also for callers other than the batch_search stage, e.g. a training-step search): build a
:class:`BatchPlanner` for the pipeline and its usable budget, then loop ``next_combination(trials)`` -> run those
sizes -> record the trial (:class:`~rpx_core.types.batch_search.BatchTracker`) until it returns None; ``result``
gives the choice and what was learnt. Memory readings are ``needed_bytes`` (allocated at the peak plus the process's
memory outside the allocator; RSS on CPU). A caller that can predict memory before measuring (activation sizes from
a model's shapes) passes ``predicted``: one line of needed bytes against batch size per stage, used instead of
calibrating until the stage's own readings can be trusted.

Each stage searches on its own line (the other stages fixed):

1. calibrate: batch 1, then double until three sizes have a memory reading (1, 2, 4); with a predicted line, batch 1
   only;
2. predict: fit ``needed = a + b * batch`` by least squares over every reading (failures over the budget included:
   they are real readings), anchor it at the largest size known to fit, and try the largest size the line keeps
   within the usable budget. A line whose growth over the sizes read is small against its own residuals (RSS at
   batch 1, 2 and 4 is mostly noise) is not trusted that far: the jump is at most :data:`MAX_JUMP`-fold. Once a
   size above the largest fitting one was read (over the budget), the slope is the one between those two readings;
3. bracket: the limit is confirmed by real trials, never by the line alone. A stage stops only once the largest
   size that fits and the smallest that fails are within ``resolution`` of each other (or adjacent), or at
   ``max_batch``. Once a size failed, the next try is the smallest size that closes that bracket if it fits (the
   likeliest to fit of those that would) unless the line says it cannot fit; a second failure in a row steps
   twice as far down, a third bisects; once the search is back under the failure, a line that still says the
   failing size fits is not followed, nor a third prediction after two that fitted: the bracket is bisected;
4. refine: a larger size measured slower than the best by no more than the two trials' noise (each trial's
   frames/s spread over its timed chunks) is measured once more before the drop is believed; when the best size
   is inside the measured range (a larger size really was slower), the geometric midpoints of the gaps beside it
   wider than :data:`PROBE_RATIO` are tried, towards the faster neighbour first, unless that neighbour is within
   ``gain_threshold`` of the best already across at most :data:`PLATEAU_SPAN`-fold (the curve is flat there). A
   best at the largest fitting size gets one probe, only when the search jumped to it straight from calibration over
   more than PLATEAU_SPAN-fold and frames/s rose by less than the square root of that factor (bending over, as
   before a peak): the jump's geometric midpoint. With ``gain_threshold = 0`` there is no refining (a memory-only
   search); refining ends once :data:`TRIALS_BASE` + :data:`TRIALS_PER_STAGE` trials per stage ran.

Sizes at or above a failure are never tried again: memory is assumed monotone in every batch size.

Sequential stages run alone, so each has its own reading and its own limit: all stages search at once (one trial
tries every stage's next size) and one stage's limit never ends another's search. Once all stopped, the combination
of each stage's best size is run once to confirm it, unless it already ran.

Concurrent stages share the budget: one reading per trial, fitted as ``needed = a + sum_i b_i * batch_i``, so the
shared baseline (process, every model's weights) is counted once in ``a``. Only the bottleneck (the stage with the
fewest frames/s in the latest fitting trial) grows, at least doubling (more when its frames/s would need more to
reach the next-slowest stage, assuming frames/s grow at most in proportion to batch size), capped by the fitted
limit, and stops growing at a plateau: its frames/s at the largest fitting size beat the best of every size at most
a quarter of it (:data:`PLATEAU_SPAN`) by less than ``gain_threshold`` (calibration sizes never make a plateau: a
flat stretch at small sizes says nothing about large ones). When the bottleneck cannot grow, growing another stage
cannot raise the pipeline's frames/s; instead the memory plane and per-stage lines of seconds per call against batch
size predict the best split of the budget (shrinking a stage that grew past its need frees memory for the
bottleneck), which is tried if it is new and predicted to gain more than the gain threshold (at least 2%); then
growth resumes from it, or the search ends.

The choice is the fitting trial with the most pipeline frames/s (fewest used bytes on ties).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import attrs

from rpx_core.types.batch_search import (
    BUDGET_HOLDS,
    BatchSearchResult,
    MemoryFit,
    StageSummary,
    Trial,
    upstream_fan_outs,
)

#: Sizes with a memory reading needed before a stage's own line is used for predictions.
CALIBRATION_POINTS = 3
#: Samples of slack when flooring a predicted size, so a size whose reading lands exactly on the budget counts.
ROUNDING = 1e-6
#: A line is trusted for a jump of any length once its growth over the sizes read is this many RMS residuals.
TRUST_GROWTH = 20.0
#: The longest jump, as a factor of the largest fitting size, on a line not trusted that far.
MAX_JUMP = 64
#: The first step down after two failures in a row, as a fraction, when ``resolution`` is smaller.
MIN_STEP = 0.01
#: The least predicted gain for which a concurrent search tries a rebalanced combination.
MIN_REBALANCE_GAIN = 0.02
#: The least factor a concurrent bottleneck grows by per step.
BOTTLENECK_GROWTH = 2
#: A plateau needs the gain to stay under the threshold over at least this factor of batch sizes.
PLATEAU_SPAN = 4
#: Refining stops once the measured sizes beside the best are within this factor of it.
PROBE_RATIO = 2.0
#: A sequential search refines the choice until TRIALS_BASE + TRIALS_PER_STAGE x stages trials ran (8 for one
#: model, 12 for two): calibration, a jump and a bracket take 5 to 7 per stage (all stages at once), and a trial
#: costs trial_seconds per stage.
TRIALS_BASE = 4
TRIALS_PER_STAGE = 4


@attrs.frozen
class LinearFit:
    """``value = intercept + sum(slope_i * batch_i)`` over the columns that varied (others: slope None)."""

    intercept: float
    slopes: tuple[float | None, ...]
    points: int
    rms_residual: float


def fit_linear(rows: Sequence[Sequence[int]], values: Sequence[float]) -> LinearFit | None:
    """Least squares ``value = intercept + sum(slope_i * row_i)`` (memory or seconds per call against batch sizes);
    None without two distinct rows."""
    import numpy as np

    if len({tuple(row) for row in rows}) < 2:
        return None
    sizes = np.asarray(rows, dtype=float)
    target = np.asarray(values, dtype=float)
    varied = [column for column in range(sizes.shape[1]) if np.ptp(sizes[:, column]) > 0]
    design = np.column_stack([np.ones(len(target)), sizes[:, varied]])
    coefficients, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = target - design @ coefficients
    slopes: list[float | None] = [None] * sizes.shape[1]
    for position, column in enumerate(varied):
        slopes[column] = float(coefficients[position + 1])
    return LinearFit(float(coefficients[0]), tuple(slopes), len(target), float(np.sqrt(np.mean(residual**2))))


@attrs.frozen
class MemoryLine:
    """How a stage's needed bytes grow with its batch size, as far as the search relies on it."""

    slope: float  # bytes per sample
    trusted: bool  # for a jump of any length (else at most MAX_JUMP-fold)


@attrs.frozen
class StageView:
    """One stage's line search with the other stages fixed."""

    lo: int | None  # largest size known to fit
    hi: int  # smallest size known to fail (max_batch + 1 when none did)
    line: MemoryLine | None  # None while calibrating
    anchor: float | None  # needed bytes at ``lo`` (read, else predicted)
    misses: int  # failed tries of this stage in a row, up to the latest
    missed_unread: bool  # the latest try of this stage failed without a memory reading
    plateau: bool = False  # concurrent stages only: growth stopped gaining
    streak: int = 0  # fitting tries of this stage in a row, up to the latest


@attrs.frozen
class BatchPlanner:
    """The search policy for one pipeline. ``usable_bytes`` is the budget minus the safety margin; ``predicted``
    (optional) holds one predicted line of needed bytes per stage (``MemoryFit(intercept, slope, points=0,
    rms=0)``; None for a stage without one), used instead of calibration until the stage's own line is trusted."""

    names: tuple[str, ...]
    fan_outs: tuple[float, ...]
    usable_bytes: int
    max_batch: int = 256
    concurrent: bool = False
    gain_threshold: float = 0.05
    resolution: float = 0.01
    predicted: tuple[MemoryFit | None, ...] = ()

    def next_combination(self, trials: Sequence[Trial]) -> tuple[int, ...] | None:
        """The batch sizes to try next; None when the search is over ."""
        return self._next_concurrent(trials) if self.concurrent else self._next_sequential(trials)

    def exhausted(self, trials: Sequence[Trial]) -> bool:
        return self.next_combination(trials) is None

    # -- sequential ----------------------------------------------------------------------------------------------------

    def _next_sequential(self, trials: Sequence[Trial]) -> tuple[int, ...] | None:
        views = [self._sequential_view(trials, stage) for stage in range(len(self.names))]
        if any(view.hi == 1 for view in views):
            return None  # a stage does not fit even at batch 1
        proposals = [self.grow(view)[0] for view in views]
        if all(proposal is None for proposal in proposals):
            proposals = self._refinements(trials, views)
        if any(proposal is not None for proposal in proposals):
            return tuple(
                proposal if proposal is not None else self._best_size(trials, stage)
                for stage, proposal in enumerate(proposals)
            )
        best = tuple(self._best_size(trials, stage) for stage in range(len(self.names)))
        already_ran = best in {trial.batch_sizes for trial in trials}
        confirmed = self._all_stopped(trials[:-1])  # the latest trial was already the confirmation
        return None if already_ran or confirmed else best

    def _all_stopped(self, trials: Sequence[Trial]) -> bool:
        views = [self._sequential_view(trials, stage) for stage in range(len(self.names))]
        return bool(trials) and all(self.grow(view)[0] is None for view in views) and not any(
            self._refinements(trials, views)
        )

    @property
    def refine_budget(self) -> int:
        """Trials after which refining stops: :data:`TRIALS_BASE` + :data:`TRIALS_PER_STAGE` per stage, less one for
        a pipeline's confirming trial. The memory search itself is never cut short."""
        return TRIALS_BASE + TRIALS_PER_STAGE * len(self.names) - (len(self.names) > 1)

    def _refinements(self, trials: Sequence[Trial], views: Sequence[StageView]) -> list[int | None]:
        if len(trials) >= self.refine_budget:
            return [None] * len(views)
        return [self.refine(trials, stage, view.hi) for stage, view in enumerate(views)]

    def _sequential_view(self, trials: Sequence[Trial], stage: int) -> StageView:
        runs = [trial.stages[stage] for trial in trials]
        hi = min((run.batch_size for run in runs if run.failure), default=self.max_batch + 1)
        fits = [run for run in runs if run.failure is None and run.batch_size < hi]
        lo = max((run.batch_size for run in fits), default=None)
        read = [run for run in runs if run.needed_bytes is not None]
        fit = fit_linear([(run.batch_size,) for run in read], [run.needed_bytes for run in read])
        at_lo = [run.needed_bytes for run in fits if run.batch_size == lo and run.needed_bytes is not None]
        anchor = max(at_lo) if at_lo else self._prior_at(stage, lo)
        above = [(run.batch_size, run.needed_bytes) for run in read if lo is not None and run.batch_size > lo]
        between = _between(lo, anchor, min(above)) if above else None
        return StageView(
            lo=lo,
            hi=hi,
            line=between or self._line(fit, {run.batch_size for run in read}, 0, stage),
            anchor=anchor,
            misses=_trailing([run.failure is not None for run in runs]),
            missed_unread=bool(runs) and runs[-1].failure is not None and runs[-1].needed_bytes is None,
            streak=_trailing([run.failure is None for run in runs]),
        )

    def _line(self, fit: LinearFit | None, sizes_read: set[int], column: int, stage: int) -> MemoryLine | None:
        """The stage's own line once CALIBRATION_POINTS sizes were read (trusted once it grew TRUST_GROWTH
        residuals over them), else the predicted one, trusted; None while calibrating without a prediction."""
        own = None
        if fit is not None and fit.slopes[column] is not None and len(sizes_read) >= CALIBRATION_POINTS:
            slope = fit.slopes[column]
            growth = slope * (max(sizes_read) - min(sizes_read))
            own = MemoryLine(slope, trusted=slope > 0 and growth >= TRUST_GROWTH * fit.rms_residual)
        prior = self._prior(stage)
        if prior is not None and (own is None or not own.trusted):
            return MemoryLine(prior.slope_bytes_per_sample, trusted=True)
        return own

    def _prior(self, stage: int) -> MemoryFit | None:
        return self.predicted[stage] if stage < len(self.predicted) else None

    def _prior_at(self, stage: int, size: int | None) -> float | None:
        prior = self._prior(stage)
        return None if prior is None or size is None else prior.intercept_bytes + prior.slope_bytes_per_sample * size

    def _best_size(self, trials: Sequence[Trial], stage: int) -> int:
        """The fitting size with the most frames/s on average (the smaller on ties)."""
        view = self._sequential_view(trials, stage)
        rates = _rates_by_size(
            (trial.stages[stage].batch_size, trial.stages[stage].frames_per_second)
            for trial in trials
            if trial.stages[stage].failure is None and trial.stages[stage].batch_size < view.hi
        )
        return max(rates, key=lambda size: (rates[size], -size))

    # -- concurrent ----------------------------------------------------------------------------------------------------

    def _next_concurrent(self, trials: Sequence[Trial]) -> tuple[int, ...] | None:
        fitting = [trial for trial in trials if trial.ok]
        if not fitting:
            return None if trials else (1,) * len(self.names)
        incumbent = fitting[-1]
        stage = self._bottleneck(incumbent)
        proposal = self.grow(self._concurrent_view(trials, stage, incumbent))[0]
        if proposal is None:
            return self._rebalanced(trials)
        rates = [run.frames_per_second for run in incumbent.stages]
        if len(rates) > 1:
            current = incumbent.batch_sizes[stage]
            next_slowest = sorted(rates)[1]
            needed = math.ceil(current * next_slowest / rates[stage])
            proposal = min(proposal, max(needed, BOTTLENECK_GROWTH * current))
        grown = tuple(proposal if index == stage else size for index, size in enumerate(incumbent.batch_sizes))
        if grown in {trial.batch_sizes for trial in trials}:  # possible after a rebalance shrank a stage
            return self._rebalanced(trials)
        return grown

    def _rebalanced(self, trials: Sequence[Trial]) -> tuple[int, ...] | None:
        """Once the bottleneck cannot grow: the combination the fitted memory plane and per-call time lines predict
        to be best, if it is new and predicted to beat the best trial by more than the gain threshold.

        Greedy water-filling from batch 1: grow the stage with the fewest predicted frames/s by one while the plane
        keeps the combination within budget and no failure dominates it (optimal for frames/s rising with batch
        size and memory linear in it). Stages whose size never varied keep it."""
        fitting = [trial for trial in trials if trial.ok]
        read = [trial for trial in trials if trial.needed_bytes is not None]
        plane = fit_linear([trial.batch_sizes for trial in read], [trial.needed_bytes for trial in read])
        if plane is None:
            return None
        upstream = upstream_fan_outs(self.fan_outs)
        lines = [self._time_line(fitting, stage) for stage in range(len(self.names))]
        fixed = [plane.slopes[stage] is None or lines[stage] is None for stage in range(len(self.names))]

        def rate(stage: int, size: int) -> float:
            seconds = lines[stage].intercept + lines[stage].slopes[0] * size
            return size / seconds / upstream[stage] if seconds > 0 else 0.0

        def predicted(sizes: list[int]) -> float:
            return min(rate(stage, size) for stage, size in enumerate(sizes) if not fixed[stage])

        sizes = [fitting[-1].batch_sizes[stage] if fixed[stage] else 1 for stage in range(len(self.names))]
        if all(fixed) or self._dominated(tuple(sizes), trials):
            return None
        while True:
            free = [stage for stage in range(len(sizes)) if not fixed[stage]]
            stage = min(free, key=lambda index: rate(index, sizes[index]))
            grown = [size + (index == stage) for index, size in enumerate(sizes)]
            used = plane.intercept + sum(slope * size for slope, size in zip(plane.slopes, grown) if slope is not None)
            if grown[stage] > self.max_batch or used > self.usable_bytes or self._dominated(tuple(grown), trials):
                break
            sizes = grown
        best = max(trial.frames_per_second for trial in fitting)
        already_ran = tuple(sizes) in {trial.batch_sizes for trial in trials}
        worth_it = predicted(sizes) > (1 + max(self.gain_threshold, MIN_REBALANCE_GAIN)) * best
        return tuple(sizes) if worth_it and not already_ran else None

    @staticmethod
    def _time_line(fitting: Sequence[Trial], stage: int) -> LinearFit | None:
        """Seconds per call against batch size for one stage: ``seconds = fixed + per_sample * batch``."""
        runs = [trial.stages[stage] for trial in fitting]
        return fit_linear([(run.batch_size,) for run in runs], [run.seconds / run.calls for run in runs])

    @staticmethod
    def _dominated(sizes: tuple[int, ...], trials: Sequence[Trial]) -> bool:
        """At or above, in every stage, a combination that failed."""
        return any(not trial.ok and all(a >= b for a, b in zip(sizes, trial.batch_sizes)) for trial in trials)

    @staticmethod
    def _bottleneck(trial: Trial) -> int:
        rates = [run.frames_per_second for run in trial.stages]
        return rates.index(min(rates))

    def _concurrent_view(self, trials: Sequence[Trial], stage: int, incumbent: Trial) -> StageView:
        sizes = incumbent.batch_sizes
        hi = self.max_batch + 1
        for trial in trials:
            others_within = all(s <= sizes[i] for i, s in enumerate(trial.batch_sizes) if i != stage)
            if trial.failure and others_within:
                hi = min(hi, max(trial.batch_sizes[stage], sizes[stage] + 1))
        read = [trial for trial in trials if trial.needed_bytes is not None]
        fit = fit_linear([trial.batch_sizes for trial in read], [trial.needed_bytes for trial in read])
        fits = [trial for trial in trials if trial.ok]
        return StageView(
            lo=sizes[stage],
            hi=hi,
            line=self._line(fit, {trial.batch_sizes[stage] for trial in read}, stage, stage),
            anchor=incumbent.needed_bytes,
            misses=_trailing([not trial.ok for trial in trials]),
            missed_unread=not trials[-1].ok and trials[-1].needed_bytes is None,
            plateau=self._plateau([(t.batch_sizes[stage], t.stages[stage].frames_per_second) for t in fits], sizes[stage]),
        )

    # -- one stage's line ----------------------------------------------------------------------------------------------

    def grow(self, view: StageView) -> tuple[int | None, str | None]:
        """The stage's next size, or None and why it stopped (see the module docstring, steps 1 to 3)."""
        if view.lo is None:
            return (1, None) if view.hi > 1 else (None, "infeasible")
        if view.plateau:
            return None, "plateau"
        ceiling = min(view.hi - 1, self.max_batch)
        floor = self.step_above(view.lo)
        if floor > ceiling:
            return None, ("memory limit" if view.hi <= self.max_batch else "max_batch")
        if view.line is None or view.anchor is None:
            return max(floor, min(2 * view.lo, ceiling)), None  # calibrating
        target = self.predicted_max(view)
        if not view.line.trusted:
            target = min(target, MAX_JUMP * view.lo)
        if view.hi <= self.max_batch:
            target = self._within_bracket(view, target)
        return max(floor, min(target, ceiling)), None

    def _within_bracket(self, view: StageView, predicted: int) -> int:
        """A failure is known: the likeliest size to close the bracket where the line allows it (a first miss is
        taken as the line being a little optimistic), stepping further down after each miss and bisecting once two
        steps missed, once two predictions in a row fitted without closing it (a step in the memory curve keeps an
        interpolation on one side), or once the line, refitted, still says the failing size fits."""
        closing = self.closing(view.lo, view.hi)
        middle = (view.lo + view.hi) // 2
        if view.misses == 0:
            if predicted >= view.hi or view.streak >= 2:
                return min(closing, middle)
            return closing if predicted >= closing else predicted
        if view.misses == 1:
            return closing if view.missed_unread or predicted >= closing else predicted
        step = (1 + max(self.resolution, MIN_STEP)) ** (2 ** (view.misses - 1))
        backed_off = math.ceil(view.hi / step)
        return min(backed_off, middle) if view.misses > 2 else backed_off

    def step_above(self, size: int) -> int:
        """The smallest size more than ``resolution`` above ``size`` (at least the next one)."""
        return max(size + 1, math.floor(size * (1 + self.resolution)) + 1)

    def closing(self, lo: int, hi: int) -> int:
        """The smallest size above ``lo`` that, if it fits, leaves no size more than ``resolution`` above it below
        the failing ``hi``: the bracket is then closed."""
        size = max(lo + 1, math.ceil((hi - 1) / (1 + self.resolution)))
        while size > lo + 1 and self.step_above(size - 1) >= hi:
            size -= 1
        while self.step_above(size) < hi:
            size += 1
        return size

    def predicted_max(self, view: StageView) -> int:
        """The largest size the line, anchored at ``lo``'s reading, keeps within the usable budget."""
        if view.line.slope <= 0:
            return self.max_batch
        samples = (self.usable_bytes - view.anchor) / view.line.slope
        return max(0, min(self.max_batch, view.lo + math.floor(samples + ROUNDING)))

    def _predicted_or_none(self, view: StageView) -> int | None:
        known = view.line is not None and view.anchor is not None and view.lo is not None
        return self.predicted_max(view) if known else None

    def _plateau(self, rates: list[tuple[int, float]], lo: int | None) -> bool:
        """Beyond calibration, ``lo``'s frames/s beat the best at sizes of at most ``lo / PLATEAU_SPAN`` by less
        than gain_threshold: the gain stayed under it over a PLATEAU_SPAN-fold span of sizes."""
        if self.gain_threshold <= 0 or lo is None or lo <= 2 ** (CALIBRATION_POINTS - 1):
            return False
        by_size = _rates_by_size(rates)
        smaller = [by_size[size] for size in by_size if size <= lo / PLATEAU_SPAN]
        return bool(smaller) and by_size[lo] < (1 + self.gain_threshold) * max(smaller)

    def refine(self, trials: Sequence[Trial], stage: int, hi: int) -> int | None:
        """Once a stage stopped growing: a size to measure again (a drop within noise) or to probe (beside a best
        inside the measured range); None when the best is settled. Sizes at or above ``hi`` never come back."""
        runs = [trial.stages[stage] for trial in trials]
        fits = [run for run in runs if run.failure is None and run.batch_size < hi and run.frames_per_second]
        if not fits or self.gain_threshold <= 0:  # 0: a memory-only search, no throughput decisions
            return None
        rates = _rates_by_size((run.batch_size, run.frames_per_second) for run in fits)
        noise = _rates_by_size((run.batch_size, run.noise or 0.0) for run in fits)
        counts = {size: sum(run.batch_size == size for run in fits) for size in rates}
        best = max(rates, key=lambda size: (rates[size], -size))
        for size in sorted(rates, reverse=True):  # the largest first: growth is what a drop would stop
            drop = 1 - rates[size] / rates[best]
            if size > best and counts[size] == 1 and drop <= noise[size] + noise[best]:
                return size
        sizes = sorted(rates)
        position = sizes.index(best)
        if position == len(sizes) - 1:
            return self._look_between(sizes, rates)
        neighbours = [sizes[position + 1]] + ([sizes[position - 1]] if position > 0 else [])
        for neighbour in sorted(neighbours, key=lambda size: -rates[size]):  # towards the faster side first
            low, high = sorted((best, neighbour))
            # equal rates across a narrow gap mean a flat curve there; across a wide one, a peak may lie between
            flat = rates[neighbour] * (1 + self.gain_threshold) >= rates[best] and high / low <= PLATEAU_SPAN
            midpoint = round(math.sqrt(low * high))
            if not flat and high / low > PROBE_RATIO and low < midpoint < high and midpoint not in rates:
                return midpoint
        return None

    @staticmethod
    def _look_between(sizes: list[int], rates: dict[int, float]) -> int | None:
        """The best is the largest size measured: once, when the search jumped straight from calibration to it over
        more than PLATEAU_SPAN-fold and frames/s rose less than the square root of the size ratio (bending over, as
        before a peak), the geometric midpoint of that jump."""
        if len(sizes) < 2:
            return None
        best, neighbour = sizes[-1], sizes[-2]
        ratio = best / neighbour
        midpoint = round(math.sqrt(best * neighbour))
        from_calibration = neighbour <= 2 ** (CALIBRATION_POINTS - 1)
        bending = rates[best] / rates[neighbour] < math.sqrt(ratio)
        return midpoint if from_calibration and ratio > PLATEAU_SPAN and bending and neighbour < midpoint < best else None

    # -- the result ----------------------------------------------------------------------------------------------------

    def result(
        self,
        trials: Sequence[Trial],
        *,
        budget_bytes: int,
        safety_margin_bytes: int,
        budget_enforced: bool,
        memory_method: str,
        **facts: Any,
    ) -> BatchSearchResult:
        """The search's outcome: the best fitting trial and what was learnt per stage; ``facts`` are further fields
        of the result that the caller knows (the device's state at the start, the allocator's cap, notes)."""
        fitting = [trial for trial in trials if trial.ok]
        chosen = max(fitting, key=lambda t: (t.frames_per_second or 0.0, -(t.used_bytes or 0)), default=None)
        summaries = self._summaries(trials, chosen)
        common = dict(
            concurrent=self.concurrent,
            budget_bytes=budget_bytes,
            safety_margin_bytes=safety_margin_bytes,
            usable_bytes=self.usable_bytes,
            budget_enforced=budget_enforced,
            memory_method=memory_method,
            trial_count=len(trials),
            budget_holds=BUDGET_HOLDS,
            stages=summaries,
            trials=tuple(trials),
            **facts,
        )
        if chosen is None:
            return BatchSearchResult(feasible=False, reason=self._infeasible_reason(trials, budget_bytes), **common)
        headroom = None if chosen.used_bytes is None else budget_bytes - chosen.used_bytes
        return BatchSearchResult(
            feasible=True,
            reason=self._reason(chosen, summaries, headroom),
            chosen_batch_sizes=chosen.batch_sizes,
            chosen_trial=chosen.index,
            frames_per_second=chosen.frames_per_second,
            headroom_bytes=headroom,
            **common,
        )

    def _summaries(self, trials: Sequence[Trial], chosen: Trial | None) -> tuple[StageSummary, ...]:
        fitting = [trial for trial in trials if trial.ok]
        upstream = upstream_fan_outs(self.fan_outs)
        summaries = []
        for stage, name in enumerate(self.names):
            if self.concurrent and fitting:
                view = self._concurrent_view(trials, stage, fitting[-1])
                stopped = self.grow(view)[1] if stage == self._bottleneck(fitting[-1]) else "not the bottleneck"
            else:
                view = self._sequential_view(trials, stage)
                stopped = self.grow(view)[1]
            summaries.append(StageSummary(
                name=name,
                fan_out=self.fan_outs[stage],
                upstream_fan_out=upstream[stage],
                stopped_by=stopped or "still growing",
                chosen_batch=chosen.batch_sizes[stage] if chosen else None,
                largest_fitting_batch=view.lo,
                smallest_failing_batch=view.hi if view.hi <= self.max_batch else None,
                predicted_max_batch=self._predicted_or_none(view),
                memory_fit=self._memory_fit(trials, stage),
            ))  # fmt: skip
        return tuple(summaries)

    def _memory_fit(self, trials: Sequence[Trial], stage: int) -> MemoryFit | None:
        if self.concurrent:
            read = [trial for trial in trials if trial.needed_bytes is not None]
            rows, used = [trial.batch_sizes for trial in read], [trial.needed_bytes for trial in read]
            column = stage
        else:
            read = [trial.stages[stage] for trial in trials if trial.stages[stage].needed_bytes is not None]
            rows, used = [(run.batch_size,) for run in read], [run.needed_bytes for run in read]
            column = 0
        fit = fit_linear(rows, used)
        if fit is None or fit.slopes[column] is None:
            return None
        return MemoryFit(fit.intercept, fit.slopes[column], fit.points, fit.rms_residual)

    def _reason(self, chosen: Trial, summaries: tuple[StageSummary, ...], headroom: int | None) -> str:
        slowest = self._bottleneck(chosen)
        sizes = ", ".join(f"{name}={size}" for name, size in zip(self.names, chosen.batch_sizes))
        room = "unknown headroom" if headroom is None else f"headroom {headroom / 1e6:.0f} MB"
        return (
            f"largest throughput {chosen.frames_per_second:.4g} frames/s at batch sizes {sizes} (trial "
            f"{chosen.index}); limited by stage {self.names[slowest]!r} ({summaries[slowest].stopped_by}); {room}"
        )

    def _infeasible_reason(self, trials: Sequence[Trial], budget_bytes: int) -> str:
        limit = f"the usable {self.usable_bytes / 1e6:.0f} MB (budget {budget_bytes / 1e6:.0f} MB minus the safety margin)"
        if not trials:
            return "no trial ran"
        first = trials[0]
        failed = [stage for stage, run in enumerate(first.stages) if run.failure] or list(range(len(self.names)))
        who = (
            "the stages together" if self.concurrent else
            " and ".join(f"stage {self.names[stage]!r}" for stage in failed)
        )  # fmt: skip
        verb = "does" if len(failed) == 1 and not self.concurrent else "do"
        runs = [first] if self.concurrent else [first.stages[stage] for stage in failed]
        if any(run.failure == "oom" for run in runs):
            errors = "; ".join(run.error for run in first.stages if run.error)
            return f"{who} ran out of memory at batch 1 under {limit}" + (f": {errors}" if errors else "")
        used = max(run.used_bytes for run in runs)
        return f"{who} {verb} not fit at batch 1: {used / 1e6:.0f} MB used, over {limit}"


def _between(lo: int | None, anchor: float | None, above: tuple[int, int]) -> MemoryLine | None:
    """A size above ``lo`` was read (it failed over the budget): the slope between the two readings, which the
    whole fit (its small sizes mostly noise on CPU) would blur; None (the whole fit then) where they do not rise."""
    size, needed = above
    if lo is None or anchor is None or needed <= anchor:
        return None
    return MemoryLine((needed - anchor) / (size - lo), trusted=True)


def _trailing(flags: Sequence[bool]) -> int:
    """How many of the last ``flags`` in a row are true."""
    count = 0
    for flag in reversed(flags):
        if not flag:
            break
        count += 1
    return count


def _rates_by_size(rates) -> dict[int, float]:
    """Mean frames/s per batch size."""
    grouped: dict[int, list[float]] = {}
    for size, rate in rates:
        grouped.setdefault(size, []).append(rate)
    return {size: sum(values) / len(values) for size, values in grouped.items()}
