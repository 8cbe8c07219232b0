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


@hookspec(firstresult=True)
def rpx_count_params(ctx: StageContext) -> Any:
    """Count parameters and buffers; return :class:`rpx_core.tier1.ParamsResult`, or None to pass."""


@hookspec(firstresult=True)
def rpx_count_flops(ctx: StageContext) -> Any:
    """Count FLOPs and MACs of one forward (or forward+backward) pass; return :class:`rpx_core.tier1.FlopsResult`."""


@hookspec(firstresult=True)
def rpx_estimate_traffic(ctx: StageContext) -> Any:
    """Estimate bytes moved and activation memory; return :class:`rpx_core.tier1.TrafficResult`, or None to pass."""


@hookspec(firstresult=True)
def rpx_roofline(ctx: StageContext) -> Any:
    """Lower-bound latency per GPU and precision from Tier 1; return :class:`rpx_core.tier2.RooflineResult`."""


@hookspec(firstresult=True)
def rpx_system_card(ctx: StageContext) -> Any:
    """Describe the machine and the run settings; return :class:`rpx_core.system.SystemCard`, or None to pass."""


@hookspec(firstresult=True)
def rpx_measure_latency(ctx: StageContext) -> Any:
    """Measure latency percentiles, throughput and peak memory; return :class:`rpx_core.tier3.LatencyResult`."""


@hookspec(firstresult=True)
def rpx_batch_search(ctx: RunContext) -> Any:
    """Search batch sizes for a pipeline of models under a memory budget; return a batch-search result, or None."""
