"""The run's results file while the run goes on.

It is rewritten atomically as results arrive, so a crash, an interrupt or a failing later stage never loses what was
already measured: at once after a measured stage, a failure, an interruption or a job placed on a node, and before a
measured stage starts; results that only count and bound (cheap to compute again) at most WRITE_INTERVAL seconds
after they arrive, together (a timer writes them if nothing else does), so a sweep of many small jobs does not rewrite
a growing file after each of its stages. A SIGKILL of rpx loses at most that window of Tier 1/2 results, which
``--resume`` computes again. Each rewrite serialises only the models that changed since the last one
(rpx_core.results.serialise.ModelCache)."""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path
from typing import Any, Literal

import attrs

from rpx_core.results.records import ModelResult, RunResult
from rpx_core.results.safe_write import Input, OutputError
from rpx_core.results.serialise import ModelCache, write


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


#: Seconds between two writes of results that only count and bound (see the module docstring).
WRITE_INTERVAL = 0.5


Save = Literal["now", "due", "later"]


class ResultsFile:
    """The run's results, rewritten atomically when something new is known (see the module docstring for when),
    never over an input of the run. Results held back ("due") are written from a timer thread, WRITE_INTERVAL after
    the last write, even if nothing else arrives (a long job after a quick one), and never by the thread that
    reported them: an executor's threads go on following their workers while the file is written (serialising a
    sweep's file takes tens of milliseconds). An error of such a write is raised by the next update or write."""

    def __init__(self, run: RunResult, path: Path | None, fmt: Literal["toml", "json"] | None = None,
                 protected: tuple[Input, ...] = (), order: tuple[str, ...] = ()) -> None:
        self.run = run
        self.path = path
        self.fmt = fmt
        self.protected = protected
        self.order = order  # job names in the plan's order
        self.unsaved = False
        self.saved_at = float("-inf")
        self._cache = ModelCache()  # used by one write at a time
        self._lock = threading.RLock()  # the state above, between executor threads and the timer thread; held briefly
        self._write_lock = threading.RLock()  # one write at a time, each of a newer state; taken before _lock
        self._timer: threading.Timer | None = None
        self._failed: OutputError | None = None  # the timer's write failed

    def update(self, *, save: Save = "now", **changes: Any) -> None:
        """Apply ``changes``; write now, at most WRITE_INTERVAL after the last write ("due"), or with the next
        write ("later")."""
        with self._lock:
            self._change(save, **changes)
        if save == "now":
            self.flush()

    def put_model(self, model: ModelResult, *, save: Save = "now") -> None:
        """Add or replace ``model``; a new one goes in the plan's order (``order``), whichever job reports first."""
        with self._lock:
            models = list(self.run.models)
            index = next((i for i, m in enumerate(models) if m.name == model.name), None)
            if index is not None:
                models[index] = model
            else:
                rank = {name: position for position, name in enumerate(self.order)}
                after = rank.get(model.name, len(rank))
                models.insert(next((i for i, m in enumerate(models) if rank.get(m.name, len(rank)) > after),
                                   len(models)), model)
            self._change(save, models=tuple(models))
        if save == "now":
            self.flush()

    def flush(self) -> None:
        """Write what is not written yet (after any write under way, which may have written it)."""
        with self._write_lock:
            with self._lock:
                self._raise_failed()
                if self.path is None or not self.unsaved:
                    return
                run, self.unsaved = self.run, False
            try:
                write(run, self.path, self.fmt, self.protected, self._cache)
            except BaseException as exc:
                with self._lock:
                    self.unsaved = True
                if isinstance(exc, OSError) and not isinstance(exc, OutputError):
                    raise OutputError(f"cannot write results to {self.path}: {exc.strerror or exc}") from None
                raise
            with self._lock:
                self.saved_at = time.monotonic()

    def close(self) -> None:
        """Stop the timer (the run wrote, or tried to write, what it has on its way out)."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            timer.join()

    def _change(self, save: Save, **changes: Any) -> None:
        self._raise_failed()
        self.run = attrs.evolve(self.run, **changes)
        self.unsaved = True
        if save == "due" and self._timer is None and self.path is not None:
            self._hold(max(0.0, WRITE_INTERVAL - (time.monotonic() - self.saved_at)))

    def _raise_failed(self) -> None:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def _hold(self, seconds: float) -> None:
        """Write in ``seconds`` (from a timer thread) what is not written by then."""
        self._timer = threading.Timer(seconds, self._flush_held)
        self._timer.daemon = True
        self._timer.start()

    def _flush_held(self) -> None:
        with self._write_lock:
            with self._lock:
                if self._timer is not threading.current_thread():
                    return  # closed meanwhile
                self._timer = None
                wait = WRITE_INTERVAL - (time.monotonic() - self.saved_at)
                if self.unsaved and wait > 0:  # written meanwhile: the window starts again from that write
                    self._hold(wait)
                    return
            try:
                self.flush()
            except OutputError as exc:
                with self._lock:
                    self._failed = exc
