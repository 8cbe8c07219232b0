"""The built-in implementations of the ``serve`` and ``measure_serving`` stages for torch models (answered
``trylast``, so a plugin can answer them first for its own backends or models); their declarations, tables and
charts are in rpx_plugins.stages.serving."""

from __future__ import annotations

from typing import Any

from rpx_core.plugin import (
    FLOAT_DTYPES,
    GPUSpec,
    MissingPeakError,
    RpxError,
    StageContext,
    hookimpl,
)
from rpx_core.types.roofline import SkippedRoofline
from rpx_core.types.serving import (
    MeasureServingResult,
    ServeOptions,
    ServeResult,
)


def handles(ctx: StageContext) -> bool:
    return ctx.backend.framework == "torch"


@hookimpl(trylast=True)
def rpx_serve(ctx: StageContext) -> ServeResult | None:
    return serve(ctx) if handles(ctx) else None


@hookimpl(trylast=True)
def rpx_measure_serving(ctx: StageContext) -> MeasureServingResult | None:
    if not handles(ctx):
        return None
    from rpx_plugins.serving.measure import measure_steps

    return measure_steps(ctx)


def token_input_shape(ctx: StageContext) -> tuple[int, int] | None:
    """(batch, sequence) of the model's token-id input, as the spec gives it; None without one (an input_factory)."""
    for spec_input in ctx.job.model.inputs:
        if spec_input.dtype not in FLOAT_DTYPES and len(spec_input.shape) >= 2:
            return spec_input.shape[spec_input.batch_dim or 0], spec_input.shape[1]
    return None


def step_sizes(ctx: StageContext, options: ServeOptions) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(prompt, contexts, batch sizes): the options', else the model input's."""
    shape = token_input_shape(ctx)
    prompt = options.prompt or (shape[1] if shape else None)
    if prompt is None:
        raise RpxError(f"options.serve.prompt: model {ctx.job.model.name!r} gives no token-id input to take the "
                       "prompt length from; set it")
    batch_sizes = options.batch_sizes or ((shape[0],) if shape else (1,))
    return prompt, options.contexts or (prompt,), tuple(dict.fromkeys(batch_sizes))


def serve(ctx: StageContext) -> ServeResult:
    from rpx_plugins.serving.count import Formats, Remembered, count_step, kv_bytes_per_token, steps_to_count
    from rpx_plugins.serving.hf_cache import cache_argument
    from rpx_plugins.serving.weights import weight_layout
    from rpx_plugins.torch.counts import live_meta_copy, meta_model

    options: ServeOptions = ctx.options("serve") or ServeOptions()
    prompt, contexts, batch_sizes = step_sizes(ctx, options)
    model = live_meta_copy(ctx) if ctx.model_object is not None else meta_model(ctx)
    argument = cache_argument(model, ctx.job.model.name)
    precision = ctx.job.precision
    layout = weight_layout(model, precision, options.weights, options.group_size, options.zero_points)
    formats = Formats(precision, options.kv_cache)
    shapes = steps_to_count(prompt, tuple(sorted(set(contexts))), batch_sizes)
    warm, formulas, steps = Remembered(), ctx.plugins.op_formulas(), []
    for done, shape in enumerate(shapes):
        ctx.progress("serving steps", done, len(shapes))
        steps.append(count_step(model, argument, shape, formats, layout, formulas, warm))
    prefill = tuple(step for step in steps if step.phase == "prefill")
    decode = tuple(step for step in steps if step.phase == "decode")
    gpus, skipped, local = bound_on_gpus(ctx, precision, prefill, decode, layout.resident_bytes,
                                         options.memory_fraction)
    kv_format = formats.kv_cache or precision
    return ServeResult(
        prompt=prompt,
        contexts=tuple(sorted(set(contexts))),
        batch_sizes=batch_sizes,
        precision=precision,
        weight_format=layout.format,
        kv_cache_format=f"{kv_format} (one fp32 scale per cache tensor)" if formats.kv_cache else kv_format,
        weight_bytes=layout.resident_bytes,
        weight_bytes_at_precision=layout.at_precision_bytes,
        quantised_weight_elements=layout.quantised_elements,
        kv_bytes_per_token=kv_bytes_per_token(list(decode)),
        prefill=prefill,
        decode=decode,
        conventions=conventions(precision, options),
        gpus=gpus,
        skipped=skipped,
        local_gpu=local,
        notes=head_notes(model, ctx.job.model.name),
    )


def head_notes(model: Any, name: str) -> tuple[str, ...]:
    """A model built without its output head computes no logits: its steps lack the head's work and weights."""
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter) and getter() is not None:
        return ()
    return (f"model {name!r} ({type(model).__name__}) has no output head: its steps end in hidden states, without "
            "the logits a served step computes; for an hf: model, kwargs.auto_class = \"AutoModelForCausalLM\" (rpx "
            "profile: --kwarg auto_class=AutoModelForCausalLM) counts the head too",)


