"""Sweeps: a [sweep] matrix expanded into named jobs with coordinates, checked with key paths, listed by --dry-run,
resumed point by point, and run by the local executor side by side exactly as one at a time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs

import rpx_core as rpx
from rpx_core.convert import converter
from rpx_core.execution.executors import Environment, Executor, Resources, WorkItem
from rpx_core.plugin import hookimpl
from rpx_core.registry.manager import Plugins
from rpx_core.results.serialise import load, write
from rpx_core.results.writer import WRITE_INTERVAL
from rpx_core.spec.limits import Execution
from rpx_plugins.executors.local import LocalExecutor, LocalOptions
from tests.conftest import make_plugin_package, pip_install_target, rpx_cli

MODELS = Path(__file__).with_name("sweep_models.py")
COUNTS = ("count_params", "count_flops", "estimate_traffic")

SWEEP_SPEC = f"""
name = "sweep"
stages = ["count_params", "count_flops", "estimate_traffic"]

[[models]]
name = "tokens"
source = "{MODELS}:token_linear"
inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]

[[models]]
name = "conv"
source = "{MODELS}:conv"
inputs = [{{ shape = [1, 3, 8, 8] }}]
"""


def test_a_sweep_is_one_job_per_point_named_by_its_coordinates_with_hand_computed_flops(write_spec, tmp_path):
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        models = ["tokens"]
        batch_size = [1, 2, 2]
        seq_len = [8, 32, 8]
    """)
    result = rpx.run(spec, output=tmp_path / "out.toml")
    names = [model.name for model in result.models]
    assert names == ["tokens[batch_size=1,seq_len=8]", "tokens[batch_size=1,seq_len=32]",
                     "tokens[batch_size=2,seq_len=8]", "tokens[batch_size=2,seq_len=32]"]  # repeats dropped, order kept
    for model in result.models:
        batch, seq = model.coordinates["batch_size"], model.coordinates["seq_len"]
        assert model.coordinates == {"model": "tokens", "batch_size": batch, "seq_len": seq}
        assert model.result("count_flops").matrix_flops == 2 * batch * seq * 8 * 4
        assert model.result("count_flops").counted_inputs == (f"int64[{batch},{seq}]",)
    again = load(tmp_path / "out.toml")
    assert [model.coordinates for model in again.models] == [model.coordinates for model in result.models]


def test_resolution_and_precision_axes(write_spec, tmp_path):
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        models = ["conv"]
        resolution = [8, 16]
        precision = ["fp32", "bf16"]
    """)
    result = rpx.run(spec, output=tmp_path / "out.toml")
    assert len(result.models) == 4
    for model in result.models:
        size, precision = model.coordinates["resolution"], model.coordinates["precision"]
        assert model.name == f"conv[resolution={size},precision={precision}]"
        assert model.precision == precision
        assert model.result("count_flops").matrix_flops == 2 * size * size * 4 * 3 * 9
        assert model.result("count_params").bytes_at_precision == 4 * 3 * 9 * (4 if precision == "fp32" else 2)


def test_a_wrong_sweep_is_one_line_per_problem_with_its_key_path(write_spec):
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        models = ["tokens", "tokenz"]
        resolution = [224]
        backend = ["cpux"]
        machine = ["H100-SXM"]
    """)
    done = rpx_cli("validate", str(spec))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    expected = [
        "sweep.models[1]: no [[models]] entry is named 'tokenz' (models: tokens, conv)",
        "sweep.resolution: model 'tokens' has no floating-point input of shape [N, C, H, W] to set",
        "sweep.backend[0]: 'cpux' not recognized. Choose one of: cpu",
        "sweep.machine: no stage of this spec measures on a machine",
    ]
    for text in expected:
        assert any(text in line for line in lines), (text, lines)
    assert all(line.startswith(f"rpx: error: {spec}: ") for line in lines), lines
    assert "Traceback" not in done.stderr


