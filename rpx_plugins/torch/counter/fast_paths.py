"""Fast-path mimicry on meta: run attention the way torch's CPU backend would, so meta counts equal CPU counts.

Meta tensors always take SDPA's unfused math path and nn.MultiheadAttention's / nn.TransformerEncoderLayer's unfused
paths (their fast paths accept only cpu/cuda tensors). The CPU backend takes ``_scaled_dot_product_flash_attention_for_cpu``
and, in eval under no_grad, the fused ``_native_multi_head_attention`` and ``_transformer_encoder_layer_fwd``. This
module reproduces those choices: SDPA by asking the CPU backend's own selector on data-free stand-ins, the module
fast paths by their conditions as torch 2.13 writes them (re-check them when torch changes: they are copied, not
imported, because torch evaluates them inline in ``forward``).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Self

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from rpx_plugins.torch.counter.ledger import Ledger


class CpuAttentionOnMeta(TorchFunctionMode):
    """On meta, run attention through the kernels the CPU backend would select.

    Why: meta tensors always take SDPA's unfused math path (a score matrix written and read back) and
    nn.MultiheadAttention's unfused path (its fast path accepts only cpu/cuda tensors), so without this a meta count
    would differ from the CPU count in bytes, other FLOPs and activation memory. Only pushed on meta: any active
    TorchFunctionMode disables nn.MultiheadAttention's fast path, which the CPU count must see.
    """

    def __init__(self, ledger: Ledger) -> None:
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
