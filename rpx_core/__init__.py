"""rpx: a declarative, plugin-based model-efficiency profiler.

The notebook API: ``load_spec``, ``run_spec``, ``run``, ``profile`` (raising ``StageFailed``), ``load_results``. Plugin authors import from
:mod:`rpx_core.plugin`. Names load on first use, so ``import rpx_core`` (and ``rpx --help``) stays light; nothing here
imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from rpx_core.version import __version__

#: Public name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "load_spec": "rpx_core.api",
    "run_spec": "rpx_core.api",
    "run": "rpx_core.api",
    "profile": "rpx_core.api",
    "load_results": "rpx_core.api",
    "StageFailed": "rpx_core.errors",
    "hookimpl": "rpx_core.registry.hookspecs",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rpx_core' has no attribute {name!r}")
