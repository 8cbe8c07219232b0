"""measure_breakdown: where one call's time goes, each operator and module against its own bound. The declaration,
its summary fields, its tables, its compare figures and its chart. The implementations: rpx_plugins.breakdown.

What the tables answer: the operators with the most time above their bound (the best places to optimise: the
console's top rows, ranked by measured - bound), the calls that waited for their launches (device idle before their
kernels), and what rpx could not attribute (kernels without an operator, operators without counted work). The full
tables (``rpx show --table breakdown_operators``, ``breakdown_calls``, ``breakdown_modules``,
``breakdown_unattributed``, and the report, sortable) hold every row; each adds up to the measured call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rpx_core.plugin import (
    PRECISION,
    SHAPES,
    BreakdownOptions,
    BreakdownResult,
    Cell,
    ChartView,
    Column,
    Figure,
    Noise,
    RpxError,
    Stage,
    Table,
    TableView,
    field,
    ok_result,
    pyplot,
    units,
)
from rpx_core.types.breakdown import IDLE_ROW, PSEUDO_ROWS

Fields = dict[str, float | str]
STAGE = "measure_breakdown"
#: Operator rows the console shows per model (the full table has them all).
TOP_ROWS = 5
#: The smallest change of one operator's time that compare calls (each comes from one profiled call).
OPERATOR_BAND = 0.10
COLOURS = {"compute": "tab:blue", "memory": "tab:orange", "overhead": "tab:red"}


# -- summary fields ----------------------------------------------------------------------------------------------------


def ranked(rows: Iterable[Any]) -> list[Any]:
    """Operator rows, best place to optimise first: most time above the bound; without bounds, most time."""
    rows = [row for row in rows if field(row, "name") not in PSEUDO_ROWS]
    if any(field(row, "bound_ms") is not None for row in rows):
        return sorted(rows, key=lambda row: -_excess(row) if _excess(row) is not None else float("inf"))
    return sorted(rows, key=lambda row: -field(row, "time_ms"))


def _excess(row: Any) -> float | None:
    bound = field(row, "bound_ms")
    return None if bound is None else field(row, "time_ms") - bound


def breakdown_fields(breakdown: BreakdownResult, results: Mapping[str, Any]) -> Fields:
    """The measured call, how much of it the device was busy, and the operator to look at first."""
    fields: Fields = {"breakdown_call_ms": breakdown.call_ms, "breakdown_busy_ms": breakdown.busy_ms,
                      "breakdown_idle_ms": breakdown.idle_ms}
    top = ranked(breakdown.operators)
    if top:
        fields["breakdown_top_operator"] = top[0].name
        if top[0].excess_ms is not None:
            fields["breakdown_top_excess_ms"] = top[0].excess_ms
    return fields


# -- tables ------------------------------------------------------------------------------------------------------------


def _figures(row: Any) -> list[Cell]:
    """time, share, bound, bound/measured, limited by, above bound."""
    limited = field(row, "limited_by")
    return [Cell.of(field(row, "time_ms"), units.milliseconds), Cell.of(field(row, "share"), units.percent),
            Cell.of(field(row, "bound_ms"), units.milliseconds), Cell.of(field(row, "fraction"), units.percent),
            Cell.text_of(limited), Cell.of(_excess(row), units.milliseconds)]


FIGURE_COLUMNS = [Column("time", "ms"), Column("share", "fraction"), Column("bound", "ms"),
                  Column("bound/measured", "fraction"), Column("limited by"), Column("above bound", "ms")]
WORK_COLUMNS = [Column("FLOPs", "FLOP"), Column("traffic", "bytes"), Column("achieved compute", "FLOP/s"),
                Column("achieved bandwidth", "bytes/s")]


def _work(row: Any) -> list[Cell]:
    return [Cell.of(field(row, "flops"), units.flops), Cell.of(field(row, "bytes"), units.size),
            Cell.of(field(row, "flops_per_s"), units.flop_rate), Cell.of(field(row, "bytes_per_s"), units.bandwidth)]


def _models(run: Any) -> list[tuple[Any, Any]]:
    return [(model, result) for model in run.models if (result := ok_result(model, STAGE)) is not None]


def _conventions(results: list[Any], matching: bool = True) -> list[str]:
    """How times were taken, how operators were matched (left out on the console: long), what the bound says."""
    first = results[0]
    return [f"time: {field(first, 'time_convention')}", *([f"matching: {field(first, 'matching')}"] if matching else []),
            "bound/measured: 100% = at the operator's roofline (above 100%: it moved fewer bytes than the unfused "
            "count says, e.g. from cache); limited by: the roof of its bound, or 'overhead' when the bound is under "
            f"{units.percent(field(first, 'overhead_below', 0.1))} of the time (launches, fixed per-kernel costs, "
            "host work)"]


def top_rows(run: Any) -> Table | None:
    """Per model: the operators with the most time above their bound, then the time no operator accounts for; and
    under the table, the calls that waited for their launches and what could not be attributed."""
    found = _models(run)
    if not found:
        return None
    rows, notes = [], []
    for model, result in found:
        pseudo = [row for row in result.operators if row.name in PSEUDO_ROWS]
        for row in [*ranked(result.operators)[:TOP_ROWS], *pseudo]:
            rows.append([Cell.text_of(model.name), Cell.text_of(row.name), Cell(row.calls, str(row.calls)),
                         *_figures(row)])
        notes += _answers(model.name, result)
    notes += ["ranked by time above the bound: the best places to optimise first (without a bound: by time); "
              "rpx show --table breakdown_operators / breakdown_calls / breakdown_modules for every row",
              *_conventions([result for _, result in found], matching=False)]
    return Table("breakdown", "Tier 3: where the call's time goes (top operators)",
                 [Column("model"), Column("operator"), Column("calls"), *FIGURE_COLUMNS], rows, notes)


def _answers(name: str, result: Any) -> list[str]:
    """The call, the launch-bound calls, and what rpx could not attribute, in words."""
    busy_share = result.busy_ms / result.total_ms if result.total_ms else None
    lines = [f"{name}: call {units.milliseconds(result.call_ms)} (median of {result.call_samples}, no profiler); "
             f"device busy {units.milliseconds(result.busy_ms)} ({units.percent(busy_share)}), idle "
             f"{units.milliseconds(result.idle_ms)}; profiled call {units.milliseconds(result.profiled_ms)}; "
             f"bound: {result.bound_convention}"]
    waited = sorted((row for row in result.operators if row.idle_before_ms > 0 and row.name != IDLE_ROW),
                    key=lambda row: -row.idle_before_ms)[:3]
    if waited:
        what = ("launch-bound (device idle before their kernels, profiled call)" if field(result, "on_device", True)
                else "host time before them outside any operator (interpreter, hooks; profiled call)")
        lines.append(f"{name}: {what}: " + ", ".join(
            f"{row.name} {units.milliseconds(row.idle_before_ms)} over {row.calls} call(s)" for row in waited))
    lost = [f"{sum(row.calls for row in result.unattributed)} kernel(s) without an operator "
            f"({units.milliseconds(sum(row.time_ms for row in result.unattributed))})"] if result.unattributed else []
    uncounted = sorted({row.name for row in result.operators if not row.counted and row.name not in PSEUDO_ROWS})
    if uncounted:
        lost.append(f"operators without counted work: {', '.join(uncounted)}")
    if result.unmatched_counted:
        lost.append(f"{result.unmatched_counted} counted call(s) not in the profile "
                    f"({units.flops(result.unmatched_counted_flops)})")
    lines.append(f"{name}: not attributed: {'; '.join(lost) if lost else 'nothing'}")
    cost = field(result, "cost")
    if cost is not None:
        phases = (("warm-up", cost.warmup_seconds), ("reference calls", cost.reference_seconds),
                  ("counting", cost.counting_seconds), ("profiling", cost.profiling_seconds),
                  ("attribution", cost.attribution_seconds))
        lines.append(f"{name}: the breakdown itself took {units.seconds(sum(s for _, s in phases))} ("
                     + ", ".join(f"{phase} {units.seconds(seconds)}" for phase, seconds in phases) + ")")
    return lines + [f"{name}: {note}" for note in result.notes]


def operators_table(run: Any) -> Table | None:
    """Every operator of every model's breakdown, with its counted work and its bound."""
    found = _models(run)
    if not found:
        return None
    rows = [[Cell.text_of(model.name), Cell.text_of(row.name), Cell(row.calls, str(row.calls)),
             Cell(row.kernels, str(row.kernels)), *_figures(row), *_work(row),
             Cell.of(row.idle_before_ms, units.milliseconds), Cell.text_of("yes" if row.counted else "no")]
            for model, result in found for row in result.operators]
    return Table("breakdown_operators", "Tier 3: measured time per operator",
                 [Column("model"), Column("operator"), Column("calls"), Column("kernels"), *FIGURE_COLUMNS,
                  *WORK_COLUMNS, Column("idle before", "ms"), Column("counted")], rows,
                 _conventions([result for _, result in found]))


