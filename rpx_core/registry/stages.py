"""A stage, declared once: the one object the plan, the pipeline, the results file and the summary all read.

A plugin returns :class:`Stage` declarations from ``rpx_register_stages``. The engine derives everything else from them:
the stage's hook (``rpx_<name>(ctx)``, first non-None result wins, so any plugin can answer it for the backends it
chooses), dependency order, option checking with key paths, the result type that results are checked against and
reloaded as, the flat summary fields, the spec checks that ``rpx validate`` runs, and how the stage's results are
shown: its tables (``rpx show``, the report, the end of ``rpx run``), the figures ``rpx compare`` and sweep charts read,
and its charts. Built-in stages are declared exactly like third-party ones (``rpx_plugins/stages/``); the display code
in ``rpx_core/show`` knows no stage by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from rpx_core.errors import RpxError

#: ``summary(result, results)`` -> flat fields for table rows; ``results`` holds every successful result of the same
#: model by stage name (so a field may combine stages, e.g. measured latency against the roofline bound).
Summary = Callable[[Any, Mapping[str, Any]], Mapping[str, float | str]]
#: ``check(spec, options, gpus)`` -> problems as ``"key.path: what is wrong"``, found without running anything:
#: ``spec`` is the spec as rpx understood it (rpx_core.spec.schema.Spec: ``models``, ``gpus``, ``precision``,
#: ``batch_sizes``, ... with defaults filled in), ``options`` the stage's structured options (None without an options
#: class), ``gpus`` the run's GPU catalogue (rpx_core.registry.gpus.GPUCatalog: ``gpus.get(name)`` resolves a name,
#: an alias or a unique prefix as every other part of rpx does). A check written for ``(spec, options)`` is called
#: with those two.
Check = Callable[..., Iterable[str]]
#: ``executes(options)`` -> whether the stage runs the model on the backend at the run's precision.
Executes = Callable[[Any], bool]
#: ``figures(models)`` -> the comparable figures (rpx_core.show.compare.Figure) any of ``models`` (one model's results
#: in each of several files) has: what ``rpx compare`` puts side by side and sweep charts draw.
Figures = Callable[[Sequence[Any]], Iterable[Any]]
#: ``traits(run, model)`` -> the facts this stage's figures depend on, by name ("counting convention": ...): two files
#: whose traits differ are not compared on the figures that depend on them.
Traits = Callable[[Any, Any], Mapping[str, Any]]
#: ``footer(run)`` -> lines under all the tables about the whole run (the system card's machine line).
Footer = Callable[[Any], Iterable[str]]


def _never(options: Any) -> bool:
    return False


def _always(options: Any) -> bool:
    return True


def _executes(value: Executes | bool) -> Executes:
    """``executes=True``/``False`` for a stage that always / never runs the model, whatever its options."""
    if isinstance(value, bool):
        return _always if value else _never
    return value


def _no_check(spec: Any, options: Any, gpus: Any) -> Iterable[str]:
    return ()


def _no_summary(result: Any, results: Mapping[str, Any]) -> Mapping[str, float | str]:
    return {}


def _stage_name(_: Any, attribute: attrs.Attribute, value: str) -> None:
    if not value.isidentifier() or not value.islower():
        raise ValueError(f"stage name {value!r} must be a lower-case Python identifier (its hook is rpx_{value})")


@attrs.frozen
class Stage:
    """Everything about one stage except its implementation (that is the hook, answered by any plugin).

    * ``result``: the attrs class every implementation must return; results files reload as it. None: a plain dict
      of TOML-able values.
    * ``options``: an attrs class the spec's ``[options.<name>]`` table is structured into (unknown keys and wrong
      types are errors with the key path); None: the stage takes no options.
    * ``scope``: "model" (once per model, ``ctx`` is a StageContext) or "run" (once per spec after every model,
      ``ctx`` is a RunContext with one StageContext per model).
    * ``executes``: whether, with the given options, the stage runs the model on the backend (a function of the
      options, or True/False); ``rpx validate`` then refuses a precision the backend cannot execute.
    * ``after``: stages this one runs after whenever both are in a job, without needing them (a stage that would
      disturb another's measurement, as a profiler would a latency, runs after it).
    * ``measures``: whether the stage times the machine it runs on (latency, memory under load); a job with such a
      stage runs alone on its machine (the local executor runs it by itself, a cluster gives it a whole GPU).
    * ``check``: spec problems this stage can see before anything runs (e.g. the roofline needs GPUs); see
      :data:`Check` for its arguments, and :func:`check_problems` for how it is called.
    * ``summary``: the flat fields this stage's result adds to its model's ``summary`` table.
    * ``tables``: :class:`rpx_core.show.tables.TableView` objects, each building one table from a results file.
    * ``figures``: its comparable figures (:class:`rpx_core.show.compare.Figure`), and ``traits``, the facts they
      depend on (see the aliases above); ``charts``: :class:`rpx_core.show.charts.ChartView` objects (``rpx plot
      --kind NAME``, the report); ``footer``: lines about the whole run.
    * ``doc``: what the hook receives and returns, for ``rpx plugins --hooks`` and the plugin guide.
    """

    name: str = attrs.field(validator=_stage_name)
    description: str
    result: type | None = None
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    options: type | None = None
    scope: Literal["model", "run"] = attrs.field(default="model", validator=attrs.validators.in_(("model", "run")))
    executes: Executes = attrs.field(default=_never, converter=_executes)
    measures: bool = False
    check: Check = _no_check
    summary: Summary = _no_summary
    tables: tuple[Any, ...] = ()
    figures: Figures | None = None
    traits: Traits | None = None
    charts: tuple[Any, ...] = ()
    footer: Footer | None = None
    doc: str = ""

    @property
    def hook(self) -> str:
        """The hook every implementation of this stage implements: ``rpx_<name>(ctx)``."""
        return f"rpx_{self.name}"


def check_problems(stage: Stage, spec: Any, options: Any, gpus: Any, provider: str) -> list[str]:
    """What ``stage.check`` finds in ``spec``. A check that raises, or returns anything but lines of text, is a line
    naming the stage and ``provider`` (the plugin that declared it): a plugin's mistake never stops ``validate``."""
    try:
        found = list(stage.check(*(spec, options, gpus)[: _positional_count(stage.check)]))
    except Exception as exc:  # a plugin's check: anything it raises is reported, naming it
        return [f"stages: the check of stage {stage.name!r} (plugin {provider!r}) raised {type(exc).__name__}: {exc}"]
    wrong = next((line for line in found if not isinstance(line, str)), None)
    if wrong is not None:
        return [f"stages: the check of stage {stage.name!r} (plugin {provider!r}) returned {type(wrong).__name__} "
                f"{wrong!r}, not a line of text"]
    return found


def _positional_count(function: Callable[..., Any]) -> int:
    """How many of (spec, options, gpus) ``function`` takes: 3, or 2 for a check written before ``gpus``."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 3
    if any(parameter.kind is parameter.VAR_POSITIONAL for parameter in parameters):
        return 3
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return 2 if len(positional) == 2 else 3


def resolve_order(requested: Iterable[str], stages: Mapping[str, Stage]) -> list[str]:
    """Requested stages plus everything they need, dependencies (and the stages each runs ``after``, when they are
    in the job too) first, otherwise in request order."""
    requested = list(requested)
    planned = _plan_order(requested, stages, set())
    return _plan_order(requested, stages, set(planned))


def _plan_order(requested: list[str], stages: Mapping[str, Stage], present: set[str]) -> list[str]:
    """The order visiting ``needs``, and ``after`` where that stage is in ``present``."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str, wanted_by: str | None) -> None:
        if name in order:
            return
        if name not in stages:
            where = f" (needed by stage {wanted_by!r})" if wanted_by else ""
            raise RpxError(f"unknown stage {name!r}{where}. Choose one of: {', '.join(sorted(stages))}")
        if name in visiting:
            cycle = " -> ".join([*visiting[visiting.index(name) :], name])
            raise RpxError(f"stage dependency cycle: {cycle}")
        visiting.append(name)
        for need in stages[name].needs:
            visit(need, name)
        for earlier in stages[name].after:
            if earlier in present:
                visit(earlier, name)
        visiting.pop()
        order.append(name)

    for name in requested:
        visit(name, None)
    return order
