"""The HTML report: one self-contained file (no network, no CDN) with the tables of ``rpx show`` (sortable, the
per-operator and per-module breakdowns included), the charts as inline SVG, a comparison when several results files
are given, and each file's provenance. Rendered with jinja2 (autoescaped); the sorting is a few lines of inline JS."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rpx_core.show import tables as views
from rpx_core.version import __version__


def render(runs: Sequence[tuple[str, Any]], stages: Mapping[str, Any]) -> str:
    """The report of ``runs`` (label, results) with the tables, figures and charts ``stages`` declare."""
    import jinja2

    environment = jinja2.Environment(loader=jinja2.PackageLoader("rpx_core.show", "templates"),
                                     autoescape=True, undefined=jinja2.StrictUndefined)
    files = [_file(label, run, stages) for label, run in runs]
    comparison = None
    if len(runs) > 1:
        from rpx_core.show.compare import compare

        comparison = compare(runs, stages)
    title = ", ".join(label for label, _ in runs)
    return environment.get_template("report.html.j2").render(title=title, files=files, comparison=comparison,
                                                             rpx_version=__version__)


def _file(label: str, run: Any, stages: Mapping[str, Any]) -> dict[str, Any]:
    charts, notes = _charts(run, stages)
    provenance = run.provenance
    rows = [("rpx", provenance.rpx_version), ("Python", provenance.python), ("schema", str(run.schema_version)),
            ("created", provenance.created), ("finished", provenance.finished or "-"),
            ("spec", provenance.spec_path or "-"), ("spec hash", provenance.spec_hash),
            ("command", provenance.command or "-"),
            ("plugins", ", ".join(f"{p.name} ({p.distribution} {p.version})" for p in provenance.plugins) or "-"),
            *(("system", line.removeprefix("system: ")) for line in views.footer(run, stages)[:-1])]
    return {"label": label, "tables": views.tables(run, stages, views.views(stages)), "charts": charts,
            "chart_notes": notes,
            "provenance": rows}


def _charts(run: Any, stages: Mapping[str, Any]) -> tuple[list[dict[str, str]], list[str]]:
    """The run's charts as inline SVG; without matplotlib the report says so instead."""
    from rpx_core.errors import RpxError
    from rpx_core.show import charts

    try:
        charts.pyplot()
    except RpxError as exc:
        return [], [f"no charts: {exc}"]
    made = []
    for view in charts.chart_views(stages).values():
        try:
            made.append({"title": view.title, "svg": charts.svg_text(view.draw(run))})
        except RpxError:
            continue  # the run has no such stage: no chart, nothing to say
    return made, []
