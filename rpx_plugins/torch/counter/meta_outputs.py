"""Remembered meta outputs: a functional operator called again with the same input shapes gets fresh tensors of the
shapes it returned before, without running its meta kernel again.

Why: on meta, many kernels (elementwise ops, reductions) are torch's Python reference implementations, which cost
about a hundred microseconds per call to work out an output's size and strides, most of a count's time. What they
return depends only on the inputs' sizes, strides, offsets, dtypes and devices and the other arguments, so the
answer is the same every time. Remembered only for aten operators whose schema says they neither alias nor mutate
an argument and return only tensors (not random ones, not views a schema does not declare: operators.ALIASES), and
only when the first call's outputs were plain meta tensors, each on a fresh storage of exactly its extent (no input
returned), so that fresh tensors from ``empty_strided`` are the same to everything after them, liveness included.
"""

from __future__ import annotations

from typing import Any

import torch

from rpx_plugins.torch.counter.containers import tensors_within
from rpx_plugins.torch.counter.operators import ALIASES
from rpx_plugins.torch.counter.pricing import storage_key


class MetaOutputs:
    """The outputs each (operator, inputs) returned, as (size, stride, dtype) per output; None: run it every time."""

    def __init__(self) -> None:
        self.known: dict[Any, tuple[tuple[Any, ...], ...] | None] = {}
        self.functional: dict[Any, bool] = {}

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``func(*args, **kwargs)``, or fresh tensors shaped as that call returned before."""
        functional = self.functional.get(func)
        if functional is None:
            functional = self.functional[func] = _functional(func)
        if not functional:
            return func(*args, **kwargs)
        try:
            key = (func, _describe(args), _describe(kwargs))
            seen = key in self.known
        except TypeError:  # an unhashable argument
            return func(*args, **kwargs)
        if not seen:
            out = func(*args, **kwargs)
            self.known[key] = _shapes(out, func, {storage_key(t) for t in tensors_within((args, kwargs))})
            return out
        shapes = self.known[key]
        if shapes is None:
            return func(*args, **kwargs)
        made = [torch.empty_strided(size, stride, dtype=dtype, device="meta") for size, stride, dtype in shapes]
        return made[0] if len(made) == 1 else tuple(made)


def _functional(func: Any) -> bool:
    schema = func._schema
    return (func.namespace == "aten" and func._overloadpacket not in ALIASES and len(schema.returns) > 0
            and torch.Tag.dynamic_output_shape not in func.tags and torch.Tag.nondeterministic_seeded not in func.tags
            and not any(argument.alias_info is not None for argument in schema.arguments)
            and all(r.alias_info is None and isinstance(r.type, torch.TensorType) for r in schema.returns))


def _shapes(out: Any, func: Any, inputs: set[int | None]) -> tuple[tuple[Any, ...], ...] | None:
    """What to make next time, or None when an output is not a fresh meta tensor of its own (an input returned,
    a view an operator's schema does not declare, storage beyond its extent)."""
    outputs = out if len(func._schema.returns) > 1 else (out,)
    shapes = []
    storages = set(inputs)
    for tensor in outputs:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_meta or type(tensor) is not torch.Tensor \
                or tensor.storage_offset() != 0:
            return None
        storage = tensor.untyped_storage()
        extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) if tensor.numel() else 0
        if storage._cdata in storages or storage.nbytes() != extent * tensor.element_size():
            return None
        storages.add(storage._cdata)
        shapes.append((tuple(tensor.shape), tensor.stride(), tensor.dtype))
    return tuple(shapes)


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device, type(value)
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_describe(item) for item in value)
    if isinstance(value, dict):
        return tuple((name, _describe(item)) for name, item in value.items())
    hash(value)
    return type(value), value
