"""The built-in ``measure_breakdown`` stage for torch models, on the ``cpu`` and ``cuda`` backends.

In order, under the backend's inference context (as ``measure_latency`` times calls): warm-up; the counter's pass over
the same call, on the device, listing every call in order; reference calls timed without any profiler (their median is
the call the tables add up to); then ``torch.profiler`` over one call that only warms the profiler up (its buffers and
CUPTI cost milliseconds once) and ``profiled_calls`` recorded ones (CPU activities; CUDA activities on CUDA; input
shapes). The trace is exported as chrome-trace JSON and read by the same code that reads traces saved elsewhere
(:mod:`rpx_plugins.breakdown.attribution`).
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from rpx_core.plugin import MissingPeakError, NotApplicable, StageContext, UnsupportedError, hookimpl, stats
from rpx_core.types.breakdown import BreakdownOptions, BreakdownResult, StageCost
from rpx_core.types.counts import OpRecord
from rpx_plugins.breakdown.attribution import Measured, breakdown
from rpx_plugins.breakdown.rows import Roof
from rpx_plugins.breakdown.trace import MARKER
from rpx_plugins.latency import model_call, sample_calls, warm_up
from rpx_plugins.measurement import gc_paused
from rpx_plugins.roofline.stage import local_gpu

#: Device types whose work torch.profiler records as kernels (the profiler activity to ask for).
DEVICE_ACTIVITIES = {"cuda": "CUDA"}


def profiler_activities(device: str) -> list[Any]:
    """The profiler activities for ``device``: the CPU's, and the device's own kernels where torch records them."""
    from torch.profiler import ProfilerActivity

    kind = device.partition(":")[0]
    if kind == "cpu":
        return [ProfilerActivity.CPU]
    if kind not in DEVICE_ACTIVITIES:
        raise UnsupportedError(
            f"measure_breakdown on {kind!r}: torch.profiler records no per-kernel device time for this device here, "
            f"so operators cannot be timed on it (supported: cpu, {', '.join(DEVICE_ACTIVITIES)})")
    return [ProfilerActivity.CPU, getattr(ProfilerActivity, DEVICE_ACTIVITIES[kind])]


def count_calls(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], formulas: Iterable[Any] = ()
                ) -> tuple[OpRecord, ...]:
    """The counter's calls of one pass of ``model`` where it is (the device it will be profiled on), in call order:
    one OpRecord (count 1) per call, with its full module path. ``formulas``: plugins' operator formulas.

    Counted under no_grad, as count_flops counts, not under inference mode: there a dispatch mode sees composite
    operators (aten::linear) before they decompose, while the profiled call (no mode active) runs their parts
    (aten::t, aten::addmm) as operators of their own. The kernels are the same."""
    import torch

    from rpx_plugins.torch.counter import count_model

    with torch.inference_mode(False), torch.no_grad():
        return count_model(model, args, kwargs, formulas=formulas, sequence=True).calls


def profiled_calls(call: Callable[[], Any], synchronize: Callable[[], None], activities: list[Any], calls: int
                   ) -> list[dict]:
    """The chrome-trace events of ``calls`` calls under torch.profiler, each in a ``MARKER`` annotation, after one
    call that warms the profiler up."""
    from torch.profiler import profile, record_function, schedule

    with tempfile.TemporaryDirectory(prefix="rpx-breakdown-") as folder:
        path = Path(folder) / "trace.json"
        with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle is wanted
            warnings.filterwarnings("ignore", message=".*[Pp]rofiler clears events.*")
            with profile(activities=activities, record_shapes=True, schedule=schedule(wait=0, warmup=1, active=calls),
                         on_trace_ready=lambda done: done.export_chrome_trace(str(path))) as profiler:
                for _ in range(1 + calls):
                    with record_function(MARKER):
                        call()
                    synchronize()
                    profiler.step()
        return json.loads(path.read_text())["traceEvents"]


def roof_of(ctx: StageContext) -> tuple[Roof | None, str | None, str]:
    """The local GPU's peaks at the job's precision, its name, and the bound's convention (or why there is none)."""
    gpu = local_gpu(ctx)
    precision = ctx.job.precision
    if gpu is None:
        name = ctx.backend.device_name(ctx.job.device)
        why = (f"the device {name!r} matches no GPU of the loaded packs (`rpx gpus`)" if name
               else f"the job ran on {ctx.job.device!r}, which has no roofline figures")
        return None, None, f"no bound: {why}"
    try:
        peak_flops = gpu.peak_flops(precision)
    except MissingPeakError as error:
        return None, gpu.name, f"no bound: {error}"
    convention = (f"per call max(FLOPs / {peak_flops / 1e12:.4g} TFLOP/s, bytes / {gpu.bandwidth_gb_s:.4g} GB/s): "
                  f"{gpu.name}'s dense {precision} peak and DRAM bandwidth ({gpu.pack or gpu.source}); every FLOP at "
                  "the matrix peak, so the bound is optimistic for element-wise work")
    return Roof(peak_flops, gpu.bandwidth_bytes_s), gpu.name, convention


