"""batch_search on the real cuda and mps backends, over the fake GPU of tests/fake_gpu.py: a caching allocator that
keeps what earlier trials freed, a hard cap, out-of-memory errors at it, and streams with virtual clocks. Everything
above torch's API (the backends, the trial runner, the planner) is rpx's own code. Expected limits come from a
direct scan against the same fake allocator, each size measured from an empty cache."""

from __future__ import annotations

import pytest

from rpx_core.execution.context import Job, RunContext, StageContext
from rpx_core.spec.schema import ModelSpec
from rpx_core.types.batch_search import BatchSearchOptions, BatchSearchResult
from rpx_plugins.batch_search.stage import rpx_batch_search
from rpx_plugins.torch.cuda import CudaBackend
from rpx_plugins.torch.mps import DEFAULT_HIGH_WATERMARK_RATIO, MpsBackend
from tests.fake_gpu import MB, MIB, TOKENS, FakeGpu, SimulatedModel

BUDGET = 8 * 10**9
USABLE = int(BUDGET * 0.95)  # the default 5% safety margin


def stage(backend, name: str, model: SimulatedModel, device: str, fan_out: float = 1.0) -> StageContext:
    spec = ModelSpec(name=name, source="tests.fake_gpu:SimulatedModel", input_factory="tests.fake_gpu:TOKENS",
                     fan_out=fan_out)  # fmt: skip
    job = Job(spec, backend.name, device, "fp16", ("batch_search",), {}, (), (1,))
    return StageContext(job, backend, plugins=None, gpu_catalog=None, model_object=model)


def search(backend, stages: list[StageContext], **options) -> BatchSearchResult:
    defaults = dict(memory_budget=BUDGET, max_batch=1024, trial_seconds=0.005, gain_threshold=0.0, resolution=0.0)
    return rpx_batch_search(RunContext(stages, BatchSearchOptions(**{**defaults, **options}), backend, None, None))


def scan_limit(gpu: FakeGpu, models: list[SimulatedModel], stage: int, usable: int, sizes: range) -> int:
    """The largest size at which ``models[stage]`` runs within ``usable`` with every model resident, each size from
    an empty cache: reserved peak plus the memory outside the allocator, read from the fake directly."""
    placed = [model.to(device="cuda:0") for model in models]
    best = 0
    for size in sizes:
        gpu.allocator.empty_cache()
        gpu.allocator.reset_peaks()
        placed[stage](TOKENS(batch_size=size, device="cuda:0", dtype=None))
        if gpu.allocator.peak_reserved + gpu.allocator.context_bytes <= usable:
            best = size
    for model in placed:
        model.weights = None
    gpu.allocator.empty_cache()
    return best


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    return FakeGpu("cuda", total_bytes=80 * 10**9, context_bytes=450 * MIB).install(monkeypatch)


def test_second_stage_measures_its_own_memory_not_the_first_stages_cache(gpu):
    """A detector at 13 MB/sample feeding an embedder at 10 MB/sample: the embedder's trials follow the detector's,
    whose freed activations stay cached. Measured from that cache, the embedder read 13 MB/sample and stopped where
    13 MB/sample would end (498 instead of 661; the issue's own simulation had 511 and 665). The search runs with
    the default 5% resolution, as the GPU check's spec does."""
    detector = SimulatedModel(gpu, 300 * MB, (6_500_000, 6_500_000))
    embedder = SimulatedModel(gpu, 200 * MB, (5 * MB, 5 * MB))
    expected = [scan_limit(gpu, [detector, embedder], s, USABLE, range(400, 700)) for s in (0, 1)]
    assert expected == [509, 661]  # the premise: both limits well inside max_batch

    backend = CudaBackend()
    stages = [stage(backend, "detector", detector, "cuda:0", fan_out=4.0), stage(backend, "embedder", embedder, "cuda:0")]
    result = search(backend, stages, resolution=0.05)

    slopes = [summary.memory_fit.slope_bytes_per_sample for summary in result.stages]
    assert slopes == [pytest.approx(13 * MB, rel=0.01), pytest.approx(10 * MB, rel=0.01)]
    assert [summary.largest_fitting_batch for summary in result.stages] == expected
    assert result.budget_enforced and gpu.allocator.cap_bytes == gpu.allocator.total_bytes  # lifted afterwards


def test_a_trial_between_the_usable_budget_and_the_cap_does_not_fail_every_later_trial(gpu):
    """With 2.24 GB resident and 10 MB/sample in blocks that small batches fit into 20 MiB segments, the first
    prediction overshoots into the gap between the usable budget and the enforced cap: no out-of-memory error, so the
    allocator keeps that trial's memory cached. Read from that cache, every later and smaller trial was over budget
    too, and the search ended at batch 4."""
    model = SimulatedModel(gpu, 2240 * MB, (4 * MB, 6 * MB))
    expected = scan_limit(gpu, [model], 0, USABLE, range(450, 520))
    assert expected == 488

    backend = CudaBackend()
    result = search(backend, [stage(backend, "model", model, "cuda:0")])

    assert result.stages[0].largest_fitting_batch == expected == result.chosen_batch_sizes[0]
    for trial in result.trials:  # each reading is that size's own, as the direct scan measures it
        if trial.used_bytes is not None and trial.ok:
            assert trial.used_bytes <= USABLE


