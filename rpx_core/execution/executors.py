"""Executors: which of a run's jobs run where and when (processes on this machine, nodes of a cluster), as plugins.

A plugin returns :class:`Executor` objects from ``rpx_register_executors``; ``[execution] executor`` (or
``rpx run --executor``) picks one by name. The pipeline hands the chosen executor every job of the run as a
:class:`WorkItem` at once; the executor decides the order and the place, and reports each job's events through the
item's ``report`` (from any thread: the pipeline serialises the calls and writes the results file as rpx_core.results.writer says).
Whatever goes wrong, every stage of every item must end up reported (failed with the reason, if nothing else), or the
job is left unfinished and ``rpx run --resume`` runs it again.

:class:`Environment` gives an executor what it needs to run a job: on this machine through rpx's own worker
processes (:meth:`Environment.run_here`), or elsewhere with :func:`run_task_elsewhere` on the far side and
:func:`rpx_core.execution.stage_loop.failed_records` for a job that could not run at all.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import attrs


@attrs.frozen
class Resources:
    """What one job needs from the machine that runs it."""

    cpus: float = 1.0
    gpus: float = 0.0  # a measured stage on a GPU backend takes a whole GPU
    accelerator: str | None = None  # the GPU model the job targets (a sweep's machine), None for any


@attrs.frozen
class WorkItem:
    """One job of a run, as an executor receives it."""

    name: str  # the job's name in the results file
    task: Any  # rpx_core.execution.tasks.Task, pure data: send it anywhere and run it with rpx_core.execution.stage_loop.execute
    measured: bool  # a stage times the machine: run it alone (rpx_core.registry.stages.Stage.measures)
    resources: Resources
    report: Callable[[Any], None]  # call with the task's events, in order: Placed (where it runs, optional), Started, Finished


@attrs.frozen
class Environment:
    """What the run gives its executor: the limits, the executor's structured options, and a way to run here."""

    setup: Any  # rpx_core.execution.tasks.Setup: the plugin set, environment, import path and folder of this run (None: in-process)
    limits: Any  # rpx_core.spec.limits.Execution
    options: Any  # the executor's options object (its ``options`` class), or None
    runner: Any  # runs one task on this machine: rpx_core.execution.runners.WorkerRunner or InProcessRunner

    @property
    def in_process(self) -> bool:
        """Jobs run in rpx's own process (debugging, live objects): one at a time, in the main thread."""
        return self.setup is None

    def run_here(self, item: WorkItem) -> None:
        """Run ``item`` on this machine, contained and time-limited as every local job is."""
        self.runner.run(item.task, item.report)

    def interrupt_here(self, signum: int = signal.SIGINT) -> None:
        """Interrupt every job running on this machine (each records its running stage as interrupted)."""
        interrupt = getattr(self.runner, "interrupt", None)
        if interrupt is not None:
            interrupt(signum)


class Executor:
    """A registration object: subclass it, set ``name`` and ``description``, implement :meth:`run`.

    ``options`` is an attrs class for the spec's ``[execution.executor_options]`` table (checked with key paths like
    stage options), or None when the executor takes none; ``requires`` and ``install`` name the library it needs."""

    name: str = ""
    description: str = ""
    options: type | None = None
    #: Top-level modules ``run`` imports (a cluster library): ``rpx validate`` finds them without importing them and
    #: names ``execution.executor`` with ``install`` when one is missing.
    requires: tuple[str, ...] = ()
    install: str = ""

    def run(self, items: Sequence[WorkItem], env: Environment) -> None:
        """Run every item, reporting each one's events through ``item.report``; return when all are reported.

        On SIGINT/SIGTERM (KeyboardInterrupt or rpx_core.execution.interrupts.Interrupted in the main thread) stop the jobs,
        let them report, and re-raise."""
        raise NotImplementedError

    def problems(self, jobs: Sequence[Any], options: Any) -> list[str]:
        """What makes the run impossible on this executor, found before anything runs (``key.path: problem`` lines);
        e.g. a job (:class:`rpx_core.execution.context.Job`) that targets a machine this executor cannot reach."""
        return []


def run_task_elsewhere(setup: Any, limits: Any, task: Any, preload: tuple[str, ...] = ()) -> list[Any]:
    """Run ``task`` in this process, on a machine or in a process other than rpx's (a cluster's worker), and return
    its events for the executor to hand to ``WorkItem.report`` back in rpx's process.

    The run's import path is extended with its folders that exist here, ``RPX_*`` variables are set as in the run,
    the framework (``preload``, the backend's ``worker_preload``) is imported before the first stage so its import
    is not counted in that stage's seconds, and the run's plugin set is loaded and checked to be the same. Time
    limits are those of in-process runs (SIGALRM, main thread only)."""
    import importlib
    import sys

    from rpx_core.execution.runners import InProcessRunner
    from rpx_core.execution.worker import load_plugins

    for path in setup.sys_path:
        if path not in sys.path and os.path.isdir(path):
            sys.path.append(path)
    os.environ.update({key: value for key, value in setup.environ.items() if key.startswith("RPX_")})
    if os.path.isdir(setup.cwd):
        os.chdir(setup.cwd)
    for module in preload:
        importlib.import_module(module)
    plugins = load_plugins(setup)
    events: list[Any] = []
    InProcessRunner(plugins, limits).run(task, events.append)
    return events


def job_lines(plan: Any, plugins: Any) -> list[str]:
    """What ``rpx run --dry-run`` prints: the executor, then one line per job with its stages and how it runs."""
    registry = plugins.stages(plan.spec.choose)
    executor = plan.spec.execution.executor
    lines = [f"{len(plan.jobs)} job(s) on executor {executor!r}; stages: {', '.join(plan.stages)}"]
    width = max(len(job.name) for job in plan.jobs)
    for job in plan.jobs:
        measured = [name for name in job.stages if registry[name].measures]
        how = f"alone (measures: {', '.join(measured)})" if measured else "side by side"
        failed = plan.failed_models.get(job.coordinates.get("model", job.name))
        if failed is not None:
            how = f"not run, failed: {failed.error}"
        where = f", on {job.machine}" if job.machine else ""
        lines.append(f"  {job.name:<{width}}  {job.backend}/{job.device} {job.precision}  {how}{where}")
    if plan.run_stages:
        lines.append(f"then once over every job: {', '.join(plan.run_stages)}")
    return lines


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)

