"""batch_search on the real cuda and mps backends, over the fake GPU of tests/fake_gpu.py: a caching allocator that
keeps what earlier trials freed and rounds blocks and segments as torch's does, library workspaces that grow with the
batch, a hard cap, out-of-memory errors at it, other processes on the device (seen through a fake NVML), and
streams with virtual clocks. Everything above torch's API (the backends, the trial runner, the planner) is rpx's own
code. Expected limits come from the fake's own bisection of real trials under the same conditions
(rpx_plugins.batch_search.direct_scan), and must agree within one resolution step."""

from __future__ import annotations

import types

import pytest

from rpx_core.execution.context import Job, RunContext, StageContext
from rpx_core.show import units
from rpx_core.spec.schema import ModelSpec
from rpx_core.types.batch_search import BatchSearchOptions, BatchSearchResult, format_table
from rpx_plugins.batch_search.direct_scan import direct_scan
from rpx_plugins.batch_search.stage import rpx_batch_search
from rpx_plugins.stages.batch_search import trials_table
from rpx_plugins.torch.cuda import CudaBackend
from rpx_plugins.torch.mps import DEFAULT_HIGH_WATERMARK_RATIO, MpsBackend
from tests.fake_gpu import (
    H200_CONTEXT,
    H200_IMAGE,
    H200_TOKENS,
    H200_TOTAL,
    MB,
    MIB,
    FakeGpu,
    SimulatedModel,
    h200_models,
)

BUDGET = 8 * 10**9
USABLE = int(BUDGET * 0.95)  # the default 5% safety margin


def stage(backend, name: str, model: SimulatedModel, device: str, fan_out: float = 1.0,
          inputs: str = "tests.fake_gpu:TOKENS") -> StageContext:
    spec = ModelSpec(name=name, source="tests.fake_gpu:SimulatedModel", input_factory=inputs, fan_out=fan_out)
    job = Job(spec, backend.name, device, "fp16", ("batch_search",), {}, (), (1,))
    return StageContext(job, backend, plugins=None, gpu_catalog=None, model_object=model)


def options(**chosen) -> BatchSearchOptions:
    defaults = dict(memory_budget=BUDGET, max_batch=1024, trial_seconds=0.005, gain_threshold=0.0)
    return BatchSearchOptions(**{**defaults, **chosen})


def search(backend, stages: list[StageContext], **chosen) -> BatchSearchResult:
    return rpx_batch_search(RunContext(stages, options(**chosen), backend, None, None))


def scan(backend, stages: list[StageContext], **chosen) -> list[int]:
    """Each stage's exact limit, by bisection of real trials run as the search runs them."""
    result = direct_scan(RunContext(stages, options(**chosen), backend, None, None))
    for summary in result.stages:
        assert summary.smallest_failing_batch in (summary.largest_fitting_batch + 1, None)  # bracketed exactly
    return [summary.largest_fitting_batch for summary in result.stages]


def within_one_step(found: list[int], exact: list[int], resolution: float = 0.02) -> bool:
    """Below the exact limit by less than one resolution step (and at most that fraction), or on it."""
    return all(limit / (1 + resolution) <= size <= limit for size, limit in zip(found, exact))


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    return FakeGpu("cuda", total_bytes=80 * 10**9, context_bytes=450 * MIB).install(monkeypatch, nvml=True)


# -- the GPU check's pipeline on a fake H200 ---------------------------------------------------------------------------

#: Readings of the GPU check's batch search on the H200 (../shared/gpu-runs/2026-12-04/gpu-batch-search*.toml), each
#: stage run alone from an empty cache, both models resident, under an 8 GB cap no trial reached: (batch, allocated
#: peak or None where the other stage set the trial's peak, reserved peak).
H200_READINGS = {
    "cnn-224": [(274, None, 5_704_253_440), (333, 5_216_674_304, 6_853_492_736)],
    "transformer-134m": [(271, None, 3_625_975_808), (538, 4_993_976_832, 6_866_075_648)],
}


@pytest.fixture
def h200(monkeypatch) -> FakeGpu:
    return FakeGpu("cuda", total_bytes=H200_TOTAL, context_bytes=H200_CONTEXT, name="NVIDIA H200").install(
        monkeypatch, nvml=True
    )


def h200_stages(gpu: FakeGpu, backend) -> list[StageContext]:
    cnn, transformer = h200_models(gpu)
    return [
        stage(backend, "cnn-224", cnn, "cuda:0", fan_out=4.0, inputs="tests.fake_gpu:H200_IMAGE"),
        stage(backend, "transformer-134m", transformer, "cuda:0", inputs="tests.fake_gpu:H200_TOKENS"),
    ]


