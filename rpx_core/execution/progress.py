"""Progress of a running stage: ``ctx.progress(phase, done, total)`` becomes a :class:`Progress` event that travels
to rpx's own process like the stage's start and end events (through the worker's channel), where the console shows it.

Stages call it from their measuring loops, so it must cost next to nothing and never flood the channel: events are
sent at most every :data:`INTERVAL` seconds, plus the first and the last of each phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

#: Seconds between two events of one phase (the console redraws at about this rate anyway).
INTERVAL = 0.2


@attrs.frozen
class Progress:
    """``done`` of ``total`` units of ``phase`` (e.g. "latency sampling", 300 of 662 calls) of stage ``stage``;
    ``total`` is None when the end is not known in advance (a search)."""

    stage: str
    phase: str
    done: int
    total: int | None = None


class ProgressReporter:
    """What a stage's ``ctx.progress`` calls: throttles, names the running stage, hands events to ``send``."""

    def __init__(self, send: Callable[[Progress], Any] | None = None) -> None:
        self.send = send
        self.stage = ""
        self._phase: str | None = None
        self._last = 0.0

    def begin(self, stage: str) -> None:
        self.stage, self._phase = stage, None

    def __call__(self, phase: str, done: int, total: int | None = None) -> None:
        if self.send is None:
            return
        now = time.monotonic()
        boundary = phase != self._phase or (total is not None and done >= total)
        if not boundary and now - self._last < INTERVAL:
            return
        self._phase, self._last = phase, now
        self.send(Progress(self.stage, phase, done, total))
