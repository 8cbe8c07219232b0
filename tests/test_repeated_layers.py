"""Repeated layers on meta: replaying two agreeing full traces gives exactly the figures of tracing every layer, and
every layer that might not repeat (state, hooks, mutable arguments, aliasing, changing shapes, grad) is traced."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from torch import nn

from rpx_plugins.torch.counter import build_on_meta, count_model
from rpx_plugins.torch.zoo import llama


def counted(model: nn.Module, args: tuple[Any, ...], replay: bool, grad: bool = False, **options: Any) -> Any:
    with torch.set_grad_enabled(grad):
        return count_model(model, args, replay_repeats=replay, **options)


def figures(report: Any) -> dict[str, Any]:
    """Every figure of a count (FLOPs, breakdowns, bytes, activation memory, per-call records) but ``replayed``."""
    flops = attrs.asdict(report.flops)
    flops.pop("replayed")
    return {"flops": flops, "traffic": attrs.asdict(report.traffic)}


def replayed_and_traced(model: nn.Module, args: tuple[Any, ...], **options: Any) -> tuple[Any, Any]:
    return counted(model, args, True, **options), counted(model, args, False, **options)


def tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.int64, device="meta")


@pytest.mark.parametrize("options", [{}, {"top_k": None, "module_depth": 8}, {"element_sizes": {torch.bfloat16: 1}}])
def test_a_llama_stack_is_replayed_with_every_figure_identical(options: dict[str, Any]) -> None:
    model = build_on_meta(llama, preset="tiny", n_layers=6).eval().to(torch.bfloat16)
    replayed, traced = replayed_and_traced(model, (tokens(2, 16),), **options)
    assert figures(replayed) == figures(traced)
    assert replayed.flops.replayed == ("layers.2 .. layers.5: 4 call(s) counted as layers.0 and layers.1, which have "
                                       "the same structure and input shapes and were traced in full with identical "
                                       "counts",)
    assert traced.flops.replayed == ()
    assert replayed.flops.by_module["layers.5.attn"].calls == 1  # replayed submodule calls are counted too


def test_a_shape_sweep_of_one_model_matches_counting_each_shape_alone() -> None:
    model = build_on_meta(llama, preset="tiny", n_layers=5).eval()
    for batch, seq in [(1, 8), (2, 8), (1, 33), (3, 64)]:
        replayed, traced = replayed_and_traced(model, (tokens(batch, seq),), top_k=None)
        assert replayed.flops.replayed
        assert figures(replayed) == figures(traced), (batch, seq)
    # and by hand: per layer, q/k/v/o and the SwiGLU projections are 4*d^2 + 2*d*kv + 3*d*ffn MACs per token
    d, kv, ffn, layers, vocab, seq = 64, 32, 160, 5, 128, 33
    report = counted(model, (tokens(1, seq),), True)
    projections = seq * layers * (2 * d * d + 2 * d * kv + 3 * d * ffn) + seq * d * vocab
    attention = layers * 4 * seq * seq * (d // 4) * 2  # 4 heads: QK^T and PV, dense causal
    assert report.flops.macs == projections + attention


class Stateful(nn.Module):
    """Keeps every output it made: its second call's activation memory differs, so it must never be replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x).relu()
        self.kept.append(y * 2)
        return y


CALLS = {"n": 0}


class Warming(nn.Module):
    """Does extra work on its first call only (state outside its arguments): its two traces disagree."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CALLS["n"] += 1
        if CALLS["n"] == 1:
            x = x.exp()
        return self.linear(x)


class WithCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None, holder: Any = None) -> torch.Tensor:
        y = self.linear(x)
        if holder is not None:
            holder.items.append(y)
        return y


class Holder:
    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []


class Passthrough(nn.Module):
    """Returns its input itself (as nn.Identity does): an output aliasing an input is never replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.linear(x)
        return x


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, total = pair
        y = self.linear(x)
        return y, total + y.sum()


class Chain(nn.Module):
    def __init__(self, layers: list[nn.Module], pass_holder: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.holder = Holder() if pass_holder else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, holder=self.holder) if self.holder is not None else layer(x)
        return x


def on_meta(factory: Any) -> nn.Module:
    return build_on_meta(factory).eval()


X = (torch.zeros(4, 8, device="meta"),)


@pytest.mark.parametrize("build, why", [
    (lambda: Chain([Stateful() for _ in range(5)]), "keeps state between calls"),
    (lambda: Chain([Warming() for _ in range(5)]), "its two traces differ"),
    (lambda: Chain([WithCache() for _ in range(5)], pass_holder=True), "takes a mutable argument"),
    (lambda: nn.Sequential(*[Passthrough() for _ in range(5)]), "returns its input"),
])
def test_layers_that_might_not_repeat_are_traced_in_full(build: Any, why: str) -> None:
    CALLS["n"] = 0
    replayed = counted(on_meta(build), X, True, top_k=None)
    CALLS["n"] = 0
    traced = counted(on_meta(build), X, False, top_k=None)
    assert replayed.flops.replayed == (), why
    assert figures(replayed) == figures(traced), why


