"""Everything ``rpx validate`` (and ``rpx run``, before anything runs) can check without running a model, reported
all at once: one ``file: key.path: problem`` line each.

The spec's own structure and meaning (:func:`rpx_core.spec.schema.structure_spec`), the plan (stages, options, backend,
precision, GPUs: :func:`rpx_core.spec.plan.plan_with_problems`), and here what needs the file system: model files exist,
import paths resolve *without importing them* (rpx's own process never runs user code: the module is found on the
import path and its source read for the name, never executed), devices have the backend's form, time limits fit in
each other, and the output is writable and none of the run's inputs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Callable

from rpx_core.errors import SpecError
from rpx_core.results.safe_write import OutputError, check_output
from rpx_core.safe_read import read_bytes
from rpx_core.spec.inputs import module_origins, spec_inputs


def validate(path: str | Path, plugins: Any, *, stages: tuple[str, ...] | None = None,
             output: Path | None = None, execution: dict[str, Any] | None = None,
             prepare: Callable[[Any], tuple[Any, dict[str, Any]]] | None = None) -> Any:
    """Load the spec at ``path`` (``execution`` overriding keys of its ``[execution]`` table), plan it once and check
    it; raise one SpecError listing every problem. ``prepare`` (``rpx run``) is given the spec once it has no problem
    of its own and returns the spec to plan and the models that failed meanwhile (the backend inferred from the
    first model, in a worker). Returns the plan (the spec as planned: ``plan.spec``)."""
    from rpx_core.spec.schema import read_spec_data, structure_spec

    path = Path(path)
    data = read_spec_data(path)
    spec, problems = structure_spec(data, where=str(path), base_dir=str(path.parent), default_name=path.stem)
    failed: dict[str, Any] = {}
    if spec is not None and not problems:
        spec = spec.with_execution(execution, str(path))
        if prepare is not None:
            spec, failed = prepare(spec)
    return checked_plan(spec, plugins, problems, where=str(path), stages=stages, output=output,
                        spec_path=str(path), failed_models=failed)


def checked_plan(spec: Any, plugins: Any, problems: list[str] | None = None, *, where: str,
                 stages: tuple[str, ...] | None = None, output: Path | None = None, spec_path: str | None = None,
                 failed_models: dict[str, Any] | None = None) -> Any:
    """The plan of ``spec`` (None: nothing could be made of it), made once and checked as ``rpx validate`` checks it;
    one SpecError listing every problem, ``problems`` (those found earlier) first. ``output``: the results file
    (default: the spec's)."""
    import attrs

    from rpx_core.spec.plan import plan_with_problems

    problems = list(problems or [])
    plan = None
    if spec is not None:
        plan, plan_problems = plan_with_problems(spec, plugins, where=where, stages=stages)
        problems += [line for line in plan_problems if line not in problems]
        try:
            target = output if output is not None else spec.output_path()
        except SpecError:
            target = None  # a bad output template, already reported
        problems += run_problems(spec, plan, plugins, where=where, output=target, spec_path=spec_path)
    if problems or plan is None:
        raise SpecError("\n".join(problems) or f"{where}: nothing to run")
    return attrs.evolve(plan, failed_models=dict(failed_models)) if failed_models else plan


def run_problems(spec: Any, plan: Any, plugins: Any, *, where: str, output: Path | None,
                 spec_path: str | None) -> list[str]:
    """Problems only the file system, the backend's device names and the limits together can show."""
    from rpx_core.registry import sources

    problems: list[str] = []
    registry = plugins.model_sources(spec.choose)
    for index, model in enumerate(spec.models):
        problems.extend(f"models[{index}].{line}" for line in
                        sources.problems(sources.resolve_target(model, spec.base_dir, registry), registry))
        for key in ("source", "input_factory"):
            source = getattr(model, key)
            if key == "source" and sources.split(source, registry):
                continue  # a named model: checked by its source above
            if source and ":" in source and not source.startswith("<object>"):
                problem = import_path_problem(source, Path(spec.base_dir))
                if problem and key == "source" and not source.partition(":")[0].endswith(".py"):
                    problem += sources.unknown_scheme_hint(source, registry)
                if problem:
                    problems.append(f"models[{index}].{key}: {problem}")
    if plan is not None:
        backend = plugins.backends(spec.choose)[spec.backend]
        if spec.device is not None:
            problem = backend.device_problem(spec.device)
            if problem:
                problems.append(f"device: {problem}")
        problems += limit_problems(spec, plan)
        if output is not None:
            try:
                check_output(output, spec_inputs(spec, plugins, spec_path))
            except OutputError as exc:
                return [f"{where}: {problem}" for problem in problems] + [str(exc)]  # names the output path first
    return [f"{where}: {problem}" for problem in problems]


def limit_problems(spec: Any, plan: Any) -> list[str]:
    """A stage's own time budget must fit in the limit that kills it, or it is killed before it can report."""
    problems = []
    latency = plan.options.get("measure_latency")
    execution = spec.execution
    if latency is not None and "measure_latency" in plan.stages:
        if latency.max_seconds >= execution.stage_timeout:
            problems.append(f"options.measure_latency.max_seconds: {latency.max_seconds:g} s is not less than "
                            f"execution.stage_timeout ({execution.stage_timeout:g} s), which would kill the stage first")
        if latency.warmup_seconds >= latency.max_seconds:
            problems.append(f"options.measure_latency.warmup_seconds: {latency.warmup_seconds:g} s is not less than "
                            f"max_seconds ({latency.max_seconds:g} s), which bounds the whole stage, warm-up included")
        cap = latency.warmup_max_seconds
        if cap is not None and cap >= latency.max_seconds:
            problems.append(f"options.measure_latency.warmup_max_seconds: {cap:g} s is not less than max_seconds "
                            f"({latency.max_seconds:g} s), which bounds the whole stage, warm-up included")
        elif cap is not None and latency.warmup_seconds > cap:
            problems.append(f"options.measure_latency.warmup_seconds: {latency.warmup_seconds:g} s of warm-up at least "
                            f"cannot fit in warmup_max_seconds ({cap:g} s), the most it may take")
    return problems


def import_path_problem(source: str, base_dir: Path) -> str | None:
    """Why ``module:attr`` or ``file.py:attr`` cannot be loaded, found without executing any of it; None if fine
    (or if only running it could tell)."""
    module_part, _, attr = source.rpartition(":")
    if not module_part or not attr:
        return f"{source!r}: expected 'package.module:callable' or 'path/to/file.py:callable'"
    if module_part.endswith(".py"):
        file = Path(module_part) if Path(module_part).is_absolute() else base_dir / module_part
        if not file.is_file():
            return f"no such file {file.resolve()}"
        origin: str | None = str(file)
    else:
        try:
            origin = find_module(module_part)
        except ModuleNotFoundError as exc:
            return f"{source!r}: cannot find module {exc.name!r} on the import path"
    if origin is None or not origin.endswith(".py"):
        return None  # a namespace package or an extension module: only importing could tell
    names = top_level_names(Path(origin))
    first = attr.split(".")[0]
    if names is not None and first not in names:
        from rpx_core.errors import did_you_mean

        return f"{source!r}: {module_part} defines no {first!r}{did_you_mean(first, names)}"
    return None


def find_module(name: str) -> str | None:
    """The file module ``name`` would be imported from, found like ``import`` finds it but without executing any
    package's ``__init__``; ModuleNotFoundError naming the part that is missing."""
    return module_origins(name)[-1]


def top_level_names(path: Path) -> set[str] | None:
    """Names a module's source binds (defs, classes, assignments, imports; anywhere, so a name is never wrongly
    missing); None when a star import or a module ``__getattr__`` means only running it could tell."""
    try:
        tree = ast.parse(read_bytes(path))
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Global):
            names.update(node.names)
    if "__getattr__" in names:
        return None
    return names
