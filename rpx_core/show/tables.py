"""A results file as tables people read: what ``rpx show`` prints, ``rpx report`` renders and ``rpx run`` ends with.

Each table is data first (:class:`Table`: columns, rows of :class:`Cell` holding the raw figure and its text in human
units, see :mod:`rpx_core.show.units`), so one builder serves the terminal, Markdown, CSV, JSON and HTML. Raw values
keep the results files' units (ms, bytes, FLOPs, samples/s), named by each :class:`Column`'s ``unit``. Figures a stage
could not produce are ``-`` (never zero); a measured figure whose samples were noisy or partial carries a mark,
explained in the notes.

Which tables exist is not known here: every stage declares its own (``Stage.tables``, a tuple of :class:`TableView`),
built-in stages exactly like a plugin's, and :mod:`rpx_core.show.declared` gathers them. Only the tables that belong
to no stage live here: the stages that did not succeed, and the flat summary fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs

from rpx_core.show import units


@attrs.frozen
class Cell:
    """One figure: ``value`` raw (a number in the column's unit, a string, or None), ``text`` as shown."""

    value: Any
    text: str

    @classmethod
    def of(cls, value: Any, fmt: Callable[[Any], str] = str, mark: str = "") -> Cell:
        if value is None:
            return cls(None, units.MISSING)
        return cls(value, fmt(value) + mark)

    @classmethod
    def text_of(cls, value: Any) -> Cell:
        """A cell showing ``value`` as it is (a name, a word): raw and text alike."""
        return cls(value, units.MISSING if value is None else str(value))


@attrs.frozen
class Column:
    """A column: ``title`` as people read it, and ``unit``, the unit of its raw values (CSV and JSON name it); None
    for text and plain counts. A cell's text carries its own human unit (``159 µs``), so a title names no unit."""

    title: str
    unit: str | None = None

    @property
    def raw_title(self) -> str:
        """The title with the raw values' unit, as CSV and JSON write it: ``p50 [ms]``."""
        return f"{self.title} [{self.unit}]" if self.unit else self.title


def _columns(columns: Iterable[Column | str]) -> tuple[Column, ...]:
    return tuple(column if isinstance(column, Column) else Column(column) for column in columns)


def _rows(rows: Iterable[Iterable[Cell]]) -> tuple[tuple[Cell, ...], ...]:
    return tuple(tuple(row) for row in rows)


@attrs.frozen
class Table:
    """A named table: ``name`` for ``--table`` and file names, ``title`` for people, ``columns`` (a title alone is a
    column without a unit), ``rows`` of cells, ``notes`` printed under it (conventions, marks, skipped figures)."""

    name: str
    title: str
    columns: tuple[Column, ...] = attrs.field(converter=_columns)
    rows: tuple[tuple[Cell, ...], ...] = attrs.field(converter=_rows)
    notes: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def titles(self) -> tuple[str, ...]:
        return tuple(column.title for column in self.columns)

    def column(self, title: str) -> list[Any]:
        """The raw values of the column titled ``title``."""
        index = self.titles.index(title)
        return [row[index].value for row in self.rows]


@attrs.frozen
class TableView:
    """A table a stage declares (``Stage.tables``): ``build(run)`` makes it from a whole results file, or returns None
    when the file has nothing for it. ``shown``: "always" (``rpx show``, the report and the end of ``rpx run``) or
    "on_request" (``rpx show --table NAME`` and the report only: long breakdowns)."""

    name: str
    build: Callable[[Any], Table | None]
    shown: Literal["always", "on_request"] = attrs.field(default="always",
                                                          validator=attrs.validators.in_(("always", "on_request")))


def ok_result(model: Any, stage: str) -> Any:
    """The result of ``stage`` for ``model`` if it succeeded, else None."""
    record = model.stages.get(stage)
    return record.result if record is not None and record.status == "ok" else None


def run_result(run: Any, stage: str) -> Any:
    """The result of the run-scoped ``stage`` if it succeeded, else None."""
    record = run.run_stages.get(stage)
    return record.result if record is not None and record.status == "ok" else None


def field(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a typed result or of plain data (a stage no loaded plugin declares, or an older file)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


# -- tables that belong to no stage ------------------------------------------------------------------------------------


def stage_problems(run: Any) -> Table | None:
    """Stages that did not succeed, with the reason: nothing vanishes silently."""
    rows = [[Cell(model.name, model.name), Cell(stage, stage), Cell(record.status, record.status.replace("_", " ")),
             Cell(record.error, (record.error or "").splitlines()[0] if record.error else "")]
            for model in run.models for stage, record in model.stages.items() if record.status != "ok"]
    rows += [[Cell("<run>", "<run>"), Cell(stage, stage), Cell(record.status, record.status.replace("_", " ")),
              Cell(record.error, (record.error or "").splitlines()[0] if record.error else "")]
             for stage, record in run.run_stages.items() if record.status != "ok"]
    if not rows:
        return None
    return Table("problems", "Stages that did not succeed", ["model", "stage", "status", "reason"], rows)


def summary(run: Any) -> Table | None:
    """The flat summary fields of every model (the results file's ``summary`` tables), one column per field, in the
    files' own units (the field name says which)."""
    models = [model for model in run.models if model.summary]
    if not models:
        return None
    fields: list[str] = []
    for model in models:
        fields += [key for key in model.summary if key not in fields]
    rows = [[Cell(model.name, model.name),
             *(Cell.of(model.summary.get(key), lambda v: units.significant(v, 4) if isinstance(v, float) else str(v))
               for key in fields)] for model in models]
    return Table("summary", "Summary fields (units in the names: _ms, _gb, _m = millions, _g = billions)",
                  ["model", *fields], rows)


#: Tables that belong to no stage, after the stages' own: (name, builder, shown).
GENERAL = (TableView("problems", stage_problems), TableView("summary", summary, shown="on_request"))


def footer(run: Any, stages: Mapping[str, Any]) -> list[str]:
    """Lines under the tables: what the stages say about the whole run (the machine, from the system card), then
    provenance."""
    lines = [line for stage in stages.values() if stage.footer is not None for line in stage.footer(run)]
    provenance = run.provenance
    lines.append(f"rpx {provenance.rpx_version}, Python {provenance.python}, schema {run.schema_version}; "
                 f"created {provenance.created}; spec {provenance.spec_hash[:12]}")
    return lines