def test_a_zero_in_an_axis_and_a_machine_on_the_local_executor_are_refused(write_spec):
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        batch_size = [0]
    """)
    done = rpx_cli("validate", str(spec))
    assert done.returncode == 2 and "sweep.batch_size[0]: must be at least 1 (a zero dimension runs no work), got 0" in done.stderr, done.stderr
    spec = write_spec(SWEEP_SPEC.replace('stages = ["count_params", "count_flops", "estimate_traffic"]',
                                         'stages = ["measure_latency"]') + """
        [sweep]
        machine = ["NVIDIA H100 80GB HBM3"]  # an alias: placed by its canonical name
    """)
    done = rpx_cli("validate", str(spec))
    assert done.returncode == 2, done.stderr
    assert "sweep.machine: the local executor runs every job on this machine, so it cannot place jobs on H100-SXM" \
        in done.stderr


def test_dry_run_lists_the_jobs_and_runs_nothing(write_spec, tmp_path):
    spec = write_spec(SWEEP_SPEC.replace('stages = ["count_params", "count_flops", "estimate_traffic"]',
                                         f'stages = ["count_flops", "measure_latency"]\noutput = "{tmp_path}/never.toml"')
                      + """
        [sweep]
        batch_size = [1, 4]
    """)
    done = rpx_cli("run", str(spec), "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "4 job(s) on executor 'local'; stages: count_flops, system_card, measure_latency"
    assert [line.split()[0] for line in lines[1:]] == ["tokens[batch_size=1]", "tokens[batch_size=4]",
                                                      "conv[batch_size=1]", "conv[batch_size=4]"]
    assert all("alone (measures: measure_latency)" in line for line in lines[1:])
    assert not (tmp_path / "never.toml").exists()


def test_resume_across_a_sweep_runs_only_the_unfinished_points(write_spec, tmp_path):
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        batch_size = [1, 2]
    """)
    output = tmp_path / "out.toml"
    first = rpx.run(spec, output=output)
    unfinished = "conv[batch_size=1]"
    models = tuple(attrs.evolve(model, finished=None, stages={}) if model.name == unfinished else model
                   for model in first.models)
    write(attrs.evolve(first, models=models), output)
    time.sleep(1.1)  # started times have one-second resolution
    resumed = rpx.run(spec, output=output, resume=True)
    assert [model.name for model in resumed.models] == [model.name for model in first.models]
    for before, after in zip(first.models, resumed.models, strict=True):
        if before.name == unfinished:
            assert after.started != before.started and after.ok
            assert after.result("count_flops") == before.result("count_flops")
        else:
            assert after == before  # kept as it was


def figures(run) -> dict:
    """Every hardware-agnostic figure of a run, by job and stage (timings left out)."""
    return {model.name: {stage: converter.unstructure(model.result(stage)) for stage in COUNTS}
            for model in run.models}


def test_side_by_side_gives_exactly_the_figures_of_one_at_a_time(write_spec, tmp_path):
    text = SWEEP_SPEC + """
        [sweep]
        batch_size = [1, 3]
    """
    parallel = rpx.run(write_spec(text), output=tmp_path / "parallel.toml")
    alone = rpx.run(write_spec(text + "[execution]\nexecutor_options = { workers = 1 }\n", "one.toml"),
                    output=tmp_path / "one-results.toml")
    assert [m.name for m in parallel.models] == [m.name for m in alone.models]  # the spec's order, whatever finished first
    assert figures(parallel) == figures(alone)


class TimingRunner:
    """Stands in for the worker processes: records when each task runs, taking a little time."""

    def __init__(self) -> None:
        self.spans: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def run(self, task, report) -> None:
        started = time.monotonic()
        time.sleep(0.2)
        with self.lock:
            self.spans[task] = (started, time.monotonic())


