"""Everything a third-party rpx plugin can do, in one small module that imports only ``rpx_core.plugin``.

* ``rpx_register_backends``: a new backend, ``cpu-1thread`` (torch on the host pinned to one thread, for latency that
  does not depend on how busy the other cores are).
* ``rpx_count_params``: overrides the built-in ``count_params`` stage *for that backend only*; every other backend
  still gets the built-in (returning None passes the call on).
* ``rpx_register_gpu_packs``: a small GPU pack shipped as a TOML file in this package.
* ``rpx_register_stages`` + ``rpx_weights_report``: a new stage, ``weights_report``, which needs ``count_params``,
  takes options, returns its own result type, contributes a summary field, and declares how it is shown: a table
  (``rpx show``, the report, the end of ``rpx run``) and a figure ``rpx compare`` puts side by side. Its
  implementation is ``trylast``, so another plugin can override it for its own backend, exactly like a built-in stage.
* ``rpx_register_op_formulas``: a FLOP formula for a custom operator, ``example::fused_gelu`` (defined in ``ops``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from rpx_core.plugin import (
    PRECISION,
    Availability,
    Cell,
    Column,
    CpuBackend,
    Figure,
    OpFormula,
    ParamsResult,
    Stage,
    StageContext,
    Table,
    TableView,
    cost_table,
    hookimpl,
    ok_result,
    units,
)


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
def rpx_count_params(ctx: StageContext) -> ParamsResult | None:
    """Count parameters by walking ``parameters()`` directly: an independent implementation for our backend."""
    if ctx.backend.name != OneThreadCpuBackend.name:
        return None
    model = ctx.build_model()
    params = list(model.parameters())  # parameters() yields a Parameter object shared by two modules once
    buffers = list(model.buffers())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    floating_size = ctx.precision.element_bytes  # floating tensors take the precision's size

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
    """Options of the ``weights_report`` stage (``[options.weights_report]``)."""

    unit: str = attrs.field(default="MB", validator=attrs.validators.in_(("MB", "MiB")))


@attrs.frozen
class WeightsReport:
    """Weight memory (parameters and buffers at the run's precision) in the unit asked for."""

    unit: str  # "MB" (1e6 bytes) or "MiB" (2**20 bytes)
    weights: float  # bytes_at_precision / unit
    precision: str


def weights_fields(report: WeightsReport, results: Any) -> dict[str, float]:
    return {f"weights_{report.unit.lower()}": report.weights}


def weights_table(run: Any) -> Table | None:
    """One row per model that has a weights report; None when no model has one (no table is shown)."""
    rows = [[Cell.text_of(model.name), Cell.text_of(report.precision), Cell(report.weights, f"{report.weights:.3g}"),
             Cell.text_of(report.unit)]
            for model in run.models if (report := ok_result(model, "weights_report")) is not None]
    if not rows:
        return None
    return Table("weights", "Weight memory", [Column("model"), Column("precision"), Column("weights"),
                                              Column("unit")], rows, ["parameters and buffers at the run's precision"])


def weights_figures(models: Any) -> list[Figure]:
    """The weight memory, compared in bytes (so MB and MiB files compare); it depends on the precision."""
    def read(model: Any) -> float | None:
        report = ok_result(model, "weights_report")
        return None if report is None else report.weights * (1e6 if report.unit == "MB" else 2**20)

    return [Figure("weight bytes", read, units.size, depends=(PRECISION,))]


WEIGHTS_REPORT = Stage(
    "weights_report",
    "weight memory in the unit of your choice",
    result=WeightsReport,
    needs=("count_params",),
    options=WeightsReportOptions,
    summary=weights_fields,
    tables=(TableView("weights", weights_table),),
    figures=weights_figures,
)


@hookimpl
def rpx_register_stages() -> list[Stage]:
    return [WEIGHTS_REPORT]


@hookimpl(trylast=True)
def rpx_weights_report(ctx: StageContext) -> WeightsReport:
    params = ctx.results["count_params"]
    unit = ctx.options("weights_report").unit
    scale = 1e6 if unit == "MB" else 2**20
    return WeightsReport(unit=unit, weights=params.bytes_at_precision / scale, precision=params.precision)


# -- operator formulas: pricing a custom operator ----------------------------------------------------------------------


@hookimpl
def rpx_register_op_formulas() -> list:
    """Price ``example::fused_gelu`` (the erf-form GELU as one operator), which rpx's counter has no formula for.

    The operator is named as a string with the module that defines it (``library``), which rpx imports only when a
    torch count starts, so loading this plugin (``rpx plugins``) never imports torch. The formula uses rpx's
    per-element cost of GELU, so the figure matches an unfused GELU's.
    """
    gelu = cost_table.GELU_ERF
    return [OpFormula("example::fused_gelu", flops=lambda call: gelu * call.out_numel(), library="rpx_example_plugin.ops")]
