"""The ``train_step`` stage for the ``jax`` backend: one optax step of a JAX model (a Flax TrainState brings its own
``tx``), traced once on abstract values to count it by phase and predict its memory, compiled for XLA's own
``memory_analysis()``, and run for real.

The step, jitted with the trainable parameters and the optimiser state donated (updated in place, as training loops
do): for each micro-batch ``jax.value_and_grad`` of the loss with respect to the trainable parameters (under the
autocast policy they are cast to the low precision inside the loss, so gradients come back in fp32), gradients added
across micro-batches, then ``tx.update`` and ``optax.apply_updates``. Non-trainable collections (batch statistics)
are read, not updated. The loss: as for torch (:class:`~rpx_core.types.training.TrainStepOptions`), cross-entropy
against integer targets for logits, else mean squared error, or the user's ``loss(outputs)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from rpx_core.plugin import TRAINABLE, JaxModel, StageContext, UnsupportedError, hookimpl, load_callable
from rpx_core.types.training import (
    NAMED_LOSSES,
    CompilerMemory,
    TrainBatchSearchOptions,
    TrainBatchSearchResult,
    TrainStepOptions,
    TrainStepResult,
)
from rpx_plugins.training.report import StepCount, assemble, memory_assumptions

#: Named optimisers: (optax function, rpx's defaults); the spec's settings override them ("lr" means learning_rate).
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("sgd", {"learning_rate": 0.01, "momentum": 0.9}),
    "adam": ("adam", {"learning_rate": 1e-3}),
    "adamw": ("adamw", {"learning_rate": 1e-3, "weight_decay": 0.01}),
}
JAX_MEMORY = (
    "predicted memory (JAX): the step's jaxpr, each value held from its equation to its last use, unfused (XLA "
    "fuses elementwise chains, so its temporaries are fewer); outputs written into donated arguments (the updated "
    "parameters and optimiser state) cost nothing; compiler: XLA's memory_analysis() of the compiled step, "
    "arguments + outputs - aliased + temporaries",
    "JAX: non-trainable collections (batch statistics) are read by the step, not updated",
)


def handles(ctx: StageContext) -> bool:
    return ctx.backend.framework == "jax"


@attrs.frozen
class JaxPolicy:
    name: str  # "fp32", "autocast" or "pure"
    parameter_dtype: Any
    compute_dtype: Any  # what the loss casts trainable parameters to (the parameters' own dtype without autocast)


def jax_policy(precision: str, options: TrainStepOptions) -> JaxPolicy:
    import jax.numpy as jnp

    if precision not in ("fp32", "bf16", "fp16"):
        raise UnsupportedError(f"train_step runs at fp32, bf16 and fp16, not {precision!r}")
    if precision == "fp32":
        return JaxPolicy("fp32", jnp.dtype("float32"), jnp.dtype("float32"))
    low = jnp.dtype("bfloat16" if precision == "bf16" else "float16")
    if options.precision_policy == "pure":
        return JaxPolicy("pure", low, low)
    return JaxPolicy("autocast", jnp.dtype("float32"), low)


def raw_model(ctx: StageContext) -> Any:
    """The model as the user gave it (before adapting): a TrainState's ``tx`` is read from it."""
    if ctx.model_object is not None:
        return ctx.model_object
    with ctx.setup_phase("build"):
        return ctx.model_factory()()


def transformation(options: TrainStepOptions, raw: Any) -> tuple[Any, str, dict[str, Any]]:
    """(optax GradientTransformation, its name, its settings)."""
    import optax

    from rpx_plugins.jax.adapters import is_train_state

    if options.optimizer is None and is_train_state(raw):
        return raw.tx, "the TrainState's tx", {}
    name = options.optimizer or "adamw"
    settings = {("learning_rate" if key == "lr" else key): value for key, value in options.optimizer_settings.items()}
    if name in OPTIMIZERS:
        function, defaults = OPTIMIZERS[name]
        settings = {**defaults, **settings}
        factory, label = getattr(optax, function), f"optax.{function}"
    else:
        factory, label = load_callable(name, what="options.train_step.optimizer"), name
    try:
        return factory(**settings), label, settings
    except TypeError as exc:
        raise UnsupportedError(f"options.train_step.optimizer_settings: {label} does not take them: {exc}") from None


