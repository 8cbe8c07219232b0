"""The built-in stages, declared like any plugin's: name, needs, options, result type, scope, hook and summary fields.

The implementations are hook implementations elsewhere (``rpx_plugins.torch.counts``, ``rpx_plugins.jax.counts``,
``rpx_plugins.roofline``, ...), registered ``trylast`` so any installed plugin can answer first for its backends.

Summary fields (flat, table-friendly; ``docs/migrating.md`` maps the older ``rpx_benchmark`` profiler's names):

* ``params_m``: parameters (shared weights once) / 1e6.
* ``flops_g``: total FLOPs of the counted pass / 1e9, FLOPs = 2 x MACs for matmul/convolution/attention plus the
  documented per-element cost of other ops; ``matrix_flops_g`` is the matmul/conv/attention part alone.
* ``macs_g``: multiply-accumulates of matmul/convolution/attention / 1e9.
* ``memory_traffic_gb``: bytes moved if every operator reads its inputs and writes its outputs (unfused) / 1e9.
* ``fused_traffic_gb``: weights + inputs + outputs, each once (the fused lower bound) / 1e9.
* ``arithmetic_intensity``: total FLOPs / unfused bytes (FLOP per byte).
* ``actmem_gb_fp16``: peak live activation bytes if activations were 2 bytes per element / 1e9.
* ``roofline_<gpu>_<precision>_ms``: the headline roofline bound (whole model, fused traffic) for that GPU and
  precision; ``bottleneck_<gpu>_<precision>`` names what limits it.
* ``latency_p50_ms`` ...: measured per-call latency of the job's inputs as written (numpy linear-interpolation
  percentiles); ``latency_batch_size`` is their batch dimension (absent for inputs without one) and
  ``latency_ms_per_sample`` the p50 only when that is 1 (a batch's time is never divided by its size).
* ``latency_p50_low_ms`` / ``latency_p50_high_ms``: the median's distribution-free confidence interval (95% by
  default); ``latency_verdict`` is "stable", "noisy" or "too_few_samples", ``latency_verdict_reasons`` why it is not
  stable (interval, spread, tail, drift, warm-up, other work on the machine); ``latency_samples`` the sample count;
  ``latency_warmup_seconds`` how long the warm-up took to settle.
* ``throughput_b<N>_samples_per_s``: samples per second measured at batch size N.
* ``peak_memory_mb``: peak memory of the measured region / 1e6 (method in the latency result);
  ``peak_increment_mb`` is that peak minus the usage at the region's start: what the measured call itself needed.
* ``fraction_of_roofline``: bound / measured p50 on the GPU the job ran on (1.0 = at the roofline), at the precision
  it ran at, only when that GPU is in a pack, the count and the measurement are of the same call (inputs, forward
  only) and the fraction is at most 1; otherwise ``efficiency_problem`` says why (``rpx_plugins.efficiency``).
* ``uncounted_ops`` / ``uncounted_call_share``: operators that ran without a FLOP formula (not in ``flops_g``) and
  their share of all operator calls of the counted pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rpx_core.plugin import Stage, did_you_mean, hookimpl
from rpx_core.types.batch_search import BatchSearchOptions, BatchSearchResult
from rpx_core.types.counts import CountOptions, FlopsResult, ParamsResult, TrafficResult
from rpx_core.types.latency import LatencyOptions, LatencyResult
from rpx_core.types.roofline import RooflineOptions, RooflineResult
from rpx_core.types.system_card import SystemCard
from rpx_plugins.efficiency import efficiency

Fields = dict[str, float | str]


def params_fields(params: ParamsResult, results: Mapping[str, Any]) -> Fields:
    return {"params_m": params.total / 1e6}


def flops_fields(flops: FlopsResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"flops_g": flops.total_flops / 1e9, "matrix_flops_g": flops.matrix_flops / 1e9,
                      "macs_g": flops.macs / 1e9}
    uncounted = uncounted_calls(flops)
    if uncounted is not None:
        fields["uncounted_ops"], fields["uncounted_call_share"] = uncounted
    return fields


def uncounted_calls(flops: FlopsResult) -> tuple[int, float] | None:
    """(operators without a FLOP formula, their share of every operator call of the counted pass); None when every
    operator had one."""
    if not flops.uncounted_ops:
        return None
    uncounted = sum(flops.uncounted_ops.values())
    counted = sum(operator.calls for operator in flops.by_operator.values())
    return len(flops.uncounted_ops), uncounted / (counted + uncounted)


def traffic_fields(traffic: TrafficResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {"memory_traffic_gb": traffic.unfused_bytes / 1e9, "fused_traffic_gb": traffic.fused_bytes / 1e9}
    if traffic.arithmetic_intensity_unfused is not None:
        fields["arithmetic_intensity"] = traffic.arithmetic_intensity_unfused
    fields["actmem_gb_fp16"] = traffic.activation_peak_bytes_fp16 / 1e9
    return fields


def gpu_key(name: str) -> str:
    """A GPU name as a field-name part: "H100-SXM" -> "h100_sxm"."""
    return name.lower().replace(" ", "_").replace("-", "_")


def roofline_fields(roofline: RooflineResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {}
    for gpu, by_precision in roofline.gpus.items():
        for precision, bound in by_precision.items():
            key = f"{gpu_key(gpu)}_{precision}"
            fields[f"roofline_{key}_ms"] = bound.bound_ms_fused
            fields[f"bottleneck_{key}"] = bound.bottleneck_fused
    return fields


def latency_fields(latency: LatencyResult, results: Mapping[str, Any]) -> Fields:
    fields: Fields = {}
    batch = latency.measured_batch_size
    if batch is not None:
        fields["latency_batch_size"] = batch
    if batch == 1:
        fields["latency_ms_per_sample"] = latency.p50_ms  # one call of one sample; never a batch's time / its size
    for name in ("p50", "p90", "p95", "p99"):
        value = getattr(latency, f"{name}_ms")
        if value is not None:
            fields[f"latency_{name}_ms"] = value
    interval = getattr(latency, "p50_interval_ms", None)  # absent from results written before it was recorded
    if interval is not None:
        fields["latency_p50_low_ms"], fields["latency_p50_high_ms"] = interval
        fields["latency_interval_confidence"] = latency.interval_confidence
    if getattr(latency, "verdict", None) is not None:
        fields["latency_verdict"] = latency.verdict
        fields["latency_samples"] = latency.samples_count
        fields["latency_interval_confidence"] = latency.interval_confidence
    if getattr(latency, "verdict_reasons", ()):
        fields["latency_verdict_reasons"] = "; ".join(latency.verdict_reasons)
    if getattr(latency, "warmup_settled", None) is not None:
        fields["latency_warmup_seconds"] = latency.warmup_seconds
    if latency.peak_memory.peak_bytes is not None:
        fields["peak_memory_mb"] = latency.peak_memory.peak_bytes / 1e6
    if getattr(latency.peak_memory, "increment_bytes", None) is not None:
        fields["peak_increment_mb"] = latency.peak_memory.increment_bytes / 1e6
    for row in latency.throughput:
        if row.samples_per_s is not None:
            fields[f"throughput_b{row.batch_size}_samples_per_s"] = row.samples_per_s
    return {**fields, **measured_vs_bound(latency, results)}


def measured_vs_bound(latency: LatencyResult, results: Mapping[str, Any]) -> Fields:
    """Measured p50 beside the roofline bound of the GPU it ran on, for the same call (rpx_plugins.efficiency)."""
    found = efficiency(latency, results.get("roofline"), results.get("count_flops"))
    if found is None:
        return {}
    fields: Fields = {
        "measured_gpu": found.gpu,
        "measured_vs_bound_precision": found.precision,
        "measured_p50_ms": found.measured_ms,
        "roofline_bound_ms": found.bound_ms,
    }
    if found.fraction is not None:
        fields["fraction_of_roofline"] = found.fraction
    else:
        fields["efficiency_problem"] = found.problem
    return fields


def roofline_needs_gpus(spec: Any, options: RooflineOptions) -> Iterable[str]:
    if not spec.gpus:
        yield 'gpus: the roofline stage needs GPUs to bound: names from `rpx gpus`, or ["all"]'


def pipeline_names_models(spec: Any, options: BatchSearchOptions) -> Iterable[str]:
    """The pipeline must name models of the spec, each once."""
    names = [model.name for model in spec.models]
    for index, name in enumerate(options.pipeline):
        if name not in names:
            yield (f"options.batch_search.pipeline[{index}]: no model named {name!r} (the spec has "
                   f"{', '.join(map(repr, names))}){did_you_mean(name, names)}")
        elif options.pipeline.index(name) != index:
            yield f"options.batch_search.pipeline[{index}]: model {name!r} is already in the pipeline"


def counts_on_device(options: CountOptions) -> bool:
    """Counting runs the model on the backend only when asked to; "auto" and "meta" count on the meta device."""
    return options.count_on == "device"


def always(options: Any) -> bool:
    return True


COUNT_PARAMS = Stage(
    "count_params",
    "parameters, buffers and their bytes at the spec's precision",
    result=ParamsResult,
    summary=params_fields,
    doc="Count parameters and buffers (shared weights once) and their bytes at ``ctx.precision``.",
)
COUNT_FLOPS = Stage(
    "count_flops",
    "FLOPs and MACs of one pass, per operator and module",
    result=FlopsResult,
    options=CountOptions,
    executes=counts_on_device,
    summary=flops_fields,
    doc="Count FLOPs and MACs of one pass (``ctx.options('count_flops')``: backward, batch size, where to count). "
    "FLOPs = 2 x MACs for matrix work; operators without a formula are listed in ``uncounted_ops``.",
)
ESTIMATE_TRAFFIC = Stage(
    "estimate_traffic",
    "bytes moved (unfused and fused bounds) and peak activation memory",
    result=TrafficResult,
    needs=("count_flops",),
    summary=traffic_fields,
    doc="Bytes moved (unfused upper and fused lower bound) and peak activation memory, with ``assumptions`` stated. "
    "Reuse the counting pass of ``rpx_count_flops`` through ``ctx.cache`` instead of running the model twice.",
)
ROOFLINE = Stage(
    "roofline",
    "lower-bound latency per GPU and precision",
    result=RooflineResult,
    needs=("count_params", "count_flops", "estimate_traffic"),
    options=RooflineOptions,
    check=roofline_needs_gpus,
    summary=roofline_fields,
    doc="Lower-bound latency per GPU and precision from ``ctx.results['count_flops']``/``['estimate_traffic']`` "
    "and ``ctx.gpu_catalog``.",
)
SYSTEM_CARD = Stage(
    "system_card",
    "the machine and run settings (OS, CPU, RAM, accelerators, library versions)",
    result=SystemCard,
    doc="Describe the machine and the run settings (MLPerf field names; gaps listed, never faked).",
)
MEASURE_LATENCY = Stage(
    "measure_latency",
    "latency percentiles of the job's inputs, throughput per batch size, peak memory",
    result=LatencyResult,
    needs=("system_card",),
    options=LatencyOptions,
    executes=always,
    measures=True,
    summary=latency_fields,
    doc="Measure per-call latency of the job's inputs as written, throughput per batch size and peak memory of the "
    "measured region; build percentiles with :mod:`rpx_core.stats` so they follow rpx's method and sufficiency rules.",
)
BATCH_SEARCH = Stage(
    "batch_search",
    "best batch sizes for a pipeline of models under a memory budget",
    result=BatchSearchResult,
    options=BatchSearchOptions,
    scope="run",
    executes=always,
    measures=True,
    check=pipeline_names_models,
    doc="Search batch sizes for a pipeline of models under a memory budget. Receives a RunContext (one "
    "StageContext per model, the options, the backend).",
)

BUILTIN_STAGES = (COUNT_PARAMS, COUNT_FLOPS, ESTIMATE_TRAFFIC, ROOFLINE, SYSTEM_CARD, MEASURE_LATENCY, BATCH_SEARCH)


@hookimpl
def rpx_register_stages() -> list[Stage]:
    return list(BUILTIN_STAGES)
