"""train_step: a whole optimiser step counted by phase equals forward + backward + optimiser counted by hand from the
shapes (an MLP, a CNN with batch norm, a one-block transformer; SGD with momentum and AdamW; fp32 and bf16 autocast),
its memory predicted item by item, bounded by phase, and its options documented.

The hand counts use rpx's conventions (FLOPs = 2 x MACs for matrix work; the per-element costs of
:mod:`rpx_core.cost_table`), written out per layer: a linear layer costs batch x in x out MACs and 1 per output element
for its bias; its backward the same MACs for the input gradient (when the input needs one) and for the weight
gradient, and 1 per output-gradient element for the bias gradient (a sum over the batch); and so on for each layer.
"""

from __future__ import annotations

import re

import attrs
import pytest

from rpx_core import cost_table as table
from rpx_core.testing import make_context, run_stage
from rpx_core.types.training import TrainBatchSearchOptions, TrainStepOptions
from rpx_plugins.training.bounds import STEP
from tests.conftest import REPO

SOFTMAX, SOFTMAX_BACKWARD = table.SOFTMAX, table.SOFTMAX_BACKWARD
LAYER_NORM = table.LAYER_NORM + 2  # with a weight and a bias
BATCH_NORM_TRAINING = table.BATCH_NORM + 2 + table.BATCH_NORM_STATISTICS  # with a weight and a bias
BATCH_NORM_BACKWARD = (table.LAYER_NORM_BACKWARD_XHAT + table.NORM_BACKWARD_WEIGHT + table.NORM_BACKWARD_BIAS
                       + table.BATCH_NORM_BACKWARD_TRAINING_INPUT)
SGD_PER_ELEMENT = 3  # momentum buffer: mul_, add_ (the gradient); parameter: add_ (the buffer, times -lr)
#: AdamW per element: decay mul_ 1, lerp_ 2 (first moment), mul_ 1 and addcmul_ 2 (second moment), sqrt 1, div 1
#: (bias correction), add_ 1 (eps), addcdiv_ 2 (the update); plus 1 per parameter tensor for its step counter.
ADAMW_PER_ELEMENT = 1 + table.PER_OUTPUT_ELEMENT["lerp"] + 1 + table.PER_OUTPUT_ELEMENT["addcmul"] + 1 + 1 + 1 + \
    table.PER_OUTPUT_ELEMENT["addcdiv"]


class Count:
    """A hand count: FLOPs by phase."""

    def __init__(self) -> None:
        self.forward = self.backward = 0

    def linear(self, rows: int, inputs: int, outputs: int, input_grad: bool = True) -> None:
        self.forward += 2 * rows * inputs * outputs + rows * outputs
        self.backward += 2 * rows * inputs * outputs * (1 + input_grad) + rows * outputs

    def conv(self, out_elements: int, in_channels: int, kernel: int, input_grad: bool = True) -> None:
        macs = out_elements * in_channels * kernel * kernel
        self.forward += 2 * macs + out_elements
        self.backward += 2 * macs * (1 + input_grad) + out_elements

    def elementwise(self, elements: int, forward: int, backward: int) -> None:
        self.forward += forward * elements
        self.backward += backward * elements

    def cross_entropy(self, rows: int, classes: int) -> None:
        self.forward += SOFTMAX * rows * classes + table.NLL_LOSS * rows
        self.backward += SOFTMAX_BACKWARD * rows * classes + table.NLL_LOSS_BACKWARD * rows


def mlp_count(batch: int) -> tuple[Count, int, int]:
    """(count, parameter elements, parameter tensors) of tests.training_models.mlp: 64 -> 256 -> ReLU -> 10."""
    count = Count()
    count.linear(batch, 64, 256, input_grad=False)
    count.elementwise(batch * 256, 1, 1)  # relu, threshold_backward
    count.linear(batch, 256, 10)
    count.cross_entropy(batch, 10)
    return count, 64 * 256 + 256 + 256 * 10 + 10, 4


