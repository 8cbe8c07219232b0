"""Every bad input answered before anything runs: one line per problem, file and key path first, every problem of a
spec at once, exit code 2 (the table runs the real command-line entry point in this process, on real spec files)."""

from __future__ import annotations

import pytest

from rpx_core.cli import main

BASE = '''
[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = { in_features = 4, out_features = 2 }
inputs = [{ shape = [1, 4] }]
'''

#: case -> (spec text, extra arguments for `rpx run` (none: `rpx validate`), the exact stderr)
CASES = {
    'missing_file': (
        'stages = ["count_params"]\n[[models]]\nname = "m"\nsource = "missing.py:build"\ninputs = [{ shape = [1, 4] }]\n',
        [],
        'rpx: error: missing_file.toml: models[0].source: no such file {dir}/missing.py',
    ),
    'pipeline_unknown': (
        'stages = ["batch_search"]\n[options.batch_search]\npipeline = ["lin", "lni"]\n' + BASE,
        [],
        "rpx: error: pipeline_unknown.toml: options.batch_search.pipeline[1]: no model named 'lni' (the spec has 'lin'); did you mean 'lin'?",
    ),
    'device_banana': (
        'device = "banana"\n' + BASE,
        [],
        "rpx: error: device_banana.toml: device: 'banana' is not a device of backend 'cpu' (expected 'cpu' or 'cpu:<index>')",
    ),
    'precision_not_executable': (
        'precision = "tf32"\nstages = ["measure_latency"]\n' + BASE,
        [],
        "rpx: error: precision_not_executable.toml: precision: backend 'cpu' cannot execute 'tf32' (it executes fp32, bf16, fp16), which stage 'measure_latency' needs; choose another precision or drop 'measure_latency'",
    ),
    'count_on_choices': (
        '[options.count_flops]\ncount_on = "banana"\n' + BASE,
        [],
        "rpx: error: count_on_choices.toml: options.count_flops.count_on: must be in ('auto', 'meta', 'device') (got 'banana')",
    ),
    'keep_samples_string': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nkeep_samples = "false"\n' + BASE,
        [],
        "rpx: error: keep_samples_string.toml: options.measure_latency.keep_samples: expected true or false, got str 'false'",
    ),
    'nul_name': (
        'name = "a\\u0000b"\n' + BASE,
        [],
        'rpx: error: nul_name.toml: name: contains a NUL character',
    ),
    'empty_stages': (
        'stages = []\n' + BASE,
        [],
        'rpx: error: empty_stages.toml: stages: at least one stage is required (names from `rpx plugins`; omit the key for the default: count_params, count_flops, estimate_traffic, system_card)',
    ),
    'zero_dim': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [0, 4] }]\n',
        [],
        'rpx: error: zero_dim.toml: models[0].inputs[0].shape[0]: must be at least 1 (a zero dimension runs no work), got 0',
    ),
    'warmup_inf': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nwarmup_seconds = inf\n' + BASE,
        [],
        'rpx: error: warmup_inf.toml: options.measure_latency.warmup_seconds: expected a finite number, got inf',
    ),
    'max_seconds_nan': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmax_seconds = nan\n' + BASE,
        [],
        'rpx: error: max_seconds_nan.toml: options.measure_latency.max_seconds: expected a finite number, got nan',
    ),
    'top_typo': (
        'stagse = ["count_params"]\n' + BASE,
        [],
        "rpx: error: top_typo.toml: <top>: unknown key 'stagse'; did you mean 'stages'?",
    ),
    'stage_typo': (
        'stages = ["count_flop"]\n' + BASE,
        [],
        "rpx: error: stage_typo.toml: stages[0]: unknown stage 'count_flop'; did you mean 'count_flops'? (stages: batch_search, count_flops, count_params, estimate_traffic, measure_breakdown, measure_latency, measure_serving, roofline, serve, system_card)",
    ),
    'cli_stage_typo': (
        BASE,
        ['--stages', 'count_parms'],
        "rpx: error: cli_stage_typo.toml: --stages: unknown stage 'count_parms'; did you mean 'count_params'? (stages: batch_search, count_flops, count_params, estimate_traffic, measure_breakdown, measure_latency, measure_serving, roofline, serve, system_card)",
    ),
    'cli_empty_stages': (
        BASE,
        ['--stages', ','],
        'rpx: error: cli_empty_stages.toml: --stages: no stage given',
    ),
    'backend_typo': (
        'backend = "cpux"\n' + BASE,
        [],
        "rpx: error: backend_typo.toml: backend: 'cpux' not recognized. Choose one of: cpu, cuda, jax, mps",
    ),
    'gpu_typo': (
        'stages = ["roofline"]\ngpus = ["H100-SMX"]\n' + BASE,
        [],
        "rpx: error: gpu_typo.toml: gpus[0]: GPU 'H100-SMX' not recognized. Choose one of: H100-SXM, H200-SXM, A100-SXM-80GB, A100-PCIe-40GB, A100-PCIe-80GB, A100-SXM-40GB, Apple-M2-Max-38c, Apple-M3-Max-40c, H100-PCIe, Jetson-AGX-Orin-64GB, Jetson-Orin-Nano-8GB, L4, L40S, MI300X, RTX-3090, RTX-4090, RTX-6000-Ada, T4, TPU-v4, TPU-v5e, TPU-v5p, TPU-v6e, V100-SXM2-16GB, V100-SXM2-32GB",
    ),
    'options_unknown_stage': (
        '[options.count_flop]\nbackward = true\n' + BASE,
        [],
        "rpx: error: options_unknown_stage.toml: options.count_flop: unknown stage 'count_flop'; did you mean 'count_flops'?",
    ),
    'option_key_typo': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmax_secs = 1\n' + BASE,
        [],
        "rpx: error: option_key_typo.toml: options.measure_latency: unknown key 'max_secs'; did you mean 'max_seconds'?",
    ),
    'options_no_options': (
        '[options.count_params]\nx = 1\n' + BASE,
        [],
        "rpx: error: options_no_options.toml: options.count_params: stage 'count_params' takes no options",
    ),
    'max_seconds_negative': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmax_seconds = -1\n' + BASE,
        [],
        "rpx: error: max_seconds_negative.toml: options.measure_latency.max_seconds: must be > 0: -1",
    ),
    'max_seconds_absurd': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmax_seconds = 1e9\n' + BASE,
        [],
        "rpx: error: max_seconds_absurd.toml: options.measure_latency.max_seconds: must be at most a week (604800 s), is the unit right?: 1e+09",
    ),
    'max_seconds_over_stage_timeout': (
        'stages = ["measure_latency"]\n[execution]\nstage_timeout = 5\n[options.measure_latency]\nmax_seconds = 10\n' + BASE,
        [],
        'rpx: error: max_seconds_over_stage_timeout.toml: options.measure_latency.max_seconds: 10 s is not less than execution.stage_timeout (5 s), which would kill the stage first',
    ),
    'warmup_over_max': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmax_seconds = 1\nwarmup_seconds = 2\n' + BASE,
        [],
        'rpx: error: warmup_over_max.toml: options.measure_latency.warmup_seconds: 2 s is not less than max_seconds (1 s), which bounds the whole stage, warm-up included',
    ),
    'warmup_cap_over_max': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmax_seconds = 1\nwarmup_max_seconds = 1\n' + BASE,
        [],
        'rpx: error: warmup_cap_over_max.toml: options.measure_latency.warmup_max_seconds: 1 s is not less than max_seconds (1 s), which bounds the whole stage, warm-up included',
    ),
    'warmup_minimum_over_cap': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nwarmup_seconds = 2\nwarmup_max_seconds = 1\n' + BASE,
        [],
        'rpx: error: warmup_minimum_over_cap.toml: options.measure_latency.warmup_seconds: 2 s of warm-up at least cannot fit in warmup_max_seconds (1 s), the most it may take',
    ),
    'stage_timeout_zero': (
        '[execution]\nstage_timeout = 0\n' + BASE,
        [],
        "rpx: error: stage_timeout_zero.toml: execution.stage_timeout: must be > 0: 0",
    ),
    'stage_over_job': (
        '[execution]\nstage_timeout = 100\njob_timeout = 10\n' + BASE,
        [],
        "rpx: error: stage_over_job.toml: execution.stage_timeout: 100 s is longer than the job_timeout (10 s) that bounds all of a job's stages",
    ),
    'isolation_typo': (
        '[execution]\nisolation = "workers"\n' + BASE,
        [],
        "rpx: error: isolation_typo.toml: execution.isolation: expected one of 'auto', 'worker', 'in-process', got 'workers'; did you mean 'worker'?",
    ),
    'execution_key_typo': (
        '[execution]\nstage_timout = 5\n' + BASE,
        [],
        "rpx: error: execution_key_typo.toml: execution: unknown key 'stage_timout'; did you mean 'stage_timeout'?",
    ),
    'min_samples_zero': (
        'stages = ["measure_latency"]\n[options.measure_latency]\nmin_samples = 0\n' + BASE,
        [],
        "rpx: error: min_samples_zero.toml: options.measure_latency.min_samples: must be > 0: 0",
    ),
    'batch_sizes_zero': (
        'batch_sizes = [0, 2]\n' + BASE,
        [],
        'rpx: error: batch_sizes_zero.toml: batch_sizes[0]: must be at least 1 (a zero dimension runs no work), got 0',
    ),
    'batch_sizes_string': (
        'batch_sizes = "8"\n' + BASE,
        [],
        "rpx: error: batch_sizes_string.toml: batch_sizes: expected a list of integers, got str '8'",
    ),
    'batch_sizes_empty': (
        'batch_sizes = []\n' + BASE,
        [],
        'rpx: error: batch_sizes_empty.toml: batch_sizes: at least one batch size is required',
    ),
    'shape_string': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = "1,4" }]\n',
        [],
        "rpx: error: shape_string.toml: models[0].inputs[0].shape: expected a list of integers, got str '1,4'",
    ),
    'shape_bool': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [true, 4] }]\n',
        [],
        'rpx: error: shape_bool.toml: models[0].inputs[0].shape: expected an integer, got True',
    ),
    'dtype_typo': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [1, 4], dtype = "float23" }]\n',
        [],
        "rpx: error: dtype_typo.toml: models[0].inputs[0].dtype: expected one of 'float32', 'float16', 'bfloat16', 'float64', 'int64', 'int32', 'int16', 'int8', 'uint8', 'bool', got 'float23'; did you mean 'float32'?",
    ),
    'duplicate_models': (
        BASE + BASE,
        [],
        "\n".join([
            "rpx: error: duplicate_models.toml: models[0].name: 'lin' is used by more than one model",
            "rpx: error: duplicate_models.toml: models[1].name: 'lin' is used by more than one model",
        ]),
    ),
    'source_no_colon': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn.Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [1, 4] }]\n',
        [],
        "rpx: error: source_no_colon.toml: models[0].source: expected 'package.module:callable', 'file.py:callable' or a "
        "named model such as 'hf:gpt2'",
    ),
    'no_inputs': (
        '[[models]]\nname = "m"\nsource = "torch.nn:Linear"\n',
        [],
        'rpx: error: no_inputs.toml: models[0]: give inputs (shapes and dtypes), an input_shape or an input_factory',
    ),
    'batch_dim_range': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [1, 4], batch_dim = 2 }]\n',
        [],
        'rpx: error: batch_dim_range.toml: models[0].inputs[0].batch_dim: out of range for shape [1, 4]',
    ),
    'module_missing': (
        '\n[[models]]\nname = "lin"\nsource = "nosuchmodule.sub:build"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [1, 4] }]\n',
        [],
        "rpx: error: module_missing.toml: models[0].source: 'nosuchmodule.sub:build': cannot find module 'nosuchmodule' on the import path",
    ),
    'attribute_missing': (
        '\n[[models]]\nname = "lin"\nsource = "models.py:buidl"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [1, 4] }]\n',
        [],
        "rpx: error: attribute_missing.toml: models[0].source: 'models.py:buidl': models.py defines no 'buidl'; did you mean 'build'?",
    ),
    'factory_missing': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = { in_features = 4, out_features = 2 }\ninput_factory = "inputs.py:make"\n',
        [],
        'rpx: error: factory_missing.toml: models[0].input_factory: no such file {dir}/inputs.py',
    ),
    'output_template': (
        'output = "{nam}.toml"\n' + BASE,
        [],
        "rpx: error: output_template.toml: output: '{nam}.toml' is not a valid template: {nam} is not a field rpx fills; only {name} is (write {{ and }} for a literal brace)",
    ),
    'schema': (
        'schema = 2\n' + BASE,
        [],
        'rpx: error: schema.toml: schema: this rpx reads schema 1, the spec says 2',
    ),
    'on_unavailable': (
        'on_unavailable = "maybe"\n' + BASE,
        [],
        "rpx: error: on_unavailable.toml: on_unavailable: expected one of 'error', 'skip', got 'maybe'",
    ),
    'roofline_no_gpus': (
        'stages = ["roofline"]\n' + BASE,
        [],
        'rpx: error: roofline_no_gpus.toml: gpus: the roofline stage needs GPUs to bound: names from `rpx gpus`, or ["all"]',
    ),
    'pipeline_twice': (
        'stages = ["batch_search"]\n[options.batch_search]\npipeline = ["lin", "lin"]\n' + BASE,
        [],
        "rpx: error: pipeline_twice.toml: options.batch_search.pipeline[1]: model 'lin' is already in the pipeline",
    ),
    'base_dir': (
        'base_dir = "/"\n' + BASE,
        [],
        "rpx: error: base_dir.toml: base_dir: unknown key 'base_dir' (it is set from the spec's location)",
    ),
    'kwargs_not_table': (
        '\n[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\nkwargs = 3\ninputs = [{ shape = [1, 4] }]\n',
        [],
        'rpx: error: kwargs_not_table.toml: models[0].kwargs: expected a table',
    ),
    'choose_unknown_backend': (
        '[choose.backends]\ncpux = "cpu"\n' + BASE,
        [],
        "rpx: error: choose_unknown_backend.toml: choose.backends.cpux: no plugin registers backend 'cpux'; did you mean 'cpu'?",
    ),
    'not_toml': (
        'stages = [\n',
        [],
        'rpx: error: not_toml.toml: not valid TOML: Invalid value (at end of document)',
    ),
    'name_not_string': (
        'name = 3\n' + BASE,
        [],
        'rpx: error: name_not_string.toml: name: expected a string, got int 3',
    ),
    'gpu_packs_missing': (
        'gpu_packs = ["nopack.toml"]\n' + BASE,
        [],
        'rpx: error: gpu_packs_missing.toml: gpu_packs: nopack.toml: cannot read the pack: No such file or directory',
    ),
    'many_at_once': (
        'stages = ["count_flop"]\nbackend = "cpux"\ndevice = "banana"\n\n[[models]]\nname = "lin"\nsource = "gone.py:build"\nkwargs = { in_features = 4, out_features = 2 }\ninputs = [{ shape = [1, 4] }]\n',
        [],
        "\n".join([
            "rpx: error: many_at_once.toml: stages[0]: unknown stage 'count_flop'; did you mean 'count_flops'? (stages: batch_search, count_flops, count_params, estimate_traffic, measure_breakdown, measure_latency, measure_serving, roofline, serve, system_card)",
            "rpx: error: many_at_once.toml: backend: 'cpux' not recognized. Choose one of: cpu, cuda, jax, mps",
            'rpx: error: many_at_once.toml: models[0].source: no such file {dir}/gone.py',
        ]),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_refused_with_the_exact_message(case, tmp_path, monkeypatch, capsys):
    text, extra, expected = CASES[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text("def build():\n    pass\n")
    (tmp_path / f"{case}.toml").write_text(text)
    code = main(["run", f"{case}.toml", *extra] if extra else ["validate", f"{case}.toml"])
    assert code == 2
    assert capsys.readouterr().err.rstrip("\n") == expected.replace("{dir}", str(tmp_path))

