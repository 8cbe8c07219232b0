"""The comparison's model set, each with parameters and MACs derived by hand from its hyperparameters.

Why hand-derived: every counter under comparison (rpx included) hooks the model somewhere; the reference has to come
from somewhere else. Each ``analytic`` function below is arithmetic over the model's configuration only (no tracing,
no hooks, no tool), written from the layer definitions:

- convolution: out_channels x out_h x out_w x (in_channels / groups) x kh x kw MACs per sample;
- linear: tokens x in x out; attention (any kernel, causal masks dense): QK^T and PV each tokens x kv_tokens x hidden;
- embeddings, norms, activations, pooling, softmax: no MACs (rpx counts them as other FLOPs, not MACs).

MACs are multiply-accumulates of matrix work; FLOPs = 2 x MACs is the convention every tool is converted to. The
parameter count takes a shared (tied) weight once. Models come from code or transformers configs: no weights are
downloaded. ``build(device)`` returns an eval-mode model; ``inputs(device)`` the positional inputs of one forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

VOCAB = 1000


@dataclass(frozen=True)
class Analytic:
    """Hand-derived figures of one forward pass at batch 1. ``attention_macs`` is the part of ``macs`` done by
    attention (QK^T and PV), ``shared_params`` the elements of weights used twice (counted once in ``params``)."""

    params: int
    macs: int
    attention_macs: int = 0
    shared_params: int = 0


@dataclass(frozen=True)
class Case:
    """One model of the comparison: how to build it, its inputs, and its analytic figures."""

    name: str
    description: str
    build: Callable[[str], Any]
    inputs: Callable[[str], tuple]
    analytic: Analytic | None  # None: a speed-only model (too large to derive here by hand or to run for real)
    #: input tables rpx.profile takes (shape, dtype, and the integer range of token ids)
    rpx_inputs: list[dict[str, Any]] = field(default_factory=list)
    #: argument names of ``inputs``, for tools that call the model with keyword arguments
    arg_names: tuple[str, ...] = ("x",)


def conv_macs(out_c: int, out_hw: int, in_c: int, groups: int, k: int) -> int:
    return out_c * out_hw * out_hw * (in_c // groups) * k * k


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------- CNNs with grouped and depthwise convolutions


def grouped_cnn(device: str = "cpu"):
    """A ResNeXt-style block: stem conv, 1x1 -> grouped 3x3 (8 groups) -> 1x1 with batch norms, pooled classifier."""
    nn = _torch().nn

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list:
        return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    with _torch().device(device):
        return nn.Sequential(
            *conv_bn(3, 32, 3, stride=2), *conv_bn(32, 64, 1), *conv_bn(64, 64, 3, groups=8), *conv_bn(64, 64, 1),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        ).eval()


def grouped_cnn_analytic() -> Analytic:
    macs = (conv_macs(32, 32, 3, 1, 3) + conv_macs(64, 32, 32, 1, 1) + conv_macs(64, 32, 64, 8, 3)
            + conv_macs(64, 32, 64, 1, 1) + 64 * 10)
    weights = 32 * 3 * 9 + 64 * 32 + 64 * (64 // 8) * 9 + 64 * 64
    norms = 2 * (32 + 64 + 64 + 64)
    return Analytic(params=weights + norms + 64 * 10 + 10, macs=macs)


def depthwise_cnn(device: str = "cpu"):
    """A MobileNet-style net: stem conv, two depthwise-separable blocks (depthwise 3x3 + pointwise 1x1), ReLU6."""
    nn = _torch().nn

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list:
        return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()]

    with _torch().device(device):
        return nn.Sequential(
            *conv_bn(3, 16, 3, stride=2),
            *conv_bn(16, 16, 3, groups=16), *conv_bn(16, 32, 1),
            *conv_bn(32, 32, 3, stride=2, groups=32), *conv_bn(32, 64, 1),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        ).eval()


def depthwise_cnn_analytic() -> Analytic:
    macs = (conv_macs(16, 32, 3, 1, 3) + conv_macs(16, 32, 16, 16, 3) + conv_macs(32, 32, 16, 1, 1)
            + conv_macs(32, 16, 32, 32, 3) + conv_macs(64, 16, 32, 1, 1) + 64 * 10)
    weights = 16 * 3 * 9 + 16 * 9 + 32 * 16 + 32 * 9 + 64 * 32
    norms = 2 * (16 + 16 + 32 + 32 + 64)
    return Analytic(params=weights + norms + 64 * 10 + 10, macs=macs)


def image(device: str) -> tuple:
    return (_torch().randn(1, 3, 64, 64, device=device),)


# ---------------------------------------------------------------- transformers models from configs (no weights)

VIT = {"hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 3, "intermediate_size": 768,
       "image_size": 64, "patch_size": 8, "num_channels": 3}
BERT = {"vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 512, "max_position_embeddings": 512, "type_vocab_size": 2}
LLAMA = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
         "tie_word_embeddings": False}


def _on(device: str, make: Callable[[], Any]):
    with _torch().device(device):
        return make().eval()


def vit(device: str = "cpu"):
    """transformers' ViTModel (no pooler) from a small config; attention through F.scaled_dot_product_attention."""
    from transformers import ViTConfig, ViTModel

    return _on(device, lambda: ViTModel(ViTConfig(**VIT, return_dict=False), add_pooling_layer=False))


