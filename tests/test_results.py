"""Results files: TOML and JSON round-trips (property-based), None omitted, schema version checked."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpx_core.errors import RpxError
from rpx_core.results.records import ModelResult, PluginInfo, Provenance, RunResult, StageRecord
from rpx_core.results.serialise import ModelCache, dumps, load, loads, write

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
scalars = st.one_of(st.integers(-(2**62), 2**62), finite, st.text(max_size=20), st.booleans())
payloads = st.dictionaries(names, st.one_of(scalars, st.lists(st.integers(0, 10**12), max_size=4)), max_size=4)

records = st.builds(
    StageRecord,
    status=st.sampled_from(["ok", "failed", "skipped"]),
    seconds=st.one_of(st.none(), finite),
    error=st.one_of(st.none(), st.text(max_size=30)),
    traceback=st.one_of(st.none(), st.text(max_size=60)),
    provided_by=st.one_of(st.none(), names),
    result=st.one_of(st.none(), payloads),
)
models = st.builds(
    ModelResult,
    name=names,
    source=st.just("pkg.mod:fn"),
    backend=st.just("cpu"),
    device=st.just("cpu"),
    precision=st.sampled_from(["fp32", "bf16"]),
    started=st.just("2026-01-01T00:00:00+00:00"),
    finished=st.one_of(st.none(), st.just("2026-01-01T00:00:01+00:00")),
    stages=st.dictionaries(names, records, max_size=3),
    summary=st.dictionaries(names, st.one_of(finite, st.text(max_size=10)), max_size=3),
)
runs = st.builds(
    RunResult,
    provenance=st.builds(
        Provenance,
        rpx_version=st.just("0.1.0"),
        python=st.just("3.11"),
        created=st.just("2026-01-01T00:00:00+00:00"),
        spec_hash=st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
        spec=payloads,
        plugins=st.lists(st.builds(PluginInfo, name=names, distribution=names, version=st.just("1.0"),
                                   builtin=st.booleans(), status=st.just("loaded")), max_size=2).map(tuple),
    ),
    models=st.lists(models, max_size=3, unique_by=lambda m: m.name).map(tuple),
    unfinished=st.one_of(st.none(), st.lists(st.text(max_size=20), max_size=4).map(tuple)),  # any text: escaped
)


@settings(max_examples=60, deadline=None)
@given(runs, st.sampled_from(["toml", "json"]))
def test_round_trip(run, fmt):
    assert loads(dumps(run, fmt), fmt) == run


@settings(max_examples=60, deadline=None)
@given(runs, st.dictionaries(names, records, max_size=2), st.sampled_from(["toml", "json"]), st.data())
def test_a_model_cache_writes_the_same_text_as_serialising_everything(run, run_stages, fmt, data):
    """The cache only saves work: the same bytes, also after some models changed (new objects, with new and kept
    stage records) and others not."""
    run = attrs.evolve(run, run_stages=run_stages)
    cache = ModelCache()
    assert dumps(run, fmt, cache) == dumps(run, fmt)
    def redrawn(model: ModelResult) -> ModelResult:  # some records replaced, some kept, some added
        stages = {name: attrs.evolve(record, seconds=(record.seconds or 0.0) + 1.0) if data.draw(st.booleans())
                  else record for name, record in model.stages.items()}
        stages.update(data.draw(st.dictionaries(names, records, max_size=2)))
        return attrs.evolve(model, finished=None if model.finished else "later", stages=stages)

    changed = tuple(redrawn(model) if data.draw(st.booleans()) else model for model in run.models)
    later = attrs.evolve(run, models=changed)
    assert dumps(later, fmt, cache) == dumps(later, fmt)


def test_none_is_omitted_and_files_round_trip(tmp_path):
    run = RunResult(Provenance("0.1.0", "3.11", "now", "0" * 16, {}), models=(
        ModelResult("m", "a:b", "cpu", "cpu", "fp32", "now", stages={"x": StageRecord("ok", result={"v": 1})}),))
    text = dumps(run, "toml")
    assert "finished" not in text and "error" not in text
    for suffix in ("toml", "json"):
        path = write(run, tmp_path / f"r.{suffix}")
        assert load(path) == run
    assert json.loads((tmp_path / "r.json").read_text())["schema_version"] == 1


def test_unknown_schema_version_is_refused():
    with pytest.raises(RpxError, match="schema_version 99 is not supported"):
        loads("schema_version = 99\n")


def test_real_stage_results_round_trip_through_toml_and_json(tmp_path):
    """Every built-in result type (Tier 1, roofline, latency, system card) survives dump -> load unchanged."""
    from rpx_core.api import load_results, run_spec
    from rpx_core.spec.schema import spec_from_dict

    spec = spec_from_dict({
        "stages": ["count_params", "roofline", "measure_latency"],
        "gpus": ["H100-SXM", "L4"],
        "batch_sizes": [1, 2],
        "options": {"measure_latency": {"min_samples": 70, "max_seconds": 0.5, "warmup_calls": 2,
                                        "warmup_seconds": 0.0, "keep_samples": True}},
        "models": [{"name": "cnn", "source": "rpx_plugins.torch.zoo:tiny_cnn", "inputs": [{"shape": [1, 3, 32, 32]}]}],
    })
    run = run_spec(spec, output=tmp_path / "r.toml")
    assert run.ok, {name: record.error for name, record in run.model("cnn").stages.items()}
    assert load_results(tmp_path / "r.toml") == run  # each result reloads as the type its stage declares
    assert load_results(write(run, tmp_path / "r.json")) == run
    assert isinstance(load(tmp_path / "r.toml").model("cnn").result("count_params"), dict)  # no declarations: data
    # the flat summary is derived from these real result types by its documented definitions
    cnn = run.model("cnn")
    flops, traffic = cnn.result("count_flops"), cnn.result("estimate_traffic")
    summary = cnn.summary
    assert summary["params_m"] == cnn.result("count_params").total / 1e6
    assert summary["flops_g"] == flops.total_flops / 1e9 and summary["macs_g"] == flops.macs / 1e9
    assert summary["memory_traffic_gb"] == traffic.unfused_bytes / 1e9
    assert summary["arithmetic_intensity"] == pytest.approx(flops.total_flops / traffic.unfused_bytes)
    assert summary["roofline_l4_fp32_ms"] == cnn.result("roofline").gpus["L4"]["fp32"].bound_ms_fused
    assert summary["latency_p50_ms"] == cnn.result("measure_latency").p50_ms
