"""GPU item: batch search against a direct scan of real runs under the same conditions (issue 25).

    PYTHONPATH=. python3 scripts/gpu_items/batch.py [--cpu] [--out DIR]

On a CUDA GPU: specs/gpu_batch_search.toml (a CNN at 224 x 224 feeding a 134M-parameter transformer, fp16, a hard
8 GB budget) searched as ``rpx run`` searches it, in a worker process; then each stage's limit found by a plain
bisection of real trials in a fresh process of its own, with every model resident, the allocator capped as the
search caps it and each trial from an empty cache (the batch-search part of scripts/gpu_check.py, which this calls).
The limits must agree within one resolution step and at most 2%. About a minute on an H200 (its search took 12 s,
the scan bisects about 10 trials of two stages). Without CUDA (or with ``--cpu``) the same comparison runs on a
miniature spec on the CPU (a small CNN whose limit is max_batch), to prove the path, and the GPU lines say SKIP.

Prints one ``PASS``/``FAIL``/``SKIP`` line per check with its figures (this process's footprint and others' use of
the device at the start, the notes, each stage's limit by search and by scan, the trials); exit status 1 when a check
failed. Results go to ``--out`` (default rpx-gpu-items/batch/): the rpx results file, direct-scan.json and
gpu-check.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The CPU miniature: 16-channel CNN at 32 x 32 under a 4 GB budget, which never binds (the limit is max_batch).
CPU_SPEC = """
name = "gpu-item-batch-cpu"
backend = "cpu"
precision = "fp32"
stages = ["batch_search"]

[options.batch_search]
memory_budget = "4GB"
max_batch = 32
trial_seconds = 0.05
gain_threshold = 0.0

[[models]]
name = "cnn-32"
source = "rpx_plugins.torch.zoo:tiny_cnn"
inputs = [{ shape = [1, 3, 32, 32], dtype = "float32" }]
"""


def gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run the CPU miniature even where CUDA is available")
    parser.add_argument("--out", type=Path, default=Path("rpx-gpu-items") / "batch", help="folder for the results")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    check = gpu_check_module()
    cuda = torch.cuda.is_available() and not args.cpu
    args.out.mkdir(parents=True, exist_ok=True)
    report = check.Report(args.out)
    started = time.perf_counter()
    print(f"batch item: torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0) if cuda else 'cpu (miniature)'}", flush=True)  # fmt: skip
    if cuda:
        check.batch_search_lines(report, args.out, "cuda")
    else:
        for name in ("batch search on the GPU", "direct scan on the GPU"):
            report.line("SKIP", name, "no CUDA device" if not args.cpu else "--cpu")
        spec = args.out / "gpu-item-batch-cpu.toml"
        spec.write_text(CPU_SPEC)
        check.BATCH_SEARCH_SPEC = spec
        check.batch_search_lines(report, args.out, "cpu")
    failed = any(line["status"] == "FAIL" for line in report.checks)
    report.write(1 if failed else 0, device="cuda" if cuda else "cpu", seconds=round(time.perf_counter() - started, 1))
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
