"""Roofline arithmetic against hand-computed values (peaks from the reference pack's datasheet figures)."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import NamedTuple

import pytest
import tomli_w
from hypothesis import given
from hypothesis import strategies as st

from rpx_core.convert import converter
from rpx_core.precision import UnknownPrecisionError
from rpx_core.registry.gpus import GPUCatalog, load_pack
from rpx_core.types.roofline import RooflineResult
from rpx_plugins.reference_gpus import reference_pack_path
from rpx_plugins.roofline.bounds import Workload, compute_roofline, roofline


class Record(NamedTuple):
    """Stands in for Tier 1's OpRecord: figures for ONE call, `count` identical calls."""

    op: str
    count: int
    flops: float
    bytes_read: float
    bytes_written: float


@pytest.fixture(scope="module")
def catalog() -> GPUCatalog:
    return GPUCatalog([load_pack(reference_pack_path(), provider="rpx 0.1.0")])


def workload(
    flops: float,
    bytes_fused: float,
    bytes_unfused: float | None = None,
    *,
    params: int = 0,
    activations: int = 0,
    records: Sequence[Record] | None = None,
) -> Workload:
    """A Workload whose unfused traffic defaults to the fused traffic."""
    unfused = bytes_fused if bytes_unfused is None else bytes_unfused
    return Workload(
        flops=flops,
        bytes_fused=bytes_fused,
        bytes_unfused=unfused,
        param_bytes=params,
        peak_activation_bytes=activations,
        records=records,
    )


def test_compute_bound_fp16_on_h100_uses_the_dense_tensor_peak(catalog: GPUCatalog) -> None:
    # 1e12 FLOP / 989.4e12 FLOP/s = 1.0107e-3 s = 1.0107 ms; 1e9 B / 3.35e12 B/s = 0.2985 ms -> compute-bound.
    bound = roofline(workload(1e12, 1e9), catalog.get("H100-SXM"), "fp16")
    assert bound.compute_ms == pytest.approx(1.0107, abs=1e-4)
    assert bound.memory_ms_fused == pytest.approx(0.2985, abs=1e-4)
    assert bound.bound_ms_fused == bound.compute_ms
    assert bound.bottleneck_fused == "compute"
    assert bound.latency_ms == bound.bound_ms_fused
    assert bound.peak_tflops == 989.4
    # machine balance: 989.4e12 / 3.35e12 = 295.34 FLOP per byte
    assert bound.machine_balance == pytest.approx(295.34, abs=0.01)


def test_memory_bound_7b_weights_at_fp16_on_a100(catalog: GPUCatalog) -> None:
    # One decode step of a 7B-parameter fp16 model: ~2 FLOP per weight, 14e9 weight bytes read once.
    # compute: 14e9 / 312e12 = 0.04487 ms; memory: 14e9 / 2039e9 = 6.8661 ms -> memory-bound at 6.8661 ms.
    bound = roofline(workload(14e9, 14e9), catalog.get("A100-SXM-80GB"), "fp16")
    assert bound.compute_ms == pytest.approx(0.04487, abs=1e-5)
    assert bound.memory_ms_fused == pytest.approx(6.8661, abs=1e-4)
    assert bound.bound_ms_fused == pytest.approx(6.8661, abs=1e-4)
    assert bound.bottleneck_fused == "memory"


def test_fused_and_unfused_traffic_give_two_bounds(catalog: GPUCatalog) -> None:
    # L4 fp16: compute 1e12 / 121e12 = 8.2645 ms; fused 1e9 / 300e9 = 3.3333 ms; unfused 5e9 / 300e9 = 16.6667 ms.
    bound = roofline(workload(1e12, 1e9, 5e9), catalog.get("L4"), "fp16")
    assert bound.bound_ms_fused == pytest.approx(8.2645, abs=1e-4)
    assert bound.bottleneck_fused == "compute"
    assert bound.bound_ms_unfused == pytest.approx(16.6667, abs=1e-4)
    assert bound.bottleneck_unfused == "memory"


