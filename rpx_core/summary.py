"""The seed's flat, table-friendly fields derived from stage results, and the short terminal summary of a run.

Definitions (rpx's, which replace the seed's rough ones):

* ``params_m``: parameters (shared weights once) / 1e6.
* ``flops_g``: total FLOPs of one forward pass / 1e9, FLOPs = 2 x MACs for matmul/convolution/attention plus the
  documented per-element cost of other ops; ``matrix_flops_g`` is the matmul/conv/attention part alone.
* ``macs_g``: multiply-accumulates of matmul/convolution/attention / 1e9.
* ``memory_traffic_gb``: bytes moved assuming every operator reads its inputs and writes its outputs (unfused, eager) / 1e9.
* ``arithmetic_intensity``: total FLOPs / unfused bytes (FLOP per byte).
* ``actmem_gb_fp16``: peak live activation bytes if activations were 2 bytes per element / 1e9.
* ``latency_p50_ms`` ...: measured per-call latency at batch 1 (numpy linear-interpolation percentiles).
* ``roofline_<gpu>_<precision>_ms``: the headline roofline lower bound for that GPU and precision.
"""

from __future__ import annotations

from typing import Any, Mapping


def seed_fields(records: Mapping[str, Any]) -> dict[str, float | str]:
    """Flat summary of whatever stages succeeded; absent figures are left out, never zero."""
    ok = {name: record.result for name, record in records.items() if record.status == "ok"}
    fields: dict[str, float | str] = {}
    if "count_params" in ok:
        fields["params_m"] = ok["count_params"].total / 1e6
    return fields


def render_run(run: Any) -> str:
    """A short terminal summary: one block per model with its headline figures and any stage that did not succeed."""
    lines = []
    for model in run.models:
        state = "ok" if model.ok else "INCOMPLETE"
        lines.append(f"{model.name} [{model.backend}/{model.device}, {model.precision}] {state}")
        for key, value in model.summary.items():
            lines.append(f"  {key:<34} {format_value(value)}")
        for stage, record in model.stages.items():
            if record.status != "ok":
                lines.append(f"  {stage}: {record.status}: {(record.error or '').splitlines()[0] if record.error else ''}")
    for stage, record in run.run_stages.items():
        lines.append(f"{stage}: {record.status}" + (f": {record.error}" if record.error else ""))
    return "\n".join(lines)


def format_value(value: float | str) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
