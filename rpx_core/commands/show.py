"""``rpx show RESULTS``: a saved run as tables, on the terminal or as Markdown, CSV or JSON."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rpx_core.errors import RpxError


def register(command: Any) -> None:
    show = command("show", "print a results file as tables (terminal, markdown, csv or json)")
    show.add_argument("results", help="a results file written by `rpx run` (TOML or JSON)")
    show.add_argument("--format", choices=("table", "markdown", "csv", "json"), default="table",
                      help="table (terminal), markdown, csv (one table: --table, default summary) or json")
    show.add_argument("--table", action="append", metavar="NAME",
                      help="only these tables (repeatable): a table a stage declares, or sweep, problems, summary; "
                           "an unknown name lists every one; default: every table but the long breakdowns")
    show.set_defaults(handler=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import declared_stages, load_plugins, load_results

    plugins = load_plugins(args, tolerant=True)
    run = load_results(args.results, plugins)
    print(show_text(run, declared_stages(plugins), args.format, args.table, sys.stdout), end="")
    return 0


def show_text(run: Any, stages: dict[str, Any], fmt: str, names: list[str] | None = None,
              terminal: Any = None) -> str:
    """The run in ``fmt``; csv takes exactly one table (default: the flat summary fields). With ``terminal`` (a
    stream), the table format is written straight to it (in colour when it is a terminal) and "" returned."""
    import io

    from rpx_core.show import declared
    from rpx_core.show import formats as render
    from rpx_core.show import tables as views

    known = declared.table_views(stages)
    unknown = [name for name in names or () if name not in known]
    if unknown:
        from rpx_core.errors import did_you_mean

        raise RpxError(f"--table: no table {unknown[0]!r}{did_you_mean(unknown[0], known)}; "
                       f"tables: {', '.join(known)}")
    if fmt == "csv":
        if names and len(names) > 1:
            raise RpxError("--format csv writes one table; give one --table (or use --format json for several)")
        name = names[0] if names else "summary"
        table = known[name].build(run)
        if table is None:
            raise RpxError(f"the results file has no figures for table {name!r}")
        return render.csv_text(table)
    tables = declared.tables(run, stages, names)
    footer = views.footer(run, stages)
    if fmt == "markdown":
        return render.markdown(tables, footer)
    if fmt == "json":
        return render.json_text(tables, footer) + "\n"
    out = terminal if terminal is not None else io.StringIO()
    render.terminal(tables, footer, out)
    return "" if terminal is not None else out.getvalue()
