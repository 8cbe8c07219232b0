"""measure_latency: the declaration of the measured latency stage, its summary fields, its tables (latency with
its interval and the fraction of the roofline bound it reached, throughput per batch size), the marks a measurement
that is not clean carries with the reasons, and its compare figures with their noise (no verdict on an unsound
measurement). The implementation: rpx_plugins.latency, for every backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rpx_core.plugin import (
    PRECISION,
    SHAPES,
    Cell,
    Column,
    Figure,
    LatencyOptions,
    LatencyResult,
    Noise,
    Stage,
    Table,
    TableView,
    field,
    ok_result,
    units,
)
from rpx_plugins.efficiency import efficiency

Fields = dict[str, float | str]

#: Marks appended to figures whose measurement is not clean, with what they mean (shown under the table).
NOISY, PARTIAL = "~", "!"
MARKS = {NOISY: "noisy: not a stable measurement (the reasons are above: interval, spread, tail, drift, warm-up, "
                "other work on the machine; older files: the spread is above the noise threshold)",
         PARTIAL: "too few samples for a confidence interval: do not trust the figure (older files: stopped by "
                  "max_seconds before min_samples)"}
#: Fewer timed calls than this in a throughput row cannot say whether a change is real.
MIN_THROUGHPUT_CALLS = 10


# -- summary fields -----------------------------------------------------------------------------------------------------


def latency_fields(latency: LatencyResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {}
    batch = latency.measured_batch_size
    if batch is not None:
        fields["latency_batch_size"] = batch
    if batch == 1:
        fields["latency_ms_per_sample"] = latency.p50_ms  # one call of one sample; never a batch's time / its size
    for name in ("p50", "p90", "p95", "p99"):
        value = getattr(latency, f"{name}_ms")
        if value is not None:
            fields[f"latency_{name}_ms"] = value
    interval = getattr(latency, "p50_interval_ms", None)  # absent from results written before it was recorded
    if interval is not None:
        fields["latency_p50_low_ms"], fields["latency_p50_high_ms"] = interval
        fields["latency_interval_confidence"] = latency.interval_confidence
    if getattr(latency, "verdict", None) is not None:
        fields["latency_verdict"] = latency.verdict
        fields["latency_samples"] = latency.samples_count
        fields["latency_interval_confidence"] = latency.interval_confidence
    if getattr(latency, "verdict_reasons", ()):
        fields["latency_verdict_reasons"] = "; ".join(latency.verdict_reasons)
    if getattr(latency, "warmup_settled", None) is not None:
        fields["latency_warmup_seconds"] = latency.warmup_seconds
    if latency.peak_memory.peak_bytes is not None:
        fields["peak_memory_mb"] = latency.peak_memory.peak_bytes / 1e6
    if getattr(latency.peak_memory, "increment_bytes", None) is not None:
        fields["peak_increment_mb"] = latency.peak_memory.increment_bytes / 1e6
    for row in latency.throughput:
        if row.samples_per_s is not None:
            fields[f"throughput_b{row.batch_size}_samples_per_s"] = row.samples_per_s
    return {**fields, **measured_vs_bound(latency, results)}


def measured_vs_bound(latency: LatencyResult, results: Mapping[str, Any]) -> Fields:
    """Measured p50 beside the roofline bound of the GPU it ran on, for the same call (rpx_plugins.efficiency)."""
    found = efficiency(latency, results.get("roofline"), results.get("count_flops"))
    if found is None:
        return {}
    fields: Fields = {
        "measured_gpu": found.gpu,
        "measured_vs_bound_precision": found.precision,
        "measured_p50_ms": found.measured_ms,
        "roofline_bound_ms": found.bound_ms,
    }
    if found.fraction is not None:
        fields["fraction_of_roofline"] = found.fraction
    else:
        fields["efficiency_problem"] = found.problem
    return fields


# -- tables ------------------------------------------------------------------------------------------------------------


def latency_marks(latency: Any) -> str:
    """The marks of a latency result, from its ``verdict``; a file older than verdicts is judged by its spread
    warning and whether sampling stopped before ``min_samples``."""
    verdict = field(latency, "verdict")
    if verdict is not None:
        return {"noisy": NOISY, "too_few_samples": PARTIAL}.get(verdict, "")
    noisy = bool(field(latency, "noisy_warning"))
    partial = field(latency, "stopped_by") == "max_seconds"
    return (NOISY if noisy else "") + (PARTIAL if partial else "")


def fallback_verdict(latency: Any) -> str:
    """The verdict of a results file older than the ``verdict`` field, in its words."""
    if field(latency, "noisy_warning"):
        return "noisy"
    return "too_few_samples" if field(latency, "stopped_by") == "max_seconds" else "stable"


def interval_text(latency: Any) -> str:
    interval = field(latency, "p50_interval_ms")
    if not interval:
        return units.MISSING
    confidence = field(latency, "interval_confidence")
    level = f" ({units.percent(confidence)})" if confidence else ""
    return f"{units.milliseconds(interval[0])} – {units.milliseconds(interval[1])}{level}"


def latency_table(run: Any) -> Table | None:
    """Measured per-call latency of each model's inputs, with its interval, the fraction of the roofline bound it
    reached (on a GPU rpx recognises), spread, verdict and peak memory."""
    rows, clocks, warnings, inputs = [], {}, [], []
    for model in run.models:
        result = ok_result(model, "measure_latency")
        if result is None:
            continue
        marks = latency_marks(result)
        verdict = field(result, "verdict") or fallback_verdict(result)
        interval = field(result, "p50_interval_ms")
        peak = result.peak_memory
        found = efficiency(result, ok_result(model, "roofline"), ok_result(model, "count_flops"))
        rows.append([
            Cell.text_of(model.name),
            Cell.of(result.p50_ms, units.milliseconds, marks),
            Cell(list(interval) if interval else None, interval_text(result)),
            efficiency_cell(found),
            Cell.of(result.p90_ms, units.milliseconds), Cell.of(result.p99_ms, units.milliseconds),
            Cell.of(result.mean_ms, units.milliseconds),
            Cell.of(result.spread, units.percent),
            Cell(result.samples_count, str(result.samples_count)),
            Cell(verdict, verdict),
            Cell.of(peak.peak_bytes if peak else None, units.size, " (sampled)" if peak and peak.sampled else ""),
            Cell.of(field(peak, "increment_bytes"), units.size),
        ])  # fmt: skip
        if (note := timing_note(model.name, result)) is not None:
            warnings.append(note)
        if found is not None and found.problem:
            warnings.append(f"{model.name}: no fraction of the {found.gpu} {found.precision} bound: {found.problem}")
        if field(result, "measured_inputs"):
            inputs.append(f"{model.name} {', '.join(result.measured_inputs)}")
        clocks.setdefault(result.clock, []).append(model.name)
    if not rows:
        return None
    notes = [*warnings,
             "per call of each model's inputs as written, each call synchronised; percentiles by linear "
             "interpolation; of bound = roofline bound / p50 on the GPU it ran on (same call, same precision); "
             "spread = IQR / p50; call increment: the measured region's peak less its start",
             *([f"inputs: {'; '.join(inputs)}"] if inputs else []),
             *(f"{mark}: {meaning}" for mark, meaning in MARKS.items()),
             *(f"clock ({', '.join(names)}): {clock}" for clock, names in clocks.items())]
    return Table("latency", "Tier 3: measured latency",
                 [Column("model"), Column("p50", "ms"), Column("p50 interval", "ms"), Column("of bound", "fraction"),
                  Column("p90", "ms"),
                  Column("p99", "ms"), Column("mean", "ms"), Column("spread", "fraction"), Column("samples"),
                  Column("verdict"), Column("peak memory", "bytes"), Column("call increment", "bytes")], rows, notes)


def throughput_table(run: Any) -> Table | None:
    """Samples per second at each batch size (back-to-back calls timed as one region)."""
    rows = []
    for model in run.models:
        result = ok_result(model, "measure_latency")
        if result is None:
            continue
        for row in result.throughput:
            peak = row.peak_memory
            rows.append([
                Cell.text_of(model.name), Cell(row.batch_size, str(row.batch_size)),
                Cell.of(row.samples_per_s, lambda v: units.rate(v, " samples/s")),
                Cell.of(row.calls, str), Cell.of(row.seconds, units.seconds),
                Cell.of(peak.peak_bytes if peak else None, units.size),
                Cell(row.error or field(row, "cut_short"), row.error or field(row, "cut_short") or ""),
            ])  # fmt: skip
    if not rows:
        return None
    return Table("throughput", "Tier 3: throughput per batch size",
                 [Column("model"), Column("batch"), Column("throughput", "samples/s"), Column("calls"),
                  Column("elapsed", "s"), Column("peak memory", "bytes"), Column("note")], rows,
                 ["calls x batch / elapsed seconds of back-to-back calls; not a per-sample latency"])


def efficiency_cell(found: Any) -> Cell:
    """The fraction of the bound, "refused" when rpx will not print one (the reason is under the table), "-" off a
    GPU rpx recognises."""
    if found is None:
        return Cell(None, units.MISSING)
    if found.fraction is None:
        return Cell(None, "refused")
    return Cell.of(found.fraction, units.percent)


def timing_note(name: str, latency: Any) -> str | None:
    """One line under the table for a latency that is not stable, saying why and what would help."""
    verdict = field(latency, "verdict") or fallback_verdict(latency)
    count, confidence = latency.samples_count, f"{field(latency, 'interval_confidence') or 0.95:.0%}"
    if verdict == "too_few_samples":
        return (f"{name}: latency p50 from {count} samples has no {confidence} confidence interval: do not trust it; "
                "raise [options.measure_latency] max_seconds or min_samples")
    if verdict == "noisy":  # files written before the reasons were recorded: what "noisy" meant then
        older = (f"the median's {confidence} interval is wider than the target width" if field(latency, "verdict")
                 else "the spread is above the noise threshold")
        reasons = field(latency, "verdict_reasons") or (older,)
        return f"{name}: latency is noisy after {count} samples: {'; '.join(reasons)}"
    return None


# -- what rpx compare puts side by side --------------------------------------------------------------------------------

#: The smallest noise band for throughput (no interval is measured for it).
THROUGHPUT_BAND = 0.05


def latency_figures(models: Sequence[Any]) -> Iterable[Figure]:
    """The p50, then samples/s at every batch size any of the models measured."""
    found = [Figure("latency p50", _latency("p50_ms"), units.milliseconds, (SHAPES, PRECISION), measured=True,
                    noise=latency_noise, unit="ms")]
    sizes = dict.fromkeys(row.batch_size for model in models if (lat := ok_result(model, "measure_latency"))
                          for row in lat.throughput)
    for size in sizes:
        found.append(Figure(f"throughput b{size}", _throughput(size), lambda v: units.rate(v, " samples/s"),
                            (SHAPES, PRECISION), measured=True, higher_is_better=True, noise=throughput_noise_at(size),
                            unit="samples/s", panel="throughput"))
    return found


def _latency(name: str) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, "measure_latency")
        return None if result is None else getattr(result, name)

    return read


def _throughput(size: int) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, "measure_latency")
        return None if result is None else next((row.samples_per_s for row in result.throughput
                                                 if row.batch_size == size), None)

    return read


def unsound(latency: Any) -> str | None:
    """Why a measurement cannot support a verdict ("noisy", "too few samples"), None when it is stable: a change
    between two results is called only when both measured cleanly."""
    verdict = field(latency, "verdict") or fallback_verdict(latency)
    return {"noisy": "noisy", "too_few_samples": "too few samples"}.get(verdict)


def latency_noise(model: Any) -> Noise | None:
    """The median's interval where the file has one, else the spread (IQR / median); unsound unless stable."""
    result = ok_result(model, "measure_latency")
    if result is None:
        return None
    interval = field(result, "p50_interval_ms")
    return Noise(interval=tuple(interval) if interval else None, spread=result.spread, unsound=unsound(result))


