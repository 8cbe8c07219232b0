"""The Python API and the spec features around it: live objects, model files, input factories, user GPU packs."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import rpx_core as rpx
from rpx_core import __version__
from rpx_core.errors import RpxError
from rpx_core.registry.manager import Plugins
from tests.conftest import rpx_cli


def test_profile_a_live_module_with_hand_computed_counts():
    model = torch.nn.Linear(16, 8)
    result = rpx.profile(model, inputs=[(4, 16)], stages=["count_params", "count_flops"])
    assert result.result("count_params").total == 16 * 8 + 8
    flops = result.result("count_flops")
    assert flops.macs == 4 * 16 * 8  # batch x in x out multiply-accumulates
    assert flops.matrix_flops == 2 * flops.macs
    assert result.summary["params_m"] == pytest.approx(136 / 1e6)


MODEL_FILE = """
import torch

class Scale(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x, *, scale):
        return self.proj(x) * scale

def build(width):
    return Scale(width)

def make_inputs(batch_size, device, dtype):
    x = torch.ones(batch_size, 32, device=device, dtype=dtype)
    return (x,), {"scale": torch.full((1,), 2.0, device=device, dtype=dtype)}
"""


def test_model_file_and_input_factory_resolve_against_the_spec_folder(tmp_path, write_spec):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "scale.py").write_text(textwrap.dedent(MODEL_FILE))
    spec = write_spec("""
        stages = ["count_flops"]
        [[models]]
        name = "scale"
        source = "models/scale.py:build"
        kwargs = { width = 32 }
        input_factory = "models/scale.py:make_inputs"
    """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = rpx_cli("run", str(spec), "-o", str(tmp_path / "out.json"), cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    flops = rpx.load_results(tmp_path / "out.json").model("scale").result("count_flops")
    assert flops.macs == 1 * 32 * 32  # one row through a 32x32 projection
    assert flops.other_flops == 32  # the elementwise scale: 1 FLOP per output element


PACK = """
[pack]
name = "mine"
version = "1"
source = "my lab's measurements"

[[gpu]]
name = "{name}"
vendor = "NVIDIA"
segment = "datacenter"
memory_gb = 80
memory_type = "HBM3"
bandwidth_gb_s = 3000
source = "measured"

[gpu.peaks.fp32]
tflops = 50
"""


def roofline_spec(extra: str = "") -> str:
    return f"""
        stages = ["roofline"]
        gpus = ["My-GPU"]
        {extra}
        [[models]]
        name = "lin"
        source = "torch.nn:Linear"
        kwargs = {{ in_features = 64, out_features = 64 }}
        inputs = [{{ shape = [8, 64] }}]
    """


def test_user_gpu_pack_from_the_spec_and_from_the_environment(tmp_path, write_spec):
    (tmp_path / "mine.toml").write_text(PACK.format(name="My-GPU"))
    from_spec = rpx.run(write_spec(roofline_spec('gpu_packs = ["mine.toml"]')), output=None)
    bound = from_spec.model("lin").result("roofline").gpus["My-GPU"]["fp32"]
    assert bound.peak_tflops == 50 and bound.bandwidth_gb_s == 3000
    assert bound.compute_ms == pytest.approx(from_spec.model("lin").result("count_flops").total_flops / 50e12 * 1e3)
    listed = rpx_cli("gpus", env={"RPX_GPU_PACKS": str(tmp_path / "mine.toml")})
    assert any(line.startswith("My-GPU ") and "mine (" in line for line in listed.stdout.splitlines())


def test_user_pack_clashing_with_the_reference_pack_needs_a_choice(tmp_path, write_spec):
    (tmp_path / "mine.toml").write_text(PACK.format(name="H100-SXM"))
    clash = roofline_spec('gpu_packs = ["mine.toml"]').replace("My-GPU", "H100-SXM")
    with pytest.raises(RpxError, match=rf"GPU 'H100-SXM' is defined by pack reference \(rpx {re.escape(__version__)}\) and pack mine"):
        rpx.run(write_spec(clash), output=None)
    chosen = roofline_spec('gpu_packs = ["mine.toml"]\nchoose = { gpus = { "H100-SXM" = "mine" } }').replace("My-GPU", "H100-SXM")
    run = rpx.run(write_spec(chosen, "chosen.toml"), output=None)
    assert run.model("lin").result("roofline").gpus["H100-SXM"]["fp32"].peak_tflops == 50


def test_every_builtin_stage_is_documented_and_implemented():
    plugins = Plugins.load()
    stages = plugins.stages()
    from rpx_plugins.stages import BUILTIN_STAGES

    assert set(stages) == {stage.name for stage in BUILTIN_STAGES} >= {
        "count_params", "count_flops", "estimate_traffic", "roofline", "system_card", "measure_latency",
        "batch_search", "serve", "measure_serving", "measure_breakdown"}
    for name in stages:
        stage = stages[name]
        assert stage.doc and stage.description, f"stage {name} is undocumented"
        assert stage.result is not None, f"stage {name} declares no result type"
        implementers = [info.name for info in plugins.infos() if stage.hook in info.hooks and info.builtin]
        assert implementers, f"no built-in plugin implements {stage.hook}"