def output_tensor(outputs: Any) -> tuple[Any, bool]:
    """The array a default loss reads and whether it is logits (a ``logits`` field, or a 2-D [batch, classes])."""
    import jax

    from rpx_plugins.jax.backend import is_floating

    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if logits is not None:
        return logits, True
    floating = [leaf for leaf in jax.tree.leaves(outputs) if is_floating(leaf.dtype)]
    if not floating:
        raise UnsupportedError("train_step: the model returns no floating array to compute a default loss from; give "
                               "options.train_step.loss as an import path")
    return floating[0], floating[0].ndim == 2 and floating[0].shape[-1] > 1


@attrs.frozen
class Loss:
    """The loss kind and its targets' shape and dtype (made once, from the output's shape, like the inputs)."""

    kind: str  # "cross_entropy", "mse" or "user"
    function: Callable[[Any, Any], Any]
    target_shape: tuple[int, ...] | None
    target_dtype: Any
    description: str


def make_loss(options: TrainStepOptions, apply: Callable[..., Any], params: Any, args: Any, kwargs: Any) -> Loss:
    import jax
    import jax.numpy as jnp
    import optax

    if options.loss not in NAMED_LOSSES:
        user = load_callable(options.loss, what="options.train_step.loss")
        return Loss("user", lambda outputs, targets: user(outputs), None, None, f"{options.loss} (user's)")
    tensor, is_logits = output_tensor(jax.eval_shape(apply, params, *args, **kwargs))
    kind = options.loss if options.loss != "auto" else ("cross_entropy" if is_logits else "mse")
    shape = tuple(tensor.shape)
    what = f"{'auto: logits' if is_logits else 'auto: output'}" if options.loss == "auto" else "output"
    description = f"{kind} ({what} {list(shape)}, random targets)"
    if kind == "cross_entropy":
        def cross_entropy(outputs: Any, targets: Any) -> Any:
            logits = output_tensor(outputs)[0]
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()

        return Loss(kind, cross_entropy, shape[:-1], jnp.int32, description)

    def mse(outputs: Any, targets: Any) -> Any:
        return jnp.mean((output_tensor(outputs)[0].astype(jnp.float32) - targets) ** 2)

    return Loss(kind, mse, shape, jnp.float32, description)


def step_function(model: JaxModel, tx: Any, policy: JaxPolicy, loss: Loss, accumulation: int) -> Callable[..., Any]:
    """``(trainable, others, opt_state, args, kwargs, targets) -> (trainable, opt_state, loss)``: one whole step."""
    import jax
    import jax.numpy as jnp
    import optax

    from rpx_plugins.jax.backend import is_floating
    from rpx_plugins.jax.jaxpr import ACCUMULATE_SCOPE, OPTIMIZER_SCOPE

    leaves, treedef = jax.tree.flatten(model.params)
    roles = model.leaf_roles()

    def merged(trainable: list[Any], others: list[Any]) -> Any:
        given, rest = iter(trainable), iter(others)
        return jax.tree.unflatten(treedef, [next(given) if role == TRAINABLE else next(rest) for role in roles])

    def loss_of(trainable: list[Any], others: list[Any], args: Any, kwargs: Any, targets: Any) -> Any:
        cast = [leaf.astype(policy.compute_dtype) if is_floating(leaf.dtype) else leaf for leaf in trainable]
        value = loss.function(model.apply(merged(cast, others), *args, **kwargs), targets)
        return value / accumulation if accumulation > 1 else value

    gradient = jax.value_and_grad(loss_of)

    def step(trainable: list[Any], others: list[Any], opt_state: Any, args: Any, kwargs: Any, targets: Any) -> Any:
        total, grads = gradient(trainable, others, args, kwargs, targets)
        for _ in range(accumulation - 1):
            value, more = gradient(trainable, others, args, kwargs, targets)
            with jax.named_scope(ACCUMULATE_SCOPE):
                grads = jax.tree.map(jnp.add, grads, more)
                total = total + value
        with jax.named_scope(OPTIMIZER_SCOPE):
            updates, opt_state = tx.update(grads, opt_state, trainable)
            trainable = optax.apply_updates(trainable, updates)
        return trainable, opt_state, total

    return step


