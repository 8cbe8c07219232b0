"""rpx's per-call cost on the jax backend, and pipelined vs blocking throughput, measured side by side in one run.

1. Overhead: the same jitted function timed by a bare loop (``perf_counter(); f(params, x).block_until_ready();
   perf_counter()``) and by rpx's sampling loop through the jax backend (``sample_calls`` with the backend's timer and
   ``call_model``), alternated over rounds; the median sample of each and the difference. Target: < 2 us added.
   Two workloads: a tiny function (dispatch-bound, where overhead shows most) and a 64-wide MLP.
2. Throughput at batch 1 of an encoder-like block (dense 256 -> 1024 -> 256 with GELU and a residual): rpx's blocking
   figure (each call waits for its outputs) beside its pipelined one (calls dispatched back to back, one wait).

Run: python bench/bench_jax_overhead.py [rounds, default 41]   (with the repository on PYTHONPATH, or rpx installed)
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
from machine import describe_machine

from rpx_plugins.jax.backend import JaxBackend, JaxModel
from rpx_plugins.jax.zoo import mlp
from rpx_plugins.latency import model_call, sample_calls, time_calls, time_pipelined, warm_up

SAMPLES = 2_000  # per round; many short alternating rounds, so drift on a shared machine hits both alike


def bare_median(f, params, x, count: int) -> float:
    clock = time.perf_counter
    samples = []
    for _ in range(count):
        start = clock()
        f(params, x).block_until_ready()
        samples.append(clock() - start)
    return statistics.median(samples)


def rpx_median(backend: JaxBackend, placed, x, count: int) -> float:
    call = model_call(backend, placed, (x,), {})
    return statistics.median(sample_calls(call, backend.timer("cpu:0"), min_samples=count, max_seconds=120.0).samples_s)


def compare_overhead(name: str, model: JaxModel, x, rounds: int) -> None:
    backend = JaxBackend()
    placed = backend.place_model(model, "fp32", "cpu:0")
    f = placed.apply
    warm_up(model_call(backend, placed, (x,), {}), lambda: None, calls=100, seconds=0.5)
    bare, ours = [], []
    for _ in range(rounds):
        bare.append(bare_median(f, placed.params, x, SAMPLES))
        ours.append(rpx_median(backend, placed, x, SAMPLES))
    added = [(o - b) * 1e6 for o, b in zip(ours, bare)]
    print(f"\n{name}: {rounds} alternating rounds of {SAMPLES} calls each")
    print(f"  bare loop: median of round medians {statistics.median(bare) * 1e6:8.2f} us; rpx {statistics.median(ours) * 1e6:8.2f} us")
    print(f"  median added per call: {statistics.median(added):+.2f} us (target < 2 us)")


def encoder_block():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (256, 1024)) / 16, "w2": jax.random.normal(k2, (1024, 256)) / 32}

    def apply(p, x):
        return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]

    return JaxModel(apply, params)


def compare_throughput(rounds: int, calls: int = 2000) -> None:
    backend = JaxBackend()
    placed = backend.place_model(encoder_block(), "fp32", "cpu:0")
    x = jax.random.normal(jax.random.key(1), (1, 256))
    call = model_call(backend, placed, (x,), {})
    warm_up(call, lambda: None, calls=100, seconds=0.5)
    print(f"\nencoder-like block at batch 1: {rounds} alternating rounds of {calls} calls")
    ratios = []
    for i in range(rounds):
        blocking = calls / time_calls(call, backend.timer("cpu:0"), calls)
        pipelined = calls / time_pipelined(backend, placed, ((x,), {}), calls, "cpu:0")
        ratios.append(pipelined / blocking)
        print(f"  round {i}: blocking {blocking:8.0f} samples/s   pipelined {pipelined:8.0f} samples/s   "
              f"ratio {pipelined / blocking:.3f}")
    print(f"  median pipelined / blocking: {statistics.median(ratios):.3f}")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 41
    print(describe_machine())
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
    compare_overhead("tiny function x * 2 + 1 on [8]", JaxModel(lambda p, x: x * p + 1.0, jnp.float32(2.0)),
                     jnp.ones(8), rounds)
    compare_overhead("MLP 64-128-10 at batch 1", mlp((64, 128, 10)), jnp.ones((1, 64)), rounds)
    compare_throughput(min(rounds, 7))


if __name__ == "__main__":
    main()
