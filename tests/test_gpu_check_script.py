"""scripts/gpu_check.py's own logic, on the CPU: what it reads from rpx's results (the profile run on the cpu
backend with a small spec), the latency-vs-roofline verdict, and which requirements it finds unmet."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_check)

SMALL = """
name = "small"
backend = "cpu"
precision = "fp32"
stages = ["count_params", "count_flops", "estimate_traffic", "roofline", "measure_latency"]
gpus = ["H100-SXM"]
batch_sizes = [1]
[options.measure_latency]
warmup_calls = 2
warmup_seconds = 0.0
min_samples = 10
max_seconds = 2.0
throughput_seconds = 0.05
[[models]]
name = "cnn"
source = "rpx_plugins.torch.zoo:tiny_cnn"
inputs = [{ shape = [1, 3, 32, 32], dtype = "float32" }]
"""


def test_profile_lines_read_rpx_results(tmp_path, monkeypatch):
    spec = tmp_path / "small.toml"
    spec.write_text(SMALL)
    monkeypatch.setattr(gpu_check, "PROFILE_SPEC", spec)
    report = gpu_check.Report(tmp_path)
    gpu_check.profile_lines(report, tmp_path, "cpu", ("fp32",))
    statuses = {check["name"]: (check["status"], check["figure"]) for check in report.checks}
    status, figure = statuses["profile cnn fp32"]
    assert status == "PASS" and figure.startswith("p50 ") and "GFLOP" in figure
    assert statuses["latency vs roofline cnn fp32"] == ("SKIP", "the GPU is not in rpx's catalogue")  # a CPU
    assert (tmp_path / "gpu-check-fp32.toml").exists()


def roofline(local: str | None, bound_ms: float) -> object:
    bound = types.SimpleNamespace(gpu="H200-SXM", precision="fp16", bound_ms_fused=bound_ms, compute_ms=bound_ms,
                                  memory_ms_fused=bound_ms / 10, peak_tflops=989.4, bandwidth_gb_s=4800.0)
    return types.SimpleNamespace(local_gpu=local, gpus={"H200-SXM": {"fp16": bound}})


LATENCY = types.SimpleNamespace(p50_ms=2.0, precision="fp16", measured_inputs=("float16[1,8]",), measured_batch_size=1)
FLOPS = types.SimpleNamespace(backward=False, counted_inputs=("float16[1,8]",), counted_batch_size=1)


@pytest.mark.parametrize("bound_ms, status", [(0.5, "PASS"), (2.0, "PASS"), (2.5, "FAIL")])
def test_latency_against_the_roofline_bound(tmp_path, bound_ms, status):
    report = gpu_check.Report(tmp_path)
    gpu_check.bound_line(report, "bound", LATENCY, roofline("H200-SXM", bound_ms), FLOPS, "fp16")
    (check,) = report.checks
    assert check["status"] == status and check["fraction"] == pytest.approx(bound_ms / 2.0)
    if status == "FAIL":  # rpx prints no fraction above 1; it names what disagrees
        assert "is below the bound of 2.5 ms" in check["figure"] and "TFLOP/s" in check["figure"]
    gpu_check.bound_line(report, "bf16", LATENCY, roofline("H200-SXM", 1.0), FLOPS, "bf16")
    assert report.checks[-1]["status"] == "SKIP" and "no bf16 peak" in report.checks[-1]["figure"]


def test_a_bound_of_other_work_fails_the_check(tmp_path):
    """The count of an 8-row call against a 1-row measurement (what rpx did before): not the same work, a FAIL."""
    report = gpu_check.Report(tmp_path)
    eight_rows = types.SimpleNamespace(backward=False, counted_inputs=("float16[8,8]",), counted_batch_size=8)
    gpu_check.bound_line(report, "bound", LATENCY, roofline("H200-SXM", 0.5), eight_rows, "fp16")
    (check,) = report.checks
    assert check["status"] == "FAIL" and "the count is of inputs float16[8,8]; latency measured float16[1,8]" in check["figure"]


def test_unmet_requirements_are_missing_or_too_old():
    assert gpu_check.unmet_requirements(["pytest>=1", "pytest>=999", "no-such-package-rpx>=1"]) == [
        "pytest>=999", "no-such-package-rpx>=1",
    ]  # fmt: skip
