"""batch_search types: what the user declares (options), what one trial measured, the thread-safe tracker that
records trials, and the result with its queries (best combination, samples, memory peaks). The planning logic lives in
:mod:`rpx_plugins.batch_search.planner`; running trials on a backend in :mod:`rpx_plugins.batch_search.stage`.

Conventions: memory in bytes (1 MB = 1e6 bytes when shown as MB); throughput in samples per second, measured as
``calls * batch_size / elapsed`` where ``elapsed`` is the backend timer's seconds over back-to-back calls run until
``trial_seconds`` passed (after one untimed warm-up call); "frames" per second are samples per second of a stage
divided by the product of the ``fan_out`` of every stage before it (a detector with fan_out 3 feeds 3 items per
frame to the next stage, which then needs 3 samples per frame). A pipeline's throughput is its slowest stage in
frames per second: stages overlap (threads, processes, devices). A deployment that runs the stages
strictly one after another gets ``1 / sum(1 / frames_per_second_i)`` instead, computable from the per-stage figures;
with ``concurrent = false`` each stage's memory limit is independent, so the same choice maximises both.

Users of faceswap's ``DataTracker`` find where each of its queries lives in rpx in ``docs/migrating.md``.
"""

from __future__ import annotations

import re
import threading
from typing import Callable, Literal, Sequence

import attrs

from rpx_core import convert
from rpx_core.registry.backends import MemoryPeak
from rpx_core.spec.limits import seconds_validator

Failure = Literal["oom", "over_budget"]
#: Units of memory amounts: decimal (1 GB = 1e9 bytes) and binary (1 GiB = 2**30 bytes); case-insensitive.
UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_AMOUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
#: What the budget is compared with: the whole usage at the trial's peak, not the measured region's increment (the
#: models, their weights and everything the process held before count, as they would in deployment).
BUDGET_HOLDS = (
    "each trial's absolute peak (used_bytes: reserved, else allocated, plus memory outside the allocator; the "
    "process's whole RSS on CPU), not the region's increment"
)
#: The smallest amount an integer may give, in bytes: below it, an integer is almost certainly a missing unit.
MIN_BYTES = 2**20


# -- options -----------------------------------------------------------------------------------------------------------


@attrs.frozen
class MemoryAmount:
    """A parsed memory amount: a number of bytes, or a fraction of something known only at run time."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, whole: Callable[[], int]) -> int:
        """Bytes; a fraction is taken of ``whole()`` (called only then: reading device memory may be costly)."""
        return self.bytes if self.bytes is not None else int(self.fraction * whole())


def parse_memory_amount(value: int | float | str, allow_zero: bool = False) -> MemoryAmount:
    """Parse a memory amount by one rule per form, so a typo is refused instead of silently becoming a tiny budget:

    * an integer is bytes, and must be at least :data:`MIN_BYTES` (1 MiB): ``1`` or ``512`` is almost certainly a
      missing unit;
    * a float in (0, 1], or a string with a decimal point ("0.8", "1.0"), is a fraction (of the device's memory for
      a budget, of the budget for a margin);
    * any other string needs a unit ("6GB", "512MiB", "1.5 gb"; see :data:`UNITS`), and is then taken as written;
      a unit-less integer string ("1", "4096") is refused, since it could mean bytes, gigabytes or the whole device.

    ``allow_zero`` accepts zero in any form (0, 0.0, "0", "0MB"): a margin may be none.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected bytes, a size with a unit or a fraction, got {value!r}")
    if allow_zero and value == 0:
        return MemoryAmount(bytes=0)
    if isinstance(value, int):
        return MemoryAmount(bytes=_at_least_min_bytes(value))
    if isinstance(value, float):
        return _fraction(value)
    match = _AMOUNT.match(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a memory amount: give a size with a unit (6GB, 512MiB), bytes as an integer, or a "
            "fraction (0.8)"
        )
    digits, unit = match.group(1), match.group(2).lower()
    if unit and unit not in UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use one of {', '.join(u.upper() for u in UNITS)}")
    number = float(digits)
    if allow_zero and number == 0:
        return MemoryAmount(bytes=0)
    if not unit:
        if "." not in digits:
            raise ValueError(
                f"{value!r} has no unit: write a size with a unit ({digits}GB, {digits}MiB), bytes as an integer "
                "(not a string), or a fraction with a decimal point (\"0.8\"; \"1.0\" for all of it)"
            )
        return _fraction(number)
    amount = int(number * UNITS[unit])
    if amount <= 0:
        raise ValueError(f"must be > 0 bytes, got {value!r}")
    return MemoryAmount(bytes=amount)


