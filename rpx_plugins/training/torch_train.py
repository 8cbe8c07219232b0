"""The ``train_step`` stage for torch backends: build the step, count it (on fake tensors of the job's device type, or
on the device), predict its memory, bound it per phase, and measure real steps.

The counted step and the measured step are the same :class:`~rpx_plugins.training.torch_step.TorchStep` code, built
over different tensors: fake ones (``FakeTensorMode``: shapes, dtypes and a device, no memory) or real ones on the
job's device. A model that cannot run on fake tensors (an operator whose result depends on values) is counted on the
device under ``count_on = "auto"``, and the result says why.
"""

from __future__ import annotations

from typing import Any

import attrs

from rpx_core.plugin import StageContext, UnsupportedError, hookimpl
from rpx_core.types.training import TrainBatchSearchOptions, TrainBatchSearchResult, TrainStepOptions, TrainStepResult
from rpx_plugins.training.report import assemble, memory_assumptions
from rpx_plugins.training.torch_step import Policy, build_step, dtype_name, policy_for

#: What counting on fake tensors can fail with (data-dependent operators; a torch without the device's support).
FAKE_FAILURES = (RuntimeError, NotImplementedError)
TORCH_MEMORY = (
    "predicted memory: storages the step's operators allocate, as the dispatcher sees them, each from its operator "
    "until its last reference dies; kernel workspaces inside an operator (oneDNN's reorders of NCHW convolutions on "
    "the CPU, cuDNN and cuBLAS workspaces) and the allocator's rounding and caching are not included",
)


def handles(ctx: StageContext) -> bool:
    return ctx.backend.framework == "torch"


def train_options(ctx: StageContext) -> TrainStepOptions:
    return ctx.options("train_step") or TrainStepOptions()


def device_type(device: str) -> str:
    return device.partition(":")[0]


def counting_device(device: str) -> tuple[str, str | None]:
    """The device fake tensors take, and why it differs from the job's (a CUDA job counted where torch has no CUDA
    counts with CPU kernels and CPU autocast)."""
    import torch

    if device_type(device) == "cuda" and not torch.cuda.is_available():
        return "cpu", ("counted on fake CPU tensors (this torch has no CUDA): CPU kernel choices and CPU autocast's "
                       "operator lists, which differ from CUDA's in places")
    return device, None


def unplaced_meta_model(ctx: StageContext) -> Any:
    """The job's model on the meta device (a factory built there, or a copy of the live object), never shared."""
    from rpx_plugins.torch.counter import build_on_meta
    from rpx_plugins.torch.counts import looked_inside, meta_copy

    if ctx.model_object is not None:
        return meta_copy(looked_inside(ctx, ctx.adapt(ctx.model_object)))
    with ctx.setup_phase("build"):
        return looked_inside(ctx, build_on_meta(ctx.model_factory()))


def channels_last(options: TrainStepOptions) -> bool:
    return options.memory_format == "channels_last"


def inputs_in_format(args: tuple[Any, ...], kwargs: dict[str, Any], options: TrainStepOptions) -> tuple:
    """The 4-D floating inputs in channels-last layout when the options ask for it."""
    import torch

    if not channels_last(options):
        return args, kwargs

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value

    return tuple(convert(v) for v in args), {k: convert(v) for k, v in kwargs.items()}


def fake_step(ctx: StageContext, options: TrainStepOptions, policy: Policy) -> tuple[Any, str, list[str]]:
    """The step over fake tensors, what it was counted on, and notes."""
    from rpx_plugins.torch.backend import make_inputs
    from rpx_plugins.training.torch_count import fake_mode, faked

    device, why = counting_device(ctx.job.device)
    mode = fake_mode()
    model = faked(unplaced_meta_model(ctx), mode, device, policy.parameter_dtype, channels_last(options))
    with mode:
        args, kwargs = inputs_in_format(*make_inputs(ctx.job.model, options.batch_size, policy.input_precision,
                                                     device), options)
    built = build_step(model, args, kwargs, policy, device_type(device), options, fake=True)
    return built, f"fake {device_type(device)}", [why] if why else []


def placed_model(ctx: StageContext, options: TrainStepOptions, policy: Policy) -> Any:
    """The model built afresh on the job's device at the policy's dtype (never the placed eval model)."""
    import torch

    from rpx_plugins.torch.counts import looked_inside

    model = looked_inside(ctx, ctx.build_model()).to(device=ctx.job.device, dtype=policy.parameter_dtype)
    return model.to(memory_format=torch.channels_last) if channels_last(options) else model


def step_on(ctx: StageContext, model: Any, options: TrainStepOptions, policy: Policy, batch_size: int | None) -> Any:
    """A step of ``model`` over real inputs at ``batch_size`` on the job's device (a new optimiser)."""
    from rpx_plugins.torch.backend import make_inputs

    args, kwargs = inputs_in_format(*make_inputs(ctx.job.model, batch_size, policy.input_precision, ctx.job.device),
                                    options)
    return build_step(model, args, kwargs, policy, device_type(ctx.job.device), options)


def real_step(ctx: StageContext, options: TrainStepOptions, policy: Policy, batch_size: int | None) -> Any:
    return step_on(ctx, placed_model(ctx, options, policy), options, policy, batch_size)