def cnn_count(batch: int, size: int) -> tuple[Count, int, int]:
    """tests.training_models.cnn with 8 channels on batch x 3 x size x size images."""
    count = Count()
    first, second = batch * 8 * size * size, batch * 16 * (size // 2) ** 2
    count.conv(first, 3, 3, input_grad=False)
    count.elementwise(first, BATCH_NORM_TRAINING, BATCH_NORM_BACKWARD)
    count.elementwise(first, 1, 1)  # relu
    count.conv(second, 8, 3)
    count.elementwise(second, BATCH_NORM_TRAINING, BATCH_NORM_BACKWARD)
    count.elementwise(second, 1, 1)  # relu
    count.elementwise(second, 1, 1)  # global average pool: 1 per input element, its backward 1 per input element
    count.forward += 2  # each batch norm counts its batches (num_batches_tracked += 1)
    count.linear(batch, 16, 10)
    count.cross_entropy(batch, 10)
    parameters = (3 * 8 * 9 + 8) + 2 * 8 + (8 * 16 * 9 + 16) + 2 * 16 + (16 * 10 + 10)
    return count, parameters, 10


def transformer_count(batch: int, seq: int, width: int = 32, heads: int = 4, vocab: int = 50) -> tuple[Count, int, int]:
    """tests.training_models.transformer with a cross-entropy loss over the vocabulary."""
    count = Count()
    tokens = batch * seq
    scores = batch * heads * seq * seq
    count.forward += LAYER_NORM * tokens * width  # norm1; its input (the model's) needs no gradient:
    count.backward += (table.LAYER_NORM_BACKWARD_XHAT + table.NORM_BACKWARD_WEIGHT + table.NORM_BACKWARD_BIAS) * \
        tokens * width
    count.linear(tokens, width, 3 * width)
    attention_macs = scores * 2 * (width // heads)  # QK^T and PV
    count.forward += 2 * attention_macs + (SOFTMAX + 1) * scores  # causal: +1 per score for the mask
    count.backward += 2 * 2 * attention_macs + SOFTMAX_BACKWARD * scores
    count.linear(tokens, width, width)
    count.elementwise(tokens * width, 1, 1)  # the residual add; its gradient meets the MLP branch's: one add
    count.elementwise(tokens * width, LAYER_NORM, table.LAYER_NORM_BACKWARD_XHAT + table.LAYER_NORM_BACKWARD_INPUT + 1
                      + table.NORM_BACKWARD_WEIGHT + table.NORM_BACKWARD_BIAS)  # norm2
    count.linear(tokens, width, 4 * width)
    count.elementwise(tokens * 4 * width, table.GELU_ERF, table.GELU_ERF_BACKWARD)
    count.linear(tokens, 4 * width, width)
    count.forward += tokens * width  # the second residual add (its gradient passes through)
    count.linear(tokens, width, vocab)
    count.cross_entropy(tokens, vocab)
    linears = [(width, 3 * width), (width, width), (width, 4 * width), (4 * width, width), (width, vocab)]
    parameters = sum(i * o + o for i, o in linears) + 2 * 2 * width
    return count, parameters, 2 * len(linears) + 4


CASES = {
    "mlp": ([(8, 64)], mlp_count(8), {}),
    "cnn": ([(4, 3, 8, 8)], cnn_count(4, 8), {}),
    "transformer": ([(2, 16, 32)], transformer_count(2, 16), {"loss": "cross_entropy"}),
}


def train_step(model: str, inputs: list, precision: str = "fp32", **options) -> object:
    ctx = make_context(f"tests.training_models:{model}", inputs=inputs, stages=["train_step"], precision=precision,
                       gpus=["H100-SXM"], options={"train_step": {"measure": False, **options}})
    return run_stage("train_step", ctx)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("model", CASES)
def test_step_flops_are_forward_backward_and_optimizer_counted_by_hand(model: str, optimizer: str, precision: str):
    inputs, (count, parameters, tensors), options = CASES[model]
    result = train_step(model, inputs, precision, optimizer=optimizer, **options)
    update = SGD_PER_ELEMENT * parameters if optimizer == "sgd" else ADAMW_PER_ELEMENT * parameters + tensors
    assert result.uncounted_ops == {}
    assert {phase: counts.flops for phase, counts in result.phases.items()} == {
        "forward": count.forward, "backward": count.backward, "optimizer": update}
    assert result.step.flops == count.forward + count.backward + update
    assert result.precision_policy == ("fp32" if precision == "fp32" else "autocast")
    assert result.compute_dtype == ("float32" if precision == "fp32" else "bfloat16")
    assert result.parameter_dtype == "float32"  # autocast keeps fp32 master weights


def test_gradient_accumulation_counts_every_micro_batch_and_the_gradient_adds():
    (count, parameters, _), steps = mlp_count(8), 3
    result = train_step("mlp", [(8, 64)], optimizer="sgd", accumulation_steps=steps)
    # each micro-batch divides its loss by the steps (1 FLOP), and its backward the loss's gradient (1); every
    # micro-batch after the first adds its gradients into .grad (1 per parameter element)
    assert result.phases["forward"].flops == steps * (count.forward + 1)
    assert result.phases["backward"].flops == steps * (count.backward + 1) + (steps - 1) * parameters
    assert result.samples_per_step == 8 * steps


def test_fp16_autocast_counts_the_loss_scaler():
    count, parameters, _ = mlp_count(8)
    result = train_step("mlp", [(8, 64)], "fp16", optimizer="sgd")
    assert result.uncounted_ops == {}
    assert result.phases["backward"].flops == count.backward + 2  # the loss times the scale, and its gradient
    unscale = 1 + table.AMP_UNSCALE * parameters  # the inverse scale (a reciprocal), then every gradient element
    assert result.phases["optimizer"].flops == SGD_PER_ELEMENT * parameters + unscale + table.AMP_UPDATE_SCALE


def test_pure_bf16_keeps_parameters_and_optimizer_state_at_bf16():
    _, parameters, _ = mlp_count(8)
    result = train_step("mlp", [(8, 64)], "bf16", optimizer="adamw", precision_policy="pure")
    resident = {item.name: item.bytes for item in result.memory.resident}
    assert result.parameter_dtype == result.compute_dtype == "bfloat16"
    assert resident["parameters"] == 2 * parameters
    assert resident["optimizer_state"] == 2 * 2 * parameters + 4 * 4  # two moments at bf16; 4 fp32 step counters


def test_a_users_optimizer_class_and_loss_are_used():
    result = train_step("mlp", [(8, 64)], optimizer="torch.optim:RMSprop", optimizer_settings={"lr": 0.01},
                        loss="tests.training_models:summed")
    assert result.optimizer == "torch.optim.rmsprop.RMSprop"
    assert result.optimizer_settings == {"lr": 0.01}
    assert result.loss == "tests.training_models:summed (user's)"
    assert result.uncounted_ops == {}


def test_memory_is_itemised_and_the_mlp_peak_is_the_adamw_update():
    """AdamW on the MLP at batch 8: the gradients and the update's temporaries are the peak, in the optimizer phase;
    resident: parameters, two moments, the batch. Hand figures: fp32 = 4 bytes per element."""
    _, parameters, _ = mlp_count(8)
    result = train_step("mlp", [(8, 64)], optimizer="adamw")
    memory = result.memory
    resident = {item.name: item.bytes for item in memory.resident}
    assert resident == {"parameters": 4 * parameters, "optimizer_state": 4 * 2 * parameters + 4 * 4,
                        "batch": 8 * 64 * 4 + 8 * 8}  # inputs; int64 class targets
    at_peak = {item.name: item.bytes for item in memory.at_peak}
    assert memory.peak_phase == "optimizer"
    assert at_peak["gradients"] == 4 * parameters
    # the largest tensor's sqrt and its division by the bias correction live together at the peak
    assert at_peak["optimizer_temporaries"] == 2 * 4 * 64 * 256
    assert memory.transient_peak_bytes == sum(at_peak.values())
    assert memory.peak_bytes == memory.resident_bytes + memory.transient_peak_bytes
    phases = {phase.phase: phase for phase in memory.phases}
    assert phases["optimizer"].live_at_end_bytes == 0  # zero_grad frees the gradients
    assert phases["backward"].live_at_end_bytes == 4 * parameters


def test_bounds_per_phase_are_the_roofline_of_each_phases_counts():
    result = train_step("mlp", [(8, 64)], optimizer="adamw")
    from rpx_core.testing import default_plugins

    gpu = default_plugins().gpu_catalog().get("H100-SXM")
    for phase, counts in [*result.phases.items(), (STEP, result.step)]:
        bound = result.bounds["H100-SXM"][phase]
        expected = max(counts.flops / gpu.peak_flops("fp32"), counts.bytes_fused / gpu.bandwidth_bytes_s) * 1e3
        assert bound.bound_ms_fused == pytest.approx(expected)
        assert bound.required_bytes == result.memory.peak_bytes
    optimizer = result.phases["optimizer"]
    parameters = 4 * mlp_count(8)[1]
    assert optimizer.bytes_fused == 2 * parameters + parameters + 2 * (2 * parameters + 16)


def test_the_readme_documents_every_training_option():
    text = (REPO / "README.md").read_text()
    for stage, options in (("train_step", TrainStepOptions), ("train_batch_search", TrainBatchSearchOptions)):
        section = text[text.index(f"`[options.{stage}]` key"):]
        documented = re.findall(r"^\| `([a-z_]+)` \|", section[: section.index("\n\n")], flags=re.MULTILINE)
        assert documented == [field.name for field in attrs.fields(options)], stage


def test_parameter_counts_by_hand_match_the_models():
    from tests import training_models

    for name, (_, (_, parameters, tensors), _) in CASES.items():
        model = getattr(training_models, name)()
        assert sum(p.numel() for p in model.parameters()) == parameters
        assert len(list(model.parameters())) == tensors


# -- predicted against measured: real steps in rpx's worker processes ------------------------------------------------

MEASURED_SPEC = """
stages = ["train_step"]
output = "{output}"
[[models]]
name = "{first}"
source = "tests.training_models:{first}"
kwargs = {first_kwargs}
inputs = [{{ shape = {first_shape} }}]
[[models]]
name = "{second}"
source = "tests.training_models:{second}"
kwargs = {second_kwargs}
inputs = [{{ shape = {second_shape} }}]
[sweep]
precision = ["fp32", "bf16"]
[options.train_step]
optimizer = "{optimizer}"
memory_format = "{memory_format}"
warmup_steps = 1
min_steps = 2
max_seconds = 1
"""
#: (optimizer, memory format, two models with their kwargs and input shape). The CNN runs channels-last: in NCHW,
#: oneDNN reorders each convolution's activations into a blocked layout inside the kernel, workspace the prediction
#: does not see (README, "Training").
MEASURED = {
    "adamw": ("adamw", "contiguous", ("mlp", "{}", [4096, 64]), ("transformer", "{ width = 64, vocab = 256 }",
                                                                  [32, 64, 64])),
    "sgd": ("sgd", "channels_last", ("cnn", "{}", [64, 3, 32, 32]), ("mlp", "{}", [4096, 64])),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", MEASURED)
def test_predicted_transient_peak_is_within_10_percent_of_the_measured_increment(case: str, tmp_path):
    import tomllib

    from tests.conftest import rpx_cli

    optimizer, memory_format, first, second = MEASURED[case]
    spec = tmp_path / "spec.toml"
    spec.write_text(MEASURED_SPEC.format(
        output=tmp_path / "out.toml", optimizer=optimizer, memory_format=memory_format, first=first[0],
        first_kwargs=first[1], first_shape=first[2], second=second[0], second_kwargs=second[1], second_shape=second[2]))
    done = rpx_cli("run", str(spec), "--quiet", env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    models = tomllib.loads((tmp_path / "out.toml").read_text())["models"]
    assert len(models) == 4
    for model in models:
        result = model["stages"]["train_step"]["result"]
        measured, memory = result["measured"], result["memory"]
        increment = measured["peak_memory"]["increment_bytes"]
        assert memory["transient_peak_bytes"] == pytest.approx(increment, rel=0.10), model["name"]
        assert result["comparison"]["transient_ratio"] == memory["transient_peak_bytes"] / increment
        assert measured["steps"] >= 1 and measured["p50_ms"] > 0
        assert measured["samples_per_s"] == pytest.approx(measured["samples_per_step"] / measured["p50_ms"] * 1e3)
        assert "mmap threshold fixed" in measured["memory_method"]
    shown = rpx_cli("show", str(tmp_path / "out.toml"), env={"PYTHONPATH": str(REPO)})
    assert shown.returncode == 0 and "Training step: memory, predicted item by item and measured" in shown.stdout


def test_ratios_are_predicted_over_measured_and_absent_where_not_comparable():
    from rpx_core.registry.backends import MemoryPeak, with_start
    from rpx_plugins.training.measure import compare

    read = with_start(MemoryPeak("m", peak_bytes=2000), 1200)  # an increment of 800
    device = compare(1000, 600, read, on_host=False)
    assert (device.transient_ratio, device.peak_ratio, device.resident_ratio) == (0.75, 0.8, 1000 / 1200)
    host = compare(1000, 600, read, on_host=True)
    assert (host.transient_ratio, host.peak_ratio, host.resident_ratio) == (0.75, None, None)
    nothing_seen = compare(1000, 600, with_start(MemoryPeak("m", peak_bytes=1200), 1200), on_host=True)
    assert nothing_seen.transient_ratio is None and "no ratio" in nothing_seen.note


def test_a_result_survives_the_results_file(tmp_path):
    """TOML drops None: every field that may be None has a default, and a written result loads back as it was."""
    import rpx_core.types.training as types
    from rpx_core.api import profile
    from rpx_core.results.records import typed
    from rpx_core.results.serialise import loads
    from tests.training_models import mlp

    for kind in (getattr(types, name) for name in dir(types)):
        for field in attrs.fields(kind) if isinstance(kind, type) and attrs.has(kind) else ():
            assert "None" not in str(field.type) or field.default is not attrs.NOTHING, (kind.__name__, field.name)
    run = profile(mlp(), [(8, 64)], stages=["train_step"], gpus=["H100-SXM"],
                  options={"train_step": {"measure": False, "optimizer": "sgd"}}, output=tmp_path / "out.toml")
    loaded = typed(loads((tmp_path / "out.toml").read_text()), {"train_step": types.TrainStepResult})
    assert loaded.models[0].stages["train_step"].result == run.stages["train_step"].result


def test_the_foreach_path_counts_the_same_work_and_holds_one_list_of_temporaries():
    """AdamW's multi-tensor path (CUDA's default): the same FLOPs, and at its peak the gradients beside the square
    roots of every second moment at once (the single-tensor path holds two of one parameter's)."""
    _, parameters, tensors = mlp_count(8)
    result = train_step("mlp", [(8, 64)], optimizer="adamw", optimizer_settings={"foreach": True})
    assert result.phases["optimizer"].flops == ADAMW_PER_ELEMENT * parameters + tensors
    at_peak = {item.name: item.bytes for item in result.memory.at_peak}
    assert at_peak == {"gradients": 4 * parameters, "optimizer_temporaries": 4 * parameters}


def test_a_fake_count_takes_the_optimizers_path_of_the_device():
    import torch

    from rpx_plugins.training.torch_step import device_default

    assert device_default(torch.optim.AdamW, {"lr": 1.0}, "cuda") == {"lr": 1.0, "foreach": True}
    assert device_default(torch.optim.AdamW, {"lr": 1.0}, "cpu") == {"lr": 1.0}
    assert device_default(torch.optim.AdamW, {"fused": True}, "cuda") == {"fused": True}  # the user chose
    assert device_default(torch.optim.LBFGS, {}, "cuda") == {}  # no foreach path
