"""Plugins price their own operators (``rpx_register_op_formulas``): a custom torch.library operator is listed as
uncounted until a plugin registered at run time gives it a formula; plugin formulas override built-ins, may replace
the measured bytes, and a bad one is one error naming the plugin. Counted through the real engine (run_spec)."""

from __future__ import annotations

import re
import types

import pytest
import torch
from torch import nn

from rpx_core import hookimpl
from rpx_core.api import run_spec
from rpx_core.errors import PluginError
from rpx_core.registry.manager import Plugins
from rpx_core.registry.op_formula import OpFormula
from rpx_core.spec.schema import spec_from_dict

ROWS, WIDTH, SCALE = 3, 8, 2.0
ELEMENTS = ROWS * WIDTH


@torch.library.custom_op("rpxtest::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * tanh(x): one tanh and one multiply per element."""
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class ScaledTanhNet(nn.Module):
    """A linear layer followed by the custom operator."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rpxtest.scaled_tanh(self.proj(x), SCALE)


def counted(plugins: Plugins):  # noqa: ANN201
    spec = spec_from_dict({
        "models": [{"name": "m", "source": "tests.test_op_formulas:ScaledTanhNet", "inputs": [{"shape": [ROWS, WIDTH]}]}],
        "stages": ["count_flops", "estimate_traffic"],
    })
    return run_spec(spec, plugins=plugins, output=None).model("m")


def formula_plugin(*formulas: OpFormula, **hook_options: object) -> types.SimpleNamespace:
    """A plugin object whose rpx_register_op_formulas returns ``formulas``."""

    @hookimpl(**hook_options)
    def rpx_register_op_formulas() -> list[OpFormula]:
        return list(formulas)

    return types.SimpleNamespace(rpx_register_op_formulas=rpx_register_op_formulas)


@pytest.fixture
def plugins() -> Plugins:
    return Plugins.load(entry_points=False)


LINEAR_MACS, BIAS_ADDS = ELEMENTS * WIDTH, ELEMENTS


def test_a_custom_op_is_uncounted_until_a_plugin_prices_it(plugins: Plugins) -> None:
    before = counted(plugins).result("count_flops")
    assert before.counted_on == "meta"
    assert before.uncounted_ops == {"rpxtest.scaled_tanh": 1}
    assert (before.macs, before.other_flops) == (LINEAR_MACS, BIAS_ADDS)  # the op adds nothing: listed, not zero-filled
    assert before.plugin_formulas == {}

    tanh_and_scale = OpFormula("rpxtest::scaled_tanh", flops=lambda call: 2 * call.out_numel())
    plugins.register(formula_plugin(tanh_and_scale), "tanh-pricer")
    after = counted(plugins).result("count_flops")
    assert after.uncounted_ops == {}
    assert (after.macs, after.other_flops) == (LINEAR_MACS, BIAS_ADDS + 2 * ELEMENTS)
    assert after.by_operator["rpxtest.scaled_tanh"].other_flops == 2 * ELEMENTS
    assert after.plugin_formulas == {"rpxtest.scaled_tanh": "tanh-pricer"}


def test_a_plugin_formula_takes_precedence_over_the_built_in_one(plugins: Plugins) -> None:
    """A plugin that counts bias adds as free: its addmm formula replaces rpx's (MACs + 1 FLOP per bias add)."""
    no_bias = OpFormula(torch.ops.aten.addmm, macs=lambda call: call.out_numel() * call.args["mat1"].shape[-1])
    plugins.register(formula_plugin(no_bias, OpFormula(scaled_tanh, flops=lambda call: 0)), "free-bias")
    flops = counted(plugins).result("count_flops")
    assert (flops.macs, flops.other_flops) == (LINEAR_MACS, 0)
    assert flops.plugin_formulas == {"aten.addmm": "free-bias", "rpxtest.scaled_tanh": "free-bias"}


def test_a_plugin_bytes_formula_replaces_the_measured_bytes(plugins: Plugins) -> None:
    measured = counted(plugins).result("estimate_traffic")
    priced = OpFormula("rpxtest::scaled_tanh.default", flops=lambda call: 0, bytes=lambda call: (1000, 10))
    plugins.register(formula_plugin(priced), "bytes")
    traffic = counted(plugins).result("estimate_traffic")
    tanh_measured = 2 * ELEMENTS * 4  # float32 in, float32 out
    assert traffic.unfused_bytes == measured.unfused_bytes - tanh_measured + 1000 + 10
    assert traffic.fused_bytes == measured.fused_bytes  # weights, inputs and outputs do not change


def test_the_first_plugin_in_call_order_wins(plugins: Plugins) -> None:
    plugins.register(formula_plugin(OpFormula(scaled_tanh, flops=lambda call: 1)), "registered-first")
    plugins.register(formula_plugin(OpFormula(scaled_tanh, flops=lambda call: 5)), "registered-last")
    flops = counted(plugins).result("count_flops")
    assert flops.plugin_formulas == {"rpxtest.scaled_tanh": "registered-last"}  # pluggy: last registered asked first
    assert flops.by_operator["rpxtest.scaled_tanh"].other_flops == 5
    plugins.register(formula_plugin(OpFormula(scaled_tanh, flops=lambda call: 7), tryfirst=True), "tryfirst")
    assert counted(plugins).result("count_flops").plugin_formulas == {"rpxtest.scaled_tanh": "tryfirst"}


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ("rpxtest::no_such_op", r"plugin 'bad': op formula for 'rpxtest::no_such_op': torch has no such operator"),
        ("scaled_tanh", r"plugin 'bad': op formula for 'scaled_tanh': write an operator name as 'namespace::name'"),
        (42, r"plugin 'bad': op formula for 42: not a torch operator"),
    ],
)
def test_an_operator_that_does_not_resolve_is_one_error_naming_the_plugin(plugins: Plugins, op: object,
                                                                           message: str) -> None:
    plugins.register(formula_plugin(OpFormula(op, flops=lambda call: 0)), "bad")
    record = counted(plugins).stages["count_flops"]
    assert record.status == "failed"
    assert record.error.startswith("PluginError: ")
    assert re.search(message, record.error), record.error


