"""Models by name (``hf:``, ``torchvision:``, ``timm:`` and a plugin's own scheme) and models rpx cannot look inside.

Hugging Face models come from a config.json written here, offline (HF_HUB_OFFLINE=1); the counts are checked against
hand-computed values. torchvision and timm do not import beside this torch build, so their builders are run against
small stand-in packages with the libraries' call signatures, and the real "not installed" path is checked as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from rpx_core.api import run_spec
from rpx_core.errors import PluginError, RpxError, SpecError, UnsupportedError
from rpx_core.plugin import ModelSource
from rpx_core.registry.manager import Plugins
from rpx_core.spec.schema import InputSpec, spec_from_dict
from rpx_plugins.sources import hf, vision
from tests.conftest import rpx_cli

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

#: A Llama-shaped configuration: grouped-query attention (4 query heads, 2 key/value heads of 64), SwiGLU MLP.
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}


def llama_counts(layers: int, seq: int) -> tuple[int, int]:
    """(parameters, MACs) of LLAMA's AutoModel (no LM head) at batch 1, by hand."""
    hidden, kv, ffn, heads, head_dim = 256, 2 * 64, 688, 4, 64
    linear = hidden * hidden * 2 + hidden * kv * 2 + 3 * hidden * ffn  # q, o; k, v; gate, up, down
    per_layer = linear + 2 * hidden  # two RMS norms
    params = 32000 * hidden + layers * per_layer + hidden  # embeddings, layers, final norm
    attention = 2 * heads * seq * seq * head_dim  # QK^T and PV, causal mask counted dense
    return params, layers * (seq * linear + attention)


@pytest.fixture
def llama_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    return folder


