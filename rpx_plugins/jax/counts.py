"""Tier 1 for the ``jax`` backend: parameters from the params pytree, FLOPs and bytes from the jaxpr.

One trace, lowering and compile per job (cached in ``ctx.cache``) feeds both ``count_flops`` and
``estimate_traffic``. Params and inputs are abstract (``jax.ShapeDtypeStruct`` at the precision's dtype, on the
job's device), the JAX analogue of torch's meta device: nothing is executed or allocated, and XLA compiles for the
job's platform. ``[options.count_flops]`` applies as for torch: inputs at its ``batch_size``, ``top_k`` operators
listed; ``backward`` is refused (forward only), and ``count_on`` changes nothing (the count is always abstract).

Where each figure comes from:

* ``macs`` and ``matrix_flops`` (= 2 x macs): the jaxpr's dot_general/conv_general_dilated equations, from shapes.
* ``other_flops``: every other equation, from the per-element tables of :mod:`rpx_plugins.jax.jaxpr` (the torch
  counter's conventions where primitives correspond); primitives without an entry are listed in ``uncounted_ops``.
  Scan bodies count once per iteration. XLA's compiled cost analysis is not used: it counts type conversions (so it
  changes with precision) and a loop body once; its figures are reported in estimate_traffic's assumptions.
* Bytes and the activation peak: from the jaxpr, unfused as the fields define them (every equation reads its operands
  and writes its results; values live from their equation to their last use). XLA's post-fusion figures (``bytes
  accessed``, temp + output buffers) are platform-specific and may include compiler copies (on CPU, bf16 weights
  widened to f32 count as temps), so they are reported in the assumptions, not substituted for those fields.
* ``op_records``: one per kind of equation that moves bytes (primitive, scope, operand shapes), with its matrix +
  other FLOPs, so the per-operator roofline sees elementwise work too.

JAX has no trainable flag and no buffers: every params leaf is a trainable parameter and ``buffers`` is 0.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs

from rpx_core.context import StageContext
from rpx_core.errors import UnsupportedError
from rpx_core.hookspecs import hookimpl
from rpx_core.precision import BYTES_PER_ELEMENT
from rpx_core.spec import InputSpec
from rpx_core.types.counts import (
    CountOptions,
    FlopsResult,
    OperatorStats,
    OpRecord,
    ParamsResult,
    TrafficResult,
    fold_largest,
)
from rpx_plugins.jax.backend import (
    JaxModel,
    as_jax_model,
    input_dtype,
    is_floating,
    jax_dtype,
    resolve_device,
    split_inputs,
)
from rpx_plugins.jax.jaxpr import (
    JaxprCounts,
    fp16_size,
    live_peak,
    nbytes,
    other_flops_convention,
    walk,
)

#: counted_on of every jax count: abstract values (ShapeDtypeStruct), JAX's analogue of torch's meta device.
COUNTED_ON = "abstract"
CAUSAL_MASK_CONVENTION = (
    "attention is counted as the dot_general equations it runs: masked positions are computed, so counted"
)


@attrs.frozen
class Analysis:
    """One job's trace and compile at its precision: everything count_flops and estimate_traffic report."""

    counts: JaxprCounts
    cost: dict[str, float]  # XLA's compiled cost analysis (reported, not used)
    jaxpr: Any  # the traced program
    xla_buffer_bytes: int | None  # XLA memory analysis: temp + output buffers
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    platform: str


# -- parameters --------------------------------------------------------------------------------------------------------


def param_avals(params: Any) -> list[Any]:
    """Shape/dtype of each params leaf; a leaf object appearing twice in the tree (a tied weight) counts once."""
    import jax

    unique = {id(leaf): leaf for leaf in jax.tree.leaves(params)}
    return [jax.typeof(leaf) for leaf in unique.values()]


def bytes_at(aval: Any, precision: str) -> int:
    """Bytes of ``aval`` with floating elements at ``precision``; integer and bool leaves keep their size."""
    return int(aval.size) * (BYTES_PER_ELEMENT[precision] if is_floating(aval.dtype) else aval.dtype.itemsize)


def count_params(params: Any, precision: str) -> ParamsResult:
    """Elements of every params leaf (all trainable: JAX has no flag) and their bytes at ``precision``; no buffers."""
    avals = param_avals(params)
    total = sum(int(aval.size) for aval in avals)
    return ParamsResult(
        total=total,
        trainable=total,
        non_trainable=0,
        buffers=0,
        bytes_at_precision=sum(bytes_at(aval, precision) for aval in avals),
        precision=precision,
    )


# -- one trace + compile per job ---------------------------------------------------------------------------------------


def jax_model(ctx: StageContext) -> JaxModel:
    """The job's unplaced model, built once per job for the Tier 1 stages."""
    if "jax.model" not in ctx.cache:
        ctx.cache["jax.model"] = as_jax_model(ctx.build_model())
    return ctx.cache["jax.model"]


