"""A Llama-2-70B-shaped model at batch 1, sequence 2048, counted on the meta device: wall time and peak RSS.

Targets on a 2-core machine: < 10 s for build + count, peak RSS < 1.5 GB (VmHWM from /proc/self/status, the process's
peak resident set, which includes importing torch; Linux only).

Run: python bench/bench_llama70b.py   (with the repository on PYTHONPATH, or rpx installed)
"""

from __future__ import annotations

import time

import torch

from machine import describe_machine
from rpx_plugins import model_zoo
from rpx_plugins.torch_counter import build_on_meta, count_model
from rpx_plugins.torch_params import count_parameters

BATCH, SEQ_LEN = 1, 2048


def peak_rss_bytes() -> int:
    """VmHWM: the process's peak resident set size."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def main() -> None:
    print(describe_machine())
    print(f"torch {torch.__version__}; peak RSS after importing torch: {peak_rss_bytes() / 1e9:.3f} GB")
    start = time.perf_counter()
    model = build_on_meta(model_zoo.llama, preset="llama2-70b")
    built = time.perf_counter()
    tokens = model.example_inputs(batch=BATCH, seq_len=SEQ_LEN)
    report = count_model(model, tokens)
    counted = time.perf_counter()
    with torch.no_grad():
        inference = count_model(model, tokens)
    params = count_parameters(model, "bf16")
    flops, traffic = report.flops, report.traffic
    print(f"llama2-70b shape, batch {BATCH}, seq {SEQ_LEN}, meta; timed count with grad enabled")
    print(f"  parameters            {params.total / 1e9:.3f} B")
    print(f"  matrix FLOPs          {flops.matrix_flops / 1e12:.2f} TFLOP (other {flops.other_flops / 1e12:.3f} TFLOP)")
    print(f"  uncounted ops         {flops.uncounted_ops or 'none'}")
    print(f"  unfused / fused bytes {traffic.unfused_bytes / 1e9:.1f} GB / {traffic.fused_bytes / 1e9:.1f} GB (fp32)")
    for mode, result in (("grad enabled", traffic), ("no_grad", inference.traffic)):
        print(f"  activation peak, {mode:<12} {result.activation_peak_bytes / 1e9:.2f} GB fp32, "
              f"{result.activation_peak_bytes_fp16 / 1e9:.2f} GB at 2 bytes/element")
    print(f"  op records            {len(traffic.op_records)}")
    total = counted - start
    print(f"wall: build {built - start:.2f} s + count {counted - built:.2f} s = {total:.2f} s (target < 10 s)")
    print(f"peak RSS (VmHWM): {peak_rss_bytes() / 1e9:.3f} GB (target < 1.5 GB)")


if __name__ == "__main__":
    main()
