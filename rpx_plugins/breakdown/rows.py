"""From profiled calls to the breakdown's tables: time per operator, call signature and module, against bounds.

Pure arithmetic over :class:`~rpx_plugins.breakdown.trace.ProfiledCall` (no torch), framework-agnostic: a backend that
reads its own profiler builds a ProfiledCall and calls :func:`tables`.

* Several profiled calls of the same operators become one: each operator's time is its median over them.
* Device time is shared out by sweeping the activities: an instant covered by k activities gives each 1/k of it,
  so the activities' times add up to the busy time (their union) and no instant is counted twice.
* The device idle before each activity (the gap since everything before it finished) is charged to the operator
  that launched it: on a GPU, time the device waited for that launch.
* The rows of each table add up to ``total_ms`` = max(call_ms, busy): operators' time, the work of no operator, and
  the idle row, call_ms - busy, the time the device was not busy in a call timed without the profiler.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from rpx_core.plugin import stats
from rpx_core.types.breakdown import IDLE_ROW, NO_OPERATOR_ROW, TimeRow
from rpx_core.types.counts import ROOT_MODULE
from rpx_plugins.breakdown.trace import ProfiledCall
from rpx_plugins.roofline.bounds import bottleneck, call_seconds


class CountedCall(Protocol):
    """What a row reads from a counted call (an OpRecord of count 1)."""

    @property
    def op(self) -> str: ...

    @property
    def flops(self) -> int: ...

    @property
    def bytes_read(self) -> int: ...

    @property
    def bytes_written(self) -> int: ...

    @property
    def inputs(self) -> str: ...


class Roof(NamedTuple):
    """A GPU's peaks at one precision, which the bounds divide FLOPs and bytes by."""

    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s


class Timed(NamedTuple):
    """One profiled operator call with its share of device time and what it was matched to."""

    name: str
    time_us: float
    kernels: int
    idle_before_us: float
    counted: CountedCall | None
    module: str
    inputs: str


class Tables(NamedTuple):
    operators: tuple[TimeRow, ...]
    signatures: tuple[TimeRow, ...]
    modules: tuple[TimeRow, ...]
    unattributed: tuple[TimeRow, ...]
    busy_ms: float
    idle_ms: float
    total_ms: float
    profiled_ms: float  # the profiled call's wall time (the median of several)
    profiled_idle_ms: float


def device_time(trace: ProfiledCall) -> tuple[list[float], list[float]]:
    """Each activity's exclusive share of busy time, and the device idle right before it (both us)."""
    activities = trace.activities
    shares = [0.0] * len(activities)
    idle = [0.0] * len(activities)
    frontier = trace.start
    for index, activity in enumerate(activities):  # in start order
        idle[index] = max(0.0, activity.start - frontier)
        frontier = max(frontier, activity.end)
    edges = sorted({edge for activity in activities for edge in (activity.start, activity.end)})
    starts: dict[float, list[int]] = defaultdict(list)
    ends: dict[float, list[int]] = defaultdict(list)
    for index, activity in enumerate(activities):
        starts[activity.start].append(index)
        ends[activity.end].append(index)
    active: set[int] = set()
    for left, right in zip(edges, edges[1:]):
        active.difference_update(ends.get(left, ()))
        active.update(index for index in starts.get(left, ()) if activities[index].end > left)
        if active:
            each = (right - left) / len(active)
            for index in active:
                shares[index] += each
    return shares, idle


def busy_us(trace: ProfiledCall) -> float:
    """Time the device was busy in the call (the union of its activities), us."""
    return sum(device_time(trace)[0])


class Profiled(NamedTuple):
    """The profiled calls reduced to one: each operator's time, what no operator launched, the call's wall time."""

    timed: list[Timed]
    orphans: dict[str, tuple[int, float]]  # kernel name -> (activities, us) of work no operator launched
    orphan_idle_us: float  # device idle right before that work
    wall_us: float


def timed_ops(trace: ProfiledCall, counted: Sequence[CountedCall | None], modules: Sequence[str]) -> Profiled:
    """Every operator call of one profiled call with its device time, and the work no operator launched."""
    shares, idle = device_time(trace)
    time_us = [0.0] * len(trace.ops)
    kernels = [0] * len(trace.ops)
    idle_us = [0.0] * len(trace.ops)
    orphans: dict[str, tuple[int, float]] = {}
    orphan_idle = 0.0
    for activity, share, gap in zip(trace.activities, shares, idle):
        if activity.op is None:
            calls, us = orphans.get(activity.name, (0, 0.0))
            orphans[activity.name] = (calls + 1, us + share)
            orphan_idle += gap
            continue
        time_us[activity.op] += share
        kernels[activity.op] += 1
        idle_us[activity.op] += gap
    timed = [
        Timed(op.name, time_us[index], kernels[index], idle_us[index], counted[index], modules[index],
              counted[index].inputs if counted[index] is not None else ", ".join(op.shapes))
        for index, op in enumerate(trace.ops)
    ]
    return Profiled(timed, orphans, orphan_idle, trace.wall_us)


