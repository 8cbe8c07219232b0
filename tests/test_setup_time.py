"""Stage time is stage time: importing the model's module, building and placing the model are timed apart
(``ModelResult.setup``, and each record's ``setup``), and no stage's seconds include them.

A model module whose import sleeps 1.0 s and whose factory sleeps 1.5 s makes both phases known; the one stage that
builds the model (measure_latency, bounded by a 0.2 s max_seconds) must then take well under the factory's 1.5 s.
Both isolations: a worker process per job (the default) and rpx's own process.
"""

from __future__ import annotations

import pytest

import rpx_core as rpx
from tests.conftest import rpx_cli

MODULE = '''
import time

import torch

time.sleep(1.0)  # a slow import (a big library)


def build():
    time.sleep(1.5)  # a slow build (weights initialised)
    return torch.nn.Linear(4, 4)
'''

SPEC = """
stages = ["measure_latency"]
batch_sizes = [1]

[[models]]
name = "slow"
source = "slow_model.py:build"
inputs = [{ shape = [1, 4] }]

[options.measure_latency]
min_samples = 5
adaptive = false
max_seconds = 0.2
warmup_calls = 1
warmup_seconds = 0.0
throughput_seconds = 0.02
throughput_min_calls = 1
"""


@pytest.mark.parametrize("isolation", ["worker", "in-process"])
def test_import_and_build_are_timed_apart_from_the_stage(tmp_path, write_spec, isolation):
    (tmp_path / "slow_model.py").write_text(MODULE)
    spec = write_spec(SPEC)
    done = rpx_cli("run", str(spec), "-o", str(tmp_path / "out.toml"), "--isolation", isolation)
    assert done.returncode == 0, done.stderr
    model = rpx.load_results(tmp_path / "out.toml").model("slow")
    record = model.stages["measure_latency"]
    assert model.setup["import"] >= 1.0 and model.setup["build"] >= 1.5 and "place" in model.setup
    assert record.setup["build"] == model.setup["build"]  # the stage that built the model carries its build
    assert record.seconds < 1.5, record.seconds  # the stage's own work: warm-up, samples, one throughput row
