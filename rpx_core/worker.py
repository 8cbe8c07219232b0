"""Running a task's stages wherever the executor put it: in rpx's own process, or in a worker process.

:func:`execute` is the one loop both use: it builds the stage contexts from the task (pure data), runs each stage,
and reports every stage as it starts and ends. It turns what user code may throw at it into records: an exception
fails the stage, ``sys.exit`` fails the stage (the run goes on), an interruption records the stage as interrupted with
whatever it handed back, then stops.

:func:`main` is the *zygote*: a process that imports the framework and rpx's plugins once and then
forks workers on request (see :mod:`rpx_core.executor`). A forked worker inherits the imports, so no job pays for
importing torch again, and starts in a fresh copy of a process that never ran user code; a job that measures always
gets a fresh one, while jobs that only count and bound may follow each other in one worker (no fork per job).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, ContextManager, Literal

import attrs

from rpx_core.context import Job, RunContext, StageContext
from rpx_core.errors import NotApplicable, UnsupportedError
from rpx_core.interrupts import Interrupted, signal_of
from rpx_core.plugins import Plugins, StageHookError
from rpx_core.progress import Progress, ProgressReporter
from rpx_core.results import StageRecord, check_result
from rpx_core.stages import Stage

# -- tasks and events (pure data: they cross process boundaries) -------------------------------------------------------


@attrs.frozen
class Setup:
    """What a worker needs to rebuild the parent's world: the plugin set, the environment, the import path, the folder."""

    disabled: tuple[str, ...]  # plugins disabled in the parent
    plugins: tuple[tuple[str, str, str], ...]  # (name, distribution, version) of every loaded plugin, checked
    environ: dict[str, str]
    sys_path: tuple[str, ...]
    cwd: str


@attrs.frozen
class Task:
    """One unit of work: the stages of one model job (``scope="model"``, one job), or one run-scoped stage over the
    pipeline's jobs (``scope="run"``). ``kept`` holds, per job, records already known (stages done before a resume,
    or every stage of the model for a run-scoped stage); ``previous`` an interrupted attempt's partial result."""

    scope: Literal["model", "run"]
    jobs: tuple[Job, ...]
    stages: tuple[str, ...]
    kept: tuple[dict[str, StageRecord], ...]
    choose: Any  # rpx_core.spec.Choices
    gpu_catalog: Any  # rpx_core.gpus.GPUCatalog
    options: Any = None  # the run-scoped stage's options
    previous: Any = None
    #: A stage times the machine: the task gets a fresh worker process of its own (others may share one in turn).
    measured: bool = False

    @property
    def label(self) -> str:
        return self.jobs[0].model.name if self.scope == "model" else "<run>"


@attrs.frozen
class Started:
    stage: str


@attrs.frozen
class Finished:
    stage: str
    record: StageRecord


@attrs.frozen
class Placed:
    """Where a job runs (a cluster executor's node), reported before its first stage and recorded with the job."""

    node: str


Report = Callable[[Started | Finished | Progress | Placed], None]
#: Wraps each stage: ``guard(stage)`` -> a context manager that enforces its time limit (in-process executors).
Guard = Callable[[str], ContextManager[Any]]


class StageTimeout(BaseException):
    """Raised into an in-process stage when its time limit passes (a BaseException: user code's ``except Exception``
    must not swallow it)."""


