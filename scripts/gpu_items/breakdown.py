"""GPU checks of measure_breakdown: where one call's time goes, each operator against its own bound, on a real GPU.

    PYTHONPATH=. python3 scripts/gpu_items/breakdown.py [--cpu] [--out DIR]

BERT-base (a transformers configuration, bf16, batch 1, 128 tokens), torchvision's ResNet-50 (fp16, batch 1) and a
4-layer Llama-2-7B-shaped prefill of 2,048 tokens (LlamaConfig, bf16), each through ``rpx run`` with
``measure_latency`` then ``measure_breakdown`` on ``cuda:0``. One line per check (``PASS|FAIL|SKIP name: figures``):

* ``rows``: each breakdown's rows (the idle row included) add up to within 10% of the p50 measure_latency measured;
* ``matmuls``: each large matmul of the Llama prefill (more than 50 GFLOP per call) runs at 50% or more of its bound;
* ``bound``: the GPU is one rpx has peaks for (else there is no bound to check against).

Then the top rows of each breakdown and the Llama's matmul rows as Markdown, for bench/RESULTS.md. Exit status: 0
every check passed or was skipped, 1 a check failed. Without CUDA (or with ``--cpu``) it runs tiny versions of the
models on the CPU (ResNet-50 only where torchvision imports), prints the same lines, and says SKIP for the checks that
need a GPU: what it proves there is that the script runs. About 90 s on an H200.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()
#: Matmuls of the Llama prefill counted as large: FLOPs of one call (2 x 2048 x 4096 x 4096 = 68.7 GFLOP upwards).
LARGE_FLOPS = 5e10
ROWS_TOLERANCE = 0.10
MATMUL_FRACTION = 0.5


def bert_base(layers: int = 12, hidden: int = 768) -> object:
    import transformers

    return transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers, hidden_size=hidden,
                                                          num_attention_heads=hidden // 64,
                                                          intermediate_size=4 * hidden))


def llama_prefill(layers: int = 4, hidden: int = 4096, intermediate: int = 11008) -> object:
    """Llama-2-7B's shapes with ``layers`` layers."""
    import transformers

    return transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 128, num_hidden_layers=layers, vocab_size=32000))


def models(gpu: bool) -> list[dict]:
    """The three models at full size on a GPU; tiny versions on the CPU."""
    tokens, bert, llama = (128, {}, {}) if gpu else (16, {"layers": 2, "hidden": 128},
                                                      {"layers": 2, "hidden": 256, "intermediate": 512})
    found = [
        {"name": "bert-base", "source": f"{THIS}:bert_base", "kwargs": bert,
         "inputs": [{"name": "input_ids", "shape": [1, tokens], "dtype": "int64", "high": 30522}], "precision": "bf16"},
        {"name": "llama-7b-4l-prefill", "source": f"{THIS}:llama_prefill", "kwargs": llama,
         "inputs": [{"name": "input_ids", "shape": [1, 2048 if gpu else 32], "dtype": "int64", "high": 32000}],
         "precision": "bf16"},
    ]
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # torchvision built for another torch fails with other errors than ImportError
        print(f"SKIP resnet50: torchvision does not import here ({type(error).__name__})", flush=True)
    else:
        found.insert(1, {"name": "resnet50", "source": "torchvision:resnet50",
                         "input_shape": [1, 3, 224 if gpu else 64, 224 if gpu else 64], "precision": "fp16"})
    return found


def run(model: dict, gpu: bool, out: Path) -> object:
    from rpx_core.api import run_spec
    from rpx_core.spec.schema import spec_from_dict

    precision = model.pop("precision")
    precision = precision if gpu else "fp32"  # the CPU backend runs bf16 and fp16 slowly or not at all
    spec = spec_from_dict({
        "name": f"breakdown-{model['name']}", "backend": "cuda" if gpu else "cpu",
        "device": "cuda:0" if gpu else "cpu", "precision": precision,
        "stages": ["measure_latency", "measure_breakdown"], "models": [model],
        "options": {"measure_latency": {"max_seconds": 6, "min_samples": 200} if gpu else
                    {"max_seconds": 1, "min_samples": 10, "warmup_seconds": 0.05},
                    "measure_breakdown": {"profiled_calls": 3} if gpu else
                    {"reference_calls": 5, "max_seconds": 1, "warmup_seconds": 0.05}},
    }, where=str(THIS))
    return run_spec(spec, output=out / f"breakdown-{model['name']}.toml")


