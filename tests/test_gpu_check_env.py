"""The GPU check's environment handling, end to end, as on an offline GPU node: a virtual environment that has
torch and nothing else of rpx's (made here: a plain venv with torch==2.13.0 from the local wheel), a wheelhouse
built beforehand by scripts/gpu_wheelhouse.sh, and the check run offline (PIP_NO_INDEX=1, no pip configuration) with
that environment's Python. There is no GPU here, so the GPU steps say "no GPU" and the check exits with 3; the
environment itself is left as it was (rpx's dependencies went into the check's private folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = 3


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, **kwargs)


@pytest.mark.slow
def test_gpu_check_runs_offline_with_a_preinstalled_torch_and_reports_no_gpu(tmp_path):
    node = tmp_path / "node-venv"
    made = run([sys.executable, "-m", "venv", str(node)])
    assert made.returncode == 0, made.stderr
    python = node / "bin" / "python"
    torch_install = run([str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0"])
    if torch_install.returncode != 0:
        pytest.skip(f"torch==2.13.0 cannot be installed here: {torch_install.stderr.strip()[-300:]}")
    before = run([str(python), "-m", "pip", "freeze", "--all"]).stdout
    assert "pluggy" not in before and "pytest" not in before  # the premise: a node with torch only

    wheelhouse = tmp_path / "wheelhouse"  # on a networked machine, beforehand
    built = run(["bash", "scripts/gpu_wheelhouse.sh", str(wheelhouse)])
    assert built.returncode == 0, built.stderr
    assert not list(wheelhouse.glob("torch-*")) and list(wheelhouse.glob("pluggy-*.whl"))

    out = tmp_path / "check"
    offline = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    offline.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, RPX_GPU_PYTHON=str(python), RPX_GPU_CHECK_OUT=str(out))
    offline.pop("PYTHONPATH", None)
    check = run(["bash", "scripts/gpu_check.sh", str(wheelhouse), "--logic-tests", "tests/test_mps_backend.py"],
                env=offline, timeout=600)  # fmt: skip

    lines = check.stdout.splitlines()
    assert check.returncode == NO_GPU, check.stdout + check.stderr
    assert any(line.startswith("PASS environment:") and "pluggy" in line and "torch 2.13.0" in line for line in lines)
    assert any(line.startswith("SKIP gpu: no GPU") for line in lines)
    for step in ("tests needing the device (cuda)", "profile at fp32, tf32, fp16, bf16", "latency vs roofline",
                 "batch search", "direct scan"):  # fmt: skip
        assert any(line.startswith(f"SKIP {step}: no GPU") for line in lines), step
    assert any(line.startswith("PASS logic tests of the GPU modules:") for line in lines)  # pytest from the wheelhouse
    results = json.loads((out / "gpu-check.json").read_text())
    assert results["exit_code"] == NO_GPU and results["python"] == str(python)
    assert run([str(python), "-m", "pip", "freeze", "--all"]).stdout == before  # the node's environment is untouched