def test_profile_of_a_local_llama_config_offline_on_h100(llama_dir: Path, tmp_path: Path) -> None:
    done = rpx_cli("profile", "hf:./llama", "--input", "1x2048", "--gpus", "H100-SXM", "--save-spec", "saved.toml",
                   env=OFFLINE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "results: rpx-results/llama.toml" in done.stdout and "Tier 2: roofline" in done.stdout
    assert any(line.split()[:3] == ["llama", "H100-SXM", "fp32"] for line in done.stdout.splitlines())
    model = tomllib.loads((tmp_path / "rpx-results/llama.toml").read_text())["models"][0]
    params, macs = llama_counts(layers=2, seq=2048)
    assert model["source"] == f"hf:{llama_dir}"
    assert model["stages"]["count_params"]["result"]["total"] == params == 9_643_264
    assert model["stages"]["count_flops"]["result"]["macs"] == macs == 7_264_534_528
    assert model["stages"]["count_flops"]["result"]["counted_on"] == "meta"  # never materialised
    assert model["stages"]["roofline"]["status"] == "ok" and "H100-SXM" in model["stages"]["roofline"]["result"]["gpus"]
    # the spec it used runs again unchanged
    saved = (tmp_path / "saved.toml").read_text()
    assert 'source = "hf:./llama"' in saved and "input_shape = [1, 2048]" in saved
    assert rpx_cli("validate", "saved.toml", env=OFFLINE, cwd=tmp_path).returncode == 0


def test_config_overrides_and_token_inputs_of_an_hf_spec(llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    spec = spec_from_dict({"stages": ["count_params", "count_flops"], "execution": {"isolation": "in-process"},
                           "models": [{"name": "one-layer", "source": f"hf:{llama_dir}", "input_shape": [2, 64],
                                       "config": {"num_hidden_layers": 1}, "notes": "config only, no weights"}]})
    result = run_spec(spec, output=tmp_path / "out.toml").model("one-layer")
    params, macs = llama_counts(layers=1, seq=64)
    assert result.result("count_params").total == params
    assert result.result("count_flops").macs == 2 * macs  # batch 2
    assert result.notes == "config only, no weights"
    assert tomllib.loads((tmp_path / "out.toml").read_text())["models"][0]["notes"] == "config only, no weights"


def test_a_sweep_over_hf_configurations_and_sequence_lengths(llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """The common sweep: named models (their token inputs made from input_shape) at several sequence lengths."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    spec = spec_from_dict({"stages": ["count_params", "count_flops"], "execution": {"isolation": "in-process"},
                           "sweep": {"seq_len": [32, 128]},
                           "models": [{"name": "two", "source": f"hf:{llama_dir}", "input_shape": [1, 8]},
                                      {"name": "one", "source": f"hf:{llama_dir}", "input_shape": [1, 8],
                                       "config": {"num_hidden_layers": 1}}]})
    run = run_spec(spec, output=None)
    for name, layers in (("two", 2), ("one", 1)):
        for seq in (32, 128):
            model = run.model(f"{name}[seq_len={seq}]")
            params, macs = llama_counts(layers=layers, seq=seq)
            assert (model.result("count_params").total, model.result("count_flops").macs) == (params, macs)
            assert model.coordinates == {"model": name, "seq_len": seq}


def test_hf_inputs_are_token_ids_with_the_vocabulary_of_a_local_config(llama_dir: Path) -> None:
    assert hf.inputs(str(llama_dir), (1, 16), {}) == (InputSpec((1, 16), "int64", name="input_ids", high=32000),)
    assert hf.inputs(str(llama_dir), (1, 16), {"vocab_size": 99})[0].high == 99
    assert hf.inputs("org/not-cached-anywhere", (1, 16), {})[0].high is None  # ids from {0, 1}; counts are the same
    with pytest.raises(RpxError, match=r"batch x sequence \(e\.g\. 1x2048\), got 1x3x16"):
        hf.inputs(str(llama_dir), (1, 3, 16), {})


def test_hf_build_refuses_an_unknown_config_key_and_auto_class(llama_dir: Path, monkeypatch) -> None:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RpxError, match=r"config\.num_hidden_layer: LlamaConfig has no attribute 'num_hidden_layer'; "
                                       r"did you mean 'num_hidden_layers'\?"):
        hf.build(str(llama_dir), {"num_hidden_layer": 1})
    with pytest.raises(RpxError, match=r"kwargs\.auto_class: transformers has no auto class 'AutoModelForCasualLM'; "
                                       r"did you mean 'AutoModelForCausalLM'\?"):
        hf.build(str(llama_dir), {}, auto_class="AutoModelForCasualLM")
    head = hf.build(str(llama_dir), {"num_hidden_layers": 1}, auto_class="AutoModelForCausalLM")
    assert type(head).__name__ == "LlamaForCausalLM"


def test_validate_reports_source_problems_in_one_line_each_without_importing(tmp_path: Path, write_spec) -> None:
    (tmp_path / "empty").mkdir()
    path = write_spec("""
        [[models]]
        name = "typo"
        source = "hff:gpt2"
        input_shape = [1, 8]
        [[models]]
        name = "gone"
        source = "hf:./no-such-folder"
        input_shape = [1, 8]
        [[models]]
        name = "empty"
        source = "hf:./empty"
        input_shape = [1, 8]
        [[models]]
        name = "shape"
        source = "hf:gpt2"
        input_shape = [1, 3, 8]
        [[models]]
        name = "config"
        source = "torch.nn:Linear"
        kwargs = { in_features = 8, out_features = 8 }
        input_shape = [1, 8]
        config = { hidden_size = 8 }
    """)
    no_hub = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "empty")}  # refused at once
    done = rpx_cli("validate", str(path), env=no_hub)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    expected = [
        "models[0].source: 'hff:gpt2': cannot find module 'hff' on the import path; did you mean the model source 'hf:'?",
        f"models[1].source: no such folder {str((tmp_path / 'no-such-folder').resolve())!r}",
        f"models[2].source: folder {str((tmp_path / 'empty').resolve())!r} has no config.json",
        "models[3].source: 'gpt2' is not in the local Hugging Face cache and the hub (http://127.0.0.1:9) cannot be "
        "reached from here: give a folder holding its config.json (hf:./folder)",
        "models[3].input_shape: hf: models take token ids of batch x sequence (e.g. 1x2048), got 1x3x8",
        "models[4].config: only named models (e.g. 'hf:gpt2') take configuration overrides",
    ]
    for want in expected:
        assert any(want in line for line in lines), (want, lines)
    assert len(lines) == len(expected)
    offline = rpx_cli("validate", str(path), env={**OFFLINE, "HF_HUB_CACHE": str(tmp_path / "empty")})
    assert ("models[3].source: 'gpt2' is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 keeps rpx off the "
            "hub") in offline.stderr


@pytest.mark.skipif(not (vision.TORCHVISION.missing() and vision.TIMM.missing()), reason="torchvision/timm installed")
def test_validate_says_torchvision_and_timm_are_not_installed(write_spec) -> None:
    path = write_spec("""
        [[models]]
        name = "resnet"
        source = "torchvision:resnet18"
        input_shape = [1, 3, 224, 224]
        [[models]]
        name = "vit"
        source = "timm:vit_tiny_patch16_224"
        input_shape = [1, 3, 224, 224]
    """)
    done = rpx_cli("validate", str(path))
    assert done.returncode == 2
    assert "models[0].source: model source 'torchvision' needs 'torchvision', which is not installed: pip install " \
           "torchvision (the release built for your torch version)" in done.stderr
    assert "models[1].source: model source 'timm' needs 'timm', which is not installed" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 2


def test_a_torchvision_built_for_another_torch_is_one_line_with_its_error(tmp_path: Path) -> None:
    # an installed torchvision built for another torch fails to import: said in one line with its error
    broken = tmp_path / "broken"
    (broken / "torchvision").mkdir(parents=True)
    (broken / "torchvision" / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')")
    sys.path.insert(0, str(broken))
    try:
        with pytest.raises(UnsupportedError, match=r"torchvision is installed but does not import here \(RuntimeError: "
                                                   r"operator torchvision::nms does not exist\)"):
            vision.build_torchvision("resnet18", {})
    finally:
        sys.path.remove(str(broken))
        sys.modules.pop("torchvision", None)


STAND_INS = {
    "torchvision/__init__.py": "from torchvision import models\n",
    "torchvision/models.py": """
        import torch
        CALLS = []
        def list_models():
            return ["resnet18", "resnet50"]
        def get_model(name, **kwargs):
            CALLS.append((name, kwargs))
            return torch.nn.Conv2d(3, kwargs.get("num_classes", 8), 3)
    """,
    "timm/__init__.py": """
        import torch
        CALLS = []
        def is_model(name):
            return name == "vit_tiny_patch16_224"
        def list_models():
            return ["vit_tiny_patch16_224"]
        def create_model(name, **kwargs):
            CALLS.append((name, kwargs))
            return torch.nn.Conv2d(3, kwargs.get("num_classes", 8), 3)
    """,
}


def test_vision_builders_ask_for_no_weights_and_pass_the_config(tmp_path: Path) -> None:
    for name, code in STAND_INS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(code))
    sys.path.insert(0, str(tmp_path))
    try:
        import timm
        import torchvision

        assert vision.build_torchvision("resnet18", {"num_classes": 10}).out_channels == 10
        assert torchvision.models.CALLS == [("resnet18", {"weights": None, "num_classes": 10})]
        assert vision.build_timm("vit_tiny_patch16_224", {}, num_classes=4).out_channels == 4
        assert timm.CALLS == [("vit_tiny_patch16_224", {"pretrained": False, "num_classes": 4})]
        with pytest.raises(RpxError, match=r"torchvision has no model 'resnet5'; did you mean 'resnet50'\?"):
            vision.build_torchvision("resnet5", {})
        with pytest.raises(RpxError, match=r"timm has no model 'vit_tiny_patch61_224'; did you mean 'vit_tiny_patch16_224'\?"):
            vision.build_timm("vit_tiny_patch61_224", {})
    finally:
        sys.path.remove(str(tmp_path))
        for module in ("torchvision", "torchvision.models", "timm"):
            sys.modules.pop(module, None)
    assert vision.TORCHVISION.inputs("resnet18", (2, 3, 32, 32), {}) == (InputSpec((2, 3, 32, 32)),)
    with pytest.raises(RpxError, match=r"batch x channels x height x width \(e\.g\. 1x3x224x224\), got 1x32"):
        vision.TIMM.inputs("vit", (1, 32), {})


class ToySource:
    """A third party's model source: ``toy:<width>`` is a Linear layer of that width."""

    @staticmethod
    def rpx_register_model_sources():
        import torch

        def build(target, config):
            return torch.nn.Linear(int(target), int(target), bias=config.get("bias", True))

        def inputs(target, shape, config):
            return (InputSpec(shape=(*shape, int(target))),)

        return [ModelSource("toy", "Linear layers by width", build=build, inputs=inputs, example="64")]


class RivalHf:
    @staticmethod
    def rpx_register_model_sources():
        return [ModelSource("hf", "another hf", build=lambda target, config: None, inputs=lambda *a: ())]


def test_a_plugin_scheme_builds_and_counts_and_a_clash_needs_a_choice(tmp_path: Path) -> None:
    plugins = Plugins.load()
    plugins.register(ToySource, "toy-plugin")
    spec = spec_from_dict({"stages": ["count_params", "count_flops"], "execution": {"isolation": "in-process"},
                           "models": [{"name": "w", "source": "toy:32", "input_shape": [4], "config": {"bias": False}}]})
    result = run_spec(spec, output=None, plugins=plugins).model("w")
    assert result.result("count_params").total == 32 * 32
    assert result.result("count_flops").macs == 4 * 32 * 32
    plugins.register(RivalHf, "rival-hf")
    clash = {"stages": ["count_params"], "models": [{"name": "m", "source": "hf:gpt2", "input_shape": [1, 8]}]}
    with pytest.raises(SpecError, match=r"source 'hf' is registered by plugin 'rival-hf' .* and by plugin "
                                        r"'model-sources' .*\[choose\.sources\]"):
        run_spec(spec_from_dict(clash), output=None, plugins=plugins)
    with pytest.raises(PluginError):
        plugins.model_sources()["hf"]
    chosen = plugins.model_sources(spec_from_dict({**clash, "choose": {"sources": {"hf": "model-sources"}}}).choose)
    assert chosen["hf"] is hf.SOURCE


def test_rpx_plugins_lists_the_model_sources() -> None:
    done = rpx_cli("plugins", "--json")
    sources = {row["scheme"]: row for row in json.loads(done.stdout)["model_sources"]}
    assert set(sources) >= {"hf", "torchvision", "timm"} and sources["hf"]["plugin"] == "model-sources"
    assert "model sources (source = \"<scheme>:<name>\"):" in rpx_cli("plugins").stdout


def test_validate_of_a_named_model_imports_neither_torch_nor_transformers(llama_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text('stages = ["count_flops"]\n[[models]]\nname = "l"\nsource = "hf:./llama"\n'
                                        'input_shape = [1, 64]\n')
    probe = ("import sys\nfrom rpx_core.cli import main\ncode = main(['validate', 'spec.toml'])\n"
             "print('CODE', code, 'HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1] == "CODE 0 HEAVY []", done.stdout + done.stderr


def test_a_cached_hub_config_gives_the_vocabulary_and_passes_offline(tmp_path: Path, monkeypatch) -> None:
    snapshot = tmp_path / "hub" / "models--org--tiny-llama" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({**LLAMA, "vocab_size": 500}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf.inputs("org/tiny-llama", (1, 8), {})[0].high == 500
    assert hf.check("org/tiny-llama", {}) == []
    assert hf.check("org/elsewhere", {}) != []


def test_profile_problems_are_one_line_each_naming_the_option(llama_dir: Path, tmp_path: Path) -> None:
    stage = rpx_cli("profile", "hf:./llama", "--input", "1x8", "--stages", "count_flop", cwd=tmp_path)
    assert stage.returncode == 2
    assert stage.stderr.splitlines() == [
        "rpx: error: rpx profile: --stages: unknown stage 'count_flop'; did you mean 'count_flops'? (stages: "
        "batch_search, count_flops, count_params, estimate_traffic, measure_breakdown, measure_latency, measure_serving, roofline, serve, "
        "system_card)"]
    folder = rpx_cli("profile", "hf:./nope", "--input", "1x8", cwd=tmp_path)
    assert folder.returncode == 2
    assert folder.stderr.splitlines() == [
        f"rpx: error: rpx profile: MODEL: no such folder '{tmp_path / 'nope'}' (a local hf: model is a "
        "folder holding config.json)"]


def test_the_llama2_7b_spec_matches_the_published_size_and_rpx_own_llama(monkeypatch) -> None:
    """specs/hf_llama2_7b.toml through transformers against the zoo's Llama-2-7B written from code: two independent
    implementations of one architecture give the same parameters (6,738,415,616, the published figure) and MACs."""
    from rpx_core.spec.schema import load_spec

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    spec = load_spec(Path(__file__).resolve().parents[1] / "specs" / "hf_llama2_7b.toml")
    zoo = {"name": "zoo", "source": "rpx_plugins.torch.zoo:llama", "kwargs": {"preset": "llama2-7b"},
           "meta_only": True, "inputs": [{"shape": [1, 256], "dtype": "int64", "high": 32000}]}
    data = {**spec.to_data(), "stages": ["count_params", "count_flops"], "execution": {"isolation": "in-process"}}
    data["models"] = [{**data["models"][0], "input_shape": [1, 256]}, zoo]  # a shorter sequence: a faster test
    run = run_spec(spec_from_dict(data, base_dir=spec.base_dir), output=None)
    hf_model, zoo_model = run.model("llama2-7b"), run.model("zoo")
    assert hf_model.result("count_params").total == zoo_model.result("count_params").total == 6_738_415_616
    assert hf_model.result("count_flops").macs == zoo_model.result("count_flops").macs
    assert hf_model.notes.startswith("Llama-2-7B architecture")


def test_a_hub_model_fails_fast_without_a_network(tmp_path: Path) -> None:
    """No network and no cached config: one line within seconds, not the hub client's minute of retries."""
    import time

    env = {"HF_ENDPOINT": "https://10.255.255.1", "HF_HUB_CACHE": str(tmp_path / "empty")}  # nothing answers there
    started = time.monotonic()
    done = rpx_cli("profile", "hf:gpt2", "--input", "1x8", "-o", str(tmp_path / "r.toml"), env=env, cwd=tmp_path)
    assert done.returncode == 2 and time.monotonic() - started < 15, done.stderr
    assert "'gpt2' is not in the local Hugging Face cache and the hub (https://10.255.255.1) cannot be reached" \
        in done.stderr and "hf:./folder" in done.stderr and "Traceback" not in done.stderr
