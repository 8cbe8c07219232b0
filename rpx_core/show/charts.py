"""Charts of a results file with matplotlib (the optional extra ``rpx[plot]``).

Which charts exist is not known here: a stage declares its own (``Stage.charts``: :class:`ChartView` objects), and
:mod:`rpx_core.show.declared` gathers them for ``rpx plot --kind NAME`` and the report. This module holds what every chart shares: importing matplotlib
lazily (headless), the label text drawn from data (never parsed as markup), and writing PNG, SVG or inline SVG.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from rpx_core.errors import RpxError
from rpx_core.results.safe_write import Input, atomic_write
from rpx_core.show.text import shown


@attrs.frozen
class ChartView:
    """A chart a stage declares: ``draw(run)`` returns a matplotlib figure, or raises RpxError saying what the file
    lacks for it (the report then leaves it out). ``name`` is ``rpx plot --kind NAME``; ``title`` heads it."""

    name: str
    title: str
    draw: Callable[[Any], Any]


def pyplot() -> Any:
    """matplotlib's pyplot on a file-only backend, or one line saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise RpxError("charts need matplotlib: pip install 'rpx[plot]'") from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


#: Colours by kind ("gpu", "model") and name, assigned once per process: a GPU has one colour on every chart.
_COLOURS: dict[str, dict[str, str]] = {}
PALETTE = tuple(f"C{index}" for index in range(10))


def assign_colours(kind: str, names: Iterable[str]) -> None:
    """Give ``names`` their colours in sorted order (a report does this for every GPU and model of its files first,
    so the colours do not depend on which chart is drawn first)."""
    for name in sorted(set(names)):
        colour(kind, name)


def colour(kind: str, name: str) -> str:
    """The colour of ``name`` (a GPU, a model) on every chart of this process: the next free one at first use."""
    taken = _COLOURS.setdefault(kind, {})
    if name not in taken:
        taken[name] = PALETTE[len(taken) % len(PALETTE)]
    return taken[name]


def plain(text: str) -> str:
    """``text`` as matplotlib draws it literally: a name from data is never read as mathtext (``$1_$2``), and a
    control character in it is drawn as its escape (rpx_core.show.text), as on the terminal."""
    return shown(text).replace("$", r"\$")


def save(figure: Any, path: Path, inputs: Iterable[Input] = ()) -> None:
    """PNG or SVG by the suffix, written atomically and never over one of ``inputs`` (rpx_core.results.safe_write)."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise RpxError(f"{path}: the chart file must end in .png or .svg")
    out = io.BytesIO()
    figure.savefig(out, format=suffix[1:], dpi=120)
    pyplot().close(figure)
    atomic_write(path, out.getvalue(), inputs)


def svg_text(figure: Any) -> str:
    """The figure as an inline SVG element (for the HTML report)."""
    out = io.StringIO()
    figure.savefig(out, format="svg")
    pyplot().close(figure)
    text = out.getvalue()
    return text[text.index("<svg"):]
