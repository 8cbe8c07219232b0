"""A custom operator the example plugin prices (``example::fused_gelu``), and a model that uses it.

Imports torch: the plugin names this module as the formula's ``library``, which rpx imports only when a torch count
starts, so ``rpx plugins`` never imports torch.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.library.custom_op("example::fused_gelu", mutates_args=())
def fused_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU in its erf form, as one operator (a stand-in for a vendor's fused kernel)."""
    return torch.nn.functional.gelu(x)


@fused_gelu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class FusedGeluMLP(nn.Module):
    """Linear -> fused_gelu -> linear."""

    def __init__(self, width: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.ops.example.fused_gelu(self.up(x)))


def fused_gelu_mlp(width: int = 16, hidden: int = 64) -> FusedGeluMLP:
    return FusedGeluMLP(width, hidden)
