"""The Python API for notebooks and scripts; the CLI is a thin layer over these same functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import attrs

from rpx_core.errors import RpxError, StageFailed
from rpx_core.execution.pipeline import Listener, Observer, run_plan
from rpx_core.execution.runners import WorkerRunner, make_runner
from rpx_core.execution.tasks import BackendProbe, Finished
from rpx_core.registry.adapters import adapter_for, backend_if_known, infer_backend
from rpx_core.registry.manager import Plugins
from rpx_core.registry.sources import split
from rpx_core.results import serialise as results_io
from rpx_core.results.records import ModelResult, RunResult, StageRecord
from rpx_core.spec.checks import checked_plan
from rpx_core.spec.plan import Plan, resolve_paths
from rpx_core.spec.schema import DEFAULT_STAGES, ModelSpec, Spec, load_spec, spec_from_dict

__all__ = ["load_spec", "run_spec", "run", "profile", "load_results", "StageFailed"]

#: ``output=DEFAULT`` writes where the spec says; ``output=None`` writes nothing.
DEFAULT: Any = object()


def run_spec(
    spec: Spec,
    *,
    output: str | Path | None = DEFAULT,
    fmt: Literal["toml", "json"] | None = None,
    stages: Sequence[str] | None = None,
    plugins: Plugins | None = None,
    spec_path: str | None = None,
    model_objects: dict[str, Any] | None = None,
    listener: Listener | None = None,
    execution: Mapping[str, Any] | None = None,
    resume: bool = False,
    where: str | None = None,
    observer: Observer | None = None,
) -> RunResult:
    """Run a loaded spec. Results are written to ``output`` as they are measured, in ``fmt`` (default: JSON for a
    .json suffix, else TOML). ``execution`` overrides keys of the spec's ``[execution]`` table (isolation, timeouts);
    ``resume`` continues the run already in ``output`` (see rpx_core.results.resume). ``where`` names the spec in problem
    lines (default: ``spec_path``)."""
    plugins = plugins or Plugins.load()
    plan = plan_spec(spec, plugins, stages=stages, execution=execution, spec_path=spec_path,
                     model_objects=model_objects, where=where, output=output)
    return run_plan(plan, plugins, output=output_path(plan.spec, output), fmt=fmt, spec_path=spec_path,
                    model_objects=model_objects, listener=listener, resume=resume, observer=observer)


def plan_spec(spec: Spec, plugins: Plugins, *, stages: Sequence[str] | None = None,
              execution: Mapping[str, Any] | None = None, spec_path: str | None = None,
              model_objects: dict[str, Any] | None = None, where: str | None = None,
              output: str | Path | None = DEFAULT) -> Plan:
    """The plan a run of ``spec`` follows (its jobs: one per model, or per point of a sweep), with ``execution``
    overriding keys of its ``[execution]`` table, made once and checked as ``rpx validate`` checks it (one SpecError
    listing every problem). Nothing runs, except that a spec naming no backend has its first model built in a
    worker to infer it (:func:`with_inferred_backend`). ``where`` names the spec in problem lines (default:
    ``spec_path``)."""
    where = where or spec_path or "<spec>"
    spec = spec.with_execution(dict(execution or {}), where)
    spec, failed = with_inferred_backend(spec, plugins, model_objects or {})
    return checked_plan(spec, plugins, where=where, stages=tuple(stages) if stages is not None else None,
                        output=output_path(spec, output), spec_path=spec_path, failed_models=failed)


def output_path(spec: Spec, output: str | Path | None = DEFAULT) -> Path | None:
    """The results file: ``output``, the spec's own with DEFAULT, none with None."""
    return spec.output_path() if output is DEFAULT else (Path(output) if output is not None else None)


def with_inferred_backend(spec: Spec, plugins: Plugins,
                          model_objects: dict[str, Any]) -> tuple[Spec, dict[str, StageRecord]]:
    """``spec`` with the backend its first model needs, for a spec that names none (see rpx_core.registry.adapters),
    and the models that failed on the way. The model is built where the run's jobs run (a worker process, unless
    the run is in-process), within the run's time limits, never in rpx's own process: a model whose building
    crashes, exits or hangs is returned as failed with the record of that (its jobs are recorded failed, never
    run), and the spec keeps the default backend. One whose building raises, a meta_only or a named model (never
    built to infer: it may be far larger than this machine), or a model of no framework an adapter recognises
    keeps the default backend, so the run reports any failure where it always did. A live object (the Python API)
    is looked at as it is."""
    if not spec.backend_inferred:
        return spec, {}
    first = spec.models[0]
    model = model_objects.get(first.name)
    if model is None:
        if first.meta_only or split(first.source, plugins.model_sources(spec.choose)):
            return spec, {}
        record = probe_in_worker(first, spec, plugins)
        if record.status != "ok":
            error = f"the spec names no backend, and building this model to infer it failed: {record.error}"
            return spec, {first.name: attrs.evolve(record, error=error)}
        backend = record.result
    else:
        backend = backend_if_known(model, plugins.model_adapters(), plugins.backends(spec.choose),
                                   f"model {first.name!r}")
    return (attrs.evolve(spec, backend=backend, backend_inferred=False) if backend else spec), {}


