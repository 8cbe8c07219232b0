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

The package, one concern per module: ``registry`` (how formulas are registered and found, plugins' included),
``formulas`` (every built-in formula, registered where it is defined), ``operators`` (the zero-FLOP kinds of operator
and what each schema says), ``pricing`` (one call's FLOPs and bytes), ``ledger`` (one pass's bookkeeping),
``fast_paths`` (torch-version-specific mimicry of CPU kernel choices on meta), ``containers`` (tensors inside whatever
a model returns), ``meta_outputs`` (outputs of identical meta calls made without their kernels), ``repeats``
(identical layers of a stack replayed from two agreeing traces), ``report`` (results), ``counting`` (the pass itself).

This package imports torch: import it lazily, inside a stage.
"""

from rpx_plugins.torch.counter.counting import CountingError, build_on_meta, count_model
from rpx_plugins.torch.counter.formulas import (
    ATTENTION_BACKWARD_CONVENTIONS,
    CAUSAL_MASK_CONVENTION,
    SOFTMAX_BACKWARD_FLOPS,
    SOFTMAX_FLOPS,
)
from rpx_plugins.torch.counter.registry import OpCall
from rpx_plugins.torch.counter.report import TRAFFIC_ASSUMPTIONS, CountReport

__all__ = [
    "ATTENTION_BACKWARD_CONVENTIONS",
    "CAUSAL_MASK_CONVENTION",
    "SOFTMAX_BACKWARD_FLOPS",
    "SOFTMAX_FLOPS",
    "TRAFFIC_ASSUMPTIONS",
    "CountReport",
    "CountingError",
    "OpCall",
    "build_on_meta",
    "count_model",
]
