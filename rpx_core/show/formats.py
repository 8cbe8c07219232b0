"""Tables (:mod:`rpx_core.show.tables`) written out: a terminal (rich), Markdown for papers, CSV for spreadsheets, JSON for
scripts. Text formats show the human-unit text; CSV and JSON carry the raw figures in the columns' units. Text from
data is written as text (rpx_core.show.text: no terminal escape sequence passes; JSON escapes them itself)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any, TextIO

from rpx_core.show.tables import Table
from rpx_core.show.text import shown

#: The line width for a file or a pipe: wide enough that no cell or note is ever wrapped (lines keep their own length).
UNWRAPPED = 1000


def terminal(tables: Sequence[Table], footer: Sequence[str], file: TextIO) -> None:
    """Rich tables at the terminal's width; on a non-terminal ``file`` the same tables as plain text, unwrapped, no
    colour codes."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table as RichTable

    terminal_file = hasattr(file, "isatty") and file.isatty()
    target = file if terminal_file else io.StringIO()
    console = Console(file=target, width=None if terminal_file else UNWRAPPED, highlight=False, soft_wrap=False)

    def text(value: str) -> str:
        return escape(shown(value))

    for table in tables:
        drawn = RichTable(title=text(table.title), box=box.SIMPLE_HEAD, title_justify="left", title_style="bold")
        for index, column in enumerate(table.columns):
            drawn.add_column(text(column.title), justify="left" if _is_text(table, index) else "right")
        for row in table.rows:
            drawn.add_row(*(text(cell.text) for cell in row))
        console.print(drawn)
        for note in table.notes:
            console.print(f"  [dim]{text(note)}[/dim]")
        console.print()
    for line in footer:
        console.print(f"[dim]{text(line)}[/dim]")
    if not terminal_file:  # a file or a pipe: no padding to the console's width
        file.write("\n".join(line.rstrip() for line in target.getvalue().splitlines()) + "\n")


def _is_text(table: Table, index: int) -> bool:
    return all(not isinstance(row[index].value, (int, float)) or isinstance(row[index].value, bool)
               for row in table.rows)


def markdown(tables: Sequence[Table], footer: Sequence[str]) -> str:
    """GitHub-flavoured pipe tables, each under a heading, notes as a list."""
    parts = []
    for table in tables:
        lines = [f"### {shown(table.title)}", "", _md_row(column.title for column in table.columns),
                 "|" + "|".join("---" if _is_text(table, i) else "---:" for i in range(len(table.columns))) + "|"]
        lines += [_md_row(cell.text for cell in row) for row in table.rows]
        lines += [""] + [f"- {shown(note)}" for note in table.notes] if table.notes else []
        parts.append("\n".join(lines))
    if footer:
        parts.append("\n".join(f"_{shown(line)}_  " for line in footer))
    return "\n\n".join(parts) + "\n"


def _md_row(cells: Any) -> str:
    return "| " + " | ".join(shown(cell).replace("|", "\\|") for cell in cells) + " |"


def csv_text(table: Table) -> str:
    """One table as CSV: raw figures (unit in the column name), the absent ones empty."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([shown(column.raw_title) for column in table.columns])
    for row in table.rows:
        writer.writerow(["" if cell.value is None else _csv_value(cell.value) for cell in row])
    return out.getvalue()


def _csv_value(value: Any) -> Any:
    if isinstance(value, list):
        return " x ".join(map(str, value))
    return shown(value) if isinstance(value, str) else value


def json_text(tables: Sequence[Table], footer: Sequence[str]) -> str:
    """Every table as ``{name: {title, columns, rows (raw values), notes}}`` plus the footer lines."""
    data = {table.name: {"title": table.title, "columns": [column.raw_title for column in table.columns],
                         "rows": [[cell.value for cell in row] for row in table.rows], "notes": list(table.notes)}
            for table in tables}
    return json.dumps({"tables": data, "footer": list(footer)}, indent=2)
