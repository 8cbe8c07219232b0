"""One profiled call and the counted calls of the same call, joined: the breakdown's result.

The entry point for a live profile and a saved one alike (:func:`breakdown`): read the trace, match its operators
to the counter's calls (:mod:`.matching`), give each operator its module, build the tables (:mod:`.rows`). Pure
functions over events, counted calls and a few predicates: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from rpx_core.types.breakdown import BreakdownOptions, BreakdownResult, StageCost
from rpx_core.types.counts import ROOT_MODULE, OpRecord
from rpx_plugins.breakdown.matching import align, fill_modules, shapes_of
from rpx_plugins.breakdown.rows import Roof, busy_us, tables
from rpx_plugins.breakdown.trace import ProfiledCall, read_calls

MATCHING = (
    "profiled operators (the outermost operator of each nest that does not decompose into others, the level the "
    "counter sees) are matched to the counter's calls of the same call, on the device, by operator name and input "
    "shapes in call order (a sequence alignment; calls left between two matches are matched by name alone, in "
    "order); device work is attributed to the profiled operator that launched it, and to the module of the counted "
    "call it matched (unmatched: the deepest module enclosing its matched neighbours)"
)
TIME_CONVENTION = {
    True: "device time of each kernel, memset and copy as the profiler recorded it (overlaps split evenly); the "
          "idle row is the median call timed without the profiler less that busy time",
    False: "host time of each operator call on the thread that made the call (overlaps split evenly); the idle row "
           "is the median call timed without the profiler less the operators' time: the interpreter between "
           "operators, hooks, and the profiler's own cost is left out of it",
}


class Attribution(NamedTuple):
    """For each profiled operator: its counted call (None: unmatched) and module; and what did not match."""

    counted: list[OpRecord | None]
    modules: list[str]
    matched: int
    unmatched_profiled: int  # operators that launched work (or took host time) without a counted call
    unmatched_counted: list[OpRecord]  # counted calls with work (FLOPs or bytes) the profile does not show


def attribute(trace: ProfiledCall, calls: Sequence[OpRecord], free: Callable[[str], bool]) -> Attribution:
    """Match the trace's operators to ``calls`` (the counter's, in call order). An unmatched operator the counter
    skips by definition (``free``: views, metadata) is given a call of zero cost, so it is counted, at nothing."""
    mapping = align([(op.name, op.shapes) for op in trace.ops], [(call.op, shapes_of(call.inputs)) for call in calls])
    counted: list[OpRecord | None] = [None if index is None else calls[index] for index in mapping]
    modules = fill_modules([None if call is None else call.module for call in counted], ROOT_MODULE)
    matched = sum(call is not None for call in counted)
    for index, op in enumerate(trace.ops):
        if counted[index] is None and free(op.name):
            counted[index] = OpRecord(op=op.name, module=modules[index], count=1, flops=0, macs=0, bytes_read=0,
                                      bytes_written=0, inputs=", ".join(op.shapes))
    working = {activity.op for activity in trace.activities if activity.end > activity.start}
    used = set(mapping)
    return Attribution(
        counted, modules, matched, sum(call is None and index in working for index, call in enumerate(counted)),
        [call for index, call in enumerate(calls) if index not in used and (call.flops or call.bytes_read
                                                                              or call.bytes_written)])


def median_call(traces: Sequence[ProfiledCall]) -> ProfiledCall:
    """The call whose busy time is the median (the lower one of an even count): one real call, all its rows."""
    return sorted(traces, key=busy_us)[(len(traces) - 1) // 2]


class Measured(NamedTuple):
    """The reference calls timed without the profiler."""

    call_ms: float  # their median
    samples: int
    clock: str
    spread: float | None = None  # their IQR / median


def breakdown(events: Iterable[Mapping[str, Any]], calls: Sequence[OpRecord], measured: Measured, *,
              decomposes: Callable[[str], bool], **settings: Any) -> BreakdownResult:
    """The breakdown of the calls profiled in ``events`` (a chrome trace's), joined with the counter's ``calls``
    (``settings``: as :func:`breakdown_of` takes them)."""
    return breakdown_of(read_calls(events, decomposes), calls, measured, **settings)


def breakdown_of(profiled: Sequence[ProfiledCall], calls: Sequence[OpRecord], measured: Measured, *,
                 roof: Roof | None, bound_convention: str, cost: StageCost | None = None,
                 options: BreakdownOptions = BreakdownOptions(), free: Callable[[str], bool] = lambda name: False,
                 device_name: str | None = None, gpu: str | None = None, precision: str = "") -> BreakdownResult:
    """The breakdown of the profiled calls, joined with the counter's ``calls`` of the same call: each operator's
    median over the calls when they ran the same operators, else the call whose device was busy for the median time.
    ``free(name)`` says which operators the counter skips as costing nothing, ``roof`` is the local GPU's (None: no
    bounds, ``bound_convention`` says why)."""
    same = len({tuple(op.name for op in trace.ops) for trace in profiled}) == 1
    traces = list(profiled) if same else [median_call(profiled)]
    trace = traces[0]
    joined = attribute(trace, calls, free)
    built = tables(traces, joined.counted, joined.modules, measured.call_ms, roof, module_depth=options.module_depth,
                   overhead_below=options.overhead_below)
    notes = []
    if built.busy_ms > measured.call_ms:
        notes.append(f"the profiled operators took {built.busy_ms:.4g} ms, more than the {measured.call_ms:.4g} ms "
                     "call timed without the profiler: the tables add up to the former")
    if joined.unmatched_profiled:
        notes.append(f"{joined.unmatched_profiled} profiled operator call(s) that took time matched no counted call: "
                     "their rows have no counted work")
    if joined.unmatched_counted:
        names = sorted({call.op for call in joined.unmatched_counted})
        notes.append(f"{len(joined.unmatched_counted)} counted call(s) were not found in the profile "
                     f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): their work is in no row")
    return BreakdownResult(
        call_ms=measured.call_ms,
        call_samples=measured.samples,
        call_spread=measured.spread,
        clock=measured.clock,
        total_ms=built.total_ms,
        busy_ms=built.busy_ms,
        idle_ms=built.idle_ms,
        profiled_ms=built.profiled_ms,
        profiled_calls=len(profiled),
        profiled_idle_ms=built.profiled_idle_ms,
        operators=built.operators,
        signatures=built.signatures,
        modules=built.modules,
        unattributed=built.unattributed,
        time_convention=TIME_CONVENTION[trace.on_device],
        matching=MATCHING,
        bound_convention=bound_convention,
        cost=cost,
        on_device=trace.on_device,
        device_name=device_name,
        gpu=gpu,
        peak_tflops=None if roof is None else roof.peak_flops / 1e12,
        bandwidth_gb_s=None if roof is None else roof.bandwidth / 1e9,
        precision=precision,
        matched_calls=joined.matched,
        unmatched_profiled=joined.unmatched_profiled,
        unmatched_counted=len(joined.unmatched_counted),
        unmatched_counted_flops=sum(call.flops for call in joined.unmatched_counted),
        overhead_below=options.overhead_below,
        notes=tuple(notes),
    )
