"""The built-in stages: one per stage hook, each running its hook so any plugin can override it per backend."""

from __future__ import annotations

import functools
from typing import Any

from rpx_core.context import StageContext
from rpx_core.errors import UnsupportedError
from rpx_core.hookspecs import hookimpl
from rpx_core.stages import Provided, StageDef


def run_stage_hook(stage: str, ctx: StageContext) -> Any:
    """Run ``stage`` through its hook; no plugin answering for this backend is said out loud."""
    result, plugin = ctx.plugins.call_stage_hook(stage, ctx)
    if plugin is None:
        raise UnsupportedError(
            f"no installed plugin implements stage {stage!r} for backend {ctx.backend.name!r} "
            f"(framework {ctx.backend.framework!r})"
        )
    return Provided(result, plugin)


def _stage(name: str, description: str, needs: tuple[str, ...] = (), options: type | None = None, scope: str = "model") -> StageDef:
    return StageDef(name, functools.partial(run_stage_hook, name), needs, options, description, scope)


@hookimpl
def rpx_register_stages() -> list[StageDef]:
    from rpx_core.types.batch_search import BatchSearchOptions
    from rpx_core.types.counts import CountOptions
    from rpx_core.types.latency import LatencyOptions
    from rpx_core.types.roofline import RooflineOptions

    return [
        _stage("count_params", "parameters, buffers and their bytes at the spec's precision"),
        _stage("count_flops", "FLOPs and MACs of one pass, per operator and module", options=CountOptions),
        _stage("estimate_traffic", "bytes moved (unfused and fused bounds) and peak activation memory",
               needs=("count_flops",)),
        _stage("roofline", "lower-bound latency per GPU and precision",
               needs=("count_params", "count_flops", "estimate_traffic"), options=RooflineOptions),
        _stage("system_card", "the machine and run settings (OS, CPU, RAM, accelerators, library versions)"),
        _stage("measure_latency", "latency percentiles at batch 1, throughput per batch size, peak memory",
               needs=("system_card",), options=LatencyOptions),
        _stage("batch_search", "best batch sizes for a pipeline of models under a memory budget",
               options=BatchSearchOptions, scope="run"),
    ]
