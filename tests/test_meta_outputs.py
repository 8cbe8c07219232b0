"""Remembered meta outputs: a count that makes an operator's outputs from an earlier identical call gives exactly the
figures of running every meta kernel, and views, in-place ops and random ops always run."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from torch import nn

from rpx_plugins.torch import zoo
from rpx_plugins.torch.counter import build_on_meta, count_model
from rpx_plugins.torch.counter.meta_outputs import MetaOutputs


def every_kernel_run(self: MetaOutputs, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


def hf_bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    return transformers.BertModel(transformers.BertConfig(num_hidden_layers=3, hidden_size=64, intermediate_size=128,
                                                          num_attention_heads=4))


def hf_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4))


TOKENS = lambda: (torch.zeros(2, 16, dtype=torch.int64, device="meta"),)  # noqa: E731
IMAGES = lambda: (torch.zeros(2, 3, 64, 64, device="meta"),)  # noqa: E731
CASES = {
    "llama": (lambda: zoo.llama(preset="tiny", n_layers=4), TOKENS),
    "transformer": (zoo.tiny_transformer, TOKENS),
    "resnet50": (zoo.resnet50, IMAGES),
    "mha": (zoo.mha_block, lambda: (torch.zeros(2, 8, 32, device="meta"),)),
    "bert": (hf_bert, TOKENS),
    "gpt2": (hf_gpt2, TOKENS),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_remembered_outputs_give_the_figures_of_running_every_meta_kernel(name, mode, monkeypatch) -> None:
    build, inputs = CASES[name]
    model = build_on_meta(build).train(mode == "train")
    options = {"top_k": None, "module_depth": 8, "replay_repeats": False}
    with torch.no_grad():
        remembered = count_model(model, inputs(), **options)
        monkeypatch.setattr(MetaOutputs, "call", every_kernel_run)
        run = count_model(model, inputs(), **options)
    assert attrs.asdict(remembered.flops) == attrs.asdict(run.flops)
    assert attrs.asdict(remembered.traffic) == attrs.asdict(run.traffic)


def test_only_fresh_outputs_of_functional_operators_are_remembered() -> None:
    remembered = MetaOutputs()
    x = torch.zeros(4, 8, device="meta")
    aten = torch.ops.aten
    for _ in range(2):
        remembered.call(aten.exp.default, (x,), {})  # functional: remembered
        remembered.call(aten._unsafe_view.default, (x, [8, 4]), {})  # a view its schema does not declare
        remembered.call(aten.add_.Tensor, (x, x), {})  # in place
        remembered.call(aten.bernoulli.default, (x,), {})  # random
        remembered.call(aten.t.default, (x,), {})  # a declared view
    assert [str(key[0]) for key, shapes in remembered.known.items() if shapes] == ["aten.exp.default"]
    made = remembered.call(aten.exp.default, (x,), {})
    assert made.is_meta and made.shape == (4, 8) and made.untyped_storage()._cdata != x.untyped_storage()._cdata
