"""Live objects through ``rpx.profile`` behave like a spec's models: a copy is counted, in eval mode, on meta where
``count_on`` allows, at the precision asked for; the caller's model is never changed; a failed stage raises."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import rpx_core as rpx
from rpx_core.api import run_spec
from rpx_core.errors import RpxError, SpecError
from rpx_core.results.records import ModelResult
from rpx_core.spec.schema import spec_from_dict

README = Path(__file__).resolve().parents[1] / "README.md"

# Linear(16, 32) -> Dropout -> Linear(32, 4) at batch 1: weights 16*32 + 32 + 32*4 + 4 = 676 elements, input 16 and
# output 4 elements, so the fused traffic (weights + inputs + outputs, each once) is 696 elements.
FUSED_ELEMENTS = 676 + 16 + 4


def mlp_with_dropout() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))


def profiled(model: torch.nn.Module, **settings: object) -> ModelResult:
    return rpx.profile(model, inputs=[(1, 16)], stages=["count_flops", "estimate_traffic"], **settings)


def test_a_copy_is_cast_to_the_precision_asked_for_and_counted_on_meta_in_eval_mode():
    model = mlp_with_dropout().train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    result = profiled(model, precision="fp16")
    flops = result.result("count_flops")
    assert result.precision == "fp16" and flops.counted_on == "meta" and flops.fallback_reason is None
    assert result.result("estimate_traffic").fused_bytes == FUSED_ELEMENTS * 2  # every tensor at 2 bytes
    assert "aten.bernoulli_" not in flops.by_operator  # eval mode: dropout is not run
    # the caller's model: same dtype, device, mode and values
    assert model.training and all(module.training for module in model.modules())
    assert all(tensor.device.type == "cpu" and tensor.dtype == torch.float32 for tensor in model.state_dict().values())
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_train_mode_is_counted_when_asked_for():
    evaluated = profiled(mlp_with_dropout()).result("count_flops")
    trained = profiled(mlp_with_dropout().eval(), options={"count_flops": {"mode": "train"}}).result("count_flops")
    # dropout in training: a mask (bernoulli_, no FLOPs), the rescale (div_) and the masking (mul), 1 FLOP per element
    # each over the 32 hidden elements
    assert trained.total_flops - evaluated.total_flops == 2 * 32
    assert {"aten.bernoulli_", "aten.div_", "aten.mul"} <= set(trained.by_operator)


def test_the_mode_option_applies_to_a_factorys_model_too():
    def flops(mode: str) -> int:
        spec = spec_from_dict({"models": [{"name": "drop", "source": "torch.nn:Dropout", "inputs": [{"shape": [1, 32]}]}],
                               "stages": ["count_flops"], "options": {"count_flops": {"mode": mode}}})
        counted = run_spec(spec, output=None, execution={"isolation": "in-process"}).model("drop").result("count_flops")
        assert counted.counted_on == "meta"
        return counted.total_flops

    assert (flops("eval"), flops("train")) == (0, 2 * 32)  # eval: identity; train: mask multiply and rescale


def test_count_on_is_honoured_for_a_live_object():
    model = mlp_with_dropout()
    on_meta = profiled(model, options={"count_flops": {"count_on": "meta"}}).result("count_flops")
    on_device = profiled(model, options={"count_flops": {"count_on": "device"}}).result("count_flops")
    assert (on_meta.counted_on, on_device.counted_on) == ("meta", "cpu")
    assert on_meta.fallback_reason is None and on_device.fallback_reason is None
    assert (on_meta.macs, on_meta.total_flops) == (on_device.macs, on_device.total_flops) == (16 * 32 + 32 * 4, 1316)


class HoldsATensor(torch.nn.Module):
    """Keeps a tensor outside its parameters and buffers, which a meta copy cannot move."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.scale = torch.full((4,), 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