def test_local_runs_hardware_agnostic_jobs_side_by_side_and_measured_jobs_alone():
    runner = TimingRunner()
    env = Environment(setup=object(), limits=Execution(), options=LocalOptions(workers=2), runner=runner)
    items = [WorkItem(name, name, name.startswith("measured"), Resources(), lambda event: None)
             for name in ("count-a", "measured-a", "count-b", "count-c", "measured-b", "count-d")]
    LocalExecutor().run(items, env)
    spans = runner.spans
    counted = [spans[name] for name in spans if name.startswith("count")]
    measured = sorted(spans[name] for name in spans if name.startswith("measured"))
    assert len(spans) == 6
    overlapping = sum(1 for a in counted for b in counted if a < b and a[1] > b[0])
    assert overlapping >= 2  # two at a time
    assert measured[0][0] >= max(end for _, end in counted)  # after every counting job
    assert measured[1][0] >= measured[0][1]  # and one at a time


# -- a third-party executor, installed like any plugin, written against the public surface only ----------------------

REVERSE_EXECUTOR = '''
import os
import threading

import attrs
from rpx_core.plugin import Executor, Placed, hookimpl, run_task_elsewhere


@attrs.frozen
class ReverseOptions:
    node: str = "elsewhere"


class ReverseExecutor(Executor):
    """Runs the jobs last first, each in a thread of its own process's "remote" side."""

    name = "reverse"
    description = "last job first, through run_task_elsewhere"
    options = ReverseOptions

    def run(self, items, env):
        for item in reversed(items):
            events = []
            thread = threading.Thread(target=lambda: events.extend(run_task_elsewhere(env.setup, env.limits, item.task)))
            thread.start()
            thread.join()
            item.report(Placed(env.options.node))
            for event in events:
                item.report(event)
            print("ran", item.name, "cpus", item.resources.cpus, flush=True)


@hookimpl
def rpx_register_executors():
    return [ReverseExecutor()]
'''


