"""Runners: how a task's stages run on this machine, and what happens when user code crashes, hangs, exits or is
interrupted.

A runner has one method, ``run(task, report)``: run the :class:`rpx_core.worker.Task` (pure data) and call
``report`` with each :class:`~rpx_core.worker.Started` / :class:`~rpx_core.worker.Finished` event, in rpx's own
process, in order. Whatever happens to the code it runs, every stage of the task ends up reported: a stage the worker
died in is failed with the exit code or signal and the tail of the worker's stderr, a stage past its time limit is
failed as timed out, and the stages after it are skipped with the reason. On SIGINT/SIGTERM the running stage is
reported as interrupted and ``run`` raises :class:`rpx_core.interrupts.Interrupted`.

* :class:`WorkerExecutor` (the default): tasks in worker processes forked from a zygote that imported the
  framework once (a measured task in a fresh one of its own; others may follow each other in one); rpx's own
  process never runs user code. Time limits are hard (the worker's process group is killed).
* :class:`InProcessExecutor`: everything in this process (debuggers; live model objects from the Python API). Time
  limits interrupt Python code through SIGALRM (main thread only); a crash in user code ends rpx.

Which task runs when, and on which machine, is for the executors of :mod:`rpx_core.scheduling` (plugins) to decide;
they run a task here through one of these runners, or elsewhere with :func:`rpx_core.scheduling.run_task_elsewhere`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, Protocol

from rpx_core.interrupts import Interrupted, signal_of
from rpx_core.limits import Deadline, Execution
from rpx_core.progress import Progress
from rpx_core.results import StageRecord
from rpx_core.worker import (
    Finished,
    Report,
    Setup,
    StageTimeout,
    Started,
    Task,
    execute,
    failed_records,
    plugin_identity,
)

#: How much of a dead worker's stderr is kept in its stage record.
STDERR_TAIL_CHARS = 4000


class Runner(Protocol):
    """Runs one task on this machine (the executors of rpx_core.scheduling decide which task runs when)."""

    def run(self, task: Task, report: Report) -> None: ...


# -- in this process ---------------------------------------------------------------------------------------------------


class InProcessExecutor:
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


# -- in worker processes -----------------------------------------------------------------------------------------------


def setup_for(plugins: Any) -> Setup:
    """What a worker needs to load the same plugins in the same environment as this process."""
    runtime = [info.name for info in plugins.infos() if info.distribution == "<runtime>" and info.status == "loaded"]
    if runtime:
        from rpx_core.errors import RpxError

        raise RpxError(f"plugin(s) {', '.join(runtime)} were registered at run time and cannot be loaded in a worker "
                       'process; use execution.isolation = "in-process" (isolation="in-process" in the Python API)')
    disabled = tuple(sorted(info.name for info in plugins.infos() if info.status == "disabled"))
    return Setup(disabled, plugin_identity(plugins), dict(os.environ), tuple(sys.path), os.getcwd())


class WorkerExecutor:
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
        self._lock = threading.Lock()

    def run(self, task: Task, report: Report) -> None:
        if task.measured:  # idle workers hold memory (a CUDA context, cached blocks) the measured task must have
            self.close()
        with self._lock:
            worker = self._idle.pop() if self._idle and not task.measured else None
        if worker is None:
            worker = Zygote.shared().start(self.preload, self.setup.disabled)
        with self._lock:
            self._running.add(worker)
        clean = False
        try:
            worker.begin_task()
            worker.connection.send(self.setup)
            worker.connection.send(task)
            supervisor = _Supervisor(worker, task, report, self.limits)
            supervisor.follow()
            clean = supervisor.clean and not task.measured
        finally:
            with self._lock:
                self._running.discard(worker)
                if clean:
                    self._idle.append(worker)
            if not clean:
                worker.close()

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
        (for tasks followed from other threads, which never see the main thread's KeyboardInterrupt)."""
        with self._lock:
            running = list(self._running)
        for worker in running:
            worker.signal(signum)


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


_TIMEOUT, _DEAD = object(), object()