@attrs.frozen
class Parts:
    """One step's arguments by kind (arrays, or ShapeDtypeStructs to count)."""

    trainable: list[Any]
    others: list[Any]
    opt_state: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    targets: Any

    def arguments(self) -> tuple[Any, ...]:
        return self.trainable, self.others, self.opt_state, self.args, self.kwargs, self.targets


def split(model: JaxModel, params: Any) -> tuple[list[Any], list[Any]]:
    import jax

    roles = model.leaf_roles()
    leaves = jax.tree.leaves(params)
    return ([leaf for leaf, role in zip(leaves, roles) if role == TRAINABLE],
            [leaf for leaf, role in zip(leaves, roles) if role != TRAINABLE])


def abstract_parts(ctx: StageContext, model: JaxModel, tx: Any, policy: JaxPolicy, options: TrainStepOptions,
                   loss: Loss | None = None) -> tuple[Parts, Loss]:
    """The step's arguments as ShapeDtypeStructs on the job's device: parameters at the policy's dtype."""
    import jax

    from rpx_plugins.jax.backend import input_dtype, is_floating, resolve_device, split_inputs

    placed = jax.sharding.SingleDeviceSharding(resolve_device(ctx.job.device))

    def abstract(leaf: Any, dtype: Any = None) -> Any:
        aval = jax.typeof(leaf) if not isinstance(leaf, jax.ShapeDtypeStruct) else leaf
        wanted = dtype if dtype is not None and is_floating(aval.dtype) else aval.dtype
        return jax.ShapeDtypeStruct(aval.shape, wanted, sharding=placed)

    params = jax.tree.map(lambda leaf: abstract(leaf, policy.parameter_dtype), model.params)
    trainable, others = split(model, params)
    positional, named = split_inputs(ctx.job.model)
    precision = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[policy.parameter_dtype.name]

    def given(spec_input: Any) -> Any:
        shape = spec_input.with_batch(options.batch_size).shape
        return jax.ShapeDtypeStruct(shape, input_dtype(spec_input, precision), sharding=placed)

    args = tuple(given(i) for i in positional)
    kwargs = {name: given(i) for name, i in named.items()}
    loss = loss or make_loss(options, model.apply, params, args, kwargs)
    targets = None if loss.target_shape is None else jax.ShapeDtypeStruct(loss.target_shape, loss.target_dtype,
                                                                          sharding=placed)
    opt_state = jax.eval_shape(tx.init, trainable)
    return Parts(trainable, others, opt_state, args, kwargs, targets), loss


def real_parts(ctx: StageContext, model: JaxModel, tx: Any, policy: JaxPolicy, loss: Loss,
               options: TrainStepOptions) -> Parts:
    """The step's arguments as arrays on the job's device."""
    import jax

    from rpx_plugins.jax.backend import is_floating, resolve_device

    device = resolve_device(ctx.job.device)
    cast = jax.jit(lambda tree: jax.tree.map(
        lambda leaf: leaf.astype(policy.parameter_dtype) if is_floating(leaf.dtype) else leaf, tree))
    params = jax.device_put(cast(model.params), device)
    trainable, others = split(model, params)
    precision = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[policy.parameter_dtype.name]
    args, kwargs = ctx.backend.make_inputs(ctx.job.model, options.batch_size, precision, ctx.job.device)
    targets = None
    if loss.target_shape is not None:
        key = jax.random.key(1)
        if loss.kind == "cross_entropy":
            classes = abstract_classes(model, params, args, kwargs)
            targets = jax.random.randint(key, loss.target_shape, 0, classes, loss.target_dtype)
        else:
            targets = jax.random.normal(key, loss.target_shape, loss.target_dtype)
        targets = jax.device_put(targets, device)
    return Parts(trainable, others, jax.device_put(tx.init(trainable), device), args, kwargs, targets)


def abstract_classes(model: JaxModel, params: Any, args: Any, kwargs: Any) -> int:
    import jax

    return int(output_tensor(jax.eval_shape(model.apply, params, *args, **kwargs))[0].shape[-1])