def execute(task: Task, plugins: Any, report: Report, *, model_objects: dict[str, Any] | None = None,
            guard: Guard | None = None) -> None:
    """Run ``task``'s stages in order, reporting each; on an interruption the stage is reported and it re-raises."""
    backend = plugins.backend(task.jobs[0].backend, task.choose, require_available=False)
    registry = plugins.stages(task.choose)
    contexts = [
        StageContext(job, backend, plugins, task.gpu_catalog, model_object=(model_objects or {}).get(job.model.name),
                     choose=task.choose)
        for job in task.jobs
    ]
    records = dict(task.kept[0]) if task.scope == "model" else {}
    for context, kept in zip(contexts, task.kept):
        context.results.update({name: record.result for name, record in kept.items() if record.status == "ok"})
    reporter = ProgressReporter(report)
    for context in contexts:
        context.reporter = reporter
    ctx: Any = contexts[0]
    if task.scope == "run":
        ctx = RunContext(contexts, task.options, backend, plugins, task.gpu_catalog, previous=task.previous,
                         reporter=reporter)
    with contexts[0].setup_phase("import"):  # the framework, where no zygote imported it before (in-process runs)
        for module in backend.worker_preload:
            _preload(module)
    try:
        for name in task.stages:
            stage = registry[name]
            report(Started(name))
            reporter.begin(name)
            failed = [need for need in stage.needs if need in records and records[need].status != "ok"]
            started = time.perf_counter()
            try:
                with guard(name) if guard else _no_guard():
                    record = run_stage(stage, ctx, plugins, failed,
                                       inapplicable=[need for need in failed if records[need].status == "not_applicable"])
            except SystemExit as exc:
                record = StageRecord("failed", seconds=_since(started), error=_exit_message(exc, name),
                                     traceback="".join(traceback.format_exception(exc)))
            except StageTimeout as exc:
                record = StageRecord("failed", seconds=_since(started), error=str(exc),
                                     traceback="".join(traceback.format_exception(exc)))
            except KeyboardInterrupt as interrupt:
                report(Finished(name, interrupted_record(stage, interrupt, _since(started))))
                raise Interrupted(signal_of(interrupt)) from None
            record = attrs.evolve(record, setup=_take_setup(contexts))
            records[name] = record
            if record.status == "ok" and task.scope == "model":
                contexts[0].results[name] = record.result
            report(Finished(name, record))
    finally:
        for context in contexts:
            context.release()
        # No gc.collect() here: a full collection costs ~0.2 s once torch is imported, a fixed cost per job; the
        # stages that measure collect themselves before timing (rpx_plugins.measurement.gc_paused).


def failed_records(stages: tuple[str, ...], error: str, *, seconds: float | None = None,
                   traceback: str | None = None, stderr_tail: str | None = None) -> list[Finished]:
    """``stages`` (what is left of a job) as records when the job cannot go on: the first failed with ``error``,
    the rest skipped naming it."""
    if not stages:
        return []
    current, *later = stages
    records = [Finished(current, StageRecord("failed", seconds=seconds, error=error, traceback=traceback,
                                             stderr_tail=stderr_tail))]
    return records + [Finished(name, StageRecord("skipped", error=f"not run: stage {current!r} of this job failed: "
                                                 f"{error}")) for name in later]

def _take_setup(contexts: list[StageContext]) -> dict[str, float]:
    """The setup seconds by phase the contexts timed since the last call (for the record of the stage that just
    ended), rounded like stage seconds; the contexts start counting afresh."""
    taken: dict[str, float] = {}
    for context in contexts:
        for phase, seconds in context.setup.items():
            taken[phase] = taken.get(phase, 0.0) + seconds
        context.setup.clear()
    return {phase: round(seconds, 6) for phase, seconds in taken.items()}


def _setup_seconds(ctx: Any) -> float:
    """Setup seconds timed so far by a stage context, or by every model's context of a run-scoped one."""
    contexts = ctx.models if isinstance(ctx, RunContext) else [ctx]
    return sum(sum(context.setup.values()) for context in contexts if isinstance(context, StageContext))


