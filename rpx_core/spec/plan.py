"""From a validated spec and the loaded plugins to a plan: stage order, structured options, one Job per model.

Everything ``rpx validate`` can check without building a model happens here, so ``validate`` and ``run`` agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from rpx_core.convert import structure
from rpx_core.errors import PluginError, RpxError, SpecError, choose_one_of, did_you_mean
from rpx_core.execution.context import Job
from rpx_core.registry.backends import Backend
from rpx_core.registry.gpus import GPUCatalog
from rpx_core.registry.manager import Plugins, Registry
from rpx_core.registry.sources import ModelSource, findable, resolve_inputs, resolve_target
from rpx_core.registry.stages import Stage, check_problems, resolve_order
from rpx_core.results.records import StageRecord
from rpx_core.spec.schema import ModelSpec, Spec
from rpx_core.spec.sweep import expand, sweep_problems


@attrs.frozen
class Plan:
    """What a run will do, as data."""

    spec: Spec
    stages: tuple[str, ...]  # every stage that runs, dependencies first
    run_stages: tuple[str, ...]  # the run-scoped ones (once per spec, after the models)
    jobs: tuple[Job, ...]
    options: dict[str, Any]  # stage -> structured options object
    gpu_catalog: GPUCatalog  # every GPU of every pack this run loaded (plugin packs, the spec's gpu_packs, RPX_GPU_PACKS)
    where: str = "<spec>"  # the spec's file, for error messages
    #: [[models]] name -> why the model failed before any job ran (building it in a worker to infer the backend
    #: crashed, exited or hung): each of its jobs is recorded failed with this record, never run.
    failed_models: dict[str, StageRecord] = attrs.Factory(dict)


def make_plan(spec: Spec, plugins: Plugins, *, where: str = "<spec>", stages: tuple[str, ...] | None = None) -> Plan:
    """Resolve stage dependencies, check options, backend, precision and GPU names, and describe each model's job;
    every problem found is reported at once (one SpecError, one line each)."""
    plan, problems = plan_with_problems(spec, plugins, where=where, stages=stages)
    if problems or plan is None:
        raise SpecError("\n".join(problems))
    return plan


def plan_with_problems(spec: Spec, plugins: Plugins, *, where: str = "<spec>",
                       stages: tuple[str, ...] | None = None) -> tuple[Plan | None, list[str]]:
    """The plan and every problem ``rpx validate`` reports for it (``file: key.path: problem`` lines); the plan is
    None when a problem leaves nothing to plan."""
    registry = plugins.stages(spec.choose)
    backends = plugins.backends(spec.choose)
    problems: list[str] = []
    requested = spec.stages if stages is None else stages
    key = "stages" if stages is None else "--stages"
    if stages is not None and not stages:
        problems.append(f"{key}: no stage given")
    known = []
    for index, name in enumerate(requested):
        if name in registry:
            known.append(name)
        else:
            at = f"{key}[{index}]" if stages is None else key
            problems.append(f"{at}: unknown stage {name!r}{did_you_mean(name, registry)} (stages: {', '.join(registry)})")
    try:
        order = resolve_order(known, registry)
    except RpxError as exc:
        problems.append(f"{key}: {exc}")
        order = []
    sources = plugins.model_sources(spec.choose)
    problems += choice_problems(spec, registry, backends, sources)
    backend = None
    if spec.backend in backends:
        try:
            backend = backends[spec.backend]
        except PluginError as exc:
            problems.append(f"backend: {exc}")
    else:
        problems.append(f"backend: {spec.backend!r} not recognized. {choose_one_of(spec.backend, backends)}")
    problems += scope_problems(order, registry)
    options, option_problems = structure_options(spec, registry, order, where)
    problems += option_problems
    catalog = plugins.gpu_catalog(gpu_pack_paths(spec), spec.choose)
    problems += catalog.problems  # packs that do not load (every problem of each), [choose.gpus] naming no GPU
    checkable = [name for name in order if registry[name].options is None or name in options]  # options understood
    problems += stage_problems(spec, registry, checkable, options, catalog)
    if backend is not None:
        problems += precision_problems(spec, backend, registry, checkable, options)
    problems += gpu_problems(spec, catalog)
    models = []
    for index, model in enumerate(spec.models):
        try:
            models.append(resolve_inputs(resolve_target(resolve_paths(model, spec.base_dir), spec.base_dir, sources), sources))
        except RpxError as exc:  # a clashing scheme, or a shape its source cannot read
            problems.append(f"models[{index}].input_shape: {exc}")
            models.append(model)
    swept = sweep_problems(spec.sweep, models) if spec.sweep is not None else []
    problems += swept
    if spec.sweep is not None:
        problems += sweep_plan_problems(spec, backends, registry, checkable, options, catalog)
    problems = [problem if problem.startswith(f"{where}: ") else f"{where}: {problem}" for problem in problems]
    if backend is None or not order or swept:  # a sweep with a wrong axis has no points to plan
        return None, problems
    model_stages = tuple(name for name in order if registry[name].scope == "model")
    jobs = tuple(
        Job(
            model=point.model,
            backend=point.backend,
            device=spec.device or (backends[point.backend].default_device() if point.backend in backends
                                   else backend.default_device()),
            precision=point.precision,
            stages=model_stages,
            options=options,
            gpus=spec.gpus,
            batch_sizes=spec.batch_sizes,
            coordinates=point.coordinates,
            machine=canonical_gpu(catalog, point.machine),
        )
        for point in expand(spec.sweep, models, spec.precision, spec.backend)
    )
    problems += [f"{where}: {problem}" for problem in executor_problems(spec, plugins, jobs, where)]
    run_stages = tuple(name for name in order if registry[name].scope == "run")
    return Plan(spec, tuple(order), run_stages, jobs, options, catalog, where), problems


def sweep_plan_problems(spec: Spec, backends: Registry[Backend], registry: Registry[Stage], order: list[str],
                        options: dict[str, Any], catalog: GPUCatalog) -> list[str]:
    """A sweep's backends must be registered and execute its precisions where a stage executes the model; its
    machines must be known GPUs, and only measured stages run on a machine."""
    assert spec.sweep is not None
    problems = []
    swept = []
    for index, name in enumerate(spec.sweep.backend):
        if name not in backends:
            problems.append(f"sweep.backend[{index}]: {name!r} not recognized. {choose_one_of(name, backends)}")
            continue
        try:
            swept.append(backends[name])
        except PluginError as exc:
            problems.append(f"sweep.backend[{index}]: {exc}")
    if not spec.sweep.backend and spec.backend in backends:
        swept.append(backends[spec.backend])
    executing = [name for name in order if registry[name].executes(options.get(name))]
    for backend in swept if executing else ():
        for precision in spec.sweep.precision or (spec.precision,):
            if precision not in backend.precisions:
                problems.append(f"sweep.precision: backend {backend.name!r} cannot execute {precision!r} (it "
                                f"executes {', '.join(backend.precisions)}), which stage {executing[0]!r} needs")
    for index, name in enumerate(spec.sweep.machine):
        try:
            catalog.get(name)
        except RpxError as exc:
            problems.append(f"sweep.machine[{index}]: {exc}")
    measured = [name for name in order if registry[name].measures]
    if spec.sweep.machine and not measured:
        problems.append("sweep.machine: no stage of this spec measures on a machine (measure_latency, batch_search); "
                        "rooflines for several GPUs come from `gpus`")
    return problems


def executor_problems(spec: Spec, plugins: Plugins, jobs: tuple[Job, ...], where: str) -> list[str]:
    """The executor must be registered, its options valid, and every job possible on it."""
    executors = plugins.executors()
    name = spec.execution.executor
    if name not in executors:
        return [f"execution.executor: {name!r} not recognized. {choose_one_of(name, executors)}"]
    try:
        executor = executors[name]
    except PluginError as exc:
        return [f"execution.executor: {exc}"]
    missing = [module for module in executor.requires if not findable(module)]
    if missing:
        how = f": {executor.install}" if executor.install else ""
        return [f"execution.executor: executor {name!r} needs {', '.join(map(repr, missing))}, which is not "
                f"installed{how}"]
    if executor.options is None:
        if spec.execution.executor_options:
            return [f"execution.executor_options: executor {name!r} takes no options"]
        return executor.problems(jobs, None)
    try:
        options = structure(spec.execution.executor_options, executor.options, where=where,
                            base_path="execution.executor_options")
    except SpecError as exc:
        return [line.removeprefix(f"{where}: ") for line in str(exc).splitlines()]
    return executor.problems(jobs, options)


def choice_problems(spec: Spec, stages: Registry[Stage], backends: Registry[Backend],
                    sources: Registry[ModelSource]) -> list[str]:
    """Every ``[choose]`` entry must name a registered name and a plugin that registers it."""
    problems = []
    for kind, registry, chosen in (("backends", backends, spec.choose.backends), ("stages", stages, spec.choose.stages),
                                   ("sources", sources, spec.choose.sources)):
        for name in chosen:
            if name not in registry:
                problems.append(f"choose.{kind}.{name}: no plugin registers {registry.kind} {name!r}"
                                f"{did_you_mean(name, registry)}")
                continue
            try:
                registry.entry(name)
            except PluginError as exc:
                problems.append(str(exc))
    return problems


def scope_problems(order: list[str], registry: Registry[Stage]) -> list[str]:
    """A per-model stage runs before the run-scoped ones, so it cannot need one."""
    problems = []
    for name in order:
        stage = registry[name]
        wrong = [need for need in stage.needs if stage.scope == "model" and registry[need].scope == "run"]
        if wrong:
            problems.append(f"stages: per-model stage {name!r} needs run-scoped stage {wrong[0]!r}, which runs after it")
    return problems


def stage_problems(spec: Spec, registry: Registry[Stage], order: list[str], options: dict[str, Any],
                   catalog: GPUCatalog) -> list[str]:
    """What each stage's own ``check`` finds in the spec before anything runs."""
    return [problem for name in order
            for problem in check_problems(registry[name], spec, options.get(name), catalog, registry.provider(name))]


