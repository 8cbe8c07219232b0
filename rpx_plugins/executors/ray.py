"""The ``ray`` executor: every job a Ray task, on an existing cluster or on a Ray instance started for the run.

Install with ``pip install 'rpx[ray]'``; the cluster's nodes need rpx, the same plugins and the models' code (the
run's plugin set is checked on each node, as in a local worker). Each job asks for what it needs: one CPU for Tier 1/2,
a whole GPU for a measured stage on a GPU backend, and the node's accelerator type when the job targets a GPU model
(a sweep's ``machine``). Finished jobs come back as they complete and go into the one results file at once, with
the same atomic writes and resume as local runs; each job records the node it ran on (and, with the
``system_card`` stage, that node's description). A task that fails or whose worker or node is lost is retried
``retries`` times, then its job is recorded as failed and the rest of the run goes on. Measured jobs on CPU
backends run one at a time after the others, so nothing competes with them on their node.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

import attrs

from rpx_core.plugin import (
    Environment,
    Executor,
    Interrupted,
    Placed,
    RpxError,
    WorkItem,
    failed_records,
    hookimpl,
    run_task_elsewhere,
    signal_of,
)


def _non_negative(_: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"'{attribute.name}' must be >= 0: {value}")


@attrs.frozen
class RayOptions:
    """``[execution.executor_options]`` of the ray executor."""

    #: The cluster to join ("ray://head:10001", "auto"); default: ``RAY_ADDRESS``, else a local instance is started.
    address: str | None = None
    #: Times a failed or lost task is run again before its job is recorded as failed.
    retries: int = attrs.field(default=2, validator=_non_negative)
    #: CPUs of a local instance rpx starts (default: Ray's, every core); ignored when joining a cluster.
    num_cpus: int | None = attrs.field(default=None, validator=_non_negative)
    #: rpx GPU name -> Ray accelerator type, where Ray's name differs from the part before the first "-"
    #: (``"H100-SXM"`` -> ``"H100"`` by default).
    accelerator_types: dict[str, str] = attrs.Factory(dict)


def accelerator_type(gpu: str, names: dict[str, str]) -> str:
    """The Ray accelerator type a job targeting ``gpu`` asks for."""
    return names.get(gpu, gpu.split("-")[0])


def run_on_node(setup: Any, limits: Any, task: Any, preload: tuple[str, ...]) -> tuple[str, list[Any]]:
    """In a Ray worker: run the task's stages, return the node's name and every event."""
    return node_name(), run_task_elsewhere(setup, limits, task, preload)


def node_name() -> str:
    """This node as a results file names it: host name and Ray's address for it."""
    import ray

    return f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"


class RayExecutor(Executor):
    name = "ray"
    description = "a Ray cluster (RAY_ADDRESS or execution.executor_options.address), or a local Ray instance"
    options = RayOptions
    requires = ("ray",)
    install = "pip install 'rpx[ray]'"

    def run(self, items: Sequence[WorkItem], env: Environment) -> None:
        if env.in_process:
            raise RpxError('the ray executor runs jobs on Ray workers, not in rpx\'s process: drop isolation '
                           '"in-process" (live model objects cannot go to a cluster)')
        ray = import_ray()
        options = env.options or RayOptions()
        started = not ray.is_initialized()
        if started:
            address = options.address or os.environ.get("RAY_ADDRESS")
            ray.init(address=address, num_cpus=None if address else options.num_cpus, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        try:
            remote = ray.remote(run_on_node)
            side_by_side = [item for item in items if not (item.measured and item.resources.gpus == 0)]
            alone = [item for item in items if item not in side_by_side]
            submit = self._submitter(ray, remote, env, options)
            self._follow(ray, [submit(item) for item in side_by_side], options)
            for item in alone:
                self._follow(ray, [submit(item)], options)
        finally:
            if started:
                ray.shutdown()

    @staticmethod
    def _submitter(ray: Any, remote: Any, env: Environment, options: RayOptions) -> Any:
        def submit(item: WorkItem) -> tuple[Any, WorkItem]:
            resources = item.resources
            settings: dict[str, Any] = {"num_cpus": resources.cpus, "num_gpus": resources.gpus,
                                        "max_retries": options.retries, "retry_exceptions": True}
            if resources.accelerator is not None:
                settings["accelerator_type"] = accelerator_type(resources.accelerator, options.accelerator_types)
            preload = getattr(env.runner, "preload", ())
            return remote.options(**settings).remote(env.setup, env.limits, item.task, preload), item

        return submit

    @staticmethod
    def _follow(ray: Any, submitted: list[tuple[Any, WorkItem]], options: RayOptions) -> None:
        """Report each task's events as soon as it completes; a task that failed every try fails its job."""
        items = dict(submitted)
        pending = list(items)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                item = items[done[0]]
                try:
                    node, events = ray.get(done[0])
                except Exception as exc:  # RayTaskError, WorkerCrashedError, NodeDiedError, ...
                    tries = options.retries + 1
                    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    error = f"ray task failed {tries} time(s) ({type(exc).__name__}: {message})"
                    events = failed_records(item.task.stages, error)
                else:
                    item.report(Placed(node))
                for event in events:
                    item.report(event)
        except KeyboardInterrupt as interrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise Interrupted(signal_of(interrupt)) from None


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RpxError("the ray executor needs Ray: pip install 'rpx[ray]'") from None
    return ray


@hookimpl
def rpx_register_executors() -> list[Executor]:
    return [RayExecutor()]
