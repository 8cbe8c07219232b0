"""The built-in FLOP formulas: what one call of each aten operator costs, each registered where it is defined.

Only what reaches dispatch needs one: nn.Linear and torch.matmul/@ decompose before dispatch into views + mm/addmm/bmm,
einsum into bmm, F.scaled_dot_product_attention into one fused kernel or the math path's bmm + softmax. Per-element
costs of non-matrix work come from the table shared with the JAX counter (:mod:`rpx_core.cost_table`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from torch._ops import OpOverloadPacket

from rpx_core.plugin import cost_table
from rpx_plugins.torch.counter.registry import Formula, OpCall, aten, formula, present

SOFTMAX_FLOPS = cost_table.SOFTMAX
SOFTMAX_BACKWARD_FLOPS = cost_table.SOFTMAX_BACKWARD

#: How the backward of a fused attention kernel is counted (CountOptions.attention_backward).
ATTENTION_BACKWARD_CONVENTIONS = ("without_recompute", "with_recompute")
#: Per score, what recomputing the probabilities from the saved log-sum-exp costs: scale, subtract, exp.
RECOMPUTED_PROBABILITY_FLOPS = 3

CAUSAL_MASK_CONVENTION = (
    "dense: attention counts the full Lq x Lk score matrix even with is_causal=True or a mask, as torch's "
    "FlopCounterMode does (a kernel that skips masked blocks does about half the attention FLOPs for a causal mask). "
    "Every attention kernel (flash, efficient, cuDNN, CPU flash, math path, the fused paths of nn.MultiheadAttention "
    "and nn.TransformerEncoderLayer) uses "
    "QK^T = B*H*Lq*Lk*E MACs and PV = B*H*Lq*Lk*Ev MACs with H the query heads (grouped-query attention included); "
    f"softmax adds {SOFTMAX_FLOPS} other FLOPs per score (+1 with a mask or is_causal); a fused kernel's backward is "
    f"2x the forward MACs (dQ, dK, dV, dP) plus {SOFTMAX_BACKWARD_FLOPS} other FLOPs per score, the work of the math "
    "path's backward (attention_backward = \"without_recompute\", the default); with \"with_recompute\" it adds "
    f"recomputing the scores as flash and efficient kernels do (QK^T again, B*H*Lq*Lk*E MACs, and "
    f"{RECOMPUTED_PROBABILITY_FLOPS} other FLOPs per score for the probabilities from the saved log-sum-exp), "
    "the convention of torch's FlopCounterMode for fused kernels; the math path's backward never recomputes"
)


# -- matrix work -------------------------------------------------------------------------------------------------------


def matmul(operand: str, bias: str | None = None) -> Formula:
    """MACs = output elements x inner dimension (the last dim of ``operand``); a bias adds 1 FLOP per output element."""

    def matmul_formula(call: OpCall) -> tuple[int, int]:
        out = call.out_numel()
        has_bias = bias is not None and call.args.get(bias) is not None
        return out * call.args[operand].shape[-1], out if has_bias else 0

    return matmul_formula


formula(aten.mm, aten.bmm, aten.mv, aten.dot, aten.vdot, aten._int_mm)(matmul("self"))
formula(aten.baddbmm)(matmul("batch1", bias="self"))
formula(aten.addmv)(matmul("mat", bias="self"))
formula(aten._scaled_mm)(matmul("self", bias="bias"))
addmm = formula(aten.addmm)(matmul("mat1", bias="self"))


@formula(aten._addmm_activation)
def addmm_activation(call: OpCall) -> tuple[int, int]:
    """addmm fused with an activation (cuBLASLt epilogue): bias add + GELU (tanh form, 9) or ReLU (1) per output."""
    macs, bias = addmm(call)
    activation = cost_table.GELU_TANH if call.args["use_gelu"] else cost_table.PER_OUTPUT_ELEMENT["relu"]
    return macs, bias + activation * call.out_numel()


def convolution(transposed: bool | None) -> Formula:
    """MACs = output elements x (C_in / groups) x kernel volume; transposed: input elements x (C_out / groups) x kernel.

    ``transposed`` None reads the op's ``transposed`` argument. Stride, padding and dilation act through the output
    shape; padded zeros are multiplied like any input (the dense convention of every counter). A bias adds 1 FLOP per
    output element.
    """

    def convolution_formula(call: OpCall) -> tuple[int, int]:
        source, weight = list(call.args.values())[:2]
        is_transposed = call.args["transposed"] if transposed is None else transposed
        macs = (source.numel() if is_transposed else call.out_numel()) * math.prod(weight.shape[1:])
        return macs, call.out_numel() if call.args.get("bias") is not None else 0

    return convolution_formula


formula(aten.convolution, aten._convolution, aten.convolution_overrideable)(convolution(None))
formula(
    aten.cudnn_convolution, aten.mkldnn_convolution, aten._slow_conv2d_forward, aten.slow_conv3d_forward,
    aten._conv_depthwise2d, aten.conv_depthwise3d, aten.thnn_conv2d,
)(convolution(False))
formula(aten.cudnn_convolution_transpose, aten.slow_conv_transpose2d, aten.slow_conv_transpose3d)(convolution(True))


@formula(aten.convolution_backward)
def convolution_backward(call: OpCall) -> tuple[int, int]:
    """Input gradient and weight gradient each cost the forward MACs; the bias gradient sums grad_output (1/element)."""
    grad_out, source, weight = call.args["grad_output"], call.args["input"], call.args["weight"]
    per_point = math.prod(weight.shape[1:])
    forward_macs = (source.numel() if call.args["transposed"] else grad_out.numel()) * per_point
    want_input, want_weight, want_bias = call.args["output_mask"]
    return forward_macs * (int(want_input) + int(want_weight)), grad_out.numel() if want_bias else 0


# -- attention ---------------------------------------------------------------------------------------------------------


class AttentionSizes(NamedTuple):
    batch_heads: int  # batch x query heads
    query_len: int  # Lq
    key_len: int  # Lk
    qk_dim: int  # E
    value_dim: int  # Ev


def heads_before_length(call: OpCall) -> AttentionSizes:
    """Sizes for kernels taking (B, H, L, E) tensors, the layout of the SDPA-level kernels."""
    query, key, value = call.args["query"], call.args["key"], call.args["value"]
    batch_heads = math.prod(query.shape[:-2])
    return AttentionSizes(batch_heads, query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1])


def length_before_heads(call: OpCall) -> AttentionSizes | None:
    """Sizes for the low-level flash/efficient kernels taking (B, L, H, E); None for variable-length packed batches."""
    if any(call.args.get(name) is not None for name in ("cum_seq_q", "cu_seqlens_q")):
        return None
    query, key, value = call.args["query"], call.args["key"], call.args["value"]
    batch_heads = query.shape[0] * query.shape[2]
    return AttentionSizes(batch_heads, query.shape[1], key.shape[1], query.shape[3], value.shape[3])


def attention(sizes_of: Callable[[OpCall], AttentionSizes | None], *, backward: bool = False,
              recompute: bool = False) -> Formula:
    """Every attention kernel's formula (see CAUSAL_MASK_CONVENTION)."""

    def attention_formula(call: OpCall) -> tuple[int, int] | None:
        sizes = sizes_of(call)
        if sizes is None:
            return None
        scores = sizes.batch_heads * sizes.query_len * sizes.key_len
        macs = scores * (sizes.qk_dim + sizes.value_dim)
        if backward:
            if recompute:
                return 2 * macs + scores * sizes.qk_dim, (SOFTMAX_BACKWARD_FLOPS + RECOMPUTED_PROBABILITY_FLOPS) * scores
            return 2 * macs, SOFTMAX_BACKWARD_FLOPS * scores
        masked = call.args.get("is_causal") or any(
            call.args.get(name) is not None for name in ("attn_mask", "attn_bias", "bias")
        )
        return macs, (SOFTMAX_FLOPS + int(bool(masked))) * scores

    return attention_formula


