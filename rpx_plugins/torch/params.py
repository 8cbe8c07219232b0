"""Parameter and buffer counts of a torch module, and their size at a chosen precision.

Shared (tied) tensors are counted once: an output head that reuses the embedding matrix adds no parameters, whether it
holds the same Parameter object or another tensor over the same storage. Works on the meta device (no data is read).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rpx_core.plugin import BYTES_PER_ELEMENT, check_precision
from rpx_core.types.counts import ParamsResult


def count_parameters(model: torch.nn.Module, precision: str) -> ParamsResult:
    """Count parameter and buffer elements of ``model``; bytes are at ``precision`` for floating tensors.

    Integer and boolean tensors (token tables, counters such as batch norm's ``num_batches_tracked``) keep their own
    element size: quantising a model does not shrink them.
    """
    check_precision(precision)
    params = unique_tensors(model.parameters())
    buffers = unique_tensors(model.buffers())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    return ParamsResult(
        total=total,
        trainable=trainable,
        non_trainable=total - trainable,
        buffers=sum(b.numel() for b in buffers),
        bytes_at_precision=sum(bytes_at(t, precision) for t in params + buffers),
        precision=precision,
    )


def tensor_key(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """What makes two tensors the same weight: their storage, offset and shape (a tied weight has its tie's key)."""
    return tensor.untyped_storage()._cdata, tensor.storage_offset(), tuple(tensor.shape)


def unique_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors with distinct (storage, offset, shape): a tensor tied to another by sharing its storage counts once."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    unique = []
    for tensor in tensors:
        key = tensor_key(tensor)
        if key not in seen:
            seen.add(key)
            unique.append(tensor)
    return unique


def bytes_at(tensor: torch.Tensor, precision: str) -> int:
    """Bytes of ``tensor`` with floating elements at ``precision``; integer and boolean ones at their own size."""
    if tensor.is_floating_point():
        return tensor.numel() * BYTES_PER_ELEMENT[precision]
    return tensor.numel() * tensor.element_size()
