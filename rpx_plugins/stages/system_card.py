"""system_card: the declaration of the stage that describes the machine and the run settings, and the line it adds
under every table (the machine, once per distinct card). The implementation: rpx_plugins.system_card."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rpx_core.plugin import Stage, SystemCard, ok_result


def machine_lines(run: Any) -> Iterable[str]:
    """One ``system: ...`` line per distinct machine the run's models ran on."""
    cards = [card for model in run.models if (card := ok_result(model, "system_card")) is not None]
    return [f"system: {line}" for line in dict.fromkeys(card.summary() for card in cards)]


SYSTEM_CARD = Stage(
    "system_card",
    "the machine and run settings (OS, CPU, RAM, accelerators, library versions)",
    result=SystemCard,
    footer=machine_lines,
    doc="Describe the machine and the run settings (MLPerf field names; gaps listed, never faked).",
)