def test_the_fake_h200_models_read_as_the_real_ones_did(h200):
    """The premise of the tests below: with both models resident and no cap reached, three calls from an empty cache
    peak where the H200's trials did (within 2%), reserved 30-40% above allocated (blocks cached between layers)."""
    models = dict(zip(H200_READINGS, h200_models(h200)))
    inputs = {"cnn-224": H200_IMAGE, "transformer-134m": H200_TOKENS}
    for model in models.values():
        model.to(device="cuda:0")
    for name, readings in H200_READINGS.items():
        for size, allocated, reserved in readings:
            h200.allocator.empty_cache()
            h200.allocator.reset_peaks()
            x = inputs[name](batch_size=size, device="cuda:0", dtype=None)
            for _ in range(3):
                models[name](x)
            del x
            assert h200.allocator.peak_reserved == pytest.approx(reserved, rel=0.02), (name, size)
            if allocated is not None:
                assert h200.allocator.peak_allocated == pytest.approx(allocated, rel=0.02), (name, size)


def test_the_gpu_checks_pipeline_agrees_with_a_direct_scan(h200):
    """specs/gpu_batch_search.toml on the fake H200 (8 GB budget, 5% margin, 2% resolution): each limit within one
    step of the bisection of real trials. On the real H200 batch search said (333, 538) where a scan found 383 and
    478: the cnn's limit came from reserved bytes the allocator would have given back (the cap sat at the whole
    budget, so blocks stayed cached), the transformer's scan counted another process's CUDA context."""
    backend = CudaBackend()
    exact = scan(backend, h200_stages(h200, backend))
    result = search(backend, h200_stages(h200, backend))

    found = [summary.largest_fitting_batch for summary in result.stages]
    assert within_one_step(found, exact), (found, exact, format_table(result))
    assert result.trial_count <= 12
    assert result.allocator_cap_bytes == USABLE - H200_CONTEXT  # the process's context counts against the budget
    assert result.start_bytes > H200_CONTEXT and result.others_at_start_bytes == 0 and not result.notes
    for trial in result.trials:
        if trial.ok:
            assert trial.used_bytes <= USABLE and trial.outside_allocator_bytes == H200_CONTEXT
            assert trial.peak_bytes <= trial.reserved_bytes < trial.used_bytes
    assert all(summary.stopped_by == "memory limit" for summary in result.stages)
    assert h200.allocator.cap_bytes == h200.allocator.total_bytes  # lifted afterwards


def test_another_process_on_the_device_changes_others_and_not_the_limit(h200):
    """Another process holding 2 GB (as one did beside the H200's ResNet-50 run) is recorded as others' use, and the
    limits are those of the search without it: the budget holds this job's footprint."""
    backend = CudaBackend()
    alone = search(backend, h200_stages(h200, backend))
    h200.hold(pid=4242, nbytes=2 * 10**9)
    shared = search(backend, h200_stages(h200, backend))

    limits = [[summary.largest_fitting_batch for summary in result.stages] for result in (alone, shared)]
    assert limits[0] == limits[1]
    assert shared.others_at_start_bytes == 2 * 10**9 and alone.others_at_start_bytes == 0
    assert {trial.others_bytes for trial in shared.trials if trial.used_bytes} == {2 * 10**9}
    assert {trial.others_bytes for trial in alone.trials if trial.used_bytes} == {0}
    assert shared.allocator_cap_bytes == alone.allocator_cap_bytes and not shared.notes
    assert "others MB" in format_table(shared)
    table = trials_table(types.SimpleNamespace(run_stages={"batch_search": types.SimpleNamespace(status="ok",
                                                                                                result=shared)}))
    assert [column.title for column in table.columns][-6:-2] == ["allocated", "reserved", "this process", "others"]
    assert set(table.column("others")) - {None} == {2 * 10**9}  # None: the trial out of memory has no reading
    assert any(f"others {units.size(2 * 10**9)}" in note for note in table.notes)


def test_without_nvml_others_are_unknown_and_said_to_be(monkeypatch):
    """No nvidia-ml-py: what is outside this process's allocator cannot be split, so all of it counts (the other
    process's 2 GB lower the limits) and the result says so, with the reason in memory_method."""
    gpu = FakeGpu("cuda", total_bytes=H200_TOTAL, context_bytes=H200_CONTEXT).install(monkeypatch, nvml=False)
    gpu.hold(pid=4242, nbytes=2 * 10**9)
    backend = CudaBackend()
    result = search(backend, h200_stages(gpu, backend))

    assert result.others_at_start_bytes is None and all(trial.others_bytes is None for trial in result.trials)
    assert result.allocator_cap_bytes == USABLE - H200_CONTEXT - 2 * 10**9
    for trial in result.ok_trials:  # the other process's 2 GB counted as this process's, within the budget
        assert trial.outside_allocator_bytes == H200_CONTEXT + 2 * 10**9 and trial.used_bytes <= USABLE
    assert any("could not be told apart" in note for note in result.notes)
    assert "nvidia-ml-py is not installed (pip install 'rpx[nvml]')" in result.memory_method