def run_stage(stage: Stage, ctx: Any, plugins: Plugins, failed_needs: list[str],
              inapplicable: list[str] | tuple[str, ...] = ()) -> StageRecord:
    """Run one stage through its hook unless something it needs failed; never raise for a stage's own failure.

    The record names the plugin that answered, or the one that was answering when the stage failed. Its seconds
    exclude setup (importing, building and placing the model) done during it; the caller records that apart. A
    stage that raises NotApplicable, or whose unmet needs all do not apply to the model, is ``not_applicable``."""
    if failed_needs and len(inapplicable) == len(failed_needs):
        verb = "does" if len(failed_needs) == 1 else "do"
        return StageRecord("not_applicable", error=f"needs {', '.join(failed_needs)}, which {verb} not apply to this model")
    if failed_needs:
        return StageRecord("skipped", error=f"needs {', '.join(failed_needs)}, which did not succeed")
    started = time.perf_counter() - _setup_seconds(ctx)  # only setup timed from here on is subtracted below
    provider = None
    try:
        try:
            result, provider = plugins.call_stage(stage, ctx)
        except StageHookError as exc:
            provider = exc.plugin
            raise exc.error from None
        if provider is None:
            raise UnsupportedError(f"no installed plugin implements stage {stage.name!r} for backend "
                                   f"{ctx.backend.name!r} (framework {ctx.backend.framework!r})")
        check_result(stage.name, stage.result, result)
    except NotApplicable as exc:
        return StageRecord("not_applicable", seconds=round(time.perf_counter() - started - _setup_seconds(ctx), 6),
                           error=str(exc),
                           provided_by=provider)
    except Exception as exc:
        return StageRecord(
            "failed",
            seconds=round(time.perf_counter() - started - _setup_seconds(ctx), 6),
            error=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
            provided_by=provider,
        )
    seconds = round(time.perf_counter() - started - _setup_seconds(ctx), 6)
    return StageRecord("ok", seconds=seconds, provided_by=provider, result=result)


def interrupted_record(stage: Any, interrupt: BaseException, seconds: float | None) -> StageRecord:
    """An interrupted stage's record, with the partial result it handed back if that can be written."""
    partial = getattr(interrupt, "partial", None)
    if partial is not None:
        try:
            check_result(stage.name, stage.result, partial)
        except TypeError:
            partial = None
    return StageRecord("interrupted", seconds=seconds, error=f"interrupted by {signal.Signals(signal_of(interrupt)).name}",
                       result=partial)


def _exit_message(exc: SystemExit, stage: str) -> str:
    return f"SystemExit: user code called sys.exit({exc.code!r}) during stage {stage!r}"


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 6)


class _no_guard:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- the worker process side ------------------------------------------------------------------------------------------


#: Plugin sets the zygote loaded before forking, by the disabled plugins they were loaded without: a worker whose run
#: has the same set uses its inherited copy instead of loading plugins again (tens of milliseconds per job).
_LOADED: dict[tuple[str, ...], Any] = {}


def _load(disabled: tuple[str, ...]) -> Any:
    import warnings

    from rpx_core.plugins import PluginLoadWarning, Plugins

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginLoadWarning)  # the parent already warned once
        return Plugins.load(disabled)


def load_plugins(setup: Setup) -> Any:
    """The parent's plugin set, loaded here (or inherited from the zygote when it is the same set); a different set
    (a plugin installed meanwhile) is an error."""
    from rpx_core.errors import PluginError

    inherited = _LOADED.get(setup.disabled)
    if inherited is not None and plugin_identity(inherited) == setup.plugins:
        return inherited
    plugins = _load(setup.disabled)
    found = plugin_identity(plugins)
    if found != setup.plugins:
        raise PluginError(f"the worker process found plugins {_names(found)}, the run has {_names(setup.plugins)}")
    return plugins


def plugin_identity(plugins: Any) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((info.name, info.distribution, info.version) for info in plugins.infos() if info.status == "loaded"))


def _names(identity: tuple[tuple[str, str, str], ...]) -> str:
    return ", ".join(f"{name} ({dist} {version})" for name, dist, version in identity) or "none"


