"""One adapter per counting tool: run its count on a model, convert what it reports to MACs (FLOPs = 2 x MACs).

Each tool reports in its own convention, written in ``native``: torch's FlopCounterMode reports FLOPs (2 per
multiply-accumulate), fvcore calls one multiply-accumulate one "flop", ptflops and thop report MACs, calflops and
DeepSpeed report both (their MACs are used). ``macs`` is always multiply-accumulates; ``params`` is None for tools
that do not count parameters. Every adapter imports its tool lazily, so a missing tool is one line, not a crash.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from compare.models import Case


@dataclass
class Reading:
    """What one tool said about one model, converted to MACs."""

    params: int | None = None
    macs: float | None = None
    #: the tool's own list of what it did not count (unsupported operators), or other facts it printed
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    distribution: str | None  # the PyPI distribution (None: torch or rpx itself)
    device: str  # where the counted model's tensors live
    native: str  # the tool's own convention
    count: Callable[[Any, tuple, Case], Reading]


@contextlib.contextmanager
def quiet():
    """Tools print tables and warnings by default; the comparison reads their return values only."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def rpx_count(model, inputs: tuple, case: Case) -> Reading:
    import rpx_core as rpx

    with tempfile.TemporaryDirectory() as folder:
        result = rpx.profile(model, case.rpx_inputs, stages=["count_params", "count_flops"], name=case.name,
                             output=f"{folder}/results.json")
    flops = result.result("count_flops")
    notes = [f"uncounted: {', '.join(flops.uncounted_ops)}"] if flops.uncounted_ops else []
    return Reading(params=result.result("count_params").total, macs=flops.macs, notes=notes)


def flop_counter_mode(model, inputs: tuple, case: Case) -> Reading:
    import torch
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    cpu_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    notes = [f"no formula for {cpu_attention} (the CPU's SDPA kernel)"] if (
        inputs[0].device.type == "cpu" and cpu_attention not in flop_registry) else []
    return Reading(macs=counter.get_total_flops() / 2, notes=notes)


def fvcore_count(model, inputs: tuple, case: Case) -> Reading:
    from fvcore.nn import FlopCountAnalysis, parameter_count

    with quiet():
        analysis = FlopCountAnalysis(model, inputs).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        total = analysis.total()
        by_operator = analysis.by_operator()
        unsupported = analysis.unsupported_ops()
    notes = [f"counts as MACs: {', '.join(sorted(op for op in by_operator if op not in MATRIX_OPS))}"] if any(
        op not in MATRIX_OPS and by_operator[op] for op in by_operator) else []
    skipped = sorted(op for op in unsupported if any(word in op for word in ("attention", "matmul", "bmm", "einsum")))
    if skipped:
        notes.append(f"unsupported: {', '.join(skipped)}")
    return Reading(params=parameter_count(model)[""], macs=total, notes=notes)


#: fvcore's names for the operators that do matrix work
MATRIX_OPS = {"conv", "linear", "matmul", "bmm", "einsum", "addmm", "mm", "baddbmm"}


def ptflops_count(backend: str) -> Callable[[Any, tuple, Case], Reading]:
    def count(model, inputs: tuple, case: Case) -> Reading:
        from ptflops import get_model_complexity_info

        with quiet():
            macs, params = get_model_complexity_info(
                model, tuple(inputs[0].shape[1:]), input_constructor=lambda _: dict(zip(case.arg_names, inputs)),
                as_strings=False, print_per_layer_stat=False, verbose=False, backend=backend)
        if macs is None:
            return Reading(error="returned no count (it printed an error and gave None)")
        return Reading(params=int(params), macs=macs)

    return count


def thop_count(model, inputs: tuple, case: Case) -> Reading:
    from thop import profile

    with quiet():
        macs, params = profile(model, inputs=inputs, verbose=False)
    return Reading(params=int(params), macs=macs)


def calflops_count(model, inputs: tuple, case: Case) -> Reading:
    from calflops import calculate_flops

    with quiet():
        _, macs, params = calculate_flops(model=model, kwargs=dict(zip(case.arg_names, inputs)), print_results=False,
                                          print_detailed=False, output_as_string=False)
    return Reading(params=int(params), macs=macs)


def deepspeed_count(model, inputs: tuple, case: Case) -> Reading:
    from deepspeed.profiling.flops_profiler import get_model_profile

    with quiet():
        _, macs, params = get_model_profile(model, kwargs=dict(zip(case.arg_names, inputs)), print_profile=False,
                                            detailed=False, as_string=False)
    return Reading(params=int(params), macs=macs)


TOOLS: tuple[Tool, ...] = (
    Tool("rpx", None, "meta", "MACs (macs); FLOPs = 2 x MACs", rpx_count),
    Tool("FlopCounterMode (cpu)", None, "cpu", "FLOPs = 2 x MACs", flop_counter_mode),
    Tool("FlopCounterMode (meta)", None, "meta", "FLOPs = 2 x MACs", flop_counter_mode),
    Tool("fvcore", "fvcore", "cpu", "one MAC = one 'flop'", fvcore_count),
    Tool("ptflops (pytorch)", "ptflops", "cpu", "MACs", ptflops_count("pytorch")),
    Tool("ptflops (aten)", "ptflops", "cpu", "MACs", ptflops_count("aten")),
    Tool("thop", "thop", "cpu", "MACs", thop_count),
    Tool("calflops", "calflops", "cpu", "MACs and FLOPs (MACs used)", calflops_count),
    Tool("DeepSpeed", "deepspeed", "cpu", "MACs and FLOPs (MACs used)", deepspeed_count),
)


def tool(name: str) -> Tool:
    return next(t for t in TOOLS if t.name == name)