def test_a_third_party_executor_is_a_plugin_like_any_other(write_spec, tmp_path):
    package = make_plugin_package(tmp_path / "src", "rpx-reverse", "rpx_reverse", "reverse", REVERSE_EXECUTOR)
    site = pip_install_target(package, tmp_path / "site")
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        models = ["tokens"]
        batch_size = [1, 2]
        [execution.executor_options]
        node = "node-7"
    """)
    text = spec.read_text().replace('name = "sweep"', f'name = "sweep"\noutput = "{tmp_path}/out.toml"')
    spec.write_text(text)
    done = rpx_cli("run", str(spec), "--executor", "reverse", env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("ran ")] == [
        "ran tokens[batch_size=2] cpus 1.0", "ran tokens[batch_size=1] cpus 1.0"]
    run = load(tmp_path / "out.toml")
    assert [model.name for model in run.models] == ["tokens[batch_size=1]", "tokens[batch_size=2]"]
    assert all(model.node == "node-7" and model.ok for model in run.models)
    assert run.models[1].stages["count_flops"].result["matrix_flops"] == 2 * 2 * 8 * 8 * 4
    spec.write_text(text.replace('node = "node-7"', 'nodes = "node-7"'))
    wrong = rpx_cli("run", str(spec), "--executor", "reverse", env={"PYTHONPATH": str(site)})
    assert wrong.returncode == 2 and "execution.executor_options" in wrong.stderr and "nodes" in wrong.stderr, \
        wrong.stderr


class DropsTheLastJob(Executor):
    """A faulty executor: runs every job but the last and returns as if all were done."""

    name = "drops-last"
    description = "loses its last job"

    def run(self, items, env):
        for item in items[:-1]:
            env.run_here(item)


def test_a_job_an_executor_returns_without_reporting_is_recorded_lost(write_spec, tmp_path):
    class Dropper:
        @hookimpl
        def rpx_register_executors():
            return [DropsTheLastJob()]

    plugins = Plugins.load()
    plugins.register(Dropper, "dropper")  # registered at run time: the jobs run in rpx's process
    spec = write_spec(SWEEP_SPEC + """
        [sweep]
        models = ["tokens"]
        batch_size = [1, 2]
        [execution]
        executor = "drops-last"
    """)
    run = rpx.run(spec, output=tmp_path / "out.toml", plugins=plugins)
    assert not run.ok and run.model("tokens[batch_size=1]").ok  # `rpx run` exits 1
    lost = load(tmp_path / "out.toml").model("tokens[batch_size=2]")
    first, *later = lost.stages.values()
    assert first.status == "failed" and first.error == (
        "lost: executor 'drops-last' returned without reporting this stage (it lost the worker or node, or has a "
        "fault of its own)")
    assert [record.status for record in later] == ["skipped", "skipped"] and lost.finished is not None


def test_a_shape_sweep_of_one_deep_model_replays_its_layers_with_the_figures_of_a_full_trace(write_spec, tmp_path):
    """The shape sweep of one big model, small: every figure (Tier 1 and the roofline) of every point equals counting
    that point with every layer traced."""
    text = """
        name = "shapes"
        precision = "bf16"
        stages = ["count_params", "count_flops", "estimate_traffic", "roofline"]
        gpus = ["H100-SXM", "A100-SXM-80GB"]

        [options.count_flops]
        count_on = "meta"
        {replay}

        [[models]]
        name = "llama"
        source = "rpx_plugins.torch.zoo:llama"
        kwargs = {{ preset = "tiny", n_layers = 6 }}
        meta_only = true
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 128 }}]

        [sweep]
        seq_len = [8, 16, 24, 64]
        batch_size = [1, 2]
    """
    replayed = rpx.run(write_spec(text.format(replay="")), output=tmp_path / "replayed.toml")
    traced = rpx.run(write_spec(text.format(replay="replay_repeats = false"), "traced-spec.toml"),
                     output=tmp_path / "traced.toml")

    def all_figures(run) -> dict:
        found = {}
        for model in run.models:
            for stage in (*COUNTS, "roofline"):
                result = converter.unstructure(model.result(stage))
                result.pop("replayed", None)
                found[model.name, stage] = result
        return found

    assert len(replayed.models) == 8
    assert all(model.result("count_flops").replayed for model in replayed.models)
    assert not any(model.result("count_flops").replayed for model in traced.models)
    assert all_figures(replayed) == all_figures(traced)


def model_tables(*models: tuple[str, str, str]) -> str:
    """[[models]] tables of sweep_models factories taking one token input: (name, factory, kwargs as TOML)."""
    return "".join(f"""
        [[models]]
        name = "{name}"
        source = "{MODELS}:{factory}"
        kwargs = {{ {kwargs} }}
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
    """ for name, factory, kwargs in models)


def test_jobs_that_only_count_follow_each_other_in_one_worker_and_a_crash_ends_only_its_own(write_spec, tmp_path):
    """No fork per counting job: one worker serves them in turn, each in the process-wide torch modes the worker
    started with; a worker that dies takes only its job, the next job gets a fresh worker, and a measured job always
    gets a fresh worker of its own."""
    log = tmp_path / "pids.log"
    models = model_tables(*((name, factory, f'log = "{log}"{extra}') for name, factory, extra in [
        ("a", "pid_linear", ', default_dtype = "float64"'), ("b", "pid_linear", ""), ("c", "dies_in_worker", ""),
        ("d", "pid_linear", ""), ("e", "pid_linear", "")]))
    spec = write_spec(f"""
        backend = "cpu"  # named, so rpx does not build the first model to infer it
        stages = ["count_params", "count_flops"]
        [execution]
        executor_options = {{ workers = 1 }}
        {models}
    """)
    result = rpx.run(spec, output=tmp_path / "out.toml")
    pids, dtypes = zip(*(line.split() for line in log.read_text().splitlines()))
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4]  # c's worker died with it; d started a new one
    assert dtypes == ("float32",) * 5  # a's float64 default did not follow it into b
    assert result.model("c").stages["count_params"].status == "failed"
    assert all(result.model(name).ok for name in "abde")
    assert result.model("b").result("count_flops").matrix_flops == 2 * 8 * 8 * 4

    log.unlink()
    measured = write_spec(f"""
        backend = "cpu"
        stages = ["count_params", "measure_latency"]
        [options.measure_latency]
        warmup_calls = 1
        warmup_seconds = 0
        min_samples = 3
        max_seconds = 0.5
        {model_tables(("m1", "pid_linear", f'log = "{log}"'), ("m2", "pid_linear", f'log = "{log}"'))}
    """, "measured.toml")
    assert rpx.run(measured, output=tmp_path / "measured-out.toml").ok
    pids = [line.split()[0] for line in log.read_text().splitlines()]  # each built on meta, then for real
    assert len(pids) == 4 and pids[0] == pids[1] != pids[2] == pids[3]


def test_a_job_whose_stage_fails_ends_its_worker(write_spec, tmp_path):
    """A stage that fails in the worker (an exception in user code, not a crash) may leave the process in any state:
    the job's worker is ended, and the next job starts in a fresh one, which the job after it shares."""
    log = tmp_path / "pids.log"
    models = model_tables(*((name, factory, f'log = "{log}"') for name, factory in [
        ("a", "pid_linear"), ("broken", "raises_in_forward"), ("c", "pid_linear"), ("d", "pid_linear")]))
    spec = write_spec(f"""
        backend = "cpu"
        stages = ["count_params", "count_flops"]
        [execution]
        executor_options = {{ workers = 1 }}
        {models}
    """)
    result = rpx.run(spec, output=tmp_path / "out.toml")
    assert result.model("broken").stages["count_flops"].status == "failed"
    assert "broken forward" in result.model("broken").stages["count_flops"].error
    assert all(result.model(name).ok for name in "acd")
    pids = [line.split()[0] for line in log.read_text().splitlines()]  # a, broken (built again to count), c, d
    assert len(set(pids[:-2])) == 1 and pids[-2] == pids[-1] != pids[0]


