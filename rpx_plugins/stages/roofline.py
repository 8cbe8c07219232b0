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
    BYTES_PER_ELEMENT,
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
    colour,
    ok_result,
    plain,
    pyplot,
    units,
)
from rpx_plugins.stages.counts import CONVENTION

Fields = dict[str, float | str]
#: Operators by what bounds them (not among the GPU colours, which the roofs use).
COLOURS = {"compute": "black", "memory": "darkgray"}


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


def roofline_check(spec: Any, options: RooflineOptions) -> Iterable[str]:
    """GPUs to bound, and precisions whose bytes the count gives: a precision storing elements of another size than
    the counted one would make the counted bytes wrong (the stage refuses it; said here before anything runs)."""
    if not spec.gpus:
        yield 'gpus: the roofline stage needs GPUs to bound: names from `rpx gpus`, or ["all"]'
    counted = spec.sweep.precision if spec.sweep is not None and spec.sweep.precision else (spec.precision,)
    for index, precision in enumerate(options.precisions):
        other = next((name for name in counted if BYTES_PER_ELEMENT[name] != BYTES_PER_ELEMENT[precision]), None)
        if other is not None:
            yield (f"options.roofline.precisions[{index}]: {precision!r} stores {BYTES_PER_ELEMENT[precision]}-byte "
                   f"elements, but the model is counted at {other!r} ({BYTES_PER_ELEMENT[other]}-byte); bound "
                   f"{precision!r} from a spec whose precision is {precision!r}")



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
    """Per GPU: the bound at the model's own precision (the one a sweep over precisions draws as one line), then
    the bound at each other precision any model was bounded at."""
    gpus = dict.fromkeys(gpu for model in models if (roof := ok_result(model, "roofline")) for gpu in roof.gpus)
    found = [Figure(f"bound {gpu}", _bound(gpu, None), units.milliseconds, (SHAPES, CONVENTION, PRECISION),
                    unit="ms", panel="bound", gpu=gpu) for gpu in gpus]
    others = dict.fromkeys((gpu, precision) for model in models if (roof := ok_result(model, "roofline"))
                           for gpu, by in roof.gpus.items() for precision in by if precision != model.precision)
    return found + [Figure(f"bound {gpu} {precision}", _bound(gpu, precision), units.milliseconds,
                           (SHAPES, CONVENTION), unit="ms", panel=f"bound {precision}", gpu=gpu)
                    for gpu, precision in others]


def _bound(gpu: str, precision: str | None) -> Any:
    """The fused bound on ``gpu`` at ``precision`` (None: the model's own)."""
    def read(model: Any) -> Any:
        result = ok_result(model, "roofline")
        bound = None if result is None else result.gpus.get(gpu, {}).get(precision or model.precision)
        return None if bound is None else bound.bound_ms_fused

    return read


# -- the chart ---------------------------------------------------------------------------------------------------------


#: Markers of the jobs on the chart, in turn (a sweep of more jobs reuses them, with the legend telling them apart).
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "h", "<", ">")


def roofline_chart(run: Any) -> Any:
    """Every model (every point of a sweep) on one chart: a roof per GPU and precision, each model at its fused
    intensity on every roof it was bounded on; with one model, its unfused point and top operators too."""
    plt = pyplot()
    models = [model for model in run.models if ok_result(model, "roofline") and ok_result(model, "estimate_traffic")
              and ok_result(model, "count_flops")]
    if not models:
        raise RpxError("the results file has no roofline (run the roofline stage) to plot")
    roofs = {(gpu, model.precision): by[model.precision] for model in models
             for gpu, by in ok_result(model, "roofline").gpus.items() if model.precision in by}
    if not roofs:
        raise RpxError("no model has a roofline at its own precision to plot")
    figure, ax = plt.subplots(figsize=(9.6, 6.4))
    single = len(models) == 1
    operators = _operator_points(next(iter(roofs.values())), ok_result(models[0], "estimate_traffic")) if single else []
    points = [point for model in models for point in _intensities(model) if point]
    everything = [*points, *(bound.machine_balance for bound in roofs.values()), *(x for _, x in operators)]
    low, high = min(everything) / 4, max(everything) * 20
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    styles = dict(zip(dict.fromkeys(precision for _, precision in roofs), ("-", "--", ":", "-.")))
    for (gpu, precision), bound in roofs.items():
        peak, bandwidth = bound.peak_tflops * 1e12, bound.bandwidth_gb_s * 1e9
        ax.plot(xs, [min(peak, bandwidth * x) for x in xs], styles[precision], color=colour("gpu", gpu),
                linewidth=1.5, label=plain(f"{gpu} {precision}"))
    for index, model in enumerate(models):
        _model_points(ax, model, MARKERS[index % len(MARKERS)], single)
    if single:
        _top_operators(ax, next(iter(roofs.values())), operators, (low, high))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(plain(models[0].name if single else f"{run.provenance.spec.get('name', 'run')}: {len(models)} points"))
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside: never over a point
    figure.tight_layout()
    _drop_overlapping_labels(figure, ax)
    return figure


