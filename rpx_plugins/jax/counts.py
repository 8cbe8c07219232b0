"""Tier 1 for the ``jax`` backend: parameters from the params pytree, FLOPs and bytes from the jaxpr.

One trace (and one compile, for XLA's own figures) per job, cached in ``ctx.cache``, feeds ``count_flops`` and
``estimate_traffic``; ``count_params`` reads the forward trace for closed-over constants. Params and inputs are
abstract (``jax.ShapeDtypeStruct`` at the precision's dtype, sharded as the params are, or on the job's device), the
JAX analogue of torch's meta device: nothing is executed or allocated. ``[options.count_flops]`` applies as for
torch: inputs at its ``batch_size``, ``top_k`` operators and modules listed, module paths folded at ``module_depth``,
``while_iterations`` for data-dependent loops; ``count_on`` changes nothing (the count is always abstract).

Where each figure comes from:

* ``macs`` and ``matrix_flops`` (= 2 x macs): the jaxpr's dot_general/conv_general_dilated equations, from shapes.
* ``other_flops``: every other equation, from the per-element tables of :mod:`rpx_plugins.jax.jaxpr`; primitives
  without an entry (and custom kernels such as ``pallas_call``) are listed in ``uncounted_ops``. Loop bodies count
  once per iteration, a ``cond`` its largest branch, a ``shard_map``/``pmap`` body once per device.
* ``backward = true``: the gradient of the summed outputs with respect to the trainable params (``jax.value_and_grad``),
  and, for a model with an optimizer (a Flax TrainState), its update; phases from the name stack.
* ``by_module``: module paths from the name stack (Flax linen's own scopes; the scopes rpx adds for NNX and Equinox),
  exclusive and inclusive, as torch's; backward and optimizer equations under "(backward)" and "(optimizer)".
* Bytes and the activation peak: from the jaxpr, unfused as the fields define them. fp8/int8 are traced at bf16 with
  floating values sized at 1 byte. XLA's compiled figures are reported in ``compiler_figures``, not used.

Parameters: leaves by role (trainable / non-trainable / buffer, from the model adapter), tied leaves once; arrays the
function closes over are ``constants``, never parameters.
"""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict
from typing import Any, Callable

import attrs

from rpx_core.plugin import (
    BUFFER,
    BYTES_PER_ELEMENT,
    NON_TRAINABLE,
    TRAINABLE,
    InputSpec,
    JaxModel,
    StageContext,
    hookimpl,
)
from rpx_core.types.counts import (
    BACKWARD_MODULE,
    OTHERS,
    ROOT_MODULE,
    CompilerFigures,
    CountOptions,
    FlopsResult,
    ModuleStats,
    OperatorStats,
    OpRecord,
    ParamsResult,
    TrafficResult,
    fold_largest,
    inputs_text,
)
from rpx_plugins.jax.backend import (
    as_jax_model,
    count_dtype,
    input_dtype,
    is_floating,
    resolve_device,
    split_inputs,
)
from rpx_plugins.jax.jaxpr import (
    OPTIMIZER_MODULE,
    OPTIMIZER_SCOPE,
    JaxprCounts,
    ModuleNaming,
    fp16_size,
    live_peak,
    other_flops_convention,
    size_at,
    walk,
)

#: counted_on of every jax count: abstract values (ShapeDtypeStruct), JAX's analogue of torch's meta device.
COUNTED_ON = "abstract"
CAUSAL_MASK_CONVENTION = (
    "attention is counted as the dot_general equations it runs: masked positions are computed, so counted"
)
#: Precisions whose floating values are sized at their own element size rather than the traced dtype's.
RESIZED = ("fp8", "int8")
PSEUDO_MODULES = (BACKWARD_MODULE, OPTIMIZER_MODULE, OTHERS)


@attrs.frozen
class Trace:
    """One traced program: the jaxpr, which of its inputs hold params, and the module calls seen while tracing."""

    traced: Any  # jax's Traced, for lowering
    jaxpr: Any  # the open jaxpr
    weights: set[Any]  # vars holding params or closed-over constants
    calls: Counter  # module path -> calls during the trace
    param_avals: Any  # the abstract params the program was traced with
    inputs: tuple[Any, ...]  # the abstract inputs (args, kwargs)


