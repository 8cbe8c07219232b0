"""What measure_breakdown says about the calls profiled on an H200, and what the breakdown itself costs.

1. The three calls recorded on an NVIDIA H200 (tests/data/h200-profiles: BERT-base bf16 at 128 tokens, ResNet-50
   fp16, a 4-layer Llama-2-7B-shaped prefill of 2,048 tokens; batch 1), attributed here on the CPU against the
   counter's calls of the same models counted on meta, bounded by the H200-SXM's dense peak and bandwidth: the busy
   and idle time against each call's median timed without the profiler, the top operators by time above their
   bound, and the large matmuls. The time to read a trace and build the tables (median of 5) is the attribution's
   cost on this machine.
2. The stage's own cost on this CPU, by phase, for rpx's tiny transformer: what one breakdown adds to a job, in
   seconds and in calls of the model.

Run: python bench/bench_breakdown.py   (from the repository root, with it on PYTHONPATH)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from machine import describe_machine  # noqa: E402

from rpx_core.testing import make_context, run_stage  # noqa: E402
from rpx_plugins.stages.breakdown import ranked  # noqa: E402
from tests.test_breakdown_h200 import BERT, LLAMA, RESNET, result_of  # noqa: E402


def recorded() -> None:
    print("1. calls recorded on an H200 (torch 2.11.0+cu130), attributed on this CPU; bound: H200-SXM dense peak at the "
          "run's precision, 4800 GB/s")
    for name in (BERT, RESNET, LLAMA):
        result_of(name)  # count the model on meta once (cached); the rounds below time the attribution alone
        seconds = []
        for _ in range(5):
            started = time.perf_counter()
            result = result_of(name)
            seconds.append(time.perf_counter() - started)
        print(f"\n{name}: call {result.call_ms:.3f} ms (median without the profiler); busy {result.busy_ms:.3f} ms "
              f"({result.busy_ms / result.total_ms:.0%}), idle {result.idle_ms:.3f} ms; profiled call "
              f"{result.profiled_ms:.2f} ms; matched {result.matched_calls} calls; attribution "
              f"{statistics.median(seconds) * 1e3:.1f} ms")
        print(f"  {'operator':42} {'calls':>5} {'time ms':>8} {'share':>6} {'bound ms':>8} {'bound/meas':>10} "
              f"{'limited by':>10} {'above ms':>8}")
        for row in ranked(result.operators)[:5]:
            print(f"  {row.name:42} {row.calls:5d} {row.time_ms:8.3f} {row.share:6.1%} {row.bound_ms:8.3f} "
                  f"{row.fraction:10.0%} {row.limited_by:>10} {row.excess_ms:8.3f}")
        if name == LLAMA:
            print("  large matmuls (per call):")
            for row in result.signatures:
                if row.name == "aten.mm" and row.flops / row.calls > 5e10:
                    print(f"    {row.module:28} {row.inputs:44} {row.time_ms / row.calls:7.3f} ms, bound "
                          f"{row.bound_ms / row.calls:7.3f} ms, {row.fraction:.0%}, "
                          f"{row.flops_per_s / 1e12:.0f} TFLOP/s")


def stage_cost() -> None:
    torch.set_num_threads(1)
    ctx = make_context("rpx_plugins.torch.zoo:tiny_transformer", inputs=[{"shape": [1, 128], "dtype": "int64",
                                                                          "high": 256}],
                       stages=["measure_breakdown"])
    started = time.perf_counter()
    result = run_stage("measure_breakdown", ctx)
    wall = time.perf_counter() - started
    cost = result.cost
    phases = {"warm-up": cost.warmup_seconds, "reference calls": cost.reference_seconds,
              "counting": cost.counting_seconds, "profiling": cost.profiling_seconds,
              "attribution": cost.attribution_seconds}
    print(f"\n2. the stage's own cost on this CPU (tiny_transformer, 1 thread): call {result.call_ms:.2f} ms; stage "
          f"{wall:.2f} s with building the model")
    for phase, seconds in phases.items():
        print(f"  {phase:16} {seconds:7.3f} s  ({seconds * 1e3 / result.call_ms:8.0f} calls)")
    print(f"  profiled call {result.profiled_ms:.2f} ms against {result.call_ms:.2f} ms without the profiler")


if __name__ == "__main__":
    print(describe_machine())
    recorded()
    stage_cost()