def test_an_fp16_request_never_uses_the_fp32_peak(catalog: GPUCatalog) -> None:
    # RTX 4090: 1e12 FLOP at the fp16 tensor rate (165.2 TFLOP/s, FP32 accumulate) = 6.0533 ms; the seed's FP32
    # vector peak (82.6 TFLOP/s) would give 12.1065 ms.
    gpu = catalog.get("RTX-4090")
    bound = roofline(workload(1e12, 0), gpu, "fp16")
    assert bound.compute_ms == pytest.approx(6.0533, abs=1e-4)
    assert bound.peak_tflops == 165.2 != gpu.peaks["fp32"].tflops
    assert roofline(workload(1e12, 0), gpu, "fp32").compute_ms == pytest.approx(12.1065, abs=1e-4)


def test_a_gpu_without_the_precision_is_skipped_with_the_reason(catalog: GPUCatalog) -> None:
    gpus = [catalog.get("T4"), catalog.get("TPU-v5e")]
    result = compute_roofline(workload(1e12, 1e9), gpus, ["fp16", "bf16"])
    assert set(result.gpus) == {"T4", "TPU-v5e"}
    assert set(result.gpus["T4"]) == {"fp16"}  # T4 has no bf16 peak: not computed with fp16's or fp32's
    assert set(result.gpus["TPU-v5e"]) == {"bf16"}  # the TPU publishes bf16 only
    skipped = {(entry.gpu, entry.precision): entry.reason for entry in result.skipped}
    assert set(skipped) == {("T4", "bf16"), ("TPU-v5e", "fp16")}
    assert "no bf16 peak" in skipped["T4", "bf16"]
    # TPU v5e bf16: 1e12 / 197e12 = 5.0761 ms
    assert result.gpus["TPU-v5e"]["bf16"].compute_ms == pytest.approx(5.0761, abs=1e-4)


def test_a_gpu_with_no_requested_precision_has_no_entry(catalog: GPUCatalog) -> None:
    result = compute_roofline(workload(1e12, 1e9), [catalog.get("TPU-v5e")], ["fp32"])
    assert result.gpus == {}
    assert [(entry.gpu, entry.precision) for entry in result.skipped] == [("TPU-v5e", "fp32")]


def test_an_unknown_precision_is_an_error_not_a_skip(catalog: GPUCatalog) -> None:
    with pytest.raises(UnknownPrecisionError):
        compute_roofline(workload(1e12, 1e9), catalog.all(), ["fp16", "half"])


RECORDS = (
    Record("aten.mm", count=2, flops=2e9, bytes_read=4e6, bytes_written=2e6),
    Record("aten.relu", count=3, flops=1e6, bytes_read=8e6, bytes_written=8e6),
    Record("aten.view", count=5, flops=0, bytes_read=0, bytes_written=0),
)


def test_per_operator_bound_sums_count_times_the_slower_roof(catalog: GPUCatalog) -> None:
    # H100 SXM fp16, peak 989.4e12 FLOP/s, bandwidth 3.35e12 B/s:
    # mm:   max(2e9 / 989.4e12, 6e6 / 3.35e12) = max(2.0214e-6, 1.7910e-6) s -> compute; x2 = 4.0429e-6 s
    # relu: max(1e6 / 989.4e12, 16e6 / 3.35e12) = max(1.0107e-9, 4.7761e-6) s -> memory; x3 = 1.43284e-5 s
    # view: no FLOPs, no bytes -> 0 s
    # total 1.83712e-5 s = 0.0183712 ms; memory-bound share 1.43284e-5 / 1.83712e-5 = 0.77994
    bound = roofline(workload(4.003e9, 3e7, 6e7, records=RECORDS), catalog.get("H100-SXM"), "fp16")
    assert bound.per_operator_ms == pytest.approx(0.0183712, rel=1e-5)
    assert bound.memory_bound_share == pytest.approx(0.77994, abs=1e-5)
    relu, mm = bound.top_operators  # largest first; the zero-time view is left out
    assert (relu.op, relu.count, relu.bottleneck) == ("aten.relu", 3, "memory")
    assert relu.time_ms == pytest.approx(0.0143284, rel=1e-5)
    assert (mm.op, mm.count, mm.bottleneck) == ("aten.mm", 2, "compute")
    assert mm.time_ms == pytest.approx(0.0040429, rel=1e-4)
    assert relu.share + mm.share == pytest.approx(1)


