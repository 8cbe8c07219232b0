"""The seed's flat, table-friendly fields derived from stage results, and the short terminal summary of a run.

Definitions (rpx's, which replace the seed's rough ones):

* ``params_m``: parameters (shared weights once) / 1e6.
* ``flops_g``: total FLOPs of one forward pass / 1e9, FLOPs = 2 x MACs for matmul/convolution/attention plus the
  documented per-element cost of other ops; ``matrix_flops_g`` is the matmul/conv/attention part alone.
* ``macs_g``: multiply-accumulates of matmul/convolution/attention / 1e9.
* ``memory_traffic_gb``: bytes moved assuming every operator reads its inputs and writes its outputs (unfused, eager) / 1e9.
* ``arithmetic_intensity``: total FLOPs / unfused bytes (FLOP per byte).
* ``actmem_gb_fp16``: peak live activation bytes if activations were 2 bytes per element / 1e9.
* ``fused_traffic_gb``: weights + inputs + outputs, each once (the fused lower bound) / 1e9.
* ``latency_p50_ms`` ...: measured per-call latency at batch 1 (numpy linear-interpolation percentiles);
  ``latency_ms_per_sample`` is the p50 at batch 1 (never a batch's time divided by its size).
* ``throughput_b<N>_samples_per_s``: samples per second measured at batch size N.
* ``peak_memory_mb``: peak memory of the measured batch-1 region / 1e6 (method in the latency result).
* ``roofline_<gpu>_<precision>_ms``: the headline roofline bound (whole model, fused traffic) for that GPU and
  precision; ``bottleneck_<gpu>_<precision>`` names what limits it.
* ``fraction_of_roofline``: bound / measured p50 on the GPU the job ran on (1.0 = at the roofline), only when that
  GPU is in a pack, one precision was bounded and Tier 1 counted batch 1 (latency is always measured at batch 1).
"""

from __future__ import annotations

from typing import Any, Mapping


def seed_fields(records: Mapping[str, Any]) -> dict[str, float | str]:
    """Flat summary of whatever stages succeeded; absent figures are left out, never zero."""
    ok = {name: record.result for name, record in records.items() if record.status == "ok"}
    fields: dict[str, float | str] = {}
    params, flops, traffic = ok.get("count_params"), ok.get("count_flops"), ok.get("estimate_traffic")
    if params is not None:
        fields["params_m"] = params.total / 1e6
    if flops is not None:
        fields.update(flops_g=flops.total_flops / 1e9, matrix_flops_g=flops.matrix_flops / 1e9, macs_g=flops.macs / 1e9)
    if traffic is not None:
        fields["memory_traffic_gb"] = traffic.unfused_bytes / 1e9
        fields["fused_traffic_gb"] = traffic.fused_bytes / 1e9
        if traffic.arithmetic_intensity_unfused is not None:
            fields["arithmetic_intensity"] = traffic.arithmetic_intensity_unfused
        fields["actmem_gb_fp16"] = traffic.activation_peak_bytes_fp16 / 1e9
    roofline, latency = ok.get("roofline"), ok.get("measure_latency")
    if roofline is not None:
        for gpu, by_precision in roofline.gpus.items():
            for precision, bound in by_precision.items():
                key = f"{_key(gpu)}_{precision}"
                fields[f"roofline_{key}_ms"] = bound.bound_ms_fused
                fields[f"bottleneck_{key}"] = bound.bottleneck_fused
    if latency is not None:
        fields.update(_latency_fields(latency))
        if roofline is not None and roofline.local_gpu and flops is not None and flops.counted_batch_size == 1:
            fields.update(_measured_vs_bound(latency, roofline))  # latency is per call at batch 1: compare like with like
    return fields


def _latency_fields(latency: Any) -> dict[str, float | str]:
    fields: dict[str, float | str] = {"latency_ms_per_sample": latency.p50_ms}  # per-call latency at batch 1
    for name in ("p50", "p90", "p95", "p99"):
        value = getattr(latency, f"{name}_ms")
        if value is not None:
            fields[f"latency_{name}_ms"] = value
    if latency.peak_memory.peak_bytes is not None:
        fields["peak_memory_mb"] = latency.peak_memory.peak_bytes / 1e6
    for row in latency.throughput:
        if row.samples_per_s is not None:
            fields[f"throughput_b{row.batch_size}_samples_per_s"] = row.samples_per_s
    return fields


def _measured_vs_bound(latency: Any, roofline: Any) -> dict[str, float | str]:
    """Measured p50 beside the roofline bound of the GPU it ran on: the fraction of the roofline achieved."""
    bounds = roofline.gpus.get(roofline.local_gpu, {})
    if len(bounds) != 1:
        return {}
    (precision, bound), = bounds.items()
    return {
        "measured_gpu": roofline.local_gpu,
        "measured_vs_bound_precision": precision,
        "measured_p50_ms": latency.p50_ms,
        "roofline_bound_ms": bound.bound_ms_fused,
        "fraction_of_roofline": bound.bound_ms_fused / latency.p50_ms,
    }


def _key(name: str) -> str:
    return name.lower().replace(" ", "_").replace("-", "_")


#: (summary key, column heading) of the per-model table, in order; a column appears when any model has the figure.
COLUMNS = (
    ("params_m", "params M"),
    ("flops_g", "GFLOPs"),
    ("macs_g", "GMACs"),
    ("memory_traffic_gb", "traffic GB"),
    ("fused_traffic_gb", "fused GB"),
    ("arithmetic_intensity", "FLOP/B"),
    ("actmem_gb_fp16", "act GB fp16"),
    ("latency_p50_ms", "p50 ms"),
    ("latency_p99_ms", "p99 ms"),
    ("peak_memory_mb", "peak MB"),
)


def render_run(run: Any) -> str:
    """A short terminal summary: a table of headline figures, roofline bounds per GPU, and what did not succeed."""
    rows = [(model.name, model.summary) for model in run.models if model.stages]
    columns = [(key, title) for key, title in COLUMNS if any(key in summary for _, summary in rows)]
    lines = table(["model", *(title for _, title in columns)],
                  [[name, *(format_value(summary.get(key, "-")) for key, _ in columns)] for name, summary in rows]) if rows else []
    bounds = sorted({key for _, summary in rows for key in summary if key.startswith("roofline_") and key.endswith("_ms")
                     and key != "roofline_bound_ms"})
    if bounds:
        lines += ["", "roofline lower bound, ms (whole model, fused traffic; * = memory-bound):"]
        lines += table(["model", *(key.removeprefix("roofline_").removesuffix("_ms") for key in bounds)],
                       [[name, *(_bound_cell(summary, key) for key in bounds)] for name, summary in rows])
    for model in run.models:
        for stage, record in model.stages.items():
            if record.status != "ok":
                lines.append(f"{model.name}: {stage} {record.status}: {(record.error or '').splitlines()[0] if record.error else ''}")
    for stage, record in run.run_stages.items():
        lines.append(f"{stage}: {record.status}" + (f": {record.error.splitlines()[0]}" if record.error else ""))
        if stage == "batch_search" and record.status == "ok":
            from rpx_core.types.batch_search import format_table

            lines += ["", format_table(record.result)]
    return "\n".join(lines)


def _bound_cell(summary: dict[str, Any], key: str) -> str:
    if key not in summary:
        return "-"
    memory = summary.get("bottleneck_" + key.removeprefix("roofline_").removesuffix("_ms")) == "memory"
    return format_value(summary[key]) + ("*" if memory else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]


def format_value(value: float | str) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
