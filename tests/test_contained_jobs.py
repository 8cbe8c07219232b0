"""Contained jobs, end to end: the real ``rpx`` CLI in a subprocess, on real spec files, with models that crash, hang,
exit or raise, and runs interrupted by SIGINT and SIGTERM in a per-model and a run-scoped stage.

Each time: the results file is valid and complete up to that point, the exit code is the documented one, and
``rpx run --resume`` finishes the rest without redoing anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rpx_core import load_results as load

MODELS = '''
import os, pathlib, signal, sys, time
import torch


class Probe(torch.nn.Module):
    """Misbehaves as told when it runs on real tensors; with ``flag``, only while that file exists (once)."""

    def __init__(self, how="ok", flag="", from_batch=1):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.how, self.flag, self.from_batch = how, flag, from_batch

    def forward(self, x):
        if x.device.type == "meta" or self.how == "ok" or x.shape[0] < self.from_batch:
            return self.lin(x)
        if self.flag:
            flag = pathlib.Path(self.flag)
            if not flag.exists():
                return self.lin(x)
            flag.unlink()
            pathlib.Path(self.flag + ".hanging").write_text(str(os.getpid()))
        if self.how == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "exit0":
            sys.exit(0)
        if self.how == "raise":
            raise ValueError("broken on purpose")
        print("probe: hanging now", file=sys.stderr, flush=True)
        while True:
            time.sleep(0.05)


def build(**kwargs):
    return Probe(**kwargs)
'''

LATENCY = """
[options.measure_latency]
max_seconds = 0.2
warmup_calls = 1
warmup_seconds = 0.0
min_samples = 5
throughput_seconds = 0.01
throughput_min_calls = 1
"""


def write_spec(tmp_path: Path, first: str, *, stages: str = '["count_params", "measure_latency"]',
               extra: str = LATENCY, execution: str = "stage_timeout = 60") -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "probe"
        stages = {stages}
        output = "out.toml"
        [execution]
        {execution}
        [[models]]
        name = "first"
        source = "models.py:build"
        kwargs = {first}
        inputs = [{{ shape = [1, 4] }}]
        [[models]]
        name = "second"
        source = "models.py:build"
        inputs = [{{ shape = [1, 4] }}]
    """) + textwrap.dedent(extra))
    return spec


