"""Tier 1 results: hardware-agnostic counts of one pass of a model (parameters, FLOPs, bytes moved, activation memory).

Conventions shared by every figure here:

* FLOPs = 2 x MACs for matrix work (matmul, convolution, attention), the convention of torch's FlopCounterMode,
  calflops and DeepSpeed. ``macs`` counts matrix multiply-accumulates only. Every other op (elementwise, norms,
  softmax, pooling, reductions) is costed from a documented per-element table and reported as ``other_flops``, never
  folded into the matrix figures.
* Bytes are element_size x element count at each tensor's real dtype; 1 GB = 1e9 bytes wherever GB appears.
* A count is an exact integer for the pass that ran: batch size and sequence length are those of the given inputs.

Plain attrs classes without torch, so the CLI can load, convert and print them without importing heavy libraries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from rpx_core import convert

#: The ``module`` of ops that ran outside every submodule, in the top-level model's own forward.
ROOT_MODULE = "(root)"
#: The ``module`` of ops that ran during the backward pass (autograd runs outside module forwards).
BACKWARD_MODULE = "(backward)"
#: The entry that collects the modules or operators left out of a size-limited breakdown, so sums stay exact.
OTHERS = "(others)"


def tensor_text(dtype: Any, shape: Any) -> str:
    """One tensor as rpx writes every shape, whatever the framework: ``float32[1,3,32,32]`` (the dtype's name without
    a ``torch.`` prefix, dimensions without spaces), so figures from torch and JAX runs of one model compare."""
    return f"{str(dtype).removeprefix('torch.')}[{','.join(str(int(dim)) for dim in shape)}]"


def inputs_text(args: Any, kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """Each array-like input (anything with ``shape`` and ``dtype``: torch tensors, JAX arrays, ShapeDtypeStructs)
    in :func:`tensor_text` form, positional then keyword (``"mask=bool[1,128]"``), looking inside tuples, lists and
    dicts; other values (flags such as ``use_cache=True``) are not inputs of a shape and are left out."""
    return (*(text for value in args for text in _arrays_text(value)),
            *(f"{name}={text}" for name, value in kwargs.items() for text in _arrays_text(value)))


def _arrays_text(value: Any) -> list[str]:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [tensor_text(value.dtype, value.shape)]
    if isinstance(value, (tuple, list)):
        return [text for item in value for text in _arrays_text(item)]
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _arrays_text(item)]
    return []


@attrs.frozen
class OpRecord:
    """Identical calls of one aten operator, aggregated: the figures are for ONE call, ``count`` says how many ran.

    A per-operator roofline sums ``count x max(flops / peak, (bytes_read + bytes_written) / bandwidth)`` over records;
    max() is not additive, which is why records keep one call's figures instead of totals.
    """

    op: str  # aten operator, e.g. "aten.mm" (all overloads of one operator share a name)
    module: str  # innermost module path; list indices become "*" when identical calls from several layers merge
    count: int  # number of identical calls (same operator, phase, input shapes/dtypes and arguments)
    flops: int  # FLOPs of one call: matrix FLOPs (2 x macs) + other FLOPs
    macs: int  # multiply-accumulates of one call (matrix work only; 0 for non-matrix ops)
    bytes_read: int  # bytes one call reads: its input tensors (weights and activations), views counted at their extent
    bytes_written: int  # bytes one call writes: its output tensors (0 for views and empty allocations)
    phase: str = "forward"  # "forward" or "backward"
    inputs: str = ""  # input tensors of the call, e.g. "float32[8,64], float32[64,256]"


@attrs.frozen
class OperatorStats:
    """Totals of one aten operator over the whole pass."""

    calls: int  # number of calls
    matrix_flops: int  # FLOPs of matrix work, 2 x MACs
    other_flops: int  # FLOPs from the per-element cost table
    bytes_read: int  # bytes read, summed over calls (unfused)
    bytes_written: int  # bytes written, summed over calls (unfused)


@attrs.frozen
class ModuleStats:
    """FLOPs and bytes of one module path. Exclusive figures sum to the pass totals; inclusive ones nest."""

    calls: int  # forward calls of this module path (0 for the "(root)"/"(backward)"/"(others)" pseudo-entries)
    exclusive_matrix_flops: int  # matrix FLOPs of ops that ran while this was the innermost module
    exclusive_other_flops: int  # other FLOPs of ops that ran while this was the innermost module
    exclusive_bytes_read: int  # bytes read by those ops
    exclusive_bytes_written: int  # bytes written by those ops
    inclusive_flops: int  # matrix + other FLOPs of this module and every module under it
    inclusive_bytes: int  # bytes read + written by this module and every module under it


@attrs.frozen
class CompilerFigures:
    """A compiler's own cost figures for the counted program, beside rpx's (XLA's ``cost_analysis`` and
    ``memory_analysis`` of the compiled, fused program). Information only: nothing else uses them; ``differences``
    says in words why they differ from rpx's counts."""

    source: str  # e.g. "XLA cost_analysis() of the compiled program on cpu, per device"
    flops: float | None = None  # the compiler's FLOPs (XLA: includes type conversions, a loop body once)
    transcendentals: float | None = None  # its count of transcendental elements (exp, log, tanh, rsqrt, ...)
    bytes_accessed: float | None = None  # bytes its fused kernels read and write
    temp_bytes: int | None = None  # scratch buffers of the compiled program
    output_bytes: int | None = None  # output buffers of the compiled program
    rpx_transcendentals: int | None = None  # rpx's count of the same elements (included in other_flops at 1 each)
    differences: tuple[str, ...] = ()  # why these differ from rpx's figures, one reason per line
    error: str | None = None  # why there are no figures (the program did not compile here)