def calls_table(run: Any) -> Table | None:
    """Every operator by input shapes and module: which matmul, which layer."""
    found = _models(run)
    if not found:
        return None
    rows = [[Cell.text_of(model.name), Cell.text_of(row.name), Cell.text_of(row.inputs), Cell.text_of(row.module),
             Cell(row.calls, str(row.calls)), *_figures(row), *_work(row)]
            for model, result in found for row in result.signatures]
    return Table("breakdown_calls", "Tier 3: measured time per operator call signature",
                 [Column("model"), Column("operator"), Column("inputs"), Column("module"), Column("calls"),
                  *FIGURE_COLUMNS, *WORK_COLUMNS], rows, _conventions([result for _, result in found]))


def modules_table(run: Any) -> Table | None:
    """The module tree: each module's time (its operators' and its children's) and what ran directly in it."""
    found = _models(run)
    if not found:
        return None
    rows = [[Cell.text_of(model.name), Cell.text_of(row.name), Cell.text_of(row.parent), Cell(row.calls, str(row.calls)),
             *_figures(row), Cell.of(row.self_ms, units.milliseconds), *_work(row)]
            for model, result in found for row in result.modules]
    return Table("breakdown_modules", "Tier 3: measured time per module",
                 [Column("model"), Column("module"), Column("parent"), Column("operator calls"), *FIGURE_COLUMNS,
                  Column("self", "ms"), *WORK_COLUMNS], rows,
                 ["a module's time is its operators' and its children's; self: its own operators'; the top rows "
                  "and the pseudo-rows add up to the measured call"])


