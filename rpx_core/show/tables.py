"""A results file as tables people read: what ``rpx show`` prints, ``rpx report`` renders and ``rpx run`` ends with.

Each table is data first (:class:`Table`: columns, rows of :class:`Cell` holding the raw figure and its text in human
units, see :mod:`rpx_core.show.units`), so one builder serves the terminal, Markdown, CSV, JSON and HTML. Raw values keep
the results files' units (ms, bytes, FLOPs, samples/s), named in the column. Figures a stage could not produce are
``-`` (never zero); a measured figure whose samples were noisy or partial carries a mark, explained in the notes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from rpx_core.show import units

#: Marks appended to figures whose measurement is not clean, with what they mean (shown under the table).
NOISY, PARTIAL = "~", "!"
MARKS = {NOISY: "noisy: the median's confidence interval is wider than the target width (older files: the spread "
                "is above the noise threshold)",
         PARTIAL: "too few samples for a confidence interval: do not trust the figure (older files: stopped by "
                  "max_seconds before min_samples)"}


@attrs.frozen
class Cell:
    """One figure: ``value`` raw (a number in the column's unit, a string, or None), ``text`` as shown."""

    value: Any
    text: str

    @classmethod
    def of(cls, value: Any, fmt: Callable[[Any], str] = str, mark: str = "") -> Cell:
        if value is None:
            return cls(None, units.MISSING)
        return cls(value, fmt(value) + mark)


@attrs.frozen
class Table:
    """A named table: ``name`` for ``--table`` and file names, ``title`` for people, ``columns`` with units."""

    name: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    notes: tuple[str, ...] = ()

    def column(self, title: str) -> list[Any]:
        index = self.columns.index(title)
        return [row[index].value for row in self.rows]


def _table(name: str, title: str, columns: Iterable[str], rows: Iterable[Iterable[Cell]],
           notes: Iterable[str] = ()) -> Table:
    return Table(name, title, tuple(columns), tuple(tuple(row) for row in rows), tuple(notes))


def ok_result(model: Any, stage: str) -> Any:
    record = model.stages.get(stage)
    return record.result if record is not None and record.status == "ok" else None


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a typed result or of plain data (a stage no loaded plugin declares, or an older file)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


# -- the tables --------------------------------------------------------------------------------------------------------


def tier1(run: Any) -> Table | None:
    """Parameters, FLOPs, bytes and activation memory per model (FLOPs = 2 x MACs; decimal units)."""
    rows = []
    for model in run.models:
        params, flops, traffic = (ok_result(model, s) for s in ("count_params", "count_flops", "estimate_traffic"))
        if params is None and flops is None and traffic is None:
            continue
        rows.append([
            Cell(model.name, model.name),
            Cell(model.precision, model.precision),
            Cell.of(params and params.total, units.count),
            Cell.of(params and params.bytes_at_precision, units.size),
            Cell.of(flops and flops.total_flops, units.flops),
            Cell.of(flops and flops.macs, units.macs),
            Cell.of(flops and (flops.matrix_flops / flops.total_flops if flops.total_flops else None), units.percent),
            Cell.of(traffic and traffic.unfused_bytes, units.size),
            Cell.of(traffic and traffic.fused_bytes, units.size),
            Cell.of(traffic and traffic.arithmetic_intensity_unfused, units.intensity),
            Cell.of(traffic and traffic.activation_peak_bytes, units.size),
        ])  # fmt: skip
    if not rows:
        return None
    return _table("tier1", "Tier 1: size and work of one pass",
                  ["model", "precision", "params", "param bytes", "FLOPs", "MACs", "matrix share",
                   "unfused bytes", "fused bytes", "FLOP/B unfused", "activation bytes"], rows,
                  ["FLOPs = 2 x MACs for matrix work, plus other FLOPs from the per-element table; bytes at each "
                   "tensor's dtype; 1 GB = 1e9 bytes"])


def roofline(run: Any) -> Table | None:
    """One row per model, GPU and precision: the three bounds, bottleneck, memory-bound share, fits."""
    rows, skipped = [], []
    for model in run.models:
        result = ok_result(model, "roofline")
        if result is None:
            continue
        for gpu, by_precision in result.gpus.items():
            for precision, bound in by_precision.items():
                mark = " (est.)" if bound.peak_is_estimate else ""
                rows.append([
                    Cell(model.name, model.name), Cell(gpu, gpu), Cell(precision, precision),
                    Cell.of(bound.bound_ms_fused, units.milliseconds),
                    Cell.of(bound.bound_ms_unfused, units.milliseconds),
                    Cell.of(bound.per_operator_ms, units.milliseconds),
                    Cell(bound.bottleneck_fused, bound.bottleneck_fused),
                    Cell.of(bound.memory_bound_share, units.percent),
                    Cell.of(bound.peak_tflops * 1e12, units.flop_rate, mark),
                    Cell(bound.fits_in_memory, f"{'yes' if bound.fits_in_memory else 'NO'} "
                         f"({units.size(bound.required_bytes)} of {units.size(bound.capacity_bytes)})"),
                ])  # fmt: skip
        skipped += [f"{model.name}: roofline skipped for {s.gpu} at {s.precision}: {s.reason}" for s in result.skipped]
    if not rows and not skipped:
        return None
    notes = ["bound (fused) = max(FLOPs / peak, fused bytes / bandwidth): nothing can run faster; unfused: every "
             "operator round-trips memory; per operator: the sum of each operator's own bound (eager estimate)",
             "(est.) on a peak: the GPU pack marks it derived or uncertain", *skipped]
    return _table("roofline", "Tier 2: roofline lower bounds per GPU and precision",
                  ["model", "GPU", "precision", "bound fused ms", "bound unfused ms", "per operator ms",
                   "bottleneck", "memory-bound share", "peak FLOP/s", "fits"], rows, notes)


def latency_marks(latency: Any) -> str:
    """The marks of a latency result, from its ``verdict``; a file older than verdicts is judged by its spread
    warning and whether sampling stopped before ``min_samples``."""
    verdict = _attr(latency, "verdict")
    if verdict is not None:
        return {"noisy": NOISY, "too_few_samples": PARTIAL}.get(verdict, "")
    noisy = bool(_attr(latency, "noisy_warning"))
    partial = _attr(latency, "stopped_by") == "max_seconds"
    return (NOISY if noisy else "") + (PARTIAL if partial else "")


def fallback_verdict(latency: Any) -> str:
    """The verdict of a results file older than the ``verdict`` field, in its words."""
    if latency.noisy_warning:
        return "noisy"
    return "too_few_samples" if latency.stopped_by == "max_seconds" else "stable"


def interval_text(latency: Any) -> str:
    interval = _attr(latency, "p50_interval_ms")
    if not interval:
        return units.MISSING
    confidence = _attr(latency, "interval_confidence")
    level = f" ({units.percent(confidence)})" if confidence else ""
    return f"{units.milliseconds(interval[0])} – {units.milliseconds(interval[1])}{level}"


def latency(run: Any) -> Table | None:
    """Measured per-call latency at batch 1, with its interval, spread, verdict and peak memory."""
    from rpx_core.results.summary import timing_note

    rows, clocks, warnings = [], {}, []
    for model in run.models:
        result = ok_result(model, "measure_latency")
        if result is None:
            continue
        marks = latency_marks(result)
        verdict = _attr(result, "verdict") or fallback_verdict(result)
        interval = _attr(result, "p50_interval_ms")
        peak = result.peak_memory
        rows.append([
            Cell(model.name, model.name),
            Cell.of(result.p50_ms, units.milliseconds, marks),
            Cell(list(interval) if interval else None, interval_text(result)),
            Cell.of(result.p90_ms, units.milliseconds), Cell.of(result.p99_ms, units.milliseconds),
            Cell.of(result.mean_ms, units.milliseconds),
            Cell.of(result.spread, units.percent),
            Cell(result.samples_count, str(result.samples_count)),
            Cell(verdict, verdict),
            Cell.of(peak.peak_bytes if peak else None, units.size, " (sampled)" if peak and peak.sampled else ""),
            Cell.of(_attr(peak, "increment_bytes"), units.size),
        ])  # fmt: skip
        if (note := timing_note(model.name, model.summary)) is not None:
            warnings.append(note)
        clocks.setdefault(result.clock, []).append(model.name)
    if not rows:
        return None
    notes = [*warnings,
             "per call at batch 1, each call synchronised; percentiles by linear interpolation; spread = IQR / p50; "
             "call bytes: the measured region's peak less its start",
             *(f"{mark}: {meaning}" for mark, meaning in MARKS.items()),
             *(f"clock ({', '.join(names)}): {clock}" for clock, names in clocks.items())]
    return _table("latency", "Tier 3: measured latency", ["model", "p50 ms", "p50 interval ms", "p90 ms",
                  "p99 ms", "mean ms", "spread", "samples", "verdict", "peak memory bytes", "call bytes"], rows, notes)


def throughput(run: Any) -> Table | None:
    """Samples per second at each batch size (back-to-back calls timed as one region)."""
    rows = []
    for model in run.models:
        result = ok_result(model, "measure_latency")
        if result is None:
            continue
        for row in result.throughput:
            peak = row.peak_memory
            rows.append([
                Cell(model.name, model.name), Cell(row.batch_size, str(row.batch_size)),
                Cell.of(row.samples_per_s, lambda v: units.rate(v, " samples/s")),
                Cell.of(row.calls, str), Cell.of(row.seconds, units.seconds),
                Cell.of(peak.peak_bytes if peak else None, units.size),
                Cell(row.error, row.error or ""),
            ])  # fmt: skip
    if not rows:
        return None
    return _table("throughput", "Tier 3: throughput per batch size",
                  ["model", "batch", "samples/s", "calls", "seconds", "peak memory bytes", "note"], rows,
                  ["calls x batch / elapsed seconds of back-to-back calls; not a per-sample latency"])


def batch_search(run: Any) -> Table | None:
    """Every trial of the batch search, the chosen one marked, with the budget and the reason of the choice."""
    record = run.run_stages.get("batch_search")
    if record is None or record.status != "ok":
        return None
    result = record.result
    names = [stage.name for stage in result.stages]
    rows = []
    for trial in result.trials:
        chosen = trial.index == result.chosen_trial
        rows.append([
            Cell(trial.index, f"{trial.index}{' *' if chosen else ''}"),
            Cell(list(trial.batch_sizes), " x ".join(map(str, trial.batch_sizes))),
            *[Cell.of(stage.frames_per_second, lambda v: units.rate(v, " fps"), _noise(stage)) for stage in trial.stages],
            Cell.of(trial.frames_per_second, lambda v: units.rate(v, " fps")),
            Cell.of(trial.used_bytes, units.size),
            Cell(trial.failure or "ok", trial.failure or "ok"),
            Cell.of(trial.seconds, units.seconds),
        ])  # fmt: skip
    budget = (f"budget {units.size(result.budget_bytes)}, usable {units.size(result.usable_bytes)} "
              f"({'enforced' if result.budget_enforced else 'checked against readings'}; {result.memory_method})"
              + (f"; held to {result.budget_holds}" if _attr(result, "budget_holds") else ""))
    choice = (f"chosen: trial {result.chosen_trial}, batch sizes "
              + ", ".join(f"{n}={b}" for n, b in zip(names, result.chosen_batch_sizes))
              if result.chosen_batch_sizes else "no combination fits")
    return _table("batch_search", "Batch search: trials (* = chosen; ± = the trial's own noise)",
                  ["trial", "batch sizes", *[f"{name} frames/s" for name in names], "pipeline frames/s",
                   "used bytes", "outcome", "seconds"], rows, [choice, result.reason, budget])


def _noise(stage: Any) -> str:
    """A trial stage's own noise ((max - min) / (2 x median) of its chunks' rates) as " ±3%"; none when not recorded."""
    noise = _attr(stage, "noise")
    return "" if noise is None else f" ±{units.percent(noise)}"


def uncounted(run: Any) -> Table | None:
    """Operators that ran without a FLOP formula: their FLOPs are NOT in the totals."""
    rows = [[Cell(model.name, model.name), Cell(op, op), Cell(calls, str(calls))]
            for model in run.models if (flops := ok_result(model, "count_flops")) is not None
            for op, calls in flops.uncounted_ops.items()]
    if not rows:
        return None
    return _table("uncounted", "Operators without a FLOP formula (not in the totals)", ["model", "operator", "calls"],
                  rows)


def operators(run: Any) -> Table | None:
    """Per-operator totals (the counter's top entries; the rest folded into "(others)")."""
    rows = []
    for model in run.models:
        flops = ok_result(model, "count_flops")
        if flops is None:
            continue
        for op, stats in flops.by_operator.items():
            total = stats.matrix_flops + stats.other_flops
            moved = stats.bytes_read + stats.bytes_written
            rows.append([Cell(model.name, model.name), Cell(op, op), Cell(stats.calls, str(stats.calls)),
                         Cell.of(total, units.flops), Cell.of(stats.matrix_flops, units.flops),
                         Cell.of(moved, units.size), Cell.of(total / moved if moved else None, units.intensity)])
    if not rows:
        return None
    return _table("operators", "Per operator", ["model", "operator", "calls", "FLOPs", "matrix FLOPs",
                  "bytes (unfused)", "intensity (FLOP/B)"], rows)


def modules(run: Any) -> Table | None:
    """Per-module figures: exclusive (ops whose innermost module it is; they sum to the totals) and inclusive."""
    rows = []
    for model in run.models:
        flops = ok_result(model, "count_flops")
        if flops is None:
            continue
        for path, stats in flops.by_module.items():
            exclusive = stats.exclusive_matrix_flops + stats.exclusive_other_flops
            rows.append([Cell(model.name, model.name), Cell(path, path), Cell(stats.calls, str(stats.calls)),
                         Cell.of(exclusive, units.flops), Cell.of(stats.inclusive_flops, units.flops),
                         Cell.of(stats.exclusive_bytes_read + stats.exclusive_bytes_written, units.size),
                         Cell.of(stats.inclusive_bytes, units.size)])
    if not rows:
        return None
    return _table("modules", "Per module", ["model", "module", "calls", "FLOPs exclusive", "FLOPs inclusive",
                  "bytes exclusive", "bytes inclusive"], rows)


def stage_problems(run: Any) -> Table | None:
    """Stages that did not succeed, with the reason: nothing vanishes silently."""
    rows = [[Cell(model.name, model.name), Cell(stage, stage), Cell(record.status, record.status.replace("_", " ")),
             Cell(record.error, (record.error or "").splitlines()[0] if record.error else "")]
            for model in run.models for stage, record in model.stages.items() if record.status != "ok"]
    rows += [[Cell("<run>", "<run>"), Cell(stage, stage), Cell(record.status, record.status.replace("_", " ")),
              Cell(record.error, (record.error or "").splitlines()[0] if record.error else "")]
             for stage, record in run.run_stages.items() if record.status != "ok"]
    if not rows:
        return None
    return _table("problems", "Stages that did not succeed", ["model", "stage", "status", "reason"], rows)


def summary(run: Any) -> Table | None:
    """The flat summary fields of every model (the results file's ``summary`` tables), one column per field, in the
    files' own units (the field name says which)."""
    models = [model for model in run.models if model.summary]
    if not models:
        return None
    fields: list[str] = []
    for model in models:
        fields += [key for key in model.summary if key not in fields]
    rows = [[Cell(model.name, model.name),
             *(Cell.of(model.summary.get(key), lambda v: units.significant(v, 4) if isinstance(v, float) else str(v))
               for key in fields)] for model in models]
    return _table("summary", "Summary fields (units in the names: _ms, _gb, _m = millions, _g = billions)",
                  ["model", *fields], rows)


#: Every table ``rpx show`` knows, in the order it prints them.
BUILDERS: dict[str, Callable[[Any], Table | None]] = {
    "tier1": tier1, "roofline": roofline, "latency": latency, "throughput": throughput,
    "batch_search": batch_search, "uncounted": uncounted, "problems": stage_problems,
    "operators": operators, "modules": modules, "summary": summary,
}  # fmt: skip
#: Printed by default on the terminal (the breakdowns and the flat fields are asked for with ``--table``).
DEFAULT = ("tier1", "roofline", "latency", "throughput", "batch_search", "uncounted", "problems")
#: What ``rpx run`` prints when it ends (``rpx show`` prints the rest).
RUN_END = ("tier1", "roofline", "latency", "batch_search", "problems")


def tables(run: Any, names: Iterable[str] = DEFAULT) -> list[Table]:
    return [table for name in names if (table := BUILDERS[name](run)) is not None]


def footer(run: Any) -> list[str]:
    """The system card and provenance in a few lines, under the tables."""
    cards = [card for model in run.models if (card := ok_result(model, "system_card")) is not None]
    lines = [f"system: {line}" for line in dict.fromkeys(card.summary() for card in cards)]
    provenance = run.provenance
    lines.append(f"rpx {provenance.rpx_version}, Python {provenance.python}, schema {run.schema_version}; "
                 f"created {provenance.created}; spec {provenance.spec_hash[:12]}")
    return lines