def _at_least_min_bytes(value: int) -> int:
    if value <= 0:
        raise ValueError(f"must be > 0 bytes, got {value}")
    if value < MIN_BYTES:
        raise ValueError(
            f"an integer is a number of bytes, and {value} is below the 1 MiB ({MIN_BYTES}) minimum, almost certainly "
            f"a missing unit: give a size with a unit (\"{value}GB\", \"{value}MiB\") or a fraction of the whole (0.8)"
        )
    return value


def _fraction(value: float) -> MemoryAmount:
    if not 0 < value <= 1:
        raise ValueError(f"a fraction must be in (0, 1], got {value}; give bytes as an integer or a size with a unit")
    return MemoryAmount(fraction=value)


def _memory_amount(_: object, attribute: attrs.Attribute, value: int | float | str) -> None:
    parse_memory_amount(value)


def _margin_amount(_: object, attribute: attrs.Attribute, value: int | float | str) -> None:
    parse_memory_amount(value, allow_zero=True)


def _fraction_below_one(_: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"must be in [0, 1), got {value}")


@attrs.frozen
class BatchSearchOptions:
    """The spec's ``[options.batch_search]`` table."""

    #: Model names in pipeline order; empty: every model of the spec, in spec order.
    pipeline: tuple[str, ...] = ()
    #: A size with a unit ("6GB", "512MiB"), bytes as an integer (at least 1 MiB), or a fraction (0.8 or "0.8") of
    #: the device's memory (total RAM for the cpu backend); see :func:`parse_memory_amount`. Made a hard limit where
    #: the backend can (CUDA).
    memory_budget: int | float | str = attrs.field(default="0.8", validator=_memory_amount)
    #: Kept free below the budget: a size with a unit, bytes as an integer (at least 1 MiB), or a fraction of the
    #: budget. A trial whose memory exceeds budget - margin counts as "over_budget", a failure like out-of-memory.
    #: 0: no margin.
    safety_margin: int | float | str = attrs.field(default=0.05, validator=_margin_amount)
    #: The largest batch size tried for any stage.
    max_batch: int = attrs.field(default=256, validator=convert.batch_size)
    #: Timed seconds per stage per trial (back-to-back calls until this much time passed; at least one call).
    trial_seconds: float = attrs.field(default=1.0, validator=seconds_validator())
    #: Stop growing a stage when doubling its batch size raised its throughput by less than this fraction;
    #: 0 disables the stop (each stage grows to its memory limit or max_batch).
    gain_threshold: float = attrs.field(default=0.05, validator=_fraction_below_one)
    #: Stop refining a stage's memory limit once the largest fitting and the smallest failing batch sizes are
    #: within this fraction of each other; 0 finds the exact limit.
    resolution: float = attrs.field(default=0.05, validator=_fraction_below_one)
    #: True: stages run at the same time on the device (one thread each) and share the budget; False: one after
    #: another, so each stage's peak must fit on its own.
    concurrent: bool = False


# -- results -----------------------------------------------------------------------------------------------------------


