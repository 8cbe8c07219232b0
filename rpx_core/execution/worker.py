"""The worker process side: a forked worker serves tasks from rpx's process, one at a time, in the parent's
environment, import path and folder, with the parent's plugin set; between tasks it restores the process-wide state
a model may change (torch's default dtype and grad mode, the global random generators), so which tasks share a
worker cannot change a figure."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any

from rpx_core.execution.interrupts import Interrupted
from rpx_core.execution.stage_loop import execute
from rpx_core.execution.tasks import Setup

#: Plugin sets the zygote loaded before forking, by the disabled plugins they were loaded without: a worker whose run
#: has the same set uses its inherited copy instead of loading plugins again (tens of milliseconds per job).
_LOADED: dict[tuple[str, ...], Any] = {}


def _load(disabled: tuple[str, ...]) -> Any:
    import warnings

    from rpx_core.registry.manager import PluginLoadWarning, Plugins

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginLoadWarning)  # the parent already warned once
        return Plugins.load(disabled)


def load_plugins(setup: Setup) -> Any:
    """The parent's plugin set, loaded here (or inherited from the zygote when it is the same set); a different set
    (a plugin installed meanwhile) is an error."""
    from rpx_core.errors import PluginError

    inherited = _LOADED.get(setup.disabled)
    if inherited is not None and plugin_identity(inherited) == setup.plugins:
        return inherited
    plugins = _load(setup.disabled)
    found = plugin_identity(plugins)
    if found != setup.plugins:
        raise PluginError(f"the worker process found plugins {_names(found)}, the run has {_names(setup.plugins)}")
    return plugins


def plugin_identity(plugins: Any) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((info.name, info.distribution, info.version) for info in plugins.infos() if info.status == "loaded"))


def _names(identity: tuple[tuple[str, str, str], ...]) -> str:
    return ", ".join(f"{name} ({dist} {version})" for name, dist, version in identity) or "none"


def serve_jobs(connection: Any) -> None:
    """A forked worker: serve tasks until the parent sends ``None`` or goes away. Each task comes as its setup, then
    the task; the worker runs it, sends each event, then a final ``None``. The parent sends a second task only to a
    worker whose first ended cleanly and measured nothing (see rpx_core.execution.runners.WorkerRunner)."""
    import faulthandler

    faulthandler.enable()  # a segfault in user code leaves the Python stack in the stderr tail
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupted)
    defaults = _global_modes()
    while True:
        try:
            setup = connection.recv()  # first, so the task's classes (a plugin's options) import from its path
        except EOFError:
            return
        if setup is None:
            return
        _restore_global_modes(defaults)
        serve_job(connection, setup)


def serve_job(connection: Any, setup: Setup) -> None:
    """One task in this worker, in the parent's environment, import path and folder."""
    os.environ.clear()
    os.environ.update(setup.environ)
    sys.path[:] = list(setup.sys_path)
    os.chdir(setup.cwd)
    try:
        task = connection.recv()
        plugins = load_plugins(setup)
        execute(task, plugins, connection.send)
    except Interrupted:
        pass  # the interrupted stage was reported
    except Exception as exc:  # the worker could not even start the task: the parent records it on the stage
        connection.send(("error", f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))))
    connection.send(None)


def _global_modes() -> dict[str, Any]:
    """Process-wide state a model's code may change, as the worker started: torch's default dtype and grad mode,
    and the global random generators (torch's CPU one, Python's, numpy's if imported), which weights and inputs are
    drawn from: a job in a reused worker draws what it would in a fresh one."""
    import random

    modes: dict[str, Any] = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        modes["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        modes.update(dtype=torch.get_default_dtype(), grad=torch.is_grad_enabled(), rng=torch.get_rng_state())
    return modes


def _restore_global_modes(modes: dict[str, Any]) -> None:
    """Before a worker's next task: the process-wide state of :func:`_global_modes` as it was when it started."""
    import random

    random.setstate(modes["random"])
    if "numpy" in modes:
        sys.modules["numpy"].random.set_state(modes["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None and "rng" in modes:
        torch.set_default_dtype(modes["dtype"])
        torch.set_grad_enabled(modes["grad"])
        torch.set_rng_state(modes["rng"])


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)
