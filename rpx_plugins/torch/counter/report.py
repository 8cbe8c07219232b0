"""From the ledger to results: totals per operator, module and phase, per-call records, traffic bounds, assumptions."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import attrs

from rpx_core.types.counts import (
    BACKWARD_MODULE,
    OTHERS,
    ROOT_MODULE,
    FlopsResult,
    ModuleStats,
    OperatorStats,
    OpRecord,
    TrafficResult,
    fold_largest,
)
from rpx_plugins.torch.counter.containers import tensors_within
from rpx_plugins.torch.counter.formulas import CAUSAL_MASK_CONVENTION, other_flops_convention
from rpx_plugins.torch.counter.ledger import BACKWARD, FREE, Ledger
from rpx_plugins.torch.counter.pricing import ElementSizes, Price, extent_bytes, short, storage_key


@attrs.frozen
class CountReport:
    """Everything one counted pass produced."""

    flops: FlopsResult
    traffic: TrafficResult
    #: Every call in call order (views and metadata queries excepted), each an OpRecord of count 1 with its full
    #: module path; only when asked for (count_model(sequence=True)), else ().
    calls: tuple[OpRecord, ...] = ()


_LIST_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


class _Totals:
    """Running sums of one group of calls (an operator, a module, the whole pass)."""

    __slots__ = ("calls", "matrix_flops", "other_flops", "bytes_read", "bytes_written")

    def __init__(self) -> None:
        self.calls = self.matrix_flops = self.other_flops = self.bytes_read = self.bytes_written = 0

    def add(self, price: Price, count: int) -> None:
        self.calls += count
        self.matrix_flops += 2 * price.macs * count
        self.other_flops += price.other_flops * count
        self.bytes_read += (price.weight_read + price.activation_read) * count
        self.bytes_written += price.written * count

    def merge(self, other: _Totals) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @classmethod
    def of(cls, parts: list[_Totals]) -> _Totals:
        """The sum of ``parts`` (the "(others)" entry of a top-k breakdown)."""
        total = cls()
        for part in parts:
            total.merge(part)
        return total

    @property
    def flops(self) -> int:
        return self.matrix_flops + self.other_flops

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def size(self) -> tuple[int, int]:
        return self.flops, self.bytes


def summarise(
    ledger: Ledger,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outputs: Any,
    *,
    backward: bool,
    device: str,
    top_k: int | None,
    depth: int,
    replayed: tuple[str, ...] = (),
) -> CountReport:
    total = _Totals()
    weight_read = 0
    by_operator: dict[str, _Totals] = defaultdict(_Totals)
    exclusive: dict[str, _Totals] = {}
    by_phase: dict[str, int] = defaultdict(int)
    uncounted: dict[str, int] = defaultdict(int)
    for (price_key, (path, phase)), count in ledger.tally.items():
        price = ledger.prices[price_key]
        total.add(price, count)
        weight_read += price.weight_read * count
        by_operator[price.label].add(price, count)
        module = path if phase == BACKWARD else ".".join(path.split(".")[:depth])
        for ancestor in _ancestors(module):
            exclusive.setdefault(ancestor, _Totals())
        exclusive[module].add(price, count)
        by_phase[phase] += (2 * price.macs + price.other_flops) * count
        if not price.counted:
            uncounted[price.label] += count
    flops = FlopsResult(
        matrix_flops=total.matrix_flops,
        other_flops=total.other_flops,
        total_flops=total.flops,
        macs=total.matrix_flops // 2,
        by_operator=_operator_stats(by_operator, top_k),
        by_module=_module_stats(exclusive, ledger.module_calls, top_k),
        by_phase=dict(by_phase),
        uncounted_ops=dict(sorted(uncounted.items(), key=lambda item: -item[1])),
        causal_mask_convention=CAUSAL_MASK_CONVENTION,
        other_flops_convention=other_flops_convention(),
        backward=backward,
        counted_on=device,
        module_depth=depth,
        top_k=top_k,
        counted_inputs=_input_descriptions(args, kwargs),
        replayed=replayed,
        plugin_formulas={
            info.label: info.plugin.plugin for info in ledger.infos.values() if info.plugin and info.label in by_operator
        },
    )
    return CountReport(flops=flops, traffic=_traffic(ledger, total, weight_read, args, kwargs, outputs, backward),
                       calls=call_sequence(ledger))


def _input_descriptions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
    """Each input tensor as "int64[1,2048]", positional then keyword ("mask=bool[1,2048]"): which pass was counted."""
    positional = [short(value) for value in tensors_within(args)]
    keyword = [f"{name}={short(value)}" for name, tree in kwargs.items() for value in tensors_within(tree)]
    return (*positional, *keyword)


def _ancestors(path: str) -> list[str]:
    """``path`` and every module above it, outermost first: "a.b" -> ["", "a", "a.b"]; pseudo-paths stand alone."""
    if path == BACKWARD_MODULE:
        return [path]
    if not path:
        return [""]
    parts = path.split(".")
    return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


def _operator_stats(totals: dict[str, _Totals], top_k: int | None) -> dict[str, OperatorStats]:
    ranked = dict(sorted(totals.items(), key=lambda item: item[1].size(), reverse=True))
    return {
        name: OperatorStats(t.calls, t.matrix_flops, t.other_flops, t.bytes_read, t.bytes_written)
        for name, t in _largest(ranked, top_k).items()
    }


def _module_stats(exclusive: dict[str, _Totals], calls: dict[str, int], top_k: int | None) -> dict[str, ModuleStats]:
    inclusive: dict[str, _Totals] = defaultdict(_Totals)
    for path, totals in exclusive.items():
        for ancestor in _ancestors(path):
            inclusive[ancestor].merge(totals)
    limited = _largest(exclusive, top_k)
    if OTHERS in limited:
        inclusive[OTHERS] = limited[OTHERS]
    return {
        (path or ROOT_MODULE): ModuleStats(
            calls=calls.get(path, 0),
            exclusive_matrix_flops=t.matrix_flops,
            exclusive_other_flops=t.other_flops,
            exclusive_bytes_read=t.bytes_read,
            exclusive_bytes_written=t.bytes_written,
            inclusive_flops=inclusive[path].flops,
            inclusive_bytes=inclusive[path].bytes,
        )
        for path, t in limited.items()
    }


def _largest(entries: dict[str, _Totals], top_k: int | None) -> dict[str, _Totals]:
    """The ``top_k`` largest entries (by FLOPs, then bytes) in their order, the rest summed into "(others)"."""
    return fold_largest(entries, top_k, key=_Totals.size, merge=_Totals.of)


def call_sequence(ledger: Ledger) -> tuple[OpRecord, ...]:
    """The ledger's calls in call order, one OpRecord each (count 1, the module path in full); views and metadata
    queries at no cost."""
    records = {}
    sequence = []
    for entry in ledger.sequence or ():
        record = records.get(entry)
        if record is None:
            record = records[entry] = _free_record(*entry[1:]) if entry[0] == FREE else _call_record(ledger, *entry)
        sequence.append(record)
    return tuple(sequence)


def _call_record(ledger: Ledger, price_key: Any, where: tuple[str, str]) -> OpRecord:
    price = ledger.prices[price_key]
    path, phase = where
    return OpRecord(op=price.label, module=path or ROOT_MODULE, count=1, flops=2 * price.macs + price.other_flops,
                    macs=price.macs, bytes_read=price.weight_read + price.activation_read, bytes_written=price.written,
                    phase=phase, inputs=price.inputs)


def _free_record(op: tuple[str, str], where: tuple[str, str]) -> OpRecord:
    (label, inputs), (path, phase) = op, where
    return OpRecord(op=label, module=path or ROOT_MODULE, count=1, flops=0, macs=0, bytes_read=0, bytes_written=0,
                    phase=phase, inputs=inputs)


def _op_records(ledger: Ledger) -> tuple[OpRecord, ...]:
    """Identical calls merged; a record merging several layers names them with list indices as "*"."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    for (price_key, (path, phase)), count in ledger.tally.items():
        price = ledger.prices[price_key]
        flops = 2 * price.macs + price.other_flops
        read = price.weight_read + price.activation_read
        if flops == 0 and read == 0 and price.written == 0:
            continue
        module = path or ROOT_MODULE
        key = (price.label, phase, price.inputs, price.macs, flops, read, price.written, _LIST_INDEX.sub("*", module))
        entry = merged.setdefault(key, [0, set()])
        entry[0] += count
        entry[1].add(module)
    records = [
        OpRecord(
            op=label,
            module=next(iter(modules)) if len(modules) == 1 else pattern,
            count=count,
            flops=flops,
            macs=macs,
            bytes_read=read,
            bytes_written=written,
            phase=phase,
            inputs=inputs,
        )
        for (label, phase, inputs, macs, flops, read, written, pattern), (count, modules) in merged.items()
    ]
    records.sort(key=lambda r: r.count * (r.bytes_read + r.bytes_written), reverse=True)
    return tuple(records)