def test_a_copy_that_cannot_run_on_meta_is_counted_on_the_device_with_the_reason():
    flops = rpx.profile(HoldsATensor(), inputs=[(1, 4)], stages=["count_flops"]).result("count_flops")
    assert flops.counted_on == "cpu"
    assert flops.fallback_reason.startswith("could not count on meta: CountingError: cannot count aten.mul.Tensor on "
                                            "the meta device: it mixes meta tensors with tensors on a real device")
    assert flops.fallback_reason.endswith("; counted on cpu")
    assert flops.macs == 16 and flops.other_flops == 4 + 4  # bias add and scale, 1 FLOP per output element each
    with pytest.raises(rpx.StageFailed, match=r"stage 'count_flops' failed for model 'model': CountingError"):
        rpx.profile(HoldsATensor(), inputs=[(1, 4)], stages=["count_flops"],
                    options={"count_flops": {"count_on": "meta"}})


def test_tied_weights_stay_tied_on_the_meta_copy():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 8)
            self.head = torch.nn.Linear(8, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(tokens))

    inputs = [{"shape": [1, 3], "dtype": "int64", "high": 10}]
    results = [rpx.profile(Tied(), inputs=inputs, stages=["estimate_traffic"],
                           options={"count_flops": {"count_on": where}}) for where in ("meta", "device")]
    meta, device = (result.result("estimate_traffic").fused_bytes for result in results)
    assert meta == device == 10 * 8 * 4 + 3 * 8 + 3 * 10 * 4  # one weight matrix, int64 tokens, fp32 logits


def test_without_a_precision_the_models_own_is_counted():
    result = profiled(mlp_with_dropout().to(torch.bfloat16))
    assert result.precision == "bf16"
    assert result.result("estimate_traffic").fused_bytes == FUSED_ELEMENTS * 2


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_fp8_and_int8_live_objects_are_counted_on_meta_at_one_byte_and_bounded(precision: str):
    model = mlp_with_dropout()
    result = rpx.profile(model, inputs=[(1, 16)], precision=precision, gpus=["H100-SXM"])
    flops = result.result("count_flops")
    assert flops.counted_on == "meta" and flops.counted_inputs == ("bfloat16[1,16]",)  # the 2-byte stand-in
    assert flops.total_flops == 1316  # FLOPs do not depend on the element size
    assert result.result("estimate_traffic").fused_bytes == FUSED_ELEMENTS  # 1 byte per element
    assert result.result("count_params").bytes_at_precision == 676
    bound = result.result("roofline").gpus["H100-SXM"][precision]  # the GPU's own fp8 / int8 peak
    assert bound.memory_ms_fused == pytest.approx(FUSED_ELEMENTS / (bound.bandwidth_gb_s * 1e9) * 1e3)
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(SpecError, match=f"backend 'cpu' cannot execute '{precision}' .* which stage 'count_flops' needs"):
        profiled(model, precision=precision, options={"count_flops": {"count_on": "device"}})


def test_a_failed_stage_raises_with_its_error_unless_partial_results_are_asked_for():
    with pytest.raises(rpx.StageFailed) as raised:
        rpx.profile(torch.nn.Linear(4, 4), inputs=[(1, 5)], stages=["count_params", "count_flops"])
    assert raised.value.stage == "count_flops"
    assert "mat1 and mat2 shapes cannot be multiplied" in str(raised.value)
    assert raised.value.result.stages["count_params"].status == "ok"
    assert isinstance(raised.value, RpxError)  # one line on the CLI, like every error the user can fix
    result = rpx.profile(torch.nn.Linear(4, 4), inputs=[(1, 5)], stages=["count_params", "count_flops"], partial=True)
    assert not result.ok and result.stages["count_flops"].status == "failed"
    assert result.result("count_params").total == 20


def test_the_readme_profile_example_runs_as_written_and_prints_what_it_documents():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (snippet,) = [block for block in blocks if "rpx.profile(my_module" in block]
    documented = re.findall(r"# prints: (.*)$", snippet, re.M)
    assert len(documented) == snippet.count("print(") >= 3
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, "README.md", "exec"), {})
    assert printed.getvalue().splitlines() == documented
