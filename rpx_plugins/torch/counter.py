"""Tier 1 counting core: FLOPs, MACs, bytes moved and activation memory of ONE real pass, at the aten dispatch level.

Why the dispatch level: module hooks miss functional calls (``x @ w``, ``F.scaled_dot_product_attention``) and mis-count
shared modules, while a TorchDispatchMode sees every aten operator that actually runs, on real tensors or on the meta
device (where a 70B-parameter model traces in seconds without allocating its weights). One pass collects everything:
each distinct (operator, input shapes/dtypes, arguments) is priced once and then only counted, so an 80-layer model
costs little more than its forward pass.

Why one formula per kind of work: which attention kernel runs depends on device, dtype and grad mode (CPU runs
``_scaled_dot_product_flash_attention_for_cpu``, CUDA flash/efficient/cuDNN kernels, meta the unfused math path,
``nn.MultiheadAttention`` in eval + no_grad its fused ``_native_multi_head_attention``). Every attention kernel gets the
same formula, so the same model has the same matrix FLOPs everywhere; ``nn.TransformerEncoderLayer``'s fused
``_transformer_encoder_layer_fwd`` (eval + no_grad) is priced as the sum of its unfused path's ops. On meta,
``F.scaled_dot_product_attention`` is routed to the kernel the CPU backend would pick, and ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` to their fused paths whenever the CPU backend would take them, so meta counts equal CPU
counts (bytes and activation memory included), except where TRAFFIC_ASSUMPTIONS says otherwise.

This module imports torch: import it lazily, inside a stage.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import re
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Self, TypeVar

import attrs
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from rpx_core.errors import UnsupportedError
from rpx_core.types.counts import (
    BACKWARD_MODULE,
    OTHERS,
    ROOT_MODULE,
    FlopsResult,
    ModuleStats,
    OperatorStats,
    OpRecord,
    TrafficResult,
    describe_cost_tables,
    fold_largest,
)


class CountingError(UnsupportedError, RuntimeError):
    """The pass cannot be counted as asked, e.g. a data-dependent op on the meta device; the message says what to do."""


@attrs.frozen
class CountReport:
    """Everything one counted pass produced."""

    flops: FlopsResult
    traffic: TrafficResult


# -- conventions: what one call of each operator costs -----------------------------------------------------------------

#: Per-element cost of softmax / log-softmax: row max, subtract, exp, row sum, divide (or log-subtract).
SOFTMAX_FLOPS = 5
#: Per-element cost of the softmax backward: grad x out, row sum, subtract, multiply by out.
SOFTMAX_BACKWARD_FLOPS = 4

CAUSAL_MASK_CONVENTION = (
    "dense: attention counts the full Lq x Lk score matrix even with is_causal=True or a mask, as torch's "
    "FlopCounterMode does (a kernel that skips masked blocks does about half the attention FLOPs for a causal mask). "
    "Every attention kernel (flash, efficient, cuDNN, CPU flash, math path, the fused paths of nn.MultiheadAttention "
    "and nn.TransformerEncoderLayer) uses "
    "QK^T = B*H*Lq*Lk*E MACs and PV = B*H*Lq*Lk*Ev MACs with H the query heads (grouped-query attention included); "
    f"softmax adds {SOFTMAX_FLOPS} other FLOPs per score (+1 with a mask or is_causal); backward is 2x the forward "
    f"MACs (dQ, dK, dV, dP; recomputing scores is not counted) plus {SOFTMAX_BACKWARD_FLOPS} other FLOPs per score"
)


class _Call:
    """One operator call as a formula sees it: arguments by schema name (defaults filled) and the output tensors."""

    __slots__ = ("args", "outputs")

    def __init__(self, args: dict[str, Any], outputs: list[torch.Tensor]) -> None:
        self.args = args
        self.outputs = outputs

    def first(self) -> torch.Tensor:
        """The first argument: the tensor an elementwise, norm or reduction op works on."""
        return next(iter(self.args.values()))

    def out_numel(self) -> int:
        return self.outputs[0].numel()


#: A FLOP formula: (MACs, other FLOPs) of one call, or None when this variant of the op has no formula.
Formula = Callable[[_Call], "tuple[int, int] | None"]


def _matmul(operand: str, bias: str | None = None) -> Formula:
    """MACs = output elements x inner dimension (the last dim of ``operand``); a bias adds 1 FLOP per output element."""

    def formula(call: _Call) -> tuple[int, int]:
        out = call.out_numel()
        has_bias = bias is not None and call.args.get(bias) is not None
        return out * call.args[operand].shape[-1], out if has_bias else 0

    return formula


_addmm = _matmul("mat1", bias="self")


def _addmm_activation(call: _Call) -> tuple[int, int]:
    """addmm fused with an activation (cuBLASLt epilogue): bias add + GELU (tanh form, 9) or ReLU (1) per output."""
    macs, bias = _addmm(call)
    activation = _GELU_TANH_FLOPS if call.args["use_gelu"] else 1
    return macs, bias + activation * call.out_numel()


def _convolution(transposed: bool | None) -> Formula:
    """MACs = output elements x (C_in / groups) x kernel volume; transposed: input elements x (C_out / groups) x kernel.

    ``transposed`` None reads the op's ``transposed`` argument. Stride, padding and dilation act through the output
    shape; padded zeros are multiplied like any input (the dense convention of every counter). A bias adds 1 FLOP per
    output element.
    """

    def formula(call: _Call) -> tuple[int, int]:
        source, weight = list(call.args.values())[:2]
        is_transposed = call.args["transposed"] if transposed is None else transposed
        macs = (source.numel() if is_transposed else call.out_numel()) * math.prod(weight.shape[1:])
        return macs, call.out_numel() if call.args.get("bias") is not None else 0

    return formula


def _convolution_backward(call: _Call) -> tuple[int, int]:
    """Input gradient and weight gradient each cost the forward MACs; the bias gradient sums grad_output (1/element)."""
    grad_out, source, weight = call.args["grad_output"], call.args["input"], call.args["weight"]
    per_point = math.prod(weight.shape[1:])
    forward_macs = (source.numel() if call.args["transposed"] else grad_out.numel()) * per_point
    want_input, want_weight, want_bias = call.args["output_mask"]
    return forward_macs * (int(want_input) + int(want_weight)), grad_out.numel() if want_bias else 0


class _AttentionSizes(NamedTuple):
    batch_heads: int  # batch x query heads
    query_len: int  # Lq
    key_len: int  # Lk
    qk_dim: int  # E
    value_dim: int  # Ev


def _heads_before_length(call: _Call) -> _AttentionSizes:
    """Sizes for kernels taking (B, H, L, E) tensors, the layout of the SDPA-level kernels."""
    query, key, value = call.args["query"], call.args["key"], call.args["value"]
    batch_heads = math.prod(query.shape[:-2])
    return _AttentionSizes(batch_heads, query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1])


def _length_before_heads(call: _Call) -> _AttentionSizes | None:
    """Sizes for the low-level flash/efficient kernels taking (B, L, H, E); None for variable-length packed batches."""
    if any(call.args.get(name) is not None for name in ("cum_seq_q", "cu_seqlens_q")):
        return None
    query, key, value = call.args["query"], call.args["key"], call.args["value"]
    batch_heads = query.shape[0] * query.shape[2]
    return _AttentionSizes(batch_heads, query.shape[1], key.shape[1], query.shape[3], value.shape[3])


def _attention(sizes_of: Callable[[_Call], _AttentionSizes | None], *, backward: bool = False) -> Formula:
    """Every attention kernel's formula (see CAUSAL_MASK_CONVENTION)."""

    def formula(call: _Call) -> tuple[int, int] | None:
        sizes = sizes_of(call)
        if sizes is None:
            return None
        scores = sizes.batch_heads * sizes.query_len * sizes.key_len
        macs = scores * (sizes.qk_dim + sizes.value_dim)
        if backward:
            return 2 * macs, SOFTMAX_BACKWARD_FLOPS * scores
        masked = call.args.get("is_causal") or any(
            call.args.get(name) is not None for name in ("attn_mask", "attn_bias", "bias")
        )
        return macs, (SOFTMAX_FLOPS + int(bool(masked))) * scores

    return formula