def serve_jobs(connection: Any) -> None:
    """A forked worker: serve tasks until the parent sends ``None`` or goes away. Each task comes as its setup, then
    the task; the worker runs it, sends each event, then a final ``None``. The parent sends a second task only to a
    worker whose first ended cleanly and measured nothing (see rpx_core.executor.WorkerExecutor)."""
    import faulthandler

    faulthandler.enable()  # a segfault in user code leaves the Python stack in the stderr tail
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupted)
    defaults = _global_modes()
    while True:
        try:
            setup = connection.recv()  # first, so the task's classes (a plugin's options) import from its path
        except EOFError:
            return
        if setup is None:
            return
        _restore_global_modes(defaults)
        serve_job(connection, setup)


def serve_job(connection: Any, setup: Setup) -> None:
    """One task in this worker, in the parent's environment, import path and folder."""
    os.environ.clear()
    os.environ.update(setup.environ)
    sys.path[:] = list(setup.sys_path)
    os.chdir(setup.cwd)
    try:
        task = connection.recv()
        plugins = load_plugins(setup)
        execute(task, plugins, connection.send)
    except Interrupted:
        pass  # the interrupted stage was reported
    except Exception as exc:  # the worker could not even start the task: the parent records it on the stage
        connection.send(("error", f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))))
    connection.send(None)


def _global_modes() -> dict[str, Any]:
    """Process-wide state a model's code may change, as the worker started: torch's default dtype and grad mode,
    and the global random generators (torch's CPU one, Python's, numpy's if imported), which weights and inputs are
    drawn from: a job in a reused worker draws what it would in a fresh one."""
    import random

    modes: dict[str, Any] = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        modes["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        modes.update(dtype=torch.get_default_dtype(), grad=torch.is_grad_enabled(), rng=torch.get_rng_state())
    return modes


def _restore_global_modes(modes: dict[str, Any]) -> None:
    """Before a worker's next task: the process-wide state of :func:`_global_modes` as it was when it started."""
    import random

    random.setstate(modes["random"])
    if "numpy" in modes:
        sys.modules["numpy"].random.set_state(modes["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None and "rng" in modes:
        torch.set_default_dtype(modes["dtype"])
        torch.set_grad_enabled(modes["grad"])
        torch.set_rng_state(modes["rng"])


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def zygote(control: socket.socket) -> None:
    """Fork one worker per request (a JSON message with the job channel and stderr pipe as file descriptors); report
    exit statuses on request. Exits, killing what it started, when the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops the workers itself
    children: set[int] = set()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 65536, 2)
        except OSError:
            message, fds = b"", []
        if not message:
            break
        request = json.loads(message)
        if request["op"] == "fork":
            for module in request.get("preload", ()):
                _preload(module)
            disabled = tuple(request.get("disabled", ()))
            if disabled not in _LOADED:
                try:
                    _LOADED[disabled] = _load(disabled)
                except Exception:
                    pass  # the worker loads them itself, and says what fails
            gc.freeze()  # what the zygote imported is permanent: a worker's collections never walk torch's objects
            pid = os.fork()
            if pid == 0:
                control.close()
                _become_worker(*fds)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            control.send(json.dumps({"pid": pid}).encode())
        elif request["op"] == "wait":
            pid = request["pid"]
            _, status = os.waitpid(pid, 0)
            children.discard(pid)
            control.send(json.dumps({"exitcode": os.waitstatus_to_exitcode(status)}).encode())
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _preload(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:
        pass  # the worker imports it itself, and says what fails


def _become_worker(job_fd: int, stderr_fd: int) -> None:
    """In the forked child: own process group (signalled and killed as one), stdout and stderr into the parent's
    pipe, then the job; never returns into the zygote's loop."""
    from multiprocessing.connection import Connection

    code = 0
    try:
        os.setpgrp()
        os.dup2(stderr_fd, 1)
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve_jobs(Connection(job_fd))
    except BaseException:
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    """The zygote's entry point (started by rpx_core.executor with the control socket's descriptor as argument)."""
    import rpx_core.plugins as plugins

    for module in plugins.BUILTIN.values():  # light (heavy imports are inside hooks); every worker needs them
        _preload(module)
    zygote(socket.socket(fileno=int(sys.argv[1])))

