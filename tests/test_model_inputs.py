"""Inputs for real models: an input_factory may return keyword arguments, positional inputs or both; an input table
may name a keyword argument; the spec check refuses names that cannot be keyword arguments. Hugging Face models from
configs (no weights): BERT taking input_ids and attention_mask by keyword, GPT-2 returning its DynamicCache."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import rpx_core as rpx
from rpx_core.loading import load_callable
from rpx_core.results.records import RunResult
from rpx_plugins.torch.backend import factory_inputs
from tests.conftest import rpx_cli

pytest.importorskip("transformers")

SEQ = 16

MODELS = """
import torch
import transformers

SEQ = 16


def bert():
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                     vocab_size=100, max_position_embeddings=32)
    return transformers.BertModel(config)


def bert_inputs(batch_size, device, dtype):
    tokens = torch.zeros(batch_size, SEQ, dtype=torch.long, device=device)
    mask = torch.ones_like(tokens)
    mask[:, -4:] = 0  # padding: the mask is applied (an all-ones mask is skipped)
    return {"input_ids": tokens, "attention_mask": mask}


def gpt2():
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=100, n_positions=32, bos_token_id=0,
                                     eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def gpt2_cached(batch_size, device, dtype):
    return {"input_ids": torch.zeros(batch_size, 5, dtype=torch.long, device=device), "use_cache": True}


def gpt2_uncached(batch_size, device, dtype):
    return (torch.zeros(batch_size, 5, dtype=torch.long, device=device),), {"use_cache": False}
"""

SPEC = """
stages = ["count_flops", "estimate_traffic"]

[[models]]
name = "bert-factory"
source = "models.py:bert"
input_factory = "models.py:bert_inputs"

[[models]]
name = "bert-tables"
source = "models.py:bert"
inputs = [{ name = "input_ids", shape = [1, 16], dtype = "int64", high = 100 },
          { name = "attention_mask", shape = [1, 16], dtype = "int64", high = 2 }]

[[models]]
name = "gpt2-cached"
source = "models.py:gpt2"
input_factory = "models.py:gpt2_cached"

[[models]]
name = "gpt2-uncached"
source = "models.py:gpt2"
input_factory = "models.py:gpt2_uncached"
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "models.py").write_text(textwrap.dedent(MODELS))
    (folder / "spec.toml").write_text(textwrap.dedent(SPEC))
    return folder


@pytest.fixture(scope="module")
def counted(folder: Path) -> RunResult:
    return rpx.run(folder / "spec.toml", output=None, execution={"isolation": "in-process"})


def test_bert_gets_keyword_inputs_from_a_factory_dict_and_from_named_tables(counted):
    factory, tables = (counted.model(name) for name in ("bert-factory", "bert-tables"))
    hidden, layers, inner = 64, 2, 128
    per_layer = 4 * SEQ * hidden * hidden + 2 * SEQ * hidden * inner + 2 * SEQ * SEQ * hidden  # Q K V O, FFN, QK^T PV
    pooler = hidden * hidden  # the first token's dense layer
    for result in (factory, tables):
        assert result.result("count_flops").macs == layers * per_layer + pooler
        assert result.result("estimate_traffic").input_bytes == 2 * SEQ * 8  # input_ids and attention_mask, int64
    assert factory.result("count_flops").total_flops == tables.result("count_flops").total_flops


def test_a_live_bert_in_training_mode_is_counted_like_the_specs_in_eval_mode(folder: Path, counted):
    model = load_callable(f"{folder / 'models.py'}:bert", what="bert")()
    assert model.training  # as transformers builds it
    inputs = [{"name": "input_ids", "shape": [1, SEQ], "dtype": "int64", "high": 100},
              {"name": "attention_mask", "shape": [1, SEQ], "dtype": "int64", "high": 2}]
    stages = ["count_flops"]
    live = rpx.profile(model, inputs=inputs, stages=stages).result("count_flops")
    trained = rpx.profile(model, inputs=inputs, stages=stages, options={"count_flops": {"mode": "train"}})
    assert live.total_flops == counted.model("bert-tables").result("count_flops").total_flops
    assert trained.result("count_flops").total_flops > live.total_flops  # dropout, when asked for
    assert model.training


def test_a_returned_dynamic_cache_is_an_output_through_a_factorys_keyword_arguments(counted):
    cached, uncached = (counted.model(name).result("estimate_traffic") for name in ("gpt2-cached", "gpt2-uncached"))
    logits = 5 * 100 * 4
    cache = 2 * 2 * 4 * 5 * (64 // 4) * 4  # a key and a value per layer: heads x tokens x head width, float32
    assert uncached.output_bytes == logits
    assert cached.output_bytes == logits + cache


def test_every_form_an_input_factory_may_return():
    x, y = torch.zeros(1), torch.ones(1)
    assert factory_inputs({"input_ids": x}) == ((), {"input_ids": x})
    assert factory_inputs(((x,), {"mask": y})) == ((x,), {"mask": y})
    assert factory_inputs([[x], {"mask": y}]) == ((x,), {"mask": y})
    assert factory_inputs((x, y)) == ((x, y), {})
    assert factory_inputs([x]) == ((x,), {})
    assert factory_inputs(x) == ((x,), {})


def test_names_that_cannot_be_keyword_arguments_and_inputs_beside_a_factory_are_refused(tmp_path):
    (tmp_path / "spec.toml").write_text(textwrap.dedent("""
        [[models]]
        name = "a"
        source = "torch.nn:Identity"
        inputs = [{ name = "attention mask", shape = [1, 4] }, { name = "x", shape = [1] }, { name = "x", shape = [1] },
                  { name = "class", shape = [1] }]

        [[models]]
        name = "b"
        source = "torch.nn:Identity"
        inputs = [{ shape = [1, 4] }]
        input_factory = "torch:zeros"
    """))
    done = rpx_cli("validate", str(tmp_path / "spec.toml"))
    assert done.returncode == 2
    where = f"rpx: error: {tmp_path / 'spec.toml'}"
    assert done.stderr.splitlines() == [
        f"{where}: models[0].inputs[0].name: 'attention mask' is not a keyword argument name (a Python identifier)",
        f"{where}: models[0].inputs[1].name: 'x' names more than one input",
        f"{where}: models[0].inputs[2].name: 'x' names more than one input",
        f"{where}: models[0].inputs[3].name: 'class' is not a keyword argument name (a Python identifier)",
        f"{where}: models[1]: give inputs or input_factory, not both (the factory makes every input)",
    ]
