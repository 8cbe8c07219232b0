"""The installed torch build, read from torch's own ``version.py`` without importing torch (which takes seconds).

Enough for the backends' probes to say exactly what importing torch would say about a build that cannot run them
(a CPU-only build has no CUDA; only macOS builds have MPS), so ``rpx backends`` imports torch only where a device
must be asked about.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path

import attrs


@attrs.frozen
class TorchBuild:
    version: str  # torch.__version__, e.g. "2.13.0+cpu"
    cuda: str | None  # torch.version.cuda: the CUDA it was built with, None for other builds


def torch_build() -> TorchBuild | None:
    """The installed build when torch is not imported yet; None when it is (then torch itself is asked: it is paid
    for, and it is what a run uses), when it is not installed, or when its version file cannot be read."""
    if "torch" in sys.modules:
        return None
    return _read_version_file()


@functools.cache
def _read_version_file() -> TorchBuild | None:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    version, cuda = values.get("__version__"), values.get("cuda")
    if not isinstance(version, str) or not (cuda is None or isinstance(cuda, str)) or "cuda" not in values:
        return None
    return TorchBuild(version, cuda)
