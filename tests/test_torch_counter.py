"""Tier 1 counting core: hand-computed FLOPs/MACs/bytes, agreement with torch's FlopCounterMode, CPU == meta, grad ==
no_grad, per-module sums without double counting, activation liveness, the meta data-dependence error, and the torch
Tier 1 stages' record of what was counted (inputs, batch size, why meta was not used).

Hand computations write the formula out; conventions: FLOPs = 2 x MACs, bias adds are 1 other FLOP per output element,
bytes = 4 per float32 element.
"""

from __future__ import annotations

import attrs
import pytest
import tomli_w
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rpx_core.api import run_spec
from rpx_core.convert import converter
from rpx_core.errors import SpecError
from rpx_core.precision import UnknownPrecisionError
from rpx_core.results.records import StageRecord
from rpx_core.spec.schema import InputSpec, ModelSpec, spec_from_dict
from rpx_core.types.counts import OTHERS, ROOT_MODULE, FlopsResult, TrafficResult, fold_largest
from rpx_plugins.torch import zoo as model_zoo
from rpx_plugins.torch.counter import (
    SOFTMAX_FLOPS,
    CountingError,
    CountReport,
    build_on_meta,
    count_model,
)
from rpx_plugins.torch.params import count_parameters

F32 = 4  # bytes per float32 element


