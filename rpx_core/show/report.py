"""The HTML report: one self-contained file (no network, no CDN) with the tables of ``rpx show`` (sortable, the
per-operator and per-module breakdowns and a sweep's table included), the charts as inline SVG, a comparison when
several results files are given (first, since that is what several files are for), each file's provenance, and a
table of contents. Rendered with jinja2 (autoescaped); the sorting is a few lines of inline JS.

Tables fit the page: text cells wrap, and a table with more columns than a page holds (the flat summary fields) is
shown turned (its columns as rows). Charts share one colour per GPU and per model across the whole report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rpx_core.show import declared
from rpx_core.show import tables as views
from rpx_core.version import __version__

#: A table with more columns than this is shown turned, its columns as rows (it would not fit a 1280-pixel page).
MAX_COLUMNS = 14


def render(runs: Sequence[tuple[str, Any]], stages: Mapping[str, Any]) -> str:
    """The report of ``runs`` (label, results) with the tables, figures and charts ``stages`` declare."""
    import jinja2

    environment = jinja2.Environment(loader=jinja2.PackageLoader("rpx_core.show", "templates"),
                                     autoescape=True, undefined=jinja2.StrictUndefined)
    _assign_colours(runs, stages)
    files = [_file(index, label, run, stages) for index, (label, run) in enumerate(runs, start=1)]
    comparison = None
    if len(runs) > 1:
        from rpx_core.show.compare import compare

        comparison = _fitted(compare(runs, stages))
    title = ", ".join(label for label, _ in runs)
    return environment.get_template("report.html.j2").render(title=title, files=files, comparison=comparison,
                                                             rpx_version=__version__)


def _file(index: int, label: str, run: Any, stages: Mapping[str, Any]) -> dict[str, Any]:
    charts, notes = _charts(run, stages)
    provenance = run.provenance
    rows = [("rpx", provenance.rpx_version), ("Python", provenance.python), ("schema", str(run.schema_version)),
            ("created", provenance.created), ("finished", provenance.finished or "-"),
            ("spec", provenance.spec_path or "-"), ("spec hash", provenance.spec_hash),
            ("command", provenance.command or "-"),
            ("plugins", ", ".join(f"{p.name} ({p.distribution} {p.version})" for p in provenance.plugins) or "-"),
            *(("system", line.removeprefix("system: ")) for line in views.footer(run, stages)[:-1])]
    tables = [_fitted(table) for table in declared.tables(run, stages, declared.table_views(stages))]
    return {"id": f"file-{index}", "label": label, "tables": tables, "charts": charts, "chart_notes": notes,
            "provenance": rows}


def _fitted(table: views.Table) -> views.Table:
    """``table`` as it fits the page: turned (one row per column, one column per row) when it has too many columns."""
    if len(table.columns) <= MAX_COLUMNS or len(table.rows) + 1 > MAX_COLUMNS:
        return table
    first, *rest = range(len(table.columns))
    heads = [views.Column(table.columns[first].title)] + [views.Column(row[first].text) for row in table.rows]
    rows = [[views.Cell.text_of(table.columns[index].raw_title), *(row[index] for row in table.rows)] for index in rest]
    return views.Table(table.name, f"{table.title} (turned: one row per column)", heads, rows, table.notes)


def _assign_colours(runs: Sequence[tuple[str, Any]], stages: Mapping[str, Any]) -> None:
    """One colour per GPU and per model across every chart of the report, whichever chart is drawn first."""
    from rpx_core.show import charts
    from rpx_core.show.compare import figures

    models = [model for _, run in runs for model in run.models]
    charts.assign_colours("gpu", (figure.gpu for figure in figures(models, stages) if figure.gpu))
    charts.assign_colours("model", (str((model.coordinates or {}).get("model", model.name)) for model in models))


def _charts(run: Any, stages: Mapping[str, Any]) -> tuple[list[dict[str, str]], list[str]]:
    """The run's charts as inline SVG; without matplotlib the report says so instead."""
    from rpx_core.errors import RpxError
    from rpx_core.show import charts

    try:
        charts.pyplot()
    except RpxError as exc:
        return [], [f"no charts: {exc}"]
    made = []
    for view in declared.chart_views(stages).values():
        try:
            made.append({"name": view.name, "title": view.title, "svg": charts.svg_text(view.draw(run))})
        except RpxError:
            continue  # the run has nothing for this chart: no chart, nothing to say
    return made, []