def precision_problems(spec: Spec, backend: Backend, registry: Registry[Stage], order: list[str],
                       options: dict[str, Any]) -> list[str]:
    """A stage that executes the model needs a precision the backend executes; counting on meta needs none."""
    if spec.precision in backend.precisions:
        return []
    executing = [name for name in order if registry[name].executes(options.get(name))]
    if not executing:
        return []
    return [f"precision: backend {backend.name!r} cannot execute {spec.precision!r} (it executes "
            f"{', '.join(backend.precisions)}), which stage {executing[0]!r} needs; choose another precision or "
            f"drop {', '.join(map(repr, executing))}"]


def structure_options(spec: Spec, registry: Registry[Stage], order: list[str],
                      where: str) -> tuple[dict[str, Any], list[str]]:
    """The options of each stage that runs or that the spec configures, as its options class (defaults when absent),
    and every problem with them."""
    problems = []
    for name in spec.options:
        if name not in registry:
            hint = did_you_mean(name, registry) or f"; stages: {', '.join(sorted(registry))}"
            problems.append(f"options.{name}: unknown stage {name!r}{hint}")
    options: dict[str, Any] = {}
    for name in dict.fromkeys([*order, *(name for name in spec.options if name in registry)]):
        stage, table = registry[name], spec.options.get(name, {})
        if stage.options is None:
            if table:
                problems.append(f"options.{name}: stage {name!r} takes no options")
            continue
        try:
            options[name] = structure(table, stage.options, where=where, base_path=f"options.{name}")
        except SpecError as exc:
            problems.extend(str(exc).splitlines())
    return options, problems


