"""serve's steps timed on the backend: the placed model, a ``StaticCache`` of each step's length on the device, filled
to ``context - 1`` positions by a real prefill for a decode step, then single synchronised calls of the step, the
cache's length put back after each (outside the timed region), so every call is the same step. Imports torch."""

from __future__ import annotations

from typing import Any

import torch

from rpx_core.plugin import FLOAT_DTYPES, Deadline, StageContext, stats
from rpx_core.types.serving import MeasuredStep, MeasureServingOptions, MeasureServingResult, ServeResult, ServeStep
from rpx_plugins.measurement import gc_paused
from rpx_plugins.serving.hf_cache import cache_argument, rewind, static_cache, step_arguments

#: Tokens a filling prefill runs in one call (batch x chunk), so filling a long cache needs no more activation memory
#: than a prefill of this many tokens.
FILL_TOKENS = 32768


def measure_steps(ctx: StageContext) -> MeasureServingResult:
    serve: ServeResult = ctx.results["serve"]
    options: MeasureServingOptions = ctx.options("measure_serving") or MeasureServingOptions()
    backend, device = ctx.backend, ctx.job.device
    model = ctx.model()
    argument = cache_argument(model, ctx.job.model.name)
    steps = [step for step in (*serve.prefill, *serve.decode) if step.batch_size in serve.batch_sizes]
    timer = backend.timer(device)
    bounds = bounds_by_step(serve)
    measured = []
    share = options.max_seconds / len(steps)
    with backend.inference_context():
        for done, step in enumerate(steps):
            ctx.progress("serving steps", done, len(steps))
            samples = time_step(ctx, model, argument, step, options, timer, share)
            measured.append(summarise(step, samples, options, bounds.get((step.phase, step.batch_size, step.context))))
    card = ctx.results.get("system_card")
    return MeasureServingResult(
        clock=timer.clock,
        percentile_method=stats.PERCENTILE_METHOD,
        interval_method=stats.INTERVAL_METHOD,
        steps=tuple(measured),
        gpu=serve.local_gpu if serve.local_gpu in serve.gpus else None,
        conventions=(
            "each sample: one synchronised call of the step (the model's forward) against a transformers StaticCache "
            "of the step's length on the device, a decode step's cache filled with context - 1 positions by a real "
            "prefill; weights and cache at the run's precision, token ids drawn at random",
            "efficiency = serve's bound on the GPU the steps ran on / measured p50 (1.0 = at the roofline)",
        ),
        system_summary=card.summary() if card is not None else None,
    )


def bounds_by_step(serve: ServeResult) -> dict[tuple[str, int, int], float]:
    """(phase, batch, context) -> serve's bound in ms on the GPU the job runs on; empty on a host or unknown GPU."""
    gpu = serve.gpus.get(serve.local_gpu) if serve.local_gpu else None
    if gpu is None:
        return {}
    return {(bound.phase, bound.batch_size, bound.context): bound.bound_ms for bound in (*gpu.prefill, *gpu.decode)}


def time_step(ctx: StageContext, model: Any, argument: str, step: ServeStep, options: MeasureServingOptions,
              timer: Any, seconds: float) -> list[float]:
    """Seconds of single calls of ``step``: the cache filled, warm-up, then samples until ``min_samples`` or
    ``seconds`` of sampling passed (filling and warm-up are not sampling)."""
    backend, device = ctx.backend, ctx.job.device
    dtype = next(model.parameters()).dtype
    cache = static_cache(model, step.batch_size, step.context, dtype, device)
    vocab = vocabulary(ctx, model)
    fill(model, argument, cache, step.batch_size, step.context - step.new_tokens, vocab, device)
    token_ids = torch.randint(vocab, (step.batch_size, step.new_tokens), device=device)
    arguments = step_arguments(model, argument, cache, token_ids, start=step.context - step.new_tokens)

    def call() -> None:
        backend.call_model(model, (), arguments)

    for _ in range(options.warmup_calls):
        call()
        rewind(cache, step.new_tokens)
    samples: list[float] = []
    deadline = Deadline.after(seconds)
    with gc_paused():
        while not samples or (len(samples) < options.min_samples and not deadline.expired()):
            timer.start()
            call()
            samples.append(timer.stop())
            rewind(cache, step.new_tokens)
    return samples


def fill(model: Any, argument: str, cache: Any, batch: int, positions: int, vocab: int, device: str) -> None:
    """Write ``positions`` positions of real keys and values into ``cache``: prefills of random tokens, in chunks."""
    chunk = max(1, FILL_TOKENS // batch)
    for start in range(0, positions, chunk):
        tokens = min(chunk, positions - start)
        token_ids = torch.randint(vocab, (batch, tokens), device=device)
        model(**step_arguments(model, argument, cache, token_ids, start=start))


def vocabulary(ctx: StageContext, model: Any) -> int:
    """Token ids are drawn from [0, vocabulary): the spec's bound on its token input, else the configuration's."""
    for spec_input in ctx.job.model.inputs:
        if spec_input.high is not None and spec_input.dtype not in FLOAT_DTYPES:
            return spec_input.high
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(getattr(text, "vocab_size", 2))


def summarise(step: ServeStep, samples: list[float], options: MeasureServingOptions,
              bound_ms: float | None) -> MeasuredStep:
    samples_ms = [seconds * 1e3 for seconds in samples]
    p50 = stats.percentile(samples_ms, 50)
    interval = stats.median_interval(samples_ms, options.interval_confidence)
    return MeasuredStep(
        phase=step.phase,
        batch_size=step.batch_size,
        context=step.context,
        samples=len(samples_ms),
        p50_ms=p50,
        min_ms=min(samples_ms),
        p50_interval_ms=list(interval) if interval is not None else None,
        tokens_per_s=step.batch_size * step.new_tokens / (p50 / 1e3),
        bound_ms=bound_ms,
        efficiency=bound_ms / p50 if bound_ms is not None else None,
    )

