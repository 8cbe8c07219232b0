"""Run by tests/test_training_search.py in a process of its own (the host allocator's setting stays there): a
direct bisection of real training steps (doubling from 1 until a step goes over the budget, then halving the gap
to 1%) and rpx's train_batch_search, on the same model, budget and measurement; prints both as JSON.

Usage: python -m tests.training_search_check ROOM_MB: the budget is the process's usage after a first count and a few
real steps (libraries allocate on first use: a few MB the baseline must already hold) plus ROOM_MB, the same for
both. Both measure a trial alike (a fresh step at the batch size, two untimed steps, one step's peak as the budget
holds it), so they differ only in where they place trials."""

from __future__ import annotations

import json
import sys

from rpx_core.testing import make_context, run_stage
from rpx_core.types.batch_search import used_bytes
from rpx_plugins.measurement import gc_paused
from rpx_plugins.training import torch_train
from rpx_plugins.training.host_allocator import freed_memory_returned, trim
from rpx_plugins.training.search import baseline

MODEL = {"source": "tests.training_models:mlp", "kwargs": {"hidden": 512}}


def context(budget: int):
    return make_context(MODEL["source"], model_keys={"kwargs": MODEL["kwargs"]}, inputs=[(8, 64)],
                        stages=["train_batch_search"],
                        options={"train_step": {"optimizer": "adamw"},
                                 "train_batch_search": {"memory_budget": budget, "trial_seconds": 0.05, "resolution": 0.02,
                                                        "max_batch": 2**20}})


def direct_bisection(ctx, budget: int) -> tuple[int, int]:
    """(the largest batch whose step stays within the budget, to 1%; real steps it took)."""
    step_options = torch_train.train_options(ctx)
    policy = torch_train.policy_for(ctx.job.precision, step_options)
    model = torch_train.placed_model(ctx, step_options, policy)
    backend, device = ctx.backend, ctx.job.device
    steps = 0

    def fits(batch: int) -> bool:
        nonlocal steps
        steps += 1
        with gc_paused():  # the previous trial's step is collected first, as rpx's trials do
            step = torch_train.step_on(ctx, model, step_options, policy, batch)[0]
            step()
            step()
            trim()
            backend.reset_peak_memory(device)
            step()
            return used_bytes(backend.read_peak_memory(device)) <= budget

    low, high = 0, 1
    while fits(high):
        low, high = high, 2 * high
    while high - low > max(1, low // 100):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, steps


def settled(ctx) -> None:
    """A count and three real steps: the imports and the libraries' first-use buffers, before the baseline."""
    options = torch_train.train_options(ctx)
    policy = torch_train.policy_for(ctx.job.precision, options)
    torch_train.predicted_line(ctx, options, policy, 10**7, 64)
    step = torch_train.real_step(ctx, options, policy, 1024)[0]
    for _ in range(3):
        step()


def main(room_mb: int) -> None:
    ctx = context(2 * 10**9)
    with freed_memory_returned():
        settled(ctx)
        budget = baseline(ctx.backend, ctx.job.device)[0] + room_mb * 10**6
        direct, direct_steps = direct_bisection(ctx, budget)
    result = run_stage("train_batch_search", context(budget))
    print(json.dumps({"budget": budget, "direct": direct, "direct_trials": direct_steps,
                      "largest": result.largest_batch, "best": result.best_batch, "trials": len(result.trials),
                      "trials_to_largest": 1 + max(i for i, t in enumerate(result.trials)
                                                   if t.batch_size == result.largest_batch),
                      "predicted": [t.predicted_bytes for t in result.trials],
                      "used": [t.used_bytes for t in result.trials], "stopped_by": result.stopped_by}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
