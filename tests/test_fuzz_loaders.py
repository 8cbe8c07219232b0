"""Property tests: arbitrary TOML documents, mutated valid specs and damaged results files never make the loaders
raise anything but rpx's own one-line errors (SpecError / RpxError), and never a traceback-worthy exception."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpx_core.errors import RpxError
from rpx_core.registry.manager import Plugins
from rpx_core.results.serialise import loads
from rpx_core.spec.plan import plan_with_problems
from rpx_core.spec.schema import structure_spec

VALID_SPEC = {
    "name": "fuzz",
    "stages": ["count_params", "measure_latency"],
    "backend": "cpu",
    "precision": "fp16",
    "batch_sizes": [1, 4],
    "gpus": ["H100-SXM"],
    "execution": {"isolation": "worker", "stage_timeout": 60.0},
    "options": {"measure_latency": {"max_seconds": 1.0, "keep_samples": True}},
    "models": [
        {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 4, "out_features": 2},
         "inputs": [{"shape": [1, 4], "dtype": "float32"}]},
    ],
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.just("\x00"), st.just(math.inf))
toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(-10**9, 10**9), st.floats(), st.text(max_size=10)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20,
)
documents = st.dictionaries(st.text(max_size=10), toml_values, max_size=6)
PLUGINS = Plugins.load()
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_spec_data(data: dict) -> None:
    """What ``rpx validate`` does with a parsed document: problems are lines, never exceptions."""
    spec, problems = structure_spec(data, where="fuzz.toml", base_dir="/nonexistent")
    assert all(isinstance(line, str) and line.startswith("fuzz.toml: ") and "\n" not in line for line in problems)
    if spec is not None:
        try:
            _, more = plan_with_problems(spec, PLUGINS, where="fuzz.toml")
        except RpxError:
            return
        assert all(line.startswith("fuzz.toml: ") for line in more)


@FUZZ
@given(documents)
def test_arbitrary_toml_documents_are_answered_with_problem_lines(data):
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError):
        return
    check_spec_data(tomllib.loads(text))


def mutate(draw, value, depth=0):
    """Replace, drop or retype one part of a valid spec, recursively."""
    if isinstance(value, dict) and value and depth < 4:
        key = draw(st.sampled_from(sorted(value)))
        action = draw(st.sampled_from(["replace", "drop", "descend", "add"]))
        copy = dict(value)
        if action == "drop":
            del copy[key]
        elif action == "replace":
            copy[key] = draw(scalars)
        elif action == "add":
            copy[draw(st.text(max_size=8))] = draw(scalars)
        else:
            copy[key] = mutate(draw, value[key], depth + 1)
        return copy
    if isinstance(value, list) and value and depth < 4:
        index = draw(st.integers(0, len(value) - 1))
        copy = list(value)
        copy[index] = mutate(draw, value[index], depth + 1) if draw(st.booleans()) else draw(scalars)
        return copy
    return draw(scalars)


@st.composite
def mutated_specs(draw):
    data = VALID_SPEC
    for _ in range(draw(st.integers(1, 3))):
        data = mutate(draw, data)
    return data


@FUZZ
@given(mutated_specs())
def test_mutated_valid_specs_are_answered_with_problem_lines(data):
    check_spec_data(data if isinstance(data, dict) else {"models": data})


def valid_results_text(tmp_path_factory) -> str:
    import rpx_core as rpx
    from rpx_core.spec.schema import spec_from_dict

    folder = tmp_path_factory.mktemp("fuzz-results")
    spec = spec_from_dict({**VALID_SPEC, "stages": ["count_params", "system_card"], "gpus": [], "options": {},
                           "precision": "fp32"}, base_dir=str(folder))
    output = Path(folder) / "r.toml"
    rpx.run_spec(spec, output=output)
    return output.read_text()


RESULTS: list[str] = []


@st.composite
def damaged_results(draw):
    text = RESULTS[0]
    how = draw(st.sampled_from(["truncate", "flip", "insert", "delete_line", "retype"]))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if how == "flip":
        at = draw(st.integers(0, len(text) - 1))
        return text[:at] + draw(st.characters()) + text[at + 1:]
    if how == "insert":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(max_size=20)) + text[at:]
    lines = text.splitlines()
    index = draw(st.integers(0, len(lines) - 1))
    if how == "delete_line":
        return "\n".join(lines[:index] + lines[index + 1:])
    key, sep, _ = lines[index].partition(" = ")
    return "\n".join(lines[:index] + [f"{key}{sep or ' = '}{draw(st.sampled_from(['3', 'true', '[1]', '{}', 'inf']))}"]
                     + lines[index + 1:])


def test_damaged_results_files_are_one_line_errors(tmp_path_factory):
    import rpx_core as rpx

    RESULTS.append(valid_results_text(tmp_path_factory))
    types = {name: stage.result for name, stage in PLUGINS.stages().unambiguous().items()}
    assert rpx.results.serialise.loads(RESULTS[0], result_types=types).models[0].name == "lin"  # the undamaged file loads

    @FUZZ
    @given(damaged_results())
    def check(text):
        try:
            loads(text, where="r.toml", result_types=types)
        except RpxError as exc:
            assert str(exc).startswith("r.toml: ") and "\n" not in str(exc)

    check()