def bound_on_gpus(ctx: StageContext, precision: str, prefill: tuple, decode: tuple, resident: int,
                  memory_fraction: float) -> tuple[dict, tuple[SkippedRoofline, ...], str | None]:
    """Every step bounded on the spec's GPUs and the one the job runs on, if the catalogue knows it."""
    from rpx_plugins.roofline.stage import local_gpu
    from rpx_plugins.serving.bounds import gpu_serving

    catalog = ctx.gpu_catalog
    chosen: list[GPUSpec] = list(catalog.all() if "all" in ctx.job.gpus else
                                 [catalog.get(name) for name in ctx.job.gpus])
    local = local_gpu(ctx)
    if local is not None and local not in chosen:
        chosen.append(local)
    gpus, skipped = {}, []
    for gpu in chosen:
        try:
            gpus[gpu.name] = gpu_serving(gpu, precision, prefill, decode, resident, memory_fraction)
        except MissingPeakError as exc:
            skipped.append(SkippedRoofline(gpu=gpu.name, precision=precision, reason=str(exc)))
    return gpus, tuple(skipped), local.name if local is not None else None


def conventions(precision: str, options: ServeOptions) -> tuple[str, ...]:
    """What every figure of a ServeResult means, in words."""
    return (
        "prefill: `prompt` tokens per sequence into an empty KV cache of `prompt` positions; decode step: one token "
        "per sequence against a KV cache of `context` positions, the new token's included (context - 1 earlier "
        "tokens); the output head computes the last position's logits only where the model allows it",
        "FLOPs = 2 x MACs for matrix work + other FLOPs from rpx's per-element table, counted by rpx's counter on the "
        "meta device over the model's own forward with a transformers StaticCache of the step's length (causal "
        "masks counted dense, as rpx counts attention everywhere); the cache's in-place writes (index_copy_) have no "
        "FLOP formula and are listed in uncounted_ops, their bytes are kv_written_bytes",
        "bytes = weights read once (embedding tables: one row per token of the pass, unless tied to the output head) "
        "+ the KV cache read once over every position attended + the new tokens' keys and values written once + "
        "token ids and positions in + outputs other than the cache out: the serving lower bound on traffic; "
        "1 GB = 1e9 bytes",
        f"weights: {options.weights or precision} for the matrix weights (every floating 2-D parameter except "
        "embedding tables and the output head), everything else at the precision; int8/int4: elements at 8/4 bits, "
        "one fp16 scale per group of `group_size` weights along the input dimension (0: per output row), plus a "
        "zero point per group at the weights' bits with `zero_points`; fp8: 1 byte, one fp32 scale per tensor; "
        "FLOPs are unchanged (dequantisation's per-element work is not counted)",
        f"KV cache: {options.kv_cache or precision}, every floating tensor of the cache object"
        + ("; one fp32 scale per cache tensor" if options.kv_cache else ""),
        f"peak: the dense {precision} peak of each GPU (weight-only formats and a quantised KV cache are dequantised "
        "to the activations' precision; `precision = \"fp8\"` for fp8 weights and activations)",
        "bound = max(FLOPs / peak, bytes / bandwidth); prefill's is the time to first token of the batch, decode's "
        "the time per output token; tokens/s = batch x new tokens / bound (per sequence: new tokens / bound)",
        f"fits: weights + the step's KV cache + its activation peak <= memory_gb x 1e9 x {options.memory_fraction} "
        "(memory_fraction); gpus_needed: the smallest power of two n with that sum / n within it (tensor "
        "parallelism as an even split; replicated norms and communication not counted), bound_ms_on_gpus_needed = "
        "bound / n",
        "max_batch and compute_bound_from_batch: FLOPs, bytes, KV cache and activation peak of the decode step taken "
        "affine in batch through the two smallest batch sizes counted at that context (exact for all but the "
        "activation peak); compute-bound once FLOPs / peak >= bytes / bandwidth (a tie counts as compute)",
    )