def test_budget_on_a_device_without_an_index(gpu):
    model = SimulatedModel(gpu, 100 * MB, (4 * MB, 6 * MB))
    backend = CudaBackend()
    result = search(backend, [stage(backend, "model", model, "cuda")], max_batch=64)
    assert result.feasible and result.budget_enforced and result.chosen_batch_sizes == (64,)


def test_out_of_memory_at_the_cap_is_survived(monkeypatch):
    """No memory outside the allocator and no safety margin: a trial can only fail by meeting the 8 GB cap, as a real
    out-of-memory error, which the search records and recovers from."""
    gpu = FakeGpu("cuda", total_bytes=80 * 10**9, context_bytes=0).install(monkeypatch)
    model = SimulatedModel(gpu, 500 * MB, (1 * MB, 30 * MB))
    expected = scan_limit(gpu, [model], 0, BUDGET, range(200, 300))
    backend = CudaBackend()
    result = search(backend, [stage(backend, "model", model, "cuda:0")], safety_margin=0)
    failures = {trial.failure for trial in result.trials if not trial.ok}
    assert "oom" in failures and gpu.allocator.ooms > 0
    assert result.stages[0].largest_fitting_batch == expected


def test_concurrent_stages_run_on_streams_of_their_own(gpu):
    """Each stage thread launches on its own stream and waits for nothing else, so each stage's time is its own
    kernels' modelled time; on the shared default stream each stage's events would also span the other's kernels."""
    first = SimulatedModel(gpu, 100 * MB, (1 * MB,), seconds_per_call=2e-3, seconds_per_sample=1e-4)
    second = SimulatedModel(gpu, 100 * MB, (1 * MB,), seconds_per_call=5e-3, seconds_per_sample=3e-4)
    backend = CudaBackend()
    stages = [stage(backend, "a", first, "cuda:0"), stage(backend, "b", second, "cuda:0")]
    result = search(backend, stages, concurrent=True, max_batch=8, trial_seconds=0.02)

    streams = gpu.kernel_streams("rpx-batch-")  # one new stream per stage thread per trial
    assert set(streams) == {"rpx-batch-0", "rpx-batch-1"} and "default" not in set.union(*streams.values())
    assert streams["rpx-batch-0"].isdisjoint(streams["rpx-batch-1"])
    assert gpu.device_syncs("rpx-batch-") == 0
    for trial in result.ok_trials:
        for run, model in zip(trial.stages, (first, second)):
            modelled = model.seconds_per_call + model.seconds_per_sample * run.batch_size
            assert run.seconds / run.calls == pytest.approx(modelled)


# -- MPS ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def mps(monkeypatch) -> FakeGpu:
    return FakeGpu("mps", total_bytes=24 * 10**9, context_bytes=300 * MB, name="Apple M2 Max").install(monkeypatch)


def test_batch_search_on_mps_runs_first_and_enforces_the_budget(mps):
    """No reading exists before a region on MPS; batch search used to refuse to start. The budget becomes MPS's own
    cap (set_per_process_memory_fraction), whose out-of-memory error the search survives."""
    model = SimulatedModel(mps, 500 * MB, (1 * MB, 30 * MB))
    backend = MpsBackend()
    result = search(backend, [stage(backend, "model", model, "mps")], memory_budget="4GB", safety_margin=0)
    assert result.feasible and result.budget_enforced
    assert mps.fractions == [4 * 10**9 / mps.allocator.total_bytes, DEFAULT_HIGH_WATERMARK_RATIO]  # set, then lifted
    chosen = result.trials[result.chosen_trial]
    assert chosen.reserved_bytes <= 4 * 10**9  # driver memory, the framework's 300 MB included
    assert result.stages[0].largest_fitting_batch == scan_limit(mps, [model], 0, 4 * 10**9, range(100, 130))
    assert result.memory_method.startswith("max of torch.mps.current_allocated_memory")
    backend.set_memory_budget("mps", 10**9)
    with pytest.raises(RuntimeError) as caught:  # torch.OutOfMemoryError is a RuntimeError
        mps.buffer(2 * 10**9)
    assert backend.is_out_of_memory(caught.value) and "MPS backend out of memory" in str(caught.value)


def test_metal_buffer_limit_counts_as_out_of_memory(monkeypatch):
    mps = FakeGpu("mps", total_bytes=24 * 10**9, context_bytes=300 * MB, max_buffer_bytes=2 * 10**9).install(monkeypatch)
    model = SimulatedModel(mps, 100 * MB, (10 * MB,))
    backend = MpsBackend()
    result = search(backend, [stage(backend, "model", model, "mps")], memory_budget="16GB")
    failed = [trial for trial in result.trials if not trial.ok]
    assert failed and all("Invalid buffer size" in trial.stages[0].error for trial in failed)
    assert result.stages[0].largest_fitting_batch == 200  # 200 x 10 MB is the largest single buffer Metal allows