def _native_multi_head_attention(call: _Call) -> tuple[int, int] | None:
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


def _transformer_encoder_layer_fwd(call: _Call) -> tuple[int, int] | None:
    """nn.TransformerEncoderLayer's fused path, costed like its unfused path (eval: dropout runs no op) so the two agree.

    Self-attention as ``_native_multi_head_attention`` without returned weights; the feed-forward linears B*L*E*F MACs
    each plus their biases (F + E per token); the activation (relu, or gelu in its erf form, per hidden element); the
    two layer norms and the two residual adds, as the table prices them. None for a nested (padded-away) input.
    """
    args = call.args
    src = args["src"]
    attention_args = {name: args[name] for name in ("qkv_bias", "proj_bias", "mask")}
    attention = _native_multi_head_attention(
        _Call({"query": src, "key": src, "num_head": args["num_heads"], "need_weights": False, **attention_args}, [])
    )
    if attention is None:
        return None
    elements = src.numel()
    hidden = elements // args["embed_dim"] * args["ffn_weight_1"].shape[0]  # B*L*F elements between the linears
    activation = _GELU_ERF_FLOPS if args["use_gelu"] else PER_OUTPUT_ELEMENT["relu"]
    norms = sum(
        _layer_norm(_Call({"input": src, "weight": args[f"norm_weight_{i}"], "bias": args[f"norm_bias_{i}"]}, []))[1]
        for i in (1, 2)
    )
    biases, residuals = hidden + elements, 2 * PER_OUTPUT_ELEMENT["add"] * elements
    return attention[0] + 2 * hidden * args["embed_dim"], attention[1] + biases + activation * hidden + norms + residuals


def _per_output_element(cost: int) -> Formula:
    return lambda call: (0, cost * call.out_numel())


def _per_input_element(cost: int) -> Formula:
    return lambda call: (0, cost * call.first().numel())


_GELU_ERF_FLOPS = 5  # 0.5 * x * (1 + erf(x / sqrt(2))): divide, erf, add, two multiplies
_GELU_TANH_FLOPS = 9  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))): cube (2), 3 multiplies, 2 adds, tanh, 1


def _gelu(call: _Call) -> tuple[int, int]:
    cost = _GELU_TANH_FLOPS if call.args["approximate"] == "tanh" else _GELU_ERF_FLOPS
    return 0, cost * call.out_numel()


#: Costs per OUTPUT element of elementwise ops (in-place variants like ``add_`` share their entry). exp, log, sqrt,
#: rsqrt, tanh, erf, sin, cos each count as 1 FLOP; composite activations count their elementwise steps.
PER_OUTPUT_ELEMENT: dict[str, int] = {
    **dict.fromkeys(
        (
            "add", "sub", "rsub", "mul", "div", "neg", "abs", "sign", "sgn", "reciprocal", "pow", "sqrt", "rsqrt",
            "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "erf", "erfc",
            "floor", "ceil", "round", "trunc", "frac", "fmod", "remainder", "floor_divide", "atan2", "copysign",
            "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max", "relu", "leaky_relu", "hardtanh",
            "threshold", "threshold_backward", "where", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge",
            "logical_not", "logical_and", "logical_or", "logical_xor", "bitwise_not", "bitwise_and", "bitwise_or",
            "isnan", "isinf", "nan_to_num",
        ),
        1,
    ),
    **dict.fromkeys(("addcmul", "addcdiv", "lerp", "native_dropout", "native_dropout_backward"), 2),
    **dict.fromkeys(("softplus", "elu", "hardsigmoid", "sigmoid_backward", "tanh_backward"), 3),
    **dict.fromkeys(("sigmoid", "hardswish", "log_sigmoid_forward"), 4),
    "silu": 5,  # x * sigmoid(x)
}

#: Costs per INPUT element of reductions and row-wise ops (the final divide of a mean is folded in).
PER_INPUT_ELEMENT: dict[str, int] = {
    **dict.fromkeys(
        (
            "sum", "mean", "nansum", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all",
            "cumsum", "cumprod", "logcumsumexp", "embedding_dense_backward",
            "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d", "adaptive_max_pool2d",
            "adaptive_max_pool3d",
        ),
        1,
    ),
    **dict.fromkeys(("linalg_vector_norm", "norm"), 2),  # square, add
    **dict.fromkeys(("var", "std", "var_mean", "std_mean"), 3),  # subtract mean, square, add
    **dict.fromkeys(("_softmax", "_safe_softmax", "_log_softmax"), SOFTMAX_FLOPS),
    **dict.fromkeys(("_softmax_backward_data", "_log_softmax_backward_data"), SOFTMAX_BACKWARD_FLOPS),
}


def _layer_norm(call: _Call) -> tuple[int, int]:
    """Layer/group norm: 5 per element (mean, subtract, square, variance sum, scale by rstd) + 1 each weight, bias."""
    affine = int(call.args["weight"] is not None) + int(call.args["bias"] is not None)
    return 0, (5 + affine) * call.first().numel()


def _rms_norm(call: _Call) -> tuple[int, int]:
    """RMS norm: 3 per element (square, sum, scale by rstd) + 1 for the weight."""
    return 0, (3 + int(call.args["weight"] is not None)) * call.first().numel()


def _batch_norm(call: _Call) -> tuple[int, int]:
    """Batch norm: 2 per element (subtract mean, scale by invstd) + 1 each for weight, bias; training adds 3 per element
    for the batch statistics (sum, square, sum). Running-statistics updates (per channel) are not counted."""
    affine = int(call.args["weight"] is not None) + int(call.args["bias"] is not None)
    statistics = 3 if call.args.get("training", False) else 0
    return 0, (2 + affine + statistics) * call.first().numel()


def _window_pool(spatial_dims: int) -> Formula:
    """Max/avg pooling: kernel volume per output element (max: comparisons; avg: k-1 adds + 1 divide)."""

    def formula(call: _Call) -> tuple[int, int]:
        kernel = list(call.args["kernel_size"])
        volume = math.prod(kernel) if len(kernel) == spatial_dims else kernel[0] ** spatial_dims
        return 0, volume * call.out_numel()

    return formula


def _index_put(call: _Call) -> tuple[int, int]:
    """Indexed write: 1 add per written value when accumulating, else pure data movement."""
    return 0, call.args["values"].numel() if call.args["accumulate"] else 0