def throughput_noise_at(size: int) -> Any:
    """No interval is measured for throughput: the latency's spread, at least THROUGHPUT_BAND; unsound when the
    machine was (the latency's verdict) or the row timed fewer than MIN_THROUGHPUT_CALLS calls."""

    def noise(model: Any) -> Noise | None:
        result = ok_result(model, "measure_latency")
        if result is None:
            return None
        row = next((row for row in result.throughput if row.batch_size == size), None)
        few = row is not None and row.calls is not None and row.calls < MIN_THROUGHPUT_CALLS
        why = unsound(result) or (f"too few calls ({row.calls})" if few else None)
        return Noise(spread=result.spread, floor=THROUGHPUT_BAND, unsound=why)

    return noise


def latency_traits(run: Any, model: Any) -> dict[str, Any]:
    """The inputs as measured, in the normal form counts use ("float32[1,64]"), for files without a count."""
    result = ok_result(model, "measure_latency")
    measured = field(result, "measured_inputs") if result is not None else None
    return {SHAPES: tuple(measured)} if measured else {}


MEASURE_LATENCY = Stage(
    "measure_latency",
    "latency percentiles of the job's inputs, throughput per batch size, peak memory",
    result=LatencyResult,
    needs=("system_card",),
    options=LatencyOptions,
    executes=True,
    measures=True,
    summary=latency_fields,
    tables=(TableView("latency", latency_table), TableView("throughput", throughput_table)),
    figures=latency_figures,
    traits=latency_traits,
    doc="Measure per-call latency of the job's inputs as written, throughput per batch size and peak memory of the "
    "measured region; build percentiles with :mod:`rpx_core.stats` so they follow rpx's method and sufficiency rules.",
)