@attrs.frozen
class Analysis:
    """One job's trace (and compile) at its precision: everything count_flops and estimate_traffic report."""

    counts: JaxprCounts
    compiler: CompilerFigures
    jaxpr: Any
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    gradient_bytes: int | None
    calls: Counter
    devices: int
    platform: str
    size: Callable[[Any], int]
    resized: bool  # floating values sized at 1 byte (fp8/int8 traced at bf16)


# -- parameters --------------------------------------------------------------------------------------------------------


def unique_leaves(model: JaxModel) -> list[tuple[Any, str]]:
    """(aval, role) of each params leaf; a leaf object appearing twice in the tree (a tied weight) counts once."""
    import jax

    seen: dict[int, tuple[Any, str]] = {}
    for leaf, role in zip(jax.tree.leaves(model.params), model.leaf_roles()):
        seen.setdefault(id(leaf), (jax.typeof(leaf), role))
    return list(seen.values())


def element_count(aval: Any) -> int:
    """Elements of a leaf; a PRNG key array counts its key data (a threefry key is 2 uint32 words)."""
    import jax

    if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key):
        return int(aval.size) * int(aval.dtype.itemsize) // 4
    return int(aval.size)


def bytes_at(aval: Any, precision: str) -> int:
    """Bytes of ``aval`` with floating elements at ``precision``; integer, bool and key leaves keep their size."""
    return int(aval.size) * (BYTES_PER_ELEMENT[precision] if is_floating(aval.dtype) else aval.dtype.itemsize)


def count_params(model: JaxModel, precision: str, constants: list[Any] = ()) -> ParamsResult:
    """Elements of each leaf by role, their bytes at ``precision``; ``constants`` (avals the function closes over)
    reported beside them, with a note when floating ones stay at a wider dtype than the precision's."""
    leaves = unique_leaves(model)
    by_role = Counter()
    for aval, role in leaves:
        by_role[role] += element_count(aval)
    notes = []
    wide = [aval for aval in constants if is_floating(aval.dtype) and aval.dtype.itemsize > BYTES_PER_ELEMENT[precision]]
    if wide:
        elements = sum(int(aval.size) for aval in wide)
        notes.append(
            f"{elements} floating elements the model's function closes over stay {wide[0].dtype.name} at {precision}: "
            "rpx cannot re-cast arrays a function captures; pass them in params to run them at the precision"
        )
    return ParamsResult(
        total=by_role[TRAINABLE] + by_role[NON_TRAINABLE],
        trainable=by_role[TRAINABLE],
        non_trainable=by_role[NON_TRAINABLE],
        buffers=by_role[BUFFER],
        bytes_at_precision=sum(bytes_at(aval, precision) for aval, _ in leaves),
        precision=precision,
        constants=sum(int(aval.size) for aval in constants),
        constant_bytes=sum(int(aval.size) * aval.dtype.itemsize for aval in constants),
        notes=tuple(notes),
    )


# -- tracing -----------------------------------------------------------------------------------------------------------


def jax_model(ctx: StageContext) -> JaxModel:
    """The job's unplaced model (adapted by ctx.build_model), built once per job for the Tier 1 stages."""
    if "jax.model" not in ctx.cache:
        ctx.cache["jax.model"] = as_jax_model(ctx.build_model())
    return ctx.cache["jax.model"]


