"""A sweep read as one thing: a table with the sweep's axes as columns, and charts of every figure against every axis.

The figures are the ones the stages declare for ``rpx compare`` (:class:`rpx_core.show.compare.Figure`), read from
every job of the sweep; the axes are the job coordinates that take more than one value (``seq_len``, ``batch_size``,
``precision``, ...). A chart has one panel per figure family (the bound on every GPU is one family) and axis, one
line per GPU and model and per value of the other axes, so a question such as "how does the bound change with
sequence length on each GPU?" is one panel. Colours are one per GPU (else per model) across every chart of a
report (:func:`rpx_core.show.charts.colour`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rpx_core.errors import RpxError
from rpx_core.show import charts
from rpx_core.show.compare import Figure, figures
from rpx_core.show.tables import Cell, Column, Table, TableView

#: Panels per row of a sweep chart, and each panel's size in inches: two panels fit the report's width.
COLUMNS, PANEL = 2, (5.4, 3.4)


def axes(run: Any) -> list[str]:
    """The sweep's axes: coordinates (other than the model) that take more than one value, in first-seen order."""
    values: dict[str, set[str]] = {}
    for model in run.models:
        for axis, value in (model.coordinates or {}).items():
            if axis != "model":
                values.setdefault(axis, set()).add(str(value))
    return [axis for axis, seen in values.items() if len(seen) > 1]


def swept_figures(run: Any, stages: Mapping[str, Any]) -> list[Figure]:
    """The figures any job of the sweep has that change across it (a figure the same everywhere says nothing)."""
    found = figures(list(run.models), stages)
    return [figure for figure in found if len({figure.read(model) for model in run.models} - {None}) > 1]


def sweep_table(run: Any, stages: Mapping[str, Any]) -> Table | None:
    """One row per job: the model, its value on each axis, then every figure that changes across the sweep."""
    swept = axes(run)
    if not swept:
        return None
    shown = swept_figures(run, stages)
    rows = [[Cell.text_of(_model(model)), *(Cell.text_of((model.coordinates or {}).get(axis)) for axis in swept),
             *(Cell.of(figure.read(model), figure.show) for figure in shown)] for model in run.models]
    return Table("sweep", f"Sweep over {', '.join(swept)}",
                 [Column("model"), *(Column(axis) for axis in swept), *(Column(f.name, f.unit) for f in shown)], rows,
                 ["one row per job; figures that are the same at every point are left out (see the other tables)"])


def sweep_views(stages: Mapping[str, Any]) -> tuple[TableView, charts.ChartView]:
    """The sweep's table and chart, for the ``stages`` that declare the figures."""
    return (TableView("sweep", lambda run: sweep_table(run, stages)),
            charts.ChartView("sweep", "Sweep", lambda run: sweep_chart(run, stages)))


def sweep_chart(run: Any, stages: Mapping[str, Any]) -> Any:
    """Every swept figure family against every axis, one panel each, two panels a row."""
    swept = axes(run)
    if not swept:
        raise RpxError("the results file has no sweep (a [sweep] table with an axis of two or more values) to plot")
    families: dict[str, list[Figure]] = {}
    for figure in swept_figures(run, stages):
        families.setdefault(figure.panel or figure.name, []).append(figure)
    panels = [(family, members, axis) for family, members in families.items() for axis in swept]
    if not panels:
        raise RpxError("no figure changes across the sweep: nothing to plot")
    plt = charts.pyplot()
    rows = math.ceil(len(panels) / COLUMNS)
    figure, grid = plt.subplots(rows, COLUMNS, figsize=(PANEL[0] * COLUMNS, PANEL[1] * rows), squeeze=False)
    for ax, (family, members, axis) in zip(grid.flat, panels):
        _panel(ax, run, family, members, axis, [other for other in swept if other != axis])
    for ax in list(grid.flat)[len(panels):]:
        ax.set_visible(False)
    figure.tight_layout()
    return figure


def _panel(ax: Any, run: Any, family: str, members: list[Figure], axis: str, others: list[str]) -> None:
    """One family against one axis: a line per figure (GPU), model and combination of the other axes' values."""
    numeric = all(isinstance((m.coordinates or {}).get(axis), (int, float)) for m in run.models)
    order = _axis_order(run, axis, numeric)
    lines: dict[tuple[Any, ...], list[tuple[Any, float, Any]]] = {}
    for figure in members:
        for model in run.models:
            value = figure.read(model)
            if value is None:
                continue
            rest = tuple((other, (model.coordinates or {}).get(other)) for other in others)
            interval = figure.noise(model).interval if figure.noise and figure.noise(model) else None
            lines.setdefault((figure, _model(model), rest), []).append(
                ((model.coordinates or {}).get(axis), value, interval))
    styles, markers = ("-", "--", ":", "-."), ("o", "s", "^", "D", "v")
    rests = list(dict.fromkeys(key[2] for key in lines))
    for (figure, model_name, rest), points in lines.items():
        points.sort(key=lambda point: order.index(point[0]))
        xs = [point[0] if numeric else order.index(point[0]) for point in points]
        ys = [point[1] for point in points]
        colour = charts.colour("gpu", figure.gpu) if figure.gpu else charts.colour("model", model_name)
        label = " ".join(part for part in (figure.gpu or (figure.name if len(members) > 1 else ""),
                                           model_name if len({key[1] for key in lines}) > 1 else "",
                                           ", ".join(f"{k}={v}" for k, v in rest)) if part) or model_name
        style = styles[rests.index(rest) % len(styles)]
        marker = markers[members.index(figure) % len(markers)] if not figure.gpu else "o"
        ax.plot(xs, ys, style, marker=marker, markersize=3, color=colour, label=charts.plain(label))
        errors = [point[2] for point in points]
        if any(errors):
            low = [y - (e[0] if e else y) for y, e in zip(ys, errors)]
            high = [(e[1] if e else y) - y for y, e in zip(ys, errors)]
            ax.errorbar(xs, ys, yerr=[low, high], fmt="none", ecolor=colour, alpha=0.5, capsize=2)
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    if numeric and _geometric(order):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    if not numeric or len(order) <= 8:  # every value a tick; more than 8 would overlap: matplotlib's own ticks
        ax.set_xticks(order if numeric else range(len(order)), [charts.plain(str(value)) for value in order])

    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: members[0].show(value) if value else "0"))
    ax.set_xlabel(charts.plain(axis))
    ax.set_ylabel(charts.plain(family))
    ax.set_title(charts.plain(f"{family} against {axis}"), fontsize=9)
    ax.grid(True, alpha=0.25)
    if len(lines) > 1:
        ax.legend(fontsize=6, loc="best")


def _geometric(values: list[Any]) -> bool:
    """Values that grow by a factor (1, 2, 4, 8, ...) rather than a step: drawn on a log2 axis."""
    positive = [value for value in values if value > 0]
    return len(positive) == len(values) >= 3 and positive[-1] / positive[0] >= 8 and \
        all(b / a >= 1.5 for a, b in zip(positive, positive[1:]))


def _axis_order(run: Any, axis: str, numeric: bool) -> list[Any]:
    values = list(dict.fromkeys((model.coordinates or {}).get(axis) for model in run.models))
    return sorted(values) if numeric else values


def _model(model: Any) -> str:
    """The model's name in the spec (a sweep job's name carries its coordinates too)."""
    return str((model.coordinates or {}).get("model", model.name))