def combined(traces: Sequence[ProfiledCall], counted: Sequence[CountedCall | None], modules: Sequence[str]) -> Profiled:
    """Several profiled calls of the same operators as one: each operator's time (and idle before it) is its median
    over the calls, so a call descheduled in one operator does not move that operator's figure; likewise the work no
    operator launched, per kernel name, and the wall time. ``counted`` and ``modules`` are per operator of each."""
    each = [timed_ops(trace, counted, modules) for trace in traces]
    if len(each) == 1:
        return each[0]
    timed = [call._replace(time_us=_median([run.timed[index].time_us for run in each]),
                           idle_before_us=_median([run.timed[index].idle_before_us for run in each]))
             for index, call in enumerate(each[0].timed)]
    names = dict.fromkeys(name for run in each for name in run.orphans)
    orphans = {name: (each[0].orphans.get(name, (0, 0.0))[0], _median([run.orphans.get(name, (0, 0.0))[1]
                                                                      for run in each])) for name in names}
    return Profiled(timed, {name: entry for name, entry in orphans.items() if entry[1] > 0},
                    _median([run.orphan_idle_us for run in each]), _median([run.wall_us for run in each]))


def _median(values: list[float]) -> float:
    return stats.percentile(values, 50)


def tables(traces: Sequence[ProfiledCall], counted: Sequence[CountedCall | None], modules: Sequence[str], call_ms: float,
           roof: Roof | None, *, module_depth: int, overhead_below: float) -> Tables:
    """The breakdown's tables for profiled calls of the same operators (see :func:`combined`); ``counted`` and
    ``modules`` hold, for each operator, its counted call (None: unmatched) and its module path."""
    profiled = combined(traces, counted, modules)
    timed = profiled.timed
    orphan_ms = sum(us for _, us in profiled.orphans.values()) / 1e3
    busy_ms = sum(row.time_us for row in timed) / 1e3 + orphan_ms
    total_ms = max(call_ms, busy_ms)
    idle_ms = total_ms - busy_ms
    profiled_idle_ms = max(0.0, profiled.wall_us / 1e3 - busy_ms)
    make = _RowMaker(total_ms, roof, overhead_below)
    pseudo = [make.pseudo(IDLE_ROW, idle_ms, 0)]
    if profiled.orphans:
        pseudo.append(make.pseudo(NO_OPERATOR_ROW, orphan_ms, sum(calls for calls, _ in profiled.orphans.values()),
                                  profiled.orphan_idle_us / 1e3))
    operators = make.grouped(timed, lambda row: row.name, lambda row: row.name)
    signatures = make.grouped(timed, lambda row: (row.name, row.inputs, _pattern(row.module), row.counted is not None),
                              lambda row: row.name, signature=True)
    return Tables(
        operators=(*_largest_first(operators), *pseudo),
        signatures=tuple(_largest_first(signatures)),
        modules=(*make.modules(timed, module_depth), *pseudo),
        unattributed=tuple(_largest_first([make.pseudo(name, us / 1e3, calls)
                                           for name, (calls, us) in profiled.orphans.items()])),
        busy_ms=busy_ms,
        idle_ms=idle_ms,
        total_ms=total_ms,
        profiled_ms=profiled.wall_us / 1e3,
        profiled_idle_ms=profiled_idle_ms,
    )


def _largest_first(rows: list[TimeRow]) -> list[TimeRow]:
    return sorted(rows, key=lambda row: row.time_ms, reverse=True)


_LIST_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


def _pattern(module: str) -> str:
    """Module paths of identical calls in several layers share a row: list indices become "*"."""
    return _LIST_INDEX.sub("*", module)


def _folded(module: str, depth: int) -> str:
    return module if module == ROOT_MODULE else ".".join(module.split(".")[:depth])


