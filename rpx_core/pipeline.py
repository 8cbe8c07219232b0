"""Running a plan: each model through its stages in order, failures recorded, dependants skipped, results kept.

The results file is rewritten after every stage, so a crash, an interrupt or a failing later stage never loses what
was already measured. Stage code never sees another model's objects: each job gets its own context (in its own
worker process by default, see rpx_core.executor), released after it. This process only plans, supervises and writes.
"""

from __future__ import annotations

import contextlib
import datetime
import platform
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

import attrs

from rpx_core.checks import run_inputs
from rpx_core.context import Job
from rpx_core.errors import BackendUnavailable, RpxError
from rpx_core.executor import Executor, InProcessExecutor, WorkerExecutor, setup_for
from rpx_core.interrupts import signals_raise
from rpx_core.limits import Execution
from rpx_core.plan import Plan
from rpx_core.plugins import Plugins
from rpx_core.progress import Progress
from rpx_core.results import ModelResult, Provenance, RunResult, StageRecord, write
from rpx_core.resume import Resumed, resume_from
from rpx_core.safe_write import OutputError, OutputLock
from rpx_core.summary import summarise
from rpx_core.version import __version__
from rpx_core.worker import Finished, Started, Task, plugin_identity, run_stage

Listener = Callable[[str, str, StageRecord], None]  # (model or "<run>", stage, record) after each stage
#: (model or "<run>", event): every event of every stage as it happens (start, progress, end), for live displays.
Observer = Callable[[str, Started | Finished | Progress], None]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class ResultsFile:
    """The run's results, rewritten atomically whenever something new is known, never over an input of the run."""

    def __init__(self, run: RunResult, path: Path | None, fmt: Literal["toml", "json"] | None = None,
                 protected: tuple[Path, ...] = ()) -> None:
        self.run = run
        self.path = path
        self.fmt = fmt
        self.protected = protected

    def update(self, **changes: Any) -> None:
        self.run = attrs.evolve(self.run, **changes)
        if self.path is not None:
            try:
                write(self.run, self.path, self.fmt, self.protected)
            except OutputError:
                raise
            except OSError as exc:
                raise OutputError(f"cannot write results to {self.path}: {exc.strerror or exc}") from None

    def put_model(self, model: ModelResult) -> None:
        models = list(self.run.models)
        index = next((i for i, m in enumerate(models) if m.name == model.name), None)
        if index is None:
            models.append(model)
        else:
            models[index] = model
        self.update(models=tuple(models))


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

    Each job runs through the executor ``execution`` selects (a worker process per job by default); SIGINT and
    SIGTERM record the running stage as interrupted and raise :class:`rpx_core.interrupts.Interrupted`. With
    ``resume``, what ``output`` already holds from the same spec, rpx and plugins is kept (see rpx_core.resume)."""
    spec = plan.spec
    execution = execution or spec.execution
    backend = plugins.backend(spec.backend, spec.choose, require_available=False)
    available = backend.availability
    reason = f"backend {backend.name!r} is not available on this machine: {available.reason}"
    if not available.available and spec.on_unavailable == "error":
        raise BackendUnavailable(reason)
    lock = OutputLock(output) if output is not None else contextlib.nullcontext()
    with lock, signals_raise():
        record = provenance(plan, plugins, spec_path)
        result_types = {name: stage.result for name, stage in plugins.stages(spec.choose).unambiguous().items()}
        previous = resume_from(output, record.spec, record.rpx_version, plugin_identity(plugins),
                               result_types) if resume and output is not None else None
        start = attrs.evolve(previous.run, provenance=attrs.evolve(previous.run.provenance, finished=None,
                                                                   command=record.command)) if previous else RunResult(provenance=record)
        results = ResultsFile(start, output, fmt, run_inputs(plan, spec_path))
        results.update()  # the file exists (and its folder is writable) before anything is measured
        if not available.available:
            for job in plan.jobs:
                skipped = {name: StageRecord("skipped", error=reason) for name in job.stages}
                results.put_model(_model_result(job, skipped, finished=True))
            run_skipped = {name: StageRecord("skipped", error=reason) for name in plan.run_stages}
            results.update(run_stages=run_skipped, provenance=attrs.evolve(results.run.provenance, finished=now()))
            return results.run

        backend.check_device(plan.jobs[0].device)
        executor = make_executor(plugins, execution, model_objects, backend.worker_preload)
        for job in plan.jobs:
            run_job(job, plan, plugins, executor, results, listener, previous, observer)
        for name in plan.run_stages:
            run_run_stage(name, plan, plugins, executor, results, listener, previous, observer)
        results.update(provenance=attrs.evolve(results.run.provenance, finished=now()))
        return results.run


def make_executor(plugins: Plugins, execution: Execution, model_objects: dict[str, Any] | None,
                  preload: tuple[str, ...] = ()) -> Executor:
    """``auto``: a worker process per job, unless the run holds live objects (models or plugins given to the Python
    API), which only rpx's own process has."""
    live = bool(model_objects) or any(info.distribution == "<runtime>" for info in plugins.infos())
    isolation = execution.isolation if execution.isolation != "auto" else ("in-process" if live else "worker")
    if isolation == "in-process":
        return InProcessExecutor(plugins, execution, model_objects)
    if model_objects:
        raise RpxError('a live model object cannot be sent to a worker process; use isolation "in-process"')
    return WorkerExecutor(setup_for(plugins), execution, preload)


