"""Latency's p50 and the uncertainty each tool reports, rpx next to torch.utils.benchmark and pyperf, on the same
CPU workloads, on the machine as it is and under an artificial background load (a busy subprocess spinning on one
core).

* rpx: warm-up, then single synchronised calls sampled until the median's distribution-free 95% interval is within
  5% of it (or 5 s), through the cpu backend's timer (the measure_latency stage's own loop and summary).
* torch.utils.benchmark: ``Timer.adaptive_autorange(threshold=0.1, max_run_time=5)``: blocks of calls until the IQR
  of the block means is within 10% of their median; it reports the median and the IQR (no interval).
* pyperf: ``python -m pyperf timeit --fast`` (calibrated loops, several worker processes); it reports mean +- std
  dev and, here, its median +- median absolute deviation, and warns when a result may be unstable.

All three run single-threaded (``torch.set_num_threads(1)``) so the background load competes for the same core
count. Each tool's p50 is divided by rpx's. ``pyperf`` is an optional extra: ``pip install -e '.[bench]'``.

Run: cd bench && python bench_latency_noise.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.utils.benchmark as benchmark  # noqa: E402
from machine import busy_processes, describe_machine, load_average  # noqa: E402

from rpx_core.registry.backends import MemoryPeak  # noqa: E402
from rpx_core.types.latency import LatencyOptions  # noqa: E402
from rpx_plugins.latency import interval_is_tight, sample_calls, summarize, warm_up  # noqa: E402
from rpx_plugins.torch.cpu import CpuBackend  # noqa: E402

#: (name, setup code, statement): each tool runs exactly this.
WORKLOADS = (
    ("matmul 256x256 fp32", "import torch; torch.set_num_threads(1); a = torch.randn(256, 256); b = torch.randn(256, 256)",
     "torch.mm(a, b)"),
    ("tiny_cnn batch 1", "import torch; torch.set_num_threads(1); from rpx_plugins.torch.zoo import tiny_cnn; "
     "m = tiny_cnn().eval(); x = torch.randn(1, 3, 32, 32)", "m(x)"),
)
MAX_SECONDS = 5.0


def rpx(setup: str, stmt: str) -> tuple[float, str]:
    scope: dict = {}
    exec(setup, scope)
    call = eval(f"lambda: {stmt}", scope)
    backend = CpuBackend()
    options = LatencyOptions(min_samples=20, max_seconds=MAX_SECONDS)
    with torch.inference_mode():
        warm = warm_up(call, lambda: None, calls=10, seconds=0.5)
        sampling = sample_calls(call, backend.timer("cpu"), options.min_samples, options.max_seconds,
                                tight=interval_is_tight(options))
    result = summarize(sampling, warm, options, clock="", peak_memory=MemoryPeak("not read"))
    low, high = result.p50_interval_ms or (float("nan"), float("nan"))
    return result.p50_ms / 1e3, (f"95% CI of median [{low * 1e3:.1f}, {high * 1e3:.1f}] us, n={result.samples_count}, "
                                 f"{result.verdict}, {result.outliers} outliers")


def torch_benchmark(setup: str, stmt: str) -> tuple[float, str]:
    torch.set_num_threads(1)
    timer = benchmark.Timer(stmt=stmt, setup=setup, num_threads=1)
    with torch.inference_mode():
        measured = timer.adaptive_autorange(threshold=0.1, max_run_time=MAX_SECONDS)
    return measured.median, (f"IQR {measured.iqr * 1e6:.1f} us over {len(measured.times)} blocks"
                             + (", flagged has_warnings (IQR above 10% of the median)" if measured.has_warnings else ""))


def pyperf(setup: str, stmt: str) -> tuple[float, str]:
    try:
        import pyperf as _pyperf
    except ImportError:
        return float("nan"), "pyperf not installed (pip install -e '.[bench]')"
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "result.json"
        done = subprocess.run(
            [sys.executable, "-m", "pyperf", "timeit", "--fast", "-o", str(output), "-s", setup, stmt],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
        )
        if done.returncode != 0:
            return float("nan"), f"pyperf failed: {done.stderr.strip().splitlines()[-1]}"
        bench = _pyperf.Benchmark.load(str(output))
    warned = "may be unstable" in done.stdout + done.stderr
    return bench.median(), (f"mean {bench.mean() * 1e6:.1f} +- {bench.stdev() * 1e6:.1f} us, median +- MAD "
                            f"{bench.median_abs_dev() * 1e6:.1f} us, {bench.get_nvalue()} values in "
                            f"{bench.get_nrun()} runs" + (", warned unstable" if warned else ""))


def main() -> None:
    print(describe_machine())
    print(f"torch {torch.__version__}; single-threaded; rpx target: 95% interval of the median within 5%")
    rows = []
    for busy in (False, True):
        condition = "busy subprocess" if busy else "machine as is"
        with busy_processes(1 if busy else 0):
            print(f"\n## {condition} ({load_average()})")
            for name, setup, stmt in WORKLOADS:
                mine, mine_note = rpx(setup, stmt)
                theirs, theirs_note = torch_benchmark(setup, stmt)
                perf, perf_note = pyperf(setup, stmt)
                print(f"{name}")
                print(f"  rpx                    p50 {mine * 1e6:9.1f} us   {mine_note}")
                print(f"  torch.utils.benchmark  p50 {theirs * 1e6:9.1f} us   x{theirs / mine:.3f}   {theirs_note}")
                print(f"  pyperf                 p50 {perf * 1e6:9.1f} us   x{perf / mine:.3f}   {perf_note}")
                rows.append({"condition": condition, "workload": name, "rpx_s": mine, "torch_s": theirs, "pyperf_s": perf})
    print("\n" + json.dumps(rows))


if __name__ == "__main__":
    main()
