"""What each registration hook must return, checked once when plugins load.

A plugin's ``rpx_register_*`` hook returns a list of registration objects. Whatever else it returns (a string, a
number, a path that does not exist, a backend without a name) would otherwise surface later as an internal error in
every command, naming nobody; checked here, it names the plugin, which is then left out (see
:meth:`rpx_core.registry.manager.Plugins.load`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from rpx_core.precision import PRECISIONS


def registration_problem(hook: str, returned: Any) -> str | None:
    """Why ``returned`` is not what ``hook`` must return (a list of its registration objects, or None), or None."""
    if returned is None:
        return None
    if not isinstance(returned, (list, tuple)):
        return f"{hook} returned {describe(returned)}, not a list"
    check = CHECKS[hook]()
    for index, item in enumerate(returned):
        problem = check(item)
        if problem:
            return f"{hook} returned {problem} at index {index}"
    return None


def describe(value: Any) -> str:
    """A value as a message shows it: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _instance_of(kind: type, expected: str) -> Callable[[Any], str | None]:
    def check(item: Any) -> str | None:
        if not isinstance(item, kind):
            return f"{describe(item)}, not {expected}"
        name = getattr(item, "name", getattr(item, "scheme", "x"))
        if not isinstance(name, str) or not name:
            return f"{expected} whose name is {describe(name)}, not a non-empty string"
        return None

    return check


def _backends() -> Callable[[Any], str | None]:
    from rpx_core.registry.backends import Backend

    named = _instance_of(Backend, "a Backend")

    def check(item: Any) -> str | None:
        problem = named(item)
        if problem:
            return problem
        precisions = item.precisions
        if not isinstance(precisions, (tuple, list)) or not all(isinstance(p, str) for p in precisions):
            return f"backend {item.name!r} whose precisions are {describe(precisions)}, not a tuple of names"
        unknown = [precision for precision in precisions if precision not in PRECISIONS]
        if unknown:
            return f"backend {item.name!r} with unknown precision {unknown[0]!r} (known: {', '.join(PRECISIONS)})"
        return None

    return check


def _gpu_packs() -> Callable[[Any], str | None]:
    def check(item: Any) -> str | None:
        if isinstance(item, (str, os.PathLike)):
            item = Path(item)
        elif not isinstance(item, Traversable):
            return f"{describe(item)}, not the path of a GPU-pack file"
        try:
            found = item.is_file()
        except (OSError, ValueError):  # an unreadable or unrepresentable path
            found = False
        return None if found else f"{str(item)!r}, which is not a file"

    return check


def _stages() -> Callable[[Any], str | None]:
    from rpx_core.registry.stages import Stage

    return _instance_of(Stage, "a Stage")


def _executors() -> Callable[[Any], str | None]:
    """An executor by what rpx calls on it (its class lives with the run path, which imports the plugin manager)."""

    def check(item: Any) -> str | None:
        name = getattr(item, "name", None)
        if not callable(getattr(item, "run", None)) or not isinstance(name, str) or not name:
            return f"{describe(item)}, not an Executor (a named object with run(items, env))"
        return None

    return check


def _op_formulas() -> Callable[[Any], str | None]:
    from rpx_core.registry.op_formula import OpFormula

    def check(item: Any) -> str | None:
        return None if isinstance(item, OpFormula) else f"{describe(item)}, not an OpFormula"

    return check


def _model_adapters() -> Callable[[Any], str | None]:
    from rpx_core.registry.adapters import ModelAdapter

    return _instance_of(ModelAdapter, "a ModelAdapter")


def _model_sources() -> Callable[[Any], str | None]:
    from rpx_core.registry.sources import ModelSource

    return _instance_of(ModelSource, "a ModelSource")


#: Registration hook -> (a function making) the check of one item it returns.
CHECKS: dict[str, Callable[[], Callable[[Any], str | None]]] = {
    "rpx_register_backends": _backends,
    "rpx_register_gpu_packs": _gpu_packs,
    "rpx_register_stages": _stages,
    "rpx_register_executors": _executors,
    "rpx_register_op_formulas": _op_formulas,
    "rpx_register_model_adapters": _model_adapters,
    "rpx_register_model_sources": _model_sources,
}
