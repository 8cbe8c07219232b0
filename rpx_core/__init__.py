"""rpx: a declarative, plugin-based model-efficiency profiler.

The notebook API: ``load_spec``, ``run_spec``, ``run``, ``profile``, ``load_results``. Nothing here imports torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

from rpx_core.api import load_results, load_spec, profile, run, run_spec  # noqa: E402
from rpx_core.hookspecs import hookimpl  # noqa: E402

__all__ = ["__version__", "hookimpl", "load_spec", "run_spec", "run", "profile", "load_results"]
