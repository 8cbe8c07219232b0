"""Test a hook without a whole run: a stage context for a model and spec settings in one call.

For plugin authors and rpx's own tests::

    from rpx_core.testing import make_context, run_stage

    ctx = make_context(torch.nn.Linear(16, 8), inputs=[(1, 16)], stages=["count_params"])
    assert run_stage("count_params", ctx).total == 136
    ctx = make_context(torch.nn.Linear(16, 8), inputs=[(1, 16)], backend="my-npu", stages=["count_params"])

The context is made exactly as ``rpx run`` makes it (spec checked, plan made, options structured into their classes),
so what a test sees is what a run sees.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from rpx_core.api import input_tables
from rpx_core.errors import UnsupportedError
from rpx_core.execution.context import RunContext, StageContext
from rpx_core.registry.backends import Backend
from rpx_core.registry.manager import Plugins, StageHookError
from rpx_core.spec.plan import Plan, make_plan
from rpx_core.spec.schema import spec_from_dict


@functools.cache
def default_plugins() -> Plugins:
    """The installed plugin set, loaded once per process."""
    return Plugins.load()


def make_plan_for(models: Mapping[str, Any], *, inputs: Iterable[Any] | Mapping[str, Iterable[Any]] = (),
                  model_keys: Mapping[str, Any] | None = None, plugins: Plugins | None = None, **settings: Any) -> Plan:
    """A plan for ``models`` (name -> a live object, or a source string ``"pkg.module:callable"``) and spec
    ``settings`` (backend, precision, stages, options, ...). ``inputs`` are shapes or input tables, for every model or
    per model name; ``model_keys`` are further keys of each ``[[models]]`` table (kwargs, input_factory, ...)."""
    tables = []
    for name, model in models.items():
        given = inputs.get(name, ()) if isinstance(inputs, Mapping) else inputs
        source = model if isinstance(model, str) else f"<object>:{type(model).__name__}"
        tables.append({"name": name, "source": source, "inputs": input_tables(given), **(model_keys or {})})
    spec = spec_from_dict({"models": tables, **settings}, where="make_context()")
    return make_plan(spec, plugins or default_plugins(), where="make_context()")


def make_context(model: Any, *, inputs: Iterable[Any] = (), backend: Backend | str | None = None,
                 plugins: Plugins | None = None, results: Mapping[str, Any] | None = None, name: str = "model",
                 model_keys: Mapping[str, Any] | None = None, **settings: Any) -> StageContext:
    """The StageContext a run would give the stages of ``model`` (a live object, or a source string). ``backend`` is
    the spec's backend name (``"cpu"`` by default), or a Backend object replacing the registered backend of the
    spec's name (e.g. a backend over a fake device); ``results`` are earlier stages' results by name."""
    plugins = plugins or default_plugins()
    backend, settings = _backend_setting(backend, settings)
    plan = make_plan_for({name: model}, inputs=inputs, model_keys=model_keys, plugins=plugins, **settings)
    backend = backend or plugins.backend(plan.spec.backend, plan.spec.choose, require_available=False)
    live = None if isinstance(model, str) else model
    ctx = StageContext(plan.jobs[0], backend, plugins, plan.gpu_catalog, model_object=live)
    ctx.results.update(results or {})
    return ctx


def make_run_context(models: Mapping[str, Any], *, stage: str, inputs: Iterable[Any] | Mapping[str, Iterable[Any]] = (),
                     backend: Backend | str | None = None, plugins: Plugins | None = None, **settings: Any) -> RunContext:
    """The RunContext a run-scoped ``stage`` (e.g. batch_search) would get for live ``models`` (name -> object);
    ``backend`` as for :func:`make_context`."""
    plugins = plugins or default_plugins()
    backend, settings = _backend_setting(backend, settings)
    plan = make_plan_for(models, inputs=inputs, plugins=plugins, stages=[stage], **settings)
    backend = backend or plugins.backend(plan.spec.backend, plan.spec.choose, require_available=False)
    contexts = [StageContext(job, backend, plugins, plan.gpu_catalog, model_object=live)
                for job in plan.jobs for live in [None if isinstance(models[job.model.name], str) else models[job.model.name]]]
    return RunContext(contexts, plan.options.get(stage), backend, plugins, plan.gpu_catalog)


def _backend_setting(backend: Backend | str | None, settings: dict[str, Any]) -> tuple[Backend | None, dict[str, Any]]:
    """A backend name is the spec's ``backend`` key; a Backend object stands in for the registered one."""
    if isinstance(backend, str):
        return None, {**settings, "backend": backend}
    return backend, settings


def run_stage(stage: str, ctx: StageContext | RunContext) -> Any:
    """Ask the plugins for ``stage`` as the pipeline does and return the result; raise what the stage raised."""
    declaration = ctx.plugins.stages()[stage]
    try:
        result, plugin = ctx.plugins.call_stage(declaration, ctx)
    except StageHookError as exc:
        raise exc.error from None
    if plugin is None:
        raise UnsupportedError(f"no installed plugin implements stage {stage!r} for backend {ctx.backend.name!r}")
    return result

