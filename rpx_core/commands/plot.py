"""``rpx plot RESULTS -o FILE.png|svg [--kind NAME]``: a chart a stage declares, of a results file
(rpx_core.show.charts)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(command: Any) -> None:
    plot = command("plot", "draw a chart of a results file: the roofline, the batch search, ... (needs rpx[plot])")
    plot.add_argument("results", help="a results file written by `rpx run`")
    plot.add_argument("-o", "--output", required=True, metavar="FILE", help="the chart: .png or .svg")
    plot.add_argument("--kind", metavar="NAME",
                      help="a chart the stages declare (the built-in ones: roofline, batch, breakdown); default: the "
                           "first one")
    plot.set_defaults(handler=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import checked_output, declared_stages, load_plugins, load_results
    from rpx_core.errors import RpxError
    from rpx_core.results.safe_write import Input
    from rpx_core.show import charts, declared
    from rpx_core.show.text import echo

    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise RpxError(f"{output}: the chart file must end in .png or .svg")
    plugins = load_plugins(args, tolerant=True)
    inputs = checked_output(output, plugins, [Input(Path(args.results), "the results file the chart shows")])
    stages = declared_stages(plugins)
    kind = args.kind or next(iter(declared.chart_views(stages)), "")
    figure = declared.figure_for(load_results(args.results, plugins), kind, stages)
    charts.save(figure, output, inputs)
    echo(f"chart: {output}")
    return 0