def test_a_measured_stage_runs_with_no_idle_counting_worker_left(write_spec, tmp_path):
    """Counting jobs leave their worker idle for the next; a measured task (here the run-scoped batch_search after
    them) ends those first, so no idle worker holds memory (a CUDA context, cached blocks) while it measures, as
    when every job had a worker of its own."""
    counting, measured = tmp_path / "counting.log", tmp_path / "measured.log"
    spec = write_spec(f"""
        backend = "cpu"
        stages = ["count_params", "batch_search"]
        [execution]
        executor_options = {{ workers = 1 }}
        [options.batch_search]
        pipeline = ["m"]
        memory_budget = "4GB"
        max_batch = 2
        trial_seconds = 0.05
        {model_tables(("c1", "pid_linear", f'log = "{counting}"'), ("c2", "pid_linear", f'log = "{counting}"'),
                      ("m", "counts_live_workers", f'log = "{measured}", watch = "{counting}"'))}
    """)
    result = rpx.run(spec, output=tmp_path / "out.toml")
    assert result.ok, [(m.name, r.error) for m in result.models for r in m.stages.values() if r.error]
    assert result.run_stages["batch_search"].status == "ok"
    assert len(set(counting.read_text().split()[::2])) == 1  # c1, c2 (and m's count_params) shared one worker
    first, *in_batch_search = measured.read_text().split()
    assert first == "0" and in_batch_search and set(in_batch_search) == {"0"}, (first, in_batch_search)