class Worker:
    """One forked worker as seen from rpx: its job channel, its process group, its stderr (forwarded and kept)."""

    def __init__(self, zygote: Zygote, pid: int, connection: Connection, stderr_fd: int) -> None:
        self.zygote, self.pid, self.connection = zygote, pid, connection
        self._tail: collections.deque[str] = collections.deque()
        self._tail_chars = 0
        self._tail_lock = threading.Lock()  # the reader thread appends while begin_task may clear
        self._exitcode: int | None = None
        self._reader = threading.Thread(target=self._forward, args=(stderr_fd,), daemon=True, name=f"rpx-stderr-{pid}")
        self._reader.start()

    def begin_task(self) -> None:
        """A new task starts in this worker: its stderr tail starts afresh."""
        with self._tail_lock:
            self._tail.clear()
            self._tail_chars = 0

    def next_event(self, timeout: float) -> Any:
        """The next event, ``None`` when the task is done, ``_TIMEOUT`` or ``_DEAD``."""
        try:
            if not self.connection.poll(None if timeout == float("inf") else timeout):
                return _TIMEOUT
            return self.connection.recv()
        except (EOFError, OSError):
            return _DEAD

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except OSError:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self) -> int:
        if self._exitcode is None:
            self._exitcode = self.zygote.wait(self.pid)
        return self._exitcode

    def stderr_tail(self) -> str:
        self._reader.join(timeout=2.0)
        with self._tail_lock:
            return "".join(self._tail)[-STDERR_TAIL_CHARS:]

    def close(self) -> None:
        self.kill()
        self.wait()
        self.connection.close()
        self._reader.join(timeout=2.0)

    def _forward(self, fd: int) -> None:
        """Copy the worker's output to our stderr as it comes, keeping the last few thousand characters."""
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                text = chunk.decode(errors="replace")
                try:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                with self._tail_lock:
                    self._tail.append(text)
                    self._tail_chars += len(text)
                    while len(self._tail) > 1 and self._tail_chars - len(self._tail[0]) > STDERR_TAIL_CHARS:
                        self._tail_chars -= len(self._tail.popleft())


class Zygote:
    """A fresh interpreter running :func:`rpx_core.worker.main`, started once per rpx process and reused: it forks
    the workers. (Not multiprocessing's forkserver: that re-imports the caller's ``__main__`` script in every worker.)"""

    _shared: Zygote | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-c", "from rpx_core.worker import main; main()", str(theirs.fileno())]
        self.process = subprocess.Popen(command,
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=dict(os.environ))
        theirs.close()
        self.control = ours

    @classmethod
    def shared(cls) -> Zygote:
        with cls._lock:
            if cls._shared is None or cls._shared.process.poll() is not None:
                cls._shared = cls()
                atexit.register(cls._shared.close)
            return cls._shared

    def start(self, preload: tuple[str, ...], disabled: tuple[str, ...] = ()) -> Worker:
        """Fork a worker, importing ``preload`` and loading the plugin set without ``disabled`` in the zygote first
        (once), so the worker inherits both."""
        ours, theirs = socket.socketpair()
        stderr_read, stderr_write = os.pipe()
        request = {"op": "fork", "preload": list(preload), "disabled": list(disabled)}
        try:
            with self._lock:
                socket.send_fds(self.control, [json.dumps(request).encode()],
                                [theirs.fileno(), stderr_write])
                pid = json.loads(self._reply())["pid"]
        except BaseException:  # interrupted mid-request: its reply would confuse the next one, so start afresh
            self.close()
            ours.close()
            os.close(stderr_read)
            raise
        finally:
            theirs.close()
            os.close(stderr_write)
        return Worker(self, pid, Connection(ours.detach()), stderr_read)

    def wait(self, pid: int) -> int:
        with self._lock:
            self.control.send(json.dumps({"op": "wait", "pid": pid}).encode())
            return json.loads(self._reply())["exitcode"]

    def _reply(self) -> bytes:
        reply = self.control.recv(65536)
        if not reply:
            raise RuntimeError(f"the rpx worker zygote (process {self.process.pid}) exited with code {self.process.poll()}")
        return reply

    def close(self) -> None:
        """End the zygote (it kills any worker still running); the next run starts a new one."""
        self.control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if Zygote._shared is self:
            Zygote._shared = None