def counted(ctx: StageContext, options: TrainStepOptions, policy: Policy) -> tuple[Any, Any, str, list[str]]:
    """(step count, built step, counted on, notes), on fake tensors or the device as ``count_on`` says."""
    from rpx_plugins.torch.counts import describe
    from rpx_plugins.training.torch_count import count_step

    formulas = ctx.plugins.op_formulas() if ctx.plugins is not None else ()
    if options.count_on != "device":
        try:
            built, where, notes = fake_step(ctx, options, policy)
            return count_step(built[0], device_type(where.split()[-1]), formulas, top_k=None), built, where, notes
        except FAKE_FAILURES as error:
            if options.count_on == "meta":
                raise UnsupportedError(f"train_step cannot be counted on fake tensors: {describe(error)}; set "
                                       "[options.train_step] count_on = \"device\"") from error
            fallback = f"could not count on fake tensors ({describe(error)}); counted on {ctx.job.device}"
    else:
        fallback = None
    built = real_step(ctx, options, policy, options.batch_size)
    count = count_step(built[0], device_type(ctx.job.device), formulas, top_k=None)
    return count, built, device_type(ctx.job.device), [fallback] if fallback else []


def measured(ctx: StageContext, options: TrainStepOptions, policy: Policy, batch_size: int, on_host: bool) -> Any:
    from rpx_plugins.training.measure import measure_steps

    def build() -> Any:
        return real_step(ctx, options, policy, options.batch_size)[0]

    return measure_steps(ctx, build, batch_size, batch_size * options.accumulation_steps, options, on_host)


def torch_train_step(ctx: StageContext) -> TrainStepResult:
    options = train_options(ctx)
    policy = policy_for(ctx.job.precision, options)
    count, (step, optimizer, settings, describe_loss), where, notes = counted(ctx, options, policy)
    batch_size = ctx.job.model.batch_size(options.batch_size) or 1
    result = assemble(
        ctx, options, framework="torch", count=count, counted_on=where, optimizer=optimizer, settings=settings,
        loss=describe_loss(), policy=policy.name, parameter_dtype=dtype_name(policy.parameter_dtype),
        compute_dtype=dtype_name(policy.compute_dtype), batch_size=batch_size,
        notes=(*notes, *TORCH_MEMORY, *memory_assumptions(policy.name)),
    )
    del step
    if not options.measure:
        return attrs.evolve(result, not_measured="options.train_step.measure is false")
    from rpx_plugins.training.measure import compare

    on_host = device_type(ctx.job.device) == "cpu"
    taken = measured(ctx, options, policy, batch_size, on_host)
    memory = result.memory
    return attrs.evolve(result, measured=taken,
                        comparison=compare(memory.resident_bytes, memory.transient_peak_bytes, taken.peak_memory,
                                           on_host))


@hookimpl(trylast=True)
def rpx_train_step(ctx: StageContext) -> TrainStepResult | None:
    return torch_train_step(ctx) if handles(ctx) else None


# -- the training batch search -----------------------------------------------------------------------------------------


def predicted_line(ctx: StageContext, options: TrainStepOptions, policy: Policy, room: int, max_batch: int) -> Any:
    """The step counted roughly at FIRST_SIZE, then at the rough limit and half of it: the search's prediction."""
    from rpx_plugins.training.search import FIRST_SIZE, prediction_through, rough_limit
    from rpx_plugins.training.torch_count import count_step

    def counted_at(size: int) -> Any:
        (step, *_), where, _ = fake_step(ctx, attrs.evolve(options, batch_size=size), policy)
        return count_step(step, device_type(where.split()[-1]))

    limit = rough_limit(counted_at(FIRST_SIZE), FIRST_SIZE, room, max_batch)
    return prediction_through((limit // 2, counted_at(limit // 2)), (limit, counted_at(limit)))


def torch_batch_search(ctx: StageContext) -> TrainBatchSearchResult:
    import contextlib

    from rpx_plugins.training.host_allocator import freed_memory_returned, trim
    from rpx_plugins.training.measure import no_preparation
    from rpx_plugins.training.search import Search, baseline, budget_of, result, run_search, trial_runner

    options = ctx.options("train_batch_search") or TrainBatchSearchOptions()
    step_options = train_options(ctx)
    policy = policy_for(ctx.job.precision, step_options)
    backend, device = ctx.backend, ctx.job.device
    budget, margin = budget_of(backend, device, options)
    on_host = device_type(device) == "cpu"
    with freed_memory_returned() if on_host else contextlib.nullcontext("") as allocator:
        held, reading = baseline(backend, device)
        predicted = predicted_line(ctx, step_options, policy, budget - margin - held, options.max_batch)
        model = placed_model(ctx, step_options, policy)
        trial = trial_runner(ctx, lambda batch: step_on(ctx, model, step_options, policy, batch)[0],
                             lambda batch: batch * step_options.accumulation_steps, options,
                             trim if on_host else no_preparation)
        search = Search(predicted, held, budget - margin, options)
        enforced = backend.set_memory_budget(device, budget)
        try:
            run_search(search, trial, ctx.progress)
        finally:
            if enforced:
                backend.set_memory_budget(device, None)
    return result(search, budget, margin, reading + (f"; {allocator}" if allocator else ""))


@hookimpl(trylast=True)
def rpx_train_batch_search(ctx: StageContext) -> TrainBatchSearchResult | None:
    return torch_batch_search(ctx) if handles(ctx) else None
