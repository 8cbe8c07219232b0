"""rpx: a declarative, plugin-based model-efficiency profiler.

The notebook API: ``load_spec``, ``run_spec``, ``run``, ``profile``, ``load_results``. Plugin authors import from
:mod:`rpx_core.plugin`. Nothing here imports torch.
"""

from __future__ import annotations

from rpx_core.api import load_results, load_spec, profile, run, run_spec
from rpx_core.hookspecs import hookimpl
from rpx_core.version import __version__

__all__ = ["__version__", "hookimpl", "load_spec", "run_spec", "run", "profile", "load_results"]