#: FLOP formulas by aten operator name (in-place variants such as ``add_`` use their op's entry). Only what reaches
#: dispatch needs one: nn.Linear and torch.matmul/@ decompose before dispatch into views + mm/addmm/bmm, einsum into
#: bmm, F.scaled_dot_product_attention into one fused kernel or the math path's bmm + softmax.
FORMULAS: dict[str, Formula] = {
    "mm": _matmul("self"),
    "addmm": _addmm,
    "bmm": _matmul("self"),
    "baddbmm": _matmul("batch1", bias="self"),
    "mv": _matmul("self"),
    "addmv": _matmul("mat", bias="self"),
    "dot": _matmul("self"),
    "vdot": _matmul("self"),
    "_int_mm": _matmul("self"),
    "_scaled_mm": _matmul("self", bias="bias"),
    "_addmm_activation": _addmm_activation,
    **dict.fromkeys(("convolution", "_convolution", "convolution_overrideable"), _convolution(None)),
    **dict.fromkeys(
        (
            "cudnn_convolution", "mkldnn_convolution", "_slow_conv2d_forward", "slow_conv3d_forward",
            "_conv_depthwise2d", "conv_depthwise3d", "thnn_conv2d",
        ),
        _convolution(False),
    ),
    **dict.fromkeys(
        ("cudnn_convolution_transpose", "slow_conv_transpose2d", "slow_conv_transpose3d"), _convolution(True)
    ),
    "convolution_backward": _convolution_backward,
    **dict.fromkeys(
        (
            "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable",
        ),
        _attention(_heads_before_length),
    ),
    **dict.fromkeys(
        (
            "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
            "_scaled_dot_product_fused_attention_overrideable_backward",
        ),
        _attention(_heads_before_length, backward=True),
    ),
    **dict.fromkeys(("_flash_attention_forward", "_efficient_attention_forward"), _attention(_length_before_heads)),
    **dict.fromkeys(
        ("_flash_attention_backward", "_efficient_attention_backward"), _attention(_length_before_heads, backward=True)
    ),
    "_native_multi_head_attention": _native_multi_head_attention,
    "_transformer_encoder_layer_fwd": _transformer_encoder_layer_fwd,
    **{name: _per_output_element(cost) for name, cost in PER_OUTPUT_ELEMENT.items()},
    **{name: _per_input_element(cost) for name, cost in PER_INPUT_ELEMENT.items()},
    "gelu": _gelu,
    **dict.fromkeys(("native_layer_norm", "native_group_norm"), _layer_norm),
    "_fused_rms_norm": _rms_norm,
    **dict.fromkeys(
        (
            "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
            "cudnn_batch_norm", "miopen_batch_norm",
        ),
        _batch_norm,
    ),
    **{f"max_pool{d}d_with_indices": _window_pool(d) for d in (1, 2, 3)},
    **{f"max_pool{d}d": _window_pool(d) for d in (1, 2, 3)},
    **{f"avg_pool{d}d": _window_pool(d) for d in (1, 2, 3)},
    **dict.fromkeys(("index_put", "_index_put_impl"), _index_put),
}

# Operators that are zero-FLOP by definition, by what they do to memory. Views (schema-declared aliases) are found
# from the schema; _unsafe_view is a view its schema does not declare, detach_ only changes autograd metadata.
ALIASES = frozenset({"_unsafe_view", "detach_"})
#: Shape/stride/device queries: no FLOPs, no bytes.
METADATA = frozenset(
    {
        "size", "sym_size", "stride", "sym_stride", "numel", "sym_numel", "dim", "storage_offset",
        "sym_storage_offset", "is_contiguous", "sym_is_contiguous", "is_strides_like_format",
        "is_non_overlapping_and_dense", "is_same_size", "result_type", "device", "layout",
    }
)
#: Allocations that leave memory uninitialised: no FLOPs, no bytes.
EMPTY_ALLOCATIONS = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted", "resize_"}
)
#: Creation ops that fill their output (constants, ranges, random numbers): no FLOPs, no reads, output written.
FILLS = frozenset(
    {
        "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill",
        "fill_", "zero_", "scalar_tensor", "arange", "linspace", "logspace", "eye", "rand", "rand_like", "randn",
        "randn_like", "randint", "randint_like", "randperm", "normal", "normal_", "uniform_", "bernoulli",
        "bernoulli_", "exponential_", "random_",
    }
)
#: Gathers: no FLOPs; read only the rows they return (plus indices), not the whole table.
GATHERS = frozenset({"embedding", "index_select", "gather", "index", "_unsafe_index"})
#: Pure data movement (copies, concatenation, padding, masking by selection): no FLOPs, bytes counted.
DATA_MOVEMENT = frozenset(
    {
        "clone", "_to_copy", "copy", "copy_", "_copy_from", "_copy_from_and_resize", "cat", "stack", "scatter",
        "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "masked_scatter",
        "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d",
        "replication_pad2d", "replication_pad3d", "repeat", "flip", "roll", "tril", "triu", "narrow_copy",
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "pixel_shuffle", "pixel_unshuffle",
        "channel_shuffle", "im2col", "_local_scalar_dense", "lift_fresh_copy", "view_copy", "permute_copy",
        "transpose_copy", "t_copy", "expand_copy", "slice_copy", "select_copy", "unsqueeze_copy", "squeeze_copy",
        "_reshape_copy", "alias_copy", "detach_copy", "split_copy", "split_with_sizes_copy", "unbind_copy",
        "diagonal_copy", "as_strided_copy", "unfold_copy", "slice_backward", "select_backward", "diagonal_backward",
    }
)
#: Ops whose mutated destination is only written, never read.
WRITE_ONLY_DESTINATION = frozenset({"copy_", "_copy_from", "_copy_from_and_resize"})

#: Kinds of operators, by how their cost is found.
_VIEW, _METADATA, _ALLOCATION, _FILL, _GATHER, _MOVEMENT, _FORMULA, _UNKNOWN = range(8)
_FREE_KINDS = (_VIEW, _METADATA)


def other_flops_convention() -> str:
    """The per-element cost table behind ``other_flops``, in words (stored with every result)."""
    lines = describe_cost_tables(PER_OUTPUT_ELEMENT, PER_INPUT_ELEMENT)
    lines += [
        f"gelu: {_GELU_ERF_FLOPS} per element (erf form) or {_GELU_TANH_FLOPS} (tanh form)",
        "layer/group norm: 5 per element + 1 each for weight and bias; RMS norm: 3 + 1 for weight",
        "batch norm: 2 per element + 1 each for weight and bias, + 3 in training for the batch statistics",
        "max/avg pooling: kernel volume per output element",
        "bias of addmm/baddbmm/addmv/convolution: 1 per output element",
        "attention: see causal_mask_convention",
        "nn.TransformerEncoderLayer's fused op: the sum of its unfused path's ops, priced as above (gelu in erf form)",
        "exp, log, sqrt, rsqrt, tanh, erf, sin, cos each count 1; in-place variants (add_) cost as their op",
        "zero by definition: views, metadata queries, allocations and fills, gathers (embedding, index), copies, "
        "concatenation, padding; any other op is listed in uncounted_ops, never counted as 0",
    ]
    return "; ".join(lines)


# -- operator classification and one call's price ----------------------------------------------------------------------


class _OpInfo(NamedTuple):
    """What rpx knows about one aten overload, derived once from its name and schema."""

    label: str  # "aten.mm"
    kind: int  # one of the kinds above
    formula: Formula | None
    arg_names: tuple[str, ...]  # schema argument names, in order
    defaults: dict[str, Any]  # schema defaults, so formulas read every argument by name
    write_only: frozenset[str]  # arguments only written (out=, copy_ destination): not read
    unreturned_writes: frozenset[str]  # arguments mutated but not returned (batch norm running stats): written
    dynamic_output: bool  # output shapes depend on tensor values (x[mask], nonzero, unique) or cannot be known