def jitted(function: Callable[..., Any]) -> Any:
    import jax

    return jax.jit(function, donate_argnums=(0, 2))


def count(ctx: StageContext, step: Callable[..., Any], parts: Parts, model: JaxModel,
          options: TrainStepOptions) -> tuple[StepCount, CompilerMemory | None]:
    """Trace the step on abstract values: counts by phase, liveness, XLA's memory analysis of the compiled step."""
    import jax

    from rpx_plugins.jax.counts import op_records
    from rpx_plugins.jax.jaxpr import JaxprCounts, ModuleNaming, nbytes, walk
    from rpx_plugins.training.jax_liveness import step_liveness

    traced = jitted(step).trace(*parts.arguments())
    closed = traced.jaxpr
    jaxpr = closed.jaxpr
    parameter_leaves = len(parts.trainable) + len(parts.others)
    weights = set(jaxpr.invars[:parameter_leaves]) | set(jaxpr.constvars)
    counts = JaxprCounts()
    naming = ModuleNaming(model.root_scope, model.ignored_scopes)
    walk(jaxpr, weights, counts, naming=naming,
         while_iterations=getattr(ctx.options("count_flops"), "while_iterations", None))
    donated = jaxpr.outvars[: len(parts.trainable) + len(jax.tree.leaves(parts.opt_state))]
    live = step_liveness(jaxpr, nbytes, naming, donated)
    resident = {
        "parameters": sum(nbytes(leaf) for leaf in parts.trainable),
        "buffers": sum(nbytes(leaf) for leaf in parts.others),
        "optimizer_state": sum(nbytes(leaf) for leaf in jax.tree.leaves(parts.opt_state)),
        "batch": sum(nbytes(leaf) for leaf in jax.tree.leaves((parts.args, parts.kwargs, parts.targets))),
    }
    step_count = StepCount(
        records=op_records(counts), uncounted_ops=dict(counts.uncounted), at_peak=live.at_peak,
        transient_peak_bytes=live.peak_bytes, peak_phase=live.peak_phase, peak_operator=live.peak_operator,
        peak_position=live.peak_position, phases=live.phases, resident=resident,
        gradient_bytes=resident["parameters"],
    )
    return step_count, compiler_memory(traced, ctx)


def compiler_memory(traced: Any, ctx: StageContext) -> CompilerMemory | None:
    """XLA's memory analysis of the compiled step; None where this platform does not give one."""
    try:
        analysis = traced.lower().compile().memory_analysis()
    except Exception:  # a platform that cannot compile it here, or gives no analysis: the prediction stands alone
        return None
    if analysis is None:
        return None
    argument, output = int(analysis.argument_size_in_bytes), int(analysis.output_size_in_bytes)
    alias, temp = int(analysis.alias_size_in_bytes), int(analysis.temp_size_in_bytes)
    return CompilerMemory(argument, output, alias, temp, argument + output - alias + temp,
                          f"XLA memory_analysis() of the compiled step on {ctx.job.device}")


class Runner:
    """The real step: the jitted function and its state, each call one whole step, blocking until it is done."""

    def __init__(self, step: Any, parts: Parts) -> None:
        self.step, self.parts = step, parts
        self.trainable, self.opt_state = parts.trainable, parts.opt_state

    def __call__(self) -> None:
        import jax

        p = self.parts
        self.trainable, self.opt_state, loss = self.step(self.trainable, p.others, self.opt_state, p.args, p.kwargs,
                                                         p.targets)
        jax.block_until_ready((self.trainable, self.opt_state, loss))


