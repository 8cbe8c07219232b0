"""Text from data as it is shown: names from a spec, a results file, a GPU pack or a plugin, and the messages that
quote them, reach a terminal as characters to read, never as instructions to it.

Every surface that writes such text (the tables in every format, ``rpx run``'s progress lines, ``rpx plugins``,
``rpx gpus``, ``rpx backends``, error lines) passes it through :func:`shown`: a character a terminal would act on
rather than display (ESC, which starts ANSI and OSC sequences, and every other C0 or C1 control, DEL,
bidirectional overrides and other invisible format characters, line separators) is written as its Python escape
(``\\x1b``, ``\\u202e``). Charts never parse names as markup (rpx_core.show.charts); the HTML report escapes them.
"""

from __future__ import annotations

import sys
from typing import TextIO


def shown(text: object) -> str:
    """``text`` with each character that is not printable written as its escape; printable text is unchanged."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def echo(text: object = "", file: TextIO | None = None) -> None:
    """``print`` for text that quotes data: each line :func:`shown` (the line breaks themselves are kept)."""
    print("\n".join(shown(line) for line in str(text).split("\n")), file=file or sys.stdout)