class Apply(nn.Module):
    """A module whose forward is one functional call, so functional ops can be counted as a model."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


# -- hand-computed figures ---------------------------------------------------------------------------------------------


def test_linear_with_bias_hand_computed() -> None:
    batch, d_in, d_out = 4, 16, 32
    report = count_model(nn.Linear(d_in, d_out), (torch.randn(batch, d_in),))
    macs = batch * d_in * d_out
    assert report.flops.macs == macs
    assert report.flops.matrix_flops == 2 * macs
    assert report.flops.other_flops == batch * d_out  # one bias add per output element
    assert report.flops.total_flops == 2 * macs + batch * d_out
    weight_bytes = (d_in * d_out + d_out) * F32
    input_bytes, output_bytes = batch * d_in * F32, batch * d_out * F32
    traffic = report.traffic
    assert traffic.unfused_weight_read_bytes == weight_bytes
    assert traffic.unfused_activation_read_bytes == input_bytes
    assert traffic.unfused_written_bytes == output_bytes
    assert traffic.unfused_bytes == weight_bytes + input_bytes + output_bytes
    assert traffic.fused_bytes == weight_bytes + input_bytes + output_bytes  # one op: fused == unfused
    assert traffic.arithmetic_intensity_unfused == pytest.approx(report.flops.total_flops / traffic.unfused_bytes)
    assert list(report.flops.by_operator) == ["aten.addmm"]


def test_linear_without_bias_on_3d_input_hand_computed() -> None:
    batch, seq, d_in, d_out = 2, 3, 16, 32
    report = count_model(nn.Linear(d_in, d_out, bias=False), (torch.randn(batch, seq, d_in),))
    assert report.flops.macs == batch * seq * d_in * d_out
    assert report.flops.other_flops == 0
    assert report.traffic.unfused_bytes == (d_in * d_out + batch * seq * d_in + batch * seq * d_out) * F32
    assert list(report.flops.by_operator) == ["aten.mm"]  # the views around it move nothing and are not listed


def test_conv2d_stride_groups_bias_hand_computed() -> None:
    batch, c_in, c_out, size, kernel, stride, padding, groups = 2, 4, 8, 9, 3, 2, 1, 2
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, groups=groups)
    report = count_model(conv, (torch.randn(batch, c_in, size, size),))
    out_size = (size + 2 * padding - kernel) // stride + 1  # 5
    outputs = batch * c_out * out_size * out_size
    macs = outputs * (c_in // groups) * kernel * kernel
    assert report.flops.macs == macs == 7200
    assert report.flops.other_flops == outputs  # bias
    read = (batch * c_in * size * size + c_out * (c_in // groups) * kernel * kernel + c_out) * F32
    assert report.flops.by_operator["aten.convolution"].bytes_read == read
    assert report.traffic.unfused_written_bytes == outputs * F32


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_transposed_conv2d_hand_computed(device: str) -> None:
    batch, c_in, c_out, size, kernel, stride, groups = 2, 4, 6, 5, 3, 2, 2
    conv = nn.ConvTranspose2d(c_in, c_out, kernel, stride=stride, groups=groups).to(device)
    report = count_model(conv, (torch.randn(batch, c_in, size, size, device=device),))
    # every input element is multiplied into (C_out / groups) x kernel x kernel outputs
    assert report.flops.macs == batch * c_in * size * size * (c_out // groups) * kernel * kernel
    out_size = (size - 1) * stride + kernel  # 11
    assert report.flops.other_flops == batch * c_out * out_size * out_size  # bias


def test_conv2d_backward_hand_computed() -> None:
    batch, c_in, c_out, size, kernel, groups = 2, 4, 8, 6, 3, 2
    conv = nn.Conv2d(c_in, c_out, kernel, groups=groups)
    x = torch.randn(batch, c_in, size, size, requires_grad=True)
    report = count_model(conv, (x,), backward=True)
    outputs = batch * c_out * (size - kernel + 1) ** 2
    forward_macs = outputs * (c_in // groups) * kernel * kernel
    # input gradient and weight gradient each cost the forward MACs; the bias gradient sums grad_output
    assert report.flops.by_phase["backward"] == 2 * (2 * forward_macs) + outputs
    assert report.flops.macs == 3 * forward_macs


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    groups=st.integers(1, 3),
    per_group=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    size=st.integers(3, 12),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
)
def test_conv2d_matches_flop_counter_mode_for_any_geometry(
    batch: int, groups: int, per_group: tuple[int, int], size: int, kernel: int, stride: int, padding: int, dilation: int
) -> None:
    c_in, c_out = groups * per_group[0], groups * per_group[1]
    assume(size + 2 * padding >= dilation * (kernel - 1) + 1)  # at least one output position
    conv = build_on_meta(nn.Conv2d, in_channels=c_in, out_channels=c_out, kernel_size=kernel, stride=stride,
                         padding=padding, dilation=dilation, groups=groups)
    x = torch.empty(batch, c_in, size, size, device="meta")
    with FlopCounterMode(display=False) as reference:
        out = conv(x)
    report = count_model(conv, (x,))
    assert report.flops.matrix_flops == reference.get_total_flops()
    assert report.flops.other_flops == out.numel()  # bias


@pytest.mark.parametrize(
    ("fn", "shapes", "macs"),
    [
        (torch.bmm, [(3, 4, 5), (3, 5, 6)], 3 * 4 * 5 * 6),
        (torch.matmul, [(2, 3, 4, 5), (2, 3, 5, 6)], 2 * 3 * 4 * 5 * 6),
        (lambda a, b: a @ b, [(4, 5), (5, 6)], 4 * 5 * 6),
    ],
)
def test_batched_matmul_hand_computed(fn, shapes, macs) -> None:  # noqa: ANN001
    a, b = (torch.randn(shape) for shape in shapes)
    report = count_model(Apply(fn), (a, b))
    assert report.flops.macs == macs
    assert report.flops.matrix_flops == 2 * macs
    assert report.flops.other_flops == 0
    output = a.shape[:-1].numel() * b.shape[-1]
    assert report.traffic.unfused_bytes == (a.numel() + b.numel() + output) * F32


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("kv_heads", "causal"), [(4, False), (4, True), (2, True)])
def test_sdpa_hand_computed(device: str, kv_heads: int, causal: bool) -> None:
    batch, heads, q_len, k_len, e = 2, 4, 8, 6, 16
    q = torch.randn(batch, heads, q_len, e, device=device)
    k, v = (torch.randn(batch, kv_heads, k_len, e, device=device) for _ in range(2))
    attend = Apply(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))
    report = count_model(attend, (q, k, v))
    scores = batch * heads * q_len * k_len  # H = query heads, also for grouped-query attention
    assert report.flops.macs == scores * e + scores * e  # QK^T + PV; causal counted dense
    assert report.flops.other_flops == (SOFTMAX_FLOPS + int(causal)) * scores  # softmax (+1 for the mask)
    assert list(report.flops.by_operator) == ["aten._scaled_dot_product_flash_attention_for_cpu"]
    assert "dense" in report.flops.causal_mask_convention


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_sdpa_with_a_different_value_dim_hand_computed(device: str) -> None:
    batch, heads, q_len, k_len, e, ev = 2, 4, 8, 6, 16, 12  # E != Ev: CPU's fused kernel declines, the math path runs
    q, k = torch.randn(batch, heads, q_len, e, device=device), torch.randn(batch, heads, k_len, e, device=device)
    v = torch.randn(batch, heads, k_len, ev, device=device)
    report = count_model(Apply(F.scaled_dot_product_attention), (q, k, v))
    scores = batch * heads * q_len * k_len
    assert report.flops.macs == scores * e + scores * ev
    assert "aten.bmm" in report.flops.by_operator


def test_attention_block_hand_computed() -> None:
    batch, seq, d_model, heads = 2, 8, 32, 4

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.out = nn.Linear(d_model, d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(batch, seq, 3, heads, -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v)
            return self.out(attended.transpose(1, 2).reshape(batch, seq, d_model))

    report = count_model(Block(), (torch.randn(batch, seq, d_model),))
    tokens = batch * seq
    projections = tokens * d_model * 3 * d_model + tokens * d_model * d_model
    attention = batch * heads * seq * seq * (d_model // heads) * 2  # QK^T and PV
    assert report.flops.macs == projections + attention
    biases = tokens * 3 * d_model + tokens * d_model
    softmax = SOFTMAX_FLOPS * batch * heads * seq * seq
    assert report.flops.other_flops == biases + softmax


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_fast_path_hand_computed_and_equal_to_slow_path(need_weights: bool) -> None:
    batch, seq, embed, heads = 2, 8, 32, 4
    torch.manual_seed(0)
    block = model_zoo.mha_block(embed, heads, need_weights=need_weights).eval()
    x = torch.randn(batch, seq, embed)
    with torch.no_grad():
        fast = count_model(block, (x,))
    slow = count_model(block, (x,))  # grad enabled: nn.MultiheadAttention's unfused path
    assert "aten._native_multi_head_attention" in fast.flops.by_operator
    assert "aten._native_multi_head_attention" not in slow.flops.by_operator
    tokens = batch * seq
    projections = 3 * tokens * embed * embed + tokens * embed * embed  # in-projection (q, k, v) and out-projection
    attention = 2 * batch * seq * seq * embed  # QK^T + PV over all heads
    assert fast.flops.macs == projections + attention
    scores = batch * heads * seq * seq
    other = 4 * tokens * embed + SOFTMAX_FLOPS * scores  # biases (3 in + 1 out per token element), softmax
    if need_weights:
        other += tokens * embed + scores  # explicit query scaling, averaging the returned weights over heads
    assert fast.flops.other_flops == other
    assert slow.flops.matrix_flops == fast.flops.matrix_flops
    assert slow.flops.other_flops == fast.flops.other_flops


class MaskedSelfAttention(nn.Module):
    """nn.MultiheadAttention self-attention with an optional mask, to check the fast-path conditions on meta."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keyword = "key_padding_mask" if self.mask == "padding" else "attn_mask"
        return self.attn(x, x, x, **{keyword: mask})[0]


