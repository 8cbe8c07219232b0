"""The training step on a GPU: rpx's predicted peak of an AdamW step under bf16 autocast against
``torch.cuda.max_memory_allocated`` of the same step, for ResNet-50 (torchvision), BERT-base and a 4-layer
Llama-2-7B-shaped decoder (transformers configurations, random weights, no network).

    PYTHONPATH=. python3 scripts/gpu_items/training.py [--cpu]

One ``PASS``/``FAIL``/``SKIP`` line per check, then the figures. On a CUDA device each model's train_step runs as rpx
runs it (counted on fake CUDA tensors, then real steps: the peak of one steady-state step, its region started after
the previous step's zero_grad with the allocator's cache emptied), and passes when the predicted peak (parameters,
optimiser state, batch, and the transient peak) is within 5% of the measured one. ResNet-50 runs channels-last (the
layout tensor cores run natively; in NCHW cuDNN transposes inside its kernels, workspace rpx does not see). Without
CUDA (or with ``--cpu``) the GPU checks say SKIP and tiny versions of the same models run on the CPU, checking the
predicted transient peak against the measured increment (10%). Exit status 1 when a check failed. About 90-120 s on
an H200.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GPU_TOLERANCE, CPU_TOLERANCE = 0.05, 0.10


def on_device(build):
    """Build on the GPU when the caller's default device is the CPU (a 1B-parameter init there takes a while); rpx's
    counting builds on meta, and that default is kept."""
    if torch.cuda.is_available() and torch.get_default_device().type == "cpu":
        with torch.device("cuda"):
            return build()
    return build()


def resnet50(tiny: bool = False):
    try:
        import torchvision

        return on_device(lambda: torchvision.models.resnet50())
    except ImportError:  # the CPU run where torchvision is not installed: the same network, built from code
        from rpx_plugins.torch import zoo

        return on_device(zoo.resnet50)


def bert(tiny: bool = False):
    import transformers

    config = transformers.BertConfig(**({"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                                         "intermediate_size": 512} if tiny else {}))
    return on_device(lambda: transformers.BertForMaskedLM(config))


def llama(tiny: bool = False):
    """Llama-2-7B's layer shape (4096 wide, 11008 hidden, 32 heads), 4 layers; tiny: 128 wide, 2 layers."""
    import transformers

    shape = ({"hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4, "num_key_value_heads": 4,
              "num_hidden_layers": 2} if tiny else
             {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
              "num_hidden_layers": 4})
    config = transformers.LlamaConfig(vocab_size=32000, max_position_embeddings=4096, **shape)
    return on_device(lambda: transformers.LlamaForCausalLM(config))


#: name -> (factory, inputs on the GPU, inputs of the tiny CPU run, options)
MODELS = {
    "resnet50": (resnet50, [{"shape": [64, 3, 224, 224]}], [{"shape": [2, 3, 64, 64]}],
                 {"memory_format": "channels_last"}),
    "bert-base": (bert, [{"name": "input_ids", "shape": [32, 128], "dtype": "int64", "high": 30522}],
                  [{"name": "input_ids", "shape": [4, 32], "dtype": "int64", "high": 30522}], {}),
    "llama-4-layer": (llama, [{"name": "input_ids", "shape": [2, 1024], "dtype": "int64", "high": 32000}],
                      [{"name": "input_ids", "shape": [2, 32], "dtype": "int64", "high": 32000}], {}),
}


def run(name: str, gpu: bool) -> tuple[str, str]:
    from rpx_core.testing import make_context, run_stage

    factory, gpu_inputs, cpu_inputs, extra = MODELS[name]
    options = {"optimizer": "adamw", "warmup_steps": 3, "min_steps": 5, "max_seconds": 4 if gpu else 2, **extra}
    ctx = make_context(f"{Path(__file__).resolve()}:{factory.__name__}", model_keys={"kwargs": {"tiny": not gpu}},
                       inputs=gpu_inputs if gpu else cpu_inputs, backend="cuda" if gpu else "cpu", precision="bf16",
                       stages=["train_step"], gpus=["H100-SXM"], options={"train_step": options})
    started = time.perf_counter()
    result = run_stage("train_step", ctx)
    seconds = time.perf_counter() - started
    memory, measured, compared = result.memory, result.measured, result.comparison
    peak = measured.peak_memory
    figures = (f"predicted peak {memory.peak_bytes / 1e9:.3f} GB (resident {memory.resident_bytes / 1e9:.3f} + "
               f"transient {memory.transient_peak_bytes / 1e9:.3f}, in {memory.peak_phase} at {memory.peak_operator});"
               f" measured peak {peak.peak_bytes / 1e9:.3f} GB, start {peak.start_bytes / 1e9:.3f}, increment "
               f"{peak.increment_bytes / 1e9:.3f}; peak ratio {compared.peak_ratio}, transient ratio "
               f"{compared.transient_ratio:.4f}; step p50 {measured.p50_ms:.2f} ms ({measured.samples_per_s:.1f} "
               f"samples/s, {measured.verdict}); step {result.step.flops / 1e12:.3f} TFLOP (forward "
               f"{result.phases['forward'].flops / 1e12:.3f}, backward {result.phases['backward'].flops / 1e12:.3f}, "
               f"optimizer {result.phases['optimizer'].flops / 1e12:.4f}); bound on H100-SXM "
               f"{result.bounds['H100-SXM']['step'].bound_ms_fused:.2f} ms; counted on {result.counted_on}; "
               f"{seconds:.0f} s")
    ratio = compared.peak_ratio if gpu else compared.transient_ratio
    tolerance = GPU_TOLERANCE if gpu else CPU_TOLERANCE
    ok = ratio is not None and abs(ratio - 1) <= tolerance
    what = "predicted peak / max_memory_allocated" if gpu else "predicted transient / measured increment (CPU, tiny)"
    return ("PASS" if ok else "FAIL"), f"{what} = {ratio if ratio is None else round(ratio, 4)}; {figures}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny models on the CPU even where CUDA is available")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.cpu
    failed = False
    for name in MODELS:
        check = f"training {name} AdamW bf16 autocast"
        if not gpu:
            print(f"SKIP {check} on the GPU: no CUDA device" + (" (--cpu)" if args.cpu else ""), flush=True)
        try:
            status, figures = run(name, gpu)
        except Exception as exc:  # one model's failure is its line, the others still run
            status, figures = "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        failed |= status == "FAIL"
        print(f"{status} {check}{'' if gpu else ' (tiny, CPU)'}: {figures}", flush=True)
        if gpu:  # the next model's step starts from an empty device
            gc.collect()
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
