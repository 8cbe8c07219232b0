"""Stage registration objects and dependency resolution.

A stage is declared by data (name, what it needs, its options class, its scope), so the engine can order stages,
pull in dependencies and skip dependants of a failure without knowing what any stage does.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import attrs

from rpx_core.errors import RpxError


@attrs.frozen
class StageDef:
    """A stage the pipeline can run.

    ``run(ctx)`` returns the stage's result object (an attrs instance, or a plain TOML-able dict for third-party stages).
    ``options`` is an attrs class; the spec's ``[options.<stage>]`` table is structured into it, so unknown options are
    rejected with the key path. ``scope`` is "model" (run once per model) or "run" (once per spec, e.g. batch_search
    over a pipeline of models).
    """

    name: str
    run: Callable[[Any], Any]
    needs: tuple[str, ...] = ()
    options: type | None = None
    description: str = ""
    scope: str = attrs.field(default="model", validator=attrs.validators.in_(("model", "run")))
    plugin: str | None = None  # set by the plugin manager: who registered the stage


@attrs.frozen
class Provided:
    """A stage result together with the plugin that produced it (the engine records both)."""

    result: Any
    plugin: str


def resolve_order(requested: Iterable[str], stages: Mapping[str, StageDef]) -> list[str]:
    """Requested stages plus everything they need, dependencies first, otherwise in request order."""
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
        visiting.pop()
        order.append(name)

    for name in requested:
        visit(name, None)
    return order