def mask_for(kind: str, device: str) -> torch.Tensor:
    """(batch 2, keys 8) padding of the last 2 keys, or an (8, 8) causal mask, boolean or as float -inf."""
    masked = torch.zeros(2, 8, dtype=torch.bool) if kind == "padding" else torch.ones(8, 8, dtype=torch.bool).triu(1)
    if kind == "padding":
        masked[:, -2:] = True
    if kind == "float causal":
        return torch.zeros(8, 8, device=device).masked_fill(masked.to(device), float("-inf"))
    return masked.to(device)


@pytest.mark.parametrize(("mask", "fused"), [("padding", True), ("causal", True), ("float causal", False)])
def test_multihead_attention_on_meta_takes_the_fast_path_when_cpu_does(mask: str, fused: bool) -> None:
    torch.manual_seed(0)
    cpu_model, meta_model = MaskedSelfAttention(mask).eval(), build_on_meta(MaskedSelfAttention, mask=mask).eval()
    with torch.no_grad():
        on_cpu = count_model(cpu_model, (torch.randn(2, 8, 32), mask_for(mask, "cpu")))
        on_meta = count_model(meta_model, (torch.randn(2, 8, 32, device="meta"), mask_for(mask, "meta")))
    assert ("aten._native_multi_head_attention" in on_meta.flops.by_operator) is fused  # a float mask: unfused
    assert counted(on_cpu) == counted(on_meta)


def test_multihead_attention_fast_path_bytes_hand_computed_on_meta() -> None:
    batch, seq, embed = 2, 8, 32
    block = build_on_meta(model_zoo.mha_block, embed=embed, need_weights=True).eval()
    with torch.no_grad():
        report = count_model(block, (torch.empty(batch, seq, embed, device="meta"),))
    assert list(report.flops.by_operator) == ["aten._native_multi_head_attention"]
    x, weights = batch * seq * embed, 3 * embed * embed + 3 * embed + embed * embed + embed  # in and out projections
    output, head_average = batch * seq * embed, batch * seq * seq  # the output and the head-averaged weights
    assert report.traffic.unfused_bytes == (x + weights + output + head_average) * F32 == 21_504
    assert report.traffic.activation_peak_bytes == (output + head_average) * F32


def encoder_layer(**options) -> nn.TransformerEncoderLayer:  # noqa: ANN003
    return nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True, **options)


ENCODER_FUSED = "aten._transformer_encoder_layer_fwd"