def jax_train_step(ctx: StageContext) -> TrainStepResult:
    from rpx_plugins.jax.backend import as_jax_model, resolve_device

    options = ctx.options("train_step") or TrainStepOptions()
    if options.count_on == "device":
        raise UnsupportedError("[options.train_step] count_on = \"device\": a JAX step is counted on abstract "
                               "values only (its jaxpr); use \"auto\" or \"meta\"")
    policy = jax_policy(ctx.job.precision, options)
    raw = raw_model(ctx)
    model = as_jax_model(ctx.adapt(raw))
    tx, optimizer, settings = transformation(options, raw)
    parts, loss = abstract_parts(ctx, model, tx, policy, options)
    step = step_function(model, tx, policy, loss, options.accumulation_steps)
    step_count, compiler = count(ctx, step, parts, model, options)
    batch_size = ctx.job.model.batch_size(options.batch_size) or 1
    result = assemble(
        ctx, options, framework="jax", count=step_count, counted_on="abstract", optimizer=optimizer,
        settings=settings, loss=loss.description, policy=policy.name, parameter_dtype=policy.parameter_dtype.name,
        compute_dtype=policy.compute_dtype.name, batch_size=batch_size,
        notes=(*JAX_MEMORY, *memory_assumptions(policy.name)), compiler=compiler,
    )
    if not options.measure:
        return attrs.evolve(result, not_measured="options.train_step.measure is false")
    from rpx_plugins.training.measure import compare, measure_steps

    def build() -> Runner:
        return Runner(jitted(step), real_parts(ctx, model, tx, policy, loss, options))

    on_host = resolve_device(ctx.job.device).platform == "cpu"
    taken = measure_steps(ctx, build, batch_size, batch_size * options.accumulation_steps, options, on_host)
    memory = result.memory
    return attrs.evolve(result, measured=taken,
                        comparison=compare(memory.resident_bytes, memory.transient_peak_bytes, taken.peak_memory,
                                           on_host))


@hookimpl
def rpx_train_step(ctx: StageContext) -> TrainStepResult | None:
    return jax_train_step(ctx) if handles(ctx) else None


# -- the training batch search -----------------------------------------------------------------------------------------


def jax_batch_search(ctx: StageContext) -> TrainBatchSearchResult:
    """The search of rpx_plugins.training.search over the jitted step: counted on abstract values at the rough limit
    and half of it, each trial a fresh compile and real steps at its batch size."""
    import contextlib

    from rpx_plugins.jax.backend import as_jax_model, resolve_device
    from rpx_plugins.training.host_allocator import freed_memory_returned, trim
    from rpx_plugins.training.measure import no_preparation
    from rpx_plugins.training.search import (
        FIRST_SIZE,
        Search,
        baseline,
        budget_of,
        prediction_through,
        result,
        rough_limit,
        run_search,
        trial_runner,
    )

    options = ctx.options("train_batch_search") or TrainBatchSearchOptions()
    step_options = ctx.options("train_step") or TrainStepOptions()
    policy = jax_policy(ctx.job.precision, step_options)
    raw = raw_model(ctx)
    model = as_jax_model(ctx.adapt(raw))
    tx = transformation(step_options, raw)[0]
    backend, device = ctx.backend, ctx.job.device
    budget, margin = budget_of(backend, device, options)

    def at(size: int) -> tuple[Any, Loss, TrainStepOptions]:
        sized = attrs.evolve(step_options, batch_size=size)
        parts, loss = abstract_parts(ctx, model, tx, policy, sized)
        return parts, loss, sized

    def counted_at(size: int) -> StepCount:
        parts, loss, sized = at(size)
        step = step_function(model, tx, policy, loss, sized.accumulation_steps)
        return count(ctx, step, parts, model, sized)[0]

    def build(size: int) -> Runner:
        _, loss, sized = at(size)
        step = step_function(model, tx, policy, loss, sized.accumulation_steps)
        return Runner(jitted(step), real_parts(ctx, model, tx, policy, loss, sized))

    on_host = resolve_device(device).platform == "cpu"
    with freed_memory_returned() if on_host else contextlib.nullcontext("") as allocator:
        held, reading = baseline(backend, device)
        limit = rough_limit(counted_at(FIRST_SIZE), FIRST_SIZE, budget - margin - held, options.max_batch)
        predicted = prediction_through((limit // 2, counted_at(limit // 2)), (limit, counted_at(limit)))
        trial = trial_runner(ctx, build, lambda size: size * step_options.accumulation_steps, options,
                             trim if on_host else no_preparation)
        search = Search(predicted, held, budget - margin, options)
        run_search(search, trial, ctx.progress)
    return result(search, budget, margin, reading + (f"; {allocator}" if allocator else ""))


@hookimpl
def rpx_train_batch_search(ctx: StageContext) -> TrainBatchSearchResult | None:
    return jax_batch_search(ctx) if handles(ctx) else None
