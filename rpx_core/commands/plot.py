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
    from rpx_core.commands.common import load_results as load
    from rpx_core.errors import RpxError
    from rpx_core.show import charts

    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise RpxError(f"{output}: the chart file must end in .png or .svg")
    figure = charts.figure_for(load(args.results), args.kind)
    charts.save(figure, output)
    print(f"chart: {output}")
    return 0