@pytest.mark.parametrize(
    ("options", "activation"), [({}, 1), ({"activation": "gelu"}, 5), ({"norm_first": True}, 1)]
)  # activation: FLOPs per hidden element, relu 1, gelu (erf form) 5
def test_transformer_encoder_layer_fused_path_hand_computed_and_equal_to_unfused_and_meta(
    options: dict, activation: int
) -> None:
    batch, seq, d, heads, ffn = 2, 8, 32, 4, 64
    torch.manual_seed(0)
    layer, meta_layer = encoder_layer(**options).eval(), build_on_meta(encoder_layer, **options).eval()
    x = torch.randn(batch, seq, d)
    with torch.no_grad():
        fused = count_model(layer, (x,))
        on_meta = count_model(meta_layer, (x.to("meta"),))
    unfused = count_model(layer, (x,))  # grad enabled: the unfused path
    assert ENCODER_FUSED in fused.flops.by_operator and ENCODER_FUSED in on_meta.flops.by_operator
    assert ENCODER_FUSED not in unfused.flops.by_operator
    assert fused.flops.uncounted_ops == on_meta.flops.uncounted_ops == unfused.flops.uncounted_ops == {}
    tokens = batch * seq
    macs = 3 * tokens * d * d + tokens * d * d + 2 * batch * heads * seq * seq * (d // heads) + 2 * tokens * d * ffn
    assert fused.flops.matrix_flops == 2 * macs == 278_528
    biases = tokens * (3 * d + d + ffn + d)  # in-projection, out-projection, the two feed-forward linears
    softmax = SOFTMAX_FLOPS * batch * heads * seq * seq
    norms, residuals = 2 * (5 + 2) * tokens * d, 2 * tokens * d  # layer norm: 5 per element + weight + bias
    assert fused.flops.other_flops == biases + softmax + activation * tokens * ffn + norms + residuals
    for other in (unfused, on_meta):
        assert (other.flops.matrix_flops, other.flops.other_flops) == (fused.flops.matrix_flops, fused.flops.other_flops)
    assert counted(fused) == counted(on_meta)  # bytes and activation peaks too: meta runs the fused op


def test_transformer_encoder_layer_fused_path_bytes_hand_computed_on_meta() -> None:
    d, ffn = 32, 64
    layer = build_on_meta(encoder_layer).eval()
    with torch.no_grad():
        report = count_model(layer, (torch.empty(2, 8, d, device="meta"),))
    assert list(report.flops.by_operator) == [ENCODER_FUSED]
    attention = 3 * d * d + 3 * d + d * d + d  # in- and out-projection weights and biases
    weights = attention + 2 * 2 * d + (ffn * d + ffn) + (d * ffn + d)  # two layer norms, two feed-forward linears
    x = output = 2 * 8 * d
    assert report.traffic.unfused_bytes == (x + weights + output) * F32 == 38_272
    assert report.traffic.activation_peak_bytes == output * F32


class MaskedEncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer with a padding or attention mask, to check the fast-path reroute on meta."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.keyword = "src_key_padding_mask" if mask == "padding" else "src_mask"
        self.layer = encoder_layer()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.layer(x, **{self.keyword: mask})


@pytest.mark.parametrize("mask", ["padding", "causal", "float causal"])
def test_transformer_encoder_layer_with_a_mask_counts_the_same_on_cpu_and_meta(mask: str) -> None:
    torch.manual_seed(0)
    cpu_model, meta_model = MaskedEncoderLayer(mask).eval(), build_on_meta(MaskedEncoderLayer, mask=mask).eval()
    with torch.no_grad():
        on_cpu = count_model(cpu_model, (torch.randn(2, 8, 32), mask_for(mask, "cpu")))
        on_meta = count_model(meta_model, (torch.randn(2, 8, 32, device="meta"), mask_for(mask, "meta")))
    assert ENCODER_FUSED in on_meta.flops.by_operator  # unlike nn.MultiheadAttention's, a float mask is fused too
    assert counted(on_cpu) == counted(on_meta)


def hooked_encoder_layer() -> nn.TransformerEncoderLayer:
    layer = encoder_layer()
    layer.linear1.register_forward_hook(lambda *_: None)  # any hook in the layer rules its fast path out
    return layer


@pytest.mark.parametrize(
    ("factory", "fused"),
    [
        (lambda: nn.TransformerEncoder(encoder_layer(), num_layers=2, enable_nested_tensor=False), True),
        (lambda: encoder_layer(activation=nn.SiLU()), False),  # only relu and gelu have a fast path
        (hooked_encoder_layer, False),
    ],
    ids=["encoder stack", "silu", "hooked"],
)
def test_transformer_encoder_layer_on_meta_takes_the_fast_path_when_cpu_does(factory, fused: bool) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    cpu_model, meta_model = factory().eval(), build_on_meta(factory).eval()
    with torch.no_grad():
        on_cpu = count_model(cpu_model, (torch.randn(2, 8, 32),))
        on_meta = count_model(meta_model, (torch.randn(2, 8, 32, device="meta"),))
    assert (ENCODER_FUSED in on_cpu.flops.by_operator) is (ENCODER_FUSED in on_meta.flops.by_operator) is fused
    assert counted(on_cpu) == counted(on_meta)


def test_unfused_multihead_attention_without_weights_on_meta_adds_the_math_paths_scaling() -> None:
    """Pins the stated exception (TRAFFIC_ASSUMPTIONS): with grad, meta cannot reroute the SDPA call nested in
    F.multi_head_attention_forward, so it runs the math path, which scales query and key elementwise."""
    tokens, d = 2 * 8, 32
    torch.manual_seed(0)
    on_cpu = count_model(encoder_layer().eval(), (torch.randn(2, 8, d),))
    on_meta = count_model(build_on_meta(encoder_layer).eval(), (torch.randn(2, 8, d, device="meta"),))
    assert on_meta.flops.matrix_flops == on_cpu.flops.matrix_flops
    assert on_meta.flops.other_flops == on_cpu.flops.other_flops + 2 * tokens * d  # query and key, 1 per element
    assert on_meta.traffic.unfused_bytes > on_cpu.traffic.unfused_bytes


def test_sdpa_math_path_and_default_path_have_equal_matrix_flops() -> None:
    torch.manual_seed(0)
    model = model_zoo.tiny_transformer().eval()
    tokens = model.example_inputs(batch=2, seq_len=16)
    with torch.no_grad():
        fused = count_model(model, tokens)
        with sdpa_kernel(SDPBackend.MATH):
            math_path = count_model(model, tokens)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in fused.flops.by_operator
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in math_path.flops.by_operator
    assert "aten.bmm" in math_path.flops.by_operator
    assert math_path.flops.matrix_flops == fused.flops.matrix_flops
    assert math_path.flops.macs == fused.flops.macs


# -- agreement with torch's FlopCounterMode on meta --------------------------------------------------------------------

MODELS = {
    "cnn": model_zoo.tiny_cnn,
    "mlp": mlp,
    "transformer": model_zoo.tiny_transformer,
    "llama": model_zoo.llama,
    "mha": model_zoo.mha_block,
}


def inputs_for(model: nn.Module, device: str) -> tuple[torch.Tensor, ...]:
    if hasattr(model, "example_inputs"):
        return model.example_inputs()
    return (torch.randn(4, 16, device=device),)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backward", [False, True])
def test_matrix_flops_equal_flop_counter_mode_on_meta(name: str, backward: bool) -> None:
    model = build_on_meta(MODELS[name])
    args = inputs_for(model, "meta")
    with FlopCounterMode(display=False) as reference:
        output = model(*args)
        if backward:
            output.sum().backward()
    report = count_model(model, args, backward=backward)
    assert report.flops.matrix_flops == reference.get_total_flops() > 0


# -- same counts on CPU and meta, with and without grad ----------------------------------------------------------------


def counted(report: CountReport) -> tuple[FlopsResult, TrafficResult]:
    return attrs.evolve(report.flops, counted_on="-"), report.traffic


@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer", "llama", "mha"])
@pytest.mark.parametrize("grad", [False, True])
def test_cpu_and_meta_counts_are_identical(name: str, grad: bool) -> None:
    torch.manual_seed(0)
    cpu_model = MODELS[name]().eval()
    meta_model = build_on_meta(MODELS[name]).eval()
    with torch.set_grad_enabled(grad):
        on_cpu = count_model(cpu_model, inputs_for(cpu_model, "cpu"))
        on_meta = count_model(meta_model, inputs_for(meta_model, "meta"))
    assert on_cpu.flops.counted_on == "cpu" and on_meta.flops.counted_on == "meta"
    assert counted(on_cpu) == counted(on_meta)  # FLOPs, bytes, activation peaks, every record


def test_cpu_and_meta_agree_with_a_boolean_attention_mask() -> None:
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    attend = Apply(lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m))
    on_cpu = count_model(attend, (torch.randn(1, 2, 8, 16), mask))
    on_meta = count_model(attend, (torch.randn(1, 2, 8, 16, device="meta"), mask.to("meta")))
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in on_meta.flops.by_operator
    assert counted(on_cpu) == counted(on_meta)