def _classify(func: torch._ops.OpOverload) -> _OpInfo:
    name = func._overloadpacket.__name__
    schema = func._schema
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    formula = FORMULAS.get(name) or FORMULAS.get(base)
    if func.is_view or name in ALIASES:
        kind = _VIEW
    elif name in METADATA or func.namespace == "prim":
        kind = _METADATA
    elif name in EMPTY_ALLOCATIONS:
        kind = _ALLOCATION
    elif name in FILLS:
        kind = _FILL
    elif name in GATHERS:
        kind = _GATHER
    elif name in DATA_MOVEMENT:
        kind = _MOVEMENT
    else:
        kind = _FORMULA if formula is not None else _UNKNOWN
    mutated = {arg.name: arg for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
    returned_sets = set().union(*(r.alias_info.before_set for r in schema.returns if r.alias_info is not None))
    write_only = {arg_name for arg_name, arg in mutated.items() if arg.kwarg_only or name in WRITE_ONLY_DESTINATION}
    return _OpInfo(
        label=f"{func.namespace}.{name}",
        kind=kind,
        formula=formula,
        arg_names=tuple(arg.name for arg in schema.arguments),
        defaults={arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()},
        write_only=frozenset(write_only),
        unreturned_writes=frozenset(
            arg_name for arg_name, arg in mutated.items() if not arg.alias_info.before_set <= returned_sets
        ),
        dynamic_output=torch.Tag.dynamic_output_shape in func.tags or func.namespace != "aten",
    )


class _WeightRead(NamedTuple):
    """How one call read one parameter/buffer, for the fused lower bound."""

    index: int  # position among the call's tensors
    nbytes: int  # bytes read
    view: tuple[Any, ...] | None  # (shape, stride) of the view read; None for a gather (rows depend on the indices)


class _Price(NamedTuple):
    """The cost of ONE call of one (operator, input shapes/dtypes/strides, arguments, weight flags) signature."""

    label: str
    counted: bool  # False: ran without a FLOP formula (listed in uncounted_ops)
    macs: int
    other_flops: int
    weight_read: int  # bytes read from parameters/buffers
    activation_read: int  # bytes read from everything else
    written: int  # bytes written
    inputs: str  # "float32[8,64], float32[64,256]"
    weight_reads: tuple[_WeightRead, ...]
    outputs: int | None  # how many leading outputs are real results (None: all), for bytes written and liveness


def _extent_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor spans: broadcast (stride-0) dimensions are stored, and read, once."""
    try:
        strides = tensor.stride()
    except (RuntimeError, NotImplementedError):  # sparse / nested layouts have no strides
        return tensor.numel() * tensor.element_size()
    elements = 1
    for size, stride in zip(tensor.shape, strides):
        if size == 0:
            return 0
        if stride != 0:
            elements *= size
    return elements * tensor.element_size()


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def _storage_key(tensor: torch.Tensor) -> int | None:
    """Identity of a tensor's storage (shared by its views); works on meta, where every data pointer is 0."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _describe(value: Any, tensors: list[torch.Tensor]) -> Any:
    """A hashable description of one argument for the price cache; collects the tensors it holds."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (value.shape, value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple([_describe(item, tensors) for item in value])
    return value


def _short(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}[{','.join(map(str, tensor.shape))}]"


def _price(
    info: _OpInfo,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    tensors: list[torch.Tensor],
    is_weight: tuple[bool, ...],
) -> _Price:
    """Price one call: FLOPs from the formula, bytes from the tensors it actually reads and writes."""
    bound = dict(zip(info.arg_names, args))  # in schema order: formulas may read the first argument
    for name in info.arg_names[len(args) :]:
        bound[name] = kwargs[name] if name in kwargs else info.defaults.get(name)
    results = _result_count(info, bound)
    outputs = list(_tensors_in(out))[:results]
    macs = other = 0
    counted = info.kind != _UNKNOWN
    if info.kind == _FORMULA:
        flops = info.formula(_Call(bound, outputs))
        counted = flops is not None
        macs, other = flops or (0, 0)
    output_bytes = sum(_extent_bytes(tensor) for tensor in outputs)
    weight_read, activation_read, weight_reads = _reads(info, bound, output_bytes, tensors, is_weight)
    written = 0
    if info.kind != _ALLOCATION:
        mutated = (tensor for name in info.unreturned_writes for tensor in _tensors_in(bound[name]))
        written = output_bytes + sum(_extent_bytes(tensor) for tensor in mutated)
    return _Price(
        label=info.label,
        counted=counted,
        macs=macs,
        other_flops=other,
        weight_read=weight_read,
        activation_read=activation_read,
        written=written,
        inputs=", ".join(_short(tensor) for tensor in tensors),
        weight_reads=weight_reads,
        outputs=results,
    )


def _reads(
    info: _OpInfo, bound: dict[str, Any], output_bytes: int, tensors: list[torch.Tensor], is_weight: tuple[bool, ...]
) -> tuple[int, int, tuple[_WeightRead, ...]]:
    """Bytes read from weights and from activations, and each weight read; a tensor passed twice is read once."""
    if info.kind in (_ALLOCATION, _FILL):
        return 0, 0, ()
    weight_index: dict[int, int] = {}
    for index, tensor in enumerate(tensors):
        if is_weight[index]:
            weight_index.setdefault(id(tensor), index)
    weight_read = activation_read = 0
    weight_reads = []
    seen: set[int] = set()
    for position, (name, value) in enumerate(bound.items()):
        if name in info.write_only:
            continue
        gathered = info.kind == _GATHER and position == 0
        for tensor in _tensors_in(value):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            nbytes = min(_extent_bytes(tensor), output_bytes) if gathered else _extent_bytes(tensor)
            index = weight_index.get(id(tensor))
            if index is None:
                activation_read += nbytes
                continue
            weight_read += nbytes
            view = None if gathered else (tuple(tensor.shape), tensor.stride())
            weight_reads.append(_WeightRead(index, nbytes, view))
    return weight_read, activation_read, tuple(weight_reads)


def _result_count(info: _OpInfo, bound: dict[str, Any]) -> int | None:
    """Batch norm in inference returns placeholder statistics whose size differs by backend (empty on CPU, one per
    channel on meta); only its output is a result, so CPU and meta agree."""
    if info.formula is _batch_norm and not bound.get("training", False):
        return 1
    return None


# -- the ledger: one pass's bookkeeping -------------------------------------------------------------------------------

_FORWARD, _BACKWARD = "forward", "backward"


class _Ledger:
    """Counts calls per (price, module, phase), tracks the module stack and live activation storages."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.weight_bytes = {
            key: tensor.untyped_storage().nbytes()
            for tensor in (*model.parameters(), *model.buffers())
            if (key := _storage_key(tensor)) is not None
        }
        self.module_names = self._qualified_names(model)
        self.infos: dict[Any, _OpInfo] = {}
        self.prices: dict[Any, _Price] = {}
        self.tally: dict[tuple[Any, tuple[str, str]], int] = {}
        self.module_calls: dict[str, int] = defaultdict(int)
        self.stack: list[tuple[torch.nn.Module, str]] = []
        self.where: tuple[str, str] = ("", _FORWARD)  # (module path, phase) charged for the next op
        self.weight_views: dict[tuple[Any, ...], int] = {}  # (storage, offset, view) -> most bytes read through it
        self.paused = False
        # activation liveness (forward pass only)
        self.tracking = True
        self.live: dict[int, tuple[weakref.ref, int, int]] = {}  # storage key -> (weakref, bytes, fp16 bytes)
        self.live_bytes = self.live_bytes_fp16 = 0
        self.peak_bytes = self.peak_bytes_fp16 = 0

    @staticmethod
    def _qualified_names(model: torch.nn.Module) -> dict[int, tuple[str, ...]]:
        names: dict[int, list[str]] = defaultdict(list)
        for name, module in model.named_modules(remove_duplicate=False):
            names[id(module)].append(name)
        return {key: tuple(value) for key, value in names.items()}

    # -- module stack --

    def enter_module(self, module: torch.nn.Module, _args: Any) -> None:
        names = self.module_names.get(id(module))
        if names is None:  # a module outside the counted model
            return
        parent = self.stack[-1][1] if self.stack else None
        path = self._path_under(names, parent)
        self.stack.append((module, path))
        if self.where[1] == _FORWARD:
            self.module_calls[path] += 1
            self.where = (path, _FORWARD)

    def exit_module(self, module: torch.nn.Module, _args: Any, _output: Any) -> None:
        if self.stack and self.stack[-1][0] is module:
            self.stack.pop()
            if self.where[1] == _FORWARD:
                self.where = (self.stack[-1][1] if self.stack else "", _FORWARD)

    @staticmethod
    def _path_under(names: tuple[str, ...], parent: str | None) -> str:
        """A shared module's name under the module calling it (``a.shared`` vs ``b.shared``), else its first name."""
        if parent:
            prefix = parent + "."
            for name in names:
                if name.startswith(prefix):
                    return name
        return names[0]

    @contextlib.contextmanager
    def module_hooks(self) -> Iterator[None]:
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self.enter_module)
        post = torch.nn.modules.module.register_module_forward_hook(self.exit_module, always_call=True)
        try:
            yield
        finally:
            pre.remove()
            post.remove()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Run rpx's own helper ops without counting them."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def start_backward(self) -> None:
        self.where = (BACKWARD_MODULE, _BACKWARD)

    # -- the hot path: one call --

    def record(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        info = self.infos.get(func)
        if info is None:
            info = self.infos[func] = _classify(func)
        if info.kind in _FREE_KINDS:
            return
        tensors: list[torch.Tensor] = []
        signature = [_describe(value, tensors) for value in args]
        if kwargs:
            signature += [(name, _describe(value, tensors)) for name, value in kwargs.items()]
        if len(tensors) > 1:  # the same tensor passed twice is read once: the price depends on which repeat
            ids = [id(tensor) for tensor in tensors]
            if len(set(ids)) < len(ids):
                signature.append(tuple(ids.index(i) for i in ids))
        if info.dynamic_output:  # the inputs do not determine the output sizes, so the price also keys on them
            signature.append(_describe(out, []))
        keys = [_storage_key(tensor) for tensor in tensors]
        weights = self.weight_bytes
        is_weight = tuple([key in weights for key in keys])
        price_key: Any = (func, tuple(signature), is_weight)
        try:
            price = self.prices[price_key]
        except KeyError:
            price = self.prices[price_key] = _price(info, args, kwargs, out, tensors, is_weight)
        except TypeError:  # an unhashable argument: key on its text instead
            price_key = repr(price_key)
            price = self.prices.get(price_key)
            if price is None:
                price = self.prices[price_key] = _price(info, args, kwargs, out, tensors, is_weight)
        slot = (price_key, self.where)
        self.tally[slot] = self.tally.get(slot, 0) + 1
        for read in price.weight_reads:
            offset = -1 if read.view is None else tensors[read.index].storage_offset()
            view = (keys[read.index], offset, read.view)
            if read.nbytes > self.weight_views.get(view, 0):
                self.weight_views[view] = read.nbytes
        if self.tracking:
            self._track_outputs(out, keys, price.outputs)

    def _track_outputs(self, out: Any, input_keys: list[int | None], results: int | None) -> None:
        """Start tracking every storage this call allocated (not an input's, not a weight's, not already tracked)."""
        for tensor in list(_tensors_in(out))[:results]:
            key = _storage_key(tensor)
            if key is None or key in self.live or key in input_keys or key in self.weight_bytes:
                continue
            storage = tensor.untyped_storage()
            nbytes = storage.nbytes()
            fp16 = nbytes // tensor.element_size() * 2 if tensor.is_floating_point() else nbytes
            self.live[key] = (weakref.ref(storage, functools.partial(self._release, key)), nbytes, fp16)
            self.live_bytes += nbytes
            self.live_bytes_fp16 += fp16
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self.peak_bytes_fp16 = max(self.peak_bytes_fp16, self.live_bytes_fp16)

    def _release(self, key: int, _ref: weakref.ref) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.live_bytes -= entry[1]
            self.live_bytes_fp16 -= entry[2]

    def stop_tracking(self) -> None:
        """End of the forward pass: the peak is final; drop the weak references (their callbacks die with them)."""
        self.tracking = False
        self.live.clear()


# -- the modes ---------------------------------------------------------------------------------------------------------


class _CountingMode(TorchDispatchMode):
    """Runs every aten op for real and hands it to the ledger; turns meta's data-dependence failures into advice."""

    def __init__(self, ledger: _Ledger, on_meta: bool) -> None:
        super().__init__()
        self.ledger = ledger
        self.on_meta = on_meta

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as error:
            if self.on_meta and "meta" in str(error).lower():
                raise _meta_error(str(func), error) from error
            raise
        if not self.ledger.paused:
            self.ledger.record(func, args, kwargs, out)
        return out


def _meta_error(op: str, error: BaseException) -> CountingError:
    return CountingError(
        f"cannot count {op} on the meta device: its result depends on tensor values (.item(), nonzero, boolean "
        f"masks, unique, ...), and meta tensors have none. Count this model on a real device instead (e.g. build it "
        f"and its inputs on 'cpu', with small inputs if memory is short). Underlying error: {error}"
    )


class _CpuAttentionOnMeta(TorchFunctionMode):
    """On meta, run attention through the kernels the CPU backend would select.

    Why: meta tensors always take SDPA's unfused math path (a score matrix written and read back) and
    nn.MultiheadAttention's unfused path (its fast path accepts only cpu/cuda tensors), so without this a meta count
    would differ from the CPU count in bytes, other FLOPs and activation memory. Only pushed on meta: any active
    TorchFunctionMode disables nn.MultiheadAttention's fast path, which the CPU count must see.
    """

    def __init__(self, ledger: _Ledger) -> None:
        super().__init__()
        self.ledger = ledger
        self.hooks: list[torch.utils.hooks.RemovableHandle] = []
        #: The nn.TransformerEncoderLayers given a forward that takes the fused path where the CPU backend would.
        self.layers: list[torch.nn.TransformerEncoderLayer] = []
        #: The nn.MultiheadAttention whose running forward the CPU backend would send down its fused fast path.
        self.fused: torch.nn.MultiheadAttention | None = None

    def __enter__(self) -> Self:
        self.layers = [  # before rpx's own hooks, which would rule the fast path out
            layer
            for layer in self.ledger.model.modules()
            if type(layer).forward is torch.nn.TransformerEncoderLayer.forward
            and "forward" not in vars(layer)
            and not any(m._forward_hooks or m._forward_pre_hooks for m in layer.modules())
        ]
        for layer in self.layers:
            layer.forward = functools.partial(_encoder_layer_on_meta, layer)
        self.hooks = [
            module.register_forward_pre_hook(self._decide_fusion, with_kwargs=True)
            for module in self.ledger.model.modules()
            if type(module).forward is torch.nn.MultiheadAttention.forward
        ]
        return super().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        for hook in self.hooks:
            hook.remove()
        for layer in self.layers:
            del layer.forward
        super().__exit__(*exc_info)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        if func is F.multi_head_attention_forward and self.fused is not None:
            module, self.fused = self.fused, None
            return _fused_multi_head_attention(module, *args, **kwargs)
        return func(*args, **kwargs)

    def _decide_fusion(self, module: torch.nn.MultiheadAttention, args: tuple[Any, ...], kwargs: Any) -> None:
        """Forward pre-hook: the fast path's conditions need the call's own arguments (a float mask rules it out)."""
        arguments = _MHA_FORWARD.bind(module, *args, **kwargs).arguments
        del arguments["self"]
        with self.ledger.pause():
            self.fused = module if _cpu_takes_mha_fast_path(module, **arguments) else None

    def _attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        flash = query.is_meta and self._cpu_picks_flash(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
        if not flash:
            return F.scaled_dot_product_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as the CPU path converts a boolean mask
            options = {"dtype": query.dtype, "device": query.device}
            attn_mask = torch.where(
                attn_mask, torch.scalar_tensor(0.0, **options), torch.scalar_tensor(float("-inf"), **options)
            )
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )[0]

    def _cpu_picks_flash(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
    ) -> bool:
        """Ask the CPU backend's own selector, on data-free CPU stand-ins of the same shapes, dtypes and strides."""
        with self.ledger.pause():
            stand_ins = [None if t is None else _cpu_stand_in(t) for t in (query, key, value, attn_mask)]
            try:
                choice = torch.ops.aten._fused_sdp_choice(
                    *stand_ins, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
                )
            except RuntimeError:  # invalid inputs: let F.scaled_dot_product_attention raise its own error
                return False
        return choice == int(SDPBackend.FLASH_ATTENTION)


_MHA_FORWARD = inspect.signature(torch.nn.MultiheadAttention.forward)
_MHA_FUNCTIONAL = inspect.signature(F.multi_head_attention_forward)


def _cpu_takes_mha_fast_path(
    module: torch.nn.MultiheadAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    **_options: Any,
) -> bool:
    """nn.MultiheadAttention.forward's fast-path conditions (torch 2.13), the device taken to be the CPU."""
    weights = (module.in_proj_weight, module.in_proj_bias, module.out_proj.weight, module.out_proj.bias)
    tensors = [t for t in (query, *weights) if t is not None]
    return (
        torch.backends.mha.get_fastpath_enabled()
        and query.dim() == 3
        and query is key is value
        and not any(mask is not None and mask.is_floating_point() for mask in (attn_mask, key_padding_mask))
        and module.in_proj_weight is not None
        and module.in_proj_bias is not None
        and query.dtype == module.in_proj_weight.dtype == module.in_proj_bias.dtype
        and not module.training
        and module.num_heads % 2 == 0
        and module.batch_first
        and module.bias_k is None
        and module.bias_v is None
        and not module.add_zero_attn
        and module._qkv_same_embed_dim
        and not torch.is_autocast_enabled()
        and all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)  # no __torch_function__ subclass
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    )


