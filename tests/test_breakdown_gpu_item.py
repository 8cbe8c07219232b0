"""scripts/gpu_items/breakdown.py, the GPU checks of measure_breakdown: its verdicts over the breakdowns of the
traces recorded on an H200, and the whole script on the CPU (tiny models; the GPU-only checks say SKIP)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from tests.h200_models import MEDIANS_MS
from tests.test_breakdown_h200 import LLAMA, result_of

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_item_breakdown", ROOT / "scripts" / "gpu_items" / "breakdown.py")
item = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(item)


def test_the_checks_pass_on_the_recorded_llama_prefill_and_fail_where_they_should(capsys) -> None:
    result = result_of(LLAMA)
    assert item.check_rows("llama", result, MEDIANS_MS[LLAMA], gpu=True)
    assert not item.check_rows("llama", result, MEDIANS_MS[LLAMA] * 0.8, gpu=True)  # rows 25% above the p50
    assert item.check_matmuls(result, gpu=True)
    slow = attrs.evolve(result, signatures=tuple(
        attrs.evolve(row, fraction=0.4) if row.module == "layers.*.mlp.down_proj" else row
        for row in result.signatures))
    assert not item.check_matmuls(slow, gpu=True)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["PASS", "FAIL", "PASS", "FAIL"]
    assert "layers.*.mlp.down_proj bfloat16[2048,11008], bfloat16[11008,4096]" in lines[2]


@pytest.mark.slow
def test_the_script_runs_on_the_cpu_with_tiny_models(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "scripts/gpu_items/breakdown.py", "--cpu", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for line in ("SKIP rows bert-base:", "SKIP rows llama-7b-4l-prefill:", "SKIP matmuls:",
                 "### Tier 3: where the call's time goes (top operators)", "| llama-7b-4l-prefill | aten.mm |"):
        assert line in out, out
    assert (tmp_path / "breakdown-bert-base.toml").is_file()
