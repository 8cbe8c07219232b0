"""Weights in the format they are served in, counted from the model's own parameters.

Which weights a format applies to: the matrix weights, every floating 2-D parameter except embedding tables and the
output head (as GPTQ, AWQ and fp8 checkpoints leave those at the activations' precision). Everything else (norms,
biases, embeddings, the head, buffers) stays at the run's precision; integer buffers keep their own size. Shared
(tied) weights count once. Imports torch: import it lazily.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from rpx_core.plugin import BYTES_PER_ELEMENT
from rpx_plugins.torch.params import bytes_at, tensor_key, unique_tensors

#: Bits per stored element of each weight format.
BITS = {"int8": 8, "int4": 4, "fp8": 8}
SCALE_BYTES = 2  # an int8/int4 group's scale (and the zero point's container) is fp16
TENSOR_SCALE_BYTES = 4  # fp8 weights: one fp32 scale per tensor


@attrs.frozen
class Gathered:
    """An embedding table a pass reads only the rows of (not tied to a weight read whole)."""

    rows: int
    row_bytes: int


@attrs.frozen
class WeightLayout:
    """The model's weights as served: resident bytes, and what one pass reads."""

    resident_bytes: int  # every parameter and buffer once, at its format, scales included
    at_precision_bytes: int  # the same, every floating tensor at the run's precision
    quantised_elements: int
    format: str  # in words, for the result
    gathered: tuple[Gathered, ...] = ()

    def read_bytes(self, rows: int) -> int:
        """Bytes one pass reads when every embedding table gathers ``rows`` rows (one per token of the pass)."""
        unread = sum((table.rows - min(rows, table.rows)) * table.row_bytes for table in self.gathered)
        return self.resident_bytes - unread


def weight_layout(model: torch.nn.Module, precision: str, weights: str | None, group_size: int,
                  zero_points: bool) -> WeightLayout:
    """The resident and per-pass bytes of ``model``'s weights with the matrix weights in ``weights`` (None: at
    ``precision``)."""
    tensors = unique_tensors([*model.parameters(), *model.buffers()])
    at_precision = sum(bytes_at(tensor, precision) for tensor in tensors)
    tables = embedding_tables(model)
    matrices = matrix_weights(model, tables) if weights else {}
    resident = sum(quantised_bytes(tensor, weights, group_size, zero_points, matrices[tensor_key(tensor)])
                   if tensor_key(tensor) in matrices else bytes_at(tensor, precision) for tensor in tensors)
    gathered = tuple(Gathered(table.shape[0], table.shape[1] * BYTES_PER_ELEMENT[precision])
                     for key, table in tables.items() if key not in read_whole(model, tables))
    return WeightLayout(
        resident_bytes=resident,
        at_precision_bytes=at_precision,
        quantised_elements=sum(tensor.numel() for tensor in tensors if tensor_key(tensor) in matrices),
        format=describe(weights, precision, group_size, zero_points),
        gathered=gathered,
    )


def embedding_tables(model: torch.nn.Module) -> dict[Any, torch.Tensor]:
    """The weight of every ``nn.Embedding``, by tensor key."""
    return {tensor_key(module.weight): module.weight for module in model.modules()
            if isinstance(module, torch.nn.Embedding)}


def read_whole(model: torch.nn.Module, tables: dict[Any, torch.Tensor]) -> set[Any]:
    """Embedding tables some other module reads whole (an output head tied to the input embedding)."""
    whole = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            continue
        whole.update(tensor_key(p) for p in module.parameters(recurse=False) if tensor_key(p) in tables)
    return whole


def output_head_keys(model: torch.nn.Module) -> set[Any]:
    """The output head's weight (Hugging Face's ``get_output_embeddings``), which quantisation leaves alone."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    weight = getattr(head, "weight", None)
    return {tensor_key(weight)} if isinstance(weight, torch.Tensor) else set()


def matrix_weights(model: torch.nn.Module, tables: dict[Any, torch.Tensor]) -> dict[Any, int]:
    """Tensor key -> input features of every matrix weight a weight format applies to."""
    excluded = set(tables) | output_head_keys(model)
    found: dict[Any, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            key = tensor_key(parameter)
            if parameter.dim() == 2 and parameter.is_floating_point() and key not in excluded:
                # torch's Linear stores [out, in]; transformers' Conv1D (GPT-2) stores [in, out]
                found[key] = parameter.shape[0] if type(module).__name__ == "Conv1D" else parameter.shape[1]
    return found


def quantised_bytes(tensor: torch.Tensor, weights: str, group_size: int, zero_points: bool, in_features: int) -> int:
    """Stored bytes of one matrix weight in ``weights``: its elements at the format's bits, plus its scales."""
    bits = BITS[weights]
    data = math.ceil(tensor.numel() * bits / 8)
    if weights == "fp8":
        return data + TENSOR_SCALE_BYTES
    rows = tensor.numel() // in_features
    groups = rows * (math.ceil(in_features / group_size) if group_size else 1)
    return data + groups * SCALE_BYTES + (math.ceil(groups * bits / 8) if zero_points else 0)


def describe(weights: str | None, precision: str, group_size: int, zero_points: bool) -> str:
    if weights is None:
        return precision
    if weights == "fp8":
        return "fp8 matrix weights, one fp32 scale per tensor"
    groups = f"groups of {group_size} along the input" if group_size else "one group per output row"
    zeros = f" and {BITS[weights]}-bit zero points" if zero_points else ""
    return f"{weights} matrix weights ({groups}, fp16 scales{zeros})"
