"""Time limits that hold: how jobs are isolated and bounded (the spec's ``[execution]`` table) and the deadline object
that stages use to stop starting new work once their own time is up.

Two kinds of limit work together. A :class:`Deadline` is cooperative: a stage checks it between calls (warm-up,
samples, throughput rows) and stops starting new calls, so it ends soon after the deadline with everything it measured.
The executor's ``stage_timeout`` and ``job_timeout`` are hard: a worker that runs past them is killed, whatever it
is doing (a hang at import, an endless forward), and the stage is recorded as timed out.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import attrs

#: A duration above a week is almost certainly a unit mistake (milliseconds written as seconds), and would make a
#: limit that never fires: refused at validation.
MAX_SECONDS = 7 * 24 * 3600.0

Isolation = Literal["auto", "worker", "in-process"]


def seconds_validator(*, allow_zero: bool = False) -> Any:
    """An attrs validator for a duration in seconds: finite, > 0 (or >= 0), and at most :data:`MAX_SECONDS`."""

    def check(_: Any, attribute: attrs.Attribute, value: float) -> None:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number of seconds: {value}")
        if value < 0 or (value == 0 and not allow_zero):
            raise ValueError(f"must be {'>= 0' if allow_zero else '> 0'}: {value:g}")
        if value > MAX_SECONDS:
            raise ValueError(f"must be at most a week ({MAX_SECONDS:.0f} s), is the unit right?: {value:g}")

    return check


@attrs.frozen
class Execution:
    """The spec's ``[execution]`` table (``rpx run`` flags override it): how model code is contained and bounded.

    ``isolation = "worker"`` runs each model's stages in a worker process started for that job (forked from a
    process that imported the framework once), so a segfault, ``sys.exit``, an out-of-memory kill or a hang ends that
    job only and is recorded. ``"in-process"`` runs everything in rpx's own process (for debuggers and profilers of
    rpx itself); time limits then interrupt Python code only, not a call stuck in C. ``"auto"`` (the default) is
    "worker", except for a Python API run holding live objects (a model object given to ``profile()``, a plugin
    registered at run time), which only rpx's own process has.
    """

    isolation: Isolation = "auto"
    #: Seconds any one stage of a job may run (building the model included) before it is killed and recorded.
    stage_timeout: float = attrs.field(default=3600.0, validator=seconds_validator())
    #: Seconds all stages of one model job may run together.
    job_timeout: float = attrs.field(default=4 * 3600.0, validator=seconds_validator())
    #: Seconds an interrupted worker gets to record what its stage finished before it is killed.
    interrupt_grace: float = attrs.field(default=10.0, validator=seconds_validator())
    #: Which executor runs the jobs (``rpx plugins`` lists them): "local" (this machine) or one a plugin adds ("ray").
    executor: str = "local"
    #: The executor's own settings (its options class: local ``workers``; ray ``address``, ``retries``, ...).
    executor_options: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen
class Deadline:
    """A point in time (``time.monotonic``) after which no new work should start. ``None`` seconds: no deadline."""

    at: float = math.inf

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(math.inf if seconds is None else time.monotonic() + seconds)

    def remaining(self) -> float:
        """Seconds left (0 once passed; ``inf`` without a deadline)."""
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def extended(self, seconds: float) -> Deadline:
        """The same deadline ``seconds`` later (time spent on rpx's own housekeeping is not the budget's)."""
        return Deadline(self.at + seconds)

    def earliest(self, other: Deadline) -> Deadline:
        return self if self.at <= other.at else other
