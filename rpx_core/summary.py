"""A model's flat, table-friendly summary fields (each stage declares its own), and the short terminal summary of a run.

The fields and their definitions are declared with the stages (``Stage.summary``; the built-in ones are listed in
``rpx_plugins/stages.py``); absent figures are left out, never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def summarise(records: Mapping[str, Any], stages: Mapping[str, Any]) -> dict[str, float | str]:
    """Every successful stage's summary fields, given the stage declarations by name."""
    ok = {name: record.result for name, record in records.items() if record.status == "ok"}
    fields: dict[str, float | str] = {}
    for name, result in ok.items():
        if name in stages:
            fields.update(stages[name].summary(result, ok))
    return fields


#: (summary key, column heading) of the per-model table, in order; a column appears when any model has the figure.
COLUMNS = (
    ("params_m", "params M"),
    ("flops_g", "GFLOPs"),
    ("macs_g", "GMACs"),
    ("memory_traffic_gb", "traffic GB"),
    ("fused_traffic_gb", "fused GB"),
    ("arithmetic_intensity", "FLOP/B"),
    ("actmem_gb_fp16", "act GB fp16"),
    ("latency_p50_ms", "p50 ms [CI]"),
    ("latency_verdict", "timing"),
    ("latency_p99_ms", "p99 ms"),
    ("peak_memory_mb", "peak MB"),
    ("peak_increment_mb", "call +MB"),
)


def render_run(run: Any) -> str:
    """A short terminal summary: a table of headline figures, roofline bounds per GPU, and what did not succeed."""
    rows = [(model.name, model.summary) for model in run.models if model.stages]
    columns = [(key, title) for key, title in COLUMNS if any(key in summary for _, summary in rows)]
    lines = table(["model", *(title for _, title in columns)],
                  [[name, *(_cell(summary, key) for key, _ in columns)] for name, summary in rows]) if rows else []
    lines += [line for name, summary in rows if (line := timing_note(name, summary))]
    bounds = sorted({key for _, summary in rows for key in summary if key.startswith("roofline_") and key.endswith("_ms")
                     and key != "roofline_bound_ms"})
    if bounds:
        lines += ["", "roofline lower bound, ms (whole model, fused traffic; * = memory-bound):"]
        lines += table(["model", *(key.removeprefix("roofline_").removesuffix("_ms") for key in bounds)],
                       [[name, *(_bound_cell(summary, key) for key in bounds)] for name, summary in rows])
    lines += skipped_rooflines(run)
    for model in run.models:
        for stage, record in model.stages.items():
            if record.status != "ok":
                lines.append(f"{model.name}: {stage} {record.status}: {(record.error or '').splitlines()[0] if record.error else ''}")
    for stage, record in run.run_stages.items():
        lines.append(f"{stage}: {record.status}" + (f": {record.error.splitlines()[0]}" if record.error else ""))
        if stage == "batch_search" and record.status == "ok":
            from rpx_core.types.batch_search import format_table

            lines += ["", format_table(record.result)]
    return "\n".join(lines)


#: How the summary table's "timing" column shows each latency verdict (loud where the p50 must not be trusted).
VERDICT_MARKS = {"stable": "stable", "noisy": "NOISY", "too_few_samples": "TOO FEW"}


def _cell(summary: dict[str, Any], key: str) -> str:
    """A table cell; the p50 carries its interval beside it and the verdict its sample count when not stable."""
    value = summary.get(key, "-")
    if key == "latency_p50_ms" and "latency_p50_low_ms" in summary:
        return f"{format_value(value)} [{format_value(summary['latency_p50_low_ms'])}, " \
               f"{format_value(summary['latency_p50_high_ms'])}]"
    if key == "latency_verdict" and value in VERDICT_MARKS:
        mark = VERDICT_MARKS[value]
        return mark if value == "stable" else f"{mark} (n={summary.get('latency_samples', '?')})"
    return format_value(value)


def timing_note(name: str, summary: dict[str, Any]) -> str | None:
    """One line under the table for a latency that is not stable, saying why and what would help."""
    verdict, count = summary.get("latency_verdict"), summary.get("latency_samples")
    confidence = f"{summary.get('latency_interval_confidence', 0.95):.0%}"
    if verdict == "too_few_samples":
        return (f"{name}: latency p50 from {count} samples has no {confidence} confidence interval: do not trust it; "
                "raise [options.measure_latency] max_seconds or min_samples")
    if verdict == "noisy":
        return (f"{name}: latency is noisy: the median's {confidence} interval is wider than the target width after "
                f"{count} samples; quiet the machine or raise max_seconds")
    return None


def skipped_rooflines(run: Any) -> list[str]:
    """One line per (GPU, precision) the roofline could not bound, with the reason, so no GPU vanishes silently."""
    lines = []
    for model in run.models:
        record = model.stages.get("roofline")
        if record is not None and record.status == "ok":
            lines += [f"{model.name}: roofline skipped for {skip.gpu} at {skip.precision}: {skip.reason}"
                      for skip in record.result.skipped]
    return lines


def _bound_cell(summary: dict[str, Any], key: str) -> str:
    if key not in summary:
        return "-"
    memory = summary.get("bottleneck_" + key.removeprefix("roofline_").removesuffix("_ms")) == "memory"
    return format_value(summary[key]) + ("*" if memory else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]


def format_value(value: float | str) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
