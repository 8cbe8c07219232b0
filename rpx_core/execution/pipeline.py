"""Running a plan: every job handed to the executor, each model through its stages in order, failures recorded,
dependants skipped, results kept.

This process only plans, supervises and writes: stage code never sees another model's objects, each job gets its own
context (in a worker process by default, see rpx_core.execution.runners), released after it; the results file is kept as
rpx_core.results.writer says."""

from __future__ import annotations

import contextlib
import platform
import shlex
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

import attrs

from rpx_core.convert import structure
from rpx_core.errors import BackendUnavailable, SpecError
from rpx_core.execution.context import Job
from rpx_core.execution.executors import Environment, Executor, Resources, WorkItem
from rpx_core.execution.interrupts import Interrupted, signal_of, signals_raise
from rpx_core.execution.progress import Progress
from rpx_core.execution.runners import WorkerRunner, make_runner
from rpx_core.execution.stage_loop import failed_records, run_stage
from rpx_core.execution.tasks import Finished, Placed, Started, Task
from rpx_core.execution.worker import plugin_identity
from rpx_core.registry.manager import Plugins
from rpx_core.results.records import ModelResult, Provenance, RunResult, StageRecord
from rpx_core.results.resume import Resumed, resume_from
from rpx_core.results.safe_write import OutputError, OutputLock
from rpx_core.results.summary import summarise
from rpx_core.results.writer import ResultsFile, now
from rpx_core.spec.inputs import spec_inputs
from rpx_core.spec.limits import Execution
from rpx_core.spec.plan import Plan
from rpx_core.version import __version__

Listener = Callable[[str, str, StageRecord], None]  # (model or "<run>", stage, record) after each stage

#: What a run-scoped stage's events and records are reported under, where a model job's name would be.
RUN = "<run>"


#: (model or "<run>", event): every event of every stage as it happens (start, progress, end), for live displays.
Observer = Callable[[str, Started | Finished | Progress], None]


def run_plan(
    plan: Plan,
    plugins: Plugins,
    *,
    output: Path | None,
    fmt: Literal["toml", "json"] | None = None,
    spec_path: str | None = None,
    model_objects: dict[str, Any] | None = None,
    listener: Listener | None = None,
    execution: Execution | None = None,
    resume: bool = False,
    observer: Observer | None = None,
) -> RunResult:
    """Run every job of ``plan``; return (and keep writing to ``output``) the results.

    Each job runs through the executor ``execution`` selects (worker processes by default, see
    rpx_core.execution.runners); SIGINT and SIGTERM record the running stage as interrupted and raise
    :class:`rpx_core.execution.interrupts.Interrupted`. With ``resume``, what ``output`` already holds from the same spec, rpx
    and plugins is kept (see rpx_core.results.resume)."""
    spec = plan.spec
    execution = execution or spec.execution
    backends = {name: plugins.backend(name, spec.choose, require_available=False)
                for name in dict.fromkeys([spec.backend, *(job.backend for job in plan.jobs)])}
    unavailable = {name: f"backend {name!r} is not available on this machine: {backend.availability.reason}"
                   for name, backend in backends.items() if not backend.availability.available}
    if unavailable and spec.on_unavailable == "error":
        raise BackendUnavailable(next(iter(unavailable.values())))
    lock = OutputLock(output) if output is not None else contextlib.nullcontext()
    with lock, signals_raise():
        record = provenance(plan, plugins, spec_path)
        result_types = {name: stage.result for name, stage in plugins.stages(spec.choose).unambiguous().items()}
        previous = resume_from(output, record.spec, record.rpx_version, plugin_identity(plugins),
                               result_types) if resume and output is not None else None
        start = attrs.evolve(previous.run, unfinished=None, provenance=attrs.evolve(
            previous.run.provenance, finished=None, command=record.command)) if previous else RunResult(provenance=record)
        results = ResultsFile(start, output, fmt, tuple(spec_inputs(spec, plugins, spec_path)),
                              tuple(job.name for job in plan.jobs))
        results.update()  # the file exists (and its folder is writable) before anything is measured
        for job in plan.jobs:
            if job.backend in unavailable:
                skipped = {name: StageRecord("skipped", error=unavailable[job.backend]) for name in job.stages}
                results.put_model(_model_result(job, skipped, finished=True))
        if unavailable and all(job.backend in unavailable for job in plan.jobs):
            reason = unavailable.get(spec.backend) or next(iter(unavailable.values()))
            run_skipped = {name: StageRecord("skipped", error=reason) for name in plan.run_stages}
            results.update(run_stages=run_skipped, unfinished=(),
                           provenance=attrs.evolve(results.run.provenance, finished=now()))
            return results.run
        backends = {name: backend for name, backend in backends.items() if name not in unavailable}

        for job in checked_devices(plan.jobs):
            if job.backend in backends:
                backends[job.backend].check_device(job.device)
        executor, env = choose_executor(plan, plugins, execution, model_objects, backends)
        try:
            run_jobs([job for job in plan.jobs if job.backend not in unavailable], plan, plugins, executor, env,
                     results, listener, previous, observer)
            for name in plan.run_stages:
                run_run_stage(name, plan, plugins, executor, env, results, listener, previous, observer)
        except BaseException as exc:
            unfinished = unfinished_jobs(plan, results.run)
            with contextlib.suppress(OutputError):  # the error on its way out says more than a failed last write
                results.update(unfinished=unfinished)
            if isinstance(exc, KeyboardInterrupt):
                raise Interrupted(signal_of(exc), unfinished=unfinished) from None
            raise
        finally:
            results.close()
            if isinstance(env.runner, WorkerRunner):
                env.runner.close()
        results.update(unfinished=unfinished_jobs(plan, results.run),
                       provenance=attrs.evolve(results.run.provenance, finished=now()))
        return results.run


