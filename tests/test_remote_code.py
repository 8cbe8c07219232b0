"""A model folder's own Python runs only when the spec says ``trust_remote_code = true``, the boolean.

A real ``hf:`` folder whose ``config.json`` names its own configuration and modelling code (``auto_map``), code that
writes a marker file when it runs. With the key absent or false, ``rpx run`` records the model as failed, saying why,
and the marker never appears; ``"false"``, ``"yes"`` and ``1`` are refused by ``rpx validate`` (and so by ``rpx run``)
before anything runs; ``true`` builds and counts the model, and the marker appears.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from rpx_core.api import load_results
from rpx_core.cli import main
from tests.conftest import rpx_cli

pytest.importorskip("transformers")

CONFIGURATION = '''
import os
from pathlib import Path

from transformers import PretrainedConfig

Path(os.environ["RPX_TEST_MARKER"]).write_text("the folder's configuration code ran")


class MarkerConfig(PretrainedConfig):
    model_type = "rpxmarker"

    def __init__(self, hidden=8, vocab_size=16, **kwargs):
        self.hidden = hidden
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
'''

MODELLING = '''
import torch
from transformers import PreTrainedModel

from .configuration_marker import MarkerConfig


class MarkerModel(PreTrainedModel):
    config_class = MarkerConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden)
        self.proj = torch.nn.Linear(config.hidden, config.hidden)

    def forward(self, input_ids):
        return self.proj(self.embed(input_ids))
'''


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    model = tmp_path / "marker-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "rpxmarker", "hidden": 8, "vocab_size": 16,
        "auto_map": {"AutoConfig": "configuration_marker.MarkerConfig", "AutoModel": "modeling_marker.MarkerModel"},
    }))
    (model / "configuration_marker.py").write_text(CONFIGURATION)
    (model / "modeling_marker.py").write_text(MODELLING)
    monkeypatch.setenv("RPX_TEST_MARKER", str(tmp_path / "marker"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # where transformers copies remote code it runs
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return model


def spec(folder: Path, **kwargs_by_model: str | None) -> Path:
    models = "".join(textwrap.dedent(f"""
        [[models]]
        name = "{name}"
        source = "hf:./{folder.name}"
        input_shape = [1, 4]
        """) + (f"kwargs = {{ trust_remote_code = {value} }}\n" if value is not None else "")
        for name, value in kwargs_by_model.items())
    path = folder.parent / "spec.toml"
    path.write_text(f'stages = ["count_params"]\noutput = "out.toml"\n{models}')
    return path


@pytest.mark.parametrize("value", ['"false"', '"yes"', "1"])
def test_anything_but_a_boolean_is_refused_before_anything_runs(folder: Path, value: str, capsys) -> None:
    path = spec(folder, model=value)
    for command in (["validate", str(path)], ["run", str(path)]):
        assert main(command) == 2
        kind = "int" if value == "1" else "str"
        assert capsys.readouterr().err.strip() == (
            f"rpx: error: {path}: models[0].kwargs.trust_remote_code: expected true or false, got {kind} "
            f"{value.replace(chr(34), chr(39))}")
    assert not (folder.parent / "marker").exists() and not (folder.parent / "out.toml").exists()


def test_absent_or_false_never_runs_the_folders_code(folder: Path) -> None:
    path = spec(folder, absent=None, false="false")
    done = rpx_cli("run", str(path), env=dict(os.environ), cwd=folder.parent)
    assert done.returncode == 1, done.stderr  # the run finished; both models' stages failed, saying why
    run = load_results(folder.parent / "out.toml")
    for name in ("absent", "false"):
        record = run.model(name).stages["count_params"]
        assert record.status == "failed"
        assert "which rpx runs only with kwargs.trust_remote_code = true" in record.error
    assert not (folder.parent / "marker").exists()


def test_true_runs_it(folder: Path) -> None:
    done = rpx_cli("run", str(spec(folder, trusted="true")), env=dict(os.environ), cwd=folder.parent)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (folder.parent / "marker").read_text() == "the folder's configuration code ran"
