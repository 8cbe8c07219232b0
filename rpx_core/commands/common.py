"""What every command shares: loading the plugins as the command line asks, and a results file with the stage
declarations that say how to show it."""

from __future__ import annotations

import argparse
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
    from pathlib import Path

    from rpx_core.api import load_results as load

    return load(Path(path), plugins=plugins)