def check_rows(name: str, result: object, p50: float, gpu: bool) -> bool:
    """The breakdown's rows against measure_latency's p50."""
    off = result.total_ms / p50 - 1
    status = "PASS" if abs(off) <= ROWS_TOLERANCE else "FAIL"
    if not gpu:
        status = "SKIP"  # a tiny model timed on a shared CPU says nothing about the GPU criterion
    print(f"{status} rows {name}: rows {result.total_ms:.4g} ms vs p50 {p50:.4g} ms ({off:+.1%}); busy "
          f"{result.busy_ms:.4g} ms, idle {result.idle_ms:.4g} ms; reference call {result.call_ms:.4g} ms; profiled "
          f"call {result.profiled_ms:.4g} ms; matched {result.matched_calls}, unmatched profiled "
          f"{result.unmatched_profiled}, counted {result.unmatched_counted}; stage cost: warm-up "
          f"{result.cost.warmup_seconds:.2f} s, reference {result.cost.reference_seconds:.2f} s, counting "
          f"{result.cost.counting_seconds:.2f} s, profiling {result.cost.profiling_seconds:.2f} s, attribution "
          f"{result.cost.attribution_seconds:.2f} s", flush=True)
    return status != "FAIL"


def check_matmuls(result: object, gpu: bool) -> bool:
    """Every large matmul of the Llama prefill at MATMUL_FRACTION of its bound or more."""
    large = [row for row in result.signatures if row.name == "aten.mm" and row.flops
             and row.flops / row.calls > LARGE_FLOPS]
    figures = "; ".join(f"{row.module} {row.inputs}: {row.time_ms / row.calls:.4g} ms per call, bound "
                        f"{row.bound_ms / row.calls:.4g} ms, {row.fraction:.0%}" for row in large if row.bound_ms)
    if not gpu:
        print(f"SKIP matmuls: the CPU has no bound ({len(large)} large matmuls at this size)", flush=True)
        return True
    passed = len(large) == 7 and all(row.fraction is not None and row.fraction >= MATMUL_FRACTION for row in large)
    print(f"{'PASS' if passed else 'FAIL'} matmuls: {len(large)} large matmul signatures (7 expected): {figures}",
          flush=True)
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny models on the CPU (what runs without a GPU)")
    parser.add_argument("--out", type=Path, default=ROOT / "rpx-gpu-check", help="folder for the results files")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'cpu (tiny models)'}; torch {torch.__version__}",
          flush=True)
    from rpx_core.commands.show import show_text
    from rpx_core.registry.manager import Plugins

    stages = Plugins.load().stages().in_load_order()
    ok = True
    for model in models(gpu):
        name = model["name"]
        result = run(model, gpu, args.out)
        (measured,) = result.models
        breakdown, latency = measured.result("measure_breakdown"), measured.result("measure_latency")
        if breakdown is None or latency is None:
            failed = {stage: record.error for stage, record in measured.stages.items() if record.status != "ok"}
            print(f"FAIL rows {name}: a stage did not finish: {failed}", flush=True)
            ok = False
            continue
        if gpu and breakdown.gpu is None:
            print(f"FAIL bound {name}: {breakdown.bound_convention}", flush=True)
            ok = False
        ok &= check_rows(name, breakdown, latency.p50_ms, gpu)
        if name.startswith("llama"):
            ok &= check_matmuls(breakdown, gpu)
        print(show_text(result, stages, "markdown", ["breakdown"]), flush=True)
        if name.startswith("llama"):
            print(show_text(result, stages, "markdown", ["breakdown_calls"]), flush=True)
    print(f"seconds: {time.perf_counter() - started:.1f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