@pytest.mark.parametrize("name", ["transformer", "llama", "cnn"])
def test_grad_mode_changes_no_flops_but_keeps_saved_activations_alive(name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    args = inputs_for(model, "cpu")
    with torch.no_grad():
        inference = count_model(model, args)
    training = count_model(model, args)
    assert training.flops == inference.flops
    assert training.traffic.unfused_bytes == inference.traffic.unfused_bytes
    assert training.traffic.activation_peak_bytes > inference.traffic.activation_peak_bytes


# -- per-module breakdown: exclusive sums equal totals (the seed's 4.7x error) -----------------------------------------


def test_module_exclusive_sums_equal_total_unlike_the_seeds_nested_sum() -> None:
    model = model_zoo.tiny_cnn()
    args = model.example_inputs(batch=2)
    report = count_model(model, args, top_k=None)
    modules = report.flops.by_module
    exclusive_flops = sum(m.exclusive_matrix_flops + m.exclusive_other_flops for m in modules.values())
    assert exclusive_flops == report.flops.total_flops
    exclusive_bytes = sum(m.exclusive_bytes_read + m.exclusive_bytes_written for m in modules.values())
    assert exclusive_bytes == report.traffic.unfused_bytes
    assert modules[ROOT_MODULE].inclusive_flops == report.flops.total_flops
    features = [m for path, m in modules.items() if path.startswith("features.")]
    assert modules["features"].inclusive_flops == sum(m.inclusive_flops for m in features)
    # The seed summed FlopCounterMode's nested per-module counts: every op once per enclosing module.
    with FlopCounterMode(display=False) as reference:
        model(*args)
    seed_sum = sum(sum(per_op.values()) for per_op in reference.get_flop_counts().values())
    assert seed_sum >= 3 * reference.get_total_flops()
    matrix_exclusive = sum(m.exclusive_matrix_flops for m in modules.values())
    assert matrix_exclusive == reference.get_total_flops()


def test_shared_module_is_attributed_per_caller_and_counted_per_call() -> None:
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8, bias=False)
            self.a, self.b = Wrapper(self.lin), Wrapper(self.lin)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(self.lin(self.b(self.a(x))))

    report = count_model(Shared(), (torch.randn(2, 8),), top_k=None)
    one_call = 2 * 2 * 8 * 8  # FLOPs of one (2x8) @ (8x8)
    modules = report.flops.by_module
    assert modules["lin"].calls == 2 and modules["lin"].exclusive_matrix_flops == 2 * one_call
    assert modules["a.inner"].calls == 1 and modules["a.inner"].exclusive_matrix_flops == one_call
    assert modules["b"].inclusive_flops == one_call
    assert sum(m.exclusive_matrix_flops for m in modules.values()) == report.flops.matrix_flops == 4 * one_call
    assert report.traffic.weight_bytes == 8 * 8 * F32  # the shared weight once


def test_top_k_folds_the_rest_into_others_keeping_sums_exact() -> None:
    report = count_model(model_zoo.llama(), model_zoo.llama().example_inputs(), top_k=3)
    flops = report.flops
    assert len(flops.by_operator) == 4 and OTHERS in flops.by_operator
    assert sum(s.matrix_flops + s.other_flops for s in flops.by_operator.values()) == flops.total_flops
    assert sum(s.bytes_read + s.bytes_written for s in flops.by_operator.values()) == report.traffic.unfused_bytes
    assert len(flops.by_module) == 4 and OTHERS in flops.by_module
    module_flops = sum(m.exclusive_matrix_flops + m.exclusive_other_flops for m in flops.by_module.values())
    assert module_flops == flops.total_flops


def test_fold_largest_keeps_order_breaks_ties_by_position_and_merges_the_rest() -> None:
    entries = {"a": 1, "b": 5, "c": 3, "d": 5}
    assert fold_largest(entries, 2, key=lambda v: v, merge=sum) == {"b": 5, "d": 5, OTHERS: 1 + 3}
    assert list(fold_largest(entries, 3, key=lambda v: v, merge=sum)) == ["b", "c", "d", OTHERS]
    assert fold_largest(entries, 1, key=lambda v: v, merge=sum, others_name="rest") == {"b": 5, "rest": 1 + 3 + 5}
    assert fold_largest(entries, None, key=lambda v: v, merge=sum) == fold_largest(entries, 4, key=abs, merge=sum)
    assert fold_largest(entries, 4, key=abs, merge=sum) == entries


def test_op_records_merge_identical_layers_and_add_up_to_the_totals() -> None:
    model = model_zoo.llama()  # 2 layers
    report = count_model(model, model.example_inputs(batch=1, seq_len=8))
    records = report.traffic.op_records
    assert sum(r.count * r.flops for r in records) == report.flops.total_flops
    assert sum(r.count * r.macs for r in records) == report.flops.macs
    assert sum(r.count * (r.bytes_read + r.bytes_written) for r in records) == report.traffic.unfused_bytes
    q_proj = [r for r in records if r.module == "layers.*.attn.q_proj"]
    assert len(q_proj) == 1 and q_proj[0].count == 2 and q_proj[0].op == "aten.mm"
    d = model.config.d_model
    assert q_proj[0].macs == 8 * d * d and q_proj[0].bytes_read == (8 * d + d * d) * F32


