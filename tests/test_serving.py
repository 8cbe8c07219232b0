"""Language models as they are served: the ``serve`` stage's counts against hand counts from the configuration, its
quantised formats, what fits on a GPU, and ``measure_serving`` on the CPU.

Models come from config.json files written here (Hugging Face Llama, built on the meta device, offline); every
expected figure is derived in the test from the configuration alone.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import attrs
import pytest

from rpx_core.errors import SpecError
from rpx_core.testing import make_context, run_stage
from rpx_core.types.serving import MeasureServingOptions, ServeOptions, ServeResult
from tests.conftest import REPO, rpx_cli
from tests.test_model_sources import LLAMA, OFFLINE

#: LLAMA's shape: hidden, query heads, key/value heads, head dimension, MLP, layers, vocabulary.
H, HEADS, KV_HEADS, D, FFN, LAYERS, VOCAB = 256, 4, 2, 64, 688, 2, 32000
#: Llama-2-70B's published shape.
LLAMA_70B = {**LLAMA, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64, "num_key_value_heads": 8}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def config_dir(tmp_path: Path, name: str, config: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def serve(folder: Path, precision: str = "bf16", gpus: tuple[str, ...] = (), shape=(1, 16),
          auto_class: str = "AutoModelForCausalLM", **options) -> ServeResult:
    ctx = make_context(f"hf:{folder}", stages=["serve"], precision=precision, gpus=list(gpus),
                       model_keys={"input_shape": list(shape), "kwargs": {"auto_class": auto_class}},
                       options={"serve": options})
    return run_stage("serve", ctx)


def linear_weights(hidden: int, heads: int, kv_heads: int, ffn: int) -> list[tuple[int, int]]:
    """(rows, input features) of one layer's matrix weights: q, k, v, o, gate, up, down."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    return [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (ffn, hidden), (ffn, hidden),
            (hidden, ffn)]


def layer_linear_macs(hidden=H, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN) -> int:
    """Multiply-accumulates of one layer's projections and MLP for one token."""
    return sum(rows * columns for rows, columns in linear_weights(hidden, heads, kv_heads, ffn))


def parameters(hidden=H, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN, layers=LAYERS, vocab=VOCAB) -> int:
    """Embedding, layers (projections, MLP, two RMS norms), final norm, untied output head."""
    per_layer = layer_linear_macs(hidden, heads, kv_heads, ffn) + 2 * hidden
    return vocab * hidden + layers * per_layer + hidden + hidden * vocab


def rotary_buffers(head_dim: int) -> int:
    """transformers' Llama rotary embedding keeps two buffers of head_dim / 2 inverse frequencies."""
    return 2 * head_dim // 2


def test_decode_step_flops_traffic_and_kv_cache_equal_hand_counts_at_three_contexts(tmp_path):
    folder = config_dir(tmp_path, "llama", LLAMA)
    batch, contexts = 3, (64, 512, 4096)
    result = serve(folder, contexts=list(contexts), batch_sizes=[batch])
    steps = {(step.context, step.batch_size): step for step in result.decode}
    weights_resident = (parameters() + rotary_buffers(D)) * 2
    for context in contexts:
        step = steps[context, batch]
        attention = 2 * HEADS * context * D  # QK^T and PV of the new token over `context` positions, per layer
        macs = batch * (LAYERS * (layer_linear_macs() + attention) + H * VOCAB)  # + the output head
        kv_cache = batch * context * LAYERS * 2 * KV_HEADS * D * 2  # keys and values of every position, bf16
        assert step.macs == macs, context
        assert step.matrix_flops == 2 * macs
        assert step.kv_cache_bytes == step.kv_read_bytes == kv_cache
        assert step.kv_written_bytes == batch * LAYERS * 2 * KV_HEADS * D * 2  # the new token's, once
        weights_read = weights_resident - (VOCAB - batch) * H * 2  # the embedding table: one row per sequence
        io = batch * 8 + batch * 8 + batch * VOCAB * 2  # token ids and positions (int64) in, logits (bf16) out
        assert (step.weight_bytes, step.io_bytes) == (weights_read, io)
        assert step.bytes == weights_read + kv_cache + step.kv_written_bytes + io
    assert result.weight_bytes == weights_resident
    assert result.kv_bytes_per_token == LAYERS * 2 * KV_HEADS * D * 2 == 1024


