"""CLI commands that read results files (show, compare, plot, report), one module each; ``rpx_core.cli`` registers
them. Each module's ``register(command)`` adds its parser through the CLI's ``command(name, help)`` factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load(path: str) -> Any:
    """A results file with each stage's result as its declared type; a missing or foreign file is one-line error."""
    from rpx_core.api import load_results

    return load_results(Path(path))
