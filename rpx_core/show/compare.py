"""The same models across results files, side by side: ratios to the first file, and for each ratio whether it is an
improvement, a regression beyond noise, or not comparable at all (then a numbered note replaces the ratio).

What makes figures comparable (checked per model and file against the first file):

* schema version of the results file: any difference makes every figure not comparable;
* the model's inputs (shapes and dtypes as counted, else as the spec wrote them): every figure depends on them;
* counting convention (the ``count_flops`` options and the counter's stated conventions): FLOPs, bytes and bounds;
* precision: bytes, roofline bounds and measured figures (parameter and FLOP counts do not depend on it).

Noise: a latency change is beyond noise when the medians' confidence intervals (``p50_interval_ms``) do not overlap,
or, without intervals, when the ratio departs from 1 by more than the larger spread (IQR / median) of the two runs;
throughput uses the same spread band, at least 5%. Counted figures are exact: any change is real. Lower is better
for everything except throughput.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from rpx_core.show import units
from rpx_core.show.tables import Cell, Table, ok_result

#: The smallest noise band for throughput (no interval is measured for it).
THROUGHPUT_BAND = 0.05


@attrs.frozen
class Figure:
    """One comparable figure of a model: how to read it, how to show it, what it depends on."""

    name: str
    read: Callable[[Any], Any]  # ModelResult -> raw value or None
    show: Callable[[Any], str]
    depends: tuple[str, ...]  # of "shapes", "convention", "precision"
    kind: str = "counted"  # "counted" (exact), "latency" or "throughput" (measured)
    higher_is_better: bool = False


def _get(stage: str, read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def value(model: Any) -> Any:
        result = ok_result(model, stage)
        return None if result is None else read(result)

    return value


def figures(models: Sequence[Any]) -> list[Figure]:
    """The figures any of ``models`` (one model's results in each file) has, in reading order."""
    found = [
        Figure("params", _get("count_params", lambda r: r.total), units.count, ("convention",)),
        Figure("FLOPs", _get("count_flops", lambda r: r.total_flops), units.flops, ("shapes", "convention")),
        Figure("fused bytes", _get("estimate_traffic", lambda r: r.fused_bytes), units.size,
               ("shapes", "convention", "precision")),
        Figure("unfused bytes", _get("estimate_traffic", lambda r: r.unfused_bytes), units.size,
               ("shapes", "convention", "precision")),
    ]
    bounds = dict.fromkeys((gpu, precision) for model in models if (roof := ok_result(model, "roofline"))
                           for gpu, by in roof.gpus.items() for precision in by)
    for gpu, precision in bounds:
        found.append(Figure(f"bound {gpu} {precision}", _bound(gpu, precision), units.milliseconds,
                            ("shapes", "convention", "precision")))
    found.append(Figure("latency p50", _get("measure_latency", lambda r: r.p50_ms), units.milliseconds,
                        ("shapes", "precision"), kind="latency"))
    sizes = dict.fromkeys(row.batch_size for model in models if (lat := ok_result(model, "measure_latency"))
                          for row in lat.throughput)
    for size in sizes:
        found.append(Figure(f"throughput b{size}", _throughput(size), lambda v: units.rate(v, " samples/s"),
                            ("shapes", "precision"), kind="throughput", higher_is_better=True))
    return [figure for figure in found if any(figure.read(model) is not None for model in models)]


def _bound(gpu: str, precision: str) -> Callable[[Any], Any]:
    def read(result: Any) -> Any:
        bound = result.gpus.get(gpu, {}).get(precision)
        return None if bound is None else bound.bound_ms_fused

    return _get("roofline", read)


def _throughput(size: int) -> Callable[[Any], Any]:
    return _get("measure_latency", lambda r: next((row.samples_per_s for row in r.throughput if row.batch_size == size),
                                                  None))


# -- what makes two results comparable ---------------------------------------------------------------------------------


def traits(run: Any, model: Any) -> dict[str, Any]:
    """The facts a figure may depend on, for one model in one file."""
    flops = ok_result(model, "count_flops")
    spec_model = next((m for m in run.provenance.spec.get("models", []) if m.get("name") == model.name), {})
    shapes = tuple(flops.counted_inputs) if flops is not None and flops.counted_inputs else \
        tuple((tuple(i.get("shape", ())), i.get("dtype")) for i in spec_model.get("inputs", []))
    options = run.provenance.spec.get("options", {}).get("count_flops", {})
    convention = (tuple(sorted((k, str(v)) for k, v in options.items() if k not in ("top_k", "module_depth", "count_on"))),
                  flops.other_flops_convention if flops is not None else None,
                  flops.causal_mask_convention if flops is not None else None)
    return {"schema": run.schema_version, "shapes": shapes, "convention": convention, "precision": model.precision}


def differences(first: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return [key for key in ("schema", "shapes", "convention", "precision") if first[key] != other[key]]


WHY = {"schema": "results schema {a} vs {b}", "shapes": "input shapes differ ({a} vs {b})",
       "convention": "counting convention differs", "precision": "precision {a} vs {b}"}


# -- verdicts ----------------------------------------------------------------------------------------------------------


def verdict(figure: Figure, base_model: Any, other_model: Any, base: float, other: float) -> str:
    """"same", "improved", "regressed" or "within noise" for ``other`` against ``base``."""
    if base == other:
        return "same"
    better = (other > base) == figure.higher_is_better
    if figure.kind != "counted" and not beyond_noise(figure, base_model, other_model, base, other):
        return "within noise"
    return "improved" if better else "regressed"


def beyond_noise(figure: Figure, base_model: Any, other_model: Any, base: float, other: float) -> bool:
    a, b = ok_result(base_model, "measure_latency"), ok_result(other_model, "measure_latency")
    if figure.kind == "latency":
        ia, ib = getattr(a, "p50_interval_ms", None), getattr(b, "p50_interval_ms", None)
        if ia and ib:
            return ia[1] < ib[0] or ib[1] < ia[0]
    band = max(a.spread if a else 0.0, b.spread if b else 0.0)
    if figure.kind == "throughput":
        band = max(band, THROUGHPUT_BAND)
    return abs(other / base - 1) > band


# -- the table ---------------------------------------------------------------------------------------------------------


def compare(runs: Sequence[tuple[str, Any]]) -> Table:
    """One row per model and figure: the value in each file, then for each later file its ratio to the first and
    the verdict (or a note number when not comparable)."""
    labels = [label for label, _ in runs]
    letters = [chr(ord("A") + index) for index in range(len(runs))]
    notes: list[str] = [f"{letter}: {label} ({_origin(run)})" for letter, label, (_, run) in zip(letters, labels, runs)]
    numbered: dict[str, int] = {}
    names = list(dict.fromkeys(model.name for _, run in runs for model in run.models))
    rows = []
    for name in names:
        present = [_model(run, name) for _, run in runs]
        base_run, base_model = runs[0][1], present[0]
        for figure in figures([model for model in present if model is not None]):
            row = [Cell(name, name), Cell(figure.name, figure.name)]
            row += [Cell.of(figure.read(model), figure.show) if model is not None else Cell(None, "not in file")
                    for model in present]
            for (_, run), model in zip(runs[1:], present[1:]):
                row += _ratio_cells(figure, base_run, base_model, run, model, notes, numbered)
            rows.append(row)
    columns = ["model", "figure", *letters]
    for letter in letters[1:]:
        columns += [f"{letter}/A", f"{letter} vs A"]
    notes.append("lower is better except throughput; measured changes within the noise band are not called; "
                 "counted figures are exact")
    return Table("compare", f"Comparison of {len(runs)} results files (ratios to A)", tuple(columns),
                 tuple(tuple(row) for row in rows), tuple(notes))


def _origin(run: Any) -> str:
    """Which rpx and which machine made a file (two machines or two rpx versions are what compare is for)."""
    cards = [card for model in run.models if (card := ok_result(model, "system_card")) is not None]
    machine = f", {cards[0].summary()}" if cards else ""
    return f"rpx {run.provenance.rpx_version}, schema {run.schema_version}{machine}"


def _model(run: Any, name: str) -> Any:
    return next((model for model in run.models if model.name == name), None)


def _ratio_cells(figure: Figure, base_run: Any, base_model: Any, run: Any, model: Any, notes: list[str],
                 numbered: dict[str, int]) -> list[Cell]:
    if base_model is None or model is None:
        return [Cell(None, units.MISSING), Cell(None, "not in both files")]
    base, other = figure.read(base_model), figure.read(model)
    if base is None or other is None:
        return [Cell(None, units.MISSING), Cell(None, "missing")]
    first, second = traits(base_run, base_model), traits(run, model)
    blocking = [key for key in differences(first, second) if key == "schema" or key in figure.depends]
    if blocking:
        reason = "; ".join(WHY[key].format(a=_short(first[key]), b=_short(second[key])) for key in blocking)
        text = f"not comparable: {reason}"
        if text not in numbered:
            numbered[text] = len(numbered) + 1
            notes.append(f"[{numbered[text]}] {text}")
        number = numbered[text]
        return [Cell(None, f"n/c [{number}]"), Cell("not comparable", f"not comparable [{number}]")]
    if base == 0:
        return [Cell(None, units.MISSING), Cell("same" if other == 0 else None, "same" if other == 0 else "-")]
    ratio = other / base
    return [Cell(ratio, units.ratio(ratio)), Cell(verdict(figure, base_model, model, base, other),
                                                  verdict(figure, base_model, model, base, other))]


def _short(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return str(value)
