"""Tier 2: the roofline stage's declaration, summary fields, table, compare figures and chart.

Chart: attainable FLOP/s = min(peak, bandwidth x intensity) against arithmetic intensity (FLOP/B), log-log, one roof
per GPU at the run's precision (the peaks and bandwidths the roofline stage used). The model sits at its fused
(lower-bound traffic) and unfused (upper-bound) intensity on each roof; the top operators of the first GPU at their
own intensity, coloured by bottleneck; a measured point (FLOPs / measured p50) where latency was measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rpx_core.plugin import (
    PRECISION,
    SHAPES,
    Cell,
    ChartView,
    Column,
    Figure,
    RooflineOptions,
    RooflineResult,
    RpxError,
    Stage,
    Table,
    TableView,
    ok_result,
    pyplot,
    units,
)
from rpx_plugins.stages.counts import CONVENTION

Fields = dict[str, float | str]
COLOURS = {"compute": "tab:blue", "memory": "tab:orange"}


# -- summary fields and checks -----------------------------------------------------------------------------------------


def gpu_key(name: str) -> str:
    """A GPU name as a field-name part: "H100-SXM" -> "h100_sxm"."""
    return name.lower().replace(" ", "_").replace("-", "_")


def roofline_fields(roofline: RooflineResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {}
    for gpu, by_precision in roofline.gpus.items():
        for precision, bound in by_precision.items():
            key = f"{gpu_key(gpu)}_{precision}"
            fields[f"roofline_{key}_ms"] = bound.bound_ms_fused
            fields[f"bottleneck_{key}"] = bound.bottleneck_fused
    return fields


def roofline_needs_gpus(spec: Any, options: RooflineOptions) -> Iterable[str]:
    if not spec.gpus:
        yield 'gpus: the roofline stage needs GPUs to bound: names from `rpx gpus`, or ["all"]'



# -- table and compare figures -----------------------------------------------------------------------------------------


def roofline_table(run: Any) -> Table | None:
    """One row per model, GPU and precision: the three bounds, bottleneck, memory-bound share, fits."""
    rows, skipped = [], []
    for model in run.models:
        result = ok_result(model, "roofline")
        if result is None:
            continue
        for gpu, by_precision in result.gpus.items():
            for precision, bound in by_precision.items():
                mark = " (est.)" if bound.peak_is_estimate else ""
                rows.append([
                    Cell.text_of(model.name), Cell.text_of(gpu), Cell.text_of(precision),
                    Cell.of(bound.bound_ms_fused, units.milliseconds),
                    Cell.of(bound.bound_ms_unfused, units.milliseconds),
                    Cell.of(bound.per_operator_ms, units.milliseconds),
                    Cell(bound.bottleneck_fused, bound.bottleneck_fused),
                    Cell.of(bound.memory_bound_share, units.percent),
                    Cell.of(bound.peak_tflops * 1e12, units.flop_rate, mark),
                    Cell(bound.fits_in_memory, f"{'yes' if bound.fits_in_memory else 'NO'} "
                         f"({units.size(bound.required_bytes)} of {units.size(bound.capacity_bytes)})"),
                ])  # fmt: skip
        skipped += [f"{model.name}: roofline skipped for {s.gpu} at {s.precision}: {s.reason}" for s in result.skipped]
    if not rows and not skipped:
        return None
    notes = ["bound (fused) = max(FLOPs / peak, fused bytes / bandwidth): nothing can run faster; unfused: every "
             "operator round-trips memory; per operator: the sum of each operator's own bound (eager estimate)",
             "(est.) on a peak: the GPU pack marks it derived or uncertain", *skipped]
    return Table("roofline", "Tier 2: roofline lower bounds per GPU and precision",
                 [Column("model"), Column("GPU"), Column("precision"), Column("bound fused", "ms"),
                  Column("bound unfused", "ms"), Column("per operator", "ms"), Column("bottleneck"),
                  Column("memory-bound share", "fraction"), Column("peak", "FLOP/s"), Column("fits")], rows, notes)



def bound_figures(models: Sequence[Any]) -> Iterable[Figure]:
    """One figure per GPU and precision any of the models was bounded on."""
    bounds = dict.fromkeys((gpu, precision) for model in models if (roof := ok_result(model, "roofline"))
                           for gpu, by in roof.gpus.items() for precision in by)
    return [Figure(f"bound {gpu} {precision}", _bound(gpu, precision), units.milliseconds,
                   (SHAPES, CONVENTION, PRECISION)) for gpu, precision in bounds]


def _bound(gpu: str, precision: str) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, "roofline")
        bound = None if result is None else result.gpus.get(gpu, {}).get(precision)
        return None if bound is None else bound.bound_ms_fused

    return read


# -- the chart ---------------------------------------------------------------------------------------------------------


def roofline_chart(run: Any) -> Any:
    """One panel per model that has a roofline."""
    plt = pyplot()
    models = [model for model in run.models if ok_result(model, "roofline") and ok_result(model, "estimate_traffic")]
    if not models:
        raise RpxError("the results file has no roofline (run the roofline stage) to plot")
    figure, axes = plt.subplots(1, len(models), figsize=(6.4 * len(models), 6.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        _roofline_panel(ax, model)
    figure.tight_layout()
    return figure


def _roofline_panel(ax: Any, model: Any) -> None:
    roof, traffic, flops = (ok_result(model, s) for s in ("roofline", "estimate_traffic", "count_flops"))
    total = flops.total_flops
    fused = total / traffic.fused_bytes if traffic.fused_bytes else None
    unfused = total / traffic.unfused_bytes if traffic.unfused_bytes else None
    points = [x for x in (fused, unfused) if x]
    bounds = [(gpu, by[model.precision]) for gpu, by in roof.gpus.items() if model.precision in by]
    if not bounds:
        raise RpxError(f"model {model.name!r} has no roofline at its precision {model.precision}")
    operators = _operator_points(bounds[0][1], traffic)
    everything = [*points, *(bound.machine_balance for _, bound in bounds), *(x for _, x in operators)]
    low, high = min(everything) / 4, max(everything) * 20
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    for index, (gpu, bound) in enumerate(bounds):
        colour = f"C{index + 2}"
        peak, bandwidth = bound.peak_tflops * 1e12, bound.bandwidth_gb_s * 1e9
        ax.plot(xs, [min(peak, bandwidth * x) for x in xs], color=colour, linewidth=1.5, label=f"{gpu} {model.precision}")
        for x, marker, what in ((fused, "o", "fused"), (unfused, "s", "unfused")):
            if x:
                ax.plot([x], [min(peak, bandwidth * x)], marker=marker, color=colour, markersize=7,
                        markerfacecolor="white" if what == "unfused" else colour, linestyle="none")
    _top_operators(ax, bounds[0][1], operators)
    latency = ok_result(model, "measure_latency")
    if latency is not None and fused:
        ax.plot([fused], [total / (latency.p50_ms / 1e3)], marker="*", color="black", markersize=12,
                linestyle="none", label=f"measured on {model.device} (p50)")
    ax.plot([], [], "o", color="gray", label="model, fused traffic")
    ax.plot([], [], "s", color="gray", markerfacecolor="white", label="model, unfused traffic")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(f"{model.name} ({model.precision})")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)  # below: never over a point


def _operator_points(bound: Any, traffic: Any) -> list[tuple[str, float]]:
    """(operator, intensity over all its calls) of the top operators of ``bound``."""
    points = []
    for op in dict.fromkeys(top.op for top in bound.top_operators):
        group = [record for record in traffic.op_records if record.op == op]
        flops = sum(r.flops * r.count for r in group)
        moved = sum((r.bytes_read + r.bytes_written) * r.count for r in group)
        if flops and moved:
            points.append((op, flops / moved))
    return points


def _top_operators(ax: Any, bound: Any, points: list[tuple[str, float]]) -> None:
    """The first GPU's top operators at their own intensity, on that GPU's roof, coloured by bottleneck."""
    peak, bandwidth = bound.peak_tflops * 1e12, bound.bandwidth_gb_s * 1e9
    seen = set()
    for op, x in points:
        bottleneck = "compute" if x >= bound.machine_balance else "memory"
        label = f"operator on {bound.gpu}, {bottleneck}-bound" if bottleneck not in seen else None
        seen.add(bottleneck)
        y = min(peak, bandwidth * x)
        ax.plot([x], [y], marker="^", color=COLOURS[bottleneck], markersize=6, linestyle="none", label=label)
        ax.annotate(op.removeprefix("aten."), (x, y), fontsize=6, alpha=0.8, xytext=(3, -9), textcoords="offset points")



ROOFLINE = Stage(
    "roofline",
    "lower-bound latency per GPU and precision",
    result=RooflineResult,
    needs=("count_params", "count_flops", "estimate_traffic"),
    options=RooflineOptions,
    check=roofline_needs_gpus,
    summary=roofline_fields,
    tables=(TableView("roofline", roofline_table),),
    figures=bound_figures,
    charts=(ChartView("roofline", "Roofline", roofline_chart),),
    doc="Lower-bound latency per GPU and precision from ``ctx.results['count_flops']``/``['estimate_traffic']`` "
    "and ``ctx.gpu_catalog``.",
)
