"""rpx's one-pass Tier 1 count (FLOPs + bytes + activation memory + per-module/per-op records) next to torch's
FlopCounterMode alone (FLOPs only), on the same meta-device models in one run. Target: rpx / FlopCounterMode <= 1.5.

Both run the same model under no_grad; a plain forward (no counter) is timed too, so the counters' own overhead is
visible. On meta, rpx runs F.scaled_dot_product_attention through the fused kernel the CPU backend would pick, while the
plain forward and FlopCounterMode take meta's unfused math path (more ops), so rpx can beat the plain forward on
attention models. Rounds alternate the three so drift hits all alike; each round repeats a call enough times to last
about 0.1 s (small models run in milliseconds, below timer and scheduler noise); the median round is reported, per call.

A second table times a whole job through the engine, ``rpx.profile`` with Tier 1 + roofline (plan, stage records,
results, summary: everything a job costs besides its count), against FlopCounterMode on the same Llama-2-7B-width
meta model at 8 and 32 layers. Target: rpx.profile / FlopCounterMode <= 1.0 from 8 layers up.

Run: python bench/bench_tier1.py [rounds]   (with the repository on PYTHONPATH, or rpx installed)
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
from machine import describe_machine
from torch.utils.flop_counter import FlopCounterMode

import rpx_core as rpx
from rpx_core.registry.manager import Plugins
from rpx_plugins.torch import zoo as model_zoo
from rpx_plugins.torch.counter import build_on_meta, count_model

#: (label, factory, factory kwargs, example_inputs kwargs)
CASES = [
    ("tiny_cnn batch 64", model_zoo.tiny_cnn, {}, {"batch": 64, "size": 64}),
    ("tiny_transformer 4 layers, seq 128", model_zoo.tiny_transformer, {"n_layers": 4}, {"batch": 8, "seq_len": 128}),
    ("llama2-7b shape, seq 512", model_zoo.llama, {"preset": "llama2-7b"}, {"batch": 1, "seq_len": 512}),
]


def seconds(run: Callable[[], object], repeat: int = 1) -> float:
    """Seconds per call of ``run``, over ``repeat`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    return (time.perf_counter() - start) / repeat


def flop_counter_mode(model: torch.nn.Module, inputs: tuple) -> int:
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


def main(rounds: int) -> None:
    print(describe_machine())
    print(f"torch {torch.__version__}; median of {rounds} alternating rounds; meta device, no_grad\n")
    print(f"{'model':<38} {'plain s':>9} {'FlopCounterMode s':>18} {'rpx s':>9} {'rpx / FCM':>10}")
    for label, factory, build_kwargs, input_kwargs in CASES:
        model = build_on_meta(factory, **build_kwargs).eval()
        inputs = model.example_inputs(**input_kwargs)
        timings: dict[str, list[float]] = {"plain": [], "fcm": [], "rpx": []}
        with torch.no_grad():
            reference = flop_counter_mode(model, inputs)
            report = count_model(model, inputs)  # warm both paths once
            repeat = max(1, round(0.1 / seconds(lambda: model(*inputs))))
            for _ in range(rounds):
                timings["plain"].append(seconds(lambda: model(*inputs), repeat))
                timings["fcm"].append(seconds(lambda: flop_counter_mode(model, inputs), repeat))
                timings["rpx"].append(seconds(lambda: count_model(model, inputs), repeat))
        assert report.flops.matrix_flops == reference, "rpx and FlopCounterMode disagree on matrix FLOPs"
        plain, fcm, rpx = (statistics.median(timings[key]) for key in ("plain", "fcm", "rpx"))
        print(f"{label:<38} {plain:>9.3f} {fcm:>18.3f} {rpx:>9.3f} {rpx / fcm:>10.2f}")


def whole_job(rounds: int) -> None:
    """rpx.profile (Tier 1 + roofline, in this process) against FlopCounterMode on 7B-width Llama configs."""
    import attrs

    plugins = Plugins.load()
    print(f"\n{'whole job: llama2-7b width, seq 512':<38} {'FlopCounterMode s':>18} {'rpx.profile s':>14} {'ratio':>7}")
    for layers in (8, 32):
        config = attrs.evolve(model_zoo.LLAMA_PRESETS["llama2-7b"], n_layers=layers)
        model = build_on_meta(model_zoo.Llama, config=config).eval()
        inputs = model.example_inputs(batch=1, seq_len=512)
        shape = {"shape": [1, 512], "dtype": "int64", "high": config.vocab}

        def profile() -> object:
            return rpx.profile(model, inputs=[shape], stages=["count_params", "roofline"], gpus=["H100-SXM"],
                               options={"count_flops": {"count_on": "meta"}}, plugins=plugins)

        profile()  # warm both paths once
        with torch.no_grad():
            flop_counter_mode(model, inputs)
        timings: dict[str, list[float]] = {"fcm": [], "rpx": []}
        for _ in range(rounds):
            with torch.no_grad():
                timings["fcm"].append(seconds(lambda: flop_counter_mode(model, inputs)))
            timings["rpx"].append(seconds(profile))
        fcm, whole = statistics.median(timings["fcm"]), statistics.median(timings["rpx"])
        print(f"{f'{layers} layers':<38} {fcm:>18.3f} {whole:>14.3f} {whole / fcm:>7.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    whole_job(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
