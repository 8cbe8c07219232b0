"""What ran in one profiled call, read from a chrome trace (torch.profiler's ``export_chrome_trace``, Kineto's format).

Pure functions over the trace's events (no torch), so the same code reads a live profile and a trace saved on a GPU
machine. Three things are read:

* the operators at the counter's level: aten operators nest (``aten::linear`` calls ``aten::t`` and
  ``aten::matmul``, which calls ``aten::mm``); the counter sees an operator only once it stopped decomposing into
  others (``decomposes``: torch's CompositeImplicitAutograd kernels), so the operator kept for each nest is the
  outermost one that does not decompose: ``aten::mm`` under ``aten::linear``, ``aten::_to_copy`` under ``aten::to``,
  ``aten::convolution`` under ``aten::conv2d`` (its ``aten::cudnn_convolution`` and the copies inside it are its own
  work), ``aten::_scaled_dot_product_cudnn_attention`` under ``aten::scaled_dot_product_attention``;
* the device activities (kernels, memsets, copies) and the operator that launched each: Kineto links a kernel to the
  innermost operator open when it was launched by its ``External id``, and to its launch call (``cudaLaunchKernel``,
  ``cuLaunchKernelEx`` of cuBLAS and cuDNN) by its ``correlation`` id; a kernel without an External id is placed by
  its launch call's time on the launching thread. Without device activities (a CPU profile), each kept operator's
  own span is its activity;
* each call's window: from its ``MARKER`` annotation's start (rpx wraps each profiled call in one; a trace without
  them is one call, from its first operator event) to its last activity's or operator's end.

Times are the trace's microseconds.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

#: The annotation rpx wraps around the profiled call (torch.profiler.record_function).
MARKER = "rpx: profiled call"
#: Categories of the marker's host event (on CUDA, Kineto copies each annotation onto the device's timeline as a
#: "gpu_user_annotation", which is not a call of its own).
HOST_MARKERS = frozenset({"user_annotation", "cpu_op"})
#: Categories of device work in Kineto traces.
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memset", "gpu_memcpy"})
#: Categories of the host calls that launch device work (their ``correlation`` id names the activity).
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: ``Input type`` entries of arguments that are not tensors (each other type is a tensor's dtype).
NOT_TENSORS = frozenset({"", "Scalar", "ScalarList", "GenericList", "Device", "Layout", "ScalarType", "MemoryFormat",
                         "int", "bool", "str", "None"})


class ProfiledOp(NamedTuple):
    """One operator call at the counter's level."""

    name: str  # "aten.mm" (the counter's spelling of "aten::mm")
    shapes: tuple[str, ...]  # its tensor inputs' shapes, e.g. ("[2048,4096]", "[4096,11008]"); lists flattened
    start: float  # host time the call began, us
    end: float  # host time it returned, us


class DeviceActivity(NamedTuple):
    """One piece of device work (or, in a CPU profile, one operator's own span)."""

    name: str  # the kernel's name
    start: float  # us
    end: float  # us
    op: int | None  # index of the operator that launched it, None if none did
    launched: float | None  # host time of its launch call, us, when known


class ProfiledCall(NamedTuple):
    """One profiled call: its operators at the counter's level in call order, its device work, its window."""

    ops: tuple[ProfiledOp, ...]
    activities: tuple[DeviceActivity, ...]  # in start order
    start: float  # us
    end: float  # us
    on_device: bool  # True when the activities are device work, False when they are the operators' own spans

    @property
    def wall_us(self) -> float:
        return self.end - self.start


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of a chrome trace file (``.json`` or gzipped ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as stream:
        data = json.load(stream)
    return data["traceEvents"] if isinstance(data, dict) else data


def op_name(name: str) -> str:
    """The counter's spelling of a profiler's operator name: "aten::mm" -> "aten.mm"."""
    return name.replace("::", ".", 1)


def tensor_shapes(args: Mapping[str, Any]) -> tuple[str, ...]:
    """The shapes of an operator event's tensor inputs, as the counter writes them ("[2048,4096]"); a tensor list's
    tensors in order. Events recorded without ``record_shapes`` have none."""
    shapes: list[str] = []
    types = args.get("Input type") or []
    for position, dims in enumerate(args.get("Input Dims") or []):
        kind = types[position] if position < len(types) else ""
        if dims and all(isinstance(item, list) for item in dims):  # a list of tensors
            shapes.extend(_shape(item) for item in dims)
        elif dims or kind not in NOT_TENSORS and kind != "TensorList":
            shapes.append(_shape(dims))
    return tuple(shapes)


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(size) for size in dims) + "]"


def read_calls(events: Iterable[Mapping[str, Any]], decomposes: Callable[[str], bool]) -> list[ProfiledCall]:
    """Each call in ``events``, in order: one per ``MARKER`` annotation (everything from its start to the next
    marker's start is that call's), or the whole trace as one call when there is no marker.

    ``decomposes(name)`` says whether a profiler operator name ("aten::linear") only calls other operators (torch:
    :func:`rpx_plugins.breakdown.torch_ops.decomposes`)."""
    events = [event for event in events if event.get("ph") == "X"]
    launches = {event["args"]["correlation"]: event for event in events
                if event.get("cat") in LAUNCH_CATEGORIES and "correlation" in (event.get("args") or {})}
    markers = sorted((event for event in events if event.get("name") == MARKER and event.get("cat") in HOST_MARKERS),
                     key=lambda event: event["ts"])
    host = [event for event in events if event.get("cat") == "cpu_op"]
    device = sorted((event for event in events if event.get("cat") in DEVICE_CATEGORIES), key=lambda e: e["ts"])
    if not markers:
        return [_call(host, device, launches, None, decomposes)]
    starts = [marker["ts"] for marker in markers]

    def window(event: Mapping[str, Any]) -> int:
        return bisect.bisect_right(starts, event["ts"]) - 1

    calls = []
    for index, marker in enumerate(markers):  # the marker's thread made the call; other threads' operators are not of it
        thread = (marker["pid"], marker["tid"])
        calls.append(_call([e for e in host if window(e) == index and (e["pid"], e["tid"]) == thread],
                           [e for e in device if window(e) == index], launches, marker, decomposes))
    return calls


