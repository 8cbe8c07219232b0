"""Runners: how a task's stages run on this machine, and what happens when user code crashes, hangs, exits or is
interrupted.

A runner has one method, ``run(task, report)``: run the :class:`rpx_core.execution.tasks.Task` (pure data) and call
``report`` with each :class:`~rpx_core.execution.tasks.Started` / :class:`~rpx_core.execution.tasks.Finished` event, in rpx's
own process, in order. Whatever happens to the code it runs, every stage of the task ends up reported: a stage the
worker died in is failed with the exit code or signal and the tail of the worker's stderr, a stage past its time limit
is failed as timed out, and the stages after it are skipped with the reason. On SIGINT/SIGTERM the running stage is
reported as interrupted and ``run`` raises :class:`rpx_core.execution.interrupts.Interrupted`.

* :class:`WorkerRunner` (the default): tasks in worker processes forked from the zygote (:mod:`rpx_core.execution.zygote`;
  a measured task in a fresh one of its own; others may follow each other in one); rpx's own process never runs user
  code. Time limits are hard (the worker's process group is killed).
* :class:`InProcessRunner`: everything in this process (debuggers; live model objects from the Python API). Time
  limits interrupt Python code through SIGALRM (main thread only); a crash in user code ends rpx.

Which task runs when, and on which machine, is for the executors of :mod:`rpx_core.execution.executors` (plugins) to
decide; they run a task here through one of these runners, or elsewhere with
:func:`rpx_core.execution.executors.run_task_elsewhere`."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from rpx_core.execution.interrupts import Interrupted, signal_of
from rpx_core.execution.progress import Progress
from rpx_core.execution.stage_loop import execute, failed_records
from rpx_core.execution.tasks import Finished, Report, Setup, StageTimeout, Started, Task
from rpx_core.execution.worker import plugin_identity
from rpx_core.execution.zygote import _DEAD, _TIMEOUT, Worker, Zygote, ZygoteLost
from rpx_core.results.records import StageRecord
from rpx_core.spec.limits import Deadline, Execution


class Runner(Protocol):
    """Runs one task on this machine (the executors of rpx_core.execution.executors decide which task runs when)."""

    def run(self, task: Task, report: Report) -> None: ...


def make_runner(plugins: Any, execution: Execution, model_objects: dict[str, Any] | None,
                preload: tuple[str, ...] = ()) -> InProcessRunner | WorkerRunner:
    """What runs one task on this machine. ``auto`` isolation: worker processes, unless the run holds live objects
    (models or plugins given to the Python API), which only rpx's own process has."""
    from rpx_core.errors import RpxError

    live = bool(model_objects) or any(info.distribution == "<runtime>" for info in plugins.infos())
    isolation = execution.isolation if execution.isolation != "auto" else ("in-process" if live else "worker")
    if isolation == "in-process":
        return InProcessRunner(plugins, execution, model_objects)
    if model_objects:
        raise RpxError('a live model object cannot be sent to a worker process; use isolation "in-process"')
    return WorkerRunner(setup_for(plugins), execution, preload)


class InProcessRunner:
    """Runs tasks in rpx's own process, with the caller's plugin objects and live models."""

    def __init__(self, plugins: Any, limits: Execution, model_objects: dict[str, Any] | None = None) -> None:
        self.plugins = plugins
        self.limits = limits
        self.model_objects = model_objects

    def run(self, task: Task, report: Report) -> None:
        job_deadline = Deadline.after(self.limits.job_timeout if task.scope == "model" else None)

        def guard(stage: str) -> contextlib.AbstractContextManager[None]:
            return alarm(self.limits.stage_timeout, job_deadline, stage)

        execute(task, self.plugins, report, model_objects=self.model_objects, guard=guard)


@contextlib.contextmanager
def alarm(stage_timeout: float, job_deadline: Deadline, stage: str) -> Iterator[None]:
    """Raise StageTimeout into the stage when the nearer of its own and its job's limit passes (main thread only)."""
    seconds = min(stage_timeout, job_deadline.remaining())
    which = "stage_timeout" if seconds == stage_timeout else "job_timeout"
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise StageTimeout(timeout_message(stage, which, stage_timeout if which == "stage_timeout" else None))

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def timeout_message(stage: str, which: str, seconds: float | None) -> str:
    limit = f" of {seconds:g} s" if seconds is not None else ""
    return f"timed out: stage {stage!r} ran past the {which}{limit} and was stopped"


