"""Batch search: rpx's ``batch_search`` beside doubling-then-bisection, trials and seconds to a result, same workload.

Reuses ``bench/bench_batch_search.py`` (its decoder workload, direct scan, real trials and the oracle sweep), so the
two benchmarks cannot drift apart: the true limit comes from a direct scan of every batch size, both strategies run
real trials under budgets placed between two scanned peaks, and the oracle sweep repeats the comparison over limits
3..250 on the scan's memory curve. Limits 6 and 12 (the other benchmark's 6 and 19 cost a minute more of real
trials on a loaded 2-CPU machine).
"""

from __future__ import annotations

import statistics
import time

import bench_batch_search as search

from rpx_plugins.batch_search.planner import fit_linear
from rpx_plugins.torch.cpu import CpuBackend

REAL_LIMITS = (6, 12)
SCAN_UP_TO = REAL_LIMITS[-1] + 1


def main() -> dict:
    backend = CpuBackend()
    model = search.decoder()
    started = time.perf_counter()
    peaks = search.scan(backend, model, range(1, SCAN_UP_TO + 1))
    scan_seconds = time.perf_counter() - started
    line = fit_linear([(size,) for size in peaks], list(peaks.values()))
    context = search.stage_context(backend, model)
    runs = [search.real_run(backend, context, (peaks[limit] + peaks[limit + 1]) // 2, limit)
            for limit in REAL_LIMITS]

    def used_at(size: int) -> int:
        return peaks[size] if size in peaks else int(line.intercept + line.slopes[0] * size)

    rpx_trials, base_trials, misses = search.oracle_sweep(used_at)
    return {
        "workload": f"conv + 16x upsampling decoder, {line.slopes[0] / 1e6:.1f} MB peak RSS per sample",
        "scan_seconds": scan_seconds,
        "scan_up_to": SCAN_UP_TO,
        "real": [{"limit": r.limit, "rpx_found": r.rpx_found, "rpx_trials": r.rpx_trials, "rpx_seconds": r.rpx_seconds,
                  "base_found": r.base_found, "base_trials": r.base_trials, "base_seconds": r.base_seconds}
                 for r in runs],
        "oracle": {"budgets": len(rpx_trials), "rpx_mean": statistics.mean(rpx_trials), "rpx_max": max(rpx_trials),
                   "base_mean": statistics.mean(base_trials), "base_max": max(base_trials),
                   "misses": [list(miss) for miss in misses]},
    }
