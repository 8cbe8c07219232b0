"""scripts/gpu_items/training.py runs here as it will on the GPU, with tiny models on the CPU (its GPU lines SKIP)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_the_training_gpu_script_runs_its_cpu_version():
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "scripts/gpu_items/training.py", "--cpu"], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert sum(line.startswith("SKIP ") for line in lines) == 3
    assert sum(line.startswith("PASS ") and "(tiny, CPU)" in line for line in lines) == 3