@attrs.frozen
class FlopsResult:
    """FLOPs and MACs of one forward pass (or forward + backward), with where they came from."""

    matrix_flops: int  # matmul/convolution/attention FLOPs, 2 x macs
    other_flops: int  # elementwise/norm/softmax/pooling/reduction FLOPs, per-element table (other_flops_convention)
    total_flops: int  # matrix_flops + other_flops
    macs: int  # multiply-accumulates of matrix work only
    by_operator: dict[str, OperatorStats]  # aten operator -> totals, largest first (see top_k)
    by_module: dict[str, ModuleStats]  # module path -> totals, in call order (see module_depth, top_k)
    by_phase: dict[str, int]  # "forward"/"backward" -> total FLOPs of that phase
    uncounted_ops: dict[str, int]  # operator -> calls of ops that ran without a FLOP formula (NOT in the totals)
    causal_mask_convention: str  # how causal/masked attention is counted
    other_flops_convention: str  # the per-element cost table behind other_flops
    backward: bool  # True if the counts include a backward pass
    counted_on: str  # device type of the counted tensors: "cpu", "meta", "cuda", ...
    module_depth: int  # module paths deeper than this many components are folded into their ancestor
    top_k: int | None = None  # by_operator/by_module keep this many largest entries, the rest summed in "(others)"
    #: The counted pass's input tensors, positional then keyword ("name=..."), e.g. ("int64[1,2048]",); () if unknown.
    counted_inputs: tuple[str, ...] = ()
    #: Batch size of the counted pass (the spec's batch dimension); None when no input has a batch dimension.
    counted_batch_size: int | None = None
    #: Why the pass was not counted where asked ("could not count on meta: <error>; counted on cpu"); None if it was.
    fallback_reason: str | None = None
    #: Operators priced by a plugin's formula (rpx_register_op_formulas) -> that plugin; empty when none was.
    plugin_formulas: dict[str, str] = attrs.Factory(dict)
    #: Devices the counted program runs on (a sharded or shard_map program's mesh); None for one device.
    devices: int | None = None
    #: total_flops / devices: exact for shard_map/pmap bodies and evenly sharded programs; None for one device.
    per_device_flops: int | None = None
    #: How control flow and custom kernels were counted, one line each (cond branches, while trip counts, kernels).
    control_flow: tuple[str, ...] = ()
    #: The compiler's own figures for the same program (JAX: XLA's), with the differences explained.
    compiler_figures: CompilerFigures | None = None
    #: Layers whose count was replayed from identical layers traced in full (torch on meta), one line per group.
    replayed: tuple[str, ...] = ()


@attrs.frozen
class TrafficResult:
    """Bytes moved by one pass and its activation memory, at the tensors' real dtypes."""

    unfused_bytes: int  # upper bound: sum over ops of bytes read + written (every op round-trips memory)
    unfused_weight_read_bytes: int  # part of unfused_bytes: parameter/buffer reads (read by two ops: counted twice)
    unfused_activation_read_bytes: int  # part of unfused_bytes: reads of everything that is not a parameter/buffer
    unfused_written_bytes: int  # part of unfused_bytes: writes
    fused_bytes: int  # lower bound: weight_bytes + input_bytes + output_bytes (+ weight gradients if backward)
    weight_bytes: int  # parameters/buffers the pass read, each storage once (shared/tied weights once)
    input_bytes: int  # model input tensors, each storage once, less storages already counted as weights
    output_bytes: int  # model output tensors, each storage once, less storages already counted as inputs or weights
    activation_peak_bytes: int  # peak of live activation storage bytes during the forward pass (see assumptions)
    activation_peak_bytes_fp16: int  # the same peak if every floating-point activation were 2 bytes per element
    assumptions: tuple[str, ...]  # conventions behind these figures, in words
    op_records: tuple[OpRecord, ...]  # per-call records for the per-operator roofline, largest bytes x count first
    gradient_bytes: int | None = None  # parameter gradients written once, included in fused_bytes (backward only)
    arithmetic_intensity_unfused: float | None = None  # total FLOPs / unfused_bytes, FLOP per byte (None if no bytes)
    arithmetic_intensity_fused: float | None = None  # total FLOPs / fused_bytes, FLOP per byte (None if no bytes)