def _call(host: list[Mapping[str, Any]], device: list[Mapping[str, Any]], launches: Mapping[Any, Mapping[str, Any]],
          marker: Mapping[str, Any] | None, decomposes: Callable[[str], bool]) -> ProfiledCall:
    """One call: its operators at the counter's level, its device work and who launched it, its window."""
    ops, owners = _kept_ops(host, decomposes)
    if device:
        activities = _device_activities(device, launches, owners)
    else:
        activities = [DeviceActivity(op.name, op.start, op.end, index, op.start) for index, op in enumerate(ops)]
    starts = [marker["ts"]] if marker is not None else [e["ts"] for e in host] or [a.start for a in activities]
    ends = [a.end for a in activities] + [_end(e) for e in host] + ([_end(marker)] if marker is not None else [])
    start = min(starts) if starts else 0.0
    return ProfiledCall(tuple(ops), tuple(activities), start, max(ends) if ends else start, bool(device))


def _end(event: Mapping[str, Any]) -> float:
    return event["ts"] + event.get("dur", 0.0)


def _kept_ops(host: list[Mapping[str, Any]], decomposes: Callable[[str], bool]) -> tuple[list[ProfiledOp], _Owners]:
    """The outermost operator of each nest that does not decompose, in call order, and which of them each host
    operator event runs inside."""
    kept: list[tuple[Mapping[str, Any], tuple[Any, Any]]] = []
    inside: dict[tuple[Any, Any, Any], int] = {}  # (pid, tid, External id) -> position in ``kept``
    by_thread: dict[tuple[Any, Any], list[Mapping[str, Any]]] = defaultdict(list)
    for event in host:
        by_thread[(event["pid"], event["tid"])].append(event)
    for thread, thread_events in by_thread.items():
        thread_events.sort(key=lambda event: (event["ts"], -event.get("dur", 0.0)))
        stack: list[tuple[float, int | None]] = []  # (end, the kept operator it runs inside)
        for event in thread_events:
            while stack and stack[-1][0] <= event["ts"]:
                stack.pop()
            index = stack[-1][1] if stack else None
            if index is None and not decomposes(event["name"]):
                index = len(kept)
                kept.append((event, thread))
            stack.append((_end(event), index))
            if index is not None:
                inside[(*thread, event["args"].get("External id"))] = index
    order = sorted(range(len(kept)), key=lambda i: kept[i][0]["ts"])
    renumber = {old: new for new, old in enumerate(order)}
    ops = [ProfiledOp(op_name(kept[old][0]["name"]), tensor_shapes(kept[old][0].get("args") or {}), kept[old][0]["ts"],
              _end(kept[old][0])) for old in order]
    spans: dict[tuple[Any, Any], list[tuple[float, float, int]]] = defaultdict(list)
    for old in order:
        event, thread = kept[old]
        spans[thread].append((event["ts"], _end(event), renumber[old]))
    return ops, _Owners({key: renumber[index] for key, index in inside.items()}, spans)


class _Owners:
    """Which kept operator a launch ran inside: by the External id of the innermost operator open at the launch (what
    Kineto records on the activity), else by the launch call's time on its thread."""

    def __init__(self, inside: dict[tuple[Any, Any, Any], int], spans: dict[tuple[Any, Any], list[tuple[float, float, int]]]
                 ) -> None:
        self.inside = inside
        self.spans = spans  # per thread, kept operators' (start, end, index), in start order, never overlapping
        self.starts = {thread: [span[0] for span in thread_spans] for thread, thread_spans in spans.items()}
        self.by_external: dict[Any, int] = {}
        for (_pid, _tid, external), index in inside.items():
            self.by_external.setdefault(external, index)

    def of(self, external: Any, launch: Mapping[str, Any] | None) -> int | None:
        if launch is None:
            return self.by_external.get(external) if external else None
        thread = (launch["pid"], launch["tid"])
        index = self.inside.get((*thread, external)) if external else None
        if index is not None or thread not in self.spans:
            return index
        at = bisect.bisect_right(self.starts[thread], launch["ts"]) - 1
        if at >= 0 and self.spans[thread][at][1] >= launch["ts"]:
            return self.spans[thread][at][2]
        return None


def _device_activities(device: list[Mapping[str, Any]], launches: Mapping[Any, Mapping[str, Any]], owners: _Owners
                       ) -> list[DeviceActivity]:
    """Each device activity with the kept operator that launched it, and when its launch call ran."""
    activities = []
    for event in device:
        args = event.get("args") or {}
        launch = launches.get(args.get("correlation"))
        activities.append(DeviceActivity(event["name"], event["ts"], _end(event), owners.of(args.get("External id"), launch),
                                   None if launch is None else launch["ts"]))
    return activities
