"""``rpx compare A B [C ...]``: the same models across results files, with ratios and verdicts (rpx_core.show.compare)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(command: Any) -> None:
    compare = command("compare", "compare the same models across results files (ratios, improved / regressed)")
    compare.add_argument("results", nargs="+", metavar="RESULTS", help="two or more results files; ratios are to the first")
    compare.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    compare.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import declared_stages, load_plugins, load_results
    from rpx_core.errors import RpxError
    from rpx_core.show import formats as render
    from rpx_core.show.compare import compare

    if len(args.results) < 2:
        raise RpxError("rpx compare needs at least two results files")
    plugins = load_plugins(args, tolerant=True)
    table = compare([(path, load_results(path, plugins)) for path in args.results], declared_stages(plugins))
    if args.format == "markdown":
        print(render.markdown([table], []), end="")
    elif args.format == "json":
        print(render.json_text([table], []))
    else:
        render.terminal([table], [], sys.stdout)
    return 0
