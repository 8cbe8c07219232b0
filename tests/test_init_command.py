"""``rpx init`` and ``rpx profile``: a commented starter spec that ``rpx validate`` accepts unchanged, for every way of naming a
model: the default, an import path, a model file (its build function found by reading it) and a named model."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from rpx_core.api import load_results
from rpx_core.errors import RpxError
from rpx_core.spec.starter import build_function, model_source
from tests.conftest import rpx_cli


@pytest.mark.parametrize(("args", "source", "shape"), [
    ([], "rpx_plugins.torch.zoo:tiny_cnn", [1, 3, 32, 32]),
    (["torch.nn:Identity", "--input", "2x8"], "torch.nn:Identity", [2, 8]),
    (["hf:./llama", "--input", "1x64"], "hf:./llama", [1, 64]),
])
def test_the_starter_spec_validates_unchanged(tmp_path: Path, args: list[str], source: str, shape: list[int]) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    done = rpx_cli("init", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "spec.toml").read_text()
    spec = tomllib.loads(text)
    assert spec["models"][0]["source"] == source and spec["models"][0]["input_shape"] == shape
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 5  # commented for a newcomer
    checked = rpx_cli("validate", "spec.toml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("spec.toml: ok")


def test_a_model_file_gets_its_build_function_and_a_path_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text("import torch\n\ndef _helper():\n    pass\n\n"
                                                "def build_model(width=8):\n    return torch.nn.Linear(width, width)\n")
    done = rpx_cli("init", "models/net.py", "--input", "1x8", "-o", "specs/net.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads((tmp_path / "specs/net.toml").read_text())["models"][0]["source"] == "../models/net.py:build_model"
    assert rpx_cli("validate", "specs/net.toml", cwd=tmp_path).returncode == 0
    again = rpx_cli("init", "models/net.py", "-o", "specs/net.toml", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip() == ("rpx: error: specs/net.toml: already exists; choose another file with -o, or add "
                                    "--force to overwrite it")


def test_how_a_model_is_named_becomes_a_source(tmp_path: Path) -> None:
    assert model_source(None) == "rpx_plugins.torch.zoo:tiny_cnn"
    assert model_source("hf:gpt2") == "hf:gpt2" and model_source("pkg.mod:make") == "pkg.mod:make"
    (tmp_path / "one.py").write_text("def resnet():\n    pass\n")
    (tmp_path / "two.py").write_text("def a():\n    pass\n\ndef b():\n    pass\n")
    assert build_function(tmp_path / "one.py") == "resnet"  # its only function
    with pytest.raises(RpxError, match=r"say which function builds the model, as .*two.py:NAME \(it defines a, b\)"):
        build_function(tmp_path / "two.py")
    with pytest.raises(RpxError, match=r"give an import path 'package.module:callable', a file"):
        model_source("resnet50")
    bad = rpx_cli("init", "--input", "1xa", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == ("rpx: error: --input: '1xa' is not a shape; write dimensions "
                                                          "separated by 'x', e.g. 1x128")


def test_profile_names_results_for_the_model_file_and_never_replaces_another_models(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.py").write_text(
            f"import torch\n\ndef build():\n    return torch.nn.Linear(8, {4 if folder == 'a' else 2})\n")
    (tmp_path / "other.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 3)\n")
    quick = ["--input", "1x8", "--stages", "count_params"]
    first = rpx_cli("profile", "a/model.py:build", *quick, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "results: rpx-results/model.toml" in first.stdout  # named for the file, not for its generic `build`
    other = rpx_cli("profile", "other.py:build", *quick, cwd=tmp_path)
    assert other.returncode == 0 and "results: rpx-results/other.toml" in other.stdout
    again = rpx_cli("profile", "a/model.py:build", *quick, cwd=tmp_path)  # the same model again: replaced
    assert again.returncode == 0, again.stderr
    clash = rpx_cli("profile", "b/model.py:build", *quick, cwd=tmp_path)  # another model.py: refused, nothing lost
    assert clash.returncode == 2 and "Traceback" not in clash.stderr
    assert "rpx-results/model.toml holds the results of another model (" in clash.stderr
    assert "a/model.py:build); give -o FILE" in clash.stderr
    kept = load_results(tmp_path / "rpx-results" / "model.toml")
    assert kept.models[0].result("count_params").total == 8 * 4 + 4
    moved = rpx_cli("profile", "b/model.py:build", *quick, "-o", "b.toml", cwd=tmp_path)
    assert moved.returncode == 0 and load_results(tmp_path / "b.toml").models[0].result("count_params").total == 18


def test_profile_errors_name_its_own_arguments(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 4)\n")
    cases = {("m.py:buildx", "--input", "1x8"): "rpx profile: MODEL: 'm.py:buildx': m.py defines no 'buildx'",
             ("m.py", "--input", "1x8", "--precision", "bf61"): "rpx profile: --precision: expected one of",
             ("m.py", "--input", "1x8", "--gpus", "H100"): "rpx profile: --gpus: GPU 'H100' could mean",
             ("hf:./none", "--input", "1x8"): "rpx profile: MODEL: no such folder"}
    for args, line in cases.items():
        done = rpx_cli("profile", *args, cwd=tmp_path)
        assert done.returncode == 2 and line in done.stderr and "models[0]" not in done.stderr, (args, done.stderr)