def probe_in_worker(model: ModelSpec, spec: Spec, plugins: Plugins) -> StageRecord:
    """The record of a :class:`~rpx_core.execution.tasks.BackendProbe` of ``model``, run as the spec's jobs run."""
    try:  # the default backend's framework, imported once in the zygote: most models are of it
        preload = tuple(plugins.backend(spec.backend, spec.choose, require_available=False).worker_preload)
    except RpxError:  # a clash on the default name, which the plan reports with its key path
        preload = ()
    runner = make_runner(plugins, spec.execution, None, preload)
    events: list[Any] = []
    try:
        runner.run(BackendProbe(resolve_paths(model, spec.base_dir), spec.choose), events.append)
    finally:
        if isinstance(runner, WorkerRunner):
            runner.close()
    return next(event.record for event in events if isinstance(event, Finished))


def run(spec_path: str | Path, **kwargs: Any) -> RunResult:
    """Load and run a spec file; keyword arguments as for :func:`run_spec`."""
    return run_spec(load_spec(spec_path), spec_path=str(spec_path), **kwargs)


def profile(
    model: Any,
    inputs: Iterable[Any],
    *,
    stages: Sequence[str] | None = None,
    name: str = "model",
    plugins: Plugins | None = None,
    output: str | Path | None = None,
    partial: bool = False,
    **settings: Any,
) -> ModelResult:
    """Profile a live model object as a spec's model is profiled: stages count and execute copies (in eval mode, at
    the precision asked for, on meta where ``count_on`` allows), never the caller's model. ``inputs`` are shapes
    (``(1, 3, 224, 224)``) or input tables (``{"shape": [1, 128], "dtype": "int64", "high": 32000}``; with ``"name"``
    a keyword argument); ``settings`` are spec keys (backend, precision, gpus, batch_sizes, options, ...); without a
    precision, the model's own (a bf16 module is counted at bf16). Default stages: Tier 1 and the system card, plus
    the roofline when ``gpus`` are given.

    A stage that fails raises :class:`~rpx_core.errors.StageFailed` with its error (the result is on the exception);
    ``partial=True`` returns the result instead, failed records included (``result.ok`` is then False)."""
    plugins = plugins or Plugins.load()
    adapters = plugins.model_adapters()
    if "backend" not in settings and (adapter_for(model, adapters) is not None or not callable(model)):
        # inferred from the model (a plain callable keeps the default torch backend); an object no adapter
        # recognises is one line naming every accepted form
        settings["backend"] = infer_backend(model, adapters, plugins.backends(), f"model {name!r}")
    if "precision" not in settings and (own := object_precision(model, plugins, settings.get("backend"))):
        settings["precision"] = own
    if stages is None:
        stages = (*DEFAULT_STAGES, "roofline") if settings.get("gpus") else DEFAULT_STAGES
    model_table = {"name": name, "source": f"<object>:{type(model).__name__}", "inputs": input_tables(inputs)}
    spec = spec_from_dict({"models": [model_table], "stages": list(stages), **settings}, where="profile()")
    result = run_spec(spec, output=output, plugins=plugins, model_objects={name: model}).model(name)
    failed = next((stage for stage, record in result.stages.items() if record.status in ("failed", "interrupted")), None)
    if failed is not None and not partial:
        record = result.stages[failed]
        raise StageFailed(f"stage {failed!r} {record.status} for model {name!r}: {record.error} "
                          "(partial=True returns the result with the failed stages)", stage=failed, result=result)
    return result


def object_precision(model: Any, plugins: Plugins, backend_name: str | None) -> str | None:
    """The precision ``model`` holds, as the backend that runs it tells (None: the spec's default)."""
    try:
        backend = plugins.backends()[backend_name or attrs.fields(Spec).backend.default]
    except (KeyError, RpxError):
        return None  # an unknown or clashing backend name is reported by the spec check, with its key path
    return backend.object_precision(model)


def input_tables(inputs: Iterable[Any]) -> list[dict[str, Any]]:
    """Shapes (``(1, 3, 224, 224)``) or input tables (``{"shape": [1, 128], "dtype": "int64"}``) as spec tables."""
    return [{"shape": list(item)} if isinstance(item, (tuple, list)) else dict(item) for item in inputs]


def load_results(path: str | Path, *, plugins: Plugins | None = None) -> RunResult:
    """Load a results file written by ``rpx run`` (TOML or JSON); each stage's result comes back as the type its
    stage declares (a stage no loaded plugin declares stays plain data)."""
    plugins = plugins or Plugins.load(tolerant=True)
    declared = plugins.stages().unambiguous()
    return results_io.load(path, result_types={name: stage.result for name, stage in declared.items()})
