"""What rpx's p50 is, against the timing loops people write themselves, on a call-heavy model on the CPU.

A stack of 100 small layers (Linear(64, 64) + ReLU, batch 1) is dominated by the Python and dispatcher work of its
300 operator calls, so how a loop runs them shows. Each loop times single calls with ``time.perf_counter`` and takes
the median; they differ in one thing at a time:

1. plain: grad mode on, garbage collector on (what a first loop looks like);
2. no_grad: ``torch.no_grad()``;
3. inference_mode: ``torch.inference_mode()`` (no autograd bookkeeping at all, no version counters);
4. inference_mode, gc paused: as rpx runs (collect once, ``gc.disable()`` while timing);
5. rpx: the measure_latency stage itself (warm-up until settled, the backend's ``call_model`` and timer).

Then ``torch.utils.benchmark.Timer.blocked_autorange`` (its median of block means, under inference mode). Loops are
alternated over rounds so drift hits all alike; each figure is divided by rpx's.

Run: python bench/bench_latency_loop.py [rounds]   (with the repository on PYTHONPATH, or rpx installed)
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.utils.benchmark as benchmark
from machine import describe_machine, load_average

import rpx_core as rpx

LAYERS, WIDTH, CALLS = 100, 64, 2000


def stack() -> torch.nn.Module:
    layers = [module for _ in range(LAYERS) for module in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers).eval()


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def loop_median(call: Callable[[], object], mode: Callable[[], contextlib.AbstractContextManager]) -> float:
    clock = time.perf_counter
    samples = []
    with mode():
        for _ in range(100):  # warm-up
            call()
        for _ in range(CALLS):
            started = clock()
            call()
            samples.append(clock() - started)
    return statistics.median(samples)


def rpx_p50(model: torch.nn.Module) -> float:
    result = rpx.profile(model, inputs=[(1, WIDTH)], stages=["measure_latency"],
                         options={"measure_latency": {"min_samples": CALLS, "adaptive": False, "max_seconds": 60}})
    return result.result("measure_latency").p50_ms / 1e3


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(describe_machine())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {LAYERS} x (Linear({WIDTH}, {WIDTH}) + ReLU), "
          f"batch 1; {CALLS} timed calls per loop; {rounds} alternating rounds")
    model, x = stack(), torch.randn(1, WIDTH)

    def call() -> object:
        return model(x)

    def both() -> contextlib.AbstractContextManager:
        contexts = contextlib.ExitStack()
        contexts.enter_context(torch.inference_mode())
        contexts.enter_context(gc_off())
        return contexts

    loops = {"plain loop": contextlib.nullcontext, "no_grad loop": torch.no_grad,
             "inference_mode loop": torch.inference_mode, "inference_mode, gc paused": both}
    figures: dict[str, list[float]] = {name: [] for name in (*loops, "torch.utils.benchmark", "rpx p50")}
    for _ in range(rounds):
        for name, mode in loops.items():
            figures[name].append(loop_median(call, mode))
        with torch.inference_mode():
            timer = benchmark.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
            figures["torch.utils.benchmark"].append(timer.blocked_autorange(min_run_time=1.0).median)
        figures["rpx p50"].append(rpx_p50(model))
    ours = statistics.median(figures["rpx p50"])
    for name, values in figures.items():
        middle = statistics.median(values)
        rounds_text = " ".join(f"{value * 1e6:7.1f}" for value in values)
        print(f"  {name:<27} {middle * 1e6:8.1f} us  x{middle / ours:.3f} of rpx   rounds: {rounds_text}")
    print(f"({load_average()})")


if __name__ == "__main__":
    main()
