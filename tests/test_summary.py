"""The seed's flat summary fields: each derived from stage results by its documented definition, absent when unknown."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from rpx_core.registry.backends import MemoryPeak
from rpx_core.results.records import StageRecord
from rpx_core.results.summary import summarise
from rpx_plugins.stages import BUILTIN_STAGES

DECLARED = {stage.name: stage for stage in BUILTIN_STAGES}


def seed_fields(records):
    return summarise(records, DECLARED)


def ok(result: object) -> StageRecord:
    return StageRecord("ok", result=result)


PARAMS = NS(total=2_500_000)
FLOPS = NS(total_flops=8_000_000_000, matrix_flops=7_000_000_000, macs=3_500_000_000, counted_batch_size=1,
           counted_inputs=("float16[1,64]",), backward=False, uncounted_ops={}, by_operator={})
TRAFFIC = NS(unfused_bytes=400_000_000, fused_bytes=100_000_000, arithmetic_intensity_unfused=20.0,
             activation_peak_bytes_fp16=50_000_000)
BOUND = NS(bound_ms_fused=0.5, bottleneck_fused="memory")
ROOFLINE = NS(gpus={"H100-SXM": {"fp16": BOUND}}, local_gpu="H100-SXM")
LATENCY = NS(p50_ms=2.0, p90_ms=2.5, p95_ms=None, p99_ms=None, peak_memory=MemoryPeak("test", peak_bytes=3_000_000),
             throughput=(NS(batch_size=8, samples_per_s=1000.0),), measured_batch_size=1, precision="fp16",
             measured_inputs=("float16[1,64]",))


def test_tier1_fields_follow_their_definitions():
    fields = seed_fields({"count_params": ok(PARAMS), "count_flops": ok(FLOPS), "estimate_traffic": ok(TRAFFIC)})
    assert fields["params_m"] == 2.5
    assert fields["flops_g"] == 8.0 and fields["matrix_flops_g"] == 7.0 and fields["macs_g"] == 3.5
    assert fields["memory_traffic_gb"] == 0.4 and fields["fused_traffic_gb"] == 0.1
    assert fields["arithmetic_intensity"] == 20.0 and fields["actmem_gb_fp16"] == 0.05


def test_measured_latency_beside_the_bound_of_the_gpu_it_ran_on():
    fields = seed_fields({"count_flops": ok(FLOPS), "roofline": ok(ROOFLINE), "measure_latency": ok(LATENCY)})
    assert fields["roofline_h100_sxm_fp16_ms"] == 0.5 and fields["bottleneck_h100_sxm_fp16"] == "memory"
    assert fields["latency_p50_ms"] == fields["latency_ms_per_sample"] == 2.0 and fields["latency_p90_ms"] == 2.5
    assert "latency_p95_ms" not in fields and "latency_p99_ms" not in fields  # unclaimed: absent, not zero
    assert fields["peak_memory_mb"] == 3.0 and fields["throughput_b8_samples_per_s"] == 1000.0
    assert fields["measured_gpu"] == "H100-SXM" and fields["fraction_of_roofline"] == pytest.approx(0.5 / 2.0)


def test_no_comparison_when_the_bound_was_counted_at_another_batch_size():
    batch8 = NS(**{**vars(FLOPS), "counted_batch_size": 8, "counted_inputs": ("float16[8,64]",)})
    fields = seed_fields({"count_flops": ok(batch8), "roofline": ok(ROOFLINE), "measure_latency": ok(LATENCY)})
    assert "fraction_of_roofline" not in fields and fields["latency_p50_ms"] == 2.0
    assert fields["efficiency_problem"] == "the count is of inputs float16[8,64]; latency measured float16[1,64]"
    older = NS(**{**vars(LATENCY), "measured_inputs": ()})  # a file written before inputs were recorded
    fields = seed_fields({"count_flops": ok(batch8), "roofline": ok(ROOFLINE), "measure_latency": ok(older)})
    assert fields["efficiency_problem"] == "the count is at batch 8; latency measured batch 1"


def test_a_latency_at_a_larger_batch_has_no_per_sample_figure():
    batch8 = NS(**{**vars(LATENCY), "measured_batch_size": 8})
    fields = seed_fields({"measure_latency": ok(batch8)})
    assert fields["latency_batch_size"] == 8 and fields["latency_p50_ms"] == 2.0
    assert "latency_ms_per_sample" not in fields  # a call of 8 samples is not a per-sample latency
    unbatched = seed_fields({"measure_latency": ok(NS(**{**vars(LATENCY), "measured_batch_size": None}))})
    assert "latency_batch_size" not in unbatched and "latency_ms_per_sample" not in unbatched


def test_operators_without_a_formula_are_counted_with_their_share_of_calls():
    flops = NS(**{**vars(FLOPS), "uncounted_ops": {"aten.foo": 3, "aten.bar": 1},
                  "by_operator": {"aten.mm": NS(calls=4), "(others)": NS(calls=8)}})
    fields = seed_fields({"count_flops": ok(flops)})
    assert fields["uncounted_ops"] == 2 and fields["uncounted_call_share"] == 4 / (12 + 4)
    assert "uncounted_ops" not in seed_fields({"count_flops": ok(FLOPS)})  # none: no field, not a zero


def test_failed_and_absent_stages_contribute_nothing():
    fields = seed_fields({"count_params": StageRecord("failed", error="x"), "roofline": ok(NS(gpus={}, local_gpu=None))})
    assert fields == {}


def test_the_tier1_table_says_how_many_operators_went_uncounted():
    """Where the count is printed (console, show, report: the Tier 1 table), the operators without a formula and
    their share of the calls: a model with uncounted work is never printed as if its count were whole."""
    from pathlib import Path

    import attrs

    from rpx_core.api import load_results
    from rpx_plugins.stages.counts import tier1

    run = load_results(Path(__file__).parent / "data" / "run_a_results.toml")
    model = run.models[0]
    flops = model.result("count_flops")
    calls = sum(stats.calls for stats in flops.by_operator.values())
    partial = attrs.evolve(flops, uncounted_ops={"aten.mystery": calls // 3, "aten.other": calls - calls // 3})
    stages = {**model.stages, "count_flops": attrs.evolve(model.stages["count_flops"], result=partial)}
    table = tier1(attrs.evolve(run, models=(attrs.evolve(model, stages=stages), run.models[1])))
    column = [column.title for column in table.columns].index("uncounted calls")
    uncounted, whole = (row[column] for row in table.rows)
    assert uncounted.value == pytest.approx(0.5) and uncounted.text == "50% (2 ops)"  # as many calls as counted ones
    assert whole.value == 0.0 and whole.text == "none"
    assert any("NOT in the totals" in note for note in table.notes)
