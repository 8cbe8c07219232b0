"""What a stage receives: the job (pure data) plus lazily built live objects (model, inputs) and earlier results.

A :class:`Job` holds only data, so a future executor can send it to a worker process and rebuild the context there.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

import attrs

from rpx_core.errors import UnsupportedError
from rpx_core.execution.progress import ProgressReporter
from rpx_core.precision import Precision, get_precision
from rpx_core.spec.schema import ModelSpec

if TYPE_CHECKING:
    from rpx_core.registry.backends import Backend
    from rpx_core.registry.gpus import GPUCatalog
    from rpx_core.registry.manager import Plugins


@attrs.frozen
class Job:
    """One model's work: which model, where, at which precision, which stages in which order, with which options."""

    model: ModelSpec
    backend: str
    device: str
    precision: str
    stages: tuple[str, ...]  # dependency-ordered
    options: dict[str, Any]  # stage name -> structured options object
    gpus: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    #: Where this job sits in a sweep: "model" and each swept axis (batch_size, seq_len, resolution, precision,
    #: backend, machine) -> its value; empty outside a sweep (rpx_core.spec.sweep).
    coordinates: dict[str, Any] = attrs.Factory(dict)
    machine: str | None = None  # the GPU model measured stages must run on (a sweep's machine axis); None: any

    @property
    def name(self) -> str:
        """The job's name in results: its model's name, with the sweep coordinates for a point of a sweep."""
        return self.model.name


@attrs.define
class StageContext:
    """Everything a stage implementation may use. Live objects are built on first use and shared by later stages."""

    job: Job
    backend: Backend
    plugins: Plugins  # to call other hooks (built-in stages run their hook through it)
    gpu_catalog: GPUCatalog  # every GPU of every pack the run loaded
    results: dict[str, Any] = attrs.Factory(dict)  # results of stages that already ran for this model, by name
    #: Scratch space shared by the stages of one job (e.g. one counting pass feeding both count_flops and
    #: estimate_traffic). Not written to results.
    cache: dict[str, Any] = attrs.Factory(dict)
    model_object: Any = None  # a live model given through the Python API instead of an import path
    #: Seconds spent importing, building and placing the model, by phase (see :meth:`setup_phase`); the stage
    #: runner subtracts them from the stage's seconds and records them apart.
    setup: dict[str, float] = attrs.Factory(dict)
    #: Where ``progress`` sends its events (set by the loop running the stages; a bare context drops them).
    reporter: ProgressReporter = attrs.Factory(ProgressReporter)

    def progress(self, phase: str, done: int, total: int | None = None) -> None:
        """Report ``done`` of ``total`` units of a long phase (None: end unknown); throttled, so a measuring loop
        may call it on every iteration it can afford a function call in (never inside a timed region)."""
        self.reporter(phase, done, total)


    @contextlib.contextmanager
    def setup_phase(self, phase: str) -> Iterator[None]:
        """Time the enclosed setup work as ``phase`` ("import", "build", "place", "inputs"), not as the stage's own."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.setup[phase] = self.setup.get(phase, 0.0) + time.perf_counter() - started
    choose: Any = None  # the spec's [choose] table (rpx_core.spec.schema.Choices), for a model source two plugins register

    @property
    def precision(self) -> Precision:
        """The job's precision as an object: element size and the dtype each framework executes it with."""
        return get_precision(self.job.precision)

    def options(self, stage: str) -> Any:
        """The structured options of ``stage`` (its declaration's options class), or None if it takes none."""
        return self.job.options.get(stage)

    def build_model(self) -> Any:
        """Call the model factory (unplaced, on whatever device the factory uses), or copy the given object so that
        placing it (dtype, device, eval mode) never changes the caller's model."""
        if self.model_object is not None:
            with self.setup_phase("build"):
                return self.adapt(copy.deepcopy(self.model_object))
        with self.setup_phase("import"):
            build = self.model_factory()
        with self.setup_phase("build"):
            return self.adapt(build())

    def model_factory(self) -> Callable[[], Any]:
        """A no-argument function building the job's model: through its model source for a named model
        (``hf:...``), else the import path called with the model's kwargs (rpx_core.registry.sources)."""
        from rpx_core.registry.sources import factory

        registry = self.plugins.model_sources(self.choose) if self.plugins is not None else None
        return factory(self.job.model, registry)

    def adapt(self, model: Any) -> Any:
        """The model as this backend runs it, through the registered model adapters (rpx_core.registry.adapters); a context
        built without plugins (a test's) passes it on as it is."""
        from rpx_core.registry.adapters import adapt_model

        if self.plugins is None:
            return model
        return adapt_model(model, self.plugins.model_adapters(), self.backend, f"model {self.job.model.name!r}")

    def model(self) -> Any:
        """The model placed on the job's device at the job's precision, built once per job."""
        if "model" not in self.cache:
            if self.job.model.meta_only:
                raise UnsupportedError(
                    f"model {self.job.model.name!r} is meta_only: it is never materialised, so it cannot be executed"
                )
            built = self.build_model()
            with self.setup_phase("place"):
                self.cache["model"] = self.backend.place_model(built, self.job.precision, self.job.device)
        return self.cache["model"]

    def inputs(self, batch_size: int | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword inputs at ``batch_size`` (None: the job's inputs as written), created on the device
        once per batch size."""
        key = f"inputs@{batch_size}"
        if key not in self.cache:
            self.cache[key] = self.fresh_inputs(batch_size)
        return self.cache[key]

    def fresh_inputs(self, batch_size: int | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Inputs at ``batch_size`` made anew and not kept (a throughput row's, dropped with it), timed as the
        "inputs" setup phase: making them is not the stage's own time."""
        with self.setup_phase("inputs"):
            return self.backend.make_inputs(self.job.model, batch_size, self.job.precision, self.job.device)

    def release(self) -> None:
        """Drop live objects (model, inputs) so the next job starts with the memory they held."""
        self.cache.clear()


@attrs.define
class RunContext:
    """What a run-scoped stage (e.g. batch_search over a pipeline of models) receives: one context per model."""

    models: list[StageContext]
    options: Any
    backend: Backend
    plugins: Plugins
    gpu_catalog: GPUCatalog
    #: The partial result of an interrupted earlier attempt at this stage (``rpx run --resume``), for a stage that
    #: can continue from it (batch_search keeps its finished trials); None otherwise.
    previous: Any = None
    reporter: ProgressReporter = attrs.Factory(ProgressReporter)  # see StageContext.progress

    def progress(self, phase: str, done: int, total: int | None = None) -> None:
        """As :meth:`StageContext.progress` (e.g. batch-search trials)."""
        self.reporter(phase, done, total)
