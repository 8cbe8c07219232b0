"""The ``local`` executor (the default): every job on this machine, hardware-agnostic ones side by side.

Jobs whose stages only count and compute bounds (Tier 1/2) do not disturb each other, so they run in parallel
worker processes, up to the usable cores (``[execution.executor_options] workers``). A job with a measured stage
(latency, batch search) runs afterwards, alone, so that nothing else competes for the machine while it is timed.
In-process runs (debuggers, live objects) run one job at a time in the main thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

import attrs

from rpx_core.plugin import Environment, Executor, Interrupted, WorkItem, hookimpl, signal_of, usable_cores


def _positive(_: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1: {value}")


@attrs.frozen
class LocalOptions:
    """``[execution.executor_options]`` of the local executor."""

    #: Hardware-agnostic jobs run at once; default: the cores this process may use.
    workers: int | None = attrs.field(default=None, validator=_positive)


class LocalExecutor(Executor):
    name = "local"
    description = "this machine: Tier 1/2 jobs in parallel worker processes, measured jobs one at a time"
    options = LocalOptions

    def problems(self, jobs: Sequence[Any], options: Any) -> list[str]:
        targeted = sorted({job.machine for job in jobs if job.machine is not None})
        if targeted:
            return [f"sweep.machine: the local executor runs every job on this machine, so it cannot place jobs on "
                    f"{', '.join(targeted)}; use a cluster executor (execution.executor = \"ray\")"]
        return []

    def run(self, items: Sequence[WorkItem], env: Environment) -> None:
        workers = (env.options.workers if env.options is not None else None) or usable_cores()
        parallel = [item for item in items if not item.measured]
        alone = [item for item in items if item.measured]
        if env.in_process or workers == 1 or len(parallel) < 2:
            alone = list(items)
            parallel = []
        run_side_by_side(parallel, env, workers)
        for item in alone:
            env.run_here(item)


def run_side_by_side(items: Sequence[WorkItem], env: Environment, workers: int) -> None:
    """Run ``items`` on up to ``workers`` threads, each following one worker process; on an interruption every
    running worker is asked to stop and report, jobs not yet started are dropped, and the interruption re-raised."""
    if not items:
        return
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="rpx-job")
    stop = threading.Event()

    def run(item: WorkItem) -> None:
        if not stop.is_set():
            env.run_here(item)

    try:
        futures = [pool.submit(run, item) for item in items]
        for future in concurrent.futures.as_completed(futures):
            future.result()
    except BaseException as exc:  # the jobs not started yet are dropped, the running ones stopped, whatever ended it
        stop.set()
        if isinstance(exc, KeyboardInterrupt):
            env.interrupt_here(signal_of(exc))
        pool.shutdown(wait=True, cancel_futures=True)
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted(signal_of(exc)) from None
        raise
    pool.shutdown(wait=True)


@hookimpl
def rpx_register_executors() -> list[Executor]:
    return [LocalExecutor()]