def setup_for(plugins: Any) -> Setup:
    """What a worker needs to load the same plugins in the same environment as this process."""
    runtime = [info.name for info in plugins.infos() if info.distribution == "<runtime>" and info.status == "loaded"]
    if runtime:
        from rpx_core.errors import RpxError

        raise RpxError(f"plugin(s) {', '.join(runtime)} were registered at run time and cannot be loaded in a worker "
                       'process; use execution.isolation = "in-process" (isolation="in-process" in the Python API)')
    disabled = tuple(sorted(info.name for info in plugins.infos() if info.status == "disabled"))
    return Setup(disabled, plugin_identity(plugins), dict(os.environ), tuple(sys.path), os.getcwd())


class WorkerRunner:
    """Tasks in worker processes; the limits are enforced here, from outside the worker.

    A measured task gets a fresh worker of its own, ended after it. A task that only counts and bounds takes an
    idle worker whose earlier tasks all ended cleanly and measured nothing, if there is one (forking a torch-sized
    process and ending it costs more than such a task), and leaves it idle for the next; a worker that crashed,
    timed out, was interrupted, could not start its task or had a stage fail (an exception or ``sys.exit`` in user
    code may leave the process in any state, e.g. a broken CUDA context) is ended. A measured task ends the idle
    workers before it starts, and :meth:`close` ends them at the end of the run."""

    def __init__(self, setup: Setup, limits: Execution, preload: tuple[str, ...] = ()) -> None:
        self.setup = setup
        self.limits = limits
        self.preload = preload  # imported in the zygote before it forks (the backend's worker_preload)
        self._running: set[Worker] = set()  # workers of tasks running now (several, from an executor's threads)
        self._idle: list[Worker] = []
        self._starting: list[Zygote] = []  # the zygote each thread now waiting for a fork asked
        self._interrupted: int | None = None  # the signal that stopped the run: no task starts after it
        self._lock = threading.Lock()

    def run(self, task: Task, report: Report) -> None:
        if task.measured:  # idle workers hold memory (a CUDA context, cached blocks) the measured task must have
            self.close()
        with self._lock:
            worker = self._idle.pop() if self._idle and not task.measured else None
        if worker is None:
            try:
                worker = self._start()
            except ZygoteLost as exc:
                if self._interrupted is not None:  # ended by interrupt(): the job stays unfinished, for --resume
                    raise Interrupted(self._interrupted) from None
                for event in failed_records(task.stages, f"no worker could be started: {exc}"):
                    report(event)
                return
        with self._lock:
            stopped = self._interrupted
            if stopped is None:
                self._running.add(worker)
        if stopped is not None:
            worker.close()
            raise Interrupted(stopped)
        clean = False
        try:
            worker.begin_task()
            worker.connection.send(self.setup)
            worker.connection.send(task)
            supervisor = _Supervisor(worker, task, report, self.limits)
            supervisor.follow()
            clean = supervisor.clean and not task.measured and not worker.zygote.gone()
        finally:
            with self._lock:
                self._running.discard(worker)
                if clean:
                    self._idle.append(worker)
            if not clean:
                worker.close()

    def _start(self) -> Worker:
        """A fresh worker; a zygote found dead (the out-of-memory killer, a model's code killing its parent) is
        replaced by a new one, once."""
        for attempt in range(2):
            zygote = Zygote.shared()
            with self._lock:  # as one step against interrupt(): it ends this zygote, or no fork is asked
                if self._interrupted is not None:
                    raise Interrupted(self._interrupted)
                self._starting.append(zygote)
            try:
                return zygote.start(self.preload, self.setup.disabled)
            except ZygoteLost:
                if attempt or self._interrupted is not None:
                    raise
            finally:
                with self._lock:
                    self._starting.remove(zygote)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """End the idle workers (before a measured task, at the end of a run)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:  # all killed first: their processes end side by side
            worker.kill()
        for worker in idle:
            worker.close()

    def interrupt(self, signum: int) -> None:
        """Forward ``signum`` to every running worker: each reports its stage as interrupted and ends its task
        (for tasks followed from other threads, which never see the main thread's KeyboardInterrupt). No task
        starts after it, and a zygote that threads wait on for a fork (busy importing the framework, say) is ended
        at once, so that nothing holds the run past the interrupt grace."""
        with self._lock:
            self._interrupted = signum
            running, starting = list(self._running), set(self._starting)
        for worker in running:
            worker.signal(signum)
        for zygote in starting:
            zygote.close(timeout=0)


class _Supervisor:
    """Follows one worker's events, enforcing the limits; turns a worker's end into records for every stage."""

    def __init__(self, worker: Worker, task: Task, report: Report, limits: Execution) -> None:
        self.worker, self.task, self.report, self.limits = worker, task, report, limits
        self.job_deadline = Deadline.after(limits.job_timeout if task.scope == "model" else None)
        self.stage: str | None = None
        self.stage_deadline = Deadline()
        self.stage_started = 0.0
        self.finished: list[str] = []
        self.failed = False  # a stage failed in the worker (an exception, sys.exit): its state is suspect
        self.clean = False  # the worker said the task was done, having reported every stage itself, none failed

    def follow(self) -> None:
        try:
            self._follow()
        except KeyboardInterrupt as interrupt:
            self._stop(signal_of(interrupt))
            raise Interrupted(signal_of(interrupt)) from None

    def _follow(self) -> None:
        while True:
            deadline = self.stage_deadline.earliest(self.job_deadline) if self.stage else self.job_deadline
            event = self.worker.next_event(deadline.remaining())
            if event is _TIMEOUT:
                which = "stage_timeout" if self.stage_deadline.at <= self.job_deadline.at else "job_timeout"
                seconds = self.limits.stage_timeout if which == "stage_timeout" else self.limits.job_timeout
                self.worker.kill()
                self._end(timeout_message(self.stage or self.task.stages[0], which, seconds))
                return
            if event is _DEAD:
                self._end(self._death())
                return
            if event is None:  # the worker finished the task
                self.clean = set(self.finished) == set(self.task.stages) and not self.failed
                return
            if isinstance(event, tuple) and event[0] == "error":
                self._end(event[1], traceback=event[2])
                return
            self._handle(event)

    def _handle(self, event: Started | Finished | Progress) -> None:
        if isinstance(event, Progress):  # the stage is alive and says how far it got: passed on, no state changes
            self.report(event)
            return
        if isinstance(event, Started):
            self.stage, self.stage_started = event.stage, time.perf_counter()
            self.stage_deadline = Deadline.after(self.limits.stage_timeout)
        else:
            self.stage = None
            self.finished.append(event.stage)
            self.failed = self.failed or event.record.status == "failed"
        self.report(event)

    def _death(self) -> str:
        code = self.worker.wait()
        where = f"during stage {self.stage!r}" if self.stage else "between stages"
        if code is None:
            return f"worker lost {where}, how it ended is unknown: {self.worker.zygote.death()}"
        if code < 0:
            name = signal.Signals(-code).name
            cause = {"SIGKILL": " (killed: the system's out-of-memory killer, or another process)",
                     "SIGSEGV": " (segmentation fault)", "SIGABRT": " (aborted)", "SIGBUS": " (bus error)"}
            return f"worker crashed {where}: killed by signal {name}{cause.get(name, '')}"
        return f"worker exited with code {code} {where} (sys.exit or os._exit in user code, or a crash)"

    def _end(self, error: str, *, traceback: str | None = None) -> None:
        """Record the running (or next) stage as failed with ``error`` (and the worker's last words) and every
        stage after it as skipped."""
        self.worker.kill()  # whatever is left of its process group
        tail = self.worker.stderr_tail()
        remaining = tuple(name for name in self.task.stages if name not in self.finished)
        seconds = round(time.perf_counter() - self.stage_started, 6) if self.stage else None
        for event in failed_records(remaining, error, seconds=seconds, traceback=traceback, stderr_tail=tail or None):
            self.report(event)

    def _stop(self, signum: int) -> None:
        """Forward the signal, give the worker its grace to report the interrupted stage, then make sure it is gone."""
        self.worker.signal(signum)
        grace = Deadline.after(self.limits.interrupt_grace)
        try:
            while True:
                event = self.worker.next_event(grace.remaining())
                if event is None or event is _DEAD or event is _TIMEOUT or isinstance(event, tuple):
                    break
                self._handle(event)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting
        self.worker.kill()
        if self.stage is not None:
            self.report(Finished(self.stage, StageRecord("interrupted", error=f"interrupted by "
                                                         f"{signal.Signals(signum).name}")))
