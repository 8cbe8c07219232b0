"""The built-in stages, declared like any plugin's: name, needs, options, result type, scope, hook, summary fields,
and how their results are shown (tables, compare figures, charts). One module per stage family: counts (Tier 1),
roofline, system_card, latency, batch_search, serving, breakdown.

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
* ``kv_bytes_per_token``: KV-cache bytes per sequence per position (serve, at the longest context counted);
  ``served_weights_gb``: the weights in their served format / 1e9.
* ``ttft_<gpu>_<precision>_b<N>_ms``, ``tpot_<gpu>_<precision>_c<C>_b<N>_ms``: serve's bounds on the prefill (time to
  first token) and on the decode step at context C (time per output token), batch N; ``max_batch_<gpu>_<precision>_c<C>``
  the largest batch that fits at context C.
* ``measured_<phase>_c<C>_b<N>_ms``, ``efficiency_<phase>_c<C>_b<N>``: measure_serving's p50 of a step and serve's
  bound / that p50 on the GPU it ran on.
* ``breakdown_call_ms`` / ``breakdown_busy_ms`` / ``breakdown_idle_ms``: the breakdown's reference call (median,
  timed without the profiler), the device's busy time in the profiled call, and the rest (host gaps, launch
  overhead); ``breakdown_top_operator`` is the operator with the most time above its bound
  (``breakdown_top_excess_ms``), or with the most time when there is no bound.
"""

from __future__ import annotations

from rpx_core.plugin import Stage, hookimpl
from rpx_plugins.stages.batch_search import BATCH_SEARCH
from rpx_plugins.stages.breakdown import MEASURE_BREAKDOWN
from rpx_plugins.stages.counts import COUNT_FLOPS, COUNT_PARAMS, ESTIMATE_TRAFFIC
from rpx_plugins.stages.latency import MEASURE_LATENCY
from rpx_plugins.stages.roofline import ROOFLINE
from rpx_plugins.stages.serving import MEASURE_SERVING, SERVE
from rpx_plugins.stages.system_card import SYSTEM_CARD

BUILTIN_STAGES = (COUNT_PARAMS, COUNT_FLOPS, ESTIMATE_TRAFFIC, ROOFLINE, SYSTEM_CARD, MEASURE_LATENCY, BATCH_SEARCH,
                  SERVE, MEASURE_SERVING, MEASURE_BREAKDOWN)


@hookimpl
def rpx_register_stages() -> list[Stage]:
    return list(BUILTIN_STAGES)
