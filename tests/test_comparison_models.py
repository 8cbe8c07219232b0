"""The comparison's rpx column against its hand-derived values (bench/compare), and how the table explains a tool's
difference. The comparison tools themselves are not installed here: the full comparison is a benchmark
(``python3 bench/compare/run.py``), not a test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from compare.models import CASES, CHEAP, case  # noqa: E402
from compare.report import macs_reason, params_reason  # noqa: E402

import rpx_core as rpx  # noqa: E402


@pytest.mark.parametrize("name", CHEAP)
def test_rpx_counts_equal_the_hand_derived_values(name: str) -> None:
    model = case(name)
    result = rpx.profile(model.build("meta"), model.rpx_inputs, stages=["count_params", "count_flops"], name=name)
    flops = result.result("count_flops")
    assert result.result("count_params").total == model.analytic.params
    assert flops.macs == model.analytic.macs
    assert flops.matrix_flops == 2 * model.analytic.macs
    assert flops.uncounted_ops == {}


@pytest.mark.parametrize("name", CHEAP)
def test_hand_derived_parameters_equal_torchs_own_count(name: str) -> None:
    """torch's parameters() yields a shared weight once: an independent check of the hand derivation."""
    model = case(name)
    assert sum(p.numel() for p in model.build("meta").parameters()) == model.analytic.params


def test_the_set_covers_what_the_comparison_promises() -> None:
    assert len(CASES) >= 8
    assert {c.name for c in CASES} >= {"grouped-cnn", "depthwise-cnn", "vit", "bert-128", "bert-512", "llama-128",
                                       "llama-512", "sdpa", "tied-lm"}
    assert case("tied-lm").analytic.shared_params > 0 and case("sdpa").analytic.attention_macs > 0


def test_reasons_name_the_convention_the_missed_kernel_and_the_tied_weight() -> None:
    llama, tied = case("llama-128").analytic, case("tied-lm").analytic
    assert macs_reason(llama.macs, llama) is None
    assert macs_reason(2 * llama.macs, llama) == "reports FLOPs (2 x MACs) as MACs"
    assert macs_reason(llama.macs - llama.attention_macs, llama) == "attention kernel (SDPA) not counted"
    assert macs_reason(0.5 * llama.macs, llama) == "-50.0%: attention (SDPA) and more not counted"
    added = 1.01 * (llama.macs - llama.attention_macs)
    assert macs_reason(added, llama) == ("attention kernel (SDPA) not counted, and +1.0% element-wise, norm or pooling "
                                         "work counted as MACs")
    assert macs_reason(1.05 * llama.macs, llama).startswith("+5.0%: counts element-wise")
    assert params_reason(tied.params + tied.shared_params, tied) == "tied weight counted twice"
    assert params_reason(tied.params, tied) is None
