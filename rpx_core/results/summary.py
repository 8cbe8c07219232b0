"""A model's flat, table-friendly summary fields: each stage declares its own.

The fields and their definitions are declared with the stages (``Stage.summary``; the built-in ones are listed in
``rpx_plugins/stages/``); absent figures are left out, never zero.
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
