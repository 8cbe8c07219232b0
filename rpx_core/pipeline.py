"""Running a plan: each model through its stages in order, failures recorded, dependants skipped, results kept.

The results file is rewritten after every stage, so a crash, an interrupt or a failing later stage never loses what
was already measured. Stage code never sees another model's objects: each job gets its own context, released after it.
"""

from __future__ import annotations

import datetime
import gc
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Literal

import attrs

from rpx_core.context import Job, RunContext, StageContext
from rpx_core.errors import BackendUnavailable, RpxError, UnsupportedError
from rpx_core.plan import Plan
from rpx_core.plugins import Plugins, Registry, StageHookError
from rpx_core.results import ModelResult, Provenance, RunResult, StageRecord, check_result, write
from rpx_core.stages import Stage
from rpx_core.summary import summarise
from rpx_core.version import __version__

Listener = Callable[[str, str, StageRecord], None]  # (model or "<run>", stage, record) after each stage


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class ResultsFile:
    """The run's results, rewritten atomically whenever something new is known."""

    def __init__(self, run: RunResult, path: Path | None, fmt: Literal["toml", "json"] | None = None) -> None:
        self.run = run
        self.path = path
        self.fmt = fmt

    def update(self, **changes: Any) -> None:
        self.run = attrs.evolve(self.run, **changes)
        if self.path is not None:
            try:
                write(self.run, self.path, self.fmt)
            except OSError as exc:
                raise RpxError(f"cannot write results to {self.path}: {exc.strerror or exc}") from None

    def put_model(self, model: ModelResult) -> None:
        models = [m for m in self.run.models if m.name != model.name]
        self.update(models=(*models, model))


def run_plan(
    plan: Plan,
    plugins: Plugins,
    *,
    output: Path | None,
    fmt: Literal["toml", "json"] | None = None,
    spec_path: str | None = None,
    model_objects: dict[str, Any] | None = None,
    listener: Listener | None = None,
) -> RunResult:
    """Run every job of ``plan``; return (and keep writing to ``output``) the results."""
    spec = plan.spec
    backend = plugins.backend(spec.backend, spec.choose, require_available=False)
    registry = plugins.stages(spec.choose)
    available = backend.availability
    reason = f"backend {backend.name!r} is not available on this machine: {available.reason}"
    if not available.available and spec.on_unavailable == "error":
        raise BackendUnavailable(reason)
    results = ResultsFile(RunResult(provenance=provenance(plan, plugins, spec_path)), output, fmt)
    results.update()  # the file exists (and its folder is writable) before anything is measured
    if not available.available:
        for job in plan.jobs:
            skipped = {name: StageRecord("skipped", error=reason) for name in job.stages}
            results.put_model(_model_result(job, skipped, finished=True))
        run_skipped = {name: StageRecord("skipped", error=reason) for name in plan.run_stages}
        results.update(run_stages=run_skipped, provenance=attrs.evolve(results.run.provenance, finished=now()))
        return results.run

    backend.check_device(plan.jobs[0].device)
    catalog = plan.gpu_catalog
    contexts = []
    for job in plan.jobs:
        ctx = StageContext(job, backend, plugins, catalog, model_object=(model_objects or {}).get(job.model.name))
        run_job(ctx, registry, results, listener)
        contexts.append(ctx)
    for name in plan.run_stages:
        run_ctx = RunContext(contexts, plan.options.get(name), backend, plugins, catalog)
        every_model = [record for model in results.run.models for record in model.stages.items()]
        failed = sorted({need for need, record in every_model if need in registry[name].needs and record.status != "ok"})
        record = run_stage(registry[name], run_ctx, plugins, failed)
        results.update(run_stages={**results.run.run_stages, name: record})
        if listener:
            listener("<run>", name, record)
    results.update(provenance=attrs.evolve(results.run.provenance, finished=now()))
    return results.run


def run_job(ctx: StageContext, registry: Registry[Stage], results: ResultsFile, listener: Listener | None) -> ModelResult:
    """Run one model's stages in order; each outcome is recorded and written before the next stage starts."""
    job = ctx.job
    records: dict[str, StageRecord] = {}
    model = _model_result(job, records)
    completed = False
    try:
        for name in job.stages:
            stage = registry[name]
            try:
                record = run_stage(stage, ctx, ctx.plugins, _failed_needs(stage, records))
            except BaseException:  # Ctrl-C or exit mid-stage: say so in the file, then let it propagate
                model = attrs.evolve(model, stages={**records, name: StageRecord("failed", error="interrupted")})
                raise
            records[name] = record
            if record.status == "ok":
                ctx.results[name] = record.result
            model = attrs.evolve(model, stages=dict(records), summary=summarise(records, registry))
            results.put_model(model)
            if listener:
                listener(job.model.name, name, record)
        completed = True
    finally:
        if completed:
            model = attrs.evolve(model, finished=now())
        results.put_model(model)
        ctx.release()  # free the model and inputs before the next job
        gc.collect()
    return model


def run_stage(stage: Stage, ctx: Any, plugins: Plugins, failed_needs: list[str]) -> StageRecord:
    """Run one stage through its hook unless something it needs failed; never raise for a stage's own failure.

    The record names the plugin that answered, or the one that was answering when the stage failed."""
    if failed_needs:
        return StageRecord("skipped", error=f"needs {', '.join(failed_needs)}, which did not succeed")
    started = time.perf_counter()
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
    except Exception as exc:
        return StageRecord(
            "failed",
            seconds=round(time.perf_counter() - started, 6),
            error=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
            provided_by=provider,
        )
    return StageRecord("ok", seconds=round(time.perf_counter() - started, 6), provided_by=provider, result=result)


def _failed_needs(stage: Stage, records: dict[str, StageRecord]) -> list[str]:
    return [need for need in stage.needs if need in records and records[need].status != "ok"]


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