@attrs.frozen
class StageMeasurement:
    """One stage within one trial."""

    batch_size: int
    calls: int | None = None  # timed calls (after one warm-up call); None when the stage failed
    seconds: float | None = None  # elapsed seconds of the timed calls, backend timer
    samples_per_second: float | None = None  # raw: calls * batch_size / seconds
    frames_per_second: float | None = None  # adjusted: samples_per_second / product of upstream fan_outs
    used_bytes: int | None = None  # sequential trials: memory while this stage ran alone (see Trial.used_bytes)
    failure: Failure | None = None
    error: str | None = None  # the out-of-memory error, "ExceptionType: message"
    #: The trial's own noise: (max - min) / (2 x median) of the samples/s of its timed chunks (NOISE_CHUNKS), shown
    #: as "±"; None with a single chunk (one call) or in results written before it was recorded.
    noise: float | None = None


@attrs.frozen
class Trial:
    """One combination of batch sizes, run once. Memory figures are peaks over the trial (sequential: the largest
    stage's)."""

    index: int
    batch_sizes: tuple[int, ...]  # per stage, pipeline order
    stages: tuple[StageMeasurement, ...]
    seconds: float  # host wall time of the whole trial (inputs, warm-up and timed calls)
    #: What is compared with the budget: reserved bytes (peak bytes where the backend has no reserve pool) plus
    #: memory used outside the framework allocator.
    used_bytes: int | None = None
    peak_bytes: int | None = None  # MemoryPeak.peak_bytes: allocated by the framework allocator (CPU: whole RSS)
    reserved_bytes: int | None = None  # MemoryPeak.reserved_bytes: the allocator's caching pool (CUDA)
    outside_allocator_bytes: int | None = None  # MemoryPeak.outside_allocator_bytes
    failure: Failure | None = None  # "oom" wins over "over_budget" when stages failed differently
    frames_per_second: float | None = None  # the pipeline's: min over stages of frames_per_second; None on failure

    @property
    def ok(self) -> bool:
        return self.failure is None


@attrs.frozen
class MemoryFit:
    """Least-squares line of used bytes against batch size: ``used = intercept_bytes + slope * batch``."""

    intercept_bytes: float  # concurrent: shared by all stages (the baseline counted once)
    slope_bytes_per_sample: float
    points: int  # trials fitted (failures with a memory reading included)
    rms_residual_bytes: float


@attrs.frozen
class StageSummary:
    """What the search learnt about one stage."""

    name: str
    fan_out: float  # items this stage emits per item it receives
    upstream_fan_out: float  # product of the fan_outs before it: frames_per_second = samples_per_second / this
    stopped_by: str  # "memory limit", "predicted memory limit", "max_batch", "plateau", "infeasible", "not the bottleneck"
    chosen_batch: int | None = None
    largest_fitting_batch: int | None = None  # concurrent: with the other stages at the final combination
    smallest_failing_batch: int | None = None  # idem; None when no larger batch failed
    predicted_max_batch: int | None = None  # the memory fit's largest batch within the usable budget (<= max_batch)
    memory_fit: MemoryFit | None = None  # None until the stage ran at two sizes with a memory reading


