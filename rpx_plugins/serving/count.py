"""Serving steps counted on the meta device: the model's own forward against a real KV cache object of the step's
length, through rpx's counter (FLOPs, activation peak), and the step's memory traffic from what it touches (weights in
their served format, the cache, token ids and outputs). Imports torch: import it lazily.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rpx_core.plugin import BYTES_PER_ELEMENT, OpFormula
from rpx_core.types.serving import ServeStep
from rpx_plugins.serving.hf_cache import cache_tensors, positions_per_tensor, static_cache, step_arguments
from rpx_plugins.serving.weights import WeightLayout
from rpx_plugins.torch.counter import count_model
from rpx_plugins.torch.counter.containers import tensors_within
from rpx_plugins.torch.counter.meta_outputs import MetaOutputs
from rpx_plugins.torch.counter.pricing import storage_key
from rpx_plugins.torch.counts import element_sizes

KV_SCALE_BYTES = 4  # an fp8/int8 KV cache: one fp32 scale per cache tensor


@attrs.frozen
class StepShape:
    """What one counted step is: its phase, batch, new tokens per sequence and the cache's length."""

    phase: str  # "prefill" or "decode"
    batch: int
    tokens: int
    length: int  # positions in the cache, the new tokens' included


@attrs.frozen
class Formats:
    """How tensors are stored: activations at ``precision``, the KV cache in ``kv_cache`` (None: at ``precision``)."""

    precision: str
    kv_cache: str | None = None

    @property
    def kv_element_bytes(self) -> int:
        return BYTES_PER_ELEMENT[self.kv_cache or self.precision]

    def kv_scale_bytes(self, tensors: int) -> int:
        return tensors * KV_SCALE_BYTES if self.kv_cache else 0

    def bytes_of(self, tensor: torch.Tensor) -> int:
        """A tensor's bytes: floating elements at the precision, others at their own size."""
        size = BYTES_PER_ELEMENT[self.precision] if tensor.is_floating_point() else tensor.element_size()
        return tensor.numel() * size


class Remembered(TorchDispatchMode):
    """Runs meta operators, remembering each (operator, input shapes)'s outputs (the counter's MetaOutputs): an
    uncounted pass that costs what a counted one does rather than the meta kernels' own Python time."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs = MetaOutputs()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return self.outputs.call(func, args, kwargs or {})


def count_step(model: torch.nn.Module, argument: str, shape: StepShape, formats: Formats, weights: WeightLayout,
               formulas: Iterable[OpFormula], warm: Remembered) -> ServeStep:
    """One step of ``model`` (built on meta) counted against a ``StaticCache`` of ``shape.length`` positions. An
    uncounted pass first allocates the cache's tensors, so the counted pass finds them in place, as a served step does."""
    dtype = next(model.parameters()).dtype
    cache = static_cache(model, shape.batch, shape.length, dtype, "meta")
    token_ids = torch.zeros(shape.batch, shape.tokens, dtype=torch.long, device="meta")
    arguments = step_arguments(model, argument, cache, token_ids, start=shape.length - shape.tokens)
    with torch.no_grad():
        with warm:
            outputs = model(**arguments)
        report = count_model(model, (), arguments, top_k=1, formulas=formulas,
                             element_sizes=element_sizes(formats.precision))
    kv = cache_tensors(cache)
    kv_bytes = sum(tensor.numel() for tensor in kv) * formats.kv_element_bytes + formats.kv_scale_bytes(len(kv))
    written = sum(tensor.numel() // positions_per_tensor(tensor) * min(shape.tokens, positions_per_tensor(tensor))
                  for tensor in kv) * formats.kv_element_bytes
    weight_bytes = weights.read_bytes(rows=shape.batch * shape.tokens)
    io = io_bytes(arguments, outputs, cache, formats)
    flops = report.flops
    return ServeStep(
        phase=shape.phase,
        batch_size=shape.batch,
        new_tokens=shape.tokens,
        context=shape.length,
        flops=flops.total_flops,
        matrix_flops=flops.matrix_flops,
        macs=flops.macs,
        weight_bytes=weight_bytes,
        kv_read_bytes=kv_bytes,
        kv_written_bytes=written,
        io_bytes=io,
        bytes=weight_bytes + kv_bytes + written + io,
        kv_cache_bytes=kv_bytes,
        activation_peak_bytes=report.traffic.activation_peak_bytes,
        uncounted_ops=dict(flops.uncounted_ops),
    )


def io_bytes(arguments: dict[str, Any], outputs: Any, cache: Any, formats: Formats) -> int:
    """Token ids and positions in, and every output tensor that is not the cache's (the logits) out, each once."""
    cache_storages = {storage_key(tensor) for tensor in tensors_within(cache)}
    inputs = [value for value in arguments.values() if isinstance(value, torch.Tensor)]
    seen: set[Any] = set()
    total = 0
    for tensor in [*inputs, *tensors_within(outputs)]:
        key = storage_key(tensor)
        if key in cache_storages or key in seen:
            continue
        seen.add(key)
        total += formats.bytes_of(tensor)
    return total


def steps_to_count(prompt: int, contexts: tuple[int, ...], batch_sizes: tuple[int, ...]) -> list[StepShape]:
    """The prefill at every batch size, and the decode step at every context and batch size; with a single batch
    size the decode step is counted at the next one too (what fits and where decode turns compute-bound come from
    two batch sizes)."""
    decode_batches = batch_sizes if len(batch_sizes) > 1 else (*batch_sizes, batch_sizes[0] + 1)
    prefill = [StepShape("prefill", batch, prompt, prompt) for batch in batch_sizes]
    decode = [StepShape("decode", batch, 1, context) for context in contexts for batch in decode_batches]
    return prefill + decode


def kv_bytes_per_token(decode: list[ServeStep]) -> float:
    """KV-cache bytes per sequence per position, at the longest context counted (smallest batch there)."""
    longest = max(decode, key=lambda step: (step.context, -step.batch_size))
    return longest.kv_cache_bytes / (longest.batch_size * longest.context)
