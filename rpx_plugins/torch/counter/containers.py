"""Every tensor inside whatever a model takes or returns, whatever holds it.

Why not torch's pytree: it sees tuples, lists, dicts and registered classes only, so a Hugging Face cache object
(``DynamicCache`` keeps its keys and values in a list of layer objects), a plain dataclass or an attrs class would hide
its tensors, and the fused bound would miss the KV cache a model returns.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import torch

#: Leaves that hold no tensors, and objects whose attributes are not model outputs (modules hold weights, which are
#: counted as weights).
_OPAQUE = (str, bytes, int, float, complex, bool, torch.dtype, torch.device, torch.nn.Module, type, types.ModuleType)


def tensors_within(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``, depth first in order: inside tuples, lists, sets, mappings (ModelOutput included),
    dataclasses, attrs classes and other objects' attributes (``vars`` or ``__slots__``); each object visited once."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
            continue
        if item is None or isinstance(item, _OPAQUE) or callable(item) or id(item) in seen:
            continue
        seen.add(id(item))
        pending.extend(reversed(list(_children(item))))
    return found


def _children(item: Any) -> Iterable[Any]:
    if isinstance(item, Mapping):
        return item.values()
    if isinstance(item, (list, tuple, set, frozenset)):
        return item
    if dataclasses.is_dataclass(item):
        return [getattr(item, field.name) for field in dataclasses.fields(item)]
    if attrs.has(type(item)):
        return [getattr(item, field.name) for field in attrs.fields(type(item))]
    if hasattr(item, "__dict__"):
        return vars(item).values()
    slots = [name for cls in type(item).__mro__ for name in getattr(cls, "__slots__", ())]
    return [getattr(item, name) for name in slots if hasattr(item, name)]
