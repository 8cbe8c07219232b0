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


def write_spec(tmp_path: Path, models: dict[str, str], *, stages: str = '["count_params", "measure_latency"]',
               extra: str = LATENCY, execution: str = "stage_timeout = 60") -> Path:
    """A spec with one model per entry of ``models`` (name -> kwargs table), all built by models.py:build."""
    (tmp_path / "models.py").write_text(MODELS)
    tables = "".join(f"""
        [[models]]
        name = "{name}"
        source = "models.py:build"
        kwargs = {kwargs}
        inputs = [{{ shape = [1, 4] }}]
        """ for name, kwargs in models.items())
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "probe"
        stages = {stages}
        output = "out.toml"
        [execution]
        {execution}
        """) + textwrap.dedent(tables) + textwrap.dedent(extra))
    return spec


def rpx(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rpx_core.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def statuses(model) -> dict[str, str]:
    return {name: record.status for name, record in model.stages.items()}


CRASHES = {
    "segv": "worker crashed during stage 'measure_latency': killed by signal SIGSEGV (segmentation fault)",
    "sigkill": "worker crashed during stage 'measure_latency': killed by signal SIGKILL (killed: the system's "
               "out-of-memory killer, or another process)",
    "exit0": "SystemExit: user code called sys.exit(0) during stage 'measure_latency'",
    "raise": "ValueError: broken on purpose",
    "hang": "timed out: stage 'measure_latency' ran past the stage_timeout of 3 s and was stopped",
}


def test_crashes_hangs_and_exits_fail_their_job_only_and_resume_redoes_nothing(tmp_path):
    """One run, one model per misbehaviour (a segfault and a SIGKILL mid-job, a hang in forward and at import,
    sys.exit(0), an exception), and a good model last: each is recorded, the run goes on, exit code 1."""
    models = {how: f'{{ how = "{how}" }}' for how in CRASHES} | {"importhang": "{}", "good": "{}"}
    spec = write_spec(tmp_path, models, execution="stage_timeout = 3")
    (tmp_path / "slow.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\ndef build():\n    pass\n")
    spec.write_text(spec.read_text().replace('name = "importhang"\nsource = "models.py:build"',
                                             'name = "importhang"\nsource = "slow.py:build"'))
    done = rpx("run", str(spec), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    run = load(tmp_path / "out.toml")
    assert [model.name for model in run.models] == [*CRASHES, "importhang", "good"]
    for how, error in CRASHES.items():
        model = run.model(how)
        assert statuses(model) == {"count_params": "ok", "system_card": "ok", "measure_latency": "failed"}, how
        assert model.stages["measure_latency"].error == error
        assert model.finished is not None  # the job is over (failed), not interrupted
    segv = run.model("segv").stages["measure_latency"]  # faulthandler's dump: the Python stack of the crash
    assert "Fatal Python error: Segmentation fault" in segv.stderr_tail and "in forward" in segv.stderr_tail
    assert "probe: hanging now" in run.model("hang").stages["measure_latency"].stderr_tail
    assert run.model("hang").stages["measure_latency"].seconds >= 3
    for how in ("exit0", "raise"):
        assert "Traceback" in run.model(how).stages["measure_latency"].traceback
    importhang = run.model("importhang")
    assert importhang.stages["count_params"].error == (
        "timed out: stage 'count_params' ran past the stage_timeout of 3 s and was stopped")
    assert statuses(importhang) == {"count_params": "failed", "system_card": "skipped", "measure_latency": "skipped"}
    assert importhang.stages["measure_latency"].error.startswith("not run: stage 'count_params' of this job failed")
    assert run.model("good").ok and run.provenance.finished is not None

    resumed = rpx("run", str(spec), "--resume", cwd=tmp_path)  # every job is complete: nothing runs again
    assert resumed.returncode == 1, resumed.stderr
    assert load(tmp_path / "out.toml").models == run.models


def interrupt_when_hanging(spec: Path, flag: Path, signum: int, *args: str) -> subprocess.CompletedProcess:
    """Run ``spec``; when the model with ``flag`` says it hangs, send ``signum`` to rpx (the parent process only)."""
    tmp_path = spec.parent
    marker = flag.with_name(flag.name + ".hanging")
    process = subprocess.Popen([sys.executable, "-m", "rpx_core.cli", "run", str(spec), *args], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the model never started hanging"
        time.sleep(0.05)
    os.kill(process.pid, signum)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


BATCH = """
[options.batch_search]
pipeline = ["second"]
max_batch = 16
trial_seconds = 0.02
gain_threshold = 0.0
memory_budget = "4GB"
safety_margin = 0
"""
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


@pytest.mark.parametrize("per_model, run_scoped", [(signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)])
def test_interrupted_stages_are_recorded_and_resume_finishes_the_rest(tmp_path, per_model, run_scoped):
    """Interrupt the first model's measure_latency, resume; the resumed run hangs in batch_search: interrupt it,
    resume again. Each time the file holds everything finished, and nothing finished is measured again."""
    first_flag, second_flag = tmp_path / "first-flag", tmp_path / "second-flag"
    first_flag.write_text("")
    spec = write_spec(tmp_path, {"first": f'{{ how = "hang", flag = "{first_flag}" }}',
                                 "second": f'{{ how = "hang", flag = "{second_flag}", from_batch = 4 }}'},
                      stages='["count_params", "measure_latency", "batch_search"]', extra=LATENCY + BATCH)
    done = interrupt_when_hanging(spec, first_flag, per_model)
    name = signal.Signals(per_model).name
    assert done.returncode == CODES[per_model], done.stderr
    assert f"rpx: interrupted ({name})" in done.stderr
    run = load(tmp_path / "out.toml")
    first = run.model("first")
    assert statuses(first) == {"count_params": "ok", "system_card": "ok", "measure_latency": "interrupted"}
    assert first.stages["measure_latency"].error == f"interrupted by {name}"
    assert first.finished is None and [model.name for model in run.models] == ["first"]
    assert run.provenance.finished is None and not run.run_stages
    assert run.unfinished == ("first", "second")  # named, the one never started too
    assert "2 job(s) did not finish: first, second;" in done.stderr

    second_flag.write_text("")  # the second model hangs in batch_search's trial at batch 4
    done = interrupt_when_hanging(spec, second_flag, run_scoped, "--resume")
    assert done.returncode == CODES[run_scoped], done.stderr
    assert "  first                count_params" not in done.stderr  # kept, not run again
    again = load(tmp_path / "out.toml")
    for stage in ("count_params", "system_card"):
        assert again.model("first").stages[stage] == first.stages[stage]
    assert again.model("first").ok and again.model("second").ok and again.unfinished == ()
    record = again.run_stages["batch_search"]
    assert record.status == "interrupted" and record.error == f"interrupted by {signal.Signals(run_scoped).name}"
    finished = record.result.trials
    assert [trial.batch_sizes for trial in finished] == [(1,), (2,)]  # batch 4 hung: the two before it are kept

    resumed = rpx("run", str(spec), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    final = load(tmp_path / "out.toml")
    assert final.models == again.models  # every model job was complete
    search = final.run_stages["batch_search"]
    assert search.status == "ok" and search.result.trials[:2] == finished  # continued from them
    later = [trial.batch_sizes for trial in search.result.trials[2:]]
    assert later[0] == (4,) and (1,) not in later and (2,) not in later
    assert final.provenance.finished is not None and final.provenance.created == run.provenance.created
    assert final.unfinished == () and final.ok


#: Model files that misbehave when imported, and what the record of the model says of it.
AT_IMPORT = {
    "exit0": ("import sys\nsys.exit(0)\n", "SystemExit: user code called sys.exit(0) during stage 'backend inference'"),
    "exit3": ("import sys\nsys.exit(3)\n", "SystemExit: user code called sys.exit(3) during stage 'backend inference'"),
    "segv": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
             "worker crashed during stage 'backend inference': killed by signal SIGSEGV (segmentation fault)"),
    "hang": ("import time\nwhile True:\n    time.sleep(0.05)\n",
             "timed out: stage 'backend inference' ran past the stage_timeout of 2 s and was stopped"),
}


def inferring_spec(tmp_path: Path, how: str) -> Path:
    """A spec naming no backend whose first model's file misbehaves at import as ``how`` says; a good model after it."""
    (tmp_path / "bad.py").write_text(AT_IMPORT[how][0] + "\ndef build():\n    pass\n")
    spec = write_spec(tmp_path, {"bad": "{}", "good": "{}"}, stages='["count_params"]', extra="",
                      execution="stage_timeout = 2")
    spec.write_text(spec.read_text().replace('name = "bad"\nsource = "models.py:build"',
                                             'name = "bad"\nsource = "bad.py:build"'))
    return spec


