"""Latency of the same workloads by rpx, torch.utils.benchmark and pyperf, on a quiet machine and under a load.

All three time one batch-1 forward under ``torch.inference_mode`` with one torch thread (``THREADS``: on a small,
shared machine torch's spinning intra-op threads turn other processes' load into millisecond stalls):
- rpx: ``measure_latency`` through ``rpx.profile`` (warm-up, single synchronised calls); its p50 and, where this rpx
  reports one, the p50's confidence interval (else its p25-p75 range, labelled so);
- torch.utils.benchmark: ``Timer.blocked_autorange``'s median (of blocks of calls);
- pyperf: ``python -m pyperf timeit``'s mean and standard deviation over its worker processes.
The load is one busy-looping process per logical CPU, started before and stopped (by process id) after each loaded
measurement; the machine's load average is recorded with each row.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
WORKLOADS = ("depthwise-cnn", "bert-128")
THREADS = 1
RPX_MAX_SECONDS = 2.0
TIMER_MIN_RUN_TIME = 1.0
#: pyperf's worker processes each import torch: few of them, and loops set from torch.utils.benchmark's median so
#: no calibration process runs (pyperf's own 0.1 s minimum per value)
PYPERF_ARGS = ("--processes", "3", "--values", "3", "--warmups", "1")  # pyperf default: 20 processes
PYPERF_VALUE_SECONDS = 0.1


@dataclass
class LatencyRow:
    workload: str
    condition: str  # "quiet" or "loaded (N busy processes)"
    load_average: float  # 1-minute load average when the row finished
    rpx_p50_ms: float
    rpx_low_ms: float
    rpx_high_ms: float
    rpx_interval: str  # what low/high are
    rpx_verdict: str | None
    timer_median_ms: float
    pyperf_mean_ms: float
    pyperf_std_ms: float


def rpx_latency(name: str) -> tuple[float, float, float, str, str | None]:
    import torch

    import rpx_core as rpx
    from compare.models import case

    workload = case(name)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory() as folder:
        result = rpx.profile(workload.build("cpu"), workload.rpx_inputs, stages=["measure_latency"], batch_sizes=[1],
                             options={"measure_latency": {"max_seconds": RPX_MAX_SECONDS, "keep_samples": True}},
                             output=f"{folder}/latency.json")
    torch.set_num_threads(threads_before)
    latency = result.result("measure_latency")
    assert latency.threads["torch_intra_op"] == THREADS, latency.threads
    interval = getattr(latency, "p50_interval_ms", None)
    if interval:
        confidence = getattr(latency, "interval_confidence", 0.95)
        return (latency.p50_ms, interval[0], interval[1], f"{confidence:.0%} CI of the p50",
                getattr(latency, "verdict", None))
    # an rpx without the interval fields: the middle half of its samples, as rpx's percentiles compute it
    from rpx_core import stats

    low, high = (stats.percentile(latency.samples_ms, q) for q in (25, 75))
    return latency.p50_ms, low, high, "p25-p75 of the samples (no p50 interval in this rpx)", None


def timer_median(name: str) -> float:
    import torch
    import torch.utils.benchmark as benchmark

    from compare.models import case

    workload = case(name)
    model, inputs = workload.build("cpu"), workload.inputs("cpu")
    timer = benchmark.Timer(stmt="model(*inputs)", globals={"model": model, "inputs": inputs},
                            num_threads=THREADS)
    with torch.inference_mode():
        return timer.blocked_autorange(min_run_time=TIMER_MIN_RUN_TIME).median * 1e3


def pyperf_mean_std(name: str, median_ms: float) -> tuple[float, float]:
    import pyperf

    setup = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import torch; torch.set_num_threads({THREADS}); "
             f"from compare.models import case; "
             f"w = case({name!r}); model = w.build('cpu'); inputs = w.inputs('cpu'); torch.inference_mode().__enter__()")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "pyperf.json"
        loops = max(1, math.ceil(PYPERF_VALUE_SECONDS / (median_ms / 1e3)))
        subprocess.run([sys.executable, "-m", "pyperf", "timeit", *PYPERF_ARGS, "--loops", str(loops), "--quiet",
                        "-o", str(out), "-s", setup, "model(*inputs)"], check=True, capture_output=True, text=True)
        bench = pyperf.Benchmark.load(str(out))
        return bench.mean() * 1e3, bench.stdev() * 1e3


def background_load() -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def measure(name: str, condition: str) -> LatencyRow:
    p50, low, high, interval, verdict = rpx_latency(name)
    median = timer_median(name)
    mean, std = pyperf_mean_std(name, median)
    return LatencyRow(name, condition, os.getloadavg()[0], p50, low, high, interval, verdict, median, mean, std)


def main() -> list[dict]:
    rows = [measure(name, "quiet") for name in WORKLOADS]
    load = background_load()
    try:
        rows += [measure(name, f"loaded ({len(load)} busy processes)") for name in WORKLOADS]
    finally:
        stop(load)
    return [asdict(row) for row in rows]


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
