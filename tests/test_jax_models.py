"""JAX models as users have them (Flax linen, Flax NNX, Equinox, a TrainState, a plain function), recognised by type,
from specs and from ``rpx.profile``: params vs buffers, FLOPs, per-module rows and training steps against hand counts
and against Flax's own ``tabulate(compute_flops=True)`` for Dense layers."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import jax
import jax.numpy as jnp
import pytest

import rpx_core as rpx
from rpx_core.api import run_spec
from rpx_core.errors import UnsupportedError
from rpx_core.spec.schema import load_spec
from rpx_plugins.jax import zoo

flax_linen = pytest.importorskip("flax.linen", reason="flax is in the test extra")
nnx = pytest.importorskip("flax.nnx")
STAGES = ["count_params", "count_flops", "estimate_traffic"]
SPECS = Path(__file__).resolve().parents[1] / "specs"


def ok(result, stage):
    record = result.stages[stage]
    assert record.status == "ok", record.error
    return record.result


def write_spec(tmp_path, source, inputs, **extra):
    """A real spec file naming no backend: rpx infers it from the model the factory returns."""
    lines = ['name = "t"', f'stages = {STAGES!r}'.replace("'", '"'), f'output = "{tmp_path}/out.toml"']
    lines += [f"{key} = {value}" for key, value in extra.items()]
    lines += ["[[models]]", 'name = "m"', f'source = "{source}"', f"inputs = [{inputs}]"]
    path = tmp_path / "spec.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_linen_cnn_from_a_spec_infers_jax_and_splits_params_from_batch_stats(tmp_path):
    spec = load_spec(write_spec(tmp_path, "rpx_plugins.jax.zoo:linen_cnn", '{ shape = [2, 8, 8, 3] }'))
    assert spec.backend_inferred
    run = run_spec(spec, output=None)
    model = run.model("m")
    assert model.backend == "jax"  # inferred: the spec names no backend
    params = ok(model, "count_params")
    conv, norm, dense = 3 * 3 * 3 * 8 + 8, 8 + 8, 8 * 10 + 10  # kernel + bias; scale + bias; kernel + bias
    assert (params.total, params.trainable, params.non_trainable, params.buffers) == (conv + norm + dense,) * 2 + (0, 16)
    flops = ok(model, "count_flops")
    conv_macs, dense_macs = (2 * 8 * 8 * 8) * 3 * 9, 2 * 8 * 10  # SAME conv: every tap; global mean then head
    assert flops.macs == conv_macs + dense_macs
    rows = flops.by_module
    assert list(rows) == ["(root)", "Conv_0", "BatchNorm_0", "Dense_0"]
    assert rows["Conv_0"].calls == 1 and rows["Conv_0"].exclusive_matrix_flops == 2 * conv_macs
    assert rows["Conv_0"].exclusive_other_flops == 2 * 8 * 8 * 8  # the bias add
    # relu (1 per element) + mean (sum 1 per element, 1 divide per output) in the root's own code
    assert rows["(root)"].exclusive_other_flops == 2 * 8 * 8 * 8 * 2 + 2 * 8
    assert rows["(root)"].inclusive_flops == flops.total_flops
    assert sum(r.exclusive_matrix_flops + r.exclusive_other_flops for r in rows.values()) == flops.total_flops


def tabulated_flops(module, *inputs) -> dict[str, int]:
    """Per-module FLOPs as Flax's own tabulate(compute_flops=True) prints them (XLA's count of each call)."""
    table = module.tabulate(jax.random.key(0), *inputs, compute_flops=True, console_kwargs={"width": 400})
    flops = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in re.split(r"[│┃]", line)]
        if len(cells) > 6 and cells[2] == "Dense" and cells[5].isdigit():
            flops[cells[1]] = int(cells[5])
    return flops


def test_dense_layers_match_flax_tabulate_and_the_hand_count():
    class MLP(flax_linen.Module):
        @flax_linen.compact
        def __call__(self, x):
            return flax_linen.Dense(10)(flax_linen.relu(flax_linen.Dense(32, name="hidden")(x)))

    module, x = MLP(), jnp.ones((8, 64))
    variables = module.init(jax.random.key(0), x)
    flops = ok(rpx.profile((module, variables), inputs=[(8, 64)], stages=["count_flops"]), "count_flops")
    theirs = tabulated_flops(module, x)
    hand = {"hidden": 2 * 8 * 64 * 32 + 8 * 32, "Dense_0": 2 * 8 * 32 * 10 + 8 * 10}  # matmul + bias add
    assert theirs == hand
    assert {name: flops.by_module[name].inclusive_flops for name in hand} == hand


def test_a_linen_attention_block_counts_projections_and_both_attention_products():
    b, length, width, heads = 2, 16, 64, 4
    flops = ok(rpx.profile(zoo.linen_attention(width, heads), inputs=[(b, length, width)], stages=["count_flops"]),
               "count_flops")
    projections = 4 * b * length * width * width  # query, key, value and output projections
    attention = 2 * b * heads * length * length * (width // heads)  # QK^T and PV
    assert flops.macs == projections + attention
    assert set(flops.by_module) >= {"LayerNorm_0", "MultiHeadDotProductAttention_0"}


def test_an_nnx_mlp_reports_batch_stats_and_rng_state_as_buffers():
    result = rpx.profile(zoo.nnx_mlp((64, 32, 10)), inputs=[(8, 64)], stages=STAGES)
    params = ok(result, "count_params")
    trainable = (64 * 32 + 32) + (32 * 10 + 10) + (32 + 32)  # two Linear layers, BatchNorm scale and bias
    # BatchNorm mean and var (32 each), Dropout's RngCount (1 uint32) and RngKey (a threefry key: 2 uint32 words)
    assert (params.trainable, params.non_trainable, params.buffers) == (trainable, 0, 32 + 32 + 1 + 2)
    flops = ok(result, "count_flops")
    assert flops.macs == 8 * 64 * 32 + 8 * 32 * 10
    assert [name for name in flops.by_module if name != "(root)"] == ["layers", "layers.0", "norm", "layers.1"]
    assert flops.by_module["layers.0"].calls == 1 and flops.by_module["layers.0"].exclusive_matrix_flops == 2 * 8 * 64 * 32


def test_an_equinox_mlp_is_profiled_with_a_row_per_layer():
    pytest.importorskip("equinox", reason="equinox is in the test extra")
    result = rpx.profile(zoo.equinox_mlp((64, 32, 10)), inputs=[(8, 64)], stages=STAGES)
    params = ok(result, "count_params")
    assert (params.total, params.buffers) == ((64 * 32 + 32) + (32 * 10 + 10), 0)
    flops = ok(result, "count_flops")
    assert flops.macs == 8 * 64 * 32 + 8 * 32 * 10
    assert flops.by_module["layers.0"].exclusive_matrix_flops == 2 * 8 * 64 * 32
    assert flops.by_module["layers.1"].exclusive_matrix_flops == 2 * 8 * 32 * 10
    assert flops.by_module["(root)"].exclusive_other_flops == 8 * 32  # the relu between them


def test_a_train_state_counts_forward_gradient_and_the_optimizer_update():
    batch = 8
    result = rpx.profile(zoo.train_state_mlp((64, 32, 10)), inputs=[(batch, 64)], stages=STAGES,
                         options={"count_flops": {"backward": True}})
    flops = ok(result, "count_flops")
    params = (64 * 32 + 32) + (32 * 10 + 10)
    forward = batch * (64 * 32 + 32 * 10)
    # gradients of both weights and of the hidden activation (the input needs none)
    backward = batch * (64 * 32 + 32 * 10) + batch * 32 * 10
    assert flops.backward and flops.macs == forward + backward
    assert list(flops.by_phase) == ["forward", "backward", "optimizer"]
    assert flops.by_phase["optimizer"] == 2 * params  # SGD: scale the gradient by -lr, add it to the param
    assert flops.by_module["(optimizer)"].exclusive_other_flops == 2 * params
    traffic = ok(result, "estimate_traffic")
    assert traffic.gradient_bytes == 4 * params


def test_a_plain_function_with_closed_over_weights_reports_them_as_constants():
    weights = jnp.ones((64, 32))
    with pytest.warns(UserWarning, match="closes over stay float32 at bf16"):
        result = rpx.profile((lambda p, x: (x @ weights) * p, jnp.float32(2.0)), inputs=[(8, 64)],
                             stages=["count_params"], precision="bf16")
    params = ok(result, "count_params")
    assert (params.total, params.constants, params.constant_bytes) == (1, 64 * 32, 64 * 32 * 4)


def test_backend_inference_and_refusals_are_one_line_naming_the_forms():
    with pytest.raises(UnsupportedError, match=r"accepted forms: .*flax nnx Module \[jax\].*Equinox Module"):
        rpx.profile(object(), inputs=[(1, 4)])
    torch = pytest.importorskip("torch")
    result = rpx.profile(torch.nn.Linear(4, 2), inputs=[(1, 4)], stages=["count_params"], backend="jax",
                         partial=True)
    assert "is a torch.nn.Module model, which 'torch' backends run" in result.stages["count_params"].error


def test_every_form_runs_from_the_example_spec_and_matches_the_api():
    pytest.importorskip("equinox", reason="equinox is in the test extra")
    spec = load_spec(SPECS / "jax_models.toml")
    run = run_spec(spec, output=None)
    assert run.ok, [(m.name, s, r.error) for m in run.models for s, r in m.stages.items() if r.status != "ok"]
    assert {model.backend for model in run.models} == {"jax"}  # inferred from the first model
    function = run.model("function-mlp")
    assert ok(function, "count_params").total == (64 * 32 + 32) + (32 * 10 + 10)
    assert ok(function, "count_flops").macs == 8 * (64 * 32 + 32 * 10)
    for model in spec.models:
        factory = getattr(zoo, model.source.rpartition(":")[2])
        inputs = [{"shape": list(i.shape)} for i in model.inputs]
        again = rpx.profile(factory(), inputs=inputs, stages=["count_params", "count_flops"])
        for stage in ("count_params", "count_flops"):
            from_spec, from_api = ok(run.model(model.name), stage), ok(again, stage)
            if stage == "count_flops":  # XLA's figures may differ by run; the counts may not
                from_spec, from_api = (attrs.evolve(f, compiler_figures=None) for f in (from_spec, from_api))
            assert from_spec == from_api, (model.name, stage)


class Haiku:
    """A stand-in for another JAX library's model object: a function and its params in a class of its own."""

    def __init__(self) -> None:
        self.fn, self.params = (lambda p, x: x @ p), jnp.ones((64, 32))


def test_a_plugin_adds_an_adapter_for_another_library_through_the_same_hook():
    from rpx_core.registry.adapters import ModelAdapter
    from rpx_core.registry.hookspecs import hookimpl
    from rpx_core.registry.manager import Plugins
    from rpx_plugins.jax import JaxModel

    class Plugin:
        @staticmethod
        @hookimpl
        def rpx_register_model_adapters():
            return [ModelAdapter("haiku-like", "jax", "Haiku-like object", lambda m: isinstance(m, Haiku),
                                 lambda m: JaxModel(m.fn, m.params, form="Haiku-like object"))]

    plugins = Plugins.load()
    with pytest.raises(UnsupportedError, match="cannot tell which backend runs model"):
        rpx.profile(Haiku(), inputs=[(8, 64)], plugins=plugins)  # not callable, no adapter yet
    plugins.register(Plugin(), "haiku-like")
    result = rpx.profile(Haiku(), inputs=[(8, 64)], stages=["count_params", "count_flops"], plugins=plugins)
    assert result.backend == "jax" and ok(result, "count_params").total == 64 * 32
    assert ok(result, "count_flops").macs == 8 * 64 * 32
