"""Tier 3 types of ``measure_breakdown``: where one call's time goes, each operator and module against its own bound.

Conventions shared by every figure here:

* Times are milliseconds of ONE call at batch 1. An operator's time is the device time of the work it launched in one
  profiled call (on a GPU: the durations of its kernels, memsets and copies, as the profiler recorded them; on the
  CPU: the host time of the operator itself); where two activities overlap, the overlap is split evenly between them,
  so operator times add up to the time the device was busy.
* ``call_ms`` is the median of calls timed WITHOUT the profiler (the profiler slows the host, not the kernels).
  The time no operator accounts for is ``idle_ms`` = ``call_ms`` - busy time: host gaps, launch overhead, waiting.
  The rows of each table (the unattributed rows included) add up to ``total_ms``, which is ``call_ms`` unless the
  profiled operators alone took longer (then ``notes`` says so and by how much).
* Counted figures are the counter's for the same calls (FLOPs = 2 x MACs for matrix work plus the per-element table
  of other work; bytes read + written, unfused: every operator round-trips memory), matched to profiled operators as
  ``matching`` states.
* An operator's bound is max(FLOPs / peak, bytes / bandwidth) per call on the GPU the job ran on, at the run's
  precision (the roofline stage's per-operator bound, bound (3)); a row's bound is the sum over its calls.
  ``fraction`` = bound / measured (1.0 = at the roofline; above 1, the kernels moved fewer bytes than the unfused
  count, which charges every operator its inputs and outputs, says: cache hits). ``limited_by`` is the bound's roof
  (compute or memory) when the row runs within ``1 / overhead_below`` of its bound, else "overhead": neither roof
  explains its time (fixed per-kernel costs, launch latency, host work).

Plain attrs classes without torch, so the CLI can load, convert and print them without importing heavy libraries.
"""

from __future__ import annotations

import attrs

from rpx_core.spec.limits import seconds_validator

_positive = attrs.validators.gt(0)
_non_negative = attrs.validators.ge(0)

#: Name of the row holding the time no operator accounts for (host gaps, launch overhead, idle device).
IDLE_ROW = "(idle: host gaps, launch overhead)"
#: Name of the row holding device work the profiler recorded without an operator that launched it.
NO_OPERATOR_ROW = "(kernels without an operator)"
PSEUDO_ROWS = (IDLE_ROW, NO_OPERATOR_ROW)


@attrs.frozen
class BreakdownOptions:
    """The spec's ``[options.measure_breakdown]`` table."""

    #: Untimed calls before anything is measured (first calls pay for allocation, compilation, autotuning).
    warmup_calls: int = attrs.field(default=5, validator=_non_negative)
    #: ... and at least this many seconds of them.
    warmup_seconds: float = attrs.field(default=0.2, validator=seconds_validator(allow_zero=True))
    #: Calls timed without the profiler; their median is the measured call the rows add up to.
    reference_calls: int = attrs.field(default=20, validator=_positive)
    #: Seconds the reference calls may take (at least one is always timed).
    max_seconds: float = attrs.field(default=5.0, validator=seconds_validator())
    #: Calls profiled one after the other; each operator's time is its median over them (when one ran other
    #: operators, the call whose device was busy for the median time is reported). More calls steady the breakdown
    #: on a noisy machine; each costs one more profiled call.
    profiled_calls: int = attrs.field(default=1, validator=_positive)
    #: Module paths deeper than this many components are folded into their ancestor (as count_flops does).
    module_depth: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    #: A row whose bound is below this fraction of its measured time is limited by "overhead", not by a roof.
    overhead_below: float = attrs.field(default=0.1, validator=[_positive, attrs.validators.le(1)])


