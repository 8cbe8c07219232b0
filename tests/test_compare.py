"""``rpx compare``: ratios to the first file, verdicts beyond noise, and notes instead of ratios for results that
cannot be compared (here: the same models run at other input shapes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from rpx_core.api import load_results
from rpx_core.show.compare import compare as compare_with
from rpx_core.show.compare import figures, verdict
from tests.conftest import builtin_stages

STAGES = builtin_stages()


def compare(runs):
    return compare_with(runs, STAGES)

DATA = Path(__file__).parent / "data"
RUN_A, RUN_B = DATA / "run_a_results.toml", DATA / "run_b_other_shapes_results.toml"


@pytest.fixture(scope="module")
def run_a():
    return load_results(RUN_A)


def rows_of(table, model, figure):
    return next(row for row in table.rows if row[0].value == model and row[1].value == figure)


def test_a_file_against_itself_is_the_same_everywhere(run_a):
    table = compare([("a", run_a), ("a again", run_a)])
    assert {row[table.titles.index("B vs A")].value for row in table.rows} == {"same"}
    assert {row[table.titles.index("B/A")].value for row in table.rows} == {1.0}


def test_other_input_shapes_give_a_note_not_a_ratio(run_a):
    table = compare([("a", run_a), ("b", load_results(RUN_B))])
    ratio, verdict_ = table.titles.index("B/A"), table.titles.index("B vs A")
    # tiny-cnn ran at 64x64 in B: every shape-dependent figure is not comparable, with the shapes in the note
    flops = rows_of(table, "tiny-cnn", "FLOPs")
    assert flops[ratio].value is None and flops[ratio].text.startswith("n/c [")
    assert flops[verdict_].value == "not comparable"
    note = next(note for note in table.notes if note.startswith("[1]"))
    assert "input shapes differ" in note and "[1,3,32,32]" in note and "[1,3,64,64]" in note
    # its parameter count does not depend on the input: compared
    assert rows_of(table, "tiny-cnn", "params")[verdict_].value == "same"
    # tiny-transformer ran at the same shapes in both: its counted figures compare exactly
    assert rows_of(table, "tiny-transformer", "FLOPs")[ratio].value == 1.0


def test_precision_blocks_bytes_and_times_but_not_counts(run_a):
    other = attrs.evolve(run_a, models=tuple(attrs.evolve(model, precision="bf16") for model in run_a.models))
    table = compare([("fp32", run_a), ("bf16", other)])
    verdict_ = table.titles.index("B vs A")
    assert rows_of(table, "tiny-cnn", "FLOPs")[verdict_].value == "same"
    assert rows_of(table, "tiny-cnn", "fused bytes")[verdict_].value == "not comparable"
    assert any("precision differs (fp32 vs bf16)" in note for note in table.notes)


def test_schema_mismatch_blocks_everything(run_a):
    other = attrs.evolve(run_a, schema_version=run_a.schema_version + 1)
    table = compare([("a", run_a), ("b", other)])
    assert {row[table.titles.index("B vs A")].value for row in table.rows} == {"not comparable"}


def test_latency_verdict_uses_intervals_or_the_spread():
    from rpx_core.results.records import ModelResult, StageRecord

    def model(p50, spread, interval=None):
        latency = {"p50_ms": p50, "spread": spread, "p50_interval_ms": interval, "throughput": ()}  # a newer file's fields
        result = type("Latency", (), latency)()
        return ModelResult("m", "s", "cpu", "cpu", "fp32", "t", stages={"measure_latency": StageRecord("ok", result=result)})

    latency = next(f for f in figures([model(1.0, 0.1)], STAGES) if f.name == "latency p50")
    # 8% slower with a 10% spread: within noise; 20% slower: regressed; 20% faster: improved
    assert verdict(latency, model(1.0, 0.1), model(1.08, 0.1), 1.0, 1.08) == "within noise"
    assert verdict(latency, model(1.0, 0.1), model(1.2, 0.1), 1.0, 1.2) == "regressed"
    assert verdict(latency, model(1.0, 0.1), model(0.8, 0.1), 1.0, 0.8) == "improved"
    # disjoint confidence intervals are beyond noise even when the spread is wide; overlapping ones are not
    assert verdict(latency, model(1.0, 0.5, [0.98, 1.02]), model(1.1, 0.5, [1.05, 1.15]), 1.0, 1.1) == "regressed"
    assert verdict(latency, model(1.0, 0.01, [0.9, 1.1]), model(1.05, 0.01, [1.0, 1.1]), 1.0, 1.05) == "within noise"


def test_no_verdict_from_a_noisy_measurement_or_a_row_of_too_few_calls():
    """A 20% change is called only when both sides measured cleanly: a noisy side (or one without an interval) gets
    "not comparable: noisy" / "too few samples", and a throughput row of one call "too few calls" (a 1-call row was
    once called "improved 9.01x")."""
    from rpx_core.results.records import ModelResult, StageRecord
    from rpx_core.types.latency import ThroughputResult

    def model(p50, verdict, calls=100):
        row = ThroughputResult(1, calls=calls, seconds=calls * p50 / 1e3, samples_per_s=1e3 / p50)
        fields = {"p50_ms": p50, "spread": 0.01, "p50_interval_ms": [p50 * 0.99, p50 * 1.01], "verdict": verdict,
                  "throughput": (row,)}
        return ModelResult("m", "s", "cpu", "cpu", "fp32", "t",
                           stages={"measure_latency": StageRecord("ok", result=type("Latency", (), fields)())})

    found = {f.name: f for f in figures([model(1.0, "stable")], STAGES)}
    latency, throughput = found["latency p50"], found["throughput b1"]
    assert verdict(latency, model(1.0, "stable"), model(1.2, "stable"), 1.0, 1.2) == "regressed"
    assert verdict(latency, model(1.0, "stable"), model(1.2, "noisy"), 1.0, 1.2) == "not comparable: noisy"
    assert verdict(latency, model(1.0, "too_few_samples"), model(1.2, "stable"), 1.0, 1.2) == \
        "not comparable: too few samples"
    assert verdict(throughput, model(1.0, "stable"), model(0.8, "stable"), 1000.0, 1250.0) == "improved"
    assert verdict(throughput, model(1.0, "stable", calls=1), model(0.8, "stable"), 1000.0, 1250.0) == \
        "not comparable: too few calls (1)"


def test_cli_compare_prints_the_note():
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "compare", str(RUN_A), str(RUN_B)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "not comparable: input shapes differ" in done.stdout
    one = subprocess.run([sys.executable, "-m", "rpx_core.cli", "compare", str(RUN_A)], capture_output=True, text=True,
                         timeout=120)
    assert one.returncode == 2 and "at least two" in one.stderr
