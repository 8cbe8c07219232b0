"""The built-in ``roofline`` stage: Tier 2 bounds from the Tier 1 results, for every requested GPU and precision.

Framework-agnostic: it reads only ``count_flops``/``estimate_traffic`` results, so any backend's Tier 1 feeds it.
"""

from __future__ import annotations

import attrs

from rpx_core.plugin import BYTES_PER_ELEMENT, GPUSpec, StageContext, UnsupportedError, hookimpl
from rpx_core.types.roofline import RooflineResult
from rpx_plugins.roofline.bounds import Workload, compute_roofline


def precisions_to_bound(ctx: StageContext) -> tuple[str, ...]:
    """The requested precisions; each must store tensors like the counted one, or the counted bytes would be wrong."""
    counted = ctx.job.precision
    requested = ctx.options("roofline").precisions or (counted,)
    for precision in requested:
        if BYTES_PER_ELEMENT.get(precision) != BYTES_PER_ELEMENT[counted]:
            raise UnsupportedError(
                f"roofline at {precision!r} needs Tier 1 bytes counted at {BYTES_PER_ELEMENT[precision]}-byte elements, "
                f"but they were counted at {counted!r}; bound it from a spec whose precision is {precision!r} "
                "(fp8/int8 cannot be counted by the torch backends yet: see the README's known gaps)"
            )
    return tuple(requested)


@hookimpl(trylast=True)
def rpx_roofline(ctx: StageContext) -> RooflineResult:
    params, flops, traffic = (ctx.results[name] for name in ("count_params", "count_flops", "estimate_traffic"))
    gpus = list(ctx.gpu_catalog.all() if "all" in ctx.job.gpus else [ctx.gpu_catalog.get(name) for name in ctx.job.gpus])
    local = local_gpu(ctx)
    if local is not None and local not in gpus:
        gpus.append(local)
    if not gpus:
        raise UnsupportedError("no GPUs to bound: list some in the spec's `gpus` (see `rpx gpus`), or \"all\"")
    workload = Workload(
        flops=flops.total_flops,
        bytes_fused=traffic.fused_bytes,
        bytes_unfused=traffic.unfused_bytes,
        param_bytes=params.bytes_at_precision,  # every weight is resident, read or not
        peak_activation_bytes=traffic.activation_peak_bytes,
        records=traffic.op_records,
    )
    result = compute_roofline(workload, gpus, precisions_to_bound(ctx), top_k=ctx.options("roofline").top_k)
    return attrs.evolve(result, local_gpu=local.name if local is not None else None)


def local_gpu(ctx: StageContext) -> GPUSpec | None:
    """The catalogue's spec of the accelerator this job runs on, matched by the name the device reports."""
    if not ctx.backend.availability.available:
        return None
    name = ctx.backend.device_name(ctx.job.device)
    return ctx.gpu_catalog.find_by_device_name(name) if name else None
