"""What a command reads, listed without running or importing anything: the files nothing rpx writes may land on.

Every command that writes a file checks its target against these with
:func:`rpx_core.results.safe_write.check_output` before it writes anything, ``--force`` or not:

* the spec, and each model's code: a ``file.py``, or a module named by import path together with the ``__init__`` of
  each package above it (found as ``import`` finds them, never executed), input factories alike, and a named model's
  local file or folder (``hf:./my-model``: everything in it);
* GPU packs from every source: the spec's ``gpu_packs``, ``RPX_GPU_PACKS``, and the packs plugins ship;
* the code of rpx and of every loaded plugin (a plugin module's file, or its top-level package's folder).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rpx_core.registry.manager import GPU_PACKS_ENV
from rpx_core.registry.sources import split
from rpx_core.results.safe_write import Input


def spec_inputs(spec: Any, plugins: Any, spec_path: str | Path | None = None) -> list[Input]:
    """Everything a run of ``spec`` reads (its spec file too, when it was read from one)."""
    schemes = plugins.model_sources(spec.choose)
    found = [Input(Path(spec_path), "the spec")] if spec_path else []
    for index, model in enumerate(spec.models):
        for key in ("source", "input_factory"):
            found += source_inputs(getattr(model, key), f"models[{index}].{key}", spec.base_dir, schemes)
    found += [Input(Path(spec.base_dir) / pack, f"gpu_packs[{index}]") for index, pack in enumerate(spec.gpu_packs)]
    return found + installed_inputs(plugins)


def installed_inputs(plugins: Any) -> list[Input]:
    """What every command reads whatever it is given: rpx's code, the plugins' code and packs, ``RPX_GPU_PACKS``."""
    import rpx_core

    found = [Input(Path(rpx_core.__file__).parent, "rpx's own code")]
    found += [Input(path, role) for path, role in plugins.files()]
    found += [Input(Path(path), f"a GPU pack named in {GPU_PACKS_ENV}")
              for path in os.environ.get(GPU_PACKS_ENV, "").split(os.pathsep) if path]
    return found


def source_inputs(source: str | None, role: str, base_dir: str | Path, schemes: Iterable[str]) -> list[Input]:
    """The files a model ``source`` (or an input factory) names: ``file.py:f``, ``pkg.mod:f`` (the module and the
    packages above it), or a named model whose target is a local path (``hf:./folder``)."""
    if not source or ":" not in source or source.startswith("<object>"):
        return []
    named = split(source, schemes)
    if named is not None:
        target = named[1]
        path = Path(base_dir) / target if target.startswith(("./", "../")) else Path(target)
        return [Input(path, role)] if target and path.exists() else []
    module = source.rpartition(":")[0]
    if module.endswith(".py"):
        return [Input(Path(module) if Path(module).is_absolute() else Path(base_dir) / module, role)]
    try:
        origins = module_origins(module)
    except (ImportError, ValueError):  # not found: `validate` says so
        return []
    return [Input(Path(origin), role) for origin in origins if origin and os.path.isfile(origin)]


def module_origins(name: str) -> list[str | None]:
    """The files ``a``, ``a.b``, ``a.b.c`` would be imported from, for ``name`` = ``a.b.c`` (a package's
    ``__init__``, None for a namespace package), found without executing anything; ModuleNotFoundError naming the
    first part that is missing."""
    origins: list[str | None] = []
    search: list[str] | None = None
    parts = name.split(".")
    for depth in range(len(parts)):
        partial = ".".join(parts[: depth + 1])
        loaded = sys.modules.get(partial)
        if loaded is not None:
            origins.append(getattr(loaded, "__file__", None))
            search = list(getattr(loaded, "__path__", None) or [])
            continue
        # The top level through every finder (an editable install's finder too); below it, the package's folders.
        spec = importlib.util.find_spec(partial) if depth == 0 else importlib.machinery.PathFinder.find_spec(partial, search)
        if spec is None:
            raise ModuleNotFoundError(f"no module {partial!r}", name=partial)
        origins.append(spec.origin)
        search = list(spec.submodule_search_locations or [])
    return origins
