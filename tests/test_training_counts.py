"""A whole training step is counted: forward + backward of BERT, GPT-2, a Llama config (Hugging Face transformers,
built from configs, no weights) and ResNet-50 (built from code) on the meta device lists no uncounted operator, and its
matrix FLOPs equal torch's FlopCounterMode on the same pass. Also: outputs inside the containers a model returns (a
Hugging Face ModelOutput holding a DynamicCache) are counted in the fused bytes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rpx_plugins.torch import zoo
from rpx_plugins.torch.counter import build_on_meta, count_model
from rpx_plugins.torch.counter.containers import tensors_within

transformers = pytest.importorskip("transformers")

SEQ = 64


def bert() -> torch.nn.Module:
    return transformers.BertModel(transformers.BertConfig())  # BERT-base: 12 layers, 768 wide, GELU, layer norm


def gpt2() -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config())  # GPT-2 small, tanh GELU, tied head


def llama() -> torch.nn.Module:
    """A small Llama: RMS norm, SwiGLU (SiLU), rotary embeddings, grouped-query attention (8 query, 2 KV heads)."""
    config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=32000)
    return transformers.LlamaForCausalLM(config)


MODELS = {"bert": bert, "gpt2": gpt2, "llama": llama, "resnet50": zoo.resnet50}


def inputs_for(name: str, model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    if name == "resnet50":
        return model.example_inputs(batch=2)
    return (torch.zeros(2, SEQ, dtype=torch.long, device="meta"),)


def flop_counter_mode_training_step(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    """FlopCounterMode's FLOPs for the same pass rpx counts: forward, then the gradient of every output that
    requires grad (a gradient of ones) into the parameters."""
    with FlopCounterMode(display=False) as reference:
        outputs = model(*inputs)
        roots = [t for t in tensors_within(outputs) if t.requires_grad]
        params = [p for p in model.parameters() if p.requires_grad]
        torch.autograd.grad(roots, params, [torch.ones_like(t) for t in roots], allow_unused=True)
    return reference.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_training_step_lists_no_uncounted_op_and_matrix_flops_equal_flop_counter_mode(name: str) -> None:
    model = build_on_meta(MODELS[name]).eval()
    inputs = inputs_for(name, model)
    report = count_model(model, inputs, backward=True, top_k=None)
    assert report.flops.uncounted_ops == {}
    assert report.flops.by_phase["backward"] > report.flops.by_phase["forward"] > 0
    assert report.flops.matrix_flops == flop_counter_mode_training_step(model, inputs)


def test_resnet50_is_resnet50() -> None:
    """The ResNet-50 built from code has torchvision's parameter count and its 4.09 GMACs at 224x224."""
    from rpx_plugins.torch.params import count_parameters

    model = build_on_meta(zoo.resnet50).eval()
    assert count_parameters(model, "fp32").total == 25_557_032
    with torch.no_grad():
        assert count_model(model, model.example_inputs()).flops.macs == 4_089_184_256


# -- outputs inside containers -----------------------------------------------------------------------------------------


def test_a_returned_dynamic_cache_is_counted_in_the_output_bytes() -> None:
    layers, heads, width, vocab, batch, seq = 2, 4, 64, 100, 2, 5
    config = transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=vocab, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    tokens = torch.zeros(batch, seq, dtype=torch.long)
    with torch.no_grad():
        cached = count_model(model, (tokens,), {"use_cache": True})
        uncached = count_model(model, (tokens,), {"use_cache": False})
        output = model(tokens, use_cache=True)
    assert isinstance(output.past_key_values, transformers.DynamicCache)
    logits = batch * seq * vocab * 4  # float32
    cache = layers * 2 * batch * heads * seq * (width // heads) * 4  # a key and a value tensor per layer
    assert uncached.traffic.output_bytes == logits
    assert cached.traffic.output_bytes == logits + cache
    assert cached.traffic.fused_bytes - uncached.traffic.fused_bytes == cache


def test_tensors_are_found_in_any_container() -> None:
    import dataclasses

    import attrs

    @dataclasses.dataclass
    class Plain:
        a: torch.Tensor
        rest: list

    @attrs.frozen
    class Frozen:
        b: torch.Tensor

    class Holder:
        __slots__ = ("c",)

        def __init__(self, c: torch.Tensor) -> None:
            self.c = c

    t = [torch.zeros(n) for n in range(1, 7)]
    nested = (t[0], {"x": Plain(t[1], [Frozen(t[2]), Holder(t[3])])}, [t[4], (t[5],)], "text", None, 3)
    assert [x.numel() for x in tensors_within(nested)] == [1, 2, 3, 4, 5, 6]
    loop = [t[0]]
    loop.append(loop)  # a cycle is visited once
    assert len(tensors_within(loop)) == 1
