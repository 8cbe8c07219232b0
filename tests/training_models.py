"""Small models the training tests count by hand and run for real: an MLP, a CNN with batch norm, a one-block
transformer (layer norms, causal attention through F.scaled_dot_product_attention, a GELU MLP, residuals, a language
model head). Importable by specs (``tests.training_models:mlp``), so measured jobs run in rpx's worker processes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(inputs: int = 64, hidden: int = 256, classes: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def cnn(channels: int = 8, classes: int = 10) -> nn.Module:
    """conv 3x3 -> batch norm -> ReLU, twice (the second with stride 2), global average pool, linear head."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1, stride=2), nn.BatchNorm2d(2 * channels), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, classes),
    )


class Block(nn.Module):
    """x + attention(LN(x)), then h + MLP(LN(h)); causal attention over ``heads`` heads."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.out(attended.transpose(1, 2).reshape(batch, seq, width))
        return h + self.down(F.gelu(self.up(self.norm2(h))))


class TinyTransformer(nn.Module):
    def __init__(self, width: int = 32, heads: int = 4, vocab: int = 50) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = Block(width, heads)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def transformer(width: int = 32, heads: int = 4, vocab: int = 50) -> nn.Module:
    return TinyTransformer(width, heads, vocab)


def summed(outputs: torch.Tensor) -> torch.Tensor:
    """A user's loss: the mean of the outputs."""
    return outputs.float().mean()
