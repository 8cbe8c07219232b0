"""Time limits: the Deadline stages check, measure_latency bounded by max_seconds as a whole, in-process stage
timeouts, and the executor's choice of isolation."""

from __future__ import annotations

import time

import pytest
import torch

import rpx_core as rpx
from rpx_core.errors import RpxError
from rpx_core.execution.runners import InProcessRunner, WorkerRunner, make_runner
from rpx_core.registry.manager import Plugins
from rpx_core.spec.limits import Deadline, Execution


def test_a_deadline_counts_down_and_none_never_expires():
    never = Deadline.after(None)
    assert not never.expired() and never.remaining() == float("inf")
    soon = Deadline.after(0.05)
    assert 0 < soon.remaining() <= 0.05 and soon.earliest(never) is soon
    time.sleep(0.06)
    assert soon.expired() and soon.remaining() == 0.0


class Slow(torch.nn.Module):
    """Each call sleeps ``seconds``: the stage's time is then set by the number of calls it makes."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return x


def test_max_seconds_bounds_warm_up_sampling_and_throughput():
    """With 0.3 s calls and max_seconds = 0.5, warm-up (asked for 10 calls) stops at the deadline, one sample is
    taken, and no throughput row starts: without the deadline this stage would make about 40 calls (12 s)."""
    result = rpx.profile(Slow(0.3), inputs=[(1, 4)], stages=["measure_latency"], batch_sizes=[1, 2, 4],
                         options={"measure_latency": {"max_seconds": 0.5, "warmup_calls": 10, "warmup_seconds": 0.0,
                                                      "throughput_min_calls": 10}})
    latency = result.result("measure_latency")
    assert latency.warmup_calls <= 2 and latency.samples_count == 1 and latency.stopped_by == "max_seconds"
    assert [row.error for row in latency.throughput] == ["not measured: measure_latency's max_seconds (0.5 s) was "
                                                         "reached"] * 3


def test_an_in_process_stage_past_its_timeout_is_stopped_and_recorded():
    result = rpx.profile(Slow(5.0), inputs=[(1, 4)], stages=["measure_latency"],
                         execution={"stage_timeout": 1.0}, partial=True,
                         options={"measure_latency": {"max_seconds": 0.5, "warmup_seconds": 0.0}})
    record = result.stages["measure_latency"]
    assert record.status == "failed"
    assert record.error == "timed out: stage 'measure_latency' ran past the stage_timeout of 1 s and was stopped"
    assert result.stages["system_card"].status == "ok"


def test_isolation_auto_runs_live_objects_in_process_and_everything_else_in_workers():
    plugins = Plugins.load()
    assert isinstance(make_runner(plugins, Execution(), None), WorkerRunner)
    assert isinstance(make_runner(plugins, Execution(), {"m": object()}), InProcessRunner)
    assert isinstance(make_runner(plugins, Execution(isolation="in-process"), None), InProcessRunner)
    with pytest.raises(RpxError, match="a live model object cannot be sent to a worker process"):
        make_runner(plugins, Execution(isolation="worker"), {"m": object()})