def checked_devices(jobs: tuple[Job, ...]) -> list[Job]:
    """One job per (backend, device) pair, whose device is checked before anything runs."""
    return list({(job.backend, job.device): job for job in jobs}.values())


def choose_executor(plan: Plan, plugins: Plugins, execution: Execution, model_objects: dict[str, Any] | None,
                    backends: dict[str, Any]) -> tuple[Executor, Environment]:
    """The executor ``execution`` names, and the environment it runs jobs in (the runner of this machine's jobs)."""
    executor = plugins.executors()[execution.executor]
    options = executor_options(executor, execution, plan.where)
    preload = tuple(dict.fromkeys(module for backend in backends.values() for module in backend.worker_preload))
    runner = make_runner(plugins, execution, model_objects, preload)
    setup = runner.setup if isinstance(runner, WorkerRunner) else None
    return executor, Environment(setup, execution, options, runner)


def executor_options(executor: Executor, execution: Execution, where: str) -> Any:
    """The ``[execution.executor_options]`` table as the executor's options class (SpecError with key paths)."""
    if executor.options is None:
        if execution.executor_options:
            raise SpecError(f"{where}: execution.executor_options: executor {executor.name!r} takes no options")
        return None
    return structure(execution.executor_options, executor.options, where=where, base_path="execution.executor_options")


def run_jobs(jobs: list[Job], plan: Plan, plugins: Plugins, executor: Executor, env: Environment,
             results: ResultsFile, listener: Listener | None, previous: Resumed | None,
             observer: Observer | None = None) -> None:
    """Hand every unfinished job to the executor; each outcome is recorded and written as the module docstring says,
    in whatever order and from whatever thread the executor reports it. What the executor returns without
    reporting is recorded as lost."""
    lock = threading.RLock()
    registry = plugins.stages(plan.spec.choose)
    items = [item for job in jobs
             if (item := work_item(job, plan, plugins, registry, results, listener, previous, lock,
                                   observer)) is not None]
    results.flush()  # what a resumed run kept, before anything runs
    executor.run(items, env)
    recorded = {model.name: model.stages for model in results.run.models}
    for item in items:
        report_lost(item, recorded.get(item.name, {}), executor)


def report_lost(item: WorkItem, recorded: dict[str, StageRecord], executor: Executor) -> None:
    """Record as failed every stage of ``item`` that ``executor`` returned without reporting (a worker or node it
    lost, a fault of its own), so that no job of a run that ends is left without a word."""
    lost = tuple(name for name in item.task.stages if name not in recorded)
    for event in failed_records(lost, f"lost: executor {executor.name!r} returned without reporting this stage "
                                      "(it lost the worker or node, or has a fault of its own)"):
        item.report(event)


def work_item(job: Job, plan: Plan, plugins: Plugins, registry: Any, results: ResultsFile, listener: Listener | None,
              previous: Resumed | None, lock: threading.RLock,
              observer: Observer | None = None) -> WorkItem | None:
    """The job as an executor receives it, its model entry written; None when a resumed run already finished it,
    or when its model could not be built before the run (recorded failed here)."""
    done = previous.finished_model(job.name) if previous else None
    if done is not None:
        results.put_model(done, save="later")  # already on disk in the resumed file; written with the next change
        return None
    records = previous.kept_stages(job.name) if previous else {}
    todo = tuple(name for name in job.stages if name not in records)
    model = _model_result(job, records, finished=not todo)
    written = bool(records or not todo)  # else written when it starts: a job not started yet is not in the file
    if written:
        results.put_model(model, save="later")
    if not todo:
        return None
    left = set(todo)

    def report(event: Started | Finished | Progress | Placed) -> None:
        nonlocal model, written
        if observer and not isinstance(event, Placed):
            observer(job.name, event)
        with lock:
            if isinstance(event, Started) and not written:
                model, written = attrs.evolve(model, started=now()), True
                results.put_model(model, save="later")  # written with its first record, a moment later
            if isinstance(event, Started) and registry[event.stage].measures:
                results.flush()  # what came before is on disk before anything is timed
            if isinstance(event, Placed):
                model = attrs.evolve(model, node=event.node)
                results.put_model(model)
            elif isinstance(event, Finished):
                records[event.stage] = event.record
                left.discard(event.stage)
                ordered = {name: records[name] for name in job.stages if name in records}
                interrupted = any(record.status == "interrupted" for record in ordered.values())
                model = attrs.evolve(model, stages=ordered, summary=summarise(ordered, registry),
                                     setup=setup_by_phase(ordered.values()),
                                     finished=None if left or interrupted else now())
                written = True
                cheap = event.record.status in ("ok", "not_applicable", "skipped") and not registry[event.stage].measures
                results.put_model(model, save="due" if cheap else "now")
                if listener:
                    listener(job.name, event.stage, event.record)

    kept = {name: record for name, record in records.items()}
    measured = any(registry[name].measures for name in todo)
    task = Task("model", (job,), todo, (kept,), plan.spec.choose, plan.gpu_catalog, measured=measured)
    item = WorkItem(job.name, task, measured, resources(job, measured, job.machine), report)
    failure = plan.failed_models.get(job.coordinates.get("model", job.name))
    if failure is None:
        return item
    for event in failed_records(todo, failure.error or "", traceback=failure.traceback,
                                stderr_tail=failure.stderr_tail):
        report(event)
    return None


