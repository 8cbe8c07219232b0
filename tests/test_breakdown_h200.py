"""The breakdown over torch.profiler traces recorded on an NVIDIA H200 (tests/data/h200-profiles: BERT-base bf16 at
128 tokens, torchvision's ResNet-50 fp16, a 4-layer Llama-2-7B-shaped prefill of 2,048 tokens; batch 1, inference
mode, after warm-up), joined with the counter's calls of the same models counted here on meta. The traces were taken
without rpx's marker, so each whole trace is the call; the per-call medians beside them were timed without the
profiler. The GPU's kernels are attributed to their operators and modules here, on the CPU.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rpx_core.testing import default_plugins
from rpx_core.types.breakdown import IDLE_ROW, BreakdownOptions, StageCost
from rpx_plugins.breakdown.attribution import Measured, attribute, breakdown
from rpx_plugins.breakdown.rows import Roof
from rpx_plugins.breakdown.torch_ops import decomposes, free
from rpx_plugins.breakdown.trace import load_events, read_calls
from tests.h200_models import MEDIANS_MS, PROFILES, counted_calls

BERT, RESNET, LLAMA = "bert-base-bf16-s128-b1", "resnet50-fp16-b1", "llama7b-4l-bf16-prefill2048"
PRECISION = {BERT: "bf16", RESNET: "fp16", LLAMA: "bf16"}


def h200(precision: str) -> Roof:
    gpu = default_plugins().gpu_catalog().get("H200-SXM")
    return Roof(gpu.peak_flops(precision), gpu.bandwidth_bytes_s)


def result_of(name: str):  # noqa: ANN201
    return breakdown(load_events(PROFILES / f"{name}.json.gz"), counted_calls(name), Measured(MEDIANS_MS[name], 30, ""),
                     decomposes=decomposes, free=free, roof=h200(PRECISION[name]), bound_convention="H200",
                     options=BreakdownOptions(), cost=StageCost(0, 0, 0, 0, 0))


def kernels_of(name: str) -> list[tuple[str, str | None, str | None]]:
    """(kernel, operator, module) of every device activity of the recorded call."""
    (trace,) = read_calls(load_events(PROFILES / f"{name}.json.gz"), decomposes)
    joined = attribute(trace, counted_calls(name), free)
    return [(activity.name, None if activity.op is None else trace.ops[activity.op].name,
             None if activity.op is None else joined.modules[activity.op]) for activity in trace.activities]


@pytest.mark.parametrize("name", [BERT, RESNET, LLAMA])
def test_each_recorded_call_adds_up_to_its_median_with_every_kernel_attributed(name: str) -> None:
    result = result_of(name)
    median = MEDIANS_MS[name]
    assert result.busy_ms < median and result.total_ms == median  # the idle row holds the rest
    assert sum(row.time_ms for row in result.operators) == pytest.approx(median, rel=1e-9)
    assert sum(row.time_ms for row in result.modules if row.parent is None) == pytest.approx(median, rel=1e-9)
    assert result.unattributed == ()  # every kernel, memset and copy has the operator that launched it
    for row in result.modules:
        if row.self_ms is not None:
            children = sum(child.time_ms for child in result.modules if child.parent == row.name)
            assert row.time_ms == pytest.approx(row.self_ms + children, abs=1e-9)


def test_all_but_the_rotary_embedding_of_the_llama_prefill_matched_its_counted_calls() -> None:
    """The H200 ran an older transformers, whose rotary embedding casts its frequencies after expanding them and
    multiplies them by the positions with a bmm, where this one casts first and multiplies elementwise: those two
    calls match nothing, on either side, and are said; the module of the unmatched cast, which ran before the first
    matched call of rotary_emb, is the one both its neighbours are in."""
    result = result_of(LLAMA)
    assert (result.unmatched_profiled, result.unmatched_counted) == (2, 2)
    uncounted = {row.name: row.module for row in result.signatures if not row.counted}
    assert uncounted == {"aten.bmm": "rotary_emb", "aten._to_copy": "(root)"}
    names = [row.name for row in result.operators]
    assert len(names) == len(set(names))  # one row per operator, counted or not
    partly = {row.name: row.bytes for row in result.operators if not row.counted and row.name != IDLE_ROW}
    assert partly["aten.bmm"] is None and partly["aten._to_copy"] > 0 and len(partly) == 2  # 21 of 22 casts counted (bytes: a copy has no FLOPs)
    assert any("2 counted call(s) were not found in the profile (aten._to_copy, aten.mul)" in note
               for note in result.notes)
    for other in (BERT, RESNET):
        assert (result_of(other).unmatched_profiled, result_of(other).unmatched_counted) == (0, 0)


def test_cublas_kernels_go_to_the_matmul_of_each_projection() -> None:
    kernels = kernels_of(LLAMA)
    nvjet = [(op, module) for kernel, op, module in kernels if kernel.startswith("nvjet_")]
    assert len(nvjet) == 28 and {op for op, _ in nvjet} == {"aten.mm"}  # 7 projections x 4 layers
    assert Counter(re.sub(r"layers\.\d+\.", "", module) for _, module in nvjet) == Counter(
        {f"self_attn.{p}_proj": 4 for p in "qkvo"} | {f"mlp.{p}_proj": 4 for p in ("gate", "up", "down")})
    memsets = [op for kernel, op, _ in kernels if kernel == "Memset (Device)"]
    assert Counter(memsets) == {"aten.mm": 8, "aten._scaled_dot_product_cudnn_attention": 4}
    bert = [(kernel, op) for kernel, op, _ in kernels_of(BERT) if kernel.startswith(("nvjet_", "void cublasLt"))]
    assert {op for _, op in bert} == {"aten.addmm"} and len(bert) == 85  # split-K reductions with their GEMMs


def test_cudnn_flash_attention_goes_to_the_attention_of_each_layer_in_order() -> None:
    for name, module in ((LLAMA, "layers.{}.self_attn"), (BERT, "encoder.layer.{}.attention.self")):
        flash = [(op, owner) for kernel, op, owner in kernels_of(name)
                 if kernel.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_fprop")]
        layers = 4 if name == LLAMA else 12
        assert flash == [("aten._scaled_dot_product_cudnn_attention", module.format(i)) for i in range(layers)]


def test_elementwise_kernels_go_to_their_operators_and_modules() -> None:
    kernels = kernels_of(LLAMA)
    norms = Counter(op for _, op, module in kernels if module and module.endswith("layernorm"))
    assert norms == {"aten._to_copy": 16, "aten.pow": 8, "aten.mean": 8, "aten.add": 8, "aten.rsqrt": 8,
                     "aten.mul": 16}  # RMSNorm in float32, twice per layer
    act = [(kernel, op) for kernel, op, module in kernels if module and module.endswith("mlp.act_fn")]
    assert len(act) == 4 and {op for _, op in act} == {"aten.silu"}
    assert all("elementwise" in kernel for kernel, _ in act)
    resnet = Counter(op for _, op, _ in kernels_of(RESNET))
    assert resnet == {"aten.native_batch_norm": 159, "aten.convolution": 115, "aten.relu_": 49, "aten.add_": 16,
                      "aten.max_pool2d_with_indices": 1, "aten.mean": 1, "aten.addmm": 1}
    conv_kernels = [kernel for kernel, op, _ in kernels_of(RESNET) if op == "aten.convolution"]
    assert any(k.startswith("nvjet_sm90_hsh") for k in conv_kernels)  # cuBLAS inside cuDNN's convolution
    assert any(k.startswith("void cudnn::engines_precompiled::nchwToNhwcKernel") for k in conv_kernels)  # its layout
    assert any("implicit_gemm" in k or "cutlass" in k for k in conv_kernels)  # transposes and GEMMs are its own


def test_the_llama_prefills_large_matmuls_reach_half_their_bound_and_resnet_at_batch_1_waits_for_launches() -> None:
    llama = result_of(LLAMA)
    large = [row for row in llama.signatures if row.name == "aten.mm" and row.flops / row.calls > 5e10]  # 69-185 GFLOP each
    assert len(large) == 7 and all(0.5 <= row.fraction <= 1 and row.limited_by == "compute" for row in large)
    assert llama.busy_ms / llama.total_ms > 0.85
    resnet = result_of(RESNET)
    assert resnet.idle_ms / resnet.total_ms > 0.75  # 4.7 ms per call, 0.9 ms of it kernels
    top = max((row for row in resnet.operators if row.excess_ms is not None), key=lambda row: row.excess_ms)
    assert top.name == "aten.convolution" and top.limited_by == "overhead"


def test_which_profiled_names_decompose_and_which_cost_nothing() -> None:
    """torch's dispatcher decides: composite operators decompose above the counter's level; views, metadata queries
    and empty allocations cost nothing; a name torch does not know (a label) is neither."""
    assert [decomposes(name) for name in ("aten::linear", "aten::to", "aten::scaled_dot_product_attention",
                                          "aten::conv2d", "aten::batch_norm")] == [True] * 5
    assert [decomposes(name) for name in ("aten::mm", "aten::_to_copy", "aten::convolution", "aten::_convolution",
                                          "aten::_scaled_dot_product_cudnn_attention", "ProfilerStep#1")] == [False] * 6
    assert [free(name) for name in ("aten::view", "aten.t", "aten::slice", "aten::empty", "aten::detach_")] == [True] * 5
    assert [free(name) for name in ("aten::mm", "aten::zeros", "aten::_to_copy", "my label")] == [False] * 4