def gpu_problems(spec: Spec, catalog: GPUCatalog) -> list[str]:
    """Every GPU name must be known (and unambiguous); "all" needs every name settled."""
    problems = []
    for index, name in enumerate(spec.gpus):
        try:
            catalog.all() if name == "all" else catalog.get(name)
        except RpxError as exc:
            problems.append(f"gpus[{index}]: {exc}")
    return problems


def canonical_gpu(catalog: GPUCatalog, name: str | None) -> str | None:
    """The GPU's canonical name for a name or alias a spec wrote (what executors place jobs by); as written when the
    catalogue cannot resolve it (already reported)."""
    if name is None:
        return None
    try:
        return catalog.get(name).name
    except RpxError:
        return name


def gpu_pack_paths(spec: Spec) -> list[Path]:
    return [Path(spec.base_dir) / path for path in spec.gpu_packs]


def resolve_paths(model: ModelSpec, base_dir: str) -> ModelSpec:
    """Make ``file.py:callable`` sources absolute so a job means the same thing from any working directory."""

    def resolve(source: str | None) -> str | None:
        if source is None:
            return None
        module, _, attr = source.rpartition(":")
        if module.endswith(".py") and not Path(module).is_absolute():
            return f"{(Path(base_dir) / module).resolve()}:{attr}"
        return source

    return attrs.evolve(model, source=resolve(model.source), input_factory=resolve(model.input_factory))
