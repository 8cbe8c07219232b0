"""rpx's latency loop next to torch.utils.benchmark on the same CPU workload in one run, and rpx's own per-call cost.

1. p50 of a 512x512 fp32 matmul: rpx (warm-up, then single synchronised calls through the cpu backend's timer) vs the
   median of torch.utils.benchmark.Timer.blocked_autorange, alternated over several rounds so drift hits both alike.
   Target: within 5%.
2. Overhead: an empty callable through rpx's sampling loop vs a bare ``perf_counter(); f(); perf_counter()`` loop,
   both as the median sample and as wall time per loop iteration. Target: < 5 us added per call.

Run: python bench/bench_latency.py [rounds]   (with the repository on PYTHONPATH, or rpx installed)
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.utils.benchmark as benchmark
from machine import describe_machine

from rpx_core import stats
from rpx_plugins.latency import model_call, sample_calls, warm_up
from rpx_plugins.torch.cpu import CpuBackend

SIZE = 512
SAMPLES = 2000


def rpx_p50(call, backend: CpuBackend) -> float:
    warm_up(call, lambda: backend.synchronize("cpu"), calls=10, seconds=0.5)
    sampling = sample_calls(call, backend.timer("cpu"), min_samples=SAMPLES, max_seconds=30.0)
    return stats.percentile(sampling.samples_s, 50)


def torch_benchmark_median(call) -> float:
    # torch.utils.benchmark runs single-threaded unless told otherwise; give it the threads rpx runs with.
    timer = benchmark.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=1.0).median


def compare_matmul(rounds: int) -> None:
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    backend = CpuBackend()
    call = model_call(backend, torch.mm, (a, b), {})
    ours, theirs = [], []
    with torch.inference_mode():  # thread-local, so it covers both timers' calls alike
        for _ in range(rounds):
            ours.append(rpx_p50(call, backend))
            theirs.append(torch_benchmark_median(call))
    print(f"\n{SIZE}x{SIZE} fp32 matmul, {torch.get_num_threads()} threads, {rounds} alternating rounds")
    for i, (mine, other) in enumerate(zip(ours, theirs)):
        print(f"  round {i}: rpx p50 {mine * 1e6:9.1f} us   torch.utils.benchmark median {other * 1e6:9.1f} us   ratio {mine / other:.3f}")
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"  median of rounds: rpx {statistics.median(ours) * 1e6:.1f} us, torch.utils.benchmark "
          f"{statistics.median(theirs) * 1e6:.1f} us, ratio {ratio:.3f} (target 0.95..1.05)")


def bare_loop(call, count: int) -> tuple[float, float]:
    """(median sample, wall seconds per iteration) of the simplest possible timing loop."""
    clock = time.perf_counter
    samples = []
    began = clock()
    for _ in range(count):
        start = clock()
        call()
        samples.append(clock() - start)
    return statistics.median(samples), (clock() - began) / count


def measure_overhead(count: int = 200_000) -> None:
    backend = CpuBackend()

    def empty() -> None:
        return None

    through_backend = model_call(backend, lambda: None, (), {})
    bare_sample, bare_iteration = bare_loop(empty, count)
    rows = {
        "empty callable": empty,
        "empty model via backend.call_model": through_backend,
    }
    print(f"\nper-call overhead, {count} calls each (bare loop: median sample {bare_sample * 1e6:.3f} us, "
          f"{bare_iteration * 1e6:.3f} us per iteration)")
    for name, call in rows.items():
        began = time.perf_counter()
        sampling = sample_calls(call, backend.timer("cpu"), min_samples=count, max_seconds=60.0)
        per_iteration = (time.perf_counter() - began) / count
        sample = statistics.median(sampling.samples_s)
        print(f"  rpx, {name:<36} median sample {sample * 1e6:.3f} us (+{(sample - bare_sample) * 1e6:.3f} us), "
              f"{per_iteration * 1e6:.3f} us per iteration (+{(per_iteration - bare_iteration) * 1e6:.3f} us)  target < 5 us")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(describe_machine())
    print(f"torch {torch.__version__}")
    compare_matmul(rounds)
    measure_overhead()


if __name__ == "__main__":
    main()
