"""The HTML report: one self-contained file (no network, no CDN) with the tables of ``rpx show`` (sortable, the
per-operator and per-module breakdowns included), the charts as inline SVG, a comparison when several results files
are given, and each file's provenance. Rendered with jinja2 (autoescaped); the sorting is a few lines of inline JS."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rpx_core.show import tables as views
from rpx_core.version import __version__

#: Tables of the report, per results file.
TABLES = (*views.DEFAULT, "operators", "modules", "summary")


def render(runs: Sequence[tuple[str, Any]]) -> str:
    import jinja2

    environment = jinja2.Environment(loader=jinja2.PackageLoader("rpx_core.show", "templates"),
                                     autoescape=True, undefined=jinja2.StrictUndefined)
    files = [_file(label, run) for label, run in runs]
    comparison = None
    if len(runs) > 1:
        from rpx_core.show.compare import compare

        comparison = compare(runs)
    title = ", ".join(label for label, _ in runs)
    return environment.get_template("report.html.j2").render(title=title, files=files, comparison=comparison,
                                                             rpx_version=__version__)


def _file(label: str, run: Any) -> dict[str, Any]:
    charts, notes = _charts(run)
    provenance = run.provenance
    rows = [("rpx", provenance.rpx_version), ("Python", provenance.python), ("schema", str(run.schema_version)),
            ("created", provenance.created), ("finished", provenance.finished or "-"),
            ("spec", provenance.spec_path or "-"), ("spec hash", provenance.spec_hash),
            ("command", provenance.command or "-"),
            ("plugins", ", ".join(f"{p.name} ({p.distribution} {p.version})" for p in provenance.plugins) or "-"),
            *(("system", line.removeprefix("system: ")) for line in views.footer(run)[:-1])]
    return {"label": label, "tables": views.tables(run, TABLES), "charts": charts, "chart_notes": notes,
            "provenance": rows}


def _charts(run: Any) -> tuple[list[dict[str, str]], list[str]]:
    """The run's charts as inline SVG; without matplotlib the report says so instead."""
    from rpx_core.errors import RpxError
    from rpx_core.show import charts

    try:
        charts.pyplot()
    except RpxError as exc:
        return [], [f"no charts: {exc}"]
    made = []
    for kind, title in (("roofline", "Roofline"), ("batch", "Batch search")):
        try:
            made.append({"title": title, "svg": charts.svg_text(charts.figure_for(run, kind))})
        except RpxError:
            continue  # the run has no such stage: no chart, nothing to say
    return made, []
