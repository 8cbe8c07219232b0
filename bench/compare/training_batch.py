"""Training batch search beside the tools people use: rpx's ``train_batch_search``, Lightning's ``BatchSizeFinder``
(mode "binsearch") and accelerate's ``find_executable_batch_size``, and a direct bisection of real steps for the true
limit: the same model (an MLP, 64 -> 512 -> 10, AdamW, fp32, on the CPU), the same room, the same measurement.

Run: python3 bench/compare/training_batch.py [ROOM_MB] (default 32); it creates bench/.training-compare-venv (torch,
pytorch-lightning, accelerate at pinned versions and this rpx checkout, editable) once, runs each tool in it, and
writes its section of docs/comparison.md (from its heading to its end marker; bench/compare/run.py keeps it).

The budget: neither tool knows a memory budget; both run steps until one raises an out-of-memory error. On the CPU
nothing runs out below the machine's RAM, so every tool's step is checked against the same budget: a step whose
peak RSS (VmHWM over the step, glibc's allocator set as rpx sets it so freed tensors leave the RSS) exceeds it
raises torch's CPU allocator error ("DefaultCPUAllocator: can't allocate memory"), which both tools recognise as an
out-of-memory error, as a GPU at its limit would. Each tool runs in a process of its own: the process first imports
its library, builds the model and runs three steps (libraries allocate on first use; rpx also counts a step), then
its usage is read, when its first trial starts (Lightning: its trainer and data made), and the budget is that plus
ROOM_MB. rpx reads the same peak itself and compares it with the same budget. A trial is a batch
size tried: rpx's trials, the distinct batch sizes Lightning's finder ran (it runs 3 steps each), accelerate's calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
VENV = BENCH / ".training-compare-venv"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ["torch==2.13.0", "pytorch-lightning==2.6.6", "accelerate==1.15.0"]
TOOLS = ("direct", "rpx", "lightning", "accelerate")
OOM = "DefaultCPUAllocator: can't allocate memory: the step's peak RSS is over the budget"
WIDTH, HIDDEN, CLASSES = 64, 512, 10
ACCELERATE_START = 8192  # accelerate's starting_batch_size: the user's guess, cut by 10% on each out-of-memory error
DOC = ROOT / "docs" / "comparison.md"
#: The section's first and last lines (the heading first, so other sections' writers stop at it).
SECTION = ("## Training batch search", "<!-- end of the training batch search: bench/compare/training_batch.py -->")


def prepare() -> None:
    if not PYTHON.exists():
        venv.create(VENV, with_pip=True)
    marker = VENV / "rpx-training-compare.json"
    if not marker.exists() or json.loads(marker.read_text()) != REQUIREMENTS:
        subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", *REQUIREMENTS, "-e", str(ROOT)], check=True)
        marker.write_text(json.dumps(REQUIREMENTS))


def mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


class Budget:
    """Checks a step's peak RSS against the budget, raising torch's CPU out-of-memory error when over."""

    def __init__(self, room: int, now: bool = True) -> None:
        from rpx_plugins.host_memory import HostPeakTracker

        self.tracker, self.room = HostPeakTracker(), room
        self.bytes: int | None = None
        if now:
            self.start()

    def start(self) -> None:
        """A step's region starts (the first one reads the usage the budget is taken from)."""
        from rpx_plugins.training.host_allocator import trim

        trim()
        self.tracker.reset()
        if self.bytes is None:
            self.bytes = self.tracker.read().start_bytes + self.room
            self.tracker.reset()

    def check(self) -> None:
        if self.tracker.read().peak_bytes > self.bytes:
            raise RuntimeError(OOM)


def plain_step(model, optimizer, batch: int):
    import torch
    import torch.nn.functional as F

    x, y = torch.randn(batch, WIDTH), torch.randint(0, CLASSES, (batch,))

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def settle() -> tuple:
    """The model and its optimiser, three steps at batch 1024 run (first-use allocations made)."""
    import torch

    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = plain_step(model, optimizer, 1024)
    for _ in range(3):
        step()
    return model, optimizer


def fits(model, optimizer, budget: Budget, batch: int) -> bool:
    """Two steps, then the third against the budget."""
    import gc

    gc.collect()
    step = plain_step(model, optimizer, batch)
    step()
    step()
    budget.start()
    step()
    try:
        budget.check()
    except RuntimeError:
        return False
    return True