def run_job(job: Job, plan: Plan, plugins: Plugins, executor: Executor, results: ResultsFile,
            listener: Listener | None, previous: Resumed | None, observer: Observer | None = None) -> ModelResult:
    """Run one model's stages; each outcome is recorded and written as soon as it is known."""
    done = previous.finished_model(job.model.name) if previous else None
    if done is not None:
        results.put_model(done)
        return done
    records = previous.kept_stages(job.model.name) if previous else {}
    kept = dict(records)
    model = _model_result(job, records)
    results.put_model(model)

    def report(event: Started | Finished | Progress) -> None:
        nonlocal model
        if observer:
            observer(job.model.name, event)
        if isinstance(event, Finished):
            records[event.stage] = event.record
            ordered = {name: records[name] for name in job.stages if name in records}
            model = attrs.evolve(model, stages=ordered, summary=summarise(ordered, plugins.stages(plan.spec.choose)),
                                 setup=setup_by_phase(ordered.values()))
            results.put_model(model)
            if listener:
                listener(job.model.name, event.stage, event.record)

    todo = tuple(name for name in job.stages if name not in kept)
    if todo:
        executor.run(Task("model", (job,), todo, (kept,), plan.spec.choose, plan.gpu_catalog), report)
    model = attrs.evolve(model, finished=now())
    results.put_model(model)
    return model


def run_run_stage(name: str, plan: Plan, plugins: Plugins, executor: Executor, results: ResultsFile,
                  listener: Listener | None, previous: Resumed | None, observer: Observer | None = None) -> None:
    """Run a run-scoped stage over every model's job, unless something it needs failed for a model."""
    earlier = previous.run_stage(name) if previous else None
    if earlier is not None and earlier.status != "interrupted":
        results.update(run_stages={**results.run.run_stages, name: earlier})
        return
    stage = plugins.stages(plan.spec.choose)[name]
    every_model = [record for model in results.run.models for record in model.stages.items()]
    failed = sorted({need for need, record in every_model if need in stage.needs and record.status != "ok"})

    def report(event: Started | Finished | Progress) -> None:
        if observer:
            observer("<run>", event)
        if isinstance(event, Finished):
            results.update(run_stages={**results.run.run_stages, name: event.record})
            if listener:
                listener("<run>", name, event.record)

    if failed:
        report(Finished(name, run_stage(stage, None, plugins, failed)))
        return
    kept = tuple(results.run.model(job.model.name).stages for job in plan.jobs)
    task = Task("run", plan.jobs, (name,), kept, plan.spec.choose, plan.gpu_catalog,
                options=plan.options.get(name), previous=earlier.result if earlier is not None else None)
    executor.run(task, report)


def setup_by_phase(records: Iterable[StageRecord]) -> dict[str, float]:
    """The model's setup seconds by phase: what each stage's record timed apart from its own seconds, summed."""
    total: dict[str, float] = {}
    for record in records:
        for phase, seconds in record.setup.items():
            total[phase] = round(total.get(phase, 0.0) + seconds, 6)
    return total


def _model_result(job: Job, records: dict[str, StageRecord], finished: bool = False) -> ModelResult:
    return ModelResult(
        name=job.model.name,
        source=job.model.source,
        backend=job.backend,
        device=job.device,
        precision=job.precision,
        started=now(),
        finished=now() if finished else None,
        stages=dict(records),
        notes=job.model.notes,
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
