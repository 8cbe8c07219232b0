"""``rpx gpus [NAME] [--pack FILE] [--json]``: the GPU catalogue, or the GPUs a name means, in full.

Names match case- and punctuation-insensitively, by name, alias or unique prefix: ``rpx gpus h100`` shows the two
H100s it could mean; a name nothing begins with is an error listing the closest names. A GPU two packs define without
a ``[choose.gpus]`` entry is shown once per pack, marked as a clash, in the listing, in full view and in the JSON
(``clash``: why it cannot be used as it is), so the command that diagnoses a clash always works. The JSON gives each
precision's figure as data (``tflops``, ``derived``, ``note``, ``sparse_tflops``); the text view explains its marks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from rpx_core.show.text import echo

LEGEND = ("figures: dense peak TFLOP/s per precision (int8: TOPS), at boost clock; bandwidth in GB/s (1 GB = 1e9 "
          "bytes)\n~ after a figure: derived or uncertain, not read off a datasheet; `rpx gpus NAME` says how it "
          "was obtained")


def register(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    parser = command("gpus", "list GPU specs from every pack, or show the GPUs a name means in full")
    parser.add_argument("name", nargs="?", help="a GPU name, alias or the start of one (any case)")
    parser.add_argument("--pack", action="append", default=[], metavar="FILE", help="also load this GPU pack TOML file")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=cmd_gpus)


def cmd_gpus(args: argparse.Namespace) -> int:
    from rpx_core.commands.common import load_plugins
    from rpx_core.errors import RpxError
    from rpx_core.registry.gpus import describe_gpu, gpu_rows

    catalog = load_plugins(args).gpu_catalog([Path(p) for p in args.pack])
    if catalog.problems:  # a pack given with --pack or RPX_GPU_PACKS that does not load: every problem at once
        raise RpxError("\n".join(catalog.problems))
    if args.name:
        found = catalog.described(args.name)
        if not found:
            catalog.get(args.name)  # raises: not recognized, with the closest names
        described = [describe_gpu(gpu, pack, catalog) for pack, gpu in found]
        if args.json:
            print(json.dumps(described[0] if len(described) == 1 else described, indent=2))
            return 0
        if len(found) > 1:
            echo(f"{args.name!r} could mean {len(found)} GPUs:\n")
        echo("\n\n".join("\n".join(describe_lines(data)) for data in described))
        echo(f"\n{LEGEND}")
        return 0
    rows = gpu_rows(catalog)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    echo("\n".join(table_lines(rows)))
    for conflict in catalog.conflicts():
        echo(f"clash: {conflict}")
    echo(f"\n{LEGEND}")
    return 0


def figure(peak: dict[str, Any]) -> str:
    return f"{peak['tflops']:g}{'~' if peak['derived'] else ''}"


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    header = ["GPU", "pack", "memory", "bandwidth", "peaks"]
    body = [[row["name"] + (" (clash)" if row["clash"] else ""), row["pack"], f"{row['memory_gb']:g} GB", f"{row['bandwidth_gb_s']:g} GB/s",
             "  ".join(f"{precision} {figure(peak)}" for precision, peak in row["precisions"].items())]
            for row in rows]
    widths = [max(len(line[column]) for line in [header, *body]) for column in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *body]]


def describe_lines(data: dict[str, Any]) -> list[str]:
    """One GPU in full, as readable lines (lists joined, absent fields left out)."""
    lines = [f"{data['name']}  ({data['vendor']}, {data['segment']})"]
    if data.get("aliases"):
        lines.append(f"  also known as: {', '.join(data['aliases'])}")
    lines.append(f"  memory: {data['memory_gb']:g} GB {data['memory_type']}, {data['bandwidth_gb_s']:g} GB/s")
    lines.append("  dense peaks:")
    width = max(len(precision) for precision in data["peaks"])
    for precision, peak in data["peaks"].items():
        unit = "TOPS" if precision == "int8" else "TFLOP/s"
        sparse = f" (2:4 sparse: {peak['sparse_tflops']:g})" if peak.get("sparse_tflops") else ""
        note = f" — {peak['note']}" if peak.get("note") else ""
        lines.append(f"    {precision:<{width}}  {figure(peak)} {unit}{sparse}{note}")
    if data.get("notes"):
        lines.append(f"  notes: {data['notes']}")
    lines.append(f"  source: {data['source']}")
    lines.append(f"  pack: {data['pack']}, version {data['pack_version']} ({data['pack_source']})")
    if data.get("clash"):
        lines.append(f"  clash: {data['clash']}")
    return lines