@attrs.frozen
class BatchSearchResult:
    """Every trial, the chosen combination and why. ``feasible = False`` (with the reason) when even batch 1 does
    not fit; the stage still succeeds, so the trials are kept."""

    feasible: bool
    reason: str
    concurrent: bool
    budget_bytes: int
    safety_margin_bytes: int
    usable_bytes: int  # budget_bytes - safety_margin_bytes: the limit trials are held to
    budget_enforced: bool  # the backend made the budget a hard limit (out-of-memory at the budget)
    memory_method: str  # how peaks were measured (MemoryPeak.method)
    trial_count: int
    stages: tuple[StageSummary, ...]
    trials: tuple[Trial, ...]
    chosen_batch_sizes: tuple[int, ...] | None = None
    chosen_trial: int | None = None
    frames_per_second: float | None = None  # of the chosen trial
    headroom_bytes: int | None = None  # budget_bytes - the chosen trial's used_bytes
    #: Which memory figure the budget holds each trial to (BUDGET_HOLDS); None in results written before it was said.
    budget_holds: str | None = None

    @property
    def batch_sizes(self) -> list[tuple[int, ...]]:
        """Every combination that ran without failing, in trial order (the order ``samples`` indexes)."""
        return [trial.batch_sizes for trial in self.ok_trials]

    @property
    def ok_trials(self) -> list[Trial]:
        return [trial for trial in self.trials if trial.ok]

    @property
    def last_failed(self) -> bool:
        return bool(self.trials) and not self.trials[-1].ok

    @property
    def memory_peaks(self) -> list[tuple[int | None, int | None]]:
        """(peak bytes, reserved bytes) of every trial; compare with ``usable_bytes``."""
        return [(trial.peak_bytes, trial.reserved_bytes) for trial in self.trials]

    def samples(self, index: int | None = None, adjusted: bool = False) -> list[float] | list[list[float]]:
        """Samples per second of each stage in the ``index``-th non-failing trial (None: all of them); ``adjusted``
        gives frames per second."""
        rows = [[_rate(stage, adjusted) for stage in trial.stages] for trial in self.ok_trials]
        return rows if index is None else rows[index]

    def samples_stats(
        self, method: Literal["mean", "min"], index: int | None = None, adjusted: bool = False
    ) -> float | list[float]:
        """Mean or minimum over stages of ``samples(index, adjusted)``; a list when ``index`` is None."""
        reduce = {"mean": lambda row: sum(row) / len(row), "min": min}[method]
        if index is not None:
            return reduce(self.samples(index, adjusted))
        return [reduce(row) for row in self.samples(None, adjusted)]


def _rate(stage: StageMeasurement, adjusted: bool) -> float:
    return stage.frames_per_second if adjusted else stage.samples_per_second


def used_bytes(peak: MemoryPeak) -> int | None:
    """What a region used from the device's point of view: reserved (else allocated) plus outside the allocator."""
    held = peak.reserved_bytes if peak.reserved_bytes is not None else peak.peak_bytes
    return None if held is None else held + (peak.outside_allocator_bytes or 0)


# -- tracking ----------------------------------------------------------------------------------------------------------


@attrs.define
class _Row:
    batch_sizes: tuple[int, ...]
    stages: list[StageMeasurement]
    peaks: list[MemoryPeak] = attrs.Factory(list)