def rpx_in_background(spec: Path, output: Path) -> subprocess.Popen:
    """``rpx run`` in its own process group (its zygote and workers with it), to be killed mid-run."""
    return subprocess.Popen([sys.executable, "-m", "rpx_core.cli", "run", str(spec), "-o", str(output), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def killed_with_its_workers(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_a_sweep_killed_mid_run_keeps_what_was_written_and_resume_finishes_it(write_spec, tmp_path):
    """Results that only count are written at most every WRITE_INTERVAL: a SIGKILL of rpx itself loses at most that
    window, the file on disk is whole, and --resume computes the rest, to the figures of an uninterrupted run."""
    spec = write_spec(f"""
        backend = "cpu"
        stages = ["count_params", "count_flops", "estimate_traffic"]
        [execution]
        executor_options = {{ workers = 1 }}
        {model_tables(("slow", "slow_linear", "seconds = 0.25"))}
        [sweep]
        batch_size = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    """)
    output = tmp_path / "out.toml"
    process = rpx_in_background(spec, output)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until a few jobs are on disk
        if output.exists() and output.read_text().count("finished = ") >= 3:
            break
        time.sleep(0.05)
    time.sleep(WRITE_INTERVAL)
    killed_with_its_workers(process)
    killed = load(output)
    done = [model.name for model in killed.models if model.finished]
    assert 3 <= len(done) < 12
    assert all(model.ok for model in killed.models if model.finished)

    resumed = rpx_cli("run", str(spec), "-o", str(output), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    whole = rpx.run(spec, output=tmp_path / "whole.toml")
    assert figures(load(output)) == figures(whole)


def test_results_held_back_are_written_within_the_window_while_a_long_job_runs(write_spec, tmp_path):
    """A quick job's last counts, held back by the write interval, reach the disk (WRITE_INTERVAL later; the test
    waits longer, for a slow machine) while the next job sends nothing for seconds; a SIGKILL of rpx then keeps
    them, and --resume runs only the long job."""
    log = tmp_path / "pids.log"
    spec = write_spec(f"""
        backend = "cpu"
        stages = ["count_params", "count_flops", "estimate_traffic"]
        [execution]
        executor_options = {{ workers = 1 }}
        {model_tables(("quick", "pid_linear", f'log = "{log}"'), ("long", "slow_linear", "seconds = 8"))}
    """)
    output = tmp_path / "out.toml"
    process = rpx_in_background(spec, output)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (log.exists() and log.read_text()):  # quick is being built
            time.sleep(0.02)
        deadline = time.monotonic() + 7  # long, built after quick, sleeps 8 s: nothing reports meanwhile
        quick = None
        while time.monotonic() < deadline and not (quick is not None and quick.finished):
            time.sleep(WRITE_INTERVAL / 5)
            quick = load(output).model("quick") if "quick" in output.read_text() else None
        assert process.poll() is None  # still running: long had not reported anything when quick was read
        assert quick is not None and quick.finished and quick.ok and set(quick.stages) == set(COUNTS)
    finally:
        killed_with_its_workers(process)
    assert not load(output).model("long").finished
    log.unlink()
    resumed = rpx_cli("run", str(spec), "-o", str(output), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert not log.exists()  # quick was kept, not built again
    assert all(model.ok and model.finished for model in load(output).models)


def test_every_job_of_a_reused_worker_starts_from_the_random_state_of_a_fresh_one(write_spec, tmp_path):
    """Jobs that share a worker draw the same random numbers a fresh worker would, so which jobs happen to share
    one (side by side, that depends on timing) cannot change a figure."""
    log = tmp_path / "pids.log"
    spec = write_spec(f"""
        backend = "cpu"
        stages = ["count_params", "count_flops"]
        [execution]
        executor_options = {{ workers = 1 }}
        [[models]]
        name = "wide"
        source = "{MODELS}:rng_width"
        kwargs = {{ log = "{log}" }}
        inputs = [{{ shape = [1, 8] }}]
        [sweep]
        batch_size = [1, 2, 3]
    """)
    result = rpx.run(spec, output=tmp_path / "out.toml")
    assert result.ok, [(m.name, r.error) for m in result.models for r in m.stages.values() if r.error]
    assert len(set(log.read_text().split())) == 1  # one worker served all three
    params = [model.result("count_params").total for model in result.models]
    assert len(params) == 3 and len(set(params)) == 1, params
