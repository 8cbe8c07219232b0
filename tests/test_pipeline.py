"""Stage dependency resolution and failure propagation through the real engine, with a throwaway plugin."""

from __future__ import annotations

import types

import pytest

from rpx_core import hookimpl
from rpx_core.api import run_spec
from rpx_core.errors import RpxError, SpecError
from rpx_core.registry.manager import Plugins
from rpx_core.registry.stages import Stage, resolve_order
from rpx_core.results.serialise import load
from rpx_core.spec.schema import spec_from_dict

CALLS: list[tuple[str, str]] = []


def stage(name: str, needs: tuple[str, ...] = (), fail_for: str | None = None) -> tuple[Stage, object]:
    """A stage declaration and its implementation, which records its calls and fails for one model."""

    def run(ctx):
        CALLS.append((ctx.job.model.name, name))
        if ctx.job.model.name == fail_for:
            raise ValueError(f"{name} broke on purpose")
        return {"stage": name, "inputs_seen": sorted(ctx.results)}

    return Stage(name, f"test stage {name}", needs=needs), run


def throwaway(*stages: tuple[Stage, object]) -> types.SimpleNamespace:
    """A plugin declaring ``stages`` and implementing each stage's hook."""
    return types.SimpleNamespace(rpx_register_stages=hookimpl(lambda: [declared for declared, _ in stages]),
                                 **{declared.hook: hookimpl(run) for declared, run in stages})


@pytest.fixture
def plugins():
    plugin = throwaway(stage("a"), stage("b", needs=("a",), fail_for="second"), stage("c", needs=("b",)), stage("d"))
    loaded = Plugins.load()
    loaded.register(plugin, "throwaway")
    CALLS.clear()
    yield loaded
    loaded.unregister("throwaway")


def two_models(stages: list[str]) -> dict:
    model = {"source": "torch.nn:Identity", "inputs": [{"shape": [1, 2]}]}
    return {"stages": stages, "models": [{"name": "first", **model}, {"name": "second", **model}]}


def test_dependencies_come_first_and_are_pulled_in(plugins):
    registry = plugins.stages()
    assert resolve_order(["c", "d"], registry) == ["a", "b", "c", "d"]
    assert resolve_order(["d", "a", "c"], registry) == ["d", "a", "b", "c"]


def test_a_stage_runs_after_the_stages_it_names_only_when_they_are_in_the_job():
    registry = {"p": Stage("p", "profiled", after=("t",)), "t": Stage("t", "timed"), "n": Stage("n", "needed"),
                "q": Stage("q", "needs n", needs=("n",), after=("t",))}
    assert resolve_order(["p", "t"], registry) == ["t", "p"]
    assert resolve_order(["p"], registry) == ["p"]  # "after" pulls nothing in
    assert resolve_order(["q", "t"], registry) == ["n", "t", "q"]


def test_unknown_stage_and_cycles_are_errors(plugins):
    with pytest.raises(RpxError, match="unknown stage 'zz'.*Choose one of"):
        resolve_order(["zz"], plugins.stages())
    cyclic = {"x": Stage("x", "x", needs=("y",)), "y": Stage("y", "y", needs=("x",))}
    with pytest.raises(RpxError, match="cycle: x -> y -> x"):
        resolve_order(["x"], cyclic)


def test_failure_skips_dependants_only_and_other_models_still_run(plugins, tmp_path):
    output = tmp_path / "out.toml"
    run = run_spec(spec_from_dict(two_models(["c", "d"])), plugins=plugins, output=output)
    first, second = run.models
    assert first.ok and {name: r.status for name, r in first.stages.items()} == dict.fromkeys("abcd", "ok")
    statuses = {name: r.status for name, r in second.stages.items()}
    assert statuses == {"a": "ok", "b": "failed", "c": "skipped", "d": "ok"}
    assert second.stages["b"].error == "ValueError: b broke on purpose"
    assert "needs b" in second.stages["c"].error
    assert ("second", "c") not in CALLS and ("second", "d") in CALLS
    assert not run.ok
    # results reached the file, failures included; the stage that produced each result is named
    on_disk = load(output)
    assert on_disk.model("second").stages["d"].status == "ok"
    assert on_disk.model("first").stages["c"].result == {"stage": "c", "inputs_seen": ["a", "b"]}
    assert on_disk.model("first").stages["a"].provided_by == "throwaway"


