"""The built-in Tier 1 stages for torch models: parameters, FLOPs, bytes moved and activation memory.

Counting happens on the meta device when it can (shapes and dtypes only: a 70B-parameter model fits in a laptop's
memory), else on real tensors on the job's device, and the result says why (``fallback_reason``); the counts do not
depend on which. One counting pass per job feeds both ``count_flops`` and ``estimate_traffic``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import attrs

from rpx_core.plugin import NotApplicable, StageContext, UnsupportedError, hookimpl
from rpx_core.types.counts import CountOptions, FlopsResult, ParamsResult, TrafficResult

#: What building or running a model on meta can fail with (the counter's CountingError is a RuntimeError); any other
#: error is a bug in the model or the spec and would fail on the device too.
META_FAILURES = (NotImplementedError, RuntimeError)


def handles(ctx: StageContext) -> bool:
    return ctx.backend.framework == "torch"


#: Precisions torch cannot execute, counted on meta with a 2-byte stand-in precision (the same operators and shapes,
#: so the same FLOPs) whose floating tensors are priced at the precision's own element size (1 byte).
STAND_INS = {"fp8": "bf16", "int8": "bf16"}


def counted_precision(precision: str) -> str:
    """The precision the counted pass runs at: the precision itself, or its stand-in (STAND_INS)."""
    return STAND_INS.get(precision, precision)


def element_sizes(precision: str) -> dict[Any, int] | None:
    """The stand-in dtype -> the precision's element size, for a precision counted with a stand-in; else None."""
    if precision not in STAND_INS:
        return None
    from rpx_core.plugin import BYTES_PER_ELEMENT
    from rpx_plugins.torch.backend import torch_dtype

    return {torch_dtype(STAND_INS[precision]): BYTES_PER_ELEMENT[precision]}


def meta_model(ctx: StageContext) -> Any:
    """The job's model built on the meta device at the job's precision (or its stand-in), once per job."""
    if "meta_model" not in ctx.cache:
        from rpx_plugins.torch.backend import torch_dtype
        from rpx_plugins.torch.counter import build_on_meta

        with ctx.setup_phase("import"):
            build = ctx.model_factory()
        with ctx.setup_phase("build"):
            model = looked_inside(ctx, build_on_meta(build))
        ctx.cache["meta_model"] = model.eval().to(dtype=torch_dtype(counted_precision(ctx.job.precision)))
    return ctx.cache["meta_model"]


def looked_inside(ctx: StageContext, model: Any) -> Any:
    """``model`` when it is a torch.nn.Module; any other callable (a client of a served model, a compiled artefact)
    is opaque: its counted stages are not applicable, said with the reason, while its measured stages run."""
    import torch

    if isinstance(model, torch.nn.Module):
        return model
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    raise NotApplicable(f"model {ctx.job.model.name!r} is a {kind}, not a torch.nn.Module: rpx cannot look inside "
                        "it, so it is not counted (measured stages still run)")


def live_meta_copy(ctx: StageContext) -> Any:
    """A meta copy (see meta_copy) of the live model object passed through the Python API, at the job's precision
    (or its stand-in); the caller's model is never changed."""
    from rpx_plugins.torch.backend import torch_dtype

    model = looked_inside(ctx, ctx.adapt(ctx.model_object))
    return meta_copy(model).to(dtype=torch_dtype(counted_precision(ctx.job.precision)))


def meta_copy(model: Any) -> Any:
    """A copy of ``model`` whose parameters and buffers are meta tensors of the same shapes and dtypes, made without
    copying their data (tied parameters stay tied). Tensors held outside parameters and buffers are copied as they
    are, so a forward that mixes them with the meta weights fails, and ``count_on = "auto"`` counts on the device."""
    import torch

    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = buffer.detach().to("meta")
    return copy.deepcopy(model, memo)


