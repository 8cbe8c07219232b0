"""train_step on the jax backend: a Flax TrainState's step (its own tx, or an optax optimiser by name) counted by
phase, its predicted memory beside XLA's memory_analysis() of the compiled step, and real steps measured on the CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("flax")

from rpx_core.testing import make_context, run_stage  # noqa: E402
from rpx_plugins.jax import zoo  # noqa: E402

SIZES, BATCH = (256, 1024, 1024, 10), 512


def train_step(**options):
    state = zoo.train_state_mlp(SIZES)
    ctx = make_context(state, inputs=[(BATCH, SIZES[0])], stages=["train_step"], backend="jax",
                       options={"train_step": {"measure": False, **options}})
    return run_stage("train_step", ctx)


def parameters() -> int:
    return sum(i * o + o for i, o in zip(SIZES, SIZES[1:]))


@pytest.mark.parametrize("optimizer", [None, "adamw"])
def test_predicted_step_memory_is_within_10_percent_of_xlas_memory_analysis(optimizer):
    result = train_step(**({"optimizer": optimizer} if optimizer else {}))
    memory = result.memory
    assert memory.compiler is not None and "memory_analysis" in memory.compiler.source
    xla = memory.compiler
    assert xla.peak_bytes == xla.argument_bytes + xla.output_bytes - xla.alias_bytes + xla.temp_bytes
    assert memory.peak_bytes == pytest.approx(xla.peak_bytes, rel=0.10)
    assert result.optimizer == ("the TrainState's tx" if optimizer is None else "optax.adamw")


def test_resident_memory_and_matrix_work_by_phase_by_hand():
    result = train_step(optimizer="adamw")
    p = parameters()
    resident = {item.name: item.bytes for item in result.memory.resident}
    # float32 parameters; adamw's two moments and its int32 step count; the inputs and int32 class targets
    assert resident == {"parameters": 4 * p, "optimizer_state": 4 * 2 * p + 4, "batch": 4 * BATCH * SIZES[0] + 4 * BATCH}
    forward_macs = BATCH * sum(i * o for i, o in zip(SIZES, SIZES[1:]))
    assert result.phases["forward"].macs == forward_macs
    # weight gradients of every layer, input gradients of all but the first (the inputs are not differentiated)
    assert result.phases["backward"].macs == 2 * forward_macs - BATCH * SIZES[0] * SIZES[1]
    assert result.phases["optimizer"].macs == 0 and result.phases["optimizer"].flops > 10 * p
    assert result.uncounted_ops == {}
    assert result.loss.startswith("cross_entropy (auto: logits [512, 10]")


def test_autocast_casts_parameters_inside_the_step_and_keeps_them_fp32():
    state = zoo.train_state_mlp(SIZES)
    ctx = make_context(state, inputs=[(BATCH, SIZES[0])], stages=["train_step"], backend="jax", precision="bf16",
                       options={"train_step": {"measure": False}})
    result = run_stage("train_step", ctx)
    assert (result.precision_policy, result.parameter_dtype, result.compute_dtype) == ("autocast", "float32", "bfloat16")
    assert {item.name: item.bytes for item in result.memory.resident}["parameters"] == 4 * parameters()


def test_gradient_accumulation_repeats_forward_and_backward():
    one, two = train_step(optimizer="sgd"), train_step(optimizer="sgd", accumulation_steps=2)
    assert two.phases["forward"].macs == 2 * one.phases["forward"].macs
    assert two.phases["backward"].macs == 2 * one.phases["backward"].macs
    assert two.phases["optimizer"].flops == one.phases["optimizer"].flops


@pytest.mark.slow
def test_real_steps_are_measured_on_the_cpu(tmp_path):
    """In a worker process, as rpx runs a measured job (the host allocator's setting stays in that process). The step's
    tensors are above the 64 KiB mmap threshold (an activation of 128 x 1024 fp32 is 512 KiB), so the RSS sees them:
    with every tensor below it (a 64-128-10 MLP) the increment is whatever heap fragments were free, 0 to 70 KB."""
    import tomllib

    from tests.conftest import REPO, rpx_cli

    spec = tmp_path / "spec.toml"
    spec.write_text(f"""
stages = ["train_step"]
backend = "jax"
output = "{tmp_path / 'out.toml'}"
[[models]]
name = "state"
source = "rpx_plugins.jax.zoo:train_state_mlp"
kwargs = {{ sizes = [512, 1024, 10] }}
inputs = [{{ shape = [128, 512] }}]
[options.train_step]
min_steps = 3
max_seconds = 2
warmup_steps = 1
""")
    done = rpx_cli("run", str(spec), "--quiet", env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    result = tomllib.loads((tmp_path / "out.toml").read_text())["models"][0]["stages"]["train_step"]["result"]
    measured = result["measured"]
    assert measured["steps"] >= 1 and measured["p50_ms"] > 0 and measured["samples_per_step"] == 128
    increment = measured["peak_memory"]["increment_bytes"]
    assert increment > 2**20, measured["peak_memory"]
    assert result["comparison"]["transient_ratio"] == result["memory"]["transient_peak_bytes"] / increment