def resources(job: Job, measured: bool, machine: str | None = None) -> Resources:
    """What a task over ``job`` needs: a measured stage on a GPU backend takes a whole GPU."""
    gpu = measured and job.device.partition(":")[0] not in ("cpu", "meta")
    return Resources(gpus=1.0 if gpu else 0.0, accelerator=machine)


def run_run_stage(name: str, plan: Plan, plugins: Plugins, executor: Executor, env: Environment,
                  results: ResultsFile, listener: Listener | None, previous: Resumed | None,
                  observer: Observer | None = None) -> None:
    """Run a run-scoped stage over every model's job through the executor, as one work item, unless something it
    needs failed for a model."""
    earlier = previous.run_stage(name) if previous else None
    if earlier is not None and earlier.status != "interrupted":
        results.update(run_stages={**results.run.run_stages, name: earlier})
        return
    stage = plugins.stages(plan.spec.choose)[name]
    every_model = [record for model in results.run.models for record in model.stages.items()]
    failed = sorted({need for need, record in every_model if need in stage.needs and record.status != "ok"})

    reported: dict[str, StageRecord] = {}

    def report(event: Started | Finished | Progress | Placed) -> None:
        if observer and not isinstance(event, Placed):
            observer(RUN, event)
        if isinstance(event, Finished):
            reported[name] = event.record
            results.update(run_stages={**results.run.run_stages, name: event.record})
            if listener:
                listener(RUN, name, event.record)

    if failed:
        report(Finished(name, run_stage(stage, None, plugins, failed)))
        return
    models = {model.name: model for model in results.run.models}
    kept = tuple(models[job.name].stages for job in plan.jobs)
    task = Task("run", plan.jobs, (name,), kept, plan.spec.choose, plan.gpu_catalog, measured=stage.measures,
                options=plan.options.get(name), previous=earlier.result if earlier is not None else None)
    item = WorkItem(RUN, task, stage.measures, resources(plan.jobs[0], stage.measures), report)
    executor.run([item], env)
    report_lost(item, reported, executor)  # not the resumed file's record of an earlier attempt


def unfinished_jobs(plan: Plan, run: RunResult) -> tuple[str, ...]:
    """The names of the plan's jobs that did not finish (never started, interrupted, lost), in the plan's order."""
    finished = {model.name for model in run.models if model.finished is not None}
    return tuple(job.name for job in plan.jobs if job.name not in finished)


def setup_by_phase(records: Iterable[StageRecord]) -> dict[str, float]:
    """The model's setup seconds by phase: what each stage's record timed apart from its own seconds, summed."""
    total: dict[str, float] = {}
    for record in records:
        for phase, seconds in record.setup.items():
            total[phase] = round(total.get(phase, 0.0) + seconds, 6)
    return total


def _model_result(job: Job, records: dict[str, StageRecord], finished: bool = False) -> ModelResult:
    return ModelResult(
        name=job.name,
        source=job.model.source,
        backend=job.backend,
        device=job.device,
        precision=job.precision,
        started=now(),
        finished=now() if finished else None,
        stages=dict(records),
        notes=job.model.notes,
        coordinates=dict(job.coordinates) or None,
    )


def provenance(plan: Plan, plugins: Plugins, spec_path: str | None) -> Provenance:
    return Provenance(
        rpx_version=__version__,
        python=platform.python_version(),
        created=now(),
        spec_hash=plan.spec.digest(),
        spec=plan.spec.to_data(),
        spec_path=spec_path,
        command=shlex.join(sys.argv) if sys.argv and sys.argv[0] else None,
        plugins=tuple(info for info in plugins.infos() if info.status != "disabled"),
    )
