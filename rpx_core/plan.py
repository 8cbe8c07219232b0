"""From a validated spec and the loaded plugins to a plan: stage order, structured options, one Job per model.

Everything ``rpx validate`` can check without building a model happens here, so ``validate`` and ``run`` agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from rpx_core.backends import Backend
from rpx_core.context import Job
from rpx_core.convert import structure
from rpx_core.errors import PluginError, RpxError, SpecError, did_you_mean
from rpx_core.gpus import GPUCatalog
from rpx_core.plugins import Plugins, Registry, choose_one_of
from rpx_core.spec import ModelSpec, Spec
from rpx_core.stages import Stage, resolve_order


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


def make_plan(spec: Spec, plugins: Plugins, *, where: str = "<spec>", stages: tuple[str, ...] | None = None) -> Plan:
    """Resolve stage dependencies, check options, backend, precision and GPU names, and describe each model's job."""
    registry = plugins.stages(spec.choose)
    try:
        order = resolve_order(stages or spec.stages, registry)
    except RpxError as exc:
        raise SpecError(f"{where}: stages: {exc}") from None
    backends = plugins.backends(spec.choose)
    check_choices(spec, registry, backends, where)
    if spec.backend not in backends:
        raise SpecError(f"{where}: backend: {spec.backend!r} not recognized. {choose_one_of(spec.backend, backends)}")
    try:
        backend = backends[spec.backend]
    except PluginError as exc:
        raise SpecError(f"{where}: backend: {exc}") from None
    check_scopes(order, registry, where)
    options = structure_options(spec, registry, order, where)
    catalog = plugins.gpu_catalog(gpu_pack_paths(spec), spec.choose)
    problems = [*stage_problems(spec, registry, order, options), *precision_problems(spec, backend, registry, order, options)]
    problems += gpu_problems(spec, catalog)
    if problems:
        raise SpecError("\n".join(f"{where}: {problem}" for problem in problems))
    device = spec.device or backend.default_device()
    model_stages = tuple(name for name in order if registry[name].scope == "model")
    jobs = tuple(
        Job(
            model=resolve_paths(model, spec.base_dir),
            backend=spec.backend,
            device=device,
            precision=spec.precision,
            stages=model_stages,
            options=options,
            gpus=spec.gpus,
            batch_sizes=spec.batch_sizes,
        )
        for model in spec.models
    )
    run_stages = tuple(name for name in order if registry[name].scope == "run")
    return Plan(spec, tuple(order), run_stages, jobs, options, catalog, where)


def check_choices(spec: Spec, stages: Registry[Stage], backends: Registry[Backend], where: str) -> None:
    """Every ``[choose]`` entry must name a registered name and a plugin that registers it."""
    for kind, registry, chosen in (("backends", backends, spec.choose.backends), ("stages", stages, spec.choose.stages)):
        for name in chosen:
            if name not in registry:
                raise SpecError(f"{where}: choose.{kind}.{name}: no plugin registers {registry.kind} {name!r}"
                                f"{did_you_mean(name, registry)}")
            try:
                registry.entry(name)
            except PluginError as exc:
                raise SpecError(f"{where}: {exc}") from None


def check_scopes(order: list[str], registry: Registry[Stage], where: str) -> None:
    """A per-model stage runs before the run-scoped ones, so it cannot need one."""
    for name in order:
        stage = registry[name]
        wrong = [need for need in stage.needs if stage.scope == "model" and registry[need].scope == "run"]
        if wrong:
            raise SpecError(f"{where}: stages: per-model stage {name!r} needs run-scoped stage {wrong[0]!r}, which runs after it")


def stage_problems(spec: Spec, registry: Registry[Stage], order: list[str], options: dict[str, Any]) -> list[str]:
    """What each stage's own ``check`` finds in the spec before anything runs."""
    return [problem for name in order for problem in registry[name].check(spec, options.get(name))]


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


def structure_options(spec: Spec, registry: Registry[Stage], order: list[str], where: str) -> dict[str, Any]:
    """The options of each stage that runs or that the spec configures, as its options class (defaults when absent)."""
    for name in spec.options:
        if name not in registry:
            hint = did_you_mean(name, registry) or f"; stages: {', '.join(sorted(registry))}"
            raise SpecError(f"{where}: options.{name}: unknown stage {name!r}{hint}")
    options: dict[str, Any] = {}
    for name in dict.fromkeys([*order, *spec.options]):
        stage, table = registry[name], spec.options.get(name, {})
        if stage.options is None:
            if table:
                raise SpecError(f"{where}: options.{name}: stage {name!r} takes no options")
            continue
        options[name] = structure(table, stage.options, where=where, base_path=f"options.{name}")
    return options


def gpu_problems(spec: Spec, catalog: GPUCatalog) -> list[str]:
    """Every GPU name must be known (and unambiguous); "all" needs every name settled."""
    problems = []
    for index, name in enumerate(spec.gpus):
        try:
            catalog.all() if name == "all" else catalog.get(name)
        except RpxError as exc:
            problems.append(f"gpus[{index}]: {exc}")
    return problems


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
