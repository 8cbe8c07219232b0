"""Built-in example models, built from code (no weights downloaded, no transformers dependency).

They give specs and tests models whose FLOPs can be checked by hand, a Llama-2-shaped decoder whose 70B preset
counts on the meta device, and ResNet-50. Every model has ``example_inputs(...)`` returning a tuple of inputs on the
model's device (meta models get meta inputs). This module imports torch: import it lazily.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


class TinyCNN(nn.Module):
    """Two conv-batchnorm-ReLU-maxpool stages, global average pooling and a linear classifier.

    Input: float32 images of shape (batch, 3, 32, 32). Output: float32 logits (batch, classes).
    """

    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(2 * channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.features(images)).flatten(1))

    def example_inputs(self, batch: int = 1, size: int = 32) -> tuple[torch.Tensor]:
        return (torch.randn(batch, 3, size, size, device=_device_of(self)),)


def tiny_cnn(channels: int = 16, classes: int = 10) -> TinyCNN:
    return TinyCNN(channels, classes)


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention through F.scaled_dot_product_attention, then a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int, ffn: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, ffn), nn.GELU(), nn.Linear(ffn, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, d_model))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, pre-norm blocks, final layer norm, and an output
    head tied to the token embedding (one weight matrix, counted once).

    Input: int64 token ids of shape (batch, seq_len), values < vocab, seq_len <= max_seq.
    Output: float32 logits (batch, seq_len, vocab).
    """

    def __init__(
        self,
        vocab: int = 256,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        ffn: int = 256,
        max_seq: int = 128,
    ) -> None:
        super().__init__()
        self.vocab, self.max_seq = vocab, max_seq
        self.embed = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, ffn) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def example_inputs(self, batch: int = 1, seq_len: int = 32) -> tuple[torch.Tensor]:
        return (torch.randint(self.vocab, (batch, seq_len), device=_device_of(self)),)


def tiny_transformer(
    vocab: int = 256, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, ffn: int = 256, max_seq: int = 128
) -> TinyTransformer:
    return TinyTransformer(vocab, d_model, n_heads, n_layers, ffn, max_seq)


class MHABlock(nn.Module):
    """Self-attention through nn.MultiheadAttention (batch_first), which takes its fused fast path in eval + no_grad.

    Input: float32 (batch, seq_len, embed). Output: float32 (batch, seq_len, embed).
    """

    def __init__(self, embed: int = 32, n_heads: int = 4, need_weights: bool = True) -> None:
        super().__init__()
        self.embed, self.need_weights = embed, need_weights
        self.attn = nn.MultiheadAttention(embed, n_heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=self.need_weights)[0]

    def example_inputs(self, batch: int = 2, seq_len: int = 8) -> tuple[torch.Tensor]:
        return (torch.randn(batch, seq_len, self.embed, device=_device_of(self)),)


def mha_block(embed: int = 32, n_heads: int = 4, need_weights: bool = True) -> MHABlock:
    return MHABlock(embed, n_heads, need_weights)


@attrs.frozen
class LlamaConfig:
    """Shape of a Llama-2-style decoder."""

    d_model: int  # hidden size
    n_layers: int  # decoder blocks
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (grouped-query attention when fewer than n_heads)
    ffn: int  # SwiGLU inner size
    vocab: int  # vocabulary size
    max_seq: int = 4096  # longest sequence the rotary tables cover
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # rotary base


#: Llama 2 shapes from the Llama 2 paper / released configs; "tiny" is for tests.
LLAMA_PRESETS = {
    "tiny": LlamaConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn=160, vocab=128, max_seq=64),
    "llama2-7b": LlamaConfig(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn=11008, vocab=32000),
    "llama2-13b": LlamaConfig(d_model=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn=13824, vocab=32000),
    "llama2-70b": LlamaConfig(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn=28672, vocab=32000),
}


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _Rotary(nn.Module):
    """Rotary position embedding (rotate-half form) from cos/sin tables built once (non-persistent buffers); one
    instance is shared by every layer, so the tables exist (and count) once."""

    def __init__(self, head_dim: int, max_seq: int, theta: float) -> None:
        super().__init__()
        inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inverse).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, half = x.shape[-2], x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos[:seq] + rotated * self.sin[:seq]


class _LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, rotary: _Rotary) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.d_model // config.n_heads
        kv_dim = self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.k_proj = nn.Linear(config.d_model, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, kv_dim, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.rotary = rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q = self.q_proj(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotary(q), self.rotary(k)
        grouped = self.n_kv_heads != self.n_heads
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        return self.o_proj(attended.transpose(1, 2).reshape(batch, seq, d_model))


class _SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.ffn, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn, bias=False)
        self.down_proj = nn.Linear(config.ffn, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _LlamaLayer(nn.Module):
    def __init__(self, config: LlamaConfig, rotary: _Rotary) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = _LlamaAttention(config, rotary)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = _SwiGLU(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Llama-2-shaped decoder: RMSNorm, rotary embeddings, grouped-query causal attention via SDPA, SwiGLU MLP, and an
    untied output head. No KV cache: one full-sequence forward pass (prefill).

    Input: int64 token ids of shape (batch, seq_len), values < vocab, seq_len <= max_seq.
    Output: logits (batch, seq_len, vocab) in the parameters' dtype.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.d_model)
        self.rotary = _Rotary(config.d_model // config.n_heads, config.max_seq, config.rope_theta)
        self.layers = nn.ModuleList(_LlamaLayer(config, self.rotary) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def example_inputs(self, batch: int = 1, seq_len: int = 16) -> tuple[torch.Tensor]:
        if seq_len > self.config.max_seq:
            raise ValueError(f"seq_len {seq_len} exceeds this model's max_seq {self.config.max_seq}")
        return (torch.randint(self.config.vocab, (batch, seq_len), device=_device_of(self)),)


def llama(preset: str = "tiny", n_layers: int | None = None) -> Llama:
    """A Llama-2-shaped decoder (``n_layers`` overrides the preset's); build large presets on meta
    (``build_on_meta(llama, preset="llama2-70b")``)."""
    if preset not in LLAMA_PRESETS:
        raise ValueError(f"unknown llama preset {preset!r}; known: {', '.join(LLAMA_PRESETS)}")
    config = LLAMA_PRESETS[preset]
    return Llama(config if n_layers is None else attrs.evolve(config, n_layers=n_layers))



class _Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (stride here), 1x1 expand by 4, each with batch norm; a projected
    shortcut where the shape changes."""

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 (He et al., v1.5 strides as torchvision's ``resnet50``: 25,557,032 parameters at 1,000 classes).

    Input: float32 images (batch, 3, 224, 224). Output: float32 logits (batch, classes).
    """

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        in_channels = 64
        for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(_Bottleneck(in_channels, width, stride))
                in_channels = 4 * width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(images)).flatten(1))

    def example_inputs(self, batch: int = 1, size: int = 224) -> tuple[torch.Tensor]:
        return (torch.randn(batch, 3, size, size, device=_device_of(self)),)


def resnet50(classes: int = 1000) -> ResNet50:
    return ResNet50(classes)