@attrs.frozen
class ParamsResult:
    """Parameter and buffer counts of a model (element counts), and their bytes at the run's precision."""

    total: int  # parameter elements, shared/tied parameters once (trainable + non_trainable)
    trainable: int  # elements of parameters with requires_grad
    non_trainable: int  # elements of parameters without requires_grad
    buffers: int  # buffer elements (e.g. batch-norm running statistics), shared buffers once
    bytes_at_precision: int  # parameters + buffers, floating tensors at the precision's element size, others as stored
    precision: str  # the precision bytes_at_precision assumes: fp32/tf32 4 bytes, fp16/bf16 2, fp8/int8 1
    #: Elements of arrays the model's function closes over (JAX constants): neither parameters nor buffers, not in
    #: ``total`` or ``bytes_at_precision``; None where the backend has no such notion.
    constants: int | None = None
    constant_bytes: int | None = None  # their bytes at their own dtype (they are baked into the program as they are)
    notes: tuple[str, ...] = ()  # caveats, e.g. constants that stay float32 at a bf16 precision


@attrs.frozen
class CountOptions:
    """Options of ``count_flops`` (``[options.count_flops]``); ``estimate_traffic`` shares its counting pass and these."""

    #: "meta": build the model on the meta device (no weights allocated, any size fits); "device": count a real pass on
    #: the job's device; "auto": meta, falling back to the device when the model cannot be built or run on meta.
    count_on: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "meta", "device")))
    #: Module mode of the counted pass: "eval" (as measured; dropout is a no-op, batch norm uses its running statistics)
    #: or "train" (dropout masks and batch-norm statistics are counted), for factories' models and live objects alike.
    mode: str = attrs.field(default="eval", validator=convert.one_of("eval", "train"))
    backward: bool = False  # count forward + backward (gradient of the summed outputs) instead of forward only
    #: Batch size of the counted pass; None counts the inputs as the spec writes them (an input_factory gets 1).
    batch_size: int | None = attrs.field(default=None, validator=convert.batch_size)
    top_k: int = attrs.field(default=20, validator=attrs.validators.ge(1))  # operators/modules listed; the rest folded
    module_depth: int = attrs.field(default=3, validator=attrs.validators.ge(1))  # deeper module paths fold into ancestors
    #: How the backward of a fused attention kernel (flash, efficient, cuDNN, CPU flash) is counted, with backward:
    #: "without_recompute" (2x the forward MACs: dQ, dK, dV, dP; the work of the math path's backward, which stores
    #: the probabilities) or "with_recompute" (adds the scores QK^T recomputed from Q and K and the probabilities from
    #: the saved log-sum-exp, as flash and efficient kernels do; torch's FlopCounterMode convention for those kernels).
    attention_backward: str = attrs.field(default="without_recompute", validator=convert.one_of("without_recompute",
                                                                                         "with_recompute"))
    #: JAX: iterations to count a ``while`` loop whose trip count is not static (an upper bound you choose); such a
    #: loop is refused without it. Loops with a static trip count are always counted exactly.
    while_iterations: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(0)))
    #: torch on meta: count identical layers of a stack by replaying two agreeing full traces (the same figures;
    #: see rpx_plugins.torch.counter.repeats); false traces every layer.
    replay_repeats: bool = True


T = TypeVar("T")


def fold_largest(
    entries: Mapping[str, T],
    top_k: int | None,
    key: Callable[[T], Any],
    merge: Callable[[list[T]], T],
    others_name: str = OTHERS,
) -> dict[str, T]:
    """The ``top_k`` entries with the largest ``key`` (ties: earlier first), in their given order, and the rest merged
    into one ``others_name`` entry, so a breakdown can be short while its sums stay exact. None keeps every entry."""
    if top_k is None or len(entries) <= top_k:
        return dict(entries)
    keep = set(sorted(entries, key=lambda name: key(entries[name]), reverse=True)[:top_k])
    kept = {name: value for name, value in entries.items() if name in keep}
    kept[others_name] = merge([value for name, value in entries.items() if name not in keep])
    return kept
