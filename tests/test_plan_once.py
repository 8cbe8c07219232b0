"""One plan per run: ``rpx run`` (and its --dry-run) and the Python API plan a spec exactly once, with every check of
``rpx validate``; and a sweep larger than its ``max_jobs`` is refused before a single job of it is made."""

from __future__ import annotations

from pathlib import Path

import pytest

import rpx_core as rpx
import rpx_core.spec.plan as planner
import rpx_core.spec.sweep as sweep
from rpx_core.cli import main
from rpx_core.errors import SpecError
from rpx_core.registry.manager import Plugins
from rpx_core.spec.checks import validate
from tests.conftest import rpx_cli

MODELS = Path(__file__).with_name("sweep_models.py")

SPEC = f"""
    name = "once"
    stages = ["count_params"]
    [[models]]
    name = "tokens"
    source = "{MODELS}:token_linear"
    inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
    [sweep]
    batch_size = [1, 2]
"""


@pytest.fixture
def plans(monkeypatch) -> list[str]:
    """Every call of the planner, by the spec's file, from now on."""
    calls: list[str] = []
    real = planner.plan_with_problems

    def counted(spec, plugins, *, where="<spec>", stages=None):
        calls.append(where)
        return real(spec, plugins, where=where, stages=stages)

    monkeypatch.setattr(planner, "plan_with_problems", counted)
    return calls


def test_the_python_api_plans_a_run_once(plans, write_spec, tmp_path):
    run = rpx.run(write_spec(SPEC), output=tmp_path / "out.toml")
    assert run.ok and len(run.models) == 2
    assert len(plans) == 1


def test_rpx_run_plans_once_with_the_backend_inferred_in_a_worker(plans, write_spec, tmp_path, capsys):
    spec = write_spec(SPEC)  # no backend: the first model is built in a worker to infer it, then the spec planned
    assert main(["run", str(spec), "-o", str(tmp_path / "out.toml"), "--quiet"]) == 0
    assert plans == [str(spec)]
    assert main(["run", str(spec), "--dry-run"]) == 0
    assert plans == [str(spec)] * 2
    assert "2 job(s) on executor 'local'" in capsys.readouterr().out


def test_a_sweep_over_its_limit_is_refused_without_expanding_it(write_spec, monkeypatch):
    """10^6 points: one line naming the count and the key that raises the limit, and not one point made."""

    def never(*args, **kwargs):
        raise AssertionError("a sweep over its limit was expanded")

    monkeypatch.setattr(planner, "expand", never)
    monkeypatch.setattr(sweep, "expand", never)
    spec = write_spec(SPEC.replace("batch_size = [1, 2]", f"batch_size = {list(range(1, 1001))}\n"
                                   f"    seq_len = {list(range(1, 1001))}"))
    with pytest.raises(SpecError) as refused:
        validate(spec, Plugins.load())
    assert str(refused.value) == (f"{spec}: sweep: 1,000,000 jobs (1 model(s) x 1000 batch_size x 1000 seq_len) is "
                                  "more than sweep.max_jobs (10,000); set [sweep] max_jobs = 1000000 to run them all")


def test_a_sweep_runs_up_to_the_limit_it_raises_and_a_limit_must_be_a_count(write_spec):
    spec = write_spec(SPEC.replace("batch_size = [1, 2]", "batch_size = [1, 2, 3]\n    max_jobs = 2"))
    done = rpx_cli("validate", str(spec))
    assert done.returncode == 2 and "sweep: 3 jobs (1 model(s) x 3 batch_size) is more than sweep.max_jobs (2)" \
        in done.stderr, done.stderr
    spec.write_text(spec.read_text().replace("max_jobs = 2", "max_jobs = 3"))
    assert len(validate(spec, Plugins.load()).jobs) == 3
    spec.write_text(spec.read_text().replace("max_jobs = 3", "max_jobs = 0"))
    done = rpx_cli("validate", str(spec))
    assert done.returncode == 2 and "sweep.max_jobs: must be >= 1, got 0" in done.stderr, done.stderr