class _RowMaker:
    def __init__(self, total_ms: float, roof: Roof | None, overhead_below: float) -> None:
        self.total_ms = total_ms
        self.roof = roof
        self.overhead_below = overhead_below

    def pseudo(self, name: str, time_ms: float, calls: int, idle_before_ms: float = 0.0) -> TimeRow:
        return TimeRow(name=name, calls=calls, time_ms=time_ms, share=self._share(time_ms), kernels=calls,
                       idle_before_ms=idle_before_ms)

    def _share(self, time_ms: float) -> float:
        return time_ms / self.total_ms if self.total_ms > 0 else 0.0

    def row(self, name: str, calls: list[Timed], **extra) -> TimeRow:
        """One row over ``calls``: their time, and the counted work of those that were counted, with its bound, set
        against those calls' time."""
        time_ms = sum(call.time_us for call in calls) / 1e3
        matched = [call.counted for call in calls if call.counted is not None]
        matched_ms = sum(call.time_us for call in calls if call.counted is not None) / 1e3
        figures = {}
        if matched:
            flops = sum(call.flops for call in matched)
            nbytes = sum(call.bytes_read + call.bytes_written for call in matched)
            figures = {"flops": flops, "bytes": nbytes}
            if matched_ms > 0:
                figures.update(flops_per_s=flops / (matched_ms / 1e3), bytes_per_s=nbytes / (matched_ms / 1e3))
            figures.update(self._bound(matched, matched_ms))
        return TimeRow(name=name, calls=len(calls), time_ms=time_ms, share=self._share(time_ms),
                       kernels=sum(call.kernels for call in calls),
                       idle_before_ms=sum(call.idle_before_us for call in calls) / 1e3,
                       counted=len(matched) == len(calls), **figures, **extra)

    def _bound(self, matched: list[CountedCall], time_ms: float) -> dict:
        if self.roof is None:
            return {}
        compute = memory = bound = 0.0
        for call in matched:
            compute_s, memory_s = call_seconds(call.flops, call.bytes_read + call.bytes_written, *self.roof)
            compute += compute_s if compute_s >= memory_s else 0.0
            memory += memory_s if memory_s > compute_s else 0.0
            bound += max(compute_s, memory_s)
        roof = bottleneck(compute, memory)
        figures = {"bound_ms": bound * 1e3, "bottleneck": roof}
        if time_ms > 0:
            fraction = bound * 1e3 / time_ms
            figures.update(fraction=fraction, limited_by=roof if fraction >= self.overhead_below else "overhead")
        return figures

    def grouped(self, timed: list[Timed], group, name, signature: bool = False) -> list[TimeRow]:
        """One row per group of calls (first-call order); rows with neither time nor counted work are left out."""
        groups: dict = defaultdict(list)
        for call in timed:
            groups[group(call)].append(call)
        rows = []
        for calls in groups.values():
            extra = {}
            if signature:
                modules = {call.module for call in calls}
                extra = {"inputs": calls[0].inputs,
                         "module": modules.pop() if len(modules) == 1 else _pattern(calls[0].module)}
            row = self.row(name(calls[0]), calls, **extra)
            if row.time_ms > 0 or row.flops or row.bytes:
                rows.append(row)
        return rows

    def modules(self, timed: list[Timed], depth: int) -> list[TimeRow]:
        """The module tree, depth-first in first-call order: each row's time is its operators' and its children's;
        ``self_ms`` is what ran directly in it. A row's children add up to its time less its self time."""
        under: dict[str, list[Timed]] = defaultdict(list)  # path -> every call under it
        direct: dict[str, list[Timed]] = defaultdict(list)
        children: dict[str, list[str]] = defaultdict(list)
        for call in timed:
            path = _folded(call.module, depth)
            direct[path].append(call)
            for ancestor, parent in _lineage(path):
                if ancestor not in under:
                    children[parent].append(ancestor)
                under[ancestor].append(call)
        rows: list[TimeRow] = []

        def visit(path: str, parent: str | None) -> None:
            row = self.row(path, under[path], parent=parent,
                           self_ms=sum(call.time_us for call in direct.get(path, ())) / 1e3)
            if row.time_ms > 0 or row.flops or row.bytes:
                rows.append(row)
            for child in children.get(path, ()):
                visit(child, path)

        for top in children.get(None, ()):
            visit(top, None)
        return rows


def _lineage(path: str) -> list[tuple[str, str | None]]:
    """(module, its parent) from the top down: "a.b" -> [("(root)", None), ("a", "(root)"), ("a.b", "a")]."""
    if path == ROOT_MODULE:
        return [(ROOT_MODULE, None)]
    parts = path.split(".")
    names = [ROOT_MODULE, *(".".join(parts[: i + 1]) for i in range(len(parts)))]
    return [(name, names[i - 1] if i else None) for i, name in enumerate(names)]
