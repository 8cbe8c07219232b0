"""The ray executor on a local Ray instance (CPU only): the same figures as the local executor, jobs streamed into
the results file with their node, and a killed Ray worker retried or recorded while the rest of the sweep completes."""

from __future__ import annotations

from pathlib import Path

import pytest

import rpx_core as rpx
from rpx_core.convert import converter
from rpx_core.errors import RpxError
from rpx_plugins.executors.ray import accelerator_type

ray = pytest.importorskip("ray")

MODELS = Path(__file__).with_name("sweep_models.py")
COUNTS = ("count_params", "count_flops", "estimate_traffic")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (the executor joins an initialised Ray instead of starting one)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def sweep_spec(models: str, executor: str, extra: str = "") -> str:
    return f"""
        name = "ray-sweep"
        backend = "cpu"  # named: a spec without one builds its first model here to infer it
        stages = ["count_params", "count_flops", "estimate_traffic", "system_card"]
        {models}
        [sweep]
        batch_size = [1, 2]
        {extra}
        [execution]
        executor = "{executor}"
    """


TWO_MODELS = f"""
        [[models]]
        name = "tokens"
        source = "{MODELS}:token_linear"
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
        [[models]]
        name = "transformer"
        source = "rpx_plugins.torch.zoo:tiny_transformer"
        inputs = [{{ shape = [1, 16], dtype = "int64", high = 1000 }}]
"""


def figures(run) -> dict:
    return {model.name: {stage: converter.unstructure(model.result(stage)) for stage in COUNTS}
            for model in run.models}


def test_ray_and_local_agree_on_every_hardware_agnostic_figure(local_ray, write_spec, tmp_path):
    local = rpx.run(write_spec(sweep_spec(TWO_MODELS, "local", "seq_len = [8, 16]"), "local.toml"),
                    output=tmp_path / "local-results.toml")
    on_ray = rpx.run(write_spec(sweep_spec(TWO_MODELS, "ray", "seq_len = [8, 16]"), "ray.toml"),
                     output=tmp_path / "ray-results.toml")
    assert len(on_ray.models) == 8 and on_ray.ok
    assert [model.name for model in on_ray.models] == [model.name for model in local.models]
    assert figures(on_ray) == figures(local)
    written = rpx.load_results(tmp_path / "ray-results.toml")
    assert all(model.node and model.finished for model in written.models)  # the node each job ran on
    assert all(model.node is None for model in local.models)
    assert all(model.result("system_card").host_processor_core_count for model in written.models)


def test_a_killed_ray_worker_is_retried_or_recorded_and_the_rest_completes(local_ray, write_spec, tmp_path):
    marker = tmp_path / "killed-once"
    models = f"""
        [[models]]
        name = "retried"
        source = "{MODELS}:dies_once"
        kwargs = {{ marker = "{marker}" }}
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
        [[models]]
        name = "lost"
        source = "{MODELS}:always_dies"
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
        [[models]]
        name = "fine"
        source = "{MODELS}:token_linear"
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
    """
    spec = write_spec(sweep_spec(models, "ray") + "executor_options = { retries = 1 }\n")
    run = rpx.run(spec, output=tmp_path / "out.toml")
    by_model: dict[str, list] = {}
    for model in run.models:
        by_model.setdefault(model.coordinates["model"], []).append(model)
    assert marker.exists()  # the first attempt was killed ...
    assert all(model.ok for model in by_model["retried"] + by_model["fine"])  # ... and the retry finished it
    for model in by_model["lost"]:  # killed on every try: recorded as failed, later stages skipped
        first, *later = [model.stages[name] for name in model.stages]
        assert first.status == "failed" and first.error.startswith("ray task failed 2 time(s) (")
        assert all(record.status == "skipped" for record in later)
        assert model.finished is not None
    assert run.provenance.finished is not None


def test_ray_asks_for_the_accelerator_type_of_the_targeted_gpu():
    assert accelerator_type("H100-SXM", {}) == "H100"
    assert accelerator_type("L4", {}) == "L4"
    assert accelerator_type("A100-SXM-80GB", {"A100-SXM-80GB": "A100-80G"}) == "A100-80G"


def test_ray_needs_worker_isolation(write_spec, tmp_path):
    spec = write_spec(sweep_spec(TWO_MODELS, "ray"))
    with pytest.raises(RpxError, match="the ray executor runs jobs on Ray workers"):
        rpx.run(spec, output=tmp_path / "out.toml", execution={"isolation": "in-process"})


def test_a_ray_sweep_runs_batch_search_through_the_ray_executor(local_ray, write_spec, tmp_path):
    """The run-scoped stage is a work item like the model jobs: every model it builds, it builds on a Ray worker."""
    log = tmp_path / "built.log"
    spec = write_spec(f"""
        name = "ray-batch"
        backend = "cpu"
        stages = ["count_params", "batch_search"]
        [[models]]
        name = "tokens"
        source = "{MODELS}:logs_where_built"
        kwargs = {{ log = "{log}" }}
        inputs = [{{ shape = [1, 8], dtype = "int64", high = 100 }}]
        [sweep]
        batch_size = [1, 2]
        [options.batch_search]
        max_batch = 4
        trial_seconds = 0.01
        gain_threshold = 0.0
        memory_budget = "1GB"
        safety_margin = 0
        [execution]
        executor = "ray"
    """)
    run = rpx.run(spec, output=tmp_path / "out.toml")
    assert run.ok and [model.name for model in run.models] == ["tokens[batch_size=1]", "tokens[batch_size=2]"]
    search = run.run_stages["batch_search"]
    assert search.status == "ok" and len(search.result.stages) == 2  # one pipeline stage per sweep point
    built = log.read_text().split()
    assert len(built) >= 4 and set(built) == {"ray"}, built  # 2 jobs, then batch_search's 2 models, all on Ray