def rpx(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rpx_core.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def statuses(model) -> dict[str, str]:
    return {name: record.status for name, record in model.stages.items()}


def assert_resume_redoes_nothing(tmp_path: Path, spec: Path, expected_code: int) -> None:
    """``--resume`` of a run that went on past the failure: nothing left to do, every record kept as it was."""
    before = load(tmp_path / "out.toml")
    done = rpx("run", str(spec), "--resume", cwd=tmp_path)
    assert done.returncode == expected_code, done.stderr
    after = load(tmp_path / "out.toml")
    assert after.models == before.models


@pytest.mark.parametrize("how, error", [
    ("segv", "worker crashed during stage 'measure_latency': killed by signal SIGSEGV (segmentation fault)"),
    ("sigkill", "worker crashed during stage 'measure_latency': killed by signal SIGKILL (killed: the system's "
                "out-of-memory killer, or another process)"),
])
def test_a_worker_killed_mid_job_fails_that_job_and_the_run_goes_on(tmp_path, how, error):
    spec = write_spec(tmp_path, f'{{ how = "{how}" }}')
    done = rpx("run", str(spec), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    run = load(tmp_path / "out.toml")
    first, second = run.model("first"), run.model("second")
    assert statuses(first) == {"count_params": "ok", "system_card": "ok", "measure_latency": "failed"}
    record = first.stages["measure_latency"]
    assert record.error == error
    if how == "segv":  # faulthandler's dump: the Python stack of the crash, in the stage record
        assert "Fatal Python error: Segmentation fault" in record.stderr_tail and "in forward" in record.stderr_tail
    assert first.finished is not None  # the job is over (failed), not interrupted
    assert second.ok and second.finished is not None
    assert_resume_redoes_nothing(tmp_path, spec, 1)


def test_a_hung_forward_is_killed_at_its_stage_timeout(tmp_path):
    spec = write_spec(tmp_path, '{ how = "hang" }', execution="stage_timeout = 3")
    started = time.monotonic()
    done = rpx("run", str(spec), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 120
    first = load(tmp_path / "out.toml").model("first")
    record = first.stages["measure_latency"]
    assert record.status == "failed"
    assert record.error == "timed out: stage 'measure_latency' ran past the stage_timeout of 3 s and was stopped"
    assert "probe: hanging now" in record.stderr_tail
    assert record.seconds >= 3
    assert load(tmp_path / "out.toml").model("second").ok
    assert_resume_redoes_nothing(tmp_path, spec, 1)


def test_a_hang_at_import_is_killed_at_the_job_timeout(tmp_path):
    spec = write_spec(tmp_path, "{}", execution="job_timeout = 3")
    (tmp_path / "slow.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    spec.write_text(spec.read_text().replace('source = "models.py:build"', 'source = "slow.py:build"', 1))
    done = rpx("run", str(spec), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    first = load(tmp_path / "out.toml").model("first")
    assert first.stages["count_params"].error == (
        "timed out: stage 'count_params' ran past the job_timeout of 3 s and was stopped")
    assert first.stages["system_card"].status == first.stages["measure_latency"].status == "skipped"
    assert first.stages["measure_latency"].error.startswith("not run: stage 'count_params' of this job failed: timed out")
    assert load(tmp_path / "out.toml").model("second").ok


@pytest.mark.parametrize("how, error", [
    ("exit0", "SystemExit: user code called sys.exit(0) during stage 'measure_latency'"),
    ("raise", "ValueError: broken on purpose"),
])
def test_sys_exit_and_exceptions_in_a_model_fail_its_stage_only(tmp_path, how, error):
    spec = write_spec(tmp_path, f'{{ how = "{how}" }}')
    done = rpx("run", str(spec), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    run = load(tmp_path / "out.toml")
    assert run.model("first").stages["measure_latency"].error == error
    assert "Traceback" in run.model("first").stages["measure_latency"].traceback
    assert run.model("second").ok
    assert_resume_redoes_nothing(tmp_path, spec, 1)


def interrupt_when_hanging(spec: Path, tmp_path: Path, signum: int) -> subprocess.CompletedProcess:
    """Run ``spec``; when the model says it hangs, send ``signum`` to rpx (the parent process only)."""
    marker = tmp_path / "flag.hanging"
    process = subprocess.Popen([sys.executable, "-m", "rpx_core.cli", "run", str(spec)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the model never started hanging"
        time.sleep(0.05)
    os.kill(process.pid, signum)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_a_per_model_stage_records_it_and_resume_finishes_the_rest(tmp_path, signum, code):
    (tmp_path / "flag").write_text("")
    spec = write_spec(tmp_path, f'{{ how = "hang", flag = "{tmp_path / "flag"}" }}')
    done = interrupt_when_hanging(spec, tmp_path, signum)
    assert done.returncode == code, done.stderr
    name = signal.Signals(signum).name
    assert f"rpx: interrupted ({name})" in done.stderr
    run = load(tmp_path / "out.toml")
    first = run.model("first")
    assert statuses(first) == {"count_params": "ok", "system_card": "ok", "measure_latency": "interrupted"}
    assert first.stages["measure_latency"].error == f"interrupted by {name}"
    assert first.finished is None and [model.name for model in run.models] == ["first"]
    assert run.provenance.finished is None

    resumed = rpx("run", str(spec), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    again = load(tmp_path / "out.toml")
    for stage in ("count_params", "system_card"):  # kept, not measured again
        assert again.model("first").stages[stage] == first.stages[stage]
    assert again.model("first").ok and again.model("second").ok and again.provenance.finished is not None
    assert again.provenance.created == run.provenance.created
    assert "count_params" not in resumed.stderr.split("second")[0]  # progress lines: first's kept stages not rerun


BATCH = """
[options.batch_search]
max_batch = 16
trial_seconds = 0.02
gain_threshold = 0.0
memory_budget = "4GB"
safety_margin = 0
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_batch_search_keeps_its_finished_trials_and_resume_continues_them(tmp_path, signum, code):
    (tmp_path / "flag").write_text("")
    spec = write_spec(tmp_path, f'{{ how = "hang", flag = "{tmp_path / "flag"}", from_batch = 4 }}',
                      stages='["count_params", "batch_search"]', extra=BATCH)
    spec.write_text(spec.read_text().replace("[options.batch_search]", '[options.batch_search]\npipeline = ["first"]'))
    done = interrupt_when_hanging(spec, tmp_path, signum)
    assert done.returncode == code, done.stderr
    run = load(tmp_path / "out.toml")
    assert run.model("first").ok and run.model("second").ok  # the per-model stages finished before
    record = run.run_stages["batch_search"]
    assert record.status == "interrupted" and record.error == f"interrupted by {signal.Signals(signum).name}"
    finished = record.result.trials
    assert [trial.batch_sizes for trial in finished] == [(1,), (2,)]  # batch 4 hung: the two before it are kept

    resumed = rpx("run", str(spec), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    search = load(tmp_path / "out.toml").run_stages["batch_search"]
    assert search.status == "ok"
    assert search.result.trials[:2] == finished  # continued from them, not measured again
    later = [trial.batch_sizes for trial in search.result.trials[2:]]
    assert later[0] == (4,) and (1,) not in later and (2,) not in later
