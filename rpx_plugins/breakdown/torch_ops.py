"""What torch's dispatcher says about an operator named in a profile: whether it decomposes, whether it is free.

A profile names operators without their overload ("aten::to"); each answer holds for every overload of the name
except the ``out=`` variants (a profile of a model rarely shows those, and they do not change what a name does).
Imports torch: import it lazily, inside a stage.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from rpx_plugins.torch.counter.operators import ALIASES, EMPTY_ALLOCATIONS, METADATA


def overloads(name: str) -> list[Any]:
    """The OpOverloads of a profiler's operator name ("aten::add" -> add.Tensor, add.Scalar) that take or return a
    tensor, ``out=`` ones left out (aten::slice.str slices strings); [] for a name torch does not know (a
    record_function label, a library's own event)."""
    namespace, _, op = name.replace("::", ".", 1).partition(".")
    packet = getattr(getattr(torch.ops, namespace, None), op, None) if op else None
    if packet is None or not hasattr(packet, "overloads"):
        return []
    found = []
    for overload in packet.overloads():
        if overload.endswith("out"):
            continue
        try:
            candidate = getattr(packet, overload)
        except (AttributeError, RuntimeError):  # listed in the schema registry, not in the dispatcher
            continue
        schema = candidate._schema
        if any("Tensor" in str(value.type) for value in (*schema.arguments, *schema.returns)):
            found.append(candidate)
    return found


@functools.cache
def decomposes(name: str) -> bool:
    """True when every overload of ``name`` is CompositeImplicitAutograd: it only calls other operators, above the
    level a TorchDispatchMode (the counter) sees, so the counter sees what it calls instead (aten::linear,
    aten::matmul, aten::to, aten::conv2d, aten::scaled_dot_product_attention)."""
    found = [implicit for overload in overloads(name) if (implicit := _composite_implicit(overload)) is not None]
    return bool(found) and all(found)


def _composite_implicit(overload: Any) -> bool | None:
    """Whether the overload has a CompositeImplicitAutograd kernel; None when the dispatcher does not hold it (a
    TorchScript-only overload such as aten::to.prim_Device)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "CompositeImplicitAutograd")
    except RuntimeError:
        return None


@functools.cache
def free(name: str) -> bool:
    """True for the operators the counter prices at nothing by their kind alone: views, metadata queries and empty
    allocations (``torch.tensor(...)`` allocates with an aten::empty no dispatch mode sees)."""
    found = overloads(name)
    return bool(found) and all(
        overload.is_view or overload.overloadpacket in ALIASES | METADATA | EMPTY_ALLOCATIONS for overload in found
    )