def count(ctx: StageContext) -> Any:
    """Count once per job (cached): on meta when possible, else on the device, as ``count_on`` says."""
    if "count_report" not in ctx.cache:
        options: CountOptions = ctx.options("count_flops")
        report, fallback_reason = counted_where_asked(ctx, options)
        batch = ctx.job.model.batch_size(options.batch_size)
        flops = attrs.evolve(report.flops, counted_batch_size=batch, fallback_reason=fallback_reason)
        ctx.cache["count_report"] = attrs.evolve(report, flops=flops)
    return ctx.cache["count_report"]


def counted_where_asked(ctx: StageContext, options: CountOptions) -> tuple[Any, str | None]:
    """The counted pass, and why it ran on the device when meta was asked for (None when it was not). A live object
    is counted like a factory's model: a copy of it moved to meta, or its copy placed on the job's device."""
    stand_in = ctx.job.precision in STAND_INS
    if options.count_on == "device":
        if stand_in:
            raise UnsupportedError(f"precision {ctx.job.precision!r} is counted on the meta device only (torch backends "
                                   "cannot execute it); set [options.count_flops] count_on = \"meta\" or \"auto\"")
        return count_pass(ctx, *device_model(ctx), options), None
    try:
        model = live_meta_copy(ctx) if ctx.model_object is not None else meta_model(ctx)
        return count_pass(ctx, model, "meta", options), None
    except META_FAILURES as error:
        if options.count_on == "meta" or ctx.job.model.meta_only or stand_in:
            raise
        ctx.cache.pop("meta_model", None)
        report = count_pass(ctx, *device_model(ctx), options)
        return report, f"could not count on meta: {describe(error)}; counted on {report.flops.counted_on}"


def device_model(ctx: StageContext) -> tuple[Any, str]:
    """The model counted on the job's device: the placed model the measuring stages share (for a live object, its
    placed copy)."""
    return looked_inside(ctx, ctx.model()), ctx.job.device


def describe(error: BaseException) -> str:
    """``Type: first line of the message``, short enough for a result field."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


@contextlib.contextmanager
def module_mode(model: Any, training: bool) -> Iterator[None]:
    """``model`` (every submodule) in training or eval mode for the counted pass, each submodule's own mode put back
    after it: the placed model is shared with the stages that measure it in eval mode."""
    before = [(module, module.training) for module in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for module, was_training in before:
            module.training = was_training


def count_pass(ctx: StageContext, model: Any, device: str, options: CountOptions) -> Any:
    import torch

    from rpx_plugins.torch.backend import make_inputs
    from rpx_plugins.torch.counter import count_model

    precision = ctx.job.precision
    args, kwargs = make_inputs(ctx.job.model, options.batch_size, counted_precision(precision), device)
    with torch.no_grad(), module_mode(model, training=options.mode == "train"):
        return count_model(model, args, kwargs, backward=options.backward, top_k=options.top_k,
                           module_depth=options.module_depth, formulas=ctx.plugins.op_formulas(),
                           attention_backward=options.attention_backward, element_sizes=element_sizes(precision),
                           replay_repeats=options.replay_repeats)


@hookimpl(trylast=True)
def rpx_count_params(ctx: StageContext) -> ParamsResult | None:
    if not handles(ctx):
        return None
    from rpx_plugins.torch.params import count_parameters

    if ctx.model_object is not None:
        return count_parameters(looked_inside(ctx, ctx.adapt(ctx.model_object)), ctx.job.precision)
    try:
        model = meta_model(ctx)
    except META_FAILURES:
        if ctx.job.model.meta_only:
            raise
        model = looked_inside(ctx, ctx.build_model())  # the factory cannot build on meta: count a real, unplaced model
    return count_parameters(model, ctx.job.precision)


@hookimpl(trylast=True)
def rpx_count_flops(ctx: StageContext) -> FlopsResult | None:
    return count(ctx).flops if handles(ctx) else None


@hookimpl(trylast=True)
def rpx_estimate_traffic(ctx: StageContext) -> TrafficResult | None:
    return count(ctx).traffic if handles(ctx) else None
