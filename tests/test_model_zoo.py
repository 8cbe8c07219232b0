"""Built-in example models: documented inputs and outputs, presets, and the Llama-2-70B shape on meta (parameters, and
one counted pass at sequence 2048 within laptop memory)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from rpx_plugins.host_memory import HostPeakTracker
from rpx_plugins.torch import zoo as model_zoo
from rpx_plugins.torch.counter import build_on_meta, count_model
from rpx_plugins.torch.params import count_parameters


@pytest.mark.parametrize(
    ("factory", "batch", "input_dtype", "output_shape"),
    [
        (model_zoo.tiny_cnn, 2, torch.float32, (2, 10)),
        (model_zoo.tiny_transformer, 2, torch.int64, (2, 32, 256)),
        (model_zoo.mha_block, 2, torch.float32, (2, 8, 32)),
        (model_zoo.llama, 2, torch.int64, (2, 16, 128)),
    ],
)
def test_models_run_on_their_documented_inputs(
    factory: Callable[[], torch.nn.Module], batch: int, input_dtype: torch.dtype, output_shape: tuple[int, ...]
) -> None:
    model = factory().eval()
    (inputs,) = model.example_inputs(batch=batch)
    assert inputs.dtype == input_dtype and inputs.shape[0] == batch
    with torch.no_grad():
        output = model(inputs)
    assert tuple(output.shape) == output_shape
    assert torch.isfinite(output).all()


def test_meta_models_get_meta_inputs() -> None:
    model = build_on_meta(model_zoo.llama)
    (tokens,) = model.example_inputs(batch=1, seq_len=8)
    assert tokens.is_meta and tokens.dtype == torch.int64


def test_llama_rejects_sequences_longer_than_its_rotary_tables() -> None:
    model = model_zoo.llama()
    with pytest.raises(ValueError, match="max_seq"):
        model.example_inputs(seq_len=model.config.max_seq + 1)
    with pytest.raises(ValueError, match="unknown llama preset"):
        model_zoo.llama("llama2-700b")


def test_llama2_70b_preset_has_about_69b_parameters_on_meta() -> None:
    model = build_on_meta(model_zoo.llama, preset="llama2-70b")
    d, layers, heads, kv_heads, ffn, vocab = 8192, 80, 64, 8, 28672, 32000
    kv_dim = kv_heads * (d // heads)
    per_layer = 2 * d * d + 2 * d * kv_dim + 3 * d * ffn + 2 * d  # q, o; k, v; gate, up, down; two RMSNorms
    expected = 2 * vocab * d + layers * per_layer + d  # embedding, untied head, final norm
    result = count_parameters(model, "bf16")
    assert result.total == expected == 68_976_648_192
    rotary_tables = 2 * 4096 * (d // heads)  # cos and sin, shared by all layers
    assert result.buffers == rotary_tables
    assert result.bytes_at_precision == 2 * (expected + rotary_tables)


def test_llama2_70b_counts_on_meta_at_sequence_2048_with_hand_computed_macs_in_little_memory() -> None:
    layers, seq, d, heads, kv_heads, ffn, vocab = 80, 2048, 8192, 64, 8, 28672, 32000
    kv = kv_heads * (d // heads)
    memory = HostPeakTracker()
    memory.reset()
    model = build_on_meta(model_zoo.llama, preset="llama2-70b").eval()
    with torch.no_grad():
        report = count_model(model, model.example_inputs(batch=1, seq_len=seq))
    peak = memory.read().peak_bytes
    per_layer = (
        2 * seq * d * d  # q and o projections
        + 2 * seq * d * kv  # k and v projections (grouped-query: 8 key/value heads)
        + 3 * seq * d * ffn  # SwiGLU gate, up and down
        + 2 * seq * seq * d  # QK^T and PV over all 64 query heads, causal counted dense
    )
    assert report.flops.macs == layers * per_layer + seq * d * vocab == 146_222_161_592_320  # + the output head
    assert report.flops.counted_on == "meta" and report.flops.counted_inputs == ("int64[1,2048]",)
    assert peak < 1.5e9  # the whole process, torch included: no 138 GB of weights, no activations


def test_tiny_transformer_ties_its_output_head_to_the_embedding() -> None:
    model = model_zoo.tiny_transformer()
    assert model.head.weight is model.embed.weight
