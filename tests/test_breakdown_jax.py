"""measure_breakdown on the jax backend: what XLA's profiler records is time per compiled kernel, and the kernels of
these models each run several of the operations rpx counts, so the stage says which, instead of guessing."""

from __future__ import annotations

import pytest

from rpx_core.errors import NotApplicable, UnsupportedError
from rpx_core.testing import make_context, run_stage
from rpx_plugins.breakdown.jax_stage import kernels, refusal, scope

pytest.importorskip("jax")

HLO = """HloModule jit_apply, is_scheduled=true

%fused_computation (param_0: f32[64,256], param_1: f32[256,10]) -> f32[64,10] {
  ROOT %dot_general.0 = f32[64,10]{1,0} dot(%param_0, %param_1), metadata={op_name="jit(apply)/M/fc2/dot_general"}
}

%fused_computation.3 (param_0.6: f32[64,256], param_1.9: f32[256]) -> f32[64,256] {
  %add.5 = f32[64,256]{1,0} broadcast(%param_1.9), dimensions={1}, metadata={op_name="jit(apply)/M/fc1/add"}
  %add.4 = f32[64,256]{1,0} add(%param_0.6, %add.5), metadata={op_name="jit(apply)/M/fc1/add"}
  ROOT %tanh.0 = f32[64,256]{1,0} tanh(%add.4), metadata={op_name="jit(apply)/M/jit(act)/tanh"}
}

ENTRY %main.1 (args_0_.1: f32[64,128], w: f32[256,10], b: f32[256]) -> f32[64,10] {
  %args_0_.1 = f32[64,128]{1,0} parameter(0), metadata={op_name="args[0]"}
  %w = f32[256,10]{1,0} parameter(1)
  %b = f32[256]{0} parameter(2)
  %broadcast_add_fusion.1 = f32[64,256]{1,0} fusion(%args_0_.1, %b), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(apply)/M/fc1/add"}
  ROOT %ynn_fusion = f32[64,10]{1,0} fusion(%broadcast_add_fusion.1, %w), kind=kCustom, calls=%fused_computation, metadata={op_name="jit(apply)/M/fc2/dot_general"}
}
"""


def test_the_kernels_of_a_compiled_program_and_the_operations_each_runs() -> None:
    assert kernels(HLO) == {
        "broadcast_add_fusion.1": {"jit(apply)/M/fc1/add", "jit(apply)/M/jit(act)/tanh"},
        "ynn_fusion": {"jit(apply)/M/fc2/dot_general"},
    }
    assert scope("jit(apply)/M/jit(act)/tanh") == "M" and scope("jit(apply)/M/fc1/add") == "M/fc1"
    reason = refusal(HLO)
    assert isinstance(reason, NotApplicable)
    assert "2 kernels (running several of the operations rpx counts: 1; running work of several modules: 1)" in str(
        reason)
    single = HLO.replace('ROOT %tanh.0 = f32[64,256]{1,0} tanh(%add.4), metadata={op_name="jit(apply)/M/jit(act)/tanh"}',
                         "ROOT %tanh.0 = f32[64,256]{1,0} tanh(%add.4)")
    assert isinstance(refusal(single), UnsupportedError)  # one operation per kernel: a gap, said as one


def test_a_flax_model_is_not_applicable_with_its_own_kernels_named() -> None:
    from rpx_plugins.jax import zoo

    ctx = make_context(zoo.linen_cnn(), inputs=[(8, 8, 8, 3)], stages=["measure_breakdown"], backend="jax")
    with pytest.raises(NotApplicable, match=r"XLA compiled this model into \d+ kernels .*CNN/BatchNorm_0/.*does not "
                                            r"divide it by a guess"):
        run_stage("measure_breakdown", ctx)