def test_prefill_counts_every_prompt_token_and_the_last_positions_logits(tmp_path):
    folder = config_dir(tmp_path, "llama", LLAMA)
    (step,) = serve(folder, shape=(2, 128)).prefill  # prompt and batch from the model's input
    prompt, batch = 128, 2
    attention = 2 * HEADS * prompt * prompt * D  # causal mask counted dense
    assert (step.batch_size, step.new_tokens, step.context) == (batch, prompt, prompt)
    assert step.macs == batch * (LAYERS * (prompt * layer_linear_macs() + attention) + H * VOCAB)
    assert step.kv_written_bytes == step.kv_cache_bytes == batch * prompt * LAYERS * 2 * KV_HEADS * D * 2


def test_grouped_query_attention_shrinks_the_kv_cache_by_the_ratio_of_query_to_key_value_heads(tmp_path):
    grouped = serve(config_dir(tmp_path, "gqa", {**LLAMA, "num_key_value_heads": 1}), contexts=[256])
    full = serve(config_dir(tmp_path, "mha", {**LLAMA, "num_key_value_heads": HEADS}), contexts=[256])
    assert full.kv_bytes_per_token == HEADS * grouped.kv_bytes_per_token
    for small, large in zip(grouped.decode, full.decode):
        assert large.kv_cache_bytes == HEADS * small.kv_cache_bytes
        assert large.kv_written_bytes == HEADS * small.kv_written_bytes


def int4_weight_bytes(rows: int, columns: int, group: int = 128) -> int:
    """4 bits per weight, one fp16 scale per group of `group` weights along each row's input."""
    return rows * columns // 2 + rows * math.ceil(columns / group) * 2


def test_weight_only_int4_changes_the_weight_bytes_by_its_convention_and_nothing_else(tmp_path):
    folder = config_dir(tmp_path, "llama", LLAMA)
    options = {"contexts": [64, 1024], "batch_sizes": [1, 4]}
    plain = serve(folder, gpus=("H100-SXM",), **options)
    int4 = serve(folder, gpus=("H100-SXM",), weights="int4", group_size=128, **options)
    per_layer = sum(rows * columns * 2 - int4_weight_bytes(rows, columns)
                    for rows, columns in linear_weights(H, HEADS, KV_HEADS, FFN))  # down_proj: 688 / 128 -> 6 groups
    saved = LAYERS * per_layer
    assert plain.weight_bytes - int4.weight_bytes == saved
    assert int4.quantised_weight_elements == LAYERS * layer_linear_macs()
    for before, after in zip(plain.prefill + plain.decode, int4.prefill + int4.decode):
        assert before.weight_bytes - after.weight_bytes == saved == before.bytes - after.bytes
        assert attrs.evolve(after, weight_bytes=before.weight_bytes, bytes=before.bytes) == before
    bounds_plain, bounds_int4 = plain.gpus["H100-SXM"], int4.gpus["H100-SXM"]
    assert [b.compute_ms for b in bounds_plain.decode] == [b.compute_ms for b in bounds_int4.decode]  # same peak
    assert bounds_int4.precision == "bf16"  # weight-only: dequantised to the activations' precision
    assert "int4 matrix weights (groups of 128 along the input, fp16 scales)" == int4.weight_format


def test_fp8_kv_cache_halves_the_cache_and_fp8_precision_prices_activations_at_one_byte(tmp_path):
    folder = config_dir(tmp_path, "llama", LLAMA)
    plain = serve(folder, contexts=[512])
    fp8_cache = serve(folder, contexts=[512], kv_cache="fp8")
    fp8 = serve(folder, precision="fp8", contexts=[512], gpus=("H100-SXM",))
    scales = LAYERS * 2 * 4  # one fp32 scale per cache tensor (keys and values of each layer)
    for before, after in zip(plain.decode, fp8_cache.decode):
        assert after.kv_cache_bytes == before.kv_cache_bytes // 2 + scales
        assert (after.flops, after.weight_bytes, after.io_bytes) == (before.flops, before.weight_bytes, before.io_bytes)
    assert fp8.weight_bytes == plain.weight_bytes // 2
    assert fp8.gpus["H100-SXM"].peak_tflops == 1978.9  # the fp8 peak applies
    assert [s.flops for s in fp8.decode] == [s.flops for s in plain.decode]


