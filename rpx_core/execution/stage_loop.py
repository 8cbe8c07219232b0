"""The stage loop: one task's stages, in order, wherever the task runs (rpx's own process or a worker).

:func:`execute` builds the stage contexts from the task (pure data), runs each stage through its hook, and reports
every stage as it starts and ends. It turns what user code may throw at it into records: an exception fails the
stage, ``sys.exit`` fails the stage (the run goes on), an interruption records the stage as interrupted with whatever
it handed back, then stops. :func:`run_stage` is one stage through its hook; :func:`failed_records` the records of a
job that cannot go on; :func:`probe_backend` the one step of a
:class:`~rpx_core.execution.tasks.BackendProbe`."""

from __future__ import annotations

import importlib
import signal
import sys
import time
import traceback
from typing import Any

import attrs

from rpx_core.errors import NotApplicable, UnsupportedError
from rpx_core.execution.context import RunContext, StageContext
from rpx_core.execution.interrupts import Interrupted, signal_of
from rpx_core.execution.progress import ProgressReporter
from rpx_core.execution.tasks import PROBE, BackendProbe, Finished, Guard, Report, StageTimeout, Started, Task
from rpx_core.loading import USER_MODULE_PREFIX, load_callable
from rpx_core.registry.manager import Plugins, StageHookError
from rpx_core.registry.stages import Stage
from rpx_core.results.records import StageRecord, check_result


def execute(task: Task | BackendProbe, plugins: Any, report: Report, *, model_objects: dict[str, Any] | None = None,
            guard: Guard | None = None) -> None:
    """Run ``task``'s stages in order, reporting each; on an interruption the stage is reported and it re-raises."""
    if isinstance(task, BackendProbe):
        probe_backend(task, plugins, report, guard)
        return
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


def probe_backend(probe: BackendProbe, plugins: Any, report: Report, guard: Guard | None = None) -> None:
    """Build the probe's model and report the backend that runs it (see BackendProbe). An exception while building
    keeps the default backend (the model's job reports it, in its own stage); ``sys.exit`` and a time limit are a
    failed record, as in a stage; a crash or a hang in a worker is recorded by its runner."""
    from rpx_core.registry.adapters import backend_if_known

    report(Started(PROBE))
    started = time.perf_counter()
    what = f"model {probe.model.name!r}"
    backend = None
    loaded = set(sys.modules)
    try:
        with guard(PROBE) if guard else _no_guard():
            model = load_callable(probe.model.source, what=what)(**probe.model.kwargs)
            backend = backend_if_known(model, plugins.model_adapters(), plugins.backends(probe.choose), what)
    except (SystemExit, StageTimeout) as exc:
        error = _exit_message(exc, PROBE) if isinstance(exc, SystemExit) else str(exc)
        report(Finished(PROBE, StageRecord("failed", seconds=_since(started), error=error,
                                           traceback="".join(traceback.format_exception(exc)))))
        return
    except Exception:  # building it raised: the model's job reports that, in its own stage
        backend = None
    finally:  # in rpx's process (an in-process run) the job imports the model's file again, timed as its setup
        _forget_model_modules(loaded)
    report(Finished(PROBE, StageRecord("ok", seconds=_since(started), result=backend)))


def _forget_model_modules(loaded: set[str]) -> None:
    """Drop the model files (modules loaded by path, rpx_core.loading) imported since ``loaded`` was taken. Packages
    named by import path stay: importing one twice in a process can register its operators twice."""
    for name in set(sys.modules) - loaded:
        if name.startswith(USER_MODULE_PREFIX):
            del sys.modules[name]


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


def _preload(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:
        pass  # the worker imports it itself, and says what fails
