"""What every command shares: loading the plugins as the command line asks, and the progress line of a stage."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def load_plugins(args: argparse.Namespace, *, tolerant: bool = False):
    from rpx_core.plugins import Plugins

    return Plugins.load([*args.disable, *getattr(args, "disable_after", [])], strict=args.strict_plugins,
                        tolerant=tolerant)


def print_progress(model: str, stage: str, record: Any) -> None:
    detail = f"{record.seconds:.2f} s" if record.seconds is not None else ""
    if record.error:
        detail = f"{detail}  {record.error.splitlines()[0]}".strip()
    print(f"  {model:<20} {stage:<18} {record.status:<8} {detail}", file=sys.stderr)
