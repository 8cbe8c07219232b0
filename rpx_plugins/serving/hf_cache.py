"""A Hugging Face decoder's KV cache and the keyword arguments of one step against it: everything that depends on the
transformers version lives here.

The cache is transformers' ``StaticCache`` of exactly the step's length: preallocated, written in place at the new
tokens' positions, read over every position (as serving engines' paged caches are), so a step's traffic and its
activation peak carry no copy of the cache, and the same step can be timed again and again. transformers 5 names the
forward's argument ``cache`` (``past_key_values`` before) and allocates the cache's tensors on its first update;
transformers 4 preallocates them and places new tokens by ``cache_position``. Imports torch: import it lazily.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rpx_core.plugin import NotApplicable
from rpx_plugins.torch.counter.containers import tensors_within

#: The forward's KV-cache argument, newest name first.
CACHE_ARGUMENTS = ("cache", "past_key_values")
#: The forward's argument asking for the last positions' logits only, newest name first.
LOGITS_ARGUMENTS = ("logits_to_keep", "num_logits_to_keep")


def forward_parameters(model: Any) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def cache_argument(model: Any, name: str) -> str:
    """The forward's KV-cache argument; NotApplicable for a model that takes none (not a decoder with a cache)."""
    parameters = forward_parameters(model)
    for argument in CACHE_ARGUMENTS:
        if argument in parameters and "use_cache" in parameters and hasattr(model, "config"):
            return argument
    raise NotApplicable(f"model {name!r} ({type(model).__name__}) takes no KV cache in Hugging Face's convention (a "
                        "`cache` or `past_key_values` argument with `use_cache`, and a `config`): serving stages "
                        "profile decoders such as hf: causal language models")


def static_cache(model: Any, batch: int, length: int, dtype: torch.dtype, device: str) -> Any:
    """An empty ``StaticCache`` of ``length`` positions for ``batch`` sequences (tensors allocated now with
    transformers 4, on the first step with transformers 5)."""
    from transformers import StaticCache

    parameters = inspect.signature(StaticCache.__init__).parameters
    if "max_batch_size" in parameters:  # transformers 4: preallocated
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=length, device=device, dtype=dtype)
    with torch.device(device):  # its position counters live beside the tensors they index
        return StaticCache(config=model.config, max_cache_len=length)


def step_arguments(model: Any, argument: str, cache: Any, token_ids: torch.Tensor, start: int) -> dict[str, Any]:
    """Keyword arguments of one step: ``token_ids`` (batch x new tokens) at positions ``start`` on, against ``cache``,
    asking for the last position's logits only where the model can (as generation and serving engines do)."""
    batch, tokens = token_ids.shape
    positions = torch.arange(start, start + tokens, device=token_ids.device)
    arguments = {"input_ids": token_ids, "position_ids": positions.expand(batch, tokens), "use_cache": True,
                 argument: cache}
    parameters = forward_parameters(model)
    if "cache_position" in parameters:  # transformers 4 writes the new tokens where this says
        arguments["cache_position"] = positions
    for name in LOGITS_ARGUMENTS:
        if name in parameters:
            arguments[name] = 1
            break
    return arguments


def rewind(cache: Any, tokens: int) -> None:
    """Take back the last ``tokens`` positions a step added, so the same step can run again against the same cache
    (transformers 5 counts positions per layer; transformers 4 writes where ``cache_position`` says)."""
    layers = getattr(cache, "layers", ())
    if any(hasattr(layer, "cumulative_length") for layer in layers):
        cache.crop(-tokens)


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The floating tensors the cache holds (keys and values; not its integer position counters)."""
    return [tensor for tensor in tensors_within(cache) if tensor.is_floating_point()]


def positions_per_tensor(tensor: torch.Tensor) -> int:
    """Positions a cache tensor holds: Hugging Face caches are [batch, heads, positions, head_dim]."""
    return tensor.shape[-2]