def test_the_library_defining_an_operator_is_imported_when_counting_starts(plugins: Plugins) -> None:
    plugins.register(formula_plugin(OpFormula("rpxtest::scaled_tanh", flops=lambda call: 2 * call.out_numel(),
                                              library="tests.test_op_formulas")), "with-library")
    assert counted(plugins).result("count_flops").plugin_formulas == {"rpxtest.scaled_tanh": "with-library"}
    plugins.register(formula_plugin(OpFormula("nolib::op", flops=lambda call: 0, library="no_such_module")), "nolib")
    record = counted(plugins).stages["count_flops"]
    assert record.status == "failed"
    assert "plugin 'nolib': op formula for 'nolib::op': cannot import its library 'no_such_module'" in record.error


def test_a_badly_built_formula_is_an_error_naming_the_plugin(plugins: Plugins) -> None:
    @hookimpl
    def rpx_register_op_formulas() -> list[OpFormula]:
        return [OpFormula("rpxtest::scaled_tanh")]  # neither macs nor flops

    with pytest.raises(PluginError, match=r"plugin 'empty': rpx_register_op_formulas raised ValueError: OpFormula for "
                                          r"'rpxtest::scaled_tanh' gives neither macs nor flops"):
        plugins.register(types.SimpleNamespace(rpx_register_op_formulas=rpx_register_op_formulas), "empty")
    assert "empty" not in plugins.hook_order("rpx_register_op_formulas")


def test_anything_but_an_op_formula_is_refused(plugins: Plugins) -> None:
    with pytest.raises(PluginError, match=r"plugin 'dicts': rpx_register_op_formulas returned dict "
                                          r"\{'op': 'rpxtest::scaled_tanh'\}, not an OpFormula at index 0"):
        plugins.register(formula_plugin({"op": "rpxtest::scaled_tanh"}), "dicts")  # type: ignore[arg-type]
