"""One call's price: FLOPs from its formula, bytes from the tensors it actually reads and writes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch

from rpx_core.types.counts import tensor_text
from rpx_plugins.torch.counter.operators import ALLOCATION, FILL, FORMULA, GATHER, UNKNOWN, OpInfo
from rpx_plugins.torch.counter.registry import OpCall


class ElementSizes:
    """Bytes per element: each tensor's own, except for dtypes counted at another size (``overrides``), as fp8 and
    int8 are: counted with a 2-byte stand-in dtype whose tensors are priced at 1 byte per element."""

    __slots__ = ("overrides",)

    def __init__(self, overrides: Mapping[torch.dtype, int] | None = None) -> None:
        self.overrides = dict(overrides or {})

    def of(self, tensor: torch.Tensor) -> int:
        return self.overrides.get(tensor.dtype) or tensor.element_size()

    def storage_bytes(self, tensor: torch.Tensor, storage: Any = None) -> int:
        """Bytes of ``tensor``'s whole storage (``storage``, when the caller has it) at the counted element size."""
        nbytes = (tensor.untyped_storage() if storage is None else storage).nbytes()
        size = self.overrides.get(tensor.dtype)
        return nbytes if size is None else nbytes // tensor.element_size() * size


class WeightRead(NamedTuple):
    """How one call read one parameter/buffer, for the fused lower bound."""

    index: int  # position among the call's tensors
    nbytes: int  # bytes read
    view: tuple[Any, ...] | None  # (shape, stride) of the view read; None for a gather (rows depend on the indices)


class Price(NamedTuple):
    """The cost of ONE call of one (operator, input shapes/dtypes/strides, arguments, weight flags) signature."""

    label: str
    counted: bool  # False: ran without a FLOP formula (listed in uncounted_ops)
    macs: int
    other_flops: int
    weight_read: int  # bytes read from parameters/buffers
    activation_read: int  # bytes read from everything else
    written: int  # bytes written
    inputs: str  # "float32[8,64], float32[64,256]"
    weight_reads: tuple[WeightRead, ...]
    outputs: int | None  # how many leading outputs are real results (None: all), for bytes written and liveness


def extent_bytes(tensor: torch.Tensor, sizes: ElementSizes) -> int:
    """Bytes a tensor spans: broadcast (stride-0) dimensions are stored, and read, once."""
    try:
        strides = tensor.stride()
    except (RuntimeError, NotImplementedError):  # sparse / nested layouts have no strides
        return tensor.numel() * sizes.of(tensor)
    elements = 1
    for size, stride in zip(tensor.shape, strides):
        if size == 0:
            return 0
        if stride != 0:
            elements *= size
    return elements * sizes.of(tensor)


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of one operator argument or result (a tensor, or lists/tuples of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def storage_key(tensor: torch.Tensor) -> int | None:
    """Identity of a tensor's storage (shared by its views); works on meta, where every data pointer is 0."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def describe(value: Any, tensors: list[torch.Tensor]) -> Any:
    """A hashable description of one argument for the price cache; collects the tensors it holds."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (value.shape, value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple([describe(item, tensors) for item in value])
    return value


def short(tensor: torch.Tensor) -> str:
    return tensor_text(tensor.dtype, tensor.shape)


def inputs_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's input tensors as a Price's ``inputs`` describes them: "float32[8,64], float32[64,256]"."""
    return ", ".join(short(tensor) for value in (*args, *kwargs.values()) for tensor in tensors_in(value))


def price_call(
    info: OpInfo,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    tensors: list[torch.Tensor],
    is_weight: tuple[bool, ...],
    sizes: ElementSizes,
) -> Price:
    """Price one call: FLOPs from the formula, bytes from the tensors it actually reads and writes (or from a
    plugin's bytes formula: its reads are charged to the weights the call read first, then to activations)."""
    bound = dict(zip(info.arg_names, args))  # in schema order: formulas may read the first argument
    for name in info.arg_names[len(args) :]:
        bound[name] = kwargs[name] if name in kwargs else info.defaults.get(name)
    results = result_count(info, bound)
    outputs = list(tensors_in(out))[:results]
    macs = other = 0
    counted = info.kind != UNKNOWN
    call = OpCall(bound, outputs)
    if info.kind == FORMULA:
        flops = info.formula(call)
        counted = flops is not None
        macs, other = flops or (0, 0)
    output_bytes = sum(extent_bytes(tensor, sizes) for tensor in outputs)
    weight_read, activation_read, weight_reads = reads(info, bound, output_bytes, tensors, is_weight, sizes)
    written = 0
    if info.kind != ALLOCATION:
        mutated = (tensor for name in info.unreturned_writes for tensor in tensors_in(bound[name]))
        written = output_bytes + sum(extent_bytes(tensor, sizes) for tensor in mutated)
    if info.plugin is not None and info.plugin.bytes is not None:
        read, written = (int(n) for n in info.plugin.bytes(call))
        weight_read = min(weight_read, read)
        activation_read = read - weight_read
    return Price(
        label=info.label,
        counted=counted,
        macs=macs,
        other_flops=other,
        weight_read=weight_read,
        activation_read=activation_read,
        written=written,
        inputs=", ".join(short(tensor) for tensor in tensors),  # as inputs_text(args, kwargs) says it
        weight_reads=weight_reads,
        outputs=results,
    )


def reads(
    info: OpInfo,
    bound: dict[str, Any],
    output_bytes: int,
    tensors: list[torch.Tensor],
    is_weight: tuple[bool, ...],
    sizes: ElementSizes,
) -> tuple[int, int, tuple[WeightRead, ...]]:
    """Bytes read from weights and from activations, and each weight read; a tensor passed twice is read once."""
    if info.kind in (ALLOCATION, FILL):
        return 0, 0, ()
    weight_index: dict[int, int] = {}
    for index, tensor in enumerate(tensors):
        if is_weight[index]:
            weight_index.setdefault(id(tensor), index)
    weight_read = activation_read = 0
    weight_reads = []
    seen: set[int] = set()
    for position, (name, value) in enumerate(bound.items()):
        if name in info.write_only:
            continue
        gathered = info.kind == GATHER and position == 0
        for tensor in tensors_in(value):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            nbytes = min(extent_bytes(tensor, sizes), output_bytes) if gathered else extent_bytes(tensor, sizes)
            index = weight_index.get(id(tensor))
            if index is None:
                activation_read += nbytes
                continue
            weight_read += nbytes
            view = None if gathered else (tuple(tensor.shape), tensor.stride())
            weight_reads.append(WeightRead(index, nbytes, view))
    return weight_read, activation_read, tuple(weight_reads)


def result_count(info: OpInfo, bound: dict[str, Any]) -> int | None:
    """Batch norm in inference returns placeholder statistics whose size differs by backend (empty on CPU, one per
    channel on meta); only its output is a result, so CPU and meta agree."""
    if info.batch_norm and not bound.get("training", False):
        return 1
    return None
