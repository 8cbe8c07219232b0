"""What travels between rpx's process and wherever a job runs: the task (pure data, picklable) and the events that
come back (:class:`Started`, :class:`Finished`, :class:`Placed`, progress). Executors and runners pass these along;
the stage loop (:mod:`rpx_core.execution.stage_loop`) turns a task into events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ContextManager, Literal

import attrs

from rpx_core.execution.context import Job
from rpx_core.execution.progress import Progress
from rpx_core.results.records import StageRecord
from rpx_core.spec.schema import ModelSpec


@attrs.frozen
class Setup:
    """What a worker needs to rebuild the parent's world: the plugin set, the environment, the import path, the folder."""

    disabled: tuple[str, ...]  # plugins disabled in the parent
    plugins: tuple[tuple[str, str, str], ...]  # (name, distribution, version) of every loaded plugin, checked
    environ: dict[str, str]
    sys_path: tuple[str, ...]
    cwd: str


@attrs.frozen
class Task:
    """One unit of work: the stages of one model job (``scope="model"``, one job), or one run-scoped stage over the
    pipeline's jobs (``scope="run"``). ``kept`` holds, per job, records already known (stages done before a resume,
    or every stage of the model for a run-scoped stage); ``previous`` an interrupted attempt's partial result."""

    scope: Literal["model", "run"]
    jobs: tuple[Job, ...]
    stages: tuple[str, ...]
    kept: tuple[dict[str, StageRecord], ...]
    choose: Any  # rpx_core.spec.schema.Choices
    gpu_catalog: Any  # rpx_core.registry.gpus.GPUCatalog
    options: Any = None  # the run-scoped stage's options
    previous: Any = None
    #: A stage times the machine: the task gets a fresh worker process of its own (others may share one in turn).
    measured: bool = False

    @property
    def label(self) -> str:
        return self.jobs[0].model.name if self.scope == "model" else "<run>"


#: The step a :class:`BackendProbe` reports, as a task reports its stages.
PROBE = "backend inference"


@attrs.frozen
class BackendProbe:
    """Build a spec's first model where tasks run (a worker process) to see which backend runs it, for a spec that
    names none: rpx's own process never imports or calls a model's code. Runners run it as a one-stage task (the
    same time limits, the same records of a crash, an exit or a hang); the :data:`PROBE` record's result is the
    backend's name, or None to keep the default (the model is of no framework an adapter recognises, or building
    it raised: its job then reports that error in its own stage)."""

    model: ModelSpec  # its import path absolute (rpx_core.spec.plan.resolve_paths)
    choose: Any  # rpx_core.spec.schema.Choices
    scope: Literal["model"] = "model"  # bounded by job_timeout as well as stage_timeout
    stages: tuple[str, ...] = (PROBE,)
    measured: bool = False


@attrs.frozen
class Started:
    stage: str


@attrs.frozen
class Finished:
    stage: str
    record: StageRecord


@attrs.frozen
class Placed:
    """Where a job runs (a cluster executor's node), reported before its first stage and recorded with the job."""

    node: str


Report = Callable[[Started | Finished | Progress | Placed], None]


#: Wraps each stage: ``guard(stage)`` -> a context manager that enforces its time limit (in-process executors).
Guard = Callable[[str], ContextManager[Any]]


class StageTimeout(BaseException):
    """Raised into an in-process stage when its time limit passes (a BaseException: user code's ``except Exception``
    must not swallow it)."""
