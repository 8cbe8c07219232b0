"""A model with a GELU, for the re-priced formula. Imports torch: named only by specs, never by the plugin module."""

from __future__ import annotations

import torch


def gelu_mlp(width: int = 16, hidden: int = 32) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU())
