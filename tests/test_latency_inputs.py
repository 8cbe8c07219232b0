"""One job, one input: latency times the call count_flops counted and the roofline bounded, at the job's inputs as
written (after a sweep set them); ``batch_sizes`` only add throughput rows. The bound and the measured time are then
set side by side (``fraction_of_roofline``) only for the same call, and only when the fraction can be true."""

from __future__ import annotations

import statistics
import textwrap
import time

import pytest
import torch

import rpx_core as rpx
from rpx_core.registry.manager import Plugins
from tests.fake_gpu import MB, DeviceLinear, FakeGpu

FAST = {"max_seconds": 2.0, "min_samples": 20, "adaptive": False, "throughput_seconds": 0.05,
        "throughput_min_calls": 2}


def test_a_cpu_linear_is_timed_at_the_input_it_was_counted_at():
    """Linear(512, 512) at input (512, 512): the counted and the measured call are one call of 512 rows, and its time
    is a 512-row call's (a 1-row call, timed here beside it, is far quicker)."""
    layer = torch.nn.Linear(512, 512)
    result = rpx.profile(layer, inputs=[(512, 512)], stages=["count_flops", "measure_latency"],
                         batch_sizes=[1], options={"measure_latency": FAST})
    flops, latency = result.result("count_flops"), result.result("measure_latency")
    assert flops.counted_inputs == latency.measured_inputs == ("float32[512,512]",)
    assert latency.measured_batch_size == flops.counted_batch_size == 512
    assert latency.precision == "fp32" and [row.batch_size for row in latency.throughput] == [1]
    one_row = torch.randn(1, 512)
    with torch.inference_mode():
        singles = []
        for _ in range(50):
            started = time.perf_counter()
            layer(one_row)
            singles.append(time.perf_counter() - started)
    assert latency.p50_ms / 1e3 > 10 * statistics.median(singles)  # 512x the work; overheads keep it far below 512x


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    return FakeGpu("cuda", total_bytes=80 * 10**9, context_bytes=500 * MB).install(monkeypatch).install_tensor_factories(
        monkeypatch)


def test_on_cuda_latency_and_bound_describe_the_same_4096_row_call(gpu):
    """Linear(4096, 4096) in bf16 at input (4096, 4096) on a fake H100 that runs it at 40% of the bf16 peak: counted
    on meta, timed with (fake) CUDA events at the same input, so bound / measured is that 40%. Timed at batch 1 as
    rpx did before, the "fraction" would have been about 4096 x 0.4 / 2: a GPU faster than physics."""
    peak = Plugins.load().gpu_catalog().get("H100-SXM").peaks["bf16"].tflops * 1e12
    layer = DeviceLinear(gpu, 4096, peak_flop_s=peak, efficiency=0.4)
    result = rpx.profile(layer, inputs=[(4096, 4096)], backend="cuda", precision="bf16", gpus=["H100-SXM"],
                         stages=["roofline", "measure_latency"], options={"measure_latency": FAST})
    flops, latency, roofline = (result.result(name) for name in ("count_flops", "measure_latency", "roofline"))
    assert flops.counted_inputs == latency.measured_inputs == ("bfloat16[4096,4096]",)
    assert flops.total_flops == 2 * 4096**3  # no bias: matrix FLOPs only
    assert roofline.local_gpu == "H100-SXM"
    bound = roofline.gpus["H100-SXM"]["bf16"]
    assert bound.bottleneck_fused == "compute" and bound.compute_ms == pytest.approx(2 * 4096**3 / peak * 1e3)
    assert latency.p50_ms == pytest.approx(2 * 4096**3 / (0.4 * peak) * 1e3)  # the modelled kernel, from the events
    summary = result.summary
    assert summary["fraction_of_roofline"] == pytest.approx(0.4) and "efficiency_problem" not in summary
    assert summary["measured_vs_bound_precision"] == "bf16" and summary["measured_gpu"] == "H100-SXM"


