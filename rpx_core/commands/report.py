"""``rpx report RESULTS [MORE ...] -o report.html``: one self-contained HTML file (rpx_core.show.report)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(command: Any) -> None:
    report = command("report", "write one self-contained HTML report of one or more results files")
    report.add_argument("results", nargs="+", metavar="RESULTS", help="results files; several add a comparison")
    report.add_argument("-o", "--output", required=True, metavar="FILE", help="the report, e.g. report.html")
    report.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import checked_output, declared_stages, load_plugins, load_results
    from rpx_core.errors import RpxError
    from rpx_core.results.safe_write import Input, atomic_write
    from rpx_core.show import report
    from rpx_core.show.text import echo

    output = Path(args.output)
    if output.suffix.lower() not in (".html", ".htm"):
        raise RpxError(f"{output}: the report file must end in .html")
    plugins = load_plugins(args, tolerant=True)
    read = [Input(Path(path), "a results file the report shows") for path in args.results]
    inputs = checked_output(output, plugins, read)
    html = report.render([(path, load_results(path, plugins)) for path in args.results], declared_stages(plugins))
    atomic_write(output, html, inputs)
    echo(f"report: {output}")
    return 0
