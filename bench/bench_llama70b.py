"""Tier 1 + Tier 2 of a Llama-2-70B-shaped model at batch 1, sequence 2048, through the real engine: wall time, peak RSS.

Runs ``specs/llama2_70b_meta.toml`` (built on the meta device, bf16, rooflines on five GPUs) in this fresh process.
Targets on a 2-core machine: < 10 s from plugin loading to the written results file, and peak RSS < 1.5 GB (VmHWM from
/proc/self/status, the process's peak resident set, torch import included; Linux only).

Run: python bench/bench_llama70b.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from machine import describe_machine

SPEC = Path(__file__).resolve().parents[1] / "specs" / "llama2_70b_meta.toml"


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def main() -> None:
    print(describe_machine())
    import torch  # imported first so its own footprint is shown separately

    print(f"torch {torch.__version__}; peak RSS after importing torch: {peak_rss_bytes() / 1e9:.3f} GB")
    from rpx_core.api import run

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        result = run(SPEC, output=Path(folder) / "llama.toml")
    seconds = time.perf_counter() - started
    model = result.model("llama2-70b")
    assert model.ok, {name: record.error for name, record in model.stages.items()}
    params, flops, traffic = (model.result(s) for s in ("count_params", "count_flops", "estimate_traffic"))
    print(f"parameters {params.total / 1e9:.3f} B; matrix FLOPs {flops.matrix_flops / 1e12:.2f} TFLOP, "
          f"other {flops.other_flops / 1e12:.3f} TFLOP; uncounted ops: {flops.uncounted_ops or 'none'}")
    print(f"bytes (bf16): unfused {traffic.unfused_bytes / 1e9:.1f} GB, fused {traffic.fused_bytes / 1e9:.1f} GB; "
          f"activation peak {traffic.activation_peak_bytes / 1e9:.2f} GB; {len(traffic.op_records)} op records")
    for gpu, bounds in model.result("roofline").gpus.items():
        bound = bounds["bf16"]
        print(f"  {gpu:<16} bound {bound.bound_ms_fused:8.1f} ms ({bound.bottleneck_fused}), per-operator "
              f"{bound.per_operator_ms:8.1f} ms, fits: {bound.fits_in_memory}")
    print(f"wall {seconds:.2f} s (target < 10 s); peak RSS {peak_rss_bytes() / 1e9:.3f} GB (target < 1.5 GB)")


if __name__ == "__main__":
    main()
