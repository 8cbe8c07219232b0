"""Every hook an rpx plugin can implement, in one place.

Two kinds of hooks:

* **Registration hooks** (``rpx_register_*``) are called once at start-up on every plugin; each returns a list of
  registration objects. Names must be unique across plugins: a clash is an error naming both providers unless the spec's
  ``[choose]`` table picks one.
* **Stage hooks** (one per built-in stage) receive a :class:`rpx_core.context.StageContext` and *stop at the first
  non-None result*. A plugin that only handles some backends returns None for the others (check ``ctx.backend.name``);
  the built-in implementations are registered ``trylast``, so any installed plugin is asked first.

Example plugin module (registered through the entry-point group ``rpx``)::

    from rpx_core import hookimpl

    @hookimpl
    def rpx_count_flops(ctx):
        if ctx.backend.name != "my-npu":
            return None          # let the built-in count for every other backend
        return my_npu_flops(ctx)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

PROJECT = "rpx"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

if TYPE_CHECKING:
    from rpx_core.backends import Backend
    from rpx_core.context import RunContext, StageContext
    from rpx_core.stages import StageDef


# -- registration hooks ------------------------------------------------------------------------------------------------


@hookspec
def rpx_register_backends() -> list[Backend]:
    """Return the backends this plugin provides (instances of :class:`rpx_core.backends.Backend`).

    Called on every plugin; results are collected. Example: ``return [MyNpuBackend()]``.
    """


@hookspec
def rpx_register_gpu_packs() -> list[Path]:
    """Return paths of GPU spec pack TOML files this plugin ships (see ``rpx_plugins/packs/reference.toml``).

    Called on every plugin; results are collected. Example:
    ``return [Path(__file__).with_name("my_gpus.toml")]``.
    """


@hookspec
def rpx_register_stages() -> list[StageDef]:
    """Return new stages (:class:`rpx_core.stages.StageDef`): name, what they need, options class, run function.

    Called on every plugin; results are collected. A plugin stage's ``run(ctx)`` returns an attrs object or a plain
    TOML-able dict. Example: ``return [StageDef("energy", run=estimate_energy, needs=("count_flops",))]``.
    """


# -- stage hooks (first non-None result wins) --------------------------------------------------------------------------
#
# Each receives ``ctx`` (rpx_core.context.StageContext): ``ctx.job`` (the model spec, backend, device, precision,
# batch sizes and every stage's options, as data), ``ctx.backend`` (the Backend object), ``ctx.model()`` and
# ``ctx.inputs(batch_size)`` (built once per job, on the job's device), ``ctx.results`` (results of stages that already
# ran for this model) and ``ctx.gpu_catalog``. Each is called plugin by plugin, third-party first and built-ins last,
# and stops at the first result that is not None; the engine records which plugin produced it. The result must be
# the stage's result type (checked), so every consumer and the results file can rely on it.


@hookspec(firstresult=True)
def rpx_count_params(ctx: StageContext) -> Any:
    """Count parameters and buffers. Returns :class:`rpx_core.types.counts.ParamsResult`, or None to pass. First result wins.

    Example: ``if ctx.backend.framework != "mine": return None`` then
    ``return ParamsResult(total=..., trainable=..., non_trainable=..., buffers=..., bytes_at_precision=...,
    precision=ctx.job.precision)``.
    """


@hookspec(firstresult=True)
def rpx_count_flops(ctx: StageContext) -> Any:
    """Count FLOPs and MACs of one pass (``ctx.options("count_flops")``: backward, batch size, where to count).
    Returns :class:`rpx_core.types.counts.FlopsResult` (FLOPs = 2 x MACs for matrix work; ops without a formula listed in
    ``uncounted_ops``), or None to pass. First result wins.

    Example: a backend whose compiler reports costs returns ``FlopsResult(...)`` from that report for its own
    backend name and None otherwise.
    """


@hookspec(firstresult=True)
def rpx_estimate_traffic(ctx: StageContext) -> Any:
    """Estimate bytes moved (unfused and fused bounds) and peak activation memory. Returns
    :class:`rpx_core.types.counts.TrafficResult` with its ``assumptions`` stated, or None to pass. First result wins.

    Example: reuse the counting pass of ``rpx_count_flops`` through ``ctx.cache`` instead of running the model twice.
    """


@hookspec(firstresult=True)
def rpx_roofline(ctx: StageContext) -> Any:
    """Lower-bound latency per GPU and precision from ``ctx.results["count_flops"]``/``["estimate_traffic"]`` and
    ``ctx.gpu_catalog``. Returns :class:`rpx_core.types.roofline.RooflineResult`, or None to pass. First result wins.

    Example: a plugin modelling a chip with a different memory hierarchy returns its own bounds for that chip's
    backend and None otherwise.
    """


@hookspec(firstresult=True)
def rpx_system_card(ctx: StageContext) -> Any:
    """Describe the machine and the run settings. Returns :class:`rpx_core.types.system_card.SystemCard`, or None to pass.
    First result wins.

    Example: a plugin for an embedded board whose CPU name is not in /proc/cpuinfo returns
    ``attrs.evolve(machine_card(), host_processor_model_name=board_cpu_name())``.
    """


@hookspec(firstresult=True)
def rpx_measure_latency(ctx: StageContext) -> Any:
    """Measure latency percentiles at batch 1, throughput per batch size and peak memory of the measured region.
    Returns :class:`rpx_core.types.latency.LatencyResult`, or None to pass. First result wins.

    Example: a remote-device plugin times calls on the device itself and returns the samples' statistics, built with
    :mod:`rpx_core.stats` so percentiles follow the same method and sufficiency rules.
    """


@hookspec(firstresult=True)
def rpx_batch_search(ctx: RunContext) -> Any:
    """Search batch sizes for a pipeline of models under a memory budget. Receives a
    :class:`rpx_core.context.RunContext` (one StageContext per model, the options, the backend). Returns
    :class:`rpx_core.types.batch_search.BatchSearchResult`, or None to pass. First result wins.

    Example: a plugin that runs each trial in a fresh subprocess returns the same result type from its own runner.
    """