def test_top_k_limits_the_listed_operators(catalog: GPUCatalog) -> None:
    bound = roofline(workload(0, 0, records=RECORDS), catalog.get("H100-SXM"), "fp16", top_k=1)
    assert [entry.op for entry in bound.top_operators] == ["aten.relu"]


def test_without_records_the_per_operator_fields_are_absent(catalog: GPUCatalog) -> None:
    bound = roofline(workload(1e12, 1e9), catalog.get("H100-SXM"), "fp16")
    assert bound.per_operator_ms is None and bound.memory_bound_share is None and bound.top_operators == ()


def test_no_memory_bound_share_when_no_operator_takes_time(catalog: GPUCatalog) -> None:
    bound = roofline(workload(0, 0, records=RECORDS[2:]), catalog.get("H100-SXM"), "fp16")
    assert bound.per_operator_ms == 0
    assert bound.memory_bound_share is None


def test_fits_compares_weights_plus_peak_activations_with_memory(catalog: GPUCatalog) -> None:
    # 14e9 weight bytes + 2.5e9 activation bytes = 16.5e9 B: fits 80e9 B (A100 80GB), not 16e9 B (T4 16GB).
    model = workload(14e9, 14e9, params=14_000_000_000, activations=2_500_000_000)
    a100 = roofline(model, catalog.get("A100-SXM-80GB"), "fp16")
    t4 = roofline(model, catalog.get("T4"), "fp16")
    assert a100.required_bytes == t4.required_bytes == 16_500_000_000
    assert (a100.capacity_bytes, a100.fits_in_memory) == (80_000_000_000, True)
    assert (t4.capacity_bytes, t4.fits_in_memory) == (16_000_000_000, False)


def test_estimated_peaks_are_flagged_with_their_note(catalog: GPUCatalog) -> None:
    bound = roofline(workload(1e12, 0), catalog.get("Apple-M2-Max-38c"), "fp32")
    assert bound.peak_is_estimate
    assert "Apple publishes no figure" in bound.peak_note
    assert not roofline(workload(1e12, 0), catalog.get("H100-SXM"), "fp16").peak_is_estimate
    assert bound.pack == "reference (rpx 0.1.0)" and bound.source


def test_negative_figures_are_refused() -> None:
    with pytest.raises(ValueError):
        workload(-1, 0)


@given(
    rows=st.lists(
        st.tuples(st.integers(1, 50), st.integers(0, 10**12), st.integers(0, 10**9), st.integers(0, 10**9)),
        min_size=1,
        max_size=20,
    ),
    fused_fraction=st.floats(0, 1),
)
def test_bounds_are_ordered_fused_unfused_per_operator(
    catalog: GPUCatalog, rows: list[tuple[int, int, int, int]], fused_fraction: float
) -> None:
    # max(sum) <= sum(max): with records that add up to the totals, bound (1) <= bound (2) <= bound (3).
    records = [Record("op", count, flops, read, written) for count, flops, read, written in rows]
    flops = sum(record.count * record.flops for record in records)
    unfused = sum(record.count * (record.bytes_read + record.bytes_written) for record in records)
    bound = roofline(workload(flops, unfused * fused_fraction, unfused, records=records), catalog.get("L40S"), "fp16")
    assert bound.bound_ms_fused <= bound.bound_ms_unfused * (1 + 1e-12)
    assert bound.bound_ms_unfused <= bound.per_operator_ms * (1 + 1e-12)


def test_results_survive_the_results_file_round_trip(catalog: GPUCatalog) -> None:
    result = compute_roofline(
        workload(4.003e9, 3e7, 6e7, records=RECORDS), [catalog.get("H100-SXM"), catalog.get("T4")], ["fp16", "bf16"]
    )
    text = tomli_w.dumps(converter.unstructure(result))
    assert converter.structure(tomllib.loads(text), RooflineResult) == result