def test_the_call_sequence_lists_every_call_in_order_with_its_full_module_path() -> None:
    model = mlp()
    with torch.no_grad():  # with grad, autograd also detaches relu's output to save it: one more view
        report = count_model(model, (torch.randn(4, 16),), sequence=True)
    assert [(call.op, call.module) for call in report.calls] == [
        ("aten.t", "0"), ("aten.addmm", "0"), ("aten.relu", "1"), ("aten.t", "2"), ("aten.addmm", "2")]
    transpose, first = report.calls[:2]
    assert transpose.inputs == "float32[32,16]" and (transpose.flops, transpose.bytes_read, transpose.bytes_written) == (
        0, 0, 0)  # a view moves nothing
    assert first.count == 1 and first.inputs == "float32[32], float32[4,16], float32[16,32]"
    assert first.macs == 4 * 16 * 32 and first.flops == 2 * 4 * 16 * 32 + 4 * 32  # + the bias adds
    assert first.bytes_read == (32 + 4 * 16 + 16 * 32) * F32 and first.bytes_written == 4 * 32 * F32
    assert sum(call.flops for call in report.calls) == report.flops.total_flops
    assert count_model(model, (torch.randn(4, 16),)).calls == ()  # only when asked for


def test_the_call_sequence_traces_every_layer_of_a_stack_on_meta() -> None:
    model = build_on_meta(model_zoo.llama, n_layers=4)
    inputs = model.example_inputs(batch=1, seq_len=8)
    with torch.no_grad():
        replayed = count_model(model, inputs)
        report = count_model(model, inputs, sequence=True)
    assert replayed.flops.replayed  # without a sequence, layers 2 and 3 are replayed from the first two
    assert report.flops.replayed == ()
    assert {f"layers.{index}.attn.q_proj" for index in range(4)} <= {call.module for call in report.calls}
    assert sum(call.flops for call in report.calls) == replayed.flops.total_flops


# -- activation memory -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("inplace", [False, True])
def test_activation_peak_hand_computed(device: str, inplace: bool) -> None:
    batch = 4
    with torch.device(device):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=inplace), nn.Linear(32, 8))
        x = torch.randn(batch, 16)
    with torch.no_grad():
        report = count_model(model, (x,))
    hidden, out = batch * 32 * F32, batch * 8 * F32
    # ReLU's output is born while the first Linear's output is still referenced; in place, there is no new storage.
    # The second Linear's output then joins the surviving hidden tensor.
    expected = max(hidden + hidden, hidden + out) if not inplace else hidden + out
    assert report.traffic.activation_peak_bytes == expected
    assert report.traffic.activation_peak_bytes_fp16 == expected // 2  # float32 -> 2 bytes per element


def test_fused_bytes_count_tied_weights_once_and_slices_at_their_extent() -> None:
    vocab, d_model, n_heads, n_layers, ffn, max_seq, seq = 64, 16, 2, 1, 32, 32, 8
    model = model_zoo.tiny_transformer(vocab, d_model, n_heads, n_layers, ffn, max_seq)
    assert model.head.weight is model.embed.weight
    report = count_model(model, model.example_inputs(batch=1, seq_len=seq))
    block = 2 * d_model + (3 * d_model * d_model + 3 * d_model) + (d_model * d_model + d_model) + 2 * d_model
    block += d_model * ffn + ffn + ffn * d_model + d_model
    # tied embedding/head once; only the first `seq` rows of the position table are read; final norm
    weights = vocab * d_model + seq * d_model + n_layers * block + 2 * d_model
    assert report.traffic.weight_bytes == weights * F32
    assert report.traffic.input_bytes == seq * 8  # int64 token ids
    assert report.traffic.output_bytes == seq * vocab * F32
    traffic = report.traffic
    assert traffic.fused_bytes == traffic.weight_bytes + traffic.input_bytes + traffic.output_bytes


@pytest.mark.parametrize(
    ("model", "shapes", "fused_elements"),
    [
        (nn.Identity(), [(4,)], 4),  # the output is the input: 16 bytes, not 32
        (Apply(lambda x, y: (x + 1, y)), [(4,), (6,)], 4 + 6 + 4),  # x, y; x + 1; y returned is not counted again
        (Apply(lambda x: x.t()), [(2, 3)], 2 * 3),  # a view of the input is the input's storage
    ],
)
def test_fused_bytes_count_an_output_aliasing_an_input_once(
    model: nn.Module, shapes: list[tuple[int, ...]], fused_elements: int
) -> None:
    traffic = count_model(model, tuple(torch.randn(shape) for shape in shapes)).traffic
    assert traffic.fused_bytes == fused_elements * F32
    assert traffic.fused_bytes == traffic.weight_bytes + traffic.input_bytes + traffic.output_bytes


def test_embedding_reads_only_the_gathered_rows() -> None:
    vocab, dim, tokens = 1000, 8, 3
    report = count_model(nn.Embedding(vocab, dim), (torch.tensor([[1, 2, 3]]),))
    assert report.flops.total_flops == 0 and report.flops.uncounted_ops == {}
    assert report.traffic.unfused_weight_read_bytes == tokens * dim * F32
    assert report.traffic.unfused_activation_read_bytes == tokens * 8  # int64 indices


# -- backward ----------------------------------------------------------------------------------------------------------


def test_backward_hand_computed_and_leaves_grad_fields_alone() -> None:
    batch, d_in, d_out = 4, 16, 32
    layer = nn.Linear(d_in, d_out)
    report = count_model(layer, (torch.randn(batch, d_in),), backward=True)
    macs = batch * d_in * d_out
    # forward: addmm; backward: weight gradient (same MACs as forward), bias gradient = sum over the batch;
    # no input gradient (the input does not require grad)
    assert report.flops.by_phase == {"forward": 2 * macs + batch * d_out, "backward": 2 * macs + batch * d_out}
    assert report.flops.macs == 2 * macs
    assert report.flops.backward is True
    assert report.traffic.gradient_bytes == (d_in * d_out + d_out) * F32
    assert layer.weight.grad is None and layer.bias.grad is None


