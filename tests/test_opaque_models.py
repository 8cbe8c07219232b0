"""Models rpx cannot look inside (any Python callable, e.g. a client of a served model): measured stages run, counted
stages are recorded as not applicable with the reason (never a zero, never a failure), and notes are kept."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch

import rpx_core as rpx
from rpx_core.api import run_spec
from rpx_core.spec.schema import spec_from_dict
from tests.conftest import rpx_cli

CLIENT = '''
import torch


class ServedModel:
    """Stands in for a client of a model served elsewhere: rpx sees a callable, nothing inside."""

    def __call__(self, x):
        return torch.tanh(x) * 2


def build_client():
    return ServedModel()
'''


def test_a_callable_is_measured_and_its_counts_are_not_applicable(tmp_path: Path) -> None:
    (tmp_path / "client.py").write_text(CLIENT)
    (tmp_path / "spec.toml").write_text('''
stages = ["count_params", "roofline", "measure_latency"]
gpus = ["H100-SXM"]

[options.measure_latency]
max_seconds = 1.0
warmup_seconds = 0.1

[[models]]
name = "served"
source = "client.py:build_client"
input_shape = [1, 16]
notes = "a client of a model behind an HTTP endpoint"
''')
    done = rpx_cli("run", "spec.toml", "-o", "out.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # not applicable is not a failure
    model = tomllib.loads((tmp_path / "out.toml").read_text())["models"][0]
    stages = model["stages"]
    reason = "is a rpx_user_"
    for counted in ("count_params", "count_flops"):
        assert stages[counted]["status"] == "not_applicable"
        assert reason in stages[counted]["error"] and "ServedModel, not a torch.nn.Module: rpx cannot look inside it" \
            in stages[counted]["error"]
        assert "result" not in stages[counted]
    assert stages["estimate_traffic"]["status"] == "not_applicable"
    assert stages["estimate_traffic"]["error"] == "needs count_flops, which does not apply to this model"
    assert stages["roofline"]["status"] == "not_applicable"
    assert stages["roofline"]["error"] == "needs count_params, count_flops, estimate_traffic, which do not apply to this model"
    assert stages["measure_latency"]["status"] == "ok"
    assert stages["measure_latency"]["result"]["p50_ms"] > 0
    assert model["notes"] == "a client of a model behind an HTTP endpoint"
    assert not any(key.startswith(("params", "flops", "macs")) for key in model["summary"])  # no zeros
    assert re.search(r"served\s+count_params\s+not applicable\s+model 'served' is a", done.stdout)  # problems table


def test_a_plain_function_through_the_python_api(tmp_path: Path) -> None:
    def served(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    result = rpx.profile(served, inputs=[(1, 8)], stages=["count_flops", "measure_latency"],
                         options={"measure_latency": {"max_seconds": 0.5, "warmup_seconds": 0.05}})
    assert result.stages["count_flops"].status == "not_applicable"
    assert "function, not a torch.nn.Module" in result.stages["count_flops"].error
    assert result.stages["measure_latency"].status == "ok" and result.ok


def test_a_module_is_still_counted_beside_a_callable(tmp_path: Path) -> None:
    (tmp_path / "client.py").write_text(CLIENT)
    spec = spec_from_dict({"stages": ["count_params"], "execution": {"isolation": "in-process"}, "models": [
        {"name": "served", "source": str(tmp_path / "client.py") + ":build_client", "input_shape": [1, 4]},
        {"name": "linear", "source": "torch.nn:Linear", "kwargs": {"in_features": 4, "out_features": 3},
         "input_shape": [1, 4]}]})
    run = run_spec(spec, output=None)
    assert run.model("linear").result("count_params").total == 4 * 3 + 3
    assert run.model("served").stages["count_params"].status == "not_applicable"
    assert run.ok