@pytest.mark.parametrize("how", AT_IMPORT)
def test_a_spec_without_backend_infers_it_in_a_worker_and_records_its_faults(tmp_path, how):
    """The first model is built in a worker to infer the backend: its exit, crash or hang there is that model's
    failed record (time limits included), the other model runs, and the exit status is 1."""
    done = rpx("run", str(inferring_spec(tmp_path, how)), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "results: out.toml" in done.stdout
    run = load(tmp_path / "out.toml")
    bad = run.model("bad").stages["count_params"]
    assert bad.status == "failed" and bad.error == (
        f"the spec names no backend, and building this model to infer it failed: {AT_IMPORT[how][1]}")
    assert run.model("bad").finished is not None and run.model("good").ok
    assert run.provenance.finished is not None and run.unfinished == ()
    if how == "segv":
        assert "Fatal Python error: Segmentation fault" in bad.stderr_tail


@pytest.mark.parametrize("how", ["exit0", "hang"])
def test_dry_run_infers_the_backend_in_a_worker_too(tmp_path, how):
    done = rpx("run", str(inferring_spec(tmp_path, how)), "--dry-run", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2 job(s) on executor 'local'; stages: count_params"
    assert lines[1].split()[:2] == ["bad", "cpu/cpu"] and lines[1].endswith(
        f"not run, failed: the spec names no backend, and building this model to infer it failed: {AT_IMPORT[how][1]}")
    assert lines[2].split() == ["good", "cpu/cpu", "fp32", "side", "by", "side"]
    assert not (tmp_path / "out.toml").exists()


KILLS_ITS_PARENT = """
import os, signal
import torch


def build():
    os.kill(os.getppid(), signal.SIGKILL)  # the worker's parent: rpx's zygote, which forks the workers
    return torch.nn.Linear(4, 2)
"""


def test_a_killed_zygote_is_replaced_and_every_job_of_the_sweep_runs(tmp_path):
    """A model that kills the process forking the workers (as the out-of-memory killer may), each time it is built
    (to infer the backend too), costs that process only: every point of the sweep runs, the summary is printed and
    the exit status says how the jobs went."""
    (tmp_path / "killer.py").write_text(KILLS_ITS_PARENT)
    spec = write_spec(tmp_path, {"killer": "{}", "good": "{}"}, stages='["count_params"]', extra="[sweep]\n"
                      "batch_size = [1, 2]\n", execution="stage_timeout = 60")
    spec.write_text(spec.read_text().replace('name = "killer"\nsource = "models.py:build"',
                                             'name = "killer"\nsource = "killer.py:build"'))
    done = rpx("run", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "results: out.toml" in done.stdout and "Tier 1" in done.stdout
    run = load(tmp_path / "out.toml")
    assert [model.name for model in run.models] == [
        "killer[batch_size=1]", "killer[batch_size=2]", "good[batch_size=1]", "good[batch_size=2]"]
    assert all(model.ok and model.finished for model in run.models)
    assert run.provenance.finished is not None and run.unfinished == ()


def zygote_of(pid: int) -> int | None:
    """The process id of rpx's worker zygote, if process ``pid`` has started it."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
            if parent == pid and b"rpx_core.execution.zygote" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return None


def test_sigterm_while_workers_are_being_forked_ends_the_run_within_the_grace(tmp_path):
    """SIGTERM as soon as the zygote exists (it is still importing torch, and the executor's threads wait on it for
    their workers): no job starts after it, rpx exits within the interrupt grace, and names the four jobs. Before,
    the threads got their workers once the import was done and ran their jobs to the end (30 s each)."""
    (tmp_path / "slow.py").write_text("import time\n\ndef build():\n    time.sleep(30)\n")
    spec = write_spec(tmp_path, {"slow": "{}"}, stages='["count_params"]', execution="interrupt_grace = 3",
                      extra="[sweep]\nbatch_size = [1, 2, 3, 4]\n")
    spec.write_text(spec.read_text().replace('source = "models.py:build"', 'source = "slow.py:build"')
                    .replace("[execution]", 'backend = "cpu"\n[execution]'))  # named: no worker before the jobs
    process = subprocess.Popen([sys.executable, "-m", "rpx_core.cli", "run", str(spec)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while zygote_of(process.pid) is None:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "rpx never started its zygote"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGTERM)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert time.monotonic() - sent < 3 + 5, stderr  # the grace, and a margin for a loaded machine
    names = [f"slow[batch_size={size}]" for size in (1, 2, 3, 4)]
    assert f"4 job(s) did not finish: {', '.join(names)};" in stderr
    assert load(tmp_path / "out.toml").unfinished == tuple(names)
