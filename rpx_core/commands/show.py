"""``rpx show RESULTS``: a saved run as tables, on the terminal or as Markdown, CSV or JSON."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rpx_core.errors import RpxError

#: Table names (rpx_core.show.tables.BUILDERS, checked by a test): listed here so `rpx --help` imports no table code.
TABLES = ("tier1", "roofline", "latency", "throughput", "batch_search", "uncounted", "problems", "operators",
          "modules", "summary")


def register(command: Any) -> None:
    show = command("show", "print a results file as tables (terminal, markdown, csv or json)")
    show.add_argument("results", help="a results file written by `rpx run` (TOML or JSON)")
    show.add_argument("--format", choices=("table", "markdown", "csv", "json"), default="table",
                      help="table (terminal), markdown, csv (one table: --table, default summary) or json")
    show.add_argument("--table", action="append", choices=TABLES, metavar="NAME",
                      help=f"only these tables (repeatable): {', '.join(TABLES)}; default: all but operators, "
                           "modules and summary")
    show.set_defaults(handler=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import load_results as load
    from rpx_core.show import formats as render
    from rpx_core.show import tables as views

    run = load(args.results)
    if args.format == "table":  # straight to the terminal, in colour when it is one
        render.terminal(views.tables(run, args.table or views.DEFAULT), views.footer(run), sys.stdout)
    else:
        print(show_text(run, args.format, args.table), end="")
    return 0


def show_text(run: Any, fmt: str, names: list[str] | None = None) -> str:
    """The run in ``fmt``; csv takes exactly one table (default: the flat summary fields)."""
    import io

    from rpx_core.show import formats as render
    from rpx_core.show import tables as views

    if fmt == "csv":
        if names and len(names) > 1:
            raise RpxError("--format csv writes one table; give one --table (or use --format json for several)")
        name = names[0] if names else "summary"
        table = views.BUILDERS[name](run)
        if table is None:
            raise RpxError(f"the results file has no figures for table {name!r}")
        return render.csv_text(table)
    tables = views.tables(run, names or views.DEFAULT)
    footer = views.footer(run)
    if fmt == "markdown":
        return render.markdown(tables, footer)
    if fmt == "json":
        return render.json_text(tables, footer) + "\n"
    out = io.StringIO()
    render.terminal(tables, footer, out)
    return out.getvalue()
