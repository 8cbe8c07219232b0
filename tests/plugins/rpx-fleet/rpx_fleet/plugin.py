"""The fleet plugin's hooks, written from the plugin guide (docs/plugins.md) alone; imports only ``rpx_core.plugin``.

* ``rpx_register_gpu_packs``: the fleet's edge device, Fleet-E1 (fp16 and int8 peaks only).
* ``rpx_register_stages`` + ``rpx_fleet_memory``: a run-scoped stage. Once every model of the spec has been
  counted, it adds up their weights and says whether they fit together in one device's memory (the option ``gpu``
  names the device; its ``check`` refuses a device the spec does not bound).
* ``rpx_register_op_formulas``: re-prices the built-in ``aten::gelu`` at 1 FLOP per element, as the E1 evaluates
  GELU (a table lookup), instead of rpx's 5 for the erf form.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from rpx_core.plugin import OpFormula, ParamsResult, RunContext, Stage, hookimpl


@hookimpl
def rpx_register_gpu_packs() -> list[Path]:
    return [Path(__file__).with_name("fleet_gpus.toml")]


@attrs.frozen
class FleetMemoryOptions:
    """``[options.fleet_memory]``: the device all models must fit on together."""

    gpu: str = "Fleet-E1"


@attrs.frozen
class FleetMemory:
    """Weights of every model of the spec, held together on one device (bytes at each model's precision)."""

    weights_bytes: dict[str, int]  # model name -> bytes_at_precision of its count_params
    total_bytes: int  # the sum
    gpu: str
    gpu_memory_bytes: int  # the device's nominal capacity (memory_gb x 1e9)
    fits: bool  # total_bytes <= gpu_memory_bytes


def gpu_is_bounded(spec: Any, options: FleetMemoryOptions) -> Iterable[str]:
    if options.gpu not in spec.gpus:
        yield f"options.fleet_memory.gpu: {options.gpu!r} is not one of the spec's gpus ({', '.join(spec.gpus)})"


FLEET_MEMORY = Stage(
    "fleet_memory",
    "whether every model's weights fit together on one device",
    result=FleetMemory,
    needs=("count_params",),
    options=FleetMemoryOptions,
    scope="run",
    check=gpu_is_bounded,
    doc="Add up ``count_params`` of every model (``ctx.models``) against a GPU of ``ctx.gpu_catalog``.",
)


@hookimpl
def rpx_register_stages() -> list[Stage]:
    return [FLEET_MEMORY]


@hookimpl(trylast=True)
def rpx_fleet_memory(ctx: RunContext) -> FleetMemory:
    counted: dict[str, ParamsResult] = {model.job.model.name: model.results["count_params"] for model in ctx.models}
    weights = {name: params.bytes_at_precision for name, params in counted.items()}
    gpu = ctx.gpu_catalog.get(ctx.options.gpu)
    total = sum(weights.values())
    return FleetMemory(weights, total, gpu.name, gpu.memory_bytes, total <= gpu.memory_bytes)


@hookimpl
def rpx_register_op_formulas() -> list[OpFormula]:
    return [OpFormula("aten::gelu", flops=lambda call: call.out_numel())]