def test_a_stateful_layer_traced_in_full_keeps_its_activation_memory() -> None:
    """What replaying would have lost: the outputs each layer kept alive grow the peak layer after layer."""
    one = counted(on_meta(lambda: Chain([Stateful()])), X, True)
    five = counted(on_meta(lambda: Chain([Stateful() for _ in range(5)])), X, True)
    kept = 4 * 8 * 4  # one fp32 4x8 tensor kept per layer
    assert five.traffic.activation_peak_bytes >= one.traffic.activation_peak_bytes + 4 * kept


def test_plain_layers_of_a_sequential_are_replayed_exactly() -> None:
    model = on_meta(lambda: nn.Sequential(*[nn.Linear(8, 8) for _ in range(3)], nn.Flatten(0), nn.Linear(32, 32)))
    replayed, traced = replayed_and_traced(model, X, top_k=None)
    assert replayed.flops.replayed == ("2: 1 call(s) counted as 0 and 1, which have the same structure and input "
                                       "shapes and were traced in full with identical counts",)
    assert figures(replayed) == figures(traced)


def test_a_layer_with_a_users_hook_is_traced_every_time() -> None:
    model = on_meta(lambda: nn.Sequential(*[nn.Linear(8, 8) for _ in range(5)]))
    seen: list[int] = []
    for layer in model:
        layer.register_forward_hook(lambda module, args, output: seen.append(1))
    assert counted(model, X, True).flops.replayed == ()
    assert len(seen) == 5


def test_tuple_outputs_are_replayed_as_fresh_meta_tensors() -> None:
    class Sum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*[TwoOutputs() for _ in range(6)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, total = self.layers((x, torch.zeros((), device=x.device)))
            return y * total

    model = on_meta(Sum)
    replayed, traced = replayed_and_traced(model, X, top_k=None)
    assert replayed.flops.replayed and figures(replayed) == figures(traced)


def test_layers_whose_input_shapes_change_are_not_replayed_across_shapes() -> None:
    """Identical strided convolutions: each sees a smaller input, so no two calls share a key."""
    model = on_meta(lambda: nn.Sequential(*[nn.Conv2d(4, 4, 3, stride=2, padding=1) for _ in range(4)]))
    images = (torch.zeros(1, 4, 64, 64, device="meta"),)
    replayed, traced = replayed_and_traced(model, images, top_k=None)
    assert replayed.flops.replayed == () and figures(replayed) == figures(traced)


def test_a_torch_transformer_encoder_on_its_fast_path_is_replayed_exactly() -> None:
    layer = lambda: nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)  # noqa: E731
    model = on_meta(lambda: nn.TransformerEncoder(layer(), 6, enable_nested_tensor=False))
    replayed, traced = replayed_and_traced(model, (torch.zeros(2, 10, 32, device="meta"),), top_k=None)
    assert replayed.flops.replayed and figures(replayed) == figures(traced)


def test_nothing_is_replayed_with_grad_enabled_or_on_a_real_device() -> None:
    model = on_meta(lambda: llama(preset="tiny", n_layers=4))
    assert counted(model, (tokens(1, 8),), True, grad=True).flops.replayed == ()
    real = llama(preset="tiny", n_layers=4).eval()
    assert counted(real, (torch.zeros(1, 8, dtype=torch.int64),), True).flops.replayed == ()


def hf_model(kind: str, **config: Any) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    settings = transformers.AutoConfig.for_model(kind, **config)
    return build_on_meta(lambda: transformers.AutoModel.from_config(settings)).eval()


def test_hugging_face_encoder_layers_differing_only_in_layer_idx_are_replayed_exactly() -> None:
    model = hf_model("bert", num_hidden_layers=5, hidden_size=64, intermediate_size=128, num_attention_heads=4)
    replayed, traced = replayed_and_traced(model, (tokens(2, 16),), top_k=None)
    assert replayed.flops.replayed[0].startswith("encoder.layer.2 .. encoder.layer.4: 3 call(s)")
    assert figures(replayed) == figures(traced)


def test_hugging_face_decoder_layers_given_a_kv_cache_are_traced_in_full() -> None:
    model = hf_model("gpt2", n_layer=4, n_embd=64, n_head=4)
    replayed, traced = replayed_and_traced(model, (tokens(1, 16),), top_k=None)
    assert replayed.flops.replayed == () and figures(replayed) == figures(traced)
