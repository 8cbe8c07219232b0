"""Turning a model spec's import path into a live object, with errors that name the model and the path."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from rpx_core.errors import RpxError

#: The name of a module rpx loads from a file (``path/to/file.py:attr``) starts so, then a hash of its path.
USER_MODULE_PREFIX = "rpx_user_"


def load_callable(source: str, *, what: str = "source") -> Callable[..., Any]:
    """Resolve ``package.module:attr`` or ``path/to/file.py:attr`` (the planner makes spec-relative paths absolute)."""
    module_part, _, attr_path = source.rpartition(":")
    if not module_part or not attr_path:
        raise RpxError(f"{what} {source!r}: expected 'package.module:callable' or 'path/to/file.py:callable'")
    module = _import_file(module_part, what) if module_part.endswith(".py") else _import_module(module_part, what)
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise RpxError(f"{what} {source!r}: {module.__name__} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise RpxError(f"{what} {source!r}: {attr_path!r} is not callable")
    return target


def _import_module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RpxError(f"{what} {name!r}: cannot import: {exc}") from exc


def _import_file(file_name: str, what: str) -> Any:
    path = Path(file_name).resolve()
    if not path.is_file():
        raise RpxError(f"{what} {file_name!r}: no such file {path}")
    module_name = USER_MODULE_PREFIX + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise RpxError(f"{what} {file_name!r}: importing it failed: {type(exc).__name__}: {exc}") from exc
    return module
