"""GPU checks of the run path (one plan, every stage through the executor, an exit status that tells the truth).

1. batch_search, a run-scoped stage, is a work item the local executor runs like a model job: on CUDA its record is
   ok over both models of the spec, and the run exits 0.
2. SIGTERM while a CUDA worker is inside measure_latency ends rpx within the interrupt grace: exit 143, the stage
   recorded interrupted, and the results file names both jobs as unfinished (the second never started).

Run from the repository root: ``PYTHONPATH=. python3 scripts/gpu_items/run.py`` (about 60 s on an H200). Without
CUDA, or with ``--cpu``, the same checks run on the cpu backend. One PASS/FAIL/SKIP line per check, then the
figures; exit status 1 on a FAIL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HANGS = """
import pathlib, time
import torch


class Hangs(torch.nn.Module):
    '''Runs its layer on the device for ever once it is called on real tensors, saying so in ``flag``.'''

    def __init__(self, flag):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.flag = flag

    def forward(self, x):
        y = self.lin(x)
        if x.device.type == "meta":
            return y
        pathlib.Path(self.flag).write_text("hanging")
        while True:
            y = self.lin(y).tanh()
            if y.is_cuda:
                torch.cuda.synchronize()
            time.sleep(0.01)


def build(flag):
    return Hangs(flag)
"""

GRACE = 5.0


def rpx(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rpx_core.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})


def batch_search_on_the_executor(folder: Path, backend: str) -> tuple[bool, str]:
    spec = folder / "batch.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "gpu-run-batch"
        backend = "{backend}"
        stages = ["count_params", "batch_search"]
        output = "{folder}/batch-results.toml"
        [[models]]
        name = "cnn"
        source = "rpx_plugins.torch.zoo:tiny_cnn"
        inputs = [{{ shape = [1, 3, 32, 32] }}]
        [[models]]
        name = "transformer"
        source = "rpx_plugins.torch.zoo:tiny_transformer"
        kwargs = {{ vocab = 1000, max_seq = 128 }}
        inputs = [{{ shape = [1, 128], dtype = "int64", high = 1000 }}]
        [options.batch_search]
        max_batch = 16
        trial_seconds = 0.05
        memory_budget = "4GB"
    """))
    started = time.monotonic()
    process = rpx("run", str(spec), "--quiet", cwd=folder)
    out, err = process.communicate(timeout=300)
    from rpx_core import load_results

    if process.returncode != 0:
        return False, f"exit {process.returncode}: {err.strip()[-400:]}"
    record = load_results(folder / "batch-results.toml").run_stages["batch_search"]
    chosen = {stage.name: stage.chosen_batch for stage in record.result.stages} if record.status == "ok" else {}
    ok = record.status == "ok" and sorted(chosen) == ["cnn", "transformer"]
    return ok, (f"batch_search {record.status} in {record.seconds} s, chosen batch sizes {chosen}; run "
                f"{time.monotonic() - started:.1f} s")


def sigterm_ends_a_device_run(folder: Path, backend: str) -> tuple[bool, str]:
    (folder / "hangs.py").write_text(HANGS)
    flag = folder / "hanging.flag"
    spec = folder / "hang.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "gpu-run-hang"
        backend = "{backend}"
        stages = ["count_params", "measure_latency"]
        output = "{folder}/hang-results.toml"
        [execution]
        interrupt_grace = {GRACE}
        [[models]]
        name = "hangs"
        source = "hangs.py:build"
        kwargs = {{ flag = "{flag}" }}
        inputs = [{{ shape = [8, 64] }}]
        [[models]]
        name = "after"
        source = "rpx_plugins.torch.zoo:tiny_cnn"
        inputs = [{{ shape = [1, 3, 32, 32] }}]
    """))
    process = rpx("run", str(spec), "--quiet", cwd=folder)
    deadline = time.monotonic() + 240
    while not flag.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return False, f"the model never started hanging: {process.communicate()[1].strip()[-400:]}"
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    try:
        _, err = process.communicate(timeout=GRACE + 60)
    except subprocess.TimeoutExpired:
        process.kill()
        return False, "rpx still ran 60 s past the grace after SIGTERM"
    took = time.monotonic() - sent
    from rpx_core import load_results

    run = load_results(folder / "hang-results.toml")
    status = run.model("hangs").stages.get("measure_latency")
    ok = (process.returncode == 143 and took <= GRACE + 5 and status is not None and status.status == "interrupted"
          and run.unfinished == ("hangs", "after") and "2 job(s) did not finish: hangs, after" in err)
    return ok, (f"exit {process.returncode} {took:.1f} s after SIGTERM (grace {GRACE:g} s); measure_latency "
                f"{status.status if status else 'absent'}; unfinished {list(run.unfinished or ())}")


def main() -> int:
    import torch

    cuda = torch.cuda.is_available() and "--cpu" not in sys.argv
    backend = "cuda" if cuda else "cpu"
    print(f"run path checks on backend {backend!r}" + ("" if cuda else " (no CUDA, or --cpu: the CPU version)"))
    failed = False
    with tempfile.TemporaryDirectory(prefix="rpx-gpu-run-") as tmp:
        for name, check in (("batch_search through the executor", batch_search_on_the_executor),
                            ("SIGTERM ends a device run within the grace", sigterm_ends_a_device_run)):
            folder = Path(tmp) / check.__name__
            folder.mkdir()
            ok, figures = check(folder, backend)
            failed = failed or not ok
            print(f"{'PASS' if ok else 'FAIL'} {name} [{backend}]: {figures}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
