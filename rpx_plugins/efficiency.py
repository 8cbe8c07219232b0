"""The measured p50 against the roofline bound of the GPU it ran on: how close a call came to the hardware's limit.

A fraction is given only when the two figures describe one call (the same inputs, the same precision, a forward pass
counted as latency times it) and only when it can be true: the bound is a time nothing can beat, so a measured time
below it (a fraction above 1) means one of the figures it is made of is wrong, and rpx names which instead of
printing it.
"""

from __future__ import annotations

from typing import Any

import attrs

from rpx_core.types.latency import Efficiency


def efficiency(latency: Any, roofline: Any, flops: Any) -> Efficiency | None:
    """The measured p50 against the bound of the GPU the job ran on (``roofline.local_gpu``) at the precision it ran
    at; None when the job did not run on a GPU rpx recognises, or that GPU has no bound at that precision."""
    if roofline is None or not getattr(roofline, "local_gpu", None):
        return None
    bounds = roofline.gpus.get(roofline.local_gpu, {})
    precision = getattr(latency, "precision", None) or (next(iter(bounds)) if len(bounds) == 1 else None)
    bound = bounds.get(precision)
    if bound is None:
        return None
    measured = Efficiency(roofline.local_gpu, precision, bound.bound_ms_fused, latency.p50_ms)
    different = other_work(latency, flops)
    if different is not None:
        return attrs.evolve(measured, problem=different)
    fraction = bound.bound_ms_fused / latency.p50_ms
    if fraction > 1:
        return attrs.evolve(measured, problem=disagreement(bound, latency.p50_ms))
    return attrs.evolve(measured, fraction=fraction)


def other_work(latency: Any, flops: Any) -> str | None:
    """Why the counted pass and the measured call are not the same work; None when they are."""
    if flops is None:
        return "no count of the call (count_flops did not run)"
    if flops.backward:
        return "the count includes a backward pass; latency times the forward call"
    measured = tuple(getattr(latency, "measured_inputs", ()) or ())
    if measured and flops.counted_inputs:
        if tuple(flops.counted_inputs) != measured:
            return (f"the count is of inputs {', '.join(flops.counted_inputs)}; latency measured "
                    f"{', '.join(measured)}")
        return None
    if flops.counted_batch_size != latency.measured_batch_size:  # a file written before inputs were recorded
        return (f"the count is at batch {flops.counted_batch_size}; latency measured batch "
                f"{latency.measured_batch_size}")
    return None


def disagreement(bound: Any, measured_ms: float) -> str:
    """A measured time below the bound, in words: which figure behind the bound the measurement contradicts."""
    seconds = measured_ms / 1e3
    found = []
    if bound.compute_ms > measured_ms:
        flops = bound.compute_ms / 1e3 * bound.peak_tflops * 1e12
        found.append(f"the counted {flops:.4g} FLOPs in {measured_ms:.4g} ms would run at {flops / seconds / 1e12:.4g} "
                     f"TFLOP/s, above the {bound.gpu} {bound.precision} peak of {bound.peak_tflops:g} TFLOP/s: "
                     "count_flops' count, the GPU pack's peak or the timing is wrong")
    if bound.memory_ms_fused > measured_ms:
        moved = bound.memory_ms_fused / 1e3 * bound.bandwidth_gb_s * 1e9
        found.append(f"the {moved:.4g} bytes every call must move (weights, inputs, outputs once) in {measured_ms:.4g} "
                     f"ms would need {moved / seconds / 1e9:.4g} GB/s, above the {bound.gpu} bandwidth of "
                     f"{bound.bandwidth_gb_s:g} GB/s: estimate_traffic's bytes, the pack's bandwidth or the timing is "
                     "wrong")
    return (f"measured {measured_ms:.4g} ms is below the bound of {bound.bound_ms_fused:.4g} ms, which nothing can "
            f"beat: {'; '.join(found)}")