def transformer_layer_macs(tokens: int, hidden: int, intermediate: int) -> tuple[int, int]:
    """(all MACs, attention MACs) of one post-/pre-norm encoder layer: Q, K, V, O projections, QK^T, PV, 2-layer MLP."""
    attention = 2 * tokens * tokens * hidden
    return 4 * tokens * hidden * hidden + 2 * tokens * hidden * intermediate + attention, attention


def transformer_layer_params(hidden: int, intermediate: int) -> int:
    """Q, K, V, O with biases, two layer norms, the MLP with biases."""
    return 4 * (hidden * hidden + hidden) + 2 * 2 * hidden + hidden * intermediate + intermediate + intermediate * hidden + hidden


def vit_analytic() -> Analytic:
    h, i, layers, p = VIT["hidden_size"], VIT["intermediate_size"], VIT["num_hidden_layers"], VIT["patch_size"]
    patches = (VIT["image_size"] // p) ** 2
    tokens = patches + 1  # the CLS token
    layer, attention = transformer_layer_macs(tokens, h, i)
    patch_embedding = patches * h * VIT["num_channels"] * p * p
    params = (h * VIT["num_channels"] * p * p + h + h + tokens * h  # patch conv, CLS token, position embeddings
              + layers * transformer_layer_params(h, i) + 2 * h)  # layers, final layer norm
    return Analytic(params=params, macs=patch_embedding + layers * layer, attention_macs=layers * attention)


def bert(device: str = "cpu"):
    """transformers' BertModel (no pooler) from a small config, 2 layers of hidden 128."""
    from transformers import BertConfig, BertModel

    return _on(device, lambda: BertModel(BertConfig(**BERT, return_dict=False), add_pooling_layer=False))


def bert_analytic(tokens: int) -> Analytic:
    h, i, layers = BERT["hidden_size"], BERT["intermediate_size"], BERT["num_hidden_layers"]
    layer, attention = transformer_layer_macs(tokens, h, i)
    embeddings = (BERT["vocab_size"] + BERT["max_position_embeddings"] + BERT["type_vocab_size"]) * h + 2 * h
    return Analytic(params=embeddings + layers * transformer_layer_params(h, i), macs=layers * layer,
                    attention_macs=layers * attention)


def llama(device: str = "cpu"):
    """transformers' LlamaForCausalLM from a small config: grouped-query attention (4 query, 2 key/value heads),
    SwiGLU MLP, RMSNorm, rotary embeddings, untied LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _on(device, lambda: LlamaForCausalLM(LlamaConfig(**LLAMA)))


def llama_analytic(tokens: int) -> Analytic:
    h, i, layers, v = LLAMA["hidden_size"], LLAMA["intermediate_size"], LLAMA["num_hidden_layers"], LLAMA["vocab_size"]
    head_dim = h // LLAMA["num_attention_heads"]
    kv = LLAMA["num_key_value_heads"] * head_dim
    attention = 2 * tokens * tokens * h  # every query head attends over all tokens (K/V heads repeated)
    layer = tokens * (2 * h * h + 2 * h * kv) + 3 * tokens * h * i + attention
    # rotary angles are an element-wise product of positions and frequencies: no MACs
    params = v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h + v * h
    return Analytic(params=params, macs=layers * layer + tokens * h * v, attention_macs=layers * attention)


def tokens(length: int) -> Callable[[str], tuple]:
    def make(device: str) -> tuple:
        return (_torch().randint(0, VOCAB, (1, length), device=device),)

    return make


def token_table(length: int) -> list[dict[str, Any]]:
    return [{"shape": [1, length], "dtype": "int64", "high": VOCAB}]


# ---------------------------------------------------------------- models written against torch directly

SDPA_DIM, SDPA_HEADS, SDPA_TOKENS = 64, 4, 64


def sdpa_model(device: str = "cpu"):
    """A causal self-attention block calling F.scaled_dot_product_attention directly (no nn.MultiheadAttention)."""
    torch = _torch()

    class CausalSelfAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(SDPA_DIM, 3 * SDPA_DIM)
            self.out = torch.nn.Linear(SDPA_DIM, SDPA_DIM)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, SDPA_HEADS, d // SDPA_HEADS).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, d))

    with torch.device(device):
        return CausalSelfAttention().eval()


def sdpa_analytic() -> Analytic:
    d, t = SDPA_DIM, SDPA_TOKENS
    attention = 2 * t * t * d  # causal mask counted dense
    return Analytic(params=3 * d * d + 3 * d + d * d + d, macs=t * d * 3 * d + t * d * d + attention,
                    attention_macs=attention)


TIED_VOCAB, TIED_DIM, TIED_TOKENS = 500, 64, 32


def tied_model(device: str = "cpu"):
    """A tiny language model whose output projection shares the embedding's weight (weight tying)."""
    torch = _torch()
    nn = torch.nn

    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(TIED_VOCAB, TIED_DIM)
            self.mlp = nn.Sequential(nn.Linear(TIED_DIM, 4 * TIED_DIM), nn.GELU(), nn.Linear(4 * TIED_DIM, TIED_DIM))
            self.norm = nn.LayerNorm(TIED_DIM)
            self.head = nn.Linear(TIED_DIM, TIED_VOCAB, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            x = self.embed(ids)
            return self.head(self.norm(x + self.mlp(x)))

    with torch.device(device):
        return TiedLM().eval()


def tied_analytic() -> Analytic:
    v, d, t = TIED_VOCAB, TIED_DIM, TIED_TOKENS
    params = v * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * d
    return Analytic(params=params, macs=t * 8 * d * d + t * d * v, shared_params=v * d)


def tied_inputs(device: str) -> tuple:
    return (_torch().randint(0, TIED_VOCAB, (1, TIED_TOKENS), device=device),)


def sdpa_inputs(device: str) -> tuple:
    return (_torch().randn(1, SDPA_TOKENS, SDPA_DIM, device=device),)


IMAGE_TABLE = [{"shape": [1, 3, 64, 64]}]

CASES: tuple[Case, ...] = (
    Case("grouped-cnn", "ResNeXt-style, grouped 3x3 conv", grouped_cnn, image, grouped_cnn_analytic(), IMAGE_TABLE,
         ("input",)),
    Case("depthwise-cnn", "MobileNet-style, depthwise 3x3 + pointwise", depthwise_cnn, image, depthwise_cnn_analytic(),
         IMAGE_TABLE, ("input",)),
    Case("vit", "transformers ViT, 4 layers, 65 tokens", vit, image, vit_analytic(), IMAGE_TABLE, ("pixel_values",)),
    Case("bert-128", "transformers BERT encoder, seq 128", bert, tokens(128), bert_analytic(128), token_table(128),
         ("input_ids",)),
    Case("bert-512", "transformers BERT encoder, seq 512", bert, tokens(512), bert_analytic(512), token_table(512),
         ("input_ids",)),
    Case("llama-128", "transformers Llama decoder (GQA), seq 128", llama, tokens(128), llama_analytic(128),
         token_table(128), ("input_ids",)),
    Case("llama-512", "transformers Llama decoder (GQA), seq 512", llama, tokens(512), llama_analytic(512),
         token_table(512), ("input_ids",)),
    Case("sdpa", "F.scaled_dot_product_attention called directly, causal", sdpa_model, sdpa_inputs, sdpa_analytic(),
         [{"shape": [1, SDPA_TOKENS, SDPA_DIM]}]),
    Case("tied-lm", "embedding tied to the output head", tied_model, tied_inputs, tied_analytic(),
         [{"shape": [1, TIED_TOKENS], "dtype": "int64", "high": TIED_VOCAB}], ("ids",)),
)

#: Cheap enough on the meta device for the test suite (all of them are, at these sizes).
CHEAP = tuple(case.name for case in CASES)




def llama70b(device: str = "meta"):
    """rpx's own Llama-2-70B-shaped decoder: only the meta device holds it on this machine (276 GB of fp32 weights)."""
    torch = _torch()
    from rpx_plugins.torch import zoo

    with torch.device(device):
        return zoo.llama(preset="llama2-70b").eval()


LLAMA70B_TOKENS = 2048

#: The speed comparison's extra model: tools that need real tensors cannot hold it.
LLAMA70B = Case("llama2-70b", "Llama-2-70B shape, seq 2048 (speed only)", llama70b,
                lambda device: (_torch().zeros(1, LLAMA70B_TOKENS, dtype=_torch().long, device=device),), None,
                [{"shape": [1, LLAMA70B_TOKENS], "dtype": "int64", "high": 32000}], ("tokens",))


def case(name: str) -> Case:
    return next(c for c in (*CASES, LLAMA70B) if c.name == name)
