"""What ``rpx run`` shows while it runs: which model and stage, progress and time left, each stage's outcome.

Four modes, one observer interface (``console(model, event)`` for every :mod:`rpx_core.execution.tasks` event):

* ``live``: a terminal (stderr is a TTY): rich progress bars with elapsed and remaining time for long phases;
* ``plain``: piped or redirected: one line when a stage starts and one when it ends, nothing redrawn;
* ``jsonl``: one JSON object per event on stdout, for scripts and CI (the results path is the last event);
* ``quiet``: nothing but failed stages.

Progress and stage lines go to stderr in the human modes, so stdout holds only the summary tables. Model and stage
names and errors are shown as text (rpx_core.show.text), never as terminal escapes or rich markup.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Literal, TextIO

from rpx_core.execution.progress import Progress
from rpx_core.execution.tasks import Finished, Started
from rpx_core.show import units
from rpx_core.show.text import shown

Mode = Literal["live", "plain", "jsonl", "quiet"]

#: Status words as the console shows them; rich styles in live mode.
STYLES = {"ok": "green", "failed": "bold red", "skipped": "yellow", "interrupted": "bold yellow"}


def choose_mode(*, quiet: bool, events: str | None, stream: TextIO | None = None) -> Mode:
    """``stream``: where progress goes (default: the current ``sys.stderr``, looked up at each call)."""
    if events == "jsonl":
        return "jsonl"
    if quiet:
        return "quiet"
    stream = stream or sys.stderr
    return "live" if stream.isatty() else "plain"


class RunConsole:
    """The observer handed to :func:`rpx_core.api.run_spec`; a context manager (live mode draws while inside)."""

    def __init__(self, mode: Mode, *, err: TextIO | None = None, out: TextIO | None = None) -> None:
        self.mode = mode
        self.err = err or sys.stderr
        self.out = out or sys.stdout
        self._started: dict[tuple[str, str], float] = {}
        self._phase_started: dict[tuple[str, str, str], float] = {}
        self._live: Any = None
        self._tasks: dict[tuple[str, str], Any] = {}
        self._phases: dict[Any, str] = {}
        self._status: Any = None  # the live display's note line, until the first stage starts

    def __enter__(self) -> RunConsole:
        if self.mode == "live":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bars

            self._console = Console(file=self.err)
            self._live = Bars(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=self._console,
                              transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def note(self, text: str) -> None:
        """What the run is doing before its first stage starts (checking the spec, starting the workers), on a
        terminal only: a spinner line, replaced by the next note and gone when the first stage starts or the run
        ends, so the screen is never blank and an error stays its one line."""
        if self.mode != "live" or self._live is None:
            return
        label = f"rpx: {shown(text)}"
        if self._status is None:
            self._status = self._live.add_task(label, total=None)
        else:
            self._live.update(self._status, description=label)

    # -- events ------------------------------------------------------------------------------------------------------

    def __call__(self, model: str, event: Started | Finished | Progress) -> None:
        if isinstance(event, Started):
            self._started[(model, event.stage)] = time.monotonic()
            self._on_start(model, event.stage)
        elif isinstance(event, Progress):
            self._on_progress(model, event)
        else:
            self._on_finish(model, event.stage, event.record)

    def _on_start(self, model: str, stage: str) -> None:
        if self.mode == "jsonl":
            self._emit({"event": "stage_started", "model": model, "stage": stage})
        elif self.mode == "plain":
            print(f"  {shown(model):<20} {shown(stage):<18} running", file=self.err, flush=True)
        elif self.mode == "live":
            if self._status is not None:  # the first stage: the notes have said their piece
                self._live.remove_task(self._status)
                self._status = None
            self._tasks[(model, stage)] = self._live.add_task(_markup(f"{model} · {stage}"), total=None)

    def _on_progress(self, model: str, event: Progress) -> None:
        key = (model, event.stage, event.phase)
        started = self._phase_started.setdefault(key, time.monotonic())
        if self.mode == "jsonl":
            self._emit({"event": "progress", "model": model, "stage": event.stage, "phase": event.phase,
                        "done": event.done, "total": event.total, "eta_s": eta(started, event)})
        elif self.mode == "live" and (model, event.stage) in self._tasks:
            task, label = self._tasks[(model, event.stage)], _markup(f"{model} · {event.stage} · {event.phase}")
            if self._phases.get(task) != event.phase:  # a new phase: its own clock, so the time left is its own
                self._phases[task] = event.phase
                self._live.reset(task, description=label, total=event.total, completed=event.done)
            else:
                self._live.update(task, completed=event.done, total=event.total)

    def _on_finish(self, model: str, stage: str, record: Any) -> None:
        seconds = record.seconds
        if seconds is None and (model, stage) in self._started:
            seconds = time.monotonic() - self._started[(model, stage)]
        reason = record.error.splitlines()[0] if record.error else ""
        if self.mode == "jsonl":
            self._emit({"event": "stage_finished", "model": model, "stage": stage, "status": record.status,
                        "seconds": record.seconds, "error": reason or None})
            return
        if self.mode == "quiet" and record.status == "ok":
            return
        took = units.seconds(seconds) if seconds is not None else ""
        line = f"  {shown(model):<20} {shown(stage):<18} {record.status:<8} {took}"
        line = f"{line}  {shown(reason)}".rstrip() if reason else line.rstrip()
        if self.mode == "live":
            task = self._tasks.pop((model, stage), None)
            if task is not None:
                self._live.remove_task(task)
            from rich.markup import escape

            style = STYLES.get(record.status, "")
            self._console.print(escape(line).replace(record.status, f"[{style}]{record.status}[/]", 1), highlight=False)
        else:
            print(line, file=self.err, flush=True)

    def finished(self, results_path: Any, ok: bool) -> None:
        """The run is over: where its results are."""
        if self.mode == "jsonl":
            self._emit({"event": "run_finished", "ok": ok, "results": str(results_path)})

    # -- helpers ------------------------------------------------------------------------------------------------------

    def _emit(self, data: dict[str, Any]) -> None:
        print(json.dumps(data), file=self.out, flush=True)


def print_tables(run: Any, stages: Any) -> None:
    """The tables a run ends with (what ``rpx show`` prints without ``--table``), on stdout: coloured on a terminal,
    plain when piped."""
    from rpx_core.show import declared
    from rpx_core.show import formats as render

    render.terminal(declared.tables(run, stages), [], sys.stdout)


def _markup(text: str) -> str:
    """``text`` for a rich progress bar's label, which reads rich markup: shown as text, brackets escaped."""
    from rich.markup import escape

    return escape(shown(text))


def eta(started: float, event: Progress) -> float | None:
    """Seconds left at the phase's rate so far; None when the end is unknown or nothing is done yet."""
    if event.total is None or event.done <= 0:
        return None
    elapsed = time.monotonic() - started
    return round(max(0.0, elapsed * (event.total - event.done) / event.done), 3)