def measure_breakdown(ctx: StageContext) -> BreakdownResult:
    import torch

    from rpx_plugins.breakdown.torch_ops import decomposes, free

    options: BreakdownOptions = ctx.options("measure_breakdown") or BreakdownOptions()
    backend, device = ctx.backend, ctx.job.device
    profiler_activities(device)  # a device torch.profiler records no kernels of is refused before anything runs
    model = ctx.model()
    if not isinstance(model, torch.nn.Module):
        raise NotApplicable(f"model {ctx.job.model.name!r} is a {type(model).__name__}, not a torch.nn.Module: rpx "
                            "cannot count its operators, so their time cannot be set against their work")
    args, kwargs = ctx.inputs(1)
    measured, calls, events, cost = measured_calls(ctx, model, args, kwargs, options)
    roof, gpu, convention = roof_of(ctx)
    started = time.perf_counter()
    result = breakdown(events, calls, measured, decomposes=decomposes, free=free, roof=roof,
                       bound_convention=convention, options=options, cost=cost,
                       device_name=backend.device_name(device), gpu=gpu, precision=ctx.job.precision)
    return attrs.evolve(result, cost=attrs.evolve(cost, attribution_seconds=time.perf_counter() - started))


def measured_calls(ctx: StageContext, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   options: BreakdownOptions) -> tuple[Measured, tuple[OpRecord, ...], list[dict], StageCost]:
    """Warm-up, the counted pass, then (with Python's collector paused once) the reference calls and the profiled
    calls; and what each phase cost."""
    backend, device = ctx.backend, ctx.job.device
    call = model_call(backend, model, args, kwargs)
    timer = backend.timer(device)
    synchronize = lambda: backend.synchronize(device)  # noqa: E731
    clock = time.perf_counter
    with backend.inference_context():
        began = clock()
        warm_up(call, synchronize, options.warmup_calls, options.warmup_seconds)
        warmed = clock()
        calls = count_calls(model, args, kwargs, ctx.plugins.op_formulas() if ctx.plugins else ())
        counted = clock()
        with gc_paused():
            sampling = sample_calls(call, timer, options.reference_calls, options.max_seconds)
            timed = clock()
            events = profiled_calls(call, synchronize, profiler_activities(device), options.profiled_calls)
        profiled = clock()
    samples = sampling.samples_s
    measured = Measured(stats.percentile(samples, 50) * 1e3, len(samples), timer.clock, stats.spread(samples))
    return measured, calls, events, StageCost(warmed - began, timed - counted, counted - warmed, profiled - timed, 0.0)


@hookimpl(trylast=True)
def rpx_measure_breakdown(ctx: StageContext) -> BreakdownResult | None:
    if ctx.backend.framework != "torch":
        return None
    return measure_breakdown(ctx)