def unattributed_table(run: Any) -> Table | None:
    """Device work the profiler recorded without an operator that launched it, by kernel."""
    rows = [[Cell.text_of(model.name), Cell.text_of(row.name), Cell(row.calls, str(row.calls)),
             Cell.of(row.time_ms, units.milliseconds)]
            for model, result in _models(run) for row in result.unattributed]
    if not rows:
        return None
    return Table("breakdown_unattributed", "Tier 3: device work without an operator",
                 [Column("model"), Column("kernel"), Column("calls"), Column("time", "ms")], rows)


# -- what rpx compare puts side by side --------------------------------------------------------------------------------


def breakdown_figures(models: Sequence[Any]) -> Iterable[Figure]:
    """The busy and idle time, then each operator's time, for every operator any of the models ran."""
    found = [Figure("breakdown busy", _total("busy_ms"), units.milliseconds, (SHAPES, PRECISION), measured=True,
                    noise=_noise),
             Figure("breakdown idle", _total("idle_ms"), units.milliseconds, (SHAPES, PRECISION), measured=True,
                    noise=_noise)]
    names = dict.fromkeys(row.name for model in models if (result := ok_result(model, STAGE))
                          for row in result.operators if row.name not in PSEUDO_ROWS)
    found += [Figure(f"time in {name}", _operator(name), units.milliseconds, (SHAPES, PRECISION), measured=True,
                     noise=_noise) for name in names]
    return found


