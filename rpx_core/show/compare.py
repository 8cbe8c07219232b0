"""The same models across results files, side by side: ratios to the first file, and for each ratio whether it is an
improvement, a regression beyond noise, or not comparable at all (then a numbered note replaces the ratio).

Which figures exist is not known here: every stage declares its own (``Stage.figures``: :class:`Figure` objects) and
the facts they depend on (``Stage.traits``). What makes figures comparable (checked per model and file against the
first file): the results schema (any difference blocks every figure), and each trait a figure names in ``depends``:
the model's input shapes and its precision (known to every model), and a stage's own (the counting convention).

Noise: a counted figure is exact, so any change is real. A measured figure's change is beyond noise when the two
confidence intervals (:class:`Noise`) do not overlap, or, without intervals, when the ratio departs from 1 by more
than the larger relative spread of the two runs (at least the figure's floor); no verdict is drawn when either side
says its measurement is unsound (noisy, too few samples). Lower is better unless the figure says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from rpx_core.show import units
from rpx_core.show.tables import Cell, Table
from rpx_core.types.counts import tensor_text


@attrs.frozen
class Noise:
    """How uncertain one measured figure is: its confidence ``interval`` (the figure's unit), its relative ``spread``
    (e.g. IQR / median), the smallest band worth calling (``floor``), and ``unsound``: why no verdict can be drawn
    from it at all ("noisy", "too few samples"), None when it is sound."""

    interval: tuple[float, float] | None = None
    spread: float | None = None
    floor: float = 0.0
    unsound: str | None = None


@attrs.frozen
class Figure:
    """One comparable figure of a model: how to read it (``read(model)`` -> raw value or None, in ``unit``), how to
    show it, the traits it depends on, and for a measured figure how to read its noise. ``panel`` groups figures a
    sweep chart draws together (the bound on each GPU: panel "bound"), and ``gpu`` names the GPU a figure is about,
    which gives it that GPU's colour on every chart."""

    name: str
    read: Callable[[Any], Any]
    show: Callable[[Any], str]
    depends: tuple[str, ...] = ()
    measured: bool = False
    higher_is_better: bool = False
    noise: Callable[[Any], Noise | None] | None = None
    unit: str | None = None
    panel: str | None = None
    gpu: str | None = None


#: Traits every model has, whatever ran: a figure may name them in ``depends``.
SHAPES, PRECISION, SCHEMA = "input shapes", "precision", "results schema"


def figures(models: Sequence[Any], stages: Mapping[str, Any]) -> list[Figure]:
    """The figures any of ``models`` (one model's results in each file) has, in the stages' order."""
    found = [figure for stage in stages.values() if stage.figures is not None for figure in stage.figures(models)]
    return [figure for figure in found if any(figure.read(model) is not None for model in models)]


# -- what makes two results comparable ---------------------------------------------------------------------------------


def traits(run: Any, model: Any, stages: Mapping[str, Any]) -> dict[str, Any]:
    """The facts a figure may depend on, for one model in one file: the schema, the precision, the input shapes as
    the spec wrote them, then every stage's own (a stage may state the shapes more exactly, e.g. as counted)."""
    spec_model = next((m for m in run.provenance.spec.get("models", []) if m.get("name") == model.name), {})
    found: dict[str, Any] = {
        SCHEMA: run.schema_version,
        PRECISION: model.precision,
        SHAPES: written_inputs(spec_model.get("inputs", [])),
    }
    for stage in stages.values():
        if stage.traits is not None:
            found.update(stage.traits(run, model))
    return found


def written_inputs(inputs: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """A spec's input tables in the one normal form every stage records shapes in ("float32[1,3,32,32]", positional
    then "name=..."), so a shape written by one framework's stage and by the spec compare by meaning."""
    def text(table: Mapping[str, Any]) -> str:
        return tensor_text(table.get("dtype", "float32"), table.get("shape", ()))

    return (*(text(i) for i in inputs if not i.get("name")),
            *(f"{i['name']}={text(i)}" for i in inputs if i.get("name")))


def differences(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    return [key for key in dict.fromkeys([*first, *other]) if first.get(key) != other.get(key)]


def why(trait: str, a: Any, b: Any) -> str:
    """A trait that differs, in words: with both values when they are short."""
    a, b = _short(a), _short(b)
    if len(a) + len(b) <= 120:
        return f"{trait} differ{'' if trait.endswith('s') else 's'} ({a} vs {b})"
    return f"{trait} differ{'' if trait.endswith('s') else 's'}"


# -- verdicts ----------------------------------------------------------------------------------------------------------


def verdict(figure: Figure, base_model: Any, other_model: Any, base: float, other: float) -> str:
    """"same", "improved", "regressed", "within noise" or "not comparable: <why>" for ``other`` against ``base``."""
    if base == other:
        return "same"
    if figure.measured:
        a, b = _noise(figure, base_model), _noise(figure, other_model)
        unsound = a.unsound or b.unsound
        if unsound:
            return f"not comparable: {unsound}"
        if not beyond_noise(a, b, base, other):
            return "within noise"
    better = (other > base) == figure.higher_is_better
    return "improved" if better else "regressed"


def beyond_noise(a: Noise, b: Noise, base: float, other: float) -> bool:
    if a.interval and b.interval:
        return a.interval[1] < b.interval[0] or b.interval[1] < a.interval[0]
    band = max(a.spread or 0.0, b.spread or 0.0, a.floor, b.floor)
    return abs(other / base - 1) > band


def _noise(figure: Figure, model: Any) -> Noise:
    return (figure.noise(model) if figure.noise is not None else None) or Noise()


# -- the table ---------------------------------------------------------------------------------------------------------


def compare(runs: Sequence[tuple[str, Any]], stages: Mapping[str, Any]) -> Table:
    """One row per model and figure: the value in each file, then for each later file its ratio to the first and
    the verdict (or a note number when not comparable)."""
    labels = [label for label, _ in runs]
    letters = [chr(ord("A") + index) for index in range(len(runs))]
    notes = [f"{letter}: {label} ({_origin(run, stages)})" for letter, label, (_, run) in zip(letters, labels, runs)]
    numbered: dict[str, int] = {}
    names = list(dict.fromkeys(model.name for _, run in runs for model in run.models))
    rows = []
    for name in names:
        present = [_model(run, name) for _, run in runs]
        base_run, base_model = runs[0][1], present[0]
        for figure in figures([model for model in present if model is not None], stages):
            row = [Cell(name, name), Cell(figure.name, figure.name)]
            row += [Cell.of(figure.read(model), figure.show) if model is not None else Cell(None, "not in file")
                    for model in present]
            for (_, run), model in zip(runs[1:], present[1:]):
                row += _ratio_cells(figure, stages, (base_run, base_model), (run, model), notes, numbered)
            rows.append(row)
    columns = ["model", "figure", *letters]
    for letter in letters[1:]:
        columns += [f"{letter}/A", f"{letter} vs A"]
    notes.append("lower is better unless the figure is a rate (throughput); measured changes within the noise band "
                 "are not called; counted figures are exact")
    return Table("compare", f"Comparison of {len(runs)} results files (ratios to A)", tuple(columns),
                 tuple(tuple(row) for row in rows), tuple(notes))


def _origin(run: Any, stages: Mapping[str, Any]) -> str:
    """Which rpx and which machine made a file (two machines or two rpx versions are what compare is for)."""
    machine = next((line for stage in stages.values() if stage.footer is not None for line in stage.footer(run)), None)
    return f"rpx {run.provenance.rpx_version}, schema {run.schema_version}" + (f", {machine}" if machine else "")


def _model(run: Any, name: str) -> Any:
    return next((model for model in run.models if model.name == name), None)


def _ratio_cells(figure: Figure, stages: Mapping[str, Any], base: tuple[Any, Any], other: tuple[Any, Any],
                 notes: list[str], numbered: dict[str, int]) -> list[Cell]:
    """The ratio and verdict cells of ``other`` (run, model) against ``base``."""
    (base_run, base_model), (run, model) = base, other
    if base_model is None or model is None:
        return [Cell(None, units.MISSING), Cell(None, "not in both files")]
    first_value, value = figure.read(base_model), figure.read(model)
    if first_value is None or value is None:
        return [Cell(None, units.MISSING), Cell(None, "missing")]
    first, second = traits(base_run, base_model, stages), traits(run, model, stages)
    blocking = [key for key in differences(first, second) if key == SCHEMA or key in figure.depends]
    if blocking:
        text = "not comparable: " + "; ".join(why(key, first.get(key), second.get(key)) for key in blocking)
        number = numbered.setdefault(text, len(numbered) + 1)
        if f"[{number}] {text}" not in notes:
            notes.append(f"[{number}] {text}")
        return [Cell(None, f"n/c [{number}]"), Cell("not comparable", f"not comparable [{number}]")]
    if first_value == 0:
        return [Cell(None, units.MISSING), Cell("same" if value == 0 else None, "same" if value == 0 else "-")]
    ratio = value / first_value
    said = verdict(figure, base_model, model, first_value, value)
    return [Cell(ratio, units.ratio(ratio)), Cell(said, said)]


def _short(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return str(value)