def test_backward_with_nothing_to_differentiate_raises() -> None:
    layer = nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(CountingError, match="nothing to differentiate"):
        count_model(layer, (torch.randn(2, 4),), backward=True)


# -- never a silent zero; meta's data-dependent ops --------------------------------------------------------------------


def test_ops_without_formula_are_listed_with_call_counts() -> None:
    report = count_model(Apply(lambda x: torch.sort(x).values + torch.topk(x, 2).values.sum()), (torch.randn(3, 5),))
    assert report.flops.uncounted_ops == {"aten.sort": 1, "aten.topk": 1}
    assert "uncounted_ops" in report.flops.other_flops_convention


@pytest.mark.parametrize(
    ("fn", "op"),
    [
        (lambda x: x.nonzero(), "aten.nonzero"),
        (lambda x: x * x.sum().item(), "aten._local_scalar_dense"),
        (lambda x: x[x > 0], "aten.index"),
    ],
)
def test_data_dependent_op_on_meta_raises_a_clear_error(fn, op: str) -> None:  # noqa: ANN001
    with pytest.raises(CountingError, match="real device") as error:
        count_model(Apply(fn), (torch.randn(4, device="meta"),))
    assert op in str(error.value)
    assert isinstance(error.value, RuntimeError)
    assert op in count_model(Apply(fn), (torch.randn(4),)).flops.by_operator  # the same model counts on CPU


def test_ops_with_data_dependent_output_sizes_are_priced_per_call() -> None:
    x = torch.randn(8)
    first, second = torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.bool)
    first[:3], second[:5] = True, True
    report = count_model(Apply(lambda x, a, b: x[a].sum() + x[b].sum()), (x, first, second))

    def selected_and_summed(kept: int) -> int:
        index = kept * F32 + 8 + kept * F32  # a gather reads only what it returns, plus the 8-byte mask; writes them
        return index + kept * F32 + F32  # sum: reads them, writes one float

    add = 2 * F32 + F32
    assert report.traffic.unfused_bytes == selected_and_summed(3) + selected_and_summed(5) + add == 132
    assert report.flops.by_operator["aten.index"].bytes_written == (3 + 5) * F32


# -- results are TOML-ready --------------------------------------------------------------------------------------------


def test_results_round_trip_through_toml() -> None:
    import tomllib

    model = model_zoo.llama()
    report = count_model(model, model.example_inputs(), backward=True)
    for result in (report.flops, report.traffic):
        data = converter.unstructure(result)
        assert converter.structure(tomllib.loads(tomli_w.dumps(data)), type(result)) == result


# -- what was counted: inputs, batch size, and why not on meta -----------------------------------------------------


def test_counted_inputs_name_each_tensor_positional_then_keyword() -> None:
    class Masked(nn.Module):
        def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> torch.Tensor:
            return x * mask

    report = count_model(Masked(), (torch.randn(2, 8),), {"mask": torch.ones(2, 8, dtype=torch.bool)})
    assert report.flops.counted_inputs == ("float32[2,8]", "mask=bool[2,8]")


@pytest.mark.parametrize(
    ("inputs", "factory", "batch_size", "expected"),
    [
        ((InputSpec((4, 128), "int64"),), None, None, 4),  # as the spec writes it
        ((InputSpec((4, 128), "int64"),), None, 1, 1),  # the option overrides it
        ((InputSpec((16,), batch_dim=None), InputSpec((128, 3), batch_dim=1)), None, None, 3),  # first with a batch dim
        ((InputSpec((16,), batch_dim=None),), None, 8, None),  # nothing to scale: batch_size has no effect
        ((), "pkg:make_inputs", None, 1),  # an input_factory is asked for batch 1
        ((), "pkg:make_inputs", 8, 8),
    ],
)
def test_batch_size_of_the_made_inputs(inputs: tuple[InputSpec, ...], factory: str | None, batch_size: int | None,
                            expected: int | None) -> None:
    model = ModelSpec("m", "pkg:build", inputs=inputs, input_factory=factory)
    assert model.batch_size(batch_size) == expected


