"""The console of ``rpx run``: progress events from a real worker process, JSON lines, plain lines when piped,
``--quiet``, the live display; and the throttle that keeps ``ctx.progress`` cheap."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap
import time

from rpx_core.execution.progress import Progress, ProgressReporter
from rpx_core.execution.tasks import Finished, Started
from rpx_core.results.records import StageRecord
from rpx_core.show.console import RunConsole

SPEC = """
name = "console"
backend = "cpu"
stages = ["count_params", "measure_latency"]
batch_sizes = [1, 2]
output = "{out}"

[options.measure_latency]
max_seconds = 1.0
min_samples = 400
warmup_calls = 2
warmup_seconds = 0.05
throughput_seconds = 0.05

[[models]]
name = "cnn"
source = "rpx_plugins.torch.zoo:tiny_cnn"
inputs = [{{ shape = [1, 3, 8, 8], dtype = "float32" }}]
"""


def write_spec(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(SPEC.format(out=tmp_path / "res.toml")))
    return spec


def rpx(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "rpx_core.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_reporter_throttles_but_keeps_each_phases_first_and_last():
    sent: list[Progress] = []
    reporter = ProgressReporter(sent.append)
    reporter.begin("measure_latency")
    for done in range(0, 5001):
        reporter("latency sampling", done, 5000)
    reporter("throughput", 0, 2)
    assert sent[0] == Progress("measure_latency", "latency sampling", 0, 5000)
    assert sent[-2] == Progress("measure_latency", "latency sampling", 5000, 5000)
    assert sent[-1] == Progress("measure_latency", "throughput", 0, 2)
    assert len(sent) < 20  # a tight loop sends a handful, not thousands
    ProgressReporter()("anything", 1, 2)  # a bare context's reporter drops events


def test_jsonl_events_from_a_real_worker(tmp_path):
    done = rpx("run", str(write_spec(tmp_path)), "--events", "jsonl")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [event["event"] for event in events]
    assert kinds[0] == "stage_started" and kinds[-1] == "run_finished"
    assert events[-1] == {"event": "run_finished", "ok": True, "results": str(tmp_path / "res.toml")}
    phases = {event["phase"] for event in events if event["event"] == "progress"}
    assert {"latency sampling", "throughput"} <= phases
    sampling = [event for event in events if event.get("phase") == "latency sampling"]
    assert all(event["total"] == 400 and event["stage"] == "measure_latency" for event in sampling)
    finished = [event for event in events if event["event"] == "stage_finished"]
    assert [(e["stage"], e["status"]) for e in finished] == [("count_params", "ok"), ("system_card", "ok"),
                                                             ("measure_latency", "ok")]


def test_piped_run_prints_plain_lines_and_tables_in_human_units(tmp_path):
    done = rpx("run", str(write_spec(tmp_path)), "--isolation", "in-process")  # the console is the same; no zygote
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stderr + done.stdout  # nothing redrawn, no colour codes
    lines = done.stderr.splitlines()
    assert any(line.split() == ["cnn", "measure_latency", "running"] for line in lines)
    assert any(line.split()[:3] == ["cnn", "measure_latency", "ok"] and re.search(r"\d (µs|ms|s)$", line) for line in lines)
    assert "Tier 3: measured latency" in done.stdout and "e-0" not in done.stdout
    assert done.stdout.strip().endswith(f"results: {tmp_path / 'res.toml'}")


def test_quiet_prints_only_the_results_path(tmp_path):
    done = rpx("run", str(write_spec(tmp_path)), "--quiet", "--isolation", "in-process")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout == f"results: {tmp_path / 'res.toml'}\n"


def test_live_display_draws_progress_and_prints_each_outcome():
    err = io.StringIO()
    with RunConsole("live", err=err) as console:
        console("m", Started("measure_latency"))
        console("m", Progress("measure_latency", "latency sampling", 64, 662))
        console("m", Progress("measure_latency", "throughput", 0, 2))
        task = console._tasks[("m", "measure_latency")]
        shown = next(t for t in console._live.tasks if t.id == task)
        assert (shown.description, shown.completed, shown.total) == ("m · measure_latency · throughput", 0, 2)
        console("m", Finished("measure_latency", StageRecord("failed", seconds=0.0123, error="RuntimeError: boom")))
        assert console._live.tasks == []
    assert "m                    measure_latency    failed   12.3 ms  RuntimeError: boom" in err.getvalue()


def test_batch_search_reports_its_trials(tmp_path):
    spec = tmp_path / "batch.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "batch"
        backend = "cpu"
        stages = ["batch_search"]
        output = "{tmp_path / 'res.toml'}"
        [options.batch_search]
        memory_budget = "0.5"
        max_batch = 4
        trial_seconds = 0.01
        gain_threshold = 0.0
        [[models]]
        name = "cnn"
        source = "rpx_plugins.torch.zoo:tiny_cnn"
        inputs = [{{ shape = [1, 3, 8, 8], dtype = "float32" }}]
    """))
    done = rpx("run", str(spec), "--events", "jsonl")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    trials = [event for event in events if event.get("phase") == "batch-search trials"]
    assert trials and trials[0]["done"] == 0 and trials[0]["total"] is None and trials[0]["model"] == "<run>"


def test_something_is_on_screen_within_a_second_of_rpx_run(tmp_path):
    """On a terminal (a real pseudo-terminal here), what rpx is doing is on screen within a second of the command,
    before the spec is checked; piped, stderr holds only the stages' lines; the final tables include everything
    `rpx show` prints by default (throughput too)."""
    import os
    import pty
    import select

    spec = write_spec(tmp_path)
    floor = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # the interpreter's own start, however loaded we are
    floor = time.monotonic() - floor
    leader, follower = pty.openpty()
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "rpx_core.cli", "run", str(spec)], stdout=subprocess.DEVNULL,
                               stderr=follower, env={**os.environ, "COLUMNS": "120"})
    os.close(follower)
    shown = b""
    while b"checking" not in shown and select.select([leader], [], [], 30)[0]:
        shown += os.read(leader, 4096)
    waited = time.monotonic() - started
    process.kill()
    process.wait()
    os.close(leader)
    assert f"rpx: checking {spec}".encode() in shown.replace(b"\r\n", b"")
    assert waited - floor < 1.0, f"on screen after {waited:.2f} s ({floor:.2f} s to start Python)"
    piped = rpx("run", str(spec))  # piped: no notes, one line per stage, every table at the end
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr.splitlines()[0].split() == ["cnn", "count_params", "running"]
    for title in ("Tier 1", "Tier 3: measured latency", "Tier 3: throughput per batch size"):
        assert title in piped.stdout
