"""Charts of a results file with matplotlib (the optional extra ``rpx[plot]``): the roofline and the batch search.

* Roofline: attainable FLOP/s = min(peak, bandwidth x intensity) against arithmetic intensity (FLOP/B), log-log, one
  roof per GPU at the run's precision (the peaks and bandwidths the roofline stage used). The model sits at its fused
  (lower-bound traffic) and unfused (upper-bound) intensity on each roof; the top operators of the first GPU at their
  own intensity, coloured by bottleneck; a measured point (FLOPs / measured p50) where latency was measured.
* Batch search: each stage's frames/s and the trial's memory against the stage's batch size (one point per trial),
  the budget as a line, failed trials marked x, the chosen trial circled.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rpx_core.errors import RpxError
from rpx_core.results.safe_write import Input, atomic_write
from rpx_core.show.tables import ok_result

KINDS = ("roofline", "batch")
COLOURS = {"compute": "tab:blue", "memory": "tab:orange"}


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RpxError("charts need matplotlib: pip install 'rpx[plot]'") from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    matplotlib.rcParams["text.parse_math"] = False  # names are text: a model named "budget_$1_$2" is no formula
    import matplotlib.pyplot as plt

    return plt


def roofline_figure(run: Any) -> Any:
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


def batch_figure(run: Any) -> Any:
    """Throughput (top) and memory (bottom) against batch size, one line per pipeline stage."""
    plt = pyplot()
    record = run.run_stages.get("batch_search")
    if record is None or record.status != "ok":
        raise RpxError("the results file has no batch search (run the batch_search stage) to plot")
    result = record.result
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7.2, 6.4), sharex=True)
    for index, stage in enumerate(result.stages):
        colour = f"C{index}"
        good = sorted((t.batch_sizes[index], t.stages[index].frames_per_second, t.used_bytes) for t in result.trials
                      if t.ok and t.stages[index].frames_per_second is not None)
        # points, not lines: a stage meets one batch size in several trials (the other stages' sizes differ)
        top.plot([g[0] for g in good], [g[1] for g in good], "o", color=colour, label=f"{stage.name} frames/s")
        measured = [g for g in good if g[2] is not None]
        bottom.plot([g[0] for g in measured], [g[2] / 1e6 for g in measured], "o", color=colour, label=f"{stage.name}")
        failed = [(t.batch_sizes[index], t.used_bytes) for t in result.trials if not t.ok]
        if failed:
            bottom.plot([f[0] for f in failed], [(f[1] or result.usable_bytes) / 1e6 for f in failed], "x",
                        color=colour, markersize=8, label=f"{stage.name} failed (oom / over budget)")
        if result.chosen_trial is not None:
            chosen = result.trials[result.chosen_trial]
            for ax, y in ((top, chosen.stages[index].frames_per_second), (bottom, (chosen.used_bytes or 0) / 1e6)):
                ax.plot([chosen.batch_sizes[index]], [y], "o", markersize=14, markerfacecolor="none",
                        markeredgecolor="black", markeredgewidth=2)
    bottom.axhline(result.usable_bytes / 1e6, color="red", linestyle="--", label="usable budget")
    if result.chosen_trial is not None:
        top.plot([], [], "o", markerfacecolor="none", markeredgecolor="black", markersize=10,
                 label=f"chosen (trial {result.chosen_trial})")
    top.set_ylabel("frames/s")
    bottom.set_ylabel("memory used (MB)")
    bottom.set_xlabel("batch size of the stage")
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=7)
    top.set_title("batch search")
    figure.tight_layout()
    return figure


def figure_for(run: Any, kind: str) -> Any:
    return roofline_figure(run) if kind == "roofline" else batch_figure(run)


def save(figure: Any, path: Path, inputs: Iterable[Input] = ()) -> None:
    """PNG or SVG by the suffix, written atomically and never over one of ``inputs`` (rpx_core.results.safe_write)."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise RpxError(f"{path}: the chart file must end in .png or .svg")
    out = io.BytesIO()
    figure.savefig(out, format=suffix[1:], dpi=120)
    pyplot().close(figure)
    atomic_write(path, out.getvalue(), inputs)


def svg_text(figure: Any) -> str:
    """The figure as an inline SVG element (for the HTML report)."""
    out = io.StringIO()
    figure.savefig(out, format="svg")
    pyplot().close(figure)
    text = out.getvalue()
    return text[text.index("<svg"):]
