"""GPU item: a served decoder's steps measured against their bounds (the ``serve`` and ``measure_serving`` stages).

    PYTHONPATH=. python3 scripts/gpu_items/serving.py [--cpu] [--out DIR]

On a CUDA GPU: a 4-layer Llama-2-7B-shaped model (specs/configs/llama-2-7b with num_hidden_layers = 4, bf16,
randomly initialised) counted by ``serve`` and timed by ``measure_serving``: a prefill of 512 tokens and a decode
step against a KV cache of 2,048 positions (filled by real prefills), at batch 1, 16 and 64; each step's p50 beside
its roofline bound on the GPU rpx recognises, with the efficiency (bound / p50, which must lie in (0, 1]). About a
minute on an H200. Without CUDA (or with ``--cpu``) a one-layer miniature runs the same path on the CPU, and the lines
that need a GPU say SKIP.

Prints one ``PASS``/``FAIL``/``SKIP`` line per check with its figures; exit status 1 when a check failed. The rpx
results file is written to ``--out`` (default rpx-gpu-items/).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "specs" / "configs" / "llama-2-7b"
GPU_SHAPE = {"config": {"num_hidden_layers": 4}, "prompt": 512, "context": 2048, "batches": [1, 16, 64],
             "precision": "bf16", "min_samples": 30, "max_seconds": 45}
CPU_SHAPE = {"config": {"num_hidden_layers": 1, "hidden_size": 256, "intermediate_size": 512,
                        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 1000},
             "prompt": 16, "context": 128, "batches": [1, 2], "precision": "fp32", "min_samples": 5, "max_seconds": 10}


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, status: str, name: str, figure: str) -> None:
        self.failed += status == "FAIL"
        print(f"{status} {name}: {figure}", flush=True)


def spec_data(shape: dict, cuda: bool) -> dict:
    return {
        "name": "gpu-item-serving",
        "backend": "cuda" if cuda else "cpu",
        "precision": shape["precision"],
        "stages": ["serve", "measure_serving"],
        "gpus": ["H200-SXM"],
        "execution": {"isolation": "in-process"},
        "options": {
            "serve": {"prompt": shape["prompt"], "contexts": [shape["context"]], "batch_sizes": shape["batches"]},
            "measure_serving": {"min_samples": shape["min_samples"], "max_seconds": shape["max_seconds"]},
        },
        "models": [{"name": "llama2-7b-shaped", "source": f"hf:{CONFIG}", "config": shape["config"],
                    "kwargs": {"auto_class": "AutoModelForCausalLM"}, "input_shape": [1, shape["prompt"]]}],
    }


def expected_kv_bytes_per_token(shape: dict) -> int:
    """Keys and values of every layer for one position, by hand from the configuration."""
    import json

    config = {**json.loads((CONFIG / "config.json").read_text()), **shape["config"]}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    element = 2 if shape["precision"] == "bf16" else 4
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * element


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run the CPU miniature even where CUDA is available")
    parser.add_argument("--out", default="rpx-gpu-items", help="folder for the rpx results file")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    import torch
    import transformers

    import rpx_core as rpx
    from rpx_core.spec.schema import spec_from_dict

    cuda = torch.cuda.is_available() and not args.cpu
    shape = GPU_SHAPE if cuda else CPU_SHAPE
    checks = Checks()
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"serving item: torch {torch.__version__}, transformers {transformers.__version__}, device {device}, "
          f"{shape['precision']}, prompt {shape['prompt']}, context {shape['context']}, batch {shape['batches']}",
          flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run = rpx.run_spec(spec_from_dict(spec_data(shape, cuda), base_dir=str(ROOT)), output=out / "serving.toml")
    model = run.models[0]
    records = model.stages
    for stage in ("serve", "measure_serving"):
        record = records[stage]
        checks.line("PASS" if record.status == "ok" else "FAIL", f"{stage} ran",
                    f"{record.status} in {record.seconds:.1f} s" + (f": {record.error}" if record.error else ""))
    if records["serve"].status != "ok":
        return 1
    serve = records["serve"].result
    kv = expected_kv_bytes_per_token(shape)
    checks.line("PASS" if serve.kv_bytes_per_token == kv else "FAIL", "KV cache per token",
                f"{serve.kv_bytes_per_token:.0f} B counted, {kv} B by hand")
    if cuda:
        checks.line("PASS" if serve.local_gpu else "FAIL", "GPU recognised",
                    f"{device!r} is {serve.local_gpu!r} in rpx's packs")
    else:
        checks.line("SKIP", "GPU recognised", "no CUDA device")
    gpu = serve.gpus.get(serve.local_gpu) if serve.local_gpu else None
    for bound in (gpu.prefill + gpu.decode) if gpu else ():
        print(f"  bound {bound.phase} batch {bound.batch_size} context {bound.context}: {bound.bound_ms:.4f} ms "
              f"({bound.bottleneck}-bound; compute {bound.compute_ms:.4f} ms, memory {bound.memory_ms:.4f} ms)")
    if records["measure_serving"].status != "ok":
        return 1
    measured = records["measure_serving"].result
    for step in measured.steps:
        name = f"{step.phase} batch {step.batch_size} context {step.context}"
        interval = "[{:.4f}, {:.4f}]".format(*step.p50_interval_ms) if step.p50_interval_ms else "(no interval)"
        figure = (f"p50 {step.p50_ms:.4f} ms {interval} over {step.samples} calls, min {step.min_ms:.4f} ms, "
                  f"{step.tokens_per_s:,.0f} tokens/s")
        if step.efficiency is None:
            checks.line("SKIP" if not cuda else "FAIL", f"{name} against its bound", f"{figure}; no bound to set it against")
        else:
            ok = 0 < step.efficiency <= 1
            checks.line("PASS" if ok else "FAIL", f"{name} against its bound",
                        f"{figure}; bound {step.bound_ms:.4f} ms, efficiency {step.efficiency:.3f}")
    decode = [step for step in measured.steps if step.phase == "decode"]
    rates = [step.tokens_per_s for step in decode]
    grows = all(later > earlier for earlier, later in zip(rates, rates[1:]))
    checks.line(("PASS" if grows else "FAIL") if cuda else "SKIP", "decode tokens/s grows with batch",
                ", ".join(f"batch {step.batch_size}: {step.tokens_per_s:,.0f}" for step in decode))
    print(f"done in {time.perf_counter() - started:.0f} s; results: {out / 'serving.toml'}", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