def _drop_overlapping_labels(figure: Any, ax: Any) -> None:
    """Hide an operator's label where it would overlap the label of an operator drawn before it (the top operators
    come in order of their share of the time, so the more important label stays)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    kept: list[Any] = []
    for text in (child for child in ax.texts if child.get_gid() == "data-label"):
        box = text.get_window_extent(renderer)
        if any(box.overlaps(other) for other in kept):
            text.set_visible(False)
        else:
            kept.append(box)


def _intensities(model: Any) -> tuple[float | None, float | None]:
    """(fused, unfused) arithmetic intensity of the model's counted pass."""
    traffic, flops = ok_result(model, "estimate_traffic"), ok_result(model, "count_flops")
    total = flops.total_flops
    return (total / traffic.fused_bytes if traffic.fused_bytes else None,
            total / traffic.unfused_bytes if traffic.unfused_bytes else None)


def _model_points(ax: Any, model: Any, marker: str, single: bool) -> None:
    """The model on each roof of its precision (fused filled; unfused open when it is the only model), and its
    measured FLOP/s where latency was measured."""
    roof, total = ok_result(model, "roofline"), ok_result(model, "count_flops").total_flops
    fused, unfused = _intensities(model)
    for gpu, by in roof.gpus.items():
        bound = by.get(model.precision)
        if bound is None:
            continue
        peak, bandwidth, tint = bound.peak_tflops * 1e12, bound.bandwidth_gb_s * 1e9, colour("gpu", gpu)
        for x, open_ in ((fused, False), *(((unfused, True),) if single else ())):
            if x:
                ax.plot([x], [min(peak, bandwidth * x)], marker=marker, color=tint, markersize=7, linestyle="none",
                        markerfacecolor="white" if open_ else tint)
    ax.plot([], [], marker, color="gray", linestyle="none", label=plain(f"{model.name}, fused traffic"))
    if single:
        ax.plot([], [], marker, color="gray", markerfacecolor="white", linestyle="none",
                label=plain(f"{model.name}, unfused traffic"))
    latency = ok_result(model, "measure_latency")
    if latency is not None and fused:  # the job's own marker, outlined in black: which point is whose stays clear
        ax.plot([fused], [total / (latency.p50_ms / 1e3)], marker=marker, color="black", markerfacecolor="none",
                markersize=9, markeredgewidth=1.5, linestyle="none",
                label=plain(f"{model.name} measured on {model.device} (p50)"))


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


def _top_operators(ax: Any, bound: Any, points: list[tuple[str, float]], span: tuple[float, float]) -> None:
    """The first GPU's top operators at their own intensity, on that GPU's roof, coloured by bottleneck; each label
    reads away from the nearer edge of the ``span`` of intensities drawn, so it stays inside the axes."""
    import math

    peak, bandwidth = bound.peak_tflops * 1e12, bound.bandwidth_gb_s * 1e9
    seen = set()
    for op, x in points:
        bottleneck = "compute" if x >= bound.machine_balance else "memory"
        label = f"operator on {bound.gpu}, {bottleneck}-bound" if bottleneck not in seen else None
        seen.add(bottleneck)
        y = min(peak, bandwidth * x)
        ax.plot([x], [y], marker="^", color=COLOURS[bottleneck], markersize=6, linestyle="none", label=label)
        rightward = math.log(x / span[0]) < 0.5 * math.log(span[1] / span[0])
        text = ax.annotate(plain(op.removeprefix("aten.")), (x, y), fontsize=6, alpha=0.8,
                           xytext=(3 if rightward else -3, -9), textcoords="offset points",
                           ha="left" if rightward else "right", annotation_clip=True, clip_on=True)
        text.set_gid("data-label")  # the report's test finds data labels by this id and checks they stay in the axes


ROOFLINE = Stage(
    "roofline",
    "lower-bound latency per GPU and precision",
    result=RooflineResult,
    needs=("count_params", "count_flops", "estimate_traffic"),
    options=RooflineOptions,
    check=roofline_check,
    summary=roofline_fields,
    tables=(TableView("roofline", roofline_table),),
    figures=bound_figures,
    charts=(ChartView("roofline", "Roofline", roofline_chart),),
    doc="Lower-bound latency per GPU and precision from ``ctx.results['count_flops']``/``['estimate_traffic']`` "
    "and ``ctx.gpu_catalog``.",
)