def abstract_args(ctx: StageContext, batch_size: int | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(params, args, kwargs) as ShapeDtypeStructs on the job's device, at the dtypes a run would give them, inputs at
    ``batch_size``."""
    import jax

    sharding = jax.sharding.SingleDeviceSharding(resolve_device(ctx.job.device))
    precision = ctx.job.precision
    dtype = jax_dtype(precision)

    def param(leaf: Any) -> Any:
        aval = jax.typeof(leaf)
        return jax.ShapeDtypeStruct(aval.shape, dtype if is_floating(aval.dtype) else aval.dtype, sharding=sharding)

    def given(spec_input: InputSpec) -> Any:
        shape = spec_input.with_batch(batch_size).shape
        return jax.ShapeDtypeStruct(shape, input_dtype(spec_input, precision), sharding=sharding)

    positional, named = split_inputs(ctx.job.model)
    args = tuple(given(i) for i in positional)
    kwargs = {name: given(i) for name, i in named.items()}
    return jax.tree.map(param, jax_model(ctx).params), args, kwargs


def xla_buffers(compiled: Any) -> int | None:
    """XLA's temp + output buffer bytes for the compiled program (None where it gives no memory analysis)."""
    memory = compiled.memory_analysis()
    return None if memory is None else int(memory.temp_size_in_bytes + memory.output_size_in_bytes)


def analyse(ctx: StageContext) -> Analysis:
    """The job's analysis at its precision, computed once and shared by count_flops and estimate_traffic."""
    import jax

    if "jax.analysis" in ctx.cache:
        return ctx.cache["jax.analysis"]
    options = count_options(ctx)
    if options.backward:
        raise UnsupportedError("the jax backend counts forward passes only; set [options.count_flops] backward = false")
    params, args, kwargs = abstract_args(ctx, options.batch_size)
    traced = jax.jit(jax_model(ctx).apply).trace(params, *args, **kwargs)
    compiled = traced.lower().compile()
    jaxpr = traced.jaxpr.jaxpr
    param_count = len(jax.tree.leaves(params))
    counts = JaxprCounts()
    walk(jaxpr, set(jaxpr.invars[:param_count]) | set(jaxpr.constvars), counts)
    analysis = Analysis(
        counts=counts,
        cost=dict(compiled.cost_analysis() or {}),
        jaxpr=jaxpr,
        xla_buffer_bytes=xla_buffers(compiled),
        weight_bytes=count_params(jax_model(ctx).params, ctx.job.precision).bytes_at_precision
        + sum(nbytes(v.aval) for v in jaxpr.constvars),
        input_bytes=sum(nbytes(leaf) for leaf in jax.tree.leaves((args, kwargs))),
        output_bytes=sum(nbytes(aval) for aval in traced.jaxpr.out_avals),
        platform=resolve_device(ctx.job.device).platform,
    )
    ctx.cache["jax.analysis"] = analysis
    return analysis


# -- results -----------------------------------------------------------------------------------------------------------


def size(stats: OperatorStats) -> tuple[int, int]:
    """How operators rank: FLOPs, then bytes (the torch counter's order)."""
    return stats.matrix_flops + stats.other_flops, stats.bytes_read + stats.bytes_written


def summed(parts: list[OperatorStats]) -> OperatorStats:
    """Field-by-field sum of ``parts`` (the "(others)" entry)."""
    return OperatorStats(*(sum(column) for column in zip(*(attrs.astuple(part) for part in parts))))


def operator_totals(counts: JaxprCounts, top_k: int) -> dict[str, OperatorStats]:
    """Totals per primitive, largest first, beyond ``top_k`` summed in "(others)" so the sums stay exact."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for call, n in counts.executions.items():
        figures = (n, 2 * call.macs * n, call.other_flops * n, call.bytes_read * n, call.bytes_written * n)
        for i, value in enumerate(figures):
            totals[call.op][i] += value
    stats = {op: OperatorStats(*figures) for op, figures in totals.items()}
    ranked = dict(sorted(stats.items(), key=lambda item: size(item[1]), reverse=True))
    return fold_largest(ranked, top_k, key=size, merge=summed)


def flops_result(analysis: Analysis, options: CountOptions) -> FlopsResult:
    counts = analysis.counts
    macs = sum(call.macs * n for call, n in counts.executions.items())
    other = sum(call.other_flops * n for call, n in counts.executions.items())
    return FlopsResult(
        matrix_flops=2 * macs,
        other_flops=other,
        total_flops=2 * macs + other,
        macs=macs,
        by_operator=operator_totals(counts, options.top_k),
        by_module={},
        by_phase={"forward": 2 * macs + other},
        uncounted_ops=dict(counts.uncounted),
        causal_mask_convention=CAUSAL_MASK_CONVENTION,
        other_flops_convention=(
            f"per jaxpr equation: {other_flops_convention()}. Scan bodies count once per iteration. by_operator lists "
            "jaxpr primitives; by_module is empty (plain JAX has no module tree). Always counted abstractly for the "
            "job's device, whatever count_on says; XLA's own cost analysis is in estimate_traffic's assumptions"
        ),
        backward=False,
        counted_on=COUNTED_ON,
        module_depth=options.module_depth,
        top_k=options.top_k,
    )


def op_records(counts: JaxprCounts) -> tuple[OpRecord, ...]:
    """One record per kind of equation; its flops are one execution's matrix + other FLOPs."""
    records = [
        OpRecord(
            call.op, call.module, n, 2 * call.macs + call.other_flops, call.macs, call.bytes_read, call.bytes_written,
            inputs=call.inputs,
        )
        for call, n in counts.executions.items()
    ]
    return tuple(sorted(records, key=lambda r: -(r.bytes_read + r.bytes_written) * r.count))


def reported(figure: float | None) -> str:
    return "not reported" if figure is None else str(round(figure))


def xla_cost_text(analysis: Analysis) -> str:
    """XLA's compiled cost analysis, reported for comparison only."""
    cost = analysis.cost
    return (
        f"XLA's cost analysis of the compiled, fused program on {analysis.platform} (not used above): flops "
        f"{reported(cost.get('flops'))}, transcendentals {reported(cost.get('transcendentals'))}, bytes accessed "
        f"{reported(cost.get('bytes accessed'))}; its flops include type conversions and count a loop body once, so "
        "they change with precision"
    )


def traffic_result(analysis: Analysis, options: CountOptions) -> TrafficResult:
    counts = analysis.counts
    unfused = counts.weight_read_bytes + counts.activation_read_bytes + counts.written_bytes
    fused = analysis.weight_bytes + analysis.input_bytes + analysis.output_bytes
    total_flops = flops_result(analysis, options).total_flops
    return TrafficResult(
        unfused_bytes=unfused,
        unfused_weight_read_bytes=counts.weight_read_bytes,
        unfused_activation_read_bytes=counts.activation_read_bytes,
        unfused_written_bytes=counts.written_bytes,
        fused_bytes=fused,
        weight_bytes=analysis.weight_bytes,
        input_bytes=analysis.input_bytes,
        output_bytes=analysis.output_bytes,
        activation_peak_bytes=live_peak(analysis.jaxpr, nbytes),
        activation_peak_bytes_fp16=live_peak(analysis.jaxpr, fp16_size),
        assumptions=(
            "unfused_*: every jaxpr equation reads its operands and writes its results (reshapes and broadcasts "
            "included, though XLA may make them free); scan bodies count once per iteration; literals are not reads",
            xla_cost_text(analysis),
            "weight_bytes: every params leaf once (floating leaves at the precision's dtype) plus the arrays the "
            "function closes over (constants, at their own dtype); reads of either count as weight reads",
            "activation_peak_bytes: liveness over the jaxpr, unfused (each equation's results held from creation to last "
            "use, outputs to the end; params and inputs excluded); _fp16 recounts floating values at 2 bytes",
            f"XLA's temp + output buffers for the compiled program on {analysis.platform}: "
            f"{reported(analysis.xla_buffer_bytes)} (after fusion; may include compiler copies such as widened "
            "weights; not used above)",
            "op_records: one per kind of equation that moves bytes (primitive, scope, operand shapes), flops = its "
            "matrix + other FLOPs; count x bytes sums to unfused_bytes and count x flops to total FLOPs",
        ),
        op_records=op_records(counts),
        arithmetic_intensity_unfused=total_flops / unfused if unfused else None,
        arithmetic_intensity_fused=total_flops / fused if fused else None,
    )


def count_options(ctx: StageContext) -> CountOptions:
    """``[options.count_flops]``, which estimate_traffic shares (one analysis feeds both)."""
    return ctx.options("count_flops") or CountOptions()


def is_jax(ctx: StageContext) -> bool:
    return ctx.backend.framework == "jax"


@hookimpl
def rpx_count_params(ctx: StageContext) -> ParamsResult | None:
    return count_params(jax_model(ctx).params, ctx.job.precision) if is_jax(ctx) else None


@hookimpl
def rpx_count_flops(ctx: StageContext) -> FlopsResult | None:
    if not is_jax(ctx):
        return None
    options = count_options(ctx)
    return attrs.evolve(flops_result(analyse(ctx), options), counted_batch_size=ctx.job.model.batch_size(options.batch_size))


@hookimpl
def rpx_estimate_traffic(ctx: StageContext) -> TrafficResult | None:
    return traffic_result(analyse(ctx), count_options(ctx)) if is_jax(ctx) else None