def _total(name: str) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, STAGE)
        return None if result is None else field(result, name)

    return read


def _operator(name: str) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, STAGE)
        rows = [] if result is None else [row for row in result.operators if row.name == name]
        return sum(row.time_ms for row in rows) if rows else None

    return read


def _noise(model: Any) -> Noise | None:
    """One profiled call per figure: the reference calls' spread, and at least OPERATOR_BAND."""
    result = ok_result(model, STAGE)
    return None if result is None else Noise(spread=field(result, "call_spread"), floor=OPERATOR_BAND)


# -- the chart ---------------------------------------------------------------------------------------------------------


def breakdown_chart(run: Any) -> Any:
    """Each operator's measured FLOP/s beside its bound at its own intensity, one panel per model with a bound."""
    plt = pyplot()
    found = [(model, result) for model, result in _models(run) if result.peak_tflops and result.bandwidth_gb_s]
    if not found:
        raise RpxError("the results file has no breakdown measured on a GPU with a bound to plot")
    figure, axes = plt.subplots(1, len(found), figsize=(6.4 * len(found), 6.4), squeeze=False)
    for ax, (model, result) in zip(axes[0], found):
        _panel(ax, model, result)
    figure.tight_layout()
    return figure


def _panel(ax: Any, model: Any, result: Any) -> None:
    peak, bandwidth = result.peak_tflops * 1e12, result.bandwidth_gb_s * 1e9
    points = [(row, row.flops / row.bytes) for row in result.operators
              if row.counted and row.flops and row.bytes and row.time_ms > 0 and row.name not in PSEUDO_ROWS]
    points = sorted(points, key=lambda item: -item[0].time_ms)[:12]
    intensities = [x for _, x in points] + [peak / bandwidth]
    low, high = min(intensities) / 4, max(intensities) * 20
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, bandwidth * x) for x in xs], color="gray", linewidth=1.5,
            label=f"{result.gpu} {result.precision} roof")
    seen = set()
    for row, x in points:
        roof = min(peak, bandwidth * x)
        measured = row.flops / (row.time_ms / 1e3)
        colour = COLOURS.get(row.limited_by or "", "gray")
        label = f"limited by {row.limited_by}" if row.limited_by not in seen else None
        seen.add(row.limited_by)
        ax.plot([x, x], [measured, roof], color=colour, linewidth=0.8, alpha=0.6)
        ax.plot([x], [roof], marker="_", color=colour, markersize=10, linestyle="none")
        ax.plot([x], [measured], marker="o", color=colour, markersize=4 + 12 * row.share, linestyle="none",
                label=label)
        ax.annotate(row.name.removeprefix("aten."), (x, measured), fontsize=6, alpha=0.8, xytext=(3, -9),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte, counted)")
    ax.set_ylabel("FLOP/s: measured (dot) and bound (dash)")
    ax.set_title(f"{model.name}: operators against their bounds")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)


MEASURE_BREAKDOWN = Stage(
    STAGE,
    "where one call's time goes: each operator and module measured against its own bound",
    result=BreakdownResult,
    options=BreakdownOptions,
    after=("measure_latency",),
    executes=True,
    measures=True,
    summary=breakdown_fields,
    tables=(TableView("breakdown", top_rows), TableView("breakdown_operators", operators_table, shown="on_request"),
            TableView("breakdown_calls", calls_table, shown="on_request"),
            TableView("breakdown_modules", modules_table, shown="on_request"),
            TableView("breakdown_unattributed", unattributed_table, shown="on_request")),
    figures=breakdown_figures,
    charts=(ChartView("breakdown", "Operators against their bounds", breakdown_chart),),
    doc="Profile one call (after warm-up, and reference calls timed without the profiler) and attribute its device "
    "time to the operators and modules that launched it, each beside its counted FLOPs and bytes and its own bound "
    "on the local GPU; the time no operator accounts for is a row of its own, so each table adds up to the "
    "measured call. Runs after measure_latency, so no latency is taken under or after the profiler in one job.",
)
