"""Tier 1: the count stages (parameters, FLOPs and MACs, bytes moved), their summary fields, tables and compare
figures. The implementations are the torch and JAX counters' hooks (rpx_plugins.torch.counts, rpx_plugins.jax.counts).

Conventions shown under the tables: FLOPs = 2 x MACs for matrix work plus other FLOPs from the per-element cost
table; bytes at each tensor's dtype; decimal units (1 GB = 1e9 bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rpx_core.plugin import (
    PRECISION,
    SHAPES,
    Cell,
    Column,
    CountOptions,
    Figure,
    FlopsResult,
    ParamsResult,
    Stage,
    Table,
    TableView,
    TrafficResult,
    ok_result,
    units,
)

Fields = dict[str, float | str]

#: The trait a figure counted under other options or conventions cannot be compared on.
CONVENTION = "counting convention"


# -- summary fields ----------------------------------------------------------------------------------------------------


def params_fields(params: ParamsResult, results: Mapping[str, Any]) -> Fields:
    return {"params_m": params.total / 1e6}


def flops_fields(flops: FlopsResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"flops_g": flops.total_flops / 1e9, "matrix_flops_g": flops.matrix_flops / 1e9,
                      "macs_g": flops.macs / 1e9}
    uncounted = uncounted_calls(flops)
    if uncounted is not None:
        fields["uncounted_ops"], fields["uncounted_call_share"] = uncounted
    return fields


def uncounted_calls(flops: FlopsResult) -> tuple[int, float] | None:
    """(operators without a FLOP formula, their share of every operator call of the counted pass); None when every
    operator had one."""
    if not flops.uncounted_ops:
        return None
    uncounted = sum(flops.uncounted_ops.values())
    counted = sum(operator.calls for operator in flops.by_operator.values())
    return len(flops.uncounted_ops), uncounted / (counted + uncounted)


def traffic_fields(traffic: TrafficResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"memory_traffic_gb": traffic.unfused_bytes / 1e9, "fused_traffic_gb": traffic.fused_bytes / 1e9}
    if traffic.arithmetic_intensity_unfused is not None:
        fields["arithmetic_intensity"] = traffic.arithmetic_intensity_unfused
    fields["actmem_gb_fp16"] = traffic.activation_peak_bytes_fp16 / 1e9
    return fields


def counts_on_device(options: CountOptions) -> bool:
    """Counting runs the model on the backend only when asked to; "auto" and "meta" count on the meta device."""
    return options.count_on == "device"


# -- tables ------------------------------------------------------------------------------------------------------------


def tier1(run: Any) -> Table | None:
    """Parameters, FLOPs, bytes and activation memory per model (FLOPs = 2 x MACs; decimal units)."""
    rows = []
    for model in run.models:
        params, flops, traffic = (ok_result(model, s) for s in ("count_params", "count_flops", "estimate_traffic"))
        if params is None and flops is None and traffic is None:
            continue
        rows.append([
            Cell.text_of(model.name),
            Cell.text_of(model.precision),
            Cell.of(params and params.total, units.count),
            Cell.of(params and params.bytes_at_precision, units.size),
            Cell.of(flops and flops.total_flops, units.flops),
            Cell.of(flops and flops.macs, units.macs),
            Cell.of(flops and (flops.matrix_flops / flops.total_flops if flops.total_flops else None), units.percent),
            Cell.of(traffic and traffic.unfused_bytes, units.size),
            Cell.of(traffic and traffic.fused_bytes, units.size),
            Cell.of(traffic and traffic.arithmetic_intensity_unfused, units.intensity),
            Cell.of(traffic and traffic.activation_peak_bytes, units.size),
            uncounted_cell(flops),
        ])  # fmt: skip
    if not rows:
        return None
    return Table("tier1", "Tier 1: size and work of one pass",
                 [Column("model"), Column("precision"), Column("params"), Column("weights", "bytes"),
                  Column("FLOPs", "FLOP"), Column("MACs", "MAC"), Column("matrix share", "fraction"),
                  Column("traffic unfused", "bytes"), Column("traffic fused", "bytes"),
                  Column("intensity unfused", "FLOP/B"), Column("activation peak", "bytes"),
                  Column("uncounted calls", "fraction")], rows,
                 ["FLOPs = 2 x MACs for matrix work, plus other FLOPs from the per-element table; bytes at each "
                  "tensor's dtype; 1 GB = 1e9 bytes",
                  "uncounted calls: operators that ran without a FLOP formula (their FLOPs are NOT in the totals) and "
                  "their share of all operator calls; the uncounted table lists them"])


def uncounted_cell(flops: Any) -> Cell:
    """How many operators had no formula and their share of the calls ("none" when every one had one)."""
    if flops is None:
        return Cell(None, units.MISSING)
    found = uncounted_calls(flops)
    if found is None:
        return Cell(0.0, "none")
    operators, share = found
    return Cell(share, f"{units.percent(share)} ({operators} op{'s' if operators != 1 else ''})")


def uncounted(run: Any) -> Table | None:
    """Operators that ran without a FLOP formula: their FLOPs are NOT in the totals."""
    rows = [[Cell.text_of(model.name), Cell.text_of(op), Cell(calls, str(calls))]
            for model in run.models if (flops := ok_result(model, "count_flops")) is not None
            for op, calls in flops.uncounted_ops.items()]
    if not rows:
        return None
    return Table("uncounted", "Operators without a FLOP formula (not in the totals)",
                 [Column("model"), Column("operator"), Column("calls")], rows)


def operators(run: Any) -> Table | None:
    """Per-operator totals (the counter's top entries; the rest folded into "(others)")."""
    rows = []
    for model in run.models:
        flops = ok_result(model, "count_flops")
        if flops is None:
            continue
        for op, stats in flops.by_operator.items():
            total = stats.matrix_flops + stats.other_flops
            moved = stats.bytes_read + stats.bytes_written
            rows.append([Cell.text_of(model.name), Cell.text_of(op), Cell(stats.calls, str(stats.calls)),
                         Cell.of(total, units.flops), Cell.of(stats.matrix_flops, units.flops),
                         Cell.of(moved, units.size), Cell.of(total / moved if moved else None, units.intensity)])
    if not rows:
        return None
    return Table("operators", "Per operator",
                 [Column("model"), Column("operator"), Column("calls"), Column("FLOPs", "FLOP"),
                  Column("matrix FLOPs", "FLOP"), Column("traffic (unfused)", "bytes"), Column("intensity", "FLOP/B")],
                 rows)


def modules(run: Any) -> Table | None:
    """Per-module figures: exclusive (ops whose innermost module it is; they sum to the totals) and inclusive."""
    rows = []
    for model in run.models:
        flops = ok_result(model, "count_flops")
        if flops is None:
            continue
        for path, stats in flops.by_module.items():
            exclusive = stats.exclusive_matrix_flops + stats.exclusive_other_flops
            rows.append([Cell.text_of(model.name), Cell.text_of(path), Cell(stats.calls, str(stats.calls)),
                         Cell.of(exclusive, units.flops), Cell.of(stats.inclusive_flops, units.flops),
                         Cell.of(stats.exclusive_bytes_read + stats.exclusive_bytes_written, units.size),
                         Cell.of(stats.inclusive_bytes, units.size)])
    if not rows:
        return None
    return Table("modules", "Per module",
                 [Column("model"), Column("module"), Column("calls"), Column("FLOPs exclusive", "FLOP"),
                  Column("FLOPs inclusive", "FLOP"), Column("traffic exclusive", "bytes"),
                  Column("traffic inclusive", "bytes")], rows)


# -- what rpx compare puts side by side --------------------------------------------------------------------------------


def _read(stage: str, field: str) -> Any:
    def read(model: Any) -> Any:
        result = ok_result(model, stage)
        return None if result is None else getattr(result, field)

    return read


def params_figures(models: Sequence[Any]) -> Iterable[Figure]:
    return [Figure("params", _read("count_params", "total"), units.count, (CONVENTION,), unit="parameters")]


def flops_figures(models: Sequence[Any]) -> Iterable[Figure]:
    return [Figure("FLOPs", _read("count_flops", "total_flops"), units.flops, (SHAPES, CONVENTION), unit="FLOP")]


def traffic_figures(models: Sequence[Any]) -> Iterable[Figure]:
    return [Figure(f"{kind} bytes", _read("estimate_traffic", f"{kind}_bytes"), units.size,
                   (SHAPES, CONVENTION, PRECISION), unit="bytes", panel="traffic") for kind in ("fused", "unfused")]


def flops_traits(run: Any, model: Any) -> dict[str, Any]:
    """The inputs as counted (more exact than the spec's), and the options and conventions the count followed."""
    flops = ok_result(model, "count_flops")
    options = run.provenance.spec.get("options", {}).get("count_flops", {})
    convention = (tuple(sorted((k, str(v)) for k, v in options.items() if k not in ("top_k", "module_depth", "count_on"))),
                  flops.other_flops_convention if flops is not None else None,
                  flops.causal_mask_convention if flops is not None else None)
    traits: dict[str, Any] = {CONVENTION: convention}
    if flops is not None and flops.counted_inputs:
        traits[SHAPES] = tuple(flops.counted_inputs)
    return traits


# -- the declarations --------------------------------------------------------------------------------------------------


COUNT_PARAMS = Stage(
    "count_params",
    "parameters, buffers and their bytes at the spec's precision",
    result=ParamsResult,
    summary=params_fields,
    tables=(TableView("tier1", tier1),),
    figures=params_figures,
    doc="Count parameters and buffers (shared weights once) and their bytes at ``ctx.precision``.",
)
COUNT_FLOPS = Stage(
    "count_flops",
    "FLOPs and MACs of one pass, per operator and module",
    result=FlopsResult,
    options=CountOptions,
    executes=counts_on_device,
    summary=flops_fields,
    tables=(TableView("uncounted", uncounted), TableView("operators", operators, shown="on_request"),
            TableView("modules", modules, shown="on_request")),
    figures=flops_figures,
    traits=flops_traits,
    doc="Count FLOPs and MACs of one pass (``ctx.options('count_flops')``: backward, batch size, where to count). "
    "FLOPs = 2 x MACs for matrix work; operators without a formula are listed in ``uncounted_ops``.",
)
ESTIMATE_TRAFFIC = Stage(
    "estimate_traffic",
    "bytes moved (unfused and fused bounds) and peak activation memory",
    result=TrafficResult,
    needs=("count_flops",),
    summary=traffic_fields,
    figures=traffic_figures,
    doc="Bytes moved (unfused upper and fused lower bound) and peak activation memory, with ``assumptions`` stated. "
    "Reuse the counting pass of ``rpx_count_flops`` through ``ctx.cache`` instead of running the model twice.",
)
