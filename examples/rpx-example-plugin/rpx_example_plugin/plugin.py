"""Everything a third-party rpx plugin can do, in one small module.

* ``rpx_register_backends``: a new backend, ``cpu-1thread`` (torch on the host pinned to one thread, for latency that
  does not depend on how busy the other cores are).
* ``rpx_count_params``: overrides the built-in ``count_params`` stage *for that backend only*; every other backend
  still gets the built-in (returning None passes the call on).
* ``rpx_register_gpu_packs``: a small GPU pack shipped as a TOML file in this package.
* ``rpx_register_stages``: a new stage, ``weights_report``, which needs ``count_params`` and takes options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from rpx_core import hookimpl
from rpx_core.backends import Availability
from rpx_core.stages import StageDef
from rpx_plugins.torch.cpu import CpuBackend


class OneThreadCpuBackend(CpuBackend):
    name = "cpu-1thread"
    description = "PyTorch on the host CPU, one intra-op thread"

    def probe(self) -> Availability:
        found = super().probe()
        return attrs.evolve(found, reason="torch on the host CPU, 1 thread") if found.available else found

    def place_model(self, model: Any, precision: str, device: str) -> Any:
        import torch

        torch.set_num_threads(1)
        return super().place_model(model, precision, device)


@hookimpl
def rpx_register_backends() -> list:
    return [OneThreadCpuBackend()]


@hookimpl
def rpx_count_params(ctx: Any) -> Any:
    """Count parameters by walking ``named_parameters`` directly: an independent implementation for our backend."""
    if ctx.backend.name != OneThreadCpuBackend.name:
        return None
    from rpx_core.precision import BYTES_PER_ELEMENT
    from rpx_core.types.counts import ParamsResult

    model = ctx.build_model()
    params = list(model.parameters())  # parameters() yields a Parameter object shared by two modules once
    buffers = list(model.buffers())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    floating_size = BYTES_PER_ELEMENT[ctx.job.precision]  # floating tensors take the precision's size

    def size(tensor: Any) -> int:
        return tensor.numel() * (floating_size if tensor.is_floating_point() else tensor.element_size())

    return ParamsResult(
        total=total,
        trainable=trainable,
        non_trainable=total - trainable,
        buffers=sum(b.numel() for b in buffers),
        bytes_at_precision=sum(size(t) for t in [*params, *buffers]),
        precision=ctx.job.precision,
    )


@hookimpl
def rpx_register_gpu_packs() -> list[Path]:
    return [Path(__file__).with_name("example_gpus.toml")]


@attrs.frozen
class WeightsReportOptions:
    """Options of the ``weights_report`` stage."""

    unit: str = attrs.field(default="MB", validator=attrs.validators.in_(("MB", "MiB")))


def weights_report(ctx: Any) -> dict[str, Any]:
    params = ctx.results["count_params"]
    unit = ctx.options("weights_report").unit
    scale = 1e6 if unit == "MB" else 2**20
    return {"unit": unit, "weights": params.bytes_at_precision / scale, "precision": params.precision}


@hookimpl
def rpx_register_stages() -> list[StageDef]:
    return [
        StageDef(
            "weights_report",
            run=weights_report,
            needs=("count_params",),
            options=WeightsReportOptions,
            description="weight memory in the unit of your choice",
        )
    ]
