"""The counter's formula registry, the per-element table shared with the JAX counter, and each backward formula
against a hand-computed value (per-element costs as rpx_core.cost_table writes them out).

Each backward test runs a real backward (on CPU) through ``count_model`` and reads the one operator it checks from
``by_operator``, so the formula is checked on the arguments autograd really passes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import sdpa_backward_flop_count

from rpx_core import cost_table
from rpx_core.api import run_spec
from rpx_core.errors import SpecError
from rpx_core.spec.schema import spec_from_dict
from rpx_core.types.counts import CountOptions
from rpx_plugins.jax import jaxpr
from rpx_plugins.torch.counter import count_model
from rpx_plugins.torch.counter.registry import ABSENT, BUILTIN, DuplicateFormulaError, aten, formula
from tests.test_torch_counter import Apply


def backward_op(model: nn.Module, *inputs: torch.Tensor, op: str, **options: object):  # noqa: ANN201
    """The backward-phase totals of ``op`` in a forward + backward count of ``model(*inputs)``."""
    report = count_model(model, inputs, backward=True, top_k=None, **options)
    assert report.flops.uncounted_ops == {}
    return report.flops.by_operator[op]


# -- the registry ------------------------------------------------------------------------------------------------------


def test_a_second_formula_for_an_operator_is_refused() -> None:
    with pytest.raises(DuplicateFormulaError, match=r"aten\.mm already has a formula"):
        formula(aten.mm)(lambda call: (0, 0))
    assert BUILTIN[aten.mm].__qualname__.startswith("matmul")  # the original stays


def test_formulas_are_keyed_by_operator_objects_so_a_typo_fails() -> None:
    with pytest.raises(TypeError, match="operators such as aten.mm"):
        formula("mm")(lambda call: (0, 0))
    with pytest.raises(AttributeError):
        formula(aten.mmm)  # what a misspelled registration does at import
    assert ABSENT == []  # every version-dependent and cost-table name exists on the pinned torch


def test_every_cost_table_entry_prices_its_aten_operator() -> None:
    for table, elements in ((cost_table.PER_OUTPUT_ELEMENT, "out"), (cost_table.PER_INPUT_ELEMENT, "in")):
        for name, cost in table.items():
            x = torch.randn(3, 4)
            priced = BUILTIN[getattr(aten, name)]
            call = type("Call", (), {"first": lambda self: x, "out_numel": lambda self: 6})()
            assert priced(call) == (0, cost * (6 if elements == "out" else 12)), name


def test_the_jax_counter_prices_from_the_same_table() -> None:
    shared_out, shared_in = cost_table.PER_OUTPUT_ELEMENT, cost_table.PER_INPUT_ELEMENT
    assert jaxpr.PER_OUTPUT_ELEMENT["add"] == shared_out["add"] == 1
    assert jaxpr.PER_OUTPUT_ELEMENT["logistic"] == shared_out["sigmoid"] == 4  # jax.nn.sigmoid's primitive
    assert jaxpr.PER_OUTPUT_ELEMENT["max"] == shared_out["maximum"]  # elementwise in JAX, unlike aten.max
    assert jaxpr.PER_INPUT_ELEMENT["reduce_sum"] == shared_in["sum"]
    assert set(jaxpr.PER_OUTPUT_ELEMENT.values()) <= set(shared_out.values())


# -- backward formulas, hand-computed ----------------------------------------------------------------------------------

ROWS, WIDTH = 6, 16
ELEMENTS = ROWS * WIDTH


def test_layer_norm_backward_hand_computed() -> None:
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    stats = backward_op(nn.LayerNorm(WIDTH), x, op="aten.native_layer_norm_backward")
    # x_hat 2 + input gradient 7 + weight multiply 1 + weight gradient 2 + bias gradient 1
    assert (stats.calls, stats.matrix_flops, stats.other_flops) == (1, 0, 13 * ELEMENTS)
    frozen_input = backward_op(nn.LayerNorm(WIDTH), x.detach(), op="aten.native_layer_norm_backward")
    assert frozen_input.other_flops == (2 + 2 + 1) * ELEMENTS  # no input gradient: x_hat, weight and bias sums


def test_group_norm_backward_hand_computed() -> None:
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    stats = backward_op(nn.GroupNorm(2, 4), x, op="aten.native_group_norm_backward")
    assert stats.other_flops == 13 * x.numel()  # as layer norm: 2 + 7 + 1 + 2 + 1


def test_rms_norm_backward_hand_computed() -> None:
    weight = torch.ones(WIDTH, device="meta")

    def fused(x: torch.Tensor) -> torch.Tensor:  # the kernels accelerators run (CPU decomposes nn.RMSNorm): on meta
        out, rstd = torch.ops.aten._fused_rms_norm(x, [WIDTH], weight, 1e-6)
        return torch.ops.aten._fused_rms_norm_backward(out, x, [WIDTH], rstd, weight, [True, True])[0]

    report = count_model(Apply(fused), (torch.randn(ROWS, WIDTH, device="meta"),))
    # (the forward decomposes on this torch) backward: x_hat 1 + input gradient 5 + weight multiply 1 + weight sum 2
    assert report.flops.by_operator["aten._fused_rms_norm_backward"].other_flops == 9 * ELEMENTS
    assert report.flops.uncounted_ops == {}


@pytest.mark.parametrize(("training", "per_element"), [(True, 2 + 1 + 2 + 4), (False, 1 + (2 + 2) + 1)])
def test_batch_norm_backward_hand_computed(training: bool, per_element: int) -> None:
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    norm = nn.BatchNorm2d(4).train(training)
    stats = backward_op(norm, x, op="aten.native_batch_norm_backward")
    # training: x_hat, grad sum, grad * x_hat sum, input gradient; inference: input scale, weight grad, bias grad
    assert stats.other_flops == per_element * x.numel()


@pytest.mark.parametrize(("approximate", "per_element"), [("none", 11), ("tanh", 18)])
def test_gelu_backward_hand_computed(approximate: str, per_element: int) -> None:
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    stats = backward_op(nn.GELU(approximate), x, op="aten.gelu_backward")
    assert stats.other_flops == per_element * ELEMENTS


def test_silu_backward_hand_computed() -> None:
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    assert backward_op(nn.SiLU(), x, op="aten.silu_backward").other_flops == (4 + 5) * ELEMENTS  # sigmoid + 5


@pytest.mark.parametrize(("fn", "op"), [(F.softmax, "aten._softmax_backward_data"),
                                         (F.log_softmax, "aten._log_softmax_backward_data")])
def test_softmax_backward_hand_computed(fn, op: str) -> None:  # noqa: ANN001
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    assert backward_op(Apply(lambda t: fn(t, dim=-1)), x, op=op).other_flops == 4 * ELEMENTS


def test_max_pool_backward_hand_computed() -> None:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    stats = backward_op(nn.MaxPool2d(3, stride=2, padding=1), x, op="aten.max_pool2d_with_indices_backward")
    assert stats.other_flops == 2 * 3 * 4 * 4  # one add per output gradient (4x4 outputs per plane)


def test_avg_pool_backward_hand_computed() -> None:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    stats = backward_op(nn.AvgPool2d(2), x, op="aten.avg_pool2d_backward")
    assert stats.other_flops == 2 * 2 * (2 * 3 * 4 * 4)  # kernel volume 4 per output gradient


def test_adaptive_avg_pool_backward_hand_computed() -> None:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    stats = backward_op(nn.AdaptiveAvgPool2d(2), x, op="aten._adaptive_avg_pool2d_backward")
    assert stats.other_flops == x.numel()  # 1 per input element, like the forward


@pytest.mark.parametrize(("scale_grad_by_freq", "per_element"), [(False, 1), (True, 2)])
def test_embedding_backward_hand_computed(scale_grad_by_freq: bool, per_element: int) -> None:
    tokens = torch.tensor([[1, 2, 3, 2]])
    table = nn.Embedding(10, 8, scale_grad_by_freq=scale_grad_by_freq)
    stats = backward_op(table, tokens, op="aten.embedding_dense_backward")
    assert stats.other_flops == per_element * 4 * 8  # 4 gradient rows of 8 added into the table


# -- attention backward: with or without recomputation -----------------------------------------------------------------

BATCH, HEADS, LQ, LK, E = 2, 4, 16, 12, 8


def sdpa_inputs() -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(BATCH, HEADS, length, E, requires_grad=True) for length in (LQ, LK, LK))


@pytest.mark.parametrize("convention", ["without_recompute", "with_recompute"])
def test_attention_backward_conventions_hand_computed(convention: str) -> None:
    stats = backward_op(Apply(F.scaled_dot_product_attention), *sdpa_inputs(),
                        op="aten._scaled_dot_product_flash_attention_for_cpu_backward", attention_backward=convention)
    scores = BATCH * HEADS * LQ * LK
    forward_macs = scores * (E + E)  # QK^T and PV
    if convention == "without_recompute":  # dQ, dK, dV, dP; softmax backward 4 per score
        assert (stats.matrix_flops, stats.other_flops) == (2 * 2 * forward_macs, 4 * scores)
    else:  # + QK^T again; + scale, subtract the log-sum-exp, exp per score
        assert (stats.matrix_flops, stats.other_flops) == (2 * (2 * forward_macs + scores * E), (4 + 3) * scores)
        # torch's own formula for fused kernels' backward counts the same recomputation
        shapes = [(BATCH, HEADS, LQ, E), (BATCH, HEADS, LQ, E), (BATCH, HEADS, LK, E), (BATCH, HEADS, LK, E)]
        assert stats.matrix_flops == sdpa_backward_flop_count(*shapes)


def test_the_math_path_backward_never_recomputes() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        plain = count_model(Apply(F.scaled_dot_product_attention), sdpa_inputs(), backward=True)
        recompute = count_model(Apply(F.scaled_dot_product_attention), sdpa_inputs(), backward=True,
                                attention_backward="with_recompute")
    assert plain.flops == recompute.flops  # bmm backward: the probabilities are stored, nothing is recomputed


def test_attention_backward_option_is_validated() -> None:
    assert CountOptions().attention_backward == "without_recompute"
    with pytest.raises(ValueError, match="attention_backward"):
        CountOptions(attention_backward="recompute")
    models = [{"name": "m", "source": "torch.nn:Identity", "inputs": [{"shape": [1, 2]}]}]
    spec = spec_from_dict({"models": models, "stages": ["count_flops"],
                           "options": {"count_flops": {"attention_backward": "recompute"}}})
    with pytest.raises(SpecError, match=r"s\.toml: options\.count_flops\.attention_backward: must be one of "
                                        r"'without_recompute', 'with_recompute'; got 'recompute'"):
        run_spec(spec, output=None, spec_path="s.toml")


def test_the_newer_batch_norm_backward_hand_computed() -> None:
    """aten.batch_norm_backward (what compiled and functionalised graphs call): ``update`` is training."""
    x, ones, zeros = (torch.randn(2, 4, 5, 5, device="meta"), torch.ones(4, device="meta"), torch.zeros(4, device="meta"))

    def backward(update: bool):  # noqa: ANN202
        return lambda t: torch.ops.aten.batch_norm_backward(t, t, ones, zeros, ones, zeros, ones, update, 1e-5,
                                                            [True, False, False], torch.empty(0, device="meta"))[0]

    training = count_model(Apply(backward(True)), (x,)).flops.by_operator["aten.batch_norm_backward"]
    inference = count_model(Apply(backward(False)), (x,)).flops.by_operator["aten.batch_norm_backward"]
    assert training.other_flops == (2 + 2 + 1 + 4) * x.numel()  # input gradient only: the sums are still needed
    assert inference.other_flops == 1 * x.numel()  # input gradient only: one scale per element


@pytest.mark.parametrize(
    ("pool", "op", "per_output_gradient"),
    [
        (nn.MaxPool3d(2), "aten.max_pool3d_with_indices_backward", 1),
        (nn.AvgPool3d(2), "aten.avg_pool3d_backward", 2 * 2 * 2),
        (nn.AdaptiveMaxPool3d(2), "aten.adaptive_max_pool3d_backward", 1),
    ],
)
def test_3d_and_adaptive_max_pool_backward_hand_computed(pool: nn.Module, op: str, per_output_gradient: int) -> None:
    x = torch.randn(1, 2, 4, 4, 4, requires_grad=True)
    assert backward_op(pool, x, op=op).other_flops == per_output_gradient * 2 * 2 * 2 * 2  # 2 planes of 2x2x2 outputs


def test_adaptive_max_pool2d_backward_hand_computed() -> None:
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    stats = backward_op(nn.AdaptiveMaxPool2d(2), x, op="aten.adaptive_max_pool2d_backward")
    assert stats.other_flops == 2 * 3 * 2 * 2  # one add per output gradient


def test_formulas_of_kernels_this_machine_cannot_run_hand_computed() -> None:
    """cuDNN/MIOpen batch-norm backward (CUDA/ROCm only) and the fused RMS norm forward (decomposed on this torch),
    priced from a call as the dispatcher would pass it."""
    from rpx_plugins.torch.counter import formulas
    from rpx_plugins.torch.counter.registry import OpCall

    x = torch.empty(2, 4, 5, 5, device="meta")
    assert BUILTIN[aten.cudnn_batch_norm_backward] is BUILTIN[aten.miopen_batch_norm_backward]
    assert formulas.vendor_batch_norm_backward(OpCall({"input": x}, [])) == (0, 9 * x.numel())  # training, all grads
    weight = torch.empty(5, device="meta")
    assert formulas.rms_norm(OpCall({"input": x, "weight": weight}, [])) == (0, (3 + 1) * x.numel())
    assert formulas.rms_norm(OpCall({"input": x, "weight": None}, [])) == (0, 3 * x.numel())