def test_nvml_not_listing_this_process_is_unknown_too(monkeypatch):
    """In a container with its own process ids NVML lists this process under the host's pid: unknown, not zero."""
    gpu = FakeGpu("cuda", context_bytes=450 * MIB, nvml_pid=1).install(monkeypatch, nvml=True)
    backend = CudaBackend()
    gpu.allocator.reset_peaks()
    peak = backend.read_peak_memory("cuda:0")
    assert peak.other_processes_bytes is None and peak.outside_allocator_bytes == 450 * MIB
    assert "NVML does not list this process" in peak.method


def test_a_budget_the_device_cannot_hold_is_a_note(h200):
    """Others hold all but 5 GB of the H200: an 8 GB budget cannot be had, and the result says why its limits are
    the device's."""
    h200.hold(pid=4242, nbytes=h200.allocator.free_device_bytes() - 5 * 10**9)
    backend = CudaBackend()
    result = search(backend, h200_stages(h200, backend)[1:])
    (note,) = result.notes
    assert "less than the usable budget of 7600 MB" in note and "other processes use" in note
    assert result.free_at_start_bytes < USABLE - result.start_bytes
    assert any(trial.failure == "oom" for trial in result.trials)


# -- the allocator's cache, cap and streams ----------------------------------------------------------------------------


def test_second_stage_measures_its_own_memory_not_the_first_stages_cache(gpu):
    """A detector at 13 MB/sample feeding an embedder at 10 MB/sample: the embedder's trials follow the detector's,
    whose freed activations stay cached. Measured from that cache, the embedder read 13 MB/sample and stopped where
    13 MB/sample would end (498 instead of 661)."""
    detector = SimulatedModel(gpu, 300 * MB, (6_500_000, 6_500_000))
    embedder = SimulatedModel(gpu, 200 * MB, (5 * MB, 5 * MB))
    backend = CudaBackend()

    def stages() -> list[StageContext]:
        return [stage(backend, "detector", detector, "cuda:0", fan_out=4.0), stage(backend, "embedder", embedder, "cuda:0")]

    exact = scan(backend, stages())
    assert exact == [509, 661]  # the premise: both limits well inside max_batch
    result = search(backend, stages())

    slopes = [summary.memory_fit.slope_bytes_per_sample for summary in result.stages]
    assert slopes == [pytest.approx(13 * MB, rel=0.01), pytest.approx(10 * MB, rel=0.01)]
    assert within_one_step([summary.largest_fitting_batch for summary in result.stages], exact)
    assert result.budget_enforced and gpu.allocator.cap_bytes == gpu.allocator.total_bytes  # lifted afterwards


def test_a_trial_that_fills_the_cap_leaves_nothing_cached_for_the_next(gpu):
    """With 2.24 GB resident and 10 MB/sample in blocks that small batches fit into 20 MiB segments, the first
    prediction overshoots to the cap: the allocator gives back its cache and fails there. Read from what it kept,
    every later and smaller trial was over budget too, and the search ended at batch 4."""
    model = SimulatedModel(gpu, 2240 * MB, (4 * MB, 6 * MB))
    backend = CudaBackend()
    exact = scan(backend, [stage(backend, "model", model, "cuda:0")])
    result = search(backend, [stage(backend, "model", model, "cuda:0")])

    assert within_one_step([result.stages[0].largest_fitting_batch], exact)
    assert result.chosen_batch_sizes == (result.stages[0].largest_fitting_batch,)
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
    backend = CudaBackend()
    exact = scan(backend, [stage(backend, "model", model, "cuda:0")], safety_margin=0)
    result = search(backend, [stage(backend, "model", model, "cuda:0")], safety_margin=0)
    failures = {trial.failure for trial in result.trials if not trial.ok}
    assert "oom" in failures and gpu.allocator.ooms > 0
    assert within_one_step([result.stages[0].largest_fitting_batch], exact)
    assert result.allocator_cap_bytes == BUDGET


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
    exact = scan(backend, [stage(backend, "model", model, "mps")], memory_budget="4GB", safety_margin=0)
    assert within_one_step([result.stages[0].largest_fitting_batch], exact)
    assert result.memory_method.startswith("max of torch.mps.current_allocated_memory")
    backend.set_memory_budget("mps", 10**9)
    with pytest.raises(RuntimeError) as caught:  # torch.OutOfMemoryError is a RuntimeError
        mps.buffer(2 * 10**9)
    assert backend.is_out_of_memory(caught.value) and "MPS backend out of memory" in str(caught.value)


def test_metal_buffer_limit_counts_as_out_of_memory(monkeypatch):
    mps = FakeGpu("mps", total_bytes=24 * 10**9, context_bytes=300 * MB, max_buffer_bytes=2 * 10**9).install(monkeypatch)
    model = SimulatedModel(mps, 100 * MB, (10 * MB,))
    backend = MpsBackend()
    result = search(backend, [stage(backend, "model", model, "mps")], memory_budget="16GB", resolution=0.0)
    failed = [trial for trial in result.trials if not trial.ok]
    assert failed and all("Invalid buffer size" in trial.stages[0].error for trial in failed)
    assert result.stages[0].largest_fitting_batch == 200  # 200 x 10 MB is the largest single buffer Metal allows