def _fused_multi_head_attention(
    module: torch.nn.MultiheadAttention, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run what the fast path runs, from the F.multi_head_attention_forward call of the unfused path: that call gets
    the input transposed to (seq, batch, embed) and the masks already converted to float, and returns the same."""
    call = _MHA_FUNCTIONAL.bind(*args, **kwargs)
    call.apply_defaults()
    arguments = call.arguments
    source = arguments["query"].transpose(1, 0)  # the module's own (batch, seq, embed) input: query is key is value
    mask, mask_type = module.merge_masks(arguments["attn_mask"], arguments["key_padding_mask"], source)
    output, weights = torch._native_multi_head_attention(
        source, source, source, module.embed_dim, module.num_heads, module.in_proj_weight, module.in_proj_bias,
        module.out_proj.weight, module.out_proj.bias, mask, arguments["need_weights"],
        arguments["average_attn_weights"], mask_type,
    )
    return output.transpose(1, 0), weights


_ENCODER_LAYER_FORWARD = inspect.signature(torch.nn.TransformerEncoderLayer.forward)


def _encoder_layer_on_meta(layer: torch.nn.TransformerEncoderLayer, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The layer's forward on meta: what its fast path runs (mask conversion, then the fused op) where the CPU backend
    would take it, else its own forward. Why not a pre-hook and a rerouted call, as for MHA: the layer's unfused path
    runs ops itself before it makes any call this mode could replace."""
    arguments = _ENCODER_LAYER_FORWARD.bind(layer, *args, **kwargs).arguments
    src, src_mask, padding = (arguments.get(name) for name in ("src", "src_mask", "src_key_padding_mask"))
    if not _cpu_takes_encoder_layer_fast_path(layer, src):
        return type(layer).forward(layer, *args, **kwargs)
    padding = F._canonical_mask(
        mask=padding, mask_name="src_key_padding_mask", other_type=F._none_or_dtype(src_mask),
        other_name="src_mask", target_type=src.dtype,
    )
    src_mask = F._canonical_mask(
        mask=src_mask, mask_name="src_mask", other_type=None, other_name="", target_type=src.dtype, check_other=False
    )
    mask, mask_type = layer.self_attn.merge_masks(src_mask, padding, src)
    attention = layer.self_attn
    return torch._transformer_encoder_layer_fwd(
        src, attention.embed_dim, attention.num_heads, attention.in_proj_weight, attention.in_proj_bias,
        attention.out_proj.weight, attention.out_proj.bias, layer.activation_relu_or_gelu == 2, layer.norm_first,
        layer.norm1.eps, layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias,
        layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias, mask, mask_type,
    )


def _cpu_takes_encoder_layer_fast_path(layer: torch.nn.TransformerEncoderLayer, src: torch.Tensor) -> bool:
    """nn.TransformerEncoderLayer.forward's fast-path conditions (torch 2.13), the device taken to be the CPU; its
    no-hooks condition is checked when counting starts (rpx's own hooks would fail it)."""
    attention = layer.self_attn
    weights = (attention.in_proj_weight, attention.in_proj_bias, attention.out_proj.weight, attention.out_proj.bias)
    weights += tuple(p for m in (layer.norm1, layer.norm2, layer.linear1, layer.linear2) for p in (m.weight, m.bias))
    return (
        torch.backends.mha.get_fastpath_enabled()
        and src.dim() == 3
        and not layer.training
        and attention.batch_first
        and attention._qkv_same_embed_dim
        and bool(layer.activation_relu_or_gelu)
        and layer.norm1.eps == layer.norm2.eps
        and attention.num_heads % 2 == 0
        and not torch.is_autocast_enabled()
        and all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in (src, *weights))  # no bias=False, no subclass
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (src, *weights)))
    )


