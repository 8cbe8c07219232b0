"""The jax backend on real JAX (CPU): probe, devices, inputs, execution, and Tier 1 against hand-computed values.

Models are run through the real engine (``run_spec``) wherever a figure is checked, so plugin wiring, caching between
stages and result records are exercised too. Hand computations are written out next to each assertion.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpx_core.api import run_spec
from rpx_core.errors import BackendUnavailable, UnsupportedError
from rpx_core.registry.backends import MemoryPeak
from rpx_core.registry.manager import Plugins
from rpx_core.results.records import ModelResult
from rpx_core.spec.schema import load_spec, spec_from_dict
from rpx_core.types.counts import OTHERS
from rpx_plugins.jax import jaxpr as jax_jaxpr
from rpx_plugins.jax.backend import (
    DEVICE_PEAK_NO_REGION,
    DEVICE_PEAK_NOT_RAISED,
    DEVICE_PEAK_RAISED,
    JaxBackend,
    JaxModel,
    device_peak,
)
from rpx_plugins.jax.zoo import mlp

SPECS = Path(__file__).resolve().parents[1] / "specs"
TIER1 = ["count_params", "count_flops", "estimate_traffic"]
FAST_LATENCY = {
    "min_samples": 5, "max_seconds": 30.0, "warmup_calls": 1,  # max_seconds bounds warm-up (compilation) too "warmup_seconds": 0.0,
    "throughput_seconds": 0.05, "throughput_min_calls": 2,
    "adaptive": False,  # a fixed count: max_seconds is high for compilation, and a noisy machine would fill half of it
}


@pytest.fixture(scope="module")
def plugins() -> Plugins:
    loaded = Plugins.load()
    assert {"jax", "jax-counts"} <= {info.name for info in loaded.infos() if info.status == "loaded"}
    return loaded


def profile(plugins: Plugins, model: object, inputs: list[dict], stages: list[str], **settings: object) -> ModelResult:
    """Run ``model`` through the engine on the jax backend; Tier 1 counts the inputs as written unless ``options``
    say otherwise."""
    table = {"name": "m", "source": "<object>:model", "inputs": inputs}
    spec = spec_from_dict({"backend": "jax", "stages": stages, "models": [table], **settings})
    return run_spec(spec, plugins=plugins, output=None, model_objects={"m": model}).model("m")


def ok(result: ModelResult, stage: str) -> object:
    record = result.stages[stage]
    assert record.status == "ok", record.error
    return record.result


def dense_relu(params: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ params["w"] + params["b"])


def dense_relu_model() -> JaxModel:
    w = jax.random.normal(jax.random.key(1), (64, 32))
    return JaxModel(dense_relu, {"w": w, "b": jnp.zeros(32)})


def dense_layernorm_gelu(params: dict, x: jax.Array) -> jax.Array:
    """Dense, layer norm over the features (learned scale and shift), GELU in erf form."""
    y = x @ params["w"]
    centred = y - y.mean(-1, keepdims=True)
    normed = centred * jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + 1e-5)
    return jax.nn.gelu(normed * params["g"] + params["b"], approximate=False)


def dense_layernorm_gelu_model() -> JaxModel:
    w = jax.random.normal(jax.random.key(1), (64, 32))
    return JaxModel(dense_layernorm_gelu, {"w": w, "g": jnp.ones(32), "b": jnp.zeros(32)})


def counted(fn: object, *avals: jax.ShapeDtypeStruct) -> jax_jaxpr.JaxprCounts:
    """The jaxpr walk of ``fn`` traced at ``avals`` (no weights marked)."""
    counts = jax_jaxpr.JaxprCounts()
    jax_jaxpr.walk(jax.jit(fn).trace(*avals).jaxpr.jaxpr, set(), counts)
    return counts


def other_flops(counts: jax_jaxpr.JaxprCounts) -> int:
    return sum(call.other_flops * n for call, n in counts.executions.items())


# -- probe and devices -------------------------------------------------------------------------------------------------


def test_probe_reports_the_cpu_device_and_the_default_device():
    backend = JaxBackend()
    assert backend.availability.available
    assert f"jax {jax.__version__}, cpu: 1 device (cpu)" == backend.availability.reason
    assert backend.default_device() == "cpu:0"


def test_probe_without_jax_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))
    availability = JaxBackend().availability
    assert not availability.available
    assert availability.reason == "jax is not installed (pip install 'rpx[jax]')"


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        ("gpu:0", "Unknown backend: 'gpu' requested, but no platforms that are instances of gpu are present"),
        ("cpu:3", "jax has 1 cpu device(s), indices 0-0"),
    ],
)
def test_a_missing_device_is_one_line_naming_backend_and_reason(device, reason):
    with pytest.raises(BackendUnavailable) as caught:
        JaxBackend().check_device(device)
    message = str(caught.value)
    assert message.startswith(f"backend 'jax': device '{device}' is not available: ") and reason in message
    assert "\n" not in message
    JaxBackend().check_device("cpu:0")  # present: no error


def test_a_spec_asking_for_gpu_fails_before_any_stage_with_that_line(plugins):
    with pytest.raises(BackendUnavailable) as info:
        profile(plugins, dense_relu_model(), [{"shape": [8, 64]}], ["count_flops", "measure_latency"], device="gpu:0")
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("backend 'jax': device 'gpu:0' is not available: Unknown backend")


# -- inputs, placement, execution ----------------------------------------------------------------------------------------


def test_inputs_follow_the_precision_the_bounds_and_the_batch_size():
    inputs = [
        {"shape": [4, 16]},
        {"shape": [4, 7], "dtype": "int64", "high": 5, "name": "ids"},
        {"shape": [3], "dtype": "bool", "batch_dim": None, "name": "mask"},
    ]
    (model,) = spec_from_dict({"models": [{"name": "m", "source": "x:y", "inputs": inputs}]}).models
    backend = JaxBackend()
    args, kwargs = backend.make_inputs(model, 2, "bf16", "cpu:0")
    again, _ = backend.make_inputs(model, 2, "bf16", "cpu:0")
    (x,) = args
    assert x.shape == (2, 16) and x.dtype == jnp.bfloat16 and x.devices() == {jax.devices("cpu")[0]}
    assert np.array_equal(x, again[0])  # a fixed key: every run sees the same inputs
    ids = np.asarray(kwargs["ids"])
    assert ids.shape == (2, 7) and ids.dtype == np.int32  # int64 -> int32: JAX's default without jax_enable_x64
    assert ids.min() >= 0 and ids.max() < 5
    assert kwargs["mask"].shape == (3,) and not kwargs["mask"].any()


def test_place_model_casts_params_and_call_model_returns_ready_outputs():
    backend = JaxBackend()
    placed = backend.place_model(mlp((16, 8, 4)), "bf16", "cpu:0")
    leaves = jax.tree.leaves(placed.params)
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype("bfloat16")}
    assert all(leaf.devices() == {jax.devices("cpu")[0]} for leaf in leaves)
    x = jax.random.normal(jax.random.key(2), (2, 16), jnp.bfloat16)
    out = backend.call_model(placed, (x,), {})
    assert out.shape == (2, 4) and out.dtype == jnp.bfloat16 and out.is_ready()
    np.testing.assert_allclose(np.asarray(out, np.float32), numpy_mlp(placed.params, x), rtol=2e-2, atol=2e-2)


def numpy_mlp(params: list[dict], x: jax.Array) -> np.ndarray:
    """The MLP computed in numpy float32 from the placed (bf16) params."""
    h = np.asarray(x, np.float32)
    for i, layer in enumerate(params):
        h = h @ np.asarray(layer["w"], np.float32) + np.asarray(layer["b"], np.float32)
        if i < len(params) - 1:
            h = np.maximum(h, 0)
    return h


def test_models_are_accepted_in_the_documented_forms_only():
    backend = JaxBackend()
    placed = backend.place_model((dense_relu, {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}), "fp32", "cpu")
    assert placed.params["w"].dtype == jnp.float32
    with pytest.raises(UnsupportedError, match=r"JaxModel\(apply, params\) or an \(apply, params\) tuple, got function"):
        backend.place_model(dense_relu, "fp32", "cpu")
    with pytest.raises(UnsupportedError, match="cannot run precision 'fp8'; it supports fp32, fp16, bf16"):
        backend.place_model(dense_relu_model(), "fp8", "cpu")


def test_out_of_memory_is_xla_resource_exhausted():
    backend = JaxBackend()
    with pytest.raises(Exception) as caught:
        jnp.zeros(10**15, jnp.uint8).block_until_ready()  # the CPU client refuses: RESOURCE_EXHAUSTED
    assert backend.is_out_of_memory(caught.value)
    assert backend.is_out_of_memory(MemoryError())
    assert not backend.is_out_of_memory(ValueError("RESOURCE_EXHAUSTED in a message is not an XLA error"))


def test_device_peak_is_given_only_when_the_region_raised_it():
    unsupported = MemoryPeak(method="unsupported: jax reports no peak_bytes_in_use for platform 'cpu'")
    assert device_peak(None, "cpu", None) == unsupported
    no_peak_key = MemoryPeak(method="unsupported: jax reports no peak_bytes_in_use for platform 'tpu'")
    assert device_peak({"bytes_in_use": 10}, "tpu", 500) == no_peak_key
    # the process-wide peak rose from 500 to 900 during the region, so 900 was reached inside it
    assert device_peak({"peak_bytes_in_use": 900}, "gpu", 500) == MemoryPeak(method=DEVICE_PEAK_RAISED, peak_bytes=900)
    # still the 900 reached before the region: the region's own peak is unknown, so no figure, not a stale 900
    assert device_peak({"peak_bytes_in_use": 900}, "gpu", 900) == MemoryPeak(method=DEVICE_PEAK_NOT_RAISED)
    no_region = MemoryPeak(method=DEVICE_PEAK_NO_REGION, peak_bytes=900)  # only batch_search's capability check
    assert device_peak({"peak_bytes_in_use": 900}, "gpu", None) == no_region


# -- Tier 1 against hand-computed values ---------------------------------------------------------------------------------


def test_parameter_count_is_the_sum_of_leaf_sizes(plugins):
    result = profile(plugins, mlp((64, 128, 10)), [{"shape": [8, 64]}], ["count_params"], precision="bf16")
    params = ok(result, "count_params")
    total = (64 * 128 + 128) + (128 * 10 + 10)  # two dense layers: weights + biases
    assert (params.total, params.trainable, params.non_trainable, params.buffers) == (total, total, 0, 0)
    assert params.bytes_at_precision == total * 2 and params.precision == "bf16"
    assert result.stages["count_params"].provided_by == "jax-counts"


def test_integer_leaves_keep_their_size_and_a_repeated_leaf_counts_once(plugins):
    w = jnp.ones((3, 4))
    params = {"w": w, "tied": w, "step": jnp.array(7, jnp.int32)}
    model = JaxModel(lambda p, x: x @ p["w"], params)
    counted = ok(profile(plugins, model, [{"shape": [2, 3]}], ["count_params"], precision="fp16"), "count_params")
    assert counted.total == 12 + 1  # w once, step once
    assert counted.bytes_at_precision == 12 * 2 + 1 * 4  # floats at fp16, the int32 counter as stored


def test_matmul_flops_equal_the_hand_count(plugins):
    model = JaxModel(lambda p, x: x @ p["w"], {"w": jnp.ones((64, 32))})
    flops = ok(profile(plugins, model, [{"shape": [8, 64]}], ["count_flops"]), "count_flops")
    macs = 8 * 64 * 32  # x[8,64] @ W[64,32]: 8*32 outputs, 64 multiply-adds each
    assert (flops.macs, flops.matrix_flops, flops.other_flops, flops.total_flops) == (macs, 2 * macs, 0, 2 * macs)
    assert flops.counted_on == "abstract" and flops.by_phase == {"forward": 2 * macs} and flops.uncounted_ops == {}
    assert flops.by_operator["dot_general"].calls == 1 and flops.by_operator["dot_general"].matrix_flops == 2 * macs


def test_other_flops_are_the_same_at_fp32_and_bf16_and_equal_the_hand_count(plugins):
    def count(model: JaxModel, precision: str) -> object:
        return ok(profile(plugins, model, [{"shape": [8, 64]}], ["count_flops"], precision=precision), "count_flops")

    # dense + ReLU: bias add and relu's max, 1 per output element each (the broadcast of b and bf16's converts: 0)
    dense = [count(dense_relu_model(), precision) for precision in ("fp32", "bf16")]
    assert [f.other_flops for f in dense] == [8 * 32 + 8 * 32] * 2
    # largest FLOPs first; add before max on bytes (it also reads the broadcast bias row)
    by_operator = [(op, s.calls, s.matrix_flops, s.other_flops) for op, s in dense[0].by_operator.items()]
    assert by_operator == [
        ("dot_general", 1, 2 * 8 * 64 * 32, 0), ("add", 1, 0, 8 * 32), ("max", 1, 0, 8 * 32), ("broadcast_in_dim", 1, 0, 0)
    ]
    # dense + layer norm + GELU on y[8,32]: per element of y, reduce_sum, sub, square (mul), reduce_sum, scale by rstd,
    # scale by g, shift by b (7, torch's layer norm with weight and bias) + GELU's erf form (5, as torch's gelu); per
    # row, two mean divides, + eps and rsqrt (4). bf16's mean adds converts to f32 and back: 0 each.
    elements, rows = 8 * 32, 8
    normed = [count(dense_layernorm_gelu_model(), precision) for precision in ("fp32", "bf16")]
    assert [f.other_flops for f in normed] == [(7 + 5) * elements + 4 * rows] * 2
    assert all(f.macs == 8 * 64 * 32 and f.uncounted_ops == {} for f in dense + normed)


@pytest.mark.parametrize(
    ("fn", "flops", "why"),
    [
        (lambda x: jax.nn.gelu(x, approximate=True), 9 * 8 * 32, "x**3 (2), 3 multiplies, 2 adds, tanh, x * (1)"),
        (jax.nn.silu, 5 * 8 * 32, "sigmoid (logistic: 4, as torch) + multiply"),
        (lambda x: x**-2, 2 * 8 * 32, "integer_pow y=-2: one multiply, one divide"),
        (jax.nn.softmax, 5 * 8 * 32 + 8, "max, sub, exp, sum, divide per element (torch's 5); max(-inf) per row"),
        (
            lambda x: jax.lax.reduce_window(x.reshape(16, 16), -jnp.inf, jax.lax.max, (2, 2), (2, 2), "VALID"),
            4 * 8 * 8,
            "2x2 max pool: window volume 4 per output, 8x8 outputs (the reshape: 0)",
        ),
        (
            lambda x: jnp.concatenate([x.T, x.T.astype(jnp.bfloat16).astype(jnp.float32)]).reshape(-1)[3:100],
            0,
            "transposes, converts, concatenation, reshape, slice: 0 by definition",
        ),
    ],
)
def test_the_per_element_table_prices_each_primitive(fn, flops, why):
    counts = counted(fn, jax.ShapeDtypeStruct((8, 32), jnp.float32))
    assert (other_flops(counts), counts.uncounted) == (flops, {}), why


def test_a_primitive_without_an_entry_is_listed_never_counted_as_zero(plugins):
    model = JaxModel(lambda w, x: jnp.sort(x @ w, axis=-1), jnp.ones((64, 32)))
    result = profile(plugins, model, [{"shape": [8, 64]}], ["count_flops", "estimate_traffic"])
    flops = ok(result, "count_flops")
    assert flops.uncounted_ops == {"sort": 1} and flops.other_flops == 0
    assert "any other primitive is listed in uncounted_ops" in flops.other_flops_convention
    y = 8 * 32 * 4
    sort = [r for r in ok(result, "estimate_traffic").op_records if r.op == "sort"]
    assert [(r.count, r.flops, r.bytes_read, r.bytes_written) for r in sort] == [(1, 0, y, y)]  # its bytes still count


def test_traffic_and_activation_peak_equal_the_hand_count(plugins):
    result = profile(plugins, dense_relu_model(), [{"shape": [8, 64]}], ["count_flops", "estimate_traffic"])
    traffic = ok(result, "estimate_traffic")
    f32 = 4
    x, w, b, y, b_row = 8 * 64 * f32, 64 * 32 * f32, 32 * f32, 8 * 32 * f32, 1 * 32 * f32
    # the jaxpr: d = dot(x, w); e = broadcast(b) -> [1,32]; f = add(d, e); g = max(f, 0.0) (inside relu's jit)
    assert traffic.unfused_weight_read_bytes == w + b  # dot reads w, broadcast reads b
    assert traffic.unfused_activation_read_bytes == x + (y + b_row) + y  # dot reads x, add reads d and e, max reads f
    assert traffic.unfused_written_bytes == y + b_row + y + y  # d, e, f, g
    assert traffic.unfused_bytes == (w + b) + (x + y + b_row + y) + (3 * y + b_row)
    assert (traffic.weight_bytes, traffic.input_bytes, traffic.output_bytes) == (w + b, x, y)
    assert traffic.fused_bytes == w + b + x + y
    assert traffic.activation_peak_bytes == y + b_row + y  # during the add: d and e live, f being written
    assert traffic.activation_peak_bytes_fp16 == (y + b_row + y) // 2
    total = ok(result, "count_flops").total_flops
    assert traffic.arithmetic_intensity_fused == total / traffic.fused_bytes
    # one record per equation, largest bytes first: (op, count, flops, macs, bytes read, bytes written, inputs)
    assert [(r.op, r.count, r.flops, r.macs, r.bytes_read, r.bytes_written, r.inputs) for r in traffic.op_records] == [
        ("dot_general", 1, 2 * 8 * 64 * 32, 8 * 64 * 32, x + w, y, "float32[8,64], float32[64,32]"),
        ("add", 1, 8 * 32, 0, y + b_row, y, "float32[8,32], float32[1,32]"),
        ("max", 1, 8 * 32, 0, y, y, "float32[8,32]"),
        ("broadcast_in_dim", 1, 0, 0, b, b_row, "float32[32]"),
    ]
    # XLA's own figures are information only: its flops on CPU are the matmul + bias + relu here (fp32, no converts)
    assert any(f"flops {2 * 8 * 64 * 32 + 2 * 8 * 32}, transcendentals" in line for line in traffic.assumptions)


def test_operator_records_add_up_to_the_whole_pass(plugins):
    model = mlp((64, 128, 128, 10))  # repeated layers: identical equations share a record with a count
    result = profile(plugins, model, [{"shape": [8, 64]}], ["count_flops", "estimate_traffic"])
    flops, traffic = ok(result, "count_flops"), ok(result, "estimate_traffic")
    records = traffic.op_records
    assert sum(r.count * (r.bytes_read + r.bytes_written) for r in records) == traffic.unfused_bytes
    assert sum(r.count * r.flops for r in records) == flops.total_flops
    assert sum(r.count * r.macs for r in records) == flops.macs
    # on [8,128] activations: both hidden layers' bias add and relu share a record; the two matmuls differ in shape
    on_hidden = sorted((r.op, r.count, r.flops) for r in records if r.inputs.startswith("float32[8,128]"))
    assert on_hidden == [
        ("add", 2, 8 * 128),
        ("dot_general", 1, 2 * 8 * 128 * 10),
        ("dot_general", 1, 2 * 8 * 128 * 128),
        ("max", 2, 8 * 128),
    ]


def test_closed_over_constants_count_as_weights(plugins):
    mask = jnp.ones((8, 64))  # an array the function closes over: baked into the program like a buffer
    model = JaxModel(lambda w, x: (x * mask) @ w, jnp.ones((64, 32)))
    traffic = ok(profile(plugins, model, [{"shape": [8, 64]}], ["estimate_traffic"]), "estimate_traffic")
    w, m = 64 * 32 * 4, 8 * 64 * 4
    assert traffic.weight_bytes == w + m
    assert traffic.unfused_weight_read_bytes == m + w  # the mul reads the mask, the dot reads w


def test_scan_counts_every_iteration(plugins):
    def apply(w, x):
        return jax.lax.scan(lambda carry, _: (jnp.tanh(carry @ w), None), x, None, length=5)[0]

    flops = ok(profile(plugins, JaxModel(apply, jnp.ones((64, 64))), [{"shape": [8, 64]}], ["count_flops"]), "count_flops")
    assert flops.macs == 5 * 8 * 64 * 64  # five iterations of [8,64] @ [64,64]
    assert flops.other_flops == 5 * 8 * 64  # and five tanh, one per element (XLA would count the body once)
    assert flops.uncounted_ops == {}


def test_padded_convolution_counts_every_tap_like_torch(plugins):
    def apply(w, x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jax.nn.relu(y)

    model = JaxModel(apply, jnp.ones((16, 3, 3, 3)))
    flops = ok(profile(plugins, model, [{"shape": [2, 3, 8, 8]}], ["count_flops"]), "count_flops")
    macs = (2 * 16 * 8 * 8) * 3 * (3 * 3)  # outputs x input channels x kernel taps, padding taps included
    assert flops.macs == macs
    assert flops.other_flops == 2 * 16 * 8 * 8  # relu


def test_transposed_convolution_counts_input_positions_like_torch():
    w = jax.ShapeDtypeStruct((12, 6, 3, 3), jnp.float32)
    x = jax.ShapeDtypeStruct((2, 6, 9, 7), jnp.float32)
    dn = ("NCHW", "OIHW", "NCHW")
    transposed = jax.jit(lambda w, x: jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), (2, 2), None, dn))
    ((call, _),) = counted(transposed, w, x).executions.items()
    assert call.macs == (2 * 6 * 9 * 7) * 12 * (3 * 3)  # input elements x output channels x kernel taps


def test_count_options_apply_as_for_torch(plugins):
    def apply(params, x):
        y = jax.lax.conv_general_dilated(x, params["conv"], (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y.reshape(y.shape[0], -1) @ params["head"]

    model = JaxModel(apply, {"conv": jnp.ones((4, 3, 3, 3)), "head": jnp.ones((4 * 6 * 6, 5))})
    inputs = [{"shape": [2, 3, 8, 8]}]
    options = {"count_flops": {"top_k": 1, "batch_size": 3}}
    flops = ok(profile(plugins, model, inputs, ["count_flops"], options=options), "count_flops")
    conv_macs, head_macs = 3 * (4 * 6 * 6) * 3 * 9, 3 * (4 * 6 * 6) * 5  # batch 3, as the options ask
    assert flops.macs == conv_macs + head_macs and flops.top_k == 1
    assert list(flops.by_operator) == ["conv_general_dilated", OTHERS]  # the larger kept, the rest summed
    others = flops.by_operator[OTHERS]  # the reshape and the head matmul, summed
    assert (others.calls, others.matrix_flops, others.other_flops) == (2, 2 * head_macs, 0)
    backward = ok(profile(plugins, model, inputs, ["count_flops"], options={"count_flops": {"backward": True}}),
                  "count_flops")
    # batch 2 as written; the gradient w.r.t. the params only (the input needs none): the head's weight gradient
    # (flat^T @ g) and its input gradient (g @ head^T), then the conv's weight gradient (x convolved with that), one
    # forward-sized matrix product each
    conv2, head2 = 2 * (4 * 6 * 6) * 3 * 9, 2 * (4 * 6 * 6) * 5
    assert backward.backward and backward.macs == (conv2 + head2) + (conv2 + 2 * head2)
    assert set(backward.by_phase) == {"forward", "backward"}


def test_abstract_params_are_counted_but_never_run(plugins):
    params = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32)}
    stages = ["count_params", "count_flops", "measure_latency"]
    result = profile(plugins, JaxModel(lambda p, x: x @ p["w"], params), [{"shape": [8, 64]}], stages)
    assert ok(result, "count_params").total == 64 * 32
    assert ok(result, "count_flops").macs == 8 * 64 * 32
    assert "params are abstract (jax.ShapeDtypeStruct), so it cannot run" in result.stages["measure_latency"].error


def test_data_dependent_loops_are_refused_out_loud(plugins):
    def apply(w, x):
        return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c @ w, x)

    result = profile(plugins, JaxModel(apply, jnp.ones((4, 4))), [{"shape": [2, 4]}], ["count_flops"])
    assert result.stages["count_flops"].status == "failed"
    assert "cannot count 'while'" in result.stages["count_flops"].error


# -- the whole pipeline ------------------------------------------------------------------------------------------------


def test_an_mlp_through_tier1_and_measured_latency(plugins, tmp_path):
    stages = [*TIER1, "measure_latency"]
    options = {"count_flops": {}, "measure_latency": FAST_LATENCY}  # Tier 1 counts the inputs as written: batch 8
    result = profile(plugins, mlp((64, 32, 10)), [{"shape": [8, 64]}], stages, batch_sizes=[1, 4], options=options)
    assert ok(result, "count_params").total == (64 * 32 + 32) + (32 * 10 + 10)
    assert ok(result, "count_flops").macs == 8 * 64 * 32 + 8 * 32 * 10
    assert ok(result, "estimate_traffic").weight_bytes == 4 * ((64 * 32 + 32) + (32 * 10 + 10))
    measured = ok(result, "measure_latency")
    assert measured.samples_count >= 5 and 0 < measured.min_ms <= measured.max_ms
    assert [t.batch_size for t in measured.throughput] == [1, 4] and all(t.samples_per_s > 0 for t in measured.throughput)
    # JAX dispatches asynchronously: the same calls pipelined (one wait at the end) are reported beside the blocking ones
    assert all(t.pipelined_samples_per_s > 0 and t.pipelined_seconds > 0 for t in measured.throughput)
    assert measured.peak_memory.peak_bytes > 0 and "RSS" in measured.peak_memory.method
    assert all(result.stages[stage].provided_by == "jax-counts" for stage in TIER1)


def test_the_example_spec_runs_tier1_and_roofline(plugins):
    spec = load_spec(SPECS / "jax_mlp.toml")
    assert spec.backend == "jax" and "measure_latency" in spec.stages
    run = run_spec(spec, plugins=plugins, output=None, stages=[*TIER1, "roofline"])  # latency: see the mlp test above
    assert run.ok, [(m.name, s, r.error) for m in run.models for s, r in m.stages.items() if r.status != "ok"]
    assert run.model("mlp").result("count_params").total == (784 * 512 + 512) + (512 * 512 + 512) + (512 * 10 + 10)
    # every equation has a record, so the per-operator bound (sum of per-record max) is at least the whole-model
    # unfused bound (max of the sums); with matrix records only it fell below it
    for model in run.models:
        for bound in (b for by_precision in model.result("roofline").gpus.values() for b in by_precision.values()):
            assert bound.per_operator_ms >= bound.bound_ms_unfused * (1 - 1e-12), (model.name, bound.gpu)


# -- control flow and custom kernels, as documented in rpx_plugins.jax.jaxpr --------------------------------------------


def test_a_cond_records_every_branch_and_counts_the_largest(plugins):
    def apply(w, x):
        return jax.lax.cond(x.sum() > 0, lambda a: jnp.tanh(a), lambda a: a @ w, x)

    flops = ok(profile(plugins, JaxModel(apply, jnp.ones((32, 32))), [{"shape": [8, 32]}], ["count_flops"]),
               "count_flops")
    # branch 0 (false: the matmul) 2*8*32*32 FLOPs, branch 1 (tanh) 8*32; the sum and the compare outside: 8*32 + 1
    assert flops.macs == 8 * 32 * 32 and flops.other_flops == 8 * 32 + 1
    (note,) = flops.control_flow
    assert f"branch 0: {2 * 8 * 32 * 32} FLOPs" in note and f"branch 1: {8 * 32} FLOPs" in note
    assert "counted branch 0, the largest" in note


def test_a_bounded_while_counts_its_trip_count_and_an_unbounded_one_takes_the_option(plugins):
    def bounded(w, x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w), (0, x))[1]

    flops = ok(profile(plugins, JaxModel(bounded, jnp.ones((4, 4))), [{"shape": [2, 4]}], ["count_flops"]),
               "count_flops")
    assert flops.macs == 3 * 2 * 4 * 4  # three iterations of [2,4] @ [4,4]
    assert flops.other_flops == 4 + 3  # the condition's compare runs 4 times, the counter's add 3
    assert "body counted 3 times (its static trip count 3)" in flops.control_flow[0]

    def unbounded(w, x):
        return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c @ w, x)

    options = {"count_flops": {"while_iterations": 5}}
    flops = ok(profile(plugins, JaxModel(unbounded, jnp.ones((4, 4))), [{"shape": [2, 4]}], ["count_flops"],
                       options=options), "count_flops")
    assert flops.macs == 5 * 2 * 4 * 4 and "while_iterations = 5" in flops.control_flow[0]


def test_a_pallas_kernel_is_listed_uncounted_with_its_calls_and_the_rest_is_counted(plugins):
    from jax.experimental import pallas as pl

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def apply(w, x):
        y = x @ w
        return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype), interpret=True)(y)

    result = profile(plugins, JaxModel(apply, jnp.ones((64, 32))), [{"shape": [8, 64]}], ["count_flops", "estimate_traffic"])
    flops = ok(result, "count_flops")
    assert flops.uncounted_ops == {"pallas_call": 1} and flops.macs == 8 * 64 * 32
    kernel = [r for r in ok(result, "estimate_traffic").op_records if r.op == "pallas_call"]
    assert [(r.count, r.bytes_read, r.bytes_written) for r in kernel] == [(1, 8 * 32 * 4, 8 * 32 * 4)]


def test_fp8_and_int8_are_counted_on_abstract_values_at_one_byte(plugins):
    for precision in ("fp8", "int8"):
        result = profile(plugins, dense_relu_model(), [{"shape": [8, 64]}], TIER1, precision=precision)
        assert ok(result, "count_flops").macs == 8 * 64 * 32
        traffic = ok(result, "estimate_traffic")
        assert traffic.weight_bytes == 64 * 32 + 32 and traffic.input_bytes == 8 * 64  # 1 byte per element
        assert ok(result, "count_params").bytes_at_precision == 64 * 32 + 32


# -- TPUs in the reference pack, and every skipped roofline on the console -----------------------------------------------


def test_tpus_are_in_the_reference_pack_with_their_sources(plugins):
    catalog = plugins.gpu_catalog()
    figures = {name: (catalog.get(name).peak("bf16").tflops, catalog.get(name).bandwidth_gb_s)
               for name in ("TPU-v4", "TPU-v5e", "TPU-v5p", "TPU-v6e")}
    assert figures == {"TPU-v4": (275, 1200), "TPU-v5e": (197, 819), "TPU-v5p": (459, 2765), "TPU-v6e": (918, 1638)}
    assert all("cloud.google.com/tpu/docs" in catalog.get(name).source for name in figures)
    assert catalog.get("TPU v6 lite").name == "TPU-v6e"  # the device_kind JAX reports matches the entry


def test_a_roofline_skipped_for_a_missing_peak_is_shown_on_the_console_with_its_reason(plugins):
    from tests.conftest import console_text

    spec = spec_from_dict({"backend": "jax", "stages": ["roofline"], "gpus": ["TPU-v5e", "H100-SXM"],
                           "models": [{"name": "m", "source": "<object>:model", "inputs": [{"shape": [8, 64]}]}]})
    run = run_spec(spec, plugins=plugins, output=None, model_objects={"m": dense_relu_model()})
    assert "m: roofline skipped for TPU-v5e at fp32: GPU 'TPU-v5e' has no fp32 peak" in console_text(run)
