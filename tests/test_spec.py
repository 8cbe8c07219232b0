"""Spec validation: every error is one line naming the file and the key path, with suggestions for typos."""

from __future__ import annotations

import pytest

from rpx_core.errors import SpecError
from rpx_core.spec.schema import load_spec
from tests.conftest import REPO, rpx_cli

REPO_SPECS = REPO / "specs"

GOOD = """
name = "ok"
stages = ["count_params"]
[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = { in_features = 8, out_features = 4 }
inputs = [{ shape = [1, 8] }]
"""


def test_good_spec_loads_with_defaults(write_spec):
    spec = load_spec(write_spec(GOOD))
    assert spec.name == "ok"
    assert spec.models[0].inputs[0].shape == (1, 8)
    assert spec.models[0].inputs[0].dtype == "float32"
    assert spec.precision == "fp32" and spec.backend == "cpu"


def error_of(write_spec, text: str) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(text))
    return str(info.value)


def test_unknown_top_level_key_suggests_the_right_one(write_spec):
    message = error_of(write_spec, GOOD.replace('stages =', 'stagse ='))
    assert "spec.toml: <top>: unknown key 'stagse'; did you mean 'stages'?" in message


def test_unknown_nested_key_names_the_path(write_spec):
    message = error_of(write_spec, GOOD.replace("inputs = [{ shape = [1, 8] }]", "inputs = [{ shape = [1, 8] }, { shpae = [2] }]"))
    assert "models[0].inputs[1]: unknown key 'shpae'; did you mean 'shape'?" in message


def test_wrong_type_names_the_exact_key_path(write_spec):
    message = error_of(write_spec, GOOD.replace("inputs = [{ shape = [1, 8] }]", 'inputs = [{ shape = [1, 8] }, { shape = [1, "x"] }]'))
    assert "models[0].inputs[1].shape" in message
    assert "expected an integer" in message


def test_bad_precision_lists_the_choices(write_spec):
    message = error_of(write_spec, 'precision = "fp64"\n' + GOOD)
    assert "precision" in message and "fp16" in message and "bf16" in message


def test_missing_required_key(write_spec):
    message = error_of(write_spec, GOOD.replace('source = "torch.nn:Linear"\n', ""))
    assert "models[0].source: required key is missing" in message


def test_semantic_checks(write_spec):
    message = error_of(write_spec, "batch_sizes = [0]\n" + GOOD.replace("inputs = [{ shape = [1, 8] }]", ""))
    assert "models[0]: give inputs" in message
    assert "batch_sizes[0]: must be at least 1 (a zero dimension runs no work), got 0" in message


def test_invalid_toml_and_missing_file(write_spec, tmp_path):
    assert "not valid TOML" in error_of(write_spec, "name = ")
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "absent.toml")


def test_validate_cli_prints_one_line_and_exits_2(write_spec):
    path = write_spec(GOOD.replace("stages =", "stagse ="))
    done = rpx_cli("validate", str(path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"rpx: error: {path}: <top>: unknown key 'stagse'; did you mean 'stages'?"]
    assert "Traceback" not in done.stderr


def test_validate_cli_checks_stage_names_and_options(write_spec):
    done = rpx_cli("validate", str(write_spec(GOOD.replace('["count_params"]', '["count_parms"]'))))
    assert done.returncode == 2 and "unknown stage 'count_parms'" in done.stderr
    done = rpx_cli("validate", str(write_spec(GOOD + "[options.count_parms]\nx = 1\n")))
    assert done.returncode == 2 and "options.count_parms: unknown stage 'count_parms'; did you mean 'count_params'?" in done.stderr


def test_validate_ok(write_spec):
    done = rpx_cli("validate", str(write_spec(GOOD)))
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


def test_debug_shows_the_traceback(write_spec):
    done = rpx_cli("--debug", "validate", str(write_spec(GOOD.replace("stages =", "stagse ="))))
    assert done.returncode != 0 and "Traceback" in done.stderr


@pytest.mark.parametrize("path", sorted(REPO_SPECS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_spec_validates(path):
    from rpx_core.registry.manager import Plugins
    from rpx_core.spec.plan import make_plan

    plan = make_plan(load_spec(path), Plugins.load(), where=str(path))
    assert plan.jobs


def test_a_named_choice_is_one_line_with_did_you_mean_and_none_only_where_it_means_something():
    from rpx_core.types.counts import CountOptions
    from rpx_core.types.serving import ServeOptions

    assert ServeOptions(weights=None).weights is None  # absent: the run's precision
    with pytest.raises(ValueError, match=r"^weights must be one of 'int8', 'int4', 'fp8' or absent \(the run's "
                                         r"precision\); got 'int3'; did you mean 'int8'\?$"):
        ServeOptions(weights="int3")
    with pytest.raises(ValueError, match=r"^mode must be one of 'eval', 'train'; got None$"):
        CountOptions(mode=None)
