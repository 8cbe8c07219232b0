"""What a results file can be shown as: the tables and charts every stage declares (``Stage.tables``,
``Stage.charts``, in the order the stages are registered), then those that belong to no stage: a sweep's table and
chart (rpx_core.show.sweeps), the stages that did not succeed and the flat summary fields (rpx_core.show.tables).
``rpx show``, ``rpx plot``, the report and the end of ``rpx run`` all ask here, so a plugin's stage is shown
everywhere with no change to rpx."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rpx_core.errors import RpxError, did_you_mean
from rpx_core.show.charts import ChartView
from rpx_core.show.sweeps import sweep_views
from rpx_core.show.tables import GENERAL, Table, TableView


def table_views(stages: Mapping[str, Any]) -> dict[str, TableView]:
    """Every table the ``stages`` (name -> Stage declaration, in registration order) declare, then the sweep table
    and the general ones, by name. Two declarations of one table name: the first stage's wins (the registry reports
    stage clashes)."""
    found: dict[str, TableView] = {}
    for stage in stages.values():
        for view in stage.tables:
            found.setdefault(view.name, view)
    for view in (sweep_views(stages)[0], *GENERAL):
        found.setdefault(view.name, view)
    return found


def default_names(stages: Mapping[str, Any]) -> tuple[str, ...]:
    """The tables ``rpx show`` prints without ``--table`` (and ``rpx run`` ends with)."""
    return tuple(name for name, view in table_views(stages).items() if view.shown == "always")


def tables(run: Any, stages: Mapping[str, Any], names: Iterable[str] | None = None) -> list[Table]:
    """The tables of ``run`` that have something to show, in declaration order; ``names`` picks some (default: those
    shown always)."""
    known = table_views(stages)
    wanted = default_names(stages) if names is None else tuple(names)
    return [table for name in wanted if (table := known[name].build(run)) is not None]


def chart_views(stages: Mapping[str, Any]) -> dict[str, ChartView]:
    """Every chart the stages declare, by name, in the stages' order, then the sweep chart."""
    found: dict[str, ChartView] = {}
    for stage in stages.values():
        for view in stage.charts:
            found.setdefault(view.name, view)
    found.setdefault("sweep", sweep_views(stages)[1])
    return found


def figure_for(run: Any, kind: str, stages: Mapping[str, Any]) -> Any:
    """The chart ``kind`` of ``run``; an unknown kind is one line naming the known ones."""
    views = chart_views(stages)
    if kind not in views:
        raise RpxError(f"no chart kind {kind!r}{did_you_mean(kind, views)}; the stages declare: {', '.join(views)}")
    return views[kind].draw(run)