def test_results_already_measured_survive_an_interrupt(plugins, tmp_path):
    def interrupt(ctx):
        raise KeyboardInterrupt

    plugin = throwaway((Stage("stop", "interrupts", needs=("a",)), interrupt))
    plugins.register(plugin, "interrupter")
    output = tmp_path / "out.toml"
    try:
        with pytest.raises(KeyboardInterrupt):
            run_spec(spec_from_dict(two_models(["stop"])), plugins=plugins, output=output)
    finally:
        plugins.unregister("interrupter")
    saved = load(output).model("first")
    assert saved.stages["a"].status == "ok"  # measured before the interrupt: kept
    assert saved.stages["stop"].status == "interrupted" and saved.stages["stop"].error == "interrupted by SIGINT"
    assert saved.finished is None  # the model did not finish


def test_a_result_that_cannot_be_written_fails_its_stage_only(plugins, tmp_path):
    bad = throwaway((Stage("nulls", "a None value"), lambda ctx: {"value": None}))
    plugins.register(bad, "bad")
    wrong = types.SimpleNamespace(rpx_count_params=hookimpl(lambda ctx: {"total": 1}))
    plugins.register(wrong, "wrong")
    try:
        run = run_spec(spec_from_dict(two_models(["nulls", "count_params", "d"])), plugins=plugins, output=tmp_path / "o.toml")
    finally:
        plugins.unregister("bad")
        plugins.unregister("wrong")
    for model in run.models:
        assert model.stages["nulls"].status == "failed"
        assert "cannot be written to TOML and JSON" in model.stages["nulls"].error
        assert model.stages["count_params"].error == "TypeError: stage 'count_params' must return ParamsResult, got dict"
        assert model.stages["d"].status == "ok"
    assert load(tmp_path / "o.toml").model("second").stages["d"].status == "ok"


def test_hook_wrappers_are_refused(plugins):
    def wrapper(ctx):
        yield

    plugin = types.SimpleNamespace(rpx_count_flops=hookimpl(wrapper=True)(wrapper))
    with pytest.raises(Exception, match="'rpx_count_flops' is a hook wrapper, which rpx does not support"):
        plugins.register(plugin, "wrapping")


def test_unknown_option_for_a_stage_is_rejected(plugins):
    spec = spec_from_dict({**two_models(["a"]), "options": {"a": {"x": 1}}}, where="s.toml")
    with pytest.raises(SpecError, match="options.a: stage 'a' takes no options"):
        run_spec(spec, plugins=plugins, output=None)


def test_run_scoped_stage_is_skipped_when_a_model_failed_what_it_needs(plugins):
    ran = []
    agg = throwaway(
        (Stage("agg", "aggregate", needs=("b",), scope="run"), lambda ctx: ran.append(len(ctx.models)) or {"n": len(ctx.models)}),
        (Stage("early", "needs agg", needs=("agg",)), lambda ctx: {}),
    )
    plugins.register(agg, "agg")
    try:
        run = run_spec(spec_from_dict(two_models(["agg"])), plugins=plugins, output=None)
        assert run.run_stages["agg"].status == "skipped" and "needs b" in run.run_stages["agg"].error
        assert ran == []
        with pytest.raises(SpecError, match="per-model stage 'early' needs run-scoped stage 'agg'"):
            run_spec(spec_from_dict(two_models(["early"])), plugins=plugins, output=None)
    finally:
        plugins.unregister("agg")
