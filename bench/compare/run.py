"""rpx beside the tools people use: accuracy, speed, latency and batch search in one command, written to
docs/comparison.md.

Run: python3 bench/compare/run.py

It creates its own environment (bench/.compare-venv, git-ignored) with torch, transformers and the counting tools at
pinned versions plus this rpx checkout (editable), then runs itself inside it. A tool that does not install is
skipped with pip's reason (recorded in the document); an environment whose pins are already installed is reused.
Sections:
1. accuracy and speed: each tool counts every model of ``compare.models`` in a process of its own
   (``compare.count_worker``), converted to MACs, beside the hand-derived values;
2. latency (``compare.latency``), quiet and under a background load;
3. batch search (``compare.batch``);
4. serving (``compare.serving``): rpx's serve stage beside LLM-Viewer's method, recomputed from its formulas.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
VENV = BENCH / ".compare-venv"
PYTHON = VENV / "bin" / "python"
MARKER = VENV / "rpx-compare.json"
DOC = ROOT / "docs" / "comparison.md"
RAW = BENCH / ".compare-results.json"
REQUIREMENTS = ["torch==2.13.0", "transformers==5.24.0", "fvcore==0.1.5.post20221221", "iopath==0.1.10",
                "ptflops==0.7.5", "thop==0.1.1.post2209072238", "calflops==0.3.2", "pyperf==2.10.0"]
#: Installed one by one after the rest; one that fails is skipped with pip's reason.
OPTIONAL = {"deepspeed": "deepspeed==0.19.8"}
WORKER_TIMEOUT_S = 420


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def prepare() -> dict[str, str]:
    """The environment, installed once per set of pins; {distribution: why it is missing}."""
    wanted = {"requirements": REQUIREMENTS, "optional": OPTIONAL}
    if MARKER.exists():
        recorded = json.loads(MARKER.read_text())
        if {key: recorded.get(key) for key in wanted} == wanted:
            return recorded["unavailable"]
    if not PYTHON.exists():
        print(f"creating {VENV.relative_to(ROOT)}", flush=True)
        venv.create(VENV, with_pip=True)
    pip = [str(PYTHON), "-m", "pip", "install", "-q"]
    print(f"installing {', '.join(REQUIREMENTS)} and rpx (editable)", flush=True)
    subprocess.run([*pip, *REQUIREMENTS, "-e", str(ROOT)], check=True)
    unavailable = {}
    for name, requirement in OPTIONAL.items():
        print(f"installing {requirement}", flush=True)
        done = subprocess.run([*pip, requirement], capture_output=True, text=True)
        if done.returncode:
            unavailable[name] = f"{requirement} did not install: {last_line(done.stderr)}"
            print(f"  skipped: {unavailable[name]}", flush=True)
    MARKER.write_text(json.dumps({**wanted, "unavailable": unavailable}, indent=1))
    return unavailable


def count_with(tool_name: str) -> tuple[dict[str, dict], str | None]:
    """{model: reading} from one tool's worker process, and why there is none (None when it ran)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "counts.jsonl"
        out.touch()
        try:
            done = subprocess.run([sys.executable, "-m", "compare.count_worker", tool_name, str(out)], cwd=BENCH,
                                  capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
            failure = f"exit {done.returncode}: {last_line(done.stderr)}"
        except subprocess.TimeoutExpired:
            failure = f"did not finish within {WORKER_TIMEOUT_S} s"
        readings = {row["model"]: row for row in map(json.loads, out.read_text().splitlines())}
    return readings, None if readings else failure


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("rpx", "torch", "transformers", "fvcore", "ptflops", "thop", "calflops", "deepspeed", "pyperf"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def system_card() -> str:
    from rpx_plugins.system_card import machine_card

    card = machine_card("torch")
    facts = {
        "CPU": f"{card.host_processor_model_name} ({card.host_processor_architecture})",
        "logical CPUs": card.host_processor_thread_count,
        "physical cores per socket / sockets": f"{card.host_processor_core_count} / {card.host_processors_per_node}",
        "RAM": f"{card.host_memory_capacity_gb} GB",
        "OS": card.operating_system,
        "Python": card.python_version,
        "accelerators": card.accelerator_model_name or "none",
        "gaps": "; ".join(card.gaps) or "none",
    }
    return "\n".join(f"| {key} | {value} |" for key, value in facts.items())


def environment(started: float) -> str:
    """How the environment came to be: installed by this run (the marker is written when installing ends) or reused."""
    installed = MARKER.stat().st_mtime - started
    return f"{installed:.0f} s of it creating the environment" if installed > 0 else "environment reused"


def headline(counts: dict, medians: dict[str, float], latency_rows: list[dict], batch: dict) -> list[str]:
    from compare.models import CASES
    from compare.report import macs_reason

    exact = {name: sum(1 for model in CASES if (r := readings.get(model.name)) and r.get("macs") is not None
                       and macs_reason(r["macs"], model.analytic) is None)
             for name, readings in counts.items()}
    quiet = [r["rpx_p50_ms"] / r["timer_median_ms"] for r in latency_rows if r["condition"] == "quiet"]
    real = batch["real"]
    return [
        "MACs exact (within 0.01% of the hand-derived value) on N of " + f"{len(CASES)} models: "
        + ", ".join(f"{name} {n}" for name, n in exact.items()),
        "count time, median over the models, as a multiple of rpx's (rpx on meta): "
        + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in medians.items()),
        "latency, quiet: rpx p50 / torch.utils.benchmark median = " + ", ".join(f"{ratio:.3f}" for ratio in quiet),
        f"batch search: rpx {sum(r['rpx_trials'] for r in real)} real trials vs {sum(r['base_trials'] for r in real)} "
        f"for doubling+bisection ({batch['oracle']['rpx_mean'] / batch['oracle']['base_mean']:.2f}x on the "
        f"{batch['oracle']['budgets']}-budget sweep)",
    ]


def inside(started: float, unavailable: dict[str, str]) -> None:
    sys.path.insert(0, str(BENCH))
    from compare import batch, latency
    from compare.report import accuracy_tables, batch_table, latency_table, speed_table
    from compare.serving import section as serving_section
    from compare.tools import TOOLS

    load_start = os.getloadavg()
    counts, missing = {}, {}
    for tool in TOOLS:
        if tool.distribution in unavailable:
            missing[tool.name] = unavailable[tool.distribution]
            continue
        print(f"counting with {tool.name}", flush=True)
        readings, why = count_with(tool.name)
        if why:
            missing[tool.name] = why
        else:
            counts[tool.name] = readings
    print("latency (quiet, then loaded)", flush=True)
    latency_rows = latency.main()
    print("batch search", flush=True)
    batch_result = batch.main()
    print("serving", flush=True)
    serving = serving_section()
    RAW.write_text(json.dumps({"counts": counts, "missing": missing, "latency": latency_rows, "batch": batch_result},
                              indent=1))

    import psutil

    memory_gb = psutil.virtual_memory().total / 1e9
    speed, medians = speed_table(counts, memory_gb)
    lines = headline(counts, medians, latency_rows, batch_result)
    seconds = time.time() - started
    load_end = os.getloadavg()
    conventions = "\n".join(f"| {t.name} | {t.native} | {t.device} |" for t in TOOLS)
    text = DOC_TEMPLATE.format(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        seconds=seconds, environment=environment(started), load_start=" / ".join(f"{x:.1f}" for x in load_start),
        load_end=" / ".join(f"{x:.1f}" for x in load_end), cpus=os.cpu_count(),
        sharing="shared with other work: times are what a loaded machine gives" if max(load_start[0], load_end[0]) > (
            os.cpu_count() or 1) / 2 else "no other heavy work was running",
        headline="\n".join(f"- {line}" for line in lines), card=system_card(),
        versions=", ".join(f"{name} {v}" for name, v in versions().items()), conventions=conventions,
        accuracy=accuracy_tables(counts, missing), speed=speed, latency=latency_table(latency_rows),
        batch=batch_table(batch_result), serving=serving)
    DOC.write_text(text)
    print("\n".join(lines))
    print(f"wrote {DOC.relative_to(ROOT)} in {seconds:.0f} s (raw figures: {RAW.relative_to(ROOT)})")


DOC_TEMPLATE = """# rpx beside the tools people use

Generated by `python3 bench/compare/run.py` on {date}, in {seconds:.0f} s end to end ({environment}). Load average (1/5/15 min) at the start {load_start}, at the end {load_end}, on {cpus} logical CPUs
({sharing}); ratios are measured side by side in one run. Rerun the command to regenerate every table below.

## Headline

{headline}

## The machine

| fact | value |
|---|---|
{card}

Versions: {versions}.

## Conventions

Every count is converted to MACs (multiply-accumulates of matmul, convolution and attention; FLOPs = 2 x MACs). The
independent value is derived by hand from each model's hyperparameters (`bench/compare/models.py`): convolution
out_channels x out_h x out_w x in_channels/groups x kh x kw, linear tokens x in x out, attention QK^T and PV each
tokens x tokens x hidden (causal masks dense), nothing for embeddings, norms, activations and pooling; parameters
count a tied weight once. rpx counts on the meta device (no weights allocated); the others on real CPU tensors.

| tool | reports | counted on |
|---|---|---|
{conventions}

## Accuracy

{accuracy}

## Speed of a count

Per model: rpx's seconds (median of 3 counts, each on a freshly built model, building excluded) and peak RSS (the
process's high-water mark above its resident set before building the model, so weights a tool needs allocated are
in it); per tool: its time and peak RSS as multiples of rpx's (rpx's peak taken as at least 1 MB), with its own
figures in brackets. Each tool runs in a process of its own. rpx's time is a whole `rpx.profile` call (plugin
loading, spec checks, parameters, and one pass giving FLOPs, bytes and activation memory): on these small models that
fixed cost of about 0.2 s is most of it, and sub-0.1 s figures move by several times between runs on a loaded machine.

{speed}

## Latency

Batch-1 forward under `torch.inference_mode`, one torch thread (on a small shared machine torch's spinning intra-op
threads turn other processes' load into millisecond stalls). rpx: `measure_latency` (2 s, p50 with its
interval); torch.utils.benchmark: `Timer.blocked_autorange` median (min_run_time 1 s); pyperf: `pyperf timeit`
mean +- standard deviation over 3 worker processes x 3 values (pyperf's default is 20 processes). The three run
one after another, so load that changes between them shows up in their ratio. Loaded: one busy-looping process per logical CPU.

{latency}

## Batch search

Trials and seconds to the largest batch size that fits a memory budget (within 5%), rpx's `batch_search` beside a
doubling-then-bisection finder (Lightning's "binsearch"), both running real trials on the same workload
(`bench/bench_batch_search.py`).

{batch}

{serving}"""


def main() -> None:
    started = float(os.environ.get("RPX_COMPARE_STARTED", time.time()))
    if Path(sys.prefix).resolve() != VENV.resolve():
        prepare()
        env = {**os.environ, "RPX_COMPARE_STARTED": str(started)}
        os.execve(str(PYTHON), [str(PYTHON), __file__], env)
    inside(started, json.loads(MARKER.read_text())["unavailable"])


if __name__ == "__main__":
    main()
