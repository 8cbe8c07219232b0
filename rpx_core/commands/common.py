"""What every command shares: loading the plugins as the command line asks, a results file with the stage
declarations that say how to show it, and checking a file a command is about to write."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def load_plugins(args: argparse.Namespace, *, tolerant: bool = False):
    from rpx_core.registry.manager import Plugins

    return Plugins.load([*args.disable, *getattr(args, "disable_after", [])], strict=args.strict_plugins,
                        tolerant=tolerant)


def declared_stages(plugins: Any) -> dict[str, Any]:
    """Every stage declaration a command may show, in the order plugins loaded (built-ins first)."""
    return plugins.stages().in_load_order()


def load_results(path: str, plugins: Any) -> Any:
    """A results file with each stage's result as its declared type; a missing or foreign file is one line."""
    from rpx_core.api import load_results as load

    return load(Path(path), plugins=plugins)


def checked_output(path: Path, plugins: Any, read: Iterable[Any] = ()) -> list[Any]:
    """Refuse, before anything is written, to write ``path`` over what the command reads (``read``, and rpx's and
    the plugins' code and packs) or over a special file, or where nothing can be created; return those inputs, for
    the write itself to check again (rpx_core.results.safe_write)."""
    from rpx_core.results.safe_write import check_output
    from rpx_core.spec.inputs import installed_inputs

    inputs = [*read, *installed_inputs(plugins)]
    check_output(path, inputs)
    return inputs
