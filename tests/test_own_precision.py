"""A model profiled without a precision is sized and run at its own (bf16, fp16, fp8 parameters as they are), on
every backend, and the precision used is written in the results; torch and JAX runs of one model compare figure for
figure (shapes in one normal form)."""

from __future__ import annotations

import pytest
import torch

import rpx_core as rpx
from rpx_core.show.compare import compare
from tests.conftest import builtin_stages

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
linen = pytest.importorskip("flax.linen")

QUICK = {"max_seconds": 1.0, "min_samples": 10, "adaptive": False, "throughput_seconds": 0.02}


def flax_dense(dtype) -> tuple:
    """Dense(64 -> 32) with its parameters stored at ``dtype``: 64 x 32 + 32 = 2,080 of them."""
    module = linen.Dense(32, param_dtype=dtype, dtype=dtype)
    variables = module.init(jax.random.key(0), jnp.ones((1, 64), dtype))
    return module, variables


def test_a_bf16_torch_model_and_a_bf16_flax_model_are_sized_at_2_bytes_per_parameter():
    torch_result = rpx.profile(torch.nn.Linear(64, 32).to(torch.bfloat16), inputs=[(1, 64)],
                               stages=["count_params", "measure_latency"], options={"measure_latency": QUICK})
    flax_result = rpx.profile(flax_dense(jnp.bfloat16), inputs=[(1, 64)], stages=["count_params", "measure_latency"],
                              options={"measure_latency": QUICK})
    for result in (torch_result, flax_result):
        params = result.result("count_params")
        assert result.precision == params.precision == "bf16"
        assert params.total == 2080 and params.bytes_at_precision == 2 * 2080
        latency = result.result("measure_latency")
        assert latency.precision == "bf16" and latency.measured_inputs in (("bfloat16[1,64]",),)


def test_fp8_and_fp16_parameters_are_sized_as_they_are():
    fp16 = rpx.profile(flax_dense(jnp.float16), inputs=[(1, 64)], stages=["count_params"])
    fp8 = rpx.profile(flax_dense(jnp.float8_e4m3fn), inputs=[(1, 64)], stages=["count_params"])
    assert (fp16.precision, fp16.result("count_params").bytes_at_precision) == ("fp16", 2 * 2080)
    assert (fp8.precision, fp8.result("count_params").bytes_at_precision) == ("fp8", 2080)
    torch_fp8 = rpx.profile(torch.nn.Linear(64, 32).to(torch.float8_e4m3fn), inputs=[(1, 64)], stages=["count_params"])
    assert (torch_fp8.precision, torch_fp8.result("count_params").bytes_at_precision) == ("fp8", 2080)


def test_a_precision_asked_for_still_wins():
    result = rpx.profile(flax_dense(jnp.bfloat16), inputs=[(1, 64)], precision="fp32", stages=["count_params"])
    assert result.precision == "fp32" and result.result("count_params").bytes_at_precision == 4 * 2080


def test_the_same_model_on_torch_and_jax_compares_without_a_shape_note(tmp_path):
    """One Dense(64 -> 32) in both frameworks (the same parameters), counted and measured at input (1, 64): the
    shapes are written the same way ("float32[1,64]"), so no "input shapes differ" note, and the latencies get a
    ratio. (Counted figures still carry a note: each counter states its convention in its own operator names.)"""
    module, variables = flax_dense(jnp.float32)
    layer = torch.nn.Linear(64, 32)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(jax.device_get(variables["params"]["kernel"]).T.copy()))
        layer.bias.copy_(torch.tensor(jax.device_get(variables["params"]["bias"]).copy()))
    stages = ["count_params", "count_flops", "estimate_traffic", "measure_latency"]
    paths = []
    for label, model in (("torch", layer), ("jax", (module, variables))):
        path = tmp_path / f"{label}.toml"
        rpx.profile(model, inputs=[(1, 64)], name="dense", stages=stages, output=path,
                    options={"measure_latency": QUICK})
        paths.append(path)
    runs = [(str(path), rpx.load_results(path)) for path in paths]
    first, second = (run.model("dense") for _, run in runs)
    assert first.result("count_flops").counted_inputs == second.result("count_flops").counted_inputs == ("float32[1,64]",)
    assert first.result("count_flops").macs == second.result("count_flops").macs == 64 * 32
    table = compare(runs, builtin_stages())
    assert not any("shapes differ" in note for note in table.notes), table.notes
    ratios = {row[1].text: row[-2].value for row in table.rows}
    assert ratios["latency p50"] is not None  # measured at the same shape and precision: a ratio, not a note