def test_a_measured_time_below_the_bound_is_refused_and_the_disagreeing_figure_named(gpu):
    """A device "faster than its peak" (the kernel runs at 150% of it): rpx prints no fraction and says that the
    counted FLOPs at the measured time would exceed the pack's peak."""
    peak = Plugins.load().gpu_catalog().get("H100-SXM").peaks["bf16"].tflops * 1e12
    result = rpx.profile(DeviceLinear(gpu, 4096, peak_flop_s=peak, efficiency=1.5), inputs=[(4096, 4096)],
                         backend="cuda", precision="bf16", gpus=["H100-SXM"], stages=["roofline", "measure_latency"],
                         options={"measure_latency": FAST})
    problem = result.summary["efficiency_problem"]
    assert "fraction_of_roofline" not in result.summary
    assert problem.startswith("measured ") and "which nothing can beat" in problem
    assert f"above the H100-SXM bf16 peak of {peak / 1e12:g} TFLOP/s" in problem and "count_flops' count" in problem
    assert "GB/s" not in problem  # the bytes agree with the bandwidth: only the compute side is named


def test_a_batch_sweeps_latency_grows_with_the_batch(tmp_path):
    """A real CPU MLP swept over batch 1, 32 and 256 from a TOML spec: each point is timed at its own batch (before,
    every point read the batch-1 time), so the p50 grows with the batch, as the counted FLOPs do."""
    (tmp_path / "mlp.py").write_text(textwrap.dedent("""
        import torch

        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    """))
    spec = tmp_path / "sweep.toml"
    spec.write_text(textwrap.dedent(f"""
        stages = ["count_flops", "measure_latency"]
        output = "{tmp_path / 'results.toml'}"

        [[models]]
        name = "mlp"
        source = "mlp.py:mlp"
        inputs = [{{ shape = [1, 256] }}]

        [sweep]
        batch_size = [1, 32, 256]

        [options.measure_latency]
        max_seconds = 2.0
        min_samples = 20
        adaptive = false
    """))
    run = rpx.run(spec)
    points = {model.coordinates["batch_size"]: model for model in run.models}
    p50 = {batch: model.result("measure_latency").p50_ms for batch, model in points.items()}
    for batch, model in points.items():
        latency = model.result("measure_latency")
        assert latency.measured_inputs == model.result("count_flops").counted_inputs == (f"float32[{batch},256]",)
        assert latency.measured_batch_size == batch and [row.batch_size for row in latency.throughput] == [1]
    assert p50[1] < p50[32] < p50[256], p50
    assert "latency_ms_per_sample" in points[1].summary and "latency_ms_per_sample" not in points[256].summary


def test_an_input_without_a_batch_dimension_round_trips_through_toml(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent("""
        [[models]]
        name = "m"
        source = "rpx_plugins.torch.zoo:tiny_cnn"
        inputs = [{ shape = [3, 32, 32], batch_dim = "none" }, { shape = [1, 3], batch_dim = 1 }]
    """))
    loaded = rpx.load_spec(spec)
    first, second = loaded.models[0].inputs
    assert first.batch_dim is None and second.batch_dim == 1
    assert loaded.models[0].batch_size(8) == 8 and first.with_batch(8).shape == (3, 32, 32)
    import tomli_w

    again = tmp_path / "again.toml"
    again.write_text(tomli_w.dumps(loaded.to_data()))  # what a results file's provenance and --save-spec write
    assert 'batch_dim = "none"' in again.read_text()
    assert rpx.load_spec(again).models == loaded.models


@pytest.mark.parametrize("value, problem", [
    (-1, 'must be >= 0 (dimensions count from 0; "none" for an input without a batch dimension), got -1'),
    ('"no"', 'expected an integer >= 0 (the batch dimension) or "none" (no batch dimension), got \'no\''),
])
def test_validate_refuses_a_negative_or_misspelled_batch_dim(tmp_path, value, problem):
    from rpx_core.errors import SpecError

    spec = tmp_path / "bad.toml"
    spec.write_text(textwrap.dedent(f"""
        [[models]]
        name = "m"
        source = "rpx_plugins.torch.zoo:tiny_cnn"
        inputs = [{{ shape = [1, 3, 32, 32], batch_dim = {value} }}]
    """))
    with pytest.raises(SpecError) as caught:
        rpx.load_spec(spec)
    assert str(caught.value) == f"{spec}: models[0].inputs[0].batch_dim: {problem}"
