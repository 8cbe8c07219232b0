"""From a validated spec and the loaded plugins to a plan: stage order, structured options, one Job per model.

Everything ``rpx validate`` can check without building a model happens here, so ``validate`` and ``run`` agree.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import attrs

from rpx_core.context import Job
from rpx_core.convert import structure
from rpx_core.errors import RpxError, SpecError
from rpx_core.plugins import Plugins
from rpx_core.spec import ModelSpec, Spec
from rpx_core.stages import StageDef, resolve_order


@attrs.frozen
class Plan:
    """What a run will do, as data."""

    spec: Spec
    stages: tuple[str, ...]  # every stage that runs, dependencies first
    run_stages: tuple[str, ...]  # the run-scoped ones (once per spec, after the models)
    jobs: tuple[Job, ...]
    options: dict[str, Any]  # stage -> structured options object
    where: str = "<spec>"  # the spec's file, for error messages


def make_plan(spec: Spec, plugins: Plugins, *, where: str = "<spec>", stages: tuple[str, ...] | None = None) -> Plan:
    """Resolve stage dependencies, check options and GPU names, and describe each model's job."""
    registry = plugins.stages(spec.choose)
    try:
        order = resolve_order(stages or spec.stages, registry)
    except RpxError as exc:
        raise SpecError(f"{where}: stages: {exc}") from None
    options = structure_options(spec, registry, where)
    backend = plugins.backend(spec.backend, spec.choose, require_available=False)
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
    if spec.gpus:
        check_gpu_names(spec, plugins, where)
    run_stages = tuple(name for name in order if registry[name].scope == "run")
    return Plan(spec, tuple(order), run_stages, jobs, options, where)


def structure_options(spec: Spec, registry: dict[str, StageDef], where: str) -> dict[str, Any]:
    """Each stage's ``[options.<stage>]`` table as its options class (defaults when absent); unknown stages refused."""
    for name in spec.options:
        if name not in registry:
            close = difflib.get_close_matches(name, registry, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; stages: {', '.join(sorted(registry))}"
            raise SpecError(f"{where}: options.{name}: unknown stage {name!r}{hint}")
    options: dict[str, Any] = {}
    for name, stage in registry.items():
        table = spec.options.get(name, {})
        if stage.options is None:
            if table:
                raise SpecError(f"{where}: options.{name}: stage {name!r} takes no options")
            continue
        options[name] = structure(table, stage.options, where=where, base_path=f"options.{name}")
    return options


def check_gpu_names(spec: Spec, plugins: Plugins, where: str) -> None:
    catalog = plugins.gpu_catalog(gpu_pack_paths(spec), spec.choose)
    for index, name in enumerate(spec.gpus):
        if name == "all":
            continue
        try:
            catalog.get(name)
        except Exception as exc:
            raise SpecError(f"{where}: gpus[{index}]: {exc}") from None


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