def test_the_largest_batch_of_a_70b_shaped_model_at_4096_on_an_80gb_gpu_equals_the_hand_computation(tmp_path):
    folder = config_dir(tmp_path, "llama70b", LLAMA_70B)
    hidden, heads, kv_heads, ffn, layers, vocab, context = 8192, 64, 8, 28672, 80, 32000, 4096
    options = {"prompt": 16, "contexts": [context], "batch_sizes": [1, 2]}
    ctx = make_context(f"hf:{folder}", stages=["serve"], precision="bf16", gpus=["H100-SXM"],
                       model_keys={"input_shape": [1, 16], "kwargs": {"auto_class": "AutoModelForCausalLM"}},
                       options={"serve": {**options, "weights": "int4"}})
    result = run_stage("serve", ctx)
    usable = 80 * 10**9 * 9 // 10  # memory_fraction 0.9 of the nominal 80 GB
    matrices = sum(int4_weight_bytes(rows, columns) for rows, columns in linear_weights(hidden, heads, kv_heads, ffn))
    others = (2 * vocab * hidden + (2 * layers + 1) * hidden + rotary_buffers(hidden // heads)) * 2  # bf16
    weights = layers * matrices + others
    kv_per_sequence = context * layers * 2 * kv_heads * (hidden // heads) * 2
    assert (result.weight_bytes, result.decode[0].kv_cache_bytes) == (weights, kv_per_sequence)
    (fit,) = result.gpus["H100-SXM"].capacities
    assert fit.kv_bytes_per_sequence == kv_per_sequence
    assert fit.max_batch == (usable - weights) // kv_per_sequence == 26
    # the counted activations (one decode step's peak, a few hundred kB per sequence) change nothing here
    assert fit.max_batch == math.floor((usable - weights - fit.activation_bytes_fixed)
                                       / (kv_per_sequence + fit.activation_bytes_per_sequence))
    assert fit.compute_bound_from_batch is None and "memory-bound at every batch" in fit.note
    ctx.job = attrs.evolve(ctx.job, options={**ctx.job.options, "serve": ServeOptions(**options)})
    at_bf16 = run_stage("serve", ctx)  # the same model, built once on meta
    (fit,) = at_bf16.gpus["H100-SXM"].capacities
    assert fit.max_batch == 0 and "not one sequence fits" in fit.note
    one = at_bf16.gpus["H100-SXM"].decode[0]
    assert one.gpus_needed == 2 == 2 ** math.ceil(math.log2(one.required_bytes / usable))
    assert one.bound_ms_on_gpus_needed == pytest.approx(one.bound_ms / 2)


def test_decode_turns_compute_bound_at_the_batch_where_its_compute_time_reaches_its_memory_time(tmp_path):
    wide = {**LLAMA, "hidden_size": 1024, "intermediate_size": 2752, "num_attention_heads": 8, "num_key_value_heads": 4}
    result = serve(config_dir(tmp_path, "llama", wide), gpus=("H100-SXM",), contexts=[16], batch_sizes=[1, 8])
    gpu = result.gpus["H100-SXM"]
    (capacity,) = gpu.capacities
    crossover = capacity.compute_bound_from_batch
    one, eight = (step for step in result.decode)
    peak, bandwidth = gpu.peak_tflops * 1e12, gpu.bandwidth_gb_s * 1e9

    def compute_bound(batch: int) -> bool:  # FLOPs and bytes are affine in batch: through the counts at 1 and 8
        flops = one.flops + (eight.flops - one.flops) * (batch - 1) / 7
        traffic = one.bytes + (eight.bytes - one.bytes) * (batch - 1) / 7
        return flops / peak >= traffic / bandwidth

    assert crossover is not None and compute_bound(crossover) and not compute_bound(crossover - 1)
    assert [bound.bottleneck for bound in gpu.decode] == ["memory", "memory"]


def test_a_model_that_takes_no_kv_cache_is_not_applicable(tmp_path):
    from rpx_core.errors import NotApplicable

    ctx = make_context("rpx_plugins.torch.zoo:tiny_transformer", inputs=[{"shape": [1, 16], "dtype": "int64"}],
                       stages=["serve"])
    with pytest.raises(NotApplicable, match=r"takes no KV cache in Hugging Face's convention"):
        run_stage("serve", ctx)


def test_a_model_without_its_output_head_is_counted_and_says_so(tmp_path):
    folder = config_dir(tmp_path, "llama", LLAMA)
    headless = serve(folder, auto_class="AutoModel", contexts=[64])
    full = serve(folder, contexts=[64])
    assert full.notes == ()
    (note,) = headless.notes
    assert "has no output head" in note and "--kwarg auto_class=AutoModelForCausalLM" in note
    for without, with_head in zip(headless.decode, full.decode):
        assert with_head.macs - without.macs == with_head.batch_size * H * VOCAB


def test_measure_serving_refuses_quantised_formats_before_anything_runs(tmp_path):
    folder = config_dir(tmp_path, "llama", LLAMA)
    with pytest.raises(SpecError, match=r"options\.serve\.weights: measure_serving times the model as the backend"):
        make_context(f"hf:{folder}", stages=["measure_serving"], model_keys={"input_shape": [1, 8]},
                     options={"serve": {"weights": "int4"}})


def test_decode_latency_on_the_cpu_grows_with_context_and_sits_beside_the_bound(tmp_path):
    """8 sequences of a small Llama at 128 and 1,024 positions: the step reads 8x the KV cache (4 MB against 34 MB,
    beside 7 MB of weights). The fastest call is compared: on a shared machine it is the figure other processes'
    load disturbs least."""
    import torch

    config = {**LLAMA, "intermediate_size": 512, "num_key_value_heads": HEADS, "vocab_size": 1000}
    folder = config_dir(tmp_path, "llama", config)
    ctx = make_context(f"hf:{folder}", stages=["measure_serving"], precision="fp32",
                       model_keys={"input_shape": [8, 8], "kwargs": {"auto_class": "AutoModelForCausalLM"}},
                       options={"serve": {"contexts": [128, 1024]},
                                "measure_serving": {"min_samples": 25, "max_seconds": 20}})
    ctx.results["serve"] = run_stage("serve", ctx)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a spinning second thread turns other processes' load into stalls
    try:
        measured = run_stage("measure_serving", ctx)
    finally:
        torch.set_num_threads(threads)
    steps = {(step.phase, step.context, step.batch_size): step for step in measured.steps}
    assert set(steps) == {("prefill", 8, 8), ("decode", 128, 8), ("decode", 1024, 8)}  # the batch sizes asked for
    short, long = steps["decode", 128, 8], steps["decode", 1024, 8]
    assert long.min_ms > short.min_ms, (short, long)
    assert all(step.samples >= 1 and step.bound_ms is None and step.efficiency is None for step in measured.steps)
    assert measured.gpu is None and measured.clock.startswith("time.perf_counter")
    assert short.tokens_per_s == pytest.approx(8 / (short.p50_ms / 1e3))


def test_serve_from_rpx_profile_with_options_on_the_command_line(tmp_path):
    config_dir(tmp_path, "llama", LLAMA)
    done = rpx_cli("profile", "hf:./llama", "--input", "1x64", "--stages", "serve", "--gpus", "H100-SXM",
                   "--kwarg", "auto_class=AutoModelForCausalLM", "--option", "serve.contexts=[128, 8192]",
                   "--option", "serve.batch_sizes=[1, 64]", "--precision", "bf16", "--save-spec", "saved.toml",
                   env=OFFLINE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = tomllib.loads((tmp_path / "rpx-results/llama.toml").read_text())["models"][0]["stages"]["serve"]
    assert result["status"] == "ok"
    decode = [(step["context"], step["batch_size"]) for step in result["result"]["decode"]]
    assert decode == [(128, 1), (128, 64), (8192, 1), (8192, 64)]
    saved = tomllib.loads((tmp_path / "saved.toml").read_text())
    assert saved["options"]["serve"] == {"contexts": [128, 8192], "batch_sizes": [1, 64]}
    assert saved["models"][0]["kwargs"] == {"auto_class": "AutoModelForCausalLM"}


def test_the_readme_documents_every_serving_option():
    text = (REPO / "README.md").read_text()
    for stage, options in (("serve", ServeOptions), ("measure_serving", MeasureServingOptions)):
        table = text[text.index(f"| `[options.{stage}]` key |"):].split("\n\n")[0]
        documented = re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)
        assert documented == list(attrs.fields_dict(options)), stage


def test_the_measured_cache_holds_real_keys_and_values_and_a_step_can_run_again(tmp_path):
    """A decode step against a cache filled by prefills in chunks, then rewound and run again, gives the logits of
    a full forward over the same tokens: the cache measured steps run against is a real one of that length."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rpx_plugins.serving.hf_cache import cache_argument, rewind, static_cache, step_arguments

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{**LLAMA, "vocab_size": 1000})).eval()
    argument = cache_argument(model, "llama")
    tokens = torch.randint(1000, (2, 50))
    with torch.inference_mode():
        full = model(input_ids=tokens, use_cache=False).logits[:, -1]
        cache = static_cache(model, 2, 50, torch.float32, "cpu")
        for start, stop in ((0, 30), (30, 49)):
            model(**step_arguments(model, argument, cache, tokens[:, start:stop], start=start))
        step = step_arguments(model, argument, cache, tokens[:, 49:], start=49)
        for _ in range(2):
            assert torch.allclose(model(**step).logits[:, -1], full, atol=1e-4)
            rewind(cache, 1)


def test_the_serving_tables_summary_and_charts_of_a_real_run():
    """tests/data/serving_results.toml: a miniature Llama through serve (H100-SXM, L4) and measure_serving (CPU)."""
    import io

    from rpx_core.api import load_results
    from rpx_plugins.stages.serving import capacity_table, measured_chart, measured_table, serving_chart, steps_table

    run = load_results(REPO / "tests" / "data" / "serving_results.toml")
    (model,) = run.models
    served = model.stages["serve"].result
    steps = steps_table(run)
    assert len(steps.rows) == 2 * (2 + 2 * 2)  # per GPU: the prefill at batch 1 and 4, decode at 2 contexts x 2 batches
    h100 = served.gpus["H100-SXM"]
    first_decode = steps.rows[2]  # after the two prefill rows of the first GPU
    assert [cell.value for cell in first_decode[1:5]] == ["H100-SXM", "decode", 1, 64]
    assert first_decode[8].value == h100.decode[0].bound_ms and first_decode[12].text == "yes"
    assert [row[5].value for row in capacity_table(run).rows] == [c.max_batch for gpu in served.gpus.values()
                                                                  for c in gpu.capacities]
    measured = measured_table(run)
    assert [(row[1].value, row[2].value, row[3].value) for row in measured.rows] == [
        ("prefill", 1, 16), ("prefill", 4, 16), ("decode", 1, 64), ("decode", 4, 64), ("decode", 1, 256),
        ("decode", 4, 256)]
    assert model.summary["ttft_h100_sxm_fp32_b1_ms"] == h100.prefill[0].bound_ms
    assert model.summary["max_batch_l4_fp32_c256"] == served.gpus["L4"].capacities[1].max_batch
    for chart in (serving_chart(run), measured_chart(run)):
        assert len([ax for ax in chart.axes if ax.get_visible()]) == 2
        chart.savefig(io.BytesIO(), format="svg")


def test_a_sweep_over_the_prompt_gives_one_serving_point_per_length(tmp_path):
    from rpx_core.api import run_spec
    from rpx_core.show.sweeps import sweep_table
    from rpx_core.spec.schema import spec_from_dict
    from tests.conftest import builtin_stages

    folder = config_dir(tmp_path, "llama", LLAMA)
    spec = spec_from_dict({"stages": ["serve"], "precision": "bf16", "gpus": ["H100-SXM"],
                           "execution": {"isolation": "in-process"}, "sweep": {"seq_len": [32, 128]},
                           "options": {"serve": {"contexts": [256]}},
                           "models": [{"name": "llama", "source": f"hf:{folder}", "input_shape": [1, 8],
                                       "kwargs": {"auto_class": "AutoModelForCausalLM"}}]})
    run = run_spec(spec, output=None)
    for prompt in (32, 128):
        served = run.model(f"llama[seq_len={prompt}]").result("serve")
        (prefill,) = served.prefill
        assert (served.prompt, prefill.new_tokens) == (prompt, prompt)
        assert prefill.macs == LAYERS * (prompt * layer_linear_macs() + 2 * HEADS * prompt * prompt * D) + H * VOCAB
    table = sweep_table(run, builtin_stages())
    assert "TTFT H100-SXM b1" in table.titles  # the prefill's bound changes with the prompt; decode's does not
    assert "TPOT H100-SXM c256 b1" not in table.titles