def direct(room: int) -> dict:
    """Doubling from 1 until a step goes over the budget, then halving the gap to one sample."""
    model, optimizer = settle()
    budget = Budget(room)
    tried = []

    def ok(batch: int) -> bool:
        tried.append(batch)
        return fits(model, optimizer, budget, batch)

    low, high = 0, 1
    while ok(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if ok(middle) else (low, middle)
    return {"found": low, "trials": len(tried)}


def rpx(room: int) -> dict:
    from rpx_core.testing import make_context, run_stage
    from rpx_plugins.training.host_allocator import freed_memory_returned

    def context(budget: int):
        return make_context("compare.training_batch:mlp", inputs=[(8, WIDTH)], stages=["train_batch_search"],
                            options={"train_step": {"optimizer": "adamw"},
                                     "train_batch_search": {"memory_budget": budget, "trial_seconds": 0.05,
                                                            "max_batch": 2**20}})

    from rpx_plugins.training import torch_train

    with freed_memory_returned():
        held = settle()
        ctx = context(2 * 10**9)
        options = torch_train.train_options(ctx)
        torch_train.predicted_line(ctx, options, torch_train.policy_for("fp32", options), 10**7, 64)
        budget = Budget(room).bytes
    del held
    result = run_stage("train_batch_search", context(budget))
    return {"found": result.largest_batch, "trials": len(result.trials),
            "trials_to_largest": 1 + [t.batch_size for t in result.trials].index(result.largest_batch),
            "best": result.best_batch}


def lightning(room: int) -> dict:
    import pytorch_lightning as pl
    import torch
    import torch.nn.functional as F
    from pytorch_lightning.callbacks import BatchSizeFinder

    settle()
    budget = Budget(room, now=False)
    sizes: list[int] = []
    data = torch.utils.data.TensorDataset(torch.randn(2**16, WIDTH), torch.randint(0, CLASSES, (2**16,)))

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.batch_size = mlp(), 2

        def training_step(self, batch, index):
            x, y = batch
            if not sizes or sizes[-1] != len(x):
                sizes.append(len(x))
            return F.cross_entropy(self.net(x), y)

        def on_train_batch_start(self, batch, index) -> None:
            budget.start()

        def on_train_batch_end(self, outputs, batch, index) -> None:
            budget.check()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    module = Module()
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[BatchSizeFinder(mode="binsearch", init_val=2, max_trials=25, max_val=2**20)])
    try:
        trainer.fit(module)  # the finder, then one step at the size it chose
    except RuntimeError as exc:
        if OOM not in str(exc):
            raise
    return {"found": module.batch_size, "trials": len(sizes) - 1, "sizes": sizes}


def accelerate(room: int) -> dict:
    import torch
    from accelerate.utils import find_executable_batch_size

    model, optimizer = settle()
    budget = Budget(room)
    sizes: list[int] = []

    @find_executable_batch_size(starting_batch_size=ACCELERATE_START)
    def train(batch_size: int) -> int:
        sizes.append(batch_size)
        step = plain_step(model, optimizer, batch_size)
        step()
        step()
        budget.start()
        step()
        budget.check()
        return batch_size

    del torch
    return {"found": train(), "trials": len(sizes), "sizes": sizes}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("rpx", "torch", "pytorch-lightning", "accelerate")}


def inside(tool: str, room: int) -> None:
    from rpx_plugins.training.host_allocator import freed_memory_returned

    started = time.perf_counter()
    if tool == "rpx":
        found = rpx(room)
    else:
        with freed_memory_returned():
            found = {"direct": direct, "lightning": lightning, "accelerate": accelerate}[tool](room)
    print(json.dumps({"tool": tool, **found, "seconds": time.perf_counter() - started}))


def main(room_mb: int) -> list[dict]:
    prepare()
    rows = []
    for tool in TOOLS:
        done = subprocess.run([str(PYTHON), __file__, "--inside", tool, str(room_mb)], cwd=BENCH, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": f"{BENCH}{os.pathsep}{ROOT}"})
        if done.returncode:
            raise SystemExit(f"{tool}: {done.stderr.strip().splitlines()[-1]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    done = subprocess.run([str(PYTHON), __file__, "--versions"], capture_output=True, text=True, check=True)
    write_section(rows, json.loads(done.stdout), room_mb)
    return rows


def write_section(rows: list[dict], found_versions: dict[str, str], room_mb: int) -> None:
    """The section of docs/comparison.md, replacing the one there (or after the rest)."""
    by_tool = {row["tool"]: row for row in rows}
    truth = by_tool["direct"]["found"]

    def row(name: str, tool: str, how: str) -> str:
        found = by_tool[tool]
        off = f"{(found['found'] - truth) / truth:+.1%}"
        return f"| {name} | {how} | {found['trials']} | {found['found']} | {off} | {found['seconds']:.1f} |"

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    text = "\n".join([
        SECTION[0],
        "",
        f"Generated by `python3 bench/compare/training_batch.py {room_mb}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load} on {os.cpu_count()} logical CPUs "
        "(shared). Versions: " + ", ".join(f"{name} {v}" for name, v in found_versions.items()) + ".",
        "",
        f"The largest training batch under a memory budget: an MLP (64 -> 512 -> 10) trained with AdamW at fp32 on the "
        f"CPU, each tool in a process of its own with {room_mb} MB of room above what that process holds when its "
        "first trial starts; a step whose peak RSS goes over the budget raises torch's CPU out-of-memory error, which "
        "both other tools handle as on a GPU (rpx reads the same peak itself). A trial: one batch size tried with real "
        "steps (two, then a third checked; Lightning's finder runs 3 per size; rpx then times more for samples/s).",
        "",
        "| tool | how it searches | trials | largest batch | vs direct bisection | s |",
        "|---|---|---|---|---|---|",
        row("direct bisection", "direct", "doubling from 1, then halving the gap to one sample (the true limit)"),
        row("rpx train_batch_search", "rpx", "predicted step memory places the first trial, real steps correct it; "
            f"{by_tool['rpx']['trials_to_largest']} trials to the largest, the rest probe half and a quarter of it "
            "for samples/s"),
        row("Lightning BatchSizeFinder", "lightning", "binsearch: doubling from 2, then bisection, 25 trials at most, "
            "the result less its 5% margin; its own training loop holds more per step than the plain step"),
        row("accelerate find_executable_batch_size", "accelerate", f"from {ACCELERATE_START}, 10% smaller after each "
            "out-of-memory error (its result depends on the start)"),
        "",
        SECTION[1],
    ])
    current = DOC.read_text()
    if SECTION[0] in current:
        start, end = current.index(SECTION[0]), current.index(SECTION[1]) + len(SECTION[1])
        current = current[:start] + text + current[end:]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(current)
    print(text)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        inside(sys.argv[2], int(sys.argv[3]) * 10**6)
    elif sys.argv[1:2] == ["--versions"]:
        print(json.dumps(versions()))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