class ScaleByMean(nn.Module):
    """A projection scaled by its input's mean read as a Python number (.item()): data-dependent, so meta cannot run
    it."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * x.mean().item()


def count_flops_record(count_on: str, batch_size: int | None = None) -> StageRecord:
    """The count_flops stage of a spec run on ScaleByMean, counting on ``count_on``."""
    options = {"count_on": count_on} | ({"batch_size": batch_size} if batch_size else {})
    spec = spec_from_dict({
        "models": [{"name": "m", "source": "tests.test_torch_counter:ScaleByMean", "inputs": [{"shape": [2, 8]}]}],
        "stages": ["count_flops"],
        "options": {"count_flops": options},
    })
    return run_spec(spec, output=None).model("m").stages["count_flops"]


def test_a_model_meta_cannot_run_is_counted_on_cpu_and_says_why() -> None:
    flops = count_flops_record("auto", batch_size=3).result
    batch, width = 3, 8
    assert flops.macs == batch * width * width
    assert flops.other_flops == batch * width + batch * width  # the mean (1 per input element), the scaling
    assert flops.counted_on == "cpu"
    assert flops.fallback_reason.startswith("could not count on meta: CountingError: cannot count aten._local_scalar")
    assert flops.fallback_reason.endswith("; counted on cpu")
    assert flops.counted_inputs == ("float32[3,8]",) and flops.counted_batch_size == batch


def test_a_model_meta_cannot_run_fails_clearly_when_meta_is_required() -> None:
    record = count_flops_record("meta")
    assert record.status == "failed"
    assert record.error.startswith("CountingError: cannot count aten._local_scalar_dense")
    assert "real device" in record.error


def test_a_model_counted_on_meta_records_no_fallback() -> None:
    spec = spec_from_dict({
        "models": [{"name": "m", "source": "torch.nn:Linear", "kwargs": {"in_features": 8, "out_features": 4},
                    "inputs": [{"shape": [2, 8]}]}],
        "stages": ["count_flops"],
    })
    flops = run_spec(spec, output=None).model("m").result("count_flops")
    assert flops.counted_on == "meta" and flops.fallback_reason is None
    assert flops.macs == 2 * 8 * 4 and flops.counted_batch_size == 2 and flops.counted_inputs == ("float32[2,8]",)


# -- parameters --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "size"), [("fp32", 4), ("tf32", 4), ("fp16", 2), ("bf16", 2), ("fp8", 1), ("int8", 1)]
)
def test_count_parameters_hand_computed(precision: str, size: int) -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20), nn.Linear(20, 5, bias=False))
    model[2].requires_grad_(False)
    result = count_parameters(model, precision)
    trainable = 10 * 20 + 20 + 2 * 20  # first Linear, batch-norm weight and bias
    frozen = 20 * 5
    float_buffers, int64_buffers = 2 * 20, 1  # running mean/var; num_batches_tracked
    assert (result.total, result.trainable, result.non_trainable) == (trainable + frozen, trainable, frozen)
    assert result.buffers == float_buffers + int64_buffers
    assert result.bytes_at_precision == (trainable + frozen + float_buffers) * size + int64_buffers * 8
    assert result.precision == precision


def test_count_parameters_counts_tied_weights_once_and_rejects_unknown_precisions() -> None:
    vocab, d_model, n_heads, n_layers, ffn, max_seq = 64, 16, 2, 1, 32, 32
    model = model_zoo.tiny_transformer(vocab, d_model, n_heads, n_layers, ffn, max_seq)
    block = 2 * d_model + (3 * d_model * d_model + 3 * d_model) + (d_model * d_model + d_model) + 2 * d_model
    block += d_model * ffn + ffn + ffn * d_model + d_model
    expected = vocab * d_model + max_seq * d_model + n_layers * block + 2 * d_model  # the head reuses the embedding
    assert count_parameters(model, "fp32").total == expected
    model.head.weight = nn.Parameter(model.embed.weight.detach())  # another Parameter over the same storage
    assert count_parameters(model, "fp32").total == expected
    with pytest.raises(UnknownPrecisionError, match="unknown precision"):
        count_parameters(model, "fp64")


# -- fp8 and int8: counted on meta with a 2-byte stand-in, priced at 1 byte per floating element -------------------


def low_precision_run(precision: str, model: dict, **options: object):  # noqa: ANN201
    spec = spec_from_dict({
        "models": [model], "precision": precision, "gpus": ["H100-SXM"],
        "stages": ["count_params", "count_flops", "estimate_traffic", "roofline"],
        "options": {"count_flops": options} if options else {},
    })
    return run_spec(spec, output=None).model(model["name"])


LINEAR = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 8},
          "inputs": [{"shape": [4, 16], "dtype": "float32"}]}


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_fp8_and_int8_bytes_hand_computed(precision: str) -> None:
    run = low_precision_run(precision, LINEAR)
    for stage in ("count_params", "count_flops", "estimate_traffic", "roofline"):
        assert run.stages[stage].status == "ok", run.stages[stage].error
    weights, inputs, outputs = 16 * 8 + 8, 4 * 16, 4 * 8  # elements, each 1 byte at fp8/int8
    assert run.result("count_params").bytes_at_precision == weights
    flops = run.result("count_flops")
    assert flops.counted_on == "meta" and flops.macs == 4 * 16 * 8 and flops.other_flops == 4 * 8  # as at fp32
    assert flops.counted_inputs == ("bfloat16[4,16]",)  # the stand-in the pass ran at
    traffic = run.result("estimate_traffic")
    assert traffic.unfused_bytes == traffic.fused_bytes == weights + inputs + outputs
    assert (traffic.weight_bytes, traffic.input_bytes, traffic.output_bytes) == (weights, inputs, outputs)
    assert traffic.activation_peak_bytes == outputs and traffic.activation_peak_bytes_fp16 == 2 * outputs
    assert any("bfloat16 tensors are counted at 1 byte(s) per element" in line for line in traffic.assumptions)
    bound = run.result("roofline").gpus["H100-SXM"][precision]  # the GPU's fp8 / int8 peak, not a wider one
    assert bound.memory_ms_fused == pytest.approx((weights + inputs + outputs) / (bound.bandwidth_gb_s * 1e9) * 1e3)
    assert bound.compute_ms == pytest.approx(flops.total_flops / (bound.peak_tflops * 1e12) * 1e3)


def test_fp8_integer_tensors_keep_their_own_size() -> None:
    table = {"name": "emb", "source": "torch.nn:Embedding", "kwargs": {"num_embeddings": 100, "embedding_dim": 8},
             "inputs": [{"shape": [1, 4], "dtype": "int64", "high": 100}]}
    traffic = low_precision_run("fp8", table).result("estimate_traffic")
    rows, indices = 4 * 8, 4 * 8  # 4 gathered rows of 8 one-byte elements; 4 int64 indices at 8 bytes
    assert traffic.unfused_bytes == rows + indices + rows  # reads the rows and the indices, writes the rows
    assert (traffic.weight_bytes, traffic.input_bytes, traffic.output_bytes) == (rows, indices, rows)


def test_fp8_is_counted_on_meta_only() -> None:
    with pytest.raises(SpecError, match=r"backend 'cpu' cannot execute 'fp8' .* which stage 'count_flops' needs"):
        low_precision_run("fp8", LINEAR, count_on="device")