def abstract_args(ctx: StageContext, batch_size: int | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(params, args, kwargs) as ShapeDtypeStructs at the dtypes the count traces at, inputs at ``batch_size``. Params
    sharded over several devices keep their sharding; the rest go on the job's device (left unplaced on JAX's default
    device, as the backend runs them)."""
    import jax

    target = resolve_device(ctx.job.device)
    placed = None if target == jax.devices()[0] else jax.sharding.SingleDeviceSharding(target)
    dtype = count_dtype(ctx.job.precision)

    def param(leaf: Any) -> Any:
        aval = jax.typeof(leaf) if not isinstance(leaf, jax.ShapeDtypeStruct) else leaf
        sharding = getattr(leaf, "sharding", None)
        keep = sharding is not None and len(sharding.device_set) > 1
        return jax.ShapeDtypeStruct(
            aval.shape, dtype if is_floating(aval.dtype) else aval.dtype, sharding=sharding if keep else placed
        )

    def given(spec_input: InputSpec) -> Any:
        shape = spec_input.with_batch(batch_size).shape
        return jax.ShapeDtypeStruct(shape, input_dtype(spec_input, ctx.job.precision, counting=True), sharding=placed)

    positional, named = split_inputs(ctx.job.model)
    args = tuple(given(i) for i in positional)
    kwargs = {name: given(i) for name, i in named.items()}
    return jax.tree.map(param, jax_model(ctx).params), args, kwargs


def summed_outputs(outputs: Any) -> Any:
    """The scalar a training step differentiates: every floating output summed (torch's convention)."""
    import jax
    import jax.numpy as jnp

    return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(outputs) if is_floating(leaf.dtype))