SDPA_KERNELS = (aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention) + present(
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
SDPA_BACKWARD_KERNELS = (
    aten._scaled_dot_product_flash_attention_backward, aten._scaled_dot_product_efficient_attention_backward
) + present(
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
)
LOW_LEVEL_KERNELS = (aten._flash_attention_forward, aten._efficient_attention_forward)
LOW_LEVEL_BACKWARD_KERNELS = (aten._flash_attention_backward, aten._efficient_attention_backward)

formula(*SDPA_KERNELS)(attention(heads_before_length))
formula(*SDPA_BACKWARD_KERNELS)(attention(heads_before_length, backward=True))
formula(*LOW_LEVEL_KERNELS)(attention(length_before_heads))
formula(*LOW_LEVEL_BACKWARD_KERNELS)(attention(length_before_heads, backward=True))

#: The fused attention backward kernels priced with recomputation (attention_backward = "with_recompute"), taking
#: the place of their built-in formulas for that count.
ATTENTION_BACKWARD_WITH_RECOMPUTE: dict[OpOverloadPacket, Formula] = {
    **dict.fromkeys(SDPA_BACKWARD_KERNELS, attention(heads_before_length, backward=True, recompute=True)),
    **dict.fromkeys(LOW_LEVEL_BACKWARD_KERNELS, attention(length_before_heads, backward=True, recompute=True)),
}


@formula(aten._native_multi_head_attention)
def native_multi_head_attention(call: OpCall) -> tuple[int, int] | None:
    """nn.MultiheadAttention's fused path, costed like its unfused path so the two agree.

    MACs: Q projection B*Lq*E*E, K and V projections B*Lk*E*E each, attention 2*B*Lq*Lk*E, output projection B*Lq*E*E.
    Other FLOPs: projection biases (1 per projected element), softmax per score (+1 with a mask), and, when the
    weights are returned, query scaling (1 per query element; without weights the unfused path folds it into SDPA)
    and their head average (1 per score) if averaged.
    """
    query, key = call.args["query"], call.args["key"]
    if query.is_nested or key.is_nested:
        return None
    batch, query_len, embed = query.shape
    key_len = key.shape[1]
    scores = batch * call.args["num_head"] * query_len * key_len
    query_elements, key_elements = batch * query_len * embed, batch * key_len * embed
    macs = 2 * query_elements * embed + 2 * key_elements * embed + 2 * batch * query_len * key_len * embed
    other = (SOFTMAX_FLOPS + int(call.args["mask"] is not None)) * scores
    if call.args["qkv_bias"] is not None:
        other += query_elements + 2 * key_elements
    if call.args["proj_bias"] is not None:
        other += query_elements
    if call.args["need_weights"]:
        other += query_elements + (scores if call.args["average_attn_weights"] else 0)
    return macs, other


@formula(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer_fwd(call: OpCall) -> tuple[int, int] | None:
    """nn.TransformerEncoderLayer's fused path, costed like its unfused path (eval: dropout runs no op) so the two agree.

    Self-attention as ``_native_multi_head_attention`` without returned weights; the feed-forward linears B*L*E*F MACs
    each plus their biases (F + E per token); the activation (relu, or gelu in its erf form, per hidden element); the
    two layer norms and the two residual adds, as the table prices them. None for a nested (padded-away) input.
    """
    args = call.args
    src = args["src"]
    attention_args = {name: args[name] for name in ("qkv_bias", "proj_bias", "mask")}
    attention_cost = native_multi_head_attention(
        OpCall({"query": src, "key": src, "num_head": args["num_heads"], "need_weights": False, **attention_args}, [])
    )
    if attention_cost is None:
        return None
    elements = src.numel()
    hidden = elements // args["embed_dim"] * args["ffn_weight_1"].shape[0]  # B*L*F elements between the linears
    activation = cost_table.GELU_ERF if args["use_gelu"] else cost_table.PER_OUTPUT_ELEMENT["relu"]
    norms = sum(
        layer_norm(OpCall({"input": src, "weight": args[f"norm_weight_{i}"], "bias": args[f"norm_bias_{i}"]}, []))[1]
        for i in (1, 2)
    )
    biases, residuals = hidden + elements, 2 * cost_table.PER_OUTPUT_ELEMENT["add"] * elements
    return (
        attention_cost[0] + 2 * hidden * args["embed_dim"],
        attention_cost[1] + biases + activation * hidden + norms + residuals,
    )


# -- elementwise work, reductions, norms, pooling ----------------------------------------------------------------------


def per_output_element(cost: int) -> Formula:
    return lambda call: (0, cost * call.out_numel())


def per_input_element(cost: int) -> Formula:
    return lambda call: (0, cost * call.first().numel())


for _name, _cost in cost_table.PER_OUTPUT_ELEMENT.items():
    formula(*present(_name))(per_output_element(_cost))
for _name, _cost in cost_table.PER_INPUT_ELEMENT.items():
    formula(*present(_name))(per_input_element(_cost))


def foreach(cost: int) -> Formula:
    """A ``_foreach_`` operator: its elementwise operation over every tensor of its first list."""
    return lambda call: (0, cost * sum(tensor.numel() for tensor in call.first()))


for _name, _cost in cost_table.PER_OUTPUT_ELEMENT.items():
    if hasattr(aten, f"_foreach_{_name}"):  # the optimisers' multi-tensor paths (foreach=True, CUDA's default)
        formula(getattr(aten, f"_foreach_{_name}"))(foreach(_cost))
formula(aten._foreach_norm)(foreach(cost_table.PER_INPUT_ELEMENT["norm"]))
formula(aten._amp_foreach_non_finite_check_and_unscale_)(foreach(cost_table.AMP_UNSCALE))


@formula(aten._amp_update_scale_)
def amp_update_scale(call: OpCall) -> tuple[int, int]:
    return 0, cost_table.AMP_UPDATE_SCALE


@formula(aten.nll_loss_forward, aten.nll_loss2d_forward)
def nll_loss(call: OpCall) -> tuple[int, int]:
    return 0, cost_table.NLL_LOSS * call.args["target"].numel()


@formula(aten.nll_loss_backward, aten.nll_loss2d_backward)
def nll_loss_backward(call: OpCall) -> tuple[int, int]:
    return 0, cost_table.NLL_LOSS_BACKWARD * call.args["target"].numel()


@formula(aten.mse_loss)
def mse_loss(call: OpCall) -> tuple[int, int]:
    return 0, cost_table.MSE_LOSS * call.first().numel()


@formula(aten.mse_loss_backward)
def mse_loss_backward(call: OpCall) -> tuple[int, int]:
    return 0, cost_table.MSE_LOSS_BACKWARD * call.args["self"].numel()


@formula(aten.gelu)
def gelu(call: OpCall) -> tuple[int, int]:
    cost = cost_table.GELU_TANH if call.args["approximate"] == "tanh" else cost_table.GELU_ERF
    return 0, cost * call.out_numel()


@formula(aten.gelu_backward)
def gelu_backward(call: OpCall) -> tuple[int, int]:
    """Per input element: 11 (erf form) or 18 (tanh form), see rpx_core.cost_table."""
    tanh = call.args["approximate"] == "tanh"
    return 0, (cost_table.GELU_TANH_BACKWARD if tanh else cost_table.GELU_ERF_BACKWARD) * call.args["self"].numel()


@formula(aten.native_layer_norm, aten.native_group_norm)
def layer_norm(call: OpCall) -> tuple[int, int]:
    """Layer/group norm: 5 per element (mean, subtract, square, variance sum, scale by rstd) + 1 each weight, bias."""
    affine = int(call.args["weight"] is not None) + int(call.args["bias"] is not None)
    return 0, (cost_table.LAYER_NORM + affine) * call.first().numel()


@formula(aten.native_layer_norm_backward, aten.native_group_norm_backward)
def layer_norm_backward(call: OpCall) -> tuple[int, int]:
    """Per element, for the gradients ``output_mask`` asks: x_hat 2 (input or weight gradient), input gradient 7
    (+1 to multiply by the weight), weight gradient 2, bias gradient 1 (see rpx_core.cost_table)."""
    want_input, want_weight, want_bias = call.args["output_mask"]
    per_element = cost_table.LAYER_NORM_BACKWARD_XHAT if (want_input or want_weight) else 0
    if want_input:
        per_element += cost_table.LAYER_NORM_BACKWARD_INPUT + int(call.args["weight"] is not None)
    per_element += cost_table.NORM_BACKWARD_WEIGHT * int(want_weight) + cost_table.NORM_BACKWARD_BIAS * int(want_bias)
    return 0, per_element * call.args["input"].numel()


@formula(*present("_fused_rms_norm"))
def rms_norm(call: OpCall) -> tuple[int, int]:
    """RMS norm: 3 per element (square, sum, scale by rstd) + 1 for the weight."""
    return 0, (cost_table.RMS_NORM + int(call.args["weight"] is not None)) * call.first().numel()


@formula(*present("_fused_rms_norm_backward"))
def rms_norm_backward(call: OpCall) -> tuple[int, int]:
    """Per element, for the gradients ``output_mask`` asks: x_hat 1, input gradient 5 (+1 to multiply by the
    weight), weight gradient 2 (see rpx_core.cost_table)."""
    want_input, want_weight = call.args["output_mask"]
    per_element = cost_table.RMS_NORM_BACKWARD_XHAT
    if want_input:
        per_element += cost_table.RMS_NORM_BACKWARD_INPUT + int(call.args["weight"] is not None)
    per_element += cost_table.NORM_BACKWARD_WEIGHT * int(want_weight)
    return 0, per_element * call.args["input"].numel()


@formula(
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten.cudnn_batch_norm, aten.miopen_batch_norm,
)
def batch_norm(call: OpCall) -> tuple[int, int]:
    """Batch norm: 2 per element (subtract mean, scale by invstd) + 1 each for weight, bias; training adds 3 per element
    for the batch statistics (sum, square, sum). Running-statistics updates (per channel) are not counted."""
    affine = int(call.args["weight"] is not None) + int(call.args["bias"] is not None)
    statistics = cost_table.BATCH_NORM_STATISTICS if call.args.get("training", False) else 0
    return 0, (cost_table.BATCH_NORM + affine + statistics) * call.first().numel()


def batch_norm_backward_cost(elements: int, training: bool, output_mask: tuple[bool, bool, bool]) -> int:
    """Per element, for the gradients asked (see rpx_core.cost_table): training needs x_hat (2), both sums (1 + 2) and
    the input gradient (4) whichever gradient is asked beyond the bias (the sums are shared); inference prices each
    gradient alone: input 1, weight 2 + 2, bias 1."""
    want_input, want_weight, want_bias = output_mask
    xhat, bias_sum, weight_sum = (
        cost_table.LAYER_NORM_BACKWARD_XHAT, cost_table.NORM_BACKWARD_BIAS, cost_table.NORM_BACKWARD_WEIGHT
    )
    if training:
        per_element = (xhat + weight_sum) * int(want_input or want_weight) + bias_sum * int(want_input or want_bias)
        per_element += cost_table.BATCH_NORM_BACKWARD_TRAINING_INPUT * int(want_input)
    else:
        per_element = cost_table.BATCH_NORM_BACKWARD_INFERENCE_INPUT * int(want_input)
        per_element += (xhat + weight_sum) * int(want_weight) + bias_sum * int(want_bias)
    return per_element * elements


@formula(aten.native_batch_norm_backward)
def native_batch_norm_backward(call: OpCall) -> tuple[int, int]:
    args = call.args
    return 0, batch_norm_backward_cost(args["input"].numel(), args["train"], tuple(args["output_mask"]))


@formula(*present("batch_norm_backward"))
def batch_norm_backward(call: OpCall) -> tuple[int, int]:
    """The newer batch-norm backward: ``update`` says whether the forward used (and updated) batch statistics."""
    args = call.args
    return 0, batch_norm_backward_cost(args["input"].numel(), args["update"], tuple(args["output_mask"]))


@formula(aten.cudnn_batch_norm_backward, aten.miopen_batch_norm_backward)
def vendor_batch_norm_backward(call: OpCall) -> tuple[int, int]:
    """cuDNN/MIOpen batch-norm backward: training statistics, every gradient."""
    return 0, batch_norm_backward_cost(call.args["input"].numel(), True, (True, True, True))


def window_pool(spatial_dims: int) -> Formula:
    """Max/avg pooling: kernel volume per output element (max: comparisons; avg: k-1 adds + 1 divide); the backward
    of average pooling spreads each output gradient over its window at the same cost."""

    def window_pool_formula(call: OpCall) -> tuple[int, int]:
        kernel = list(call.args["kernel_size"])
        volume = math.prod(kernel) if len(kernel) == spatial_dims else kernel[0] ** spatial_dims
        outputs = call.args["grad_output"].numel() if "grad_output" in call.args else call.out_numel()
        return 0, volume * outputs

    return window_pool_formula


for _dims in (1, 2, 3):
    formula(getattr(aten, f"max_pool{_dims}d_with_indices"), getattr(aten, f"max_pool{_dims}d"),
            getattr(aten, f"avg_pool{_dims}d"))(window_pool(_dims))
for _dims in (2, 3):
    formula(getattr(aten, f"avg_pool{_dims}d_backward"))(window_pool(_dims))


@formula(
    aten.max_pool2d_with_indices_backward, aten.max_pool3d_with_indices_backward, aten.adaptive_max_pool2d_backward,
    aten.adaptive_max_pool3d_backward,
)
def max_pool_backward(call: OpCall) -> tuple[int, int]:
    """Each output gradient is added into the input position its window's maximum came from: 1 per grad_output
    element (overlapping windows accumulate; the zero fill of the input gradient is data movement)."""
    return 0, call.args["grad_output"].numel()


@formula(aten._adaptive_avg_pool2d_backward, aten._adaptive_avg_pool3d_backward)
def adaptive_avg_pool_backward(call: OpCall) -> tuple[int, int]:
    """Each input position receives its window's gradient divided by the window size: 1 per input element, as the
    forward costs 1 per input element."""
    return 0, call.args["self"].numel()


@formula(aten.embedding_dense_backward)
def embedding_backward(call: OpCall) -> tuple[int, int]:
    """The gradient rows are added into the table rows their indices name: 1 add per grad_output element, + 1 per
    element to scale by the inverse index frequency with ``scale_grad_by_freq``."""
    return 0, (1 + int(call.args["scale_grad_by_freq"])) * call.args["grad_output"].numel()


@formula(aten.index_put, aten._index_put_impl)
def index_put(call: OpCall) -> tuple[int, int]:
    """Indexed write: 1 add per written value when accumulating, else pure data movement."""
    return 0, call.args["values"].numel() if call.args["accumulate"] else 0


def other_flops_convention() -> str:
    """The per-element cost table behind ``other_flops``, in words (stored with every result)."""
    lines = cost_table.describe(cost_table.PER_OUTPUT_ELEMENT, cost_table.PER_INPUT_ELEMENT)
    lines += [
        f"gelu: {cost_table.GELU_ERF} per element (erf form) or {cost_table.GELU_TANH} (tanh form); its backward "
        f"{cost_table.GELU_ERF_BACKWARD} or {cost_table.GELU_TANH_BACKWARD}",
        "layer/group norm: 5 per element + 1 each for weight and bias; RMS norm: 3 + 1 for weight",
        "layer/group norm backward per element: 2 (x_hat) + 7 (+1 with a weight) for the input gradient, 2 for the "
        "weight gradient, 1 for the bias gradient; RMS norm backward: 1 + 5 (+1 with a weight) + 2",
        "batch norm: 2 per element + 1 each for weight and bias, + 3 in training for the batch statistics",
        "batch norm backward per element: training 9 with the input gradient (the weight and bias sums included), "
        "else 4 for the weight gradient and 1 for the bias gradient; inference 1 (input), 4 (weight), 1 (bias)",
        "max/avg pooling: kernel volume per output element; avg pooling backward the same per output gradient; max "
        "pooling backward 1 per output gradient; adaptive avg pooling backward 1 per input element",
        "embedding backward: 1 per gradient element (+1 with scale_grad_by_freq)",
        f"losses: nll_loss {cost_table.NLL_LOSS} per target element (backward {cost_table.NLL_LOSS_BACKWARD}), mse_loss "
        f"{cost_table.MSE_LOSS} per input element (backward {cost_table.MSE_LOSS_BACKWARD})",
        "_foreach_ operators (optimisers' multi-tensor paths): their elementwise operation's cost per element of "
        f"every tensor in the list; a loss scaler's unscale {cost_table.AMP_UNSCALE} per gradient element, its scale "
        f"update {cost_table.AMP_UPDATE_SCALE} per call",
        "bias of addmm/baddbmm/addmv/convolution: 1 per output element",
        "attention: see causal_mask_convention",
        "nn.TransformerEncoderLayer's fused op: the sum of its unfused path's ops, priced as above (gelu in erf form)",
        "exp, log, sqrt, rsqrt, tanh, erf, sin, cos each count 1; in-place variants (add_) cost as their op",
        "zero by definition: views, metadata queries, allocations and fills, gathers (embedding, index), copies, "
        "concatenation, padding; any other op is listed in uncounted_ops, never counted as 0",
    ]
    return "; ".join(lines)
