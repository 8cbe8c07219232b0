"""A model's flat, table-friendly summary fields (each stage declares its own), and the note a latency result
that is not stable gets on the console (rpx_core.show.tables).

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


def timing_note(name: str, summary: dict[str, Any]) -> str | None:
    """One line under the table for a latency that is not stable, saying why and what would help."""
    verdict, count = summary.get("latency_verdict"), summary.get("latency_samples")
    count = int(count) if isinstance(count, float) else count  # summary fields are floats: "194 samples", not 194.0
    confidence = f"{summary.get('latency_interval_confidence', 0.95):.0%}"
    if verdict == "too_few_samples":
        return (f"{name}: latency p50 from {count} samples has no {confidence} confidence interval: do not trust it; "
                "raise [options.measure_latency] max_seconds or min_samples")
    if verdict == "noisy":
        return (f"{name}: latency is noisy: the median's {confidence} interval is wider than the target width after "
                f"{count} samples; quiet the machine or raise max_seconds")
    return None