class BatchTracker:
    """Records trials as runners report them; ``record_stage`` may be called from one thread per stage."""

    def __init__(self, fan_outs: Sequence[float], usable_bytes: int) -> None:
        self.upstream = upstream_fan_outs(fan_outs)
        self.usable_bytes = usable_bytes
        self.memory_method: str | None = None
        self._lock = threading.Lock()
        self._trials: list[Trial] = []
        self._row: _Row | None = None

    @property
    def trials(self) -> tuple[Trial, ...]:
        return tuple(self._trials)

    @property
    def last_failed(self) -> bool:
        return bool(self._trials) and not self._trials[-1].ok

    def resume(self, trials: Sequence[Trial]) -> None:
        """Start from the finished trials of an interrupted search of the same spec (``rpx run --resume``)."""
        self._trials.extend(trials)

    def begin_trial(self, batch_sizes: Sequence[int]) -> None:
        self._row = _Row(tuple(batch_sizes), [StageMeasurement(size) for size in batch_sizes])

    def record_stage(
        self,
        stage: int,
        *,
        calls: int | None = None,
        seconds: float | None = None,
        peak: MemoryPeak | None = None,
        failure: Failure | None = None,
        error: str | None = None,
        noise: float | None = None,
    ) -> None:
        """Record stage ``stage`` of the open trial: its timed calls, or its failure; ``peak`` when it ran alone."""
        with self._lock:
            row = self._row
            batch = row.batch_sizes[stage]
            used = self._note_peak(row, peak)
            if failure is None and used is not None and used > self.usable_bytes:
                failure = "over_budget"
            rate = calls * batch / seconds if failure is None and calls and seconds else None
            row.stages[stage] = StageMeasurement(
                batch_size=batch,
                calls=calls if failure is None else None,
                seconds=seconds if failure is None else None,
                samples_per_second=rate,
                frames_per_second=None if rate is None else rate / self.upstream[stage],
                used_bytes=used,
                failure=failure,
                error=error,
                noise=noise if failure is None else None,
            )

    def end_trial(
        self, *, seconds: float, peak: MemoryPeak | None = None, failure: Failure | None = None
    ) -> Trial:
        """Close the open trial; ``peak`` is the whole trial's (concurrent stages), else the stages' are combined."""
        with self._lock:
            row, self._row = self._row, None
            self._note_peak(row, peak)
        used = [value for value in map(used_bytes, row.peaks) if value is not None]
        trial_used = max(used, default=None)
        failures = {stage.failure for stage in row.stages} | {failure}
        if trial_used is not None and trial_used > self.usable_bytes:
            failures.add("over_budget")
        verdict = "oom" if "oom" in failures else ("over_budget" if "over_budget" in failures else None)
        rates = [stage.frames_per_second for stage in row.stages]
        trial = Trial(
            index=len(self._trials),
            batch_sizes=row.batch_sizes,
            stages=tuple(row.stages),
            seconds=seconds,
            used_bytes=trial_used,
            peak_bytes=_max_field(row.peaks, "peak_bytes"),
            reserved_bytes=_max_field(row.peaks, "reserved_bytes"),
            outside_allocator_bytes=_max_field(row.peaks, "outside_allocator_bytes"),
            failure=verdict,
            frames_per_second=min(rates) if verdict is None and None not in rates else None,
        )
        self._trials.append(trial)
        return trial

    def _note_peak(self, row: _Row, peak: MemoryPeak | None) -> int | None:
        if peak is None:
            return None
        row.peaks.append(peak)
        self.memory_method = self.memory_method or peak.method
        return used_bytes(peak)


def upstream_fan_outs(fan_outs: Sequence[float]) -> list[float]:
    """For each stage, the product of the fan_outs of the stages before it (1 for the first)."""
    products, product = [], 1.0
    for fan_out in fan_outs:
        products.append(product)
        product *= fan_out
    return products


def _max_field(peaks: list[MemoryPeak], field: str) -> int | None:
    return max((getattr(peak, field) for peak in peaks if getattr(peak, field) is not None), default=None)


# -- rendering ---------------------------------------------------------------------------------------------------------


def format_table(result: BatchSearchResult) -> str:
    """The trials as a text table: batch sizes and frames/s per stage, pipeline frames/s, memory in MB, outcome.
    The chosen trial is marked with ``*``."""
    names = [stage.name for stage in result.stages]
    header = ["#", "batch sizes", *[f"{name} fps ±noise" for name in names], "pipeline fps", "used MB", "reserved MB"]
    header += ["outcome", "s"]
    rows = [header]
    for trial in result.trials:
        mark = "*" if trial.index == result.chosen_trial else " "
        rows.append([
            f"{mark}{trial.index}",
            "x".join(map(str, trial.batch_sizes)),
            *[_with_noise(stage) for stage in trial.stages],
            _number(trial.frames_per_second),
            _number(None if trial.used_bytes is None else trial.used_bytes / 1e6),
            _number(None if trial.reserved_bytes is None else trial.reserved_bytes / 1e6),
            trial.failure or "ok",
            f"{trial.seconds:.2f}",
        ])  # fmt: skip
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    budget = f"usable {result.usable_bytes / 1e6:.0f} MB of a {result.budget_bytes / 1e6:.0f} MB budget"
    if result.budget_holds:
        budget += " (held to each trial's absolute peak, not its increment)"
    return "\n".join([*lines, f"{budget}; {result.reason}"])


def _with_noise(stage: StageMeasurement) -> str:
    """frames/s with the trial's own noise, e.g. "812.4 ±3%"."""
    if stage.frames_per_second is None or stage.noise is None:
        return _number(stage.frames_per_second)
    return f"{stage.frames_per_second:.1f} ±{stage.noise:.0%}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