def _unique_bytes(tree: Any, sizes: ElementSizes, counted: set[Any] | None = None) -> int:
    """Bytes of the tensors in ``tree`` (in any container), each storage once (at the largest extent seen in it),
    skipping storages in ``counted`` and adding the new ones to it, so a storage is counted once across weights,
    inputs and outputs."""
    counted = set() if counted is None else counted
    extents: dict[Any, int] = {}
    for value in tensors_within(tree):
        key = storage_key(value) or id(value)
        if key not in counted:
            extents[key] = max(extents.get(key, 0), extent_bytes(value, sizes))
    counted.update(extents)
    return sum(extents.values())


def _traffic(
    ledger: Ledger,
    total: _Totals,
    weight_read: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outputs: Any,
    backward: bool,
) -> TrafficResult:
    read_per_storage: dict[int, int] = defaultdict(int)
    for (key, _offset, _view), nbytes in ledger.weight_views.items():
        read_per_storage[key] += nbytes
    weight_bytes = sum(min(ledger.weight_bytes[key], nbytes) for key, nbytes in read_per_storage.items())
    counted = set(ledger.weight_bytes)  # a storage is counted once: as a weight, else as an input, else as an output
    sizes = ledger.sizes
    input_bytes = _unique_bytes((args, kwargs), sizes, counted)
    output_bytes = _unique_bytes(outputs, sizes, counted)
    trained = [p for p in ledger.model.parameters() if p.requires_grad]
    gradient_bytes = _unique_bytes(trained, sizes) if backward else None
    fused = weight_bytes + input_bytes + output_bytes + (gradient_bytes or 0)
    return TrafficResult(
        unfused_bytes=total.bytes,
        unfused_weight_read_bytes=weight_read,
        unfused_activation_read_bytes=total.bytes_read - weight_read,
        unfused_written_bytes=total.bytes_written,
        fused_bytes=fused,
        weight_bytes=weight_bytes,
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        activation_peak_bytes=ledger.peak_bytes,
        activation_peak_bytes_fp16=ledger.peak_bytes_fp16,
        assumptions=TRAFFIC_ASSUMPTIONS + _size_assumptions(sizes),
        op_records=_op_records(ledger),
        gradient_bytes=gradient_bytes,
        arithmetic_intensity_unfused=total.flops / total.bytes if total.bytes else None,
        arithmetic_intensity_fused=total.flops / fused if fused else None,
    )