def train_step(model: JaxModel) -> Callable[..., Any]:
    """``(params, *inputs) -> (loss, grads[, updated params])``: the gradient of the summed outputs with respect to
    the trainable leaves, then the model's optimizer update (under OPTIMIZER_SCOPE) if it has one."""
    import jax

    roles = model.leaf_roles()

    def step(params: Any, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jax.tree.flatten(params)

        def loss(trainable: list[Any]) -> Any:
            given = iter(trainable)
            full = [next(given) if role == TRAINABLE else leaf for leaf, role in zip(leaves, roles)]
            return summed_outputs(model.apply(jax.tree.unflatten(treedef, full), *args, **kwargs))

        value, grads = jax.value_and_grad(loss)([leaf for leaf, role in zip(leaves, roles) if role == TRAINABLE])
        if model.optimizer is None:
            return value, grads
        given = iter(grads)
        grad_tree = jax.tree.unflatten(treedef, [next(given) if role == TRAINABLE else None for role in roles])
        with jax.named_scope(OPTIMIZER_SCOPE):
            return value, grads, model.optimizer(params, grad_tree)

    return step


def trace(ctx: StageContext, backward: bool) -> Trace:
    """The forward pass (or the training step) traced at the count's dtypes, module calls recorded; cached."""
    import jax

    from rpx_plugins.jax.adapters import recording_calls

    key = f"jax.trace.{'backward' if backward else 'forward'}"
    if key in ctx.cache:
        return ctx.cache[key]
    model = jax_model(ctx)
    params, args, kwargs = abstract_args(ctx, count_options(ctx).batch_size)
    program = train_step(model) if backward else model.apply
    with recording_calls() as calls:
        traced = jax.jit(program).trace(params, *args, **kwargs)
    jaxpr = traced.jaxpr.jaxpr
    weights = set(jaxpr.invars[: len(jax.tree.leaves(params))]) | set(jaxpr.constvars)
    ctx.cache[key] = Trace(traced, jaxpr, weights, calls, params, (args, kwargs))
    return ctx.cache[key]


def element_size(precision: str) -> Callable[[Any], int]:
    """How the count sizes a value: at its traced dtype, or at 1 byte per floating element for fp8/int8."""
    return size_at(BYTES_PER_ELEMENT[precision] if precision in RESIZED else None)


def mesh_devices(params: Any) -> int:
    """Devices the params are sharded over (1 when none is sharded)."""
    import jax

    shardings = [leaf.sharding for leaf in jax.tree.leaves(params) if getattr(leaf, "sharding", None) is not None]
    return len(set().union(*(s.device_set for s in shardings))) if shardings else 1


def analyse(ctx: StageContext) -> Analysis:
    """The job's analysis at its precision, computed once and shared by count_flops and estimate_traffic."""
    import jax

    if "jax.analysis" in ctx.cache:
        return ctx.cache["jax.analysis"]
    options = count_options(ctx)
    model = jax_model(ctx)
    traced = trace(ctx, options.backward)
    size = element_size(ctx.job.precision)
    counts = JaxprCounts()
    naming = ModuleNaming(model.root_scope, model.ignored_scopes)
    walk(traced.jaxpr, traced.weights, counts, size=size, naming=naming, while_iterations=options.while_iterations)
    outputs = traced.traced.jaxpr.out_avals
    precision = ctx.job.precision
    trainable_bytes = sum(bytes_at(aval, precision) for aval, role in unique_leaves(model) if role == TRAINABLE)
    weight_bytes = count_params(model, precision).bytes_at_precision + sum(size(v.aval) for v in traced.jaxpr.constvars)
    output_bytes = sum(size(aval) for aval in outputs)
    devices = max(counts.devices, mesh_devices(traced.param_avals))
    platform = resolve_device(ctx.job.device).platform
    analysis = Analysis(
        counts=counts,
        compiler=compiler_figures(traced, counts, platform, devices, precision),
        jaxpr=traced.jaxpr,
        weight_bytes=weight_bytes,
        input_bytes=sum(size(leaf) for leaf in jax.tree.leaves(traced.inputs)),
        output_bytes=output_bytes - trainable_bytes if options.backward else output_bytes,
        gradient_bytes=trainable_bytes if options.backward else None,
        calls=traced.calls,
        devices=devices,
        platform=platform,
        size=size,
        resized=precision in RESIZED,
    )
    ctx.cache["jax.analysis"] = analysis
    return analysis


# -- XLA's own figures -------------------------------------------------------------------------------------------------


def compiler_figures(traced: Trace, counts: JaxprCounts, platform: str, devices: int, precision: str) -> CompilerFigures:
    """XLA's cost and memory analysis of the compiled program, with why they differ from rpx's counts."""
    rpx_transcendentals = sum(call.transcendentals * n for call, n in counts.executions.items())
    source = f"XLA cost_analysis() and memory_analysis() of the compiled program on {platform}" + (
        f", per device of {devices}" if devices > 1 else ""
    )
    try:
        compiled = traced.traced.lower().compile()
        cost = dict(compiled.cost_analysis() or {})
        memory = compiled.memory_analysis()
    except Exception as exc:  # a program JAX traces but this platform cannot compile (e.g. a TPU-only kernel)
        return CompilerFigures(source, rpx_transcendentals=rpx_transcendentals,
                               error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    differences = [
        "XLA's flops count type conversions, compares and selects of the fused program and exclude transcendentals "
        "(reported apart); rpx counts conversions as 0 and each transcendental element as 1 FLOP in other_flops",
        "XLA's bytes accessed are those of its fused kernels: between rpx's fused and unfused bounds",
    ]
    if counts.loop_iterations:
        differences.append(
            f"XLA counts a loop body once; rpx counts every iteration ({counts.loop_iterations} body runs more)"
        )
    if counts.padded_convolutions:
        differences.append("XLA skips a convolution's padding taps; rpx counts every tap, as torch's counter does")
    if devices > 1:
        differences.append(f"XLA's figures are for one device's partitioned program; rpx's totals for all {devices}")
    if precision in RESIZED:
        differences.append(f"{precision} is counted on a bf16 trace: XLA's figures are for bf16")
    if counts.uncounted:
        differences.append(f"rpx lists {', '.join(sorted(counts.uncounted))} as uncounted; XLA may count them")
    return CompilerFigures(
        source,
        flops=cost.get("flops"),
        transcendentals=cost.get("transcendentals"),
        bytes_accessed=cost.get("bytes accessed"),
        temp_bytes=None if memory is None else int(memory.temp_size_in_bytes),
        output_bytes=None if memory is None else int(memory.output_size_in_bytes),
        rpx_transcendentals=rpx_transcendentals,
        differences=tuple(differences),
    )


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


def ancestors(path: str) -> list[str]:
    """``path`` and every module above it, outermost first ("a.b" -> ["", "a", "a.b"]); pseudo-paths stand alone."""
    if path in PSEUDO_MODULES:
        return [path]
    parts = path.split(".") if path else []
    return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


def module_totals(counts: JaxprCounts, calls: Counter, options: CountOptions) -> dict[str, ModuleStats]:
    """Exclusive figures per module path (folded at ``module_depth``), inclusive ones summed over descendants; the
    ``top_k`` largest listed in first-seen order, the rest in "(others)" (torch's layout)."""
    exclusive: dict[str, list[int]] = {}
    for call, n in counts.executions.items():
        path = "" if call.module == ROOT_MODULE else call.module
        if path not in PSEUDO_MODULES:
            path = ".".join(path.split(".")[: options.module_depth]) if path else ""
        for ancestor in ancestors(path):
            exclusive.setdefault(ancestor, [0, 0, 0, 0])
        row = exclusive[path]
        row[0] += 2 * call.macs * n
        row[1] += call.other_flops * n
        row[2] += call.bytes_read * n
        row[3] += call.bytes_written * n
    inclusive: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path, (matrix, other, read, written) in exclusive.items():
        for ancestor in ancestors(path):
            inclusive[ancestor][0] += matrix + other
            inclusive[ancestor][1] += read + written

    def merge(rows: list[list[int]]) -> list[int]:
        return [sum(column) for column in zip(*rows)]

    limited = fold_largest(exclusive, options.top_k, key=lambda r: (r[0] + r[1], r[2] + r[3]), merge=merge)
    if OTHERS in limited:
        other = limited[OTHERS]
        inclusive[OTHERS] = [other[0] + other[1], other[2] + other[3]]
    return {
        (path or ROOT_MODULE): ModuleStats(
            calls=calls.get(path, 0), exclusive_matrix_flops=row[0], exclusive_other_flops=row[1],
            exclusive_bytes_read=row[2], exclusive_bytes_written=row[3],
            inclusive_flops=inclusive[path][0], inclusive_bytes=inclusive[path][1],
        )
        for path, row in limited.items()
    }


def flops_result(analysis: Analysis, options: CountOptions) -> FlopsResult:
    counts = analysis.counts
    macs = sum(call.macs * n for call, n in counts.executions.items())
    other = sum(call.other_flops * n for call, n in counts.executions.items())
    phases: dict[str, int] = defaultdict(int)
    for call, n in counts.executions.items():
        phases[call.phase] += (2 * call.macs + call.other_flops) * n
    phases.setdefault("forward", 0)
    total = 2 * macs + other
    devices = analysis.devices if analysis.devices > 1 else None
    return FlopsResult(
        matrix_flops=2 * macs,
        other_flops=other,
        total_flops=total,
        macs=macs,
        by_operator=operator_totals(counts, options.top_k),
        by_module=module_totals(counts, analysis.calls, options),
        by_phase=dict(sorted(phases.items(), key=lambda item: ("forward", "backward", "optimizer").index(item[0]))),
        uncounted_ops=dict(counts.uncounted),
        causal_mask_convention=CAUSAL_MASK_CONVENTION,
        other_flops_convention=(
            f"per jaxpr equation: {other_flops_convention()}. Loop bodies count once per iteration, a cond its "
            "largest branch, a shard_map/pmap body once per device (see control_flow). by_operator lists jaxpr "
            "primitives; by_module module paths from the name stack (linen scopes; rpx's scopes for NNX and "
            "Equinox). backward = gradient of the summed outputs w.r.t. the trainable params, plus the optimizer "
            "update when the model has one. Always counted abstractly, whatever count_on says; XLA's own figures "
            "are in compiler_figures"
        ),
        backward=options.backward,
        counted_on=COUNTED_ON,
        module_depth=options.module_depth,
        top_k=options.top_k,
        devices=devices,
        per_device_flops=total // analysis.devices if devices else None,
        control_flow=tuple(dict.fromkeys(counts.notes)),
        compiler_figures=analysis.compiler,
    )


def op_records(counts: JaxprCounts) -> tuple[OpRecord, ...]:
    """One record per kind of equation; its flops are one execution's matrix + other FLOPs."""
    records = [
        OpRecord(
            call.op, call.module, n, 2 * call.macs + call.other_flops, call.macs, call.bytes_read, call.bytes_written,
            phase=call.phase, inputs=call.inputs,
        )
        for call, n in counts.executions.items()
    ]
    return tuple(sorted(records, key=lambda r: -(r.bytes_read + r.bytes_written) * r.count))


def reported(figure: float | None) -> str:
    return "not reported" if figure is None else str(round(figure))


def xla_cost_text(figures: CompilerFigures) -> str:
    """XLA's figures in words (count_flops' compiler_figures has them as numbers, with the differences)."""
    if figures.error:
        return f"{figures.source}: none, {figures.error}"
    return (
        f"{figures.source} (not used above): flops {reported(figures.flops)}, transcendentals "
        f"{reported(figures.transcendentals)}, bytes accessed {reported(figures.bytes_accessed)}, temp + output "
        f"buffers {reported((figures.temp_bytes or 0) + (figures.output_bytes or 0))}; numbers and differences in "
        "count_flops' compiler_figures"
    )


def traffic_result(analysis: Analysis, options: CountOptions) -> TrafficResult:
    counts = analysis.counts
    unfused = counts.weight_read_bytes + counts.activation_read_bytes + counts.written_bytes
    fused = analysis.weight_bytes + analysis.input_bytes + analysis.output_bytes + (analysis.gradient_bytes or 0)
    total_flops = flops_result(analysis, options).total_flops
    resized = "; floating values at 1 byte (fp8/int8, traced at bf16)" if analysis.resized else ""
    return TrafficResult(
        unfused_bytes=unfused,
        unfused_weight_read_bytes=counts.weight_read_bytes,
        unfused_activation_read_bytes=counts.activation_read_bytes,
        unfused_written_bytes=counts.written_bytes,
        fused_bytes=fused,
        weight_bytes=analysis.weight_bytes,
        input_bytes=analysis.input_bytes,
        output_bytes=analysis.output_bytes,
        activation_peak_bytes=live_peak(analysis.jaxpr, analysis.size),
        activation_peak_bytes_fp16=live_peak(analysis.jaxpr, fp16_size),
        gradient_bytes=analysis.gradient_bytes,
        assumptions=(
            "unfused_*: every jaxpr equation reads its operands and writes its results (reshapes and broadcasts "
            "included, though XLA may make them free); loop bodies count once per iteration; literals are not reads"
            + resized,
            "weight_bytes: every params leaf once (floating leaves at the precision's dtype) plus the arrays the "
            "function closes over (constants, at their own dtype); reads of either count as weight reads",
            "activation_peak_bytes: liveness over the jaxpr, unfused (each equation's results held from creation to last "
            "use, outputs to the end; params and inputs excluded); _fp16 recounts floating values at 2 bytes",
            "backward: output_bytes are the loss (and updated params); gradient_bytes the trainable params' gradients"
            if options.backward else "forward only",
            xla_cost_text(analysis.compiler),
            "op_records: one per kind of equation that moves bytes (primitive, module, phase, operand shapes), flops = "
            "its matrix + other FLOPs; count x bytes sums to unfused_bytes and count x flops to total FLOPs",
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
    if not is_jax(ctx):
        return None
    constants = [v.aval for v in trace(ctx, backward=False).jaxpr.constvars]
    result = count_params(jax_model(ctx), ctx.job.precision, constants)
    for note in result.notes:
        warnings.warn(f"model {ctx.job.model.name!r}: {note}", stacklevel=2)
    return result


@hookimpl
def rpx_count_flops(ctx: StageContext) -> FlopsResult | None:
    if not is_jax(ctx):
        return None
    options = count_options(ctx)
    args, kwargs = trace(ctx, options.backward).inputs
    return attrs.evolve(flops_result(analyse(ctx), options), counted_inputs=inputs_text(args, kwargs),
                        counted_batch_size=ctx.job.model.batch_size(options.batch_size))


@hookimpl
def rpx_estimate_traffic(ctx: StageContext) -> TrafficResult | None:
    return traffic_result(analyse(ctx), count_options(ctx)) if is_jax(ctx) else None
