"""``rpx plot RESULTS -o FILE.png|svg [--kind roofline|batch]``: a chart of a results file (rpx_core.show.charts)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(command: Any) -> None:
    plot = command("plot", "draw the roofline or the batch-search chart of a results file (needs rpx[plot])")
    plot.add_argument("results", help="a results file written by `rpx run`")
    plot.add_argument("-o", "--output", required=True, metavar="FILE", help="the chart: .png or .svg")
    plot.add_argument("--kind", choices=("roofline", "batch"), default="roofline")
    plot.set_defaults(handler=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import checked_output, load_plugins
    from rpx_core.commands.common import load_results as load
    from rpx_core.errors import RpxError
    from rpx_core.results.safe_write import Input
    from rpx_core.show import charts
    from rpx_core.show.text import echo

    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise RpxError(f"{output}: the chart file must end in .png or .svg")
    read = [Input(Path(args.results), "the results file the chart shows")]
    inputs = checked_output(output, load_plugins(args, tolerant=True), read)
    figure = charts.figure_for(load(args.results), args.kind)
    charts.save(figure, output, inputs)
    echo(f"chart: {output}")
    return 0