def _size_assumptions(sizes: ElementSizes) -> tuple[str, ...]:
    return tuple(
        f"{str(dtype).removeprefix('torch.')} tensors are counted at {size} byte(s) per element: the pass ran at "
        f"{str(dtype).removeprefix('torch.')} as a stand-in for a precision torch cannot run on meta (same operators "
        f"and shapes, so the same FLOPs), and their bytes, activation memory and fused bound are at the precision's "
        f"element size; tensors of other dtypes (integer indices, masks) at their own"
        for dtype, size in sizes.overrides.items()
    )


TRAFFIC_ASSUMPTIONS = (
    "bytes = element size x elements at each tensor's real dtype; a broadcast (stride-0) dimension is read once",
    "unfused: every operator reads each input tensor (a tensor passed twice once) and writes each output once; "
    "views and aliases (schema-declared, plus aten._unsafe_view) move nothing; in-place and out= operators write "
    "their destination, copy_ does not read it; empty allocations write nothing; fills (zeros, arange, random) "
    "write their output; batch norm in inference writes only its output (not placeholder statistics)",
    "gathers (embedding, index_select, gather, index) read only the rows they return, plus the indices",
    "fused: each parameter/buffer storage counted once (shared/tied weights once), at the bytes of the distinct "
    "views the pass read from it (a slice only its extent, a gather the most rows one gather returned), at most its "
    "size; plus each model input and output storage once, a storage shared by weights, inputs and outputs only once "
    "(an output that is an input, as nn.Identity returns, adds nothing); plus the parameter gradients once with "
    "backward",
    "activation memory: storages allocated by operators during the forward pass (including the outputs and "
    "auxiliary outputs such as pooling indices or attention log-sum-exp), excluding parameters, buffers and model "
    "inputs; each live from its op until its last reference dies (tracked by weak references to storages); "
    "workspace inside a kernel and allocator caching are not included",
    "with grad enabled, tensors saved for backward stay alive, so the activation peak is the training-time figure; "
    "under no_grad it is the inference figure",
    "on meta, F.scaled_dot_product_attention runs the kernel the CPU backend selects, and nn.MultiheadAttention and "
    "nn.TransformerEncoderLayer their fused paths when the CPU backend would take them (meta alone would take the "
    "unfused paths), so meta and CPU counts agree",
    "the exception: the attention inside nn.MultiheadAttention's unfused path without returned weights (grad "
    "enabled or training; every nn.TransformerEncoderLayer's self-attention then) runs SDPA's math path on meta, as "
    "rpx cannot reroute a call nested in F.multi_head_attention_forward: matrix FLOPs agree, but meta adds 1 other "
    "FLOP per query and per key element (their scaling) and moves more bytes",
    "nn.MultiheadAttention's and nn.TransformerEncoderLayer's fused inference paths (eval + no_grad; see torch's "
    "fast-path conditions) move fewer bytes than their unfused paths, which grad-enabled and training runs take; "
    "FLOPs are the same",
    "nn.TransformerEncoder with src_key_padding_mask on its fast path runs nested tensors, which rpx cannot count: "
    "on CPU the count fails with torch's 'NestedTensorImpl doesn't support sizes', on meta with a CountingError (the "
    "nesting depends on the mask's values); pass enable_nested_tensor=False to count it",
)
