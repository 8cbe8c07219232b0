"""Whether each backend can run here, for ``rpx backends``, without importing every framework into rpx's process.

A backend's ``probe()`` may import its framework to ask for devices (JAX initialises its runtime; a CUDA build of
torch asks the driver), which costs seconds and is what a run pays anyway. A listing should not: the probes run in
one short-lived process (``python -m rpx_core.registry.availability``), and their answers are kept in a cache file
(``$RPX_CACHE_DIR``, else ``$XDG_CACHE_HOME/rpx``, else ``~/.cache/rpx``) for at most :data:`FRESH_SECONDS`, and only
while nothing they depend on has changed: the Python, the plugin set, the backends and who registers them, the
installed packages (the import path's folders but the working directory), the probes' own code, the GPU driver and device files, the variables that select devices,
and the boot. The reasons are the probes' own, word for word. ``rpx backends --refresh`` probes now; a run never
reads the cache (it probes the backend it uses, in its own process).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: How long answers are reused when nothing they depend on has changed.
FRESH_SECONDS = 600.0
#: Variables that change which devices a framework sees.
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "JAX_PLATFORMS",
                    "JAX_PLATFORM_NAME", "XLA_FLAGS", "TPU_VISIBLE_CHIPS", "NVIDIA_VISIBLE_DEVICES", "PATH",
                    "LD_LIBRARY_PATH")
#: Files whose change means the devices may have changed (driver version, device nodes, the boot).
DEVICE_FILES = ("/proc/driver/nvidia/version", "/proc/sys/kernel/random/boot_id", "/dev/nvidia*", "/dev/dri/*",
                "/dev/kfd", "/dev/accel*", "/dev/vfio/*")


def listed_availability(plugins: Any, registry: Any, *, refresh: bool = False) -> tuple[dict[str, Any], float]:
    """Each backend of ``registry`` -> its ``Availability``, and how many seconds ago it was probed (0: now)."""
    from rpx_core.registry.backends import Availability

    names = sorted(registry.unambiguous())
    key = fingerprint(plugins, registry, names)
    cached = None if refresh else _read(key)
    if cached is not None:
        found, probed_at = cached
        return {name: Availability(*found[name]) for name in names}, max(0.0, time.time() - probed_at)
    found = _probe_elsewhere(plugins) or {name: _as_pair(registry[name].availability) for name in names}
    if set(found) >= set(names):
        _write(key, found)
    return {name: Availability(*found[name]) if name in found else registry[name].availability
            for name in names}, 0.0


def fingerprint(plugins: Any, registry: Any, names: list[str]) -> str:
    """Everything a probe's answer depends on, as one digest (see the module's docstring)."""
    from rpx_core.version import __version__

    facts = {
        "python": [sys.executable, sys.version],
        "rpx": __version__,
        "plugins": [[info.name, info.distribution, info.version, info.status] for info in plugins.infos()],
        "backends": [[name, registry.provider(name), type(registry[name]).__qualname__,
                      _mtime(sys.modules[type(registry[name]).__module__].__file__ or "")] for name in names],
        "packages": [[path, _mtime(path)] for path in sys.path if path and path != os.getcwd() and os.path.isdir(path)],
        "variables": {name: os.environ.get(name) for name in DEVICE_VARIABLES},
        "devices": {path: _mtime(path) for pattern in DEVICE_FILES for path in sorted(glob.glob(pattern))},
        "boot": _text("/proc/sys/kernel/random/boot_id"),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def cache_file() -> Path:
    base = os.environ.get("RPX_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rpx"
    return Path(base) / "backends.json"


def _read(key: str) -> tuple[dict[str, list[Any]], float] | None:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
        probed_at = float(data["probed_at"])
        found = {name: [bool(pair[0]), str(pair[1])] for name, pair in data["backends"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if data.get("key") != key or not 0 <= time.time() - probed_at <= FRESH_SECONDS:
        return None
    return found, probed_at


def _write(key: str, found: dict[str, list[Any]]) -> None:
    """Replace the cache atomically (a unique temporary file beside it, renamed over it); a cache that cannot be
    written only costs the next listing its speed."""
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".backends-", suffix=".json", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"key": key, "probed_at": time.time(), "backends": found}, out)
        os.replace(temporary, path)
    except OSError:
        return


def _probe_elsewhere(plugins: Any) -> dict[str, list[Any]] | None:
    """Every backend's probe, run in a short-lived process with the same plugin set; None when it fails (the
    caller then probes here)."""
    disabled = ",".join(info.name for info in plugins.infos() if info.status == "disabled")
    env = {**os.environ, "RPX_DISABLE_PLUGINS": disabled}
    try:
        done = subprocess.run([sys.executable, "-m", "rpx_core.registry.availability"], capture_output=True,
                              text=True, env=env, timeout=300)
        found = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return found if isinstance(found, dict) else None


def _as_pair(availability: Any) -> list[Any]:
    return [availability.available, availability.reason]


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def main() -> None:
    """The probing process: load the plugins as rpx does and print each backend's answer as JSON."""
    import warnings

    from rpx_core.registry.manager import Plugins

    warnings.simplefilter("ignore")  # rpx's own process already warned about the plugin set
    registry = Plugins.load(tolerant=True).backends()
    print(json.dumps({name: _as_pair(backend.availability) for name, backend in registry.unambiguous().items()}))


if __name__ == "__main__":
    main()
