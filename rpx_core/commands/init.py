"""``rpx init [MODEL] [--input 1x128] [-o spec.toml]``: write a commented starter spec for one model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


def register(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    parser = command("init", "write a commented starter spec for a model")
    parser.add_argument("model", nargs="?", help="'pkg.module:callable', 'model.py[:callable]' or a named model such "
                                                  "as 'hf:gpt2' (default: a tiny CNN from rpx's zoo)")
    parser.add_argument("--input", metavar="SHAPE", help="input shape, e.g. 1x128 (hf: batch x sequence)")
    parser.add_argument("-o", "--output", default="spec.toml", help="spec file to write (default: spec.toml)")
    parser.add_argument("--force", action="store_true", help="overwrite the file if it exists (never the model's "
                                                              "own files or anything else rpx reads)")
    parser.set_defaults(handler=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import checked_output, load_plugins
    from rpx_core.errors import RpxError
    from rpx_core.registry.sources import parse_shape
    from rpx_core.results.safe_write import atomic_write
    from rpx_core.show.text import echo
    from rpx_core.spec.inputs import source_inputs
    from rpx_core.spec.starter import relocate, render, spec_data

    path = Path(args.output)
    shape = parse_shape(args.input) if args.input else None
    data = spec_data(args.model, shape)
    plugins = load_plugins(args, tolerant=True)
    model = source_inputs(data["models"][0]["source"], "the model", ".", plugins.model_sources())
    inputs = checked_output(path, plugins, model)
    if path.exists() and not args.force:
        raise RpxError(f"{path}: already exists; choose another file with -o, or add --force to overwrite it")
    atomic_write(path, render(relocate(data, path.parent)), inputs)
    echo(f"wrote {path}; check it with `rpx validate {path}`, run it with `rpx run {path}`")
    return 0
