"""How far past ``max_seconds`` the measure_latency stage runs on a busy machine, throughput rows included.

Four subprocesses spin in Python loops beside rpx (on a 2-core machine, five runnable processes for two cores). Each
real CPU model is profiled with ``stages = ["measure_latency"]``, ``max_seconds = 3`` and throughput rows at batch 1, 8
and 32, several rounds; the stage's own seconds (its record's ``seconds``: model building excluded, as max_seconds
excludes it) are set against 3 s. rpx's promise (``rpx_core.types.latency.OVERRUN_SLACK_SECONDS``): no call starts
after max_seconds, so the stage ends within max_seconds + its longest call + the stated slack. Before it timed
throughput rows in chunks and stopped paying for garbage collection out of nobody's budget, the same setting ran
14.5 s, 27 s and 37.8 s on a loaded machine.

Run: python bench/bench_latency_limits.py [rounds]   (with the repository on PYTHONPATH, or rpx installed)
"""

from __future__ import annotations

import sys

import torch
from machine import busy_processes, describe_machine, load_average

import rpx_core as rpx
from rpx_core.types.latency import OVERRUN_SLACK_SECONDS
from rpx_plugins.torch import zoo

MAX_SECONDS = 3.0
BUSY = 4


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))


MODELS = (("tiny_cnn", zoo.tiny_cnn, (1, 3, 32, 32)), ("mlp 256-1024-256", mlp, (1, 256)),
          ("tiny_transformer", zoo.tiny_transformer, {"shape": [1, 64], "dtype": "int64", "high": 256}))


def longest_call_seconds(latency) -> float:
    """The longest single call the stage made: its slowest sample, or a throughput row's mean call."""
    rows = [row.seconds / row.calls for row in latency.throughput if row.calls]
    return max([latency.max_ms / 1e3, *rows])


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(describe_machine())
    print(f"torch {torch.__version__}; max_seconds = {MAX_SECONDS:g}; {BUSY} busy background processes; "
          f"stated slack: the longest call + {OVERRUN_SLACK_SECONDS} s")
    worst = 0.0
    with busy_processes(BUSY):
        print(f"({load_average()} once they started)")
        for round_index in range(rounds):
            for name, build, shape in MODELS:
                result = rpx.profile(build(), inputs=[shape], stages=["measure_latency"], batch_sizes=[1, 8, 32],
                                     options={"measure_latency": {"max_seconds": MAX_SECONDS}})
                record = result.stages["measure_latency"]
                latency = record.result
                over = record.seconds - MAX_SECONDS
                allowed = longest_call_seconds(latency) + OVERRUN_SLACK_SECONDS
                worst = max(worst, over)
                cut = [f"b{row.batch_size}: {row.error or row.cut_short}" for row in latency.throughput
                       if row.error or row.cut_short]
                print(f"  round {round_index} {name:<18} stage {record.seconds:6.2f} s  over {over:+5.2f} s  "
                      f"allowed +{allowed:.2f} s  {'ok' if over <= allowed else 'OVER'}  "
                      f"{latency.samples_count} samples ({latency.verdict}); {'; '.join(cut) or 'every row measured'}")
    print(f"worst overrun past max_seconds: {worst:+.2f} s ({load_average()})")


if __name__ == "__main__":
    main()