@attrs.frozen
class TimeRow:
    """One operator, call signature or module of the profiled call: measured time beside counted work and its bound.

    Counted figures, the bound and what derives from them are None where the row has none (an operator the counter
    did not see, a pseudo-row), never zero. They cover the row's counted calls (all of them when ``counted``), and
    the achieved rates and ``fraction`` set them against those calls' own time.
    """

    name: str  # "aten.mm"; a module path; or one of PSEUDO_ROWS
    calls: int  # operator calls (module rows: operator calls under the module)
    time_ms: float  # measured time in one call, ms
    share: float  # time_ms / the table's total_ms
    kernels: int = 0  # device activities attributed (GPU kernels, memsets, copies; on the CPU the operator calls)
    idle_before_ms: float = 0.0  # profiled call: device idle right before this row's kernels (waiting for launches)
    counted: bool = False  # True when counted figures were matched to every call of the row
    flops: int | None = None  # counted FLOPs of these calls (FLOPs = 2 x MACs + other FLOPs)
    bytes: int | None = None  # counted bytes read + written by these calls (unfused)
    flops_per_s: float | None = None  # achieved: flops / time
    bytes_per_s: float | None = None  # achieved: bytes / time
    bound_ms: float | None = None  # sum over calls of max(FLOPs / peak, bytes / bandwidth) on the local GPU
    bottleneck: str | None = None  # the roof of the bound: "compute" or "memory"
    fraction: float | None = None  # bound_ms / time_ms
    limited_by: str | None = None  # "compute", "memory" or "overhead" (see the module docstring)
    inputs: str = ""  # signature rows: the input tensors of each call, e.g. "bfloat16[2048,4096], bfloat16[4096,11008]"
    module: str = ""  # signature rows: the module path of the calls ("layers.*.mlp" when several layers')
    parent: str | None = None  # module rows: the enclosing module's row name (None for the top)
    self_ms: float | None = None  # module rows: time of operators directly in this module, not in a child

    @property
    def excess_ms(self) -> float | None:
        """Measured time above the bound: what a perfect kernel would save here."""
        return None if self.bound_ms is None else self.time_ms - self.bound_ms


@attrs.frozen
class StageCost:
    """What the breakdown itself cost, in host seconds, by phase: it is one profiled call per job, plus these."""

    warmup_seconds: float  # untimed calls before measuring
    reference_seconds: float  # the calls timed without the profiler (and one collection of Python's garbage first)
    counting_seconds: float  # the counter's pass over the same call, on the device, in call order
    profiling_seconds: float  # the profiler's warm-up call and the profiled calls, trace export included
    attribution_seconds: float  # reading the trace, matching operators, building the tables


@attrs.frozen
class BreakdownResult:
    """One call's time by operator, call signature and module, each against its own bound (see the module docstring)."""

    call_ms: float  # median of the reference calls, timed without the profiler
    call_samples: int  # reference calls timed
    clock: str  # how the reference calls were timed
    total_ms: float  # what each table's rows add up to: call_ms, or the busy time when that exceeded it
    busy_ms: float  # device busy time in the profiled call (union of its activities)
    idle_ms: float  # total_ms - busy_ms: the time no operator accounts for
    profiled_ms: float  # wall time of the profiled call, the median of several (the profiler slows the host)
    profiled_idle_ms: float  # device idle in the profiled call, for comparison with idle_ms
    operators: tuple[TimeRow, ...]  # by operator, largest time first, then the pseudo-rows
    signatures: tuple[TimeRow, ...]  # by operator, input shapes and module, largest time first
    modules: tuple[TimeRow, ...]  # module tree (depth-first, call order), then the pseudo-rows
    unattributed: tuple[TimeRow, ...]  # device activities without an operator, by kernel name
    time_convention: str  # how measured time was taken and shared out
    matching: str  # how counted operators were matched to profiled ones
    bound_convention: str  # the bound's peaks, or why there is none
    cost: StageCost | None = None  # what the breakdown itself cost; None where its provider did not measure it
    #: True: times are a device's work (GPU kernels, memsets, copies); False: the host's operator calls (the CPU),
    #: where "idle before" is host time between operators (the interpreter, hooks) rather than waiting for launches.
    on_device: bool = True
    device_name: str | None = None  # the device as its runtime names it
    gpu: str | None = None  # the GPU spec (pack) the bounds come from; None: no bound (host, unknown device)
    peak_tflops: float | None = None  # the peak the bounds divide FLOPs by, 1e12 FLOP/s
    bandwidth_gb_s: float | None = None  # the bandwidth the bounds divide bytes by, 1e9 bytes/s
    precision: str = ""  # the precision the job ran and was bounded at
    profiled_calls: int = 1  # calls profiled (each operator's figure is its median over them)
    matched_calls: int = 0  # profiled operator calls matched to counted ones
    unmatched_profiled: int = 0  # profiled operator calls that took time without a counted one (rows not counted)
    unmatched_counted: int = 0  # counted calls with work (FLOPs or bytes) the profile does not show: in no row
    unmatched_counted_flops: int = 0  # their FLOPs
    call_spread: float | None = None  # IQR / median of the reference calls
    overhead_below: float = 0.1  # the options' threshold behind limited_by = "overhead"
    notes: tuple[str, ...] = ()  # caveats: rows exceeding the call, operators not matched, ...
