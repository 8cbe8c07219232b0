"""``rpx validate`` catches what ``rpx run`` would trip on, every problem of a spec in one pass, each one line with its
key path: stage options, precisions, GPU-pack figures, model keys, time limits, batch sizes, a named model's
configuration overrides and keyword arguments, and an executor whose library is missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rpx_core.cli import main

MODEL = """
[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = { in_features = 4, out_features = 2 }
inputs = [{ shape = [1, 4] }]
"""

PACK = """
[pack]
name = "mine"
version = "1"
source = "made up"

[[gpu]]
name = "Mine-1"
vendor = "Acme"
segment = "datacenter"
memory_gb = 8
memory_type = "HBM3"
bandwidth_gb_s = 100
source = "made up"

[gpu.peaks.fp32]
tflops = 10
"""


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> list[str]:
    """The lines one ``rpx validate`` prints for a spec (exit 2, nothing else printed)."""
    path = tmp_path / "spec.toml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return [line.removeprefix(f"rpx: error: {path}: ") for line in captured.err.splitlines()]


def test_a_mistake_in_a_stage_option_a_precision_a_pack_and_a_model_is_four_lines_of_one_validate(tmp_path, capsys):
    (tmp_path / "mine.toml").write_text(PACK.replace("bandwidth_gb_s = 100", "bandwidth_gb_s = nan"))
    lines = refused(tmp_path, capsys, 'stages = ["roofline", "measure_latency"]\ngpus = ["L4"]\n'
                    'gpu_packs = ["mine.toml"]\n[options.measure_latency]\nmax_secondz = 3\n'
                    '[options.roofline]\nprecisions = ["bf61"]\n' + MODEL + 'nmae = "x"\n')
    assert sorted(lines) == sorted([
        "models[0]: unknown key 'nmae'; did you mean 'name'?",
        "options.measure_latency: unknown key 'max_secondz'; did you mean 'max_seconds'?",
        "options.roofline.precisions[0]: expected one of 'fp32', 'tf32', 'fp16', 'bf16', 'fp8', 'int8', got 'bf61'; "
        "did you mean 'bf16'?",
        f"gpu_packs: {tmp_path / 'mine.toml'}: gpu[0].bandwidth_gb_s: expected a finite number, got nan",
    ])


def test_every_refused_value_of_a_table_at_once(tmp_path, capsys):
    lines = refused(tmp_path, capsys, '[execution]\nstage_timeout = nan\njob_timeout = -1\ninterrupt_grace = inf\n'
                    '[options.count_flops]\ntop_k = 0\nmodule_depth = "3"\ncount_on = "gpu"\n' + MODEL)
    assert sorted(lines) == sorted([
        "execution.stage_timeout: expected a finite number, got nan",
        "execution.job_timeout: must be > 0: -1",
        "execution.interrupt_grace: expected a finite number, got inf",
        "options.count_flops.top_k: must be >= 1: 0",
        "options.count_flops.module_depth: expected an integer, got str '3'",
        "options.count_flops.count_on: must be in ('auto', 'meta', 'device') (got 'gpu')",
    ])


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("batch_sizes", "[99999999999999999999]", "batch_sizes[0]: must be at most 2147483647 (2**31 - 1), got "
                                              "99999999999999999999"),
    ("batch_sizes", "[]", "batch_sizes: at least one batch size is required"),
    ("sweep", "{ seq_len = [0, 8] }", "sweep.seq_len[0]: must be at least 1 (a zero dimension runs no work), got 0"),
    ("options", "{ count_flops = { batch_size = 4294967296 } }",
     "options.count_flops.batch_size: must be at most 2147483647 (2**31 - 1), got 4294967296"),
    ("options", "{ batch_search = { max_batch = 0 } }",
     "options.batch_search.max_batch: must be at least 1 (a zero dimension runs no work), got 0"),
])
def test_one_rule_for_batch_sizes_everywhere(tmp_path, capsys, key, value, expected):
    stages = 'stages = ["batch_search"]\n' if "batch_search" in value else ""
    assert refused(tmp_path, capsys, f"{stages}{key} = {value}\n" + MODEL) == [expected]


@pytest.mark.parametrize(("figure", "expected"), [
    ("bandwidth_gb_s = inf", "gpu[0].bandwidth_gb_s: expected a finite number, got inf"),
    ("memory_gb = 1e300", "gpu[0].memory_gb: must be at most 1e+06, got 1e+300; is the unit right (TFLOP/s, GB/s, GB)?"),
    ("tflops = -2", "gpu[0].peaks.fp32.tflops: must be greater than 0, got -2"),
])
def test_pack_figures_are_finite_positive_and_plausible(tmp_path, capsys, figure, expected):
    key = figure.partition(" = ")[0]
    (tmp_path / "mine.toml").write_text("\n".join(figure if line.startswith(f"{key} = ") else line
                                                  for line in PACK.splitlines()))
    lines = refused(tmp_path, capsys, 'stages = ["roofline"]\ngpus = ["Mine-1"]\ngpu_packs = ["mine.toml"]\n' + MODEL)
    assert lines[0] == f"gpu_packs: {tmp_path / 'mine.toml'}: {expected}"
    assert lines[1:] == ["gpus[0]: GPU 'Mine-1' not recognized. Choose one of: " + lines[1].partition("of: ")[2]]


def test_an_executor_whose_library_is_missing_is_named_by_its_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what Python does for a module that cannot be imported
    assert refused(tmp_path, capsys, MODEL + '[execution]\nexecutor = "ray"\n') == [
        "execution.executor: executor 'ray' needs 'ray', which is not installed: pip install 'rpx[ray]'"]


def test_a_named_models_overrides_and_kwargs_are_checked_against_its_configuration(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2,
                                                    "vocab_size": 100}))
    lines = refused(tmp_path, capsys, """
        [[models]]
        name = "g"
        source = "hf:./gpt2"
        input_shape = [1, 8]
        config = { vocab_size = "abc", n_layr = 2, n_layer = "two", num_hidden_layers = 1, resid_pdrop = 0 }
        kwargs = { trust_remote_code = "false", auto_clas = "AutoModel" }
        """.replace("\n        ", "\n"))
    assert lines == [
        "models[0].config.vocab_size: expected int, got str 'abc'",
        "models[0].config.n_layr: GPT2Config has no attribute 'n_layr'; did you mean 'n_layer'?",
        "models[0].config.n_layer: expected int, got str 'two'",
        "models[0].kwargs.trust_remote_code: expected true or false, got str 'false'",
        "models[0].kwargs: unknown key 'auto_clas'; did you mean 'auto_class'?",
    ]


def test_a_stage_check_gets_the_gpu_catalogue_and_a_broken_check_is_a_line_naming_its_plugin():
    import types

    from rpx_core.plugin import Stage, hookimpl
    from rpx_core.registry.manager import Plugins
    from rpx_core.spec.plan import plan_with_problems
    from rpx_core.spec.schema import spec_from_dict

    seen = []

    def needs_an_h100(spec, options, gpus):  # resolves names and aliases as rpx does
        seen.extend(gpus.get(name).name for name in spec.gpus)
        if "H100-SXM" not in seen:
            yield "gpus: the h100_only stage needs an H100-SXM"

    def broken(spec, options):  # a check written for two arguments is called with two
        raise KeyError("oops")

    @hookimpl
    def rpx_register_stages():
        return [Stage("h100_only", "needs an H100", check=needs_an_h100), Stage("broken", "raises", check=broken)]

    plugins = Plugins.load()
    plugins.register(types.SimpleNamespace(rpx_register_stages=rpx_register_stages), "checks")
    model = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 4, "out_features": 2},
             "inputs": [{"shape": [1, 4]}]}
    spec = spec_from_dict({"models": [model], "stages": ["h100_only", "broken"], "gpus": ["NVIDIA H100 80GB HBM3"]})
    _, problems = plan_with_problems(spec, plugins, where="s.toml")
    assert seen == ["H100-SXM"]  # the alias a CUDA device reports, resolved by the catalogue
    assert problems == ["s.toml: stages: the check of stage 'broken' (plugin 'checks') raised KeyError: 'oops'"]