def _cpu_stand_in(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of the same shape, dtype and last-dimension stride, backed by a single row of memory."""
    if tensor.dim() == 0 or tensor.numel() == 0:
        return torch.empty(tensor.shape, dtype=tensor.dtype)
    last = tensor.stride(-1)
    row = torch.empty((tensor.shape[-1] - 1) * last + 1, dtype=tensor.dtype)
    return row.as_strided(tensor.shape, (0,) * (tensor.dim() - 1) + (last,))


# -- public API --------------------------------------------------------------------------------------------------------

Model = TypeVar("Model", bound=torch.nn.Module)


def build_on_meta(factory: Callable[..., Model], **kwargs: Any) -> Model:
    """Build a module on the meta device: parameters have shapes and dtypes but no storage, so any size fits."""
    with torch.device("meta"):
        return factory(**kwargs)


def count_model(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    backward: bool = False,
    top_k: int | None = 20,
    module_depth: int = 3,
) -> CountReport:
    """Run ONE real pass of ``model(*args, **kwargs)`` and count its FLOPs, bytes and activation memory.

    The forward runs in the caller's grad mode (so ``torch.no_grad()`` or ``model.eval()`` decide which kernels run);
    with ``backward=True`` it runs with grad enabled and is followed by a backward pass from the sum of the floating
    outputs that require grad (gradient of ones; parameter ``.grad`` fields are left untouched).

    ``top_k`` bounds ``by_operator`` and ``by_module`` to the largest entries (by FLOPs, then bytes), the rest folded
    into one "(others)" entry so sums stay exact; None lists all. Module paths deeper than ``module_depth`` components
    are folded into their ancestor. Operator records (``op_records``) are never truncated.

    Raises CountingError when an op cannot run on meta (data-dependent) or backward has nothing to differentiate.
    """
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if module_depth < 1:
        raise ValueError(f"module_depth must be >= 1, got {module_depth}")
    kwargs = kwargs or {}
    device = _device_of(model, args, kwargs)
    ledger = _Ledger(model)
    on_meta = device == "meta"
    with contextlib.ExitStack() as stack:
        if backward:
            stack.enter_context(torch.enable_grad())
        stack.enter_context(ledger.module_hooks())
        stack.enter_context(_CountingMode(ledger, on_meta))
        if on_meta:
            stack.enter_context(_CpuAttentionOnMeta(ledger))
        outputs = _forward(model, args, kwargs, on_meta)
        ledger.stop_tracking()
        if backward:
            _backward(ledger, model, args, kwargs, outputs)
    return _summarise(ledger, args, kwargs, outputs, backward=backward, device=device, top_k=top_k, depth=module_depth)


def _device_of(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Device type of the first input tensor, else of the first parameter or buffer."""
    for value in (*tree_leaves((args, kwargs)), *model.parameters(), *model.buffers()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


def _forward(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], on_meta: bool) -> Any:
    try:
        return model(*args, **kwargs)
    except CountingError:
        raise
    except (RuntimeError, NotImplementedError) as error:  # e.g. Tensor.tolist() reads data outside aten dispatch
        if on_meta and "meta" in str(error).lower():
            raise _meta_error("an operation outside aten dispatch", error) from error
        raise


def _backward(
    ledger: _Ledger, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: Any
) -> None:
    """Backward from the sum of the outputs that require grad, into trainable parameters and grad-requiring inputs.

    torch.autograd.grad rather than .backward(): the gradients are computed (and counted) but never stored in the
    user's ``.grad`` fields.
    """
    roots = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    targets = [p for p in model.parameters() if p.requires_grad]
    targets += [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not roots or not targets:
        raise CountingError(
            "backward=True, but nothing to differentiate: no model output requires grad, or no parameter/input does "
            "(are all parameters frozen?)"
        )
    with ledger.pause():
        seeds = [torch.ones_like(root) for root in roots]
    ledger.start_backward()
    torch.autograd.grad(roots, targets, seeds, allow_unused=True)


# -- from the ledger to results ----------------------------------------------------------------------------------------

_LIST_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


class _Totals:
    """Running sums of one group of calls (an operator, a module, the whole pass)."""

    __slots__ = ("calls", "matrix_flops", "other_flops", "bytes_read", "bytes_written")

    def __init__(self) -> None:
        self.calls = self.matrix_flops = self.other_flops = self.bytes_read = self.bytes_written = 0

    def add(self, price: _Price, count: int) -> None:
        self.calls += count
        self.matrix_flops += 2 * price.macs * count
        self.other_flops += price.other_flops * count
        self.bytes_read += (price.weight_read + price.activation_read) * count
        self.bytes_written += price.written * count

    def merge(self, other: _Totals) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @classmethod
    def of(cls, parts: list[_Totals]) -> _Totals:
        """The sum of ``parts`` (the "(others)" entry of a top-k breakdown)."""
        total = cls()
        for part in parts:
            total.merge(part)
        return total

    @property
    def flops(self) -> int:
        return self.matrix_flops + self.other_flops

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def size(self) -> tuple[int, int]:
        return self.flops, self.bytes


def _summarise(
    ledger: _Ledger,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outputs: Any,
    *,
    backward: bool,
    device: str,
    top_k: int | None,
    depth: int,
) -> CountReport:
    total = _Totals()
    weight_read = 0
    by_operator: dict[str, _Totals] = defaultdict(_Totals)
    exclusive: dict[str, _Totals] = {}
    by_phase: dict[str, int] = defaultdict(int)
    uncounted: dict[str, int] = defaultdict(int)
    for (price_key, (path, phase)), count in ledger.tally.items():
        price = ledger.prices[price_key]
        total.add(price, count)
        weight_read += price.weight_read * count
        by_operator[price.label].add(price, count)
        module = path if phase == _BACKWARD else ".".join(path.split(".")[:depth])
        for ancestor in _ancestors(module):
            exclusive.setdefault(ancestor, _Totals())
        exclusive[module].add(price, count)
        by_phase[phase] += (2 * price.macs + price.other_flops) * count
        if not price.counted:
            uncounted[price.label] += count
    flops = FlopsResult(
        matrix_flops=total.matrix_flops,
        other_flops=total.other_flops,
        total_flops=total.flops,
        macs=total.matrix_flops // 2,
        by_operator=_operator_stats(by_operator, top_k),
        by_module=_module_stats(exclusive, ledger.module_calls, top_k),
        by_phase=dict(by_phase),
        uncounted_ops=dict(sorted(uncounted.items(), key=lambda item: -item[1])),
        causal_mask_convention=CAUSAL_MASK_CONVENTION,
        other_flops_convention=other_flops_convention(),
        backward=backward,
        counted_on=device,
        module_depth=depth,
        top_k=top_k,
        counted_inputs=_input_descriptions(args, kwargs),
    )
    return CountReport(flops=flops, traffic=_traffic(ledger, total, weight_read, args, kwargs, outputs, backward))


def _input_descriptions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
    """Each input tensor as "int64[1,2048]", positional then keyword ("mask=bool[1,2048]"): which pass was counted."""
    positional = [_short(value) for value in tree_leaves(args) if isinstance(value, torch.Tensor)]
    keyword = [
        f"{name}={_short(value)}"
        for name, tree in kwargs.items()
        for value in tree_leaves(tree)
        if isinstance(value, torch.Tensor)
    ]
    return (*positional, *keyword)


def _ancestors(path: str) -> list[str]:
    """``path`` and every module above it, outermost first: "a.b" -> ["", "a", "a.b"]; pseudo-paths stand alone."""
    if path == BACKWARD_MODULE:
        return [path]
    if not path:
        return [""]
    parts = path.split(".")
    return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


def _operator_stats(totals: dict[str, _Totals], top_k: int | None) -> dict[str, OperatorStats]:
    ranked = dict(sorted(totals.items(), key=lambda item: item[1].size(), reverse=True))
    return {
        name: OperatorStats(t.calls, t.matrix_flops, t.other_flops, t.bytes_read, t.bytes_written)
        for name, t in _largest(ranked, top_k).items()
    }


def _module_stats(exclusive: dict[str, _Totals], calls: dict[str, int], top_k: int | None) -> dict[str, ModuleStats]:
    inclusive: dict[str, _Totals] = defaultdict(_Totals)
    for path, totals in exclusive.items():
        for ancestor in _ancestors(path):
            inclusive[ancestor].merge(totals)
    limited = _largest(exclusive, top_k)
    if OTHERS in limited:
        inclusive[OTHERS] = limited[OTHERS]
    return {
        (path or ROOT_MODULE): ModuleStats(
            calls=calls.get(path, 0),
            exclusive_matrix_flops=t.matrix_flops,
            exclusive_other_flops=t.other_flops,
            exclusive_bytes_read=t.bytes_read,
            exclusive_bytes_written=t.bytes_written,
            inclusive_flops=inclusive[path].flops,
            inclusive_bytes=inclusive[path].bytes,
        )
        for path, t in limited.items()
    }


def _largest(entries: dict[str, _Totals], top_k: int | None) -> dict[str, _Totals]:
    """The ``top_k`` largest entries (by FLOPs, then bytes) in their order, the rest summed into "(others)"."""
    return fold_largest(entries, top_k, key=_Totals.size, merge=_Totals.of)


def _op_records(ledger: _Ledger) -> tuple[OpRecord, ...]:
    """Identical calls merged; a record merging several layers names them with list indices as "*"."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    for (price_key, (path, phase)), count in ledger.tally.items():
        price = ledger.prices[price_key]
        flops = 2 * price.macs + price.other_flops
        read = price.weight_read + price.activation_read
        if flops == 0 and read == 0 and price.written == 0:
            continue
        module = path or ROOT_MODULE
        key = (price.label, phase, price.inputs, price.macs, flops, read, price.written, _LIST_INDEX.sub("*", module))
        entry = merged.setdefault(key, [0, set()])
        entry[0] += count
        entry[1].add(module)
    records = [
        OpRecord(
            op=label,
            module=next(iter(modules)) if len(modules) == 1 else pattern,
            count=count,
            flops=flops,
            macs=macs,
            bytes_read=read,
            bytes_written=written,
            phase=phase,
            inputs=inputs,
        )
        for (label, phase, inputs, macs, flops, read, written, pattern), (count, modules) in merged.items()
    ]
    records.sort(key=lambda r: r.count * (r.bytes_read + r.bytes_written), reverse=True)
    return tuple(records)


def _unique_bytes(tree: Any, counted: set[Any] | None = None) -> int:
    """Bytes of the tensors in ``tree``, each storage once (at the largest extent seen in it), skipping storages in
    ``counted`` and adding the new ones to it, so a storage is counted once across weights, inputs and outputs."""
    counted = set() if counted is None else counted
    extents: dict[Any, int] = {}
    for value in tree_leaves(tree):
        if isinstance(value, torch.Tensor):
            key = _storage_key(value) or id(value)
            if key not in counted:
                extents[key] = max(extents.get(key, 0), _extent_bytes(value))
    counted.update(extents)
    return sum(extents.values())


def _traffic(
    ledger: _Ledger,
    total: _Totals,
    weight_read: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outputs: Any,
    backward: bool,
) -> TrafficResult:
    read_per_storage: dict[int, int] = defaultdict(int)
    for (key, _offset, _view), nbytes in ledger.weight_views.items():
        read_per_storage[key] += nbytes
    weight_bytes = sum(min(ledger.weight_bytes[key], nbytes) for key, nbytes in read_per_storage.items())
    counted = set(ledger.weight_bytes)  # a storage is counted once: as a weight, else as an input, else as an output
    input_bytes = _unique_bytes((args, kwargs), counted)
    output_bytes = _unique_bytes(outputs, counted)
    gradient_bytes = _unique_bytes([p for p in ledger.model.parameters() if p.requires_grad]) if backward else None
    fused = weight_bytes + input_bytes + output_bytes + (gradient_bytes or 0)
    return TrafficResult(
        unfused_bytes=total.bytes,
        unfused_weight_read_bytes=weight_read,
        unfused_activation_read_bytes=total.bytes_read - weight_read,
        unfused_written_bytes=total.bytes_written,
        fused_bytes=fused,
        weight_bytes=weight_bytes,
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        activation_peak_bytes=ledger.peak_bytes,
        activation_peak_bytes_fp16=ledger.peak_bytes_fp16,
        assumptions=TRAFFIC_ASSUMPTIONS,
        op_records=_op_records(ledger),
        gradient_bytes=gradient_bytes,
        arithmetic_intensity_unfused=total.flops / total.bytes if total.bytes else None,
        arithmetic_intensity_fused=total.flops / fused if fused else None,
    )


TRAFFIC_ASSUMPTIONS = (
    "bytes = element size x elements at each tensor's real dtype; a broadcast (stride-0) dimension is read once",
    "unfused: every operator reads each input tensor (a tensor passed twice once) and writes each output once; "
    "views and aliases (schema-declared, plus aten._unsafe_view) move nothing; in-place and out= operators write "
    "their destination, copy_ does not read it; empty allocations write nothing; fills (zeros, arange, random) "
    "write their output; batch norm in inference writes only its output (not placeholder statistics)",
    "gathers (embedding, index_select, gather, index) read only the rows they return, plus the indices",
    "fused: each parameter/buffer storage counted once (shared/tied weights once), at the bytes of the distinct "
    "views the pass read from it (a slice only its extent, a gather the most rows one gather returned), at most its "
    "size; plus each model input and output storage once, a storage shared by weights, inputs and outputs only once "
    "(an output that is an input, as nn.Identity returns, adds nothing); plus the parameter gradients once with "
    "backward",
    "activation memory: storages allocated by operators during the forward pass (including the outputs and "
    "auxiliary outputs such as pooling indices or attention log-sum-exp), excluding parameters, buffers and model "
    "inputs; each live from its op until its last reference dies (tracked by weak references to storages); "
    "workspace inside a kernel and allocator caching are not included",
    "with grad enabled, tensors saved for backward stay alive, so the activation peak is the training-time figure; "
    "under no_grad it is the inference figure",
    "on meta, F.scaled_dot_product_attention runs the kernel the CPU backend selects, and nn.MultiheadAttention and "
    "nn.TransformerEncoderLayer their fused paths when the CPU backend would take them (meta alone would take the "
    "unfused paths), so meta and CPU counts agree",
    "the exception: the attention inside nn.MultiheadAttention's unfused path without returned weights (grad "
    "enabled or training; every nn.TransformerEncoderLayer's self-attention then) runs SDPA's math path on meta, as "
    "rpx cannot reroute a call nested in F.multi_head_attention_forward: matrix FLOPs agree, but meta adds 1 other "
    "FLOP per query and per key element (their scaling) and moves more bytes",
    "nn.MultiheadAttention's and nn.TransformerEncoderLayer's fused inference paths (eval + no_grad; see torch's "
    "fast-path conditions) move fewer bytes than their unfused paths, which grad-enabled and training runs take; "
    "FLOPs are the same",
    "nn.TransformerEncoder with src_key_padding_mask on its fast path runs nested tensors, which rpx cannot count: "
    "on CPU the count fails with torch's 'NestedTensorImpl doesn't support sizes', on meta with a CountingError (the "
    "nesting depends on the mask's values); pass enable_nested_tensor=False to count it",
)
