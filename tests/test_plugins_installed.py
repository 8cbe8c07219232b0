"""Plugin loading rules, proven with plugin distributions really installed by pip and discovered by entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpx_core import __version__
from rpx_core.api import run_spec
from rpx_core.errors import PluginError, SpecError
from rpx_core.registry.manager import PluginLoadWarning, Plugins
from rpx_core.spec.schema import spec_from_dict
from tests.conftest import make_plugin_package, pip_install_target, rpx_cli

MODEL = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 8},
         "inputs": [{"shape": [1, 16]}]}


def env_with(*sites: Path) -> dict[str, str]:
    return {"PYTHONPATH": ":".join(str(site) for site in sites)}


@pytest.fixture
def with_example(example_plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(example_plugin_site))
    return example_plugin_site


def test_rpx_plugins_lists_the_installed_plugin_with_version_and_hooks(example_plugin_site):
    done = rpx_cli("plugins", "--json", env=env_with(example_plugin_site))
    assert done.returncode == 0, done.stderr
    example = next(info for info in json.loads(done.stdout)["plugins"] if info["name"] == "example")
    assert example["distribution"] == "rpx-example-plugin" and example["version"] == "0.3.0"
    assert example["builtin"] is False and example["status"] == "loaded"
    assert set(example["hooks"]) == {"rpx_register_backends", "rpx_count_params", "rpx_register_gpu_packs",
                                     "rpx_register_stages", "rpx_weights_report", "rpx_register_op_formulas"}


def test_plugin_gpu_pack_is_listed_by_rpx_gpus(example_plugin_site):
    done = rpx_cli("gpus", env=env_with(example_plugin_site))
    assert done.returncode == 0, done.stderr
    a10 = next(line for line in done.stdout.splitlines() if line.startswith("A10 "))
    assert "example-ampere" in a10 and "600 GB/s" in a10


def test_stage_override_applies_to_its_backend_only_and_new_stage_runs(with_example):
    plugins = Plugins.load()
    spec = {"models": [MODEL], "stages": ["weights_report"], "options": {"weights_report": {"unit": "MB"}}}
    own = run_spec(spec_from_dict({**spec, "backend": "cpu-1thread"}), plugins=plugins, output=None).model("lin")
    builtin = run_spec(spec_from_dict({**spec, "backend": "cpu"}), plugins=plugins, output=None).model("lin")
    assert own.stages["count_params"].provided_by == "example"
    assert builtin.stages["count_params"].provided_by == "torch-counts"
    # both implementations agree: 16*8 weights + 8 biases = 136 parameters, 544 bytes at fp32
    assert own.result("count_params").total == builtin.result("count_params").total == 16 * 8 + 8
    report = own.result("weights_report")
    assert type(report).__name__ == "WeightsReport"
    assert (report.unit, report.weights, report.precision) == ("MB", 136 * 4 / 1e6, "fp32")
    assert own.summary["weights_mb"] == 136 * 4 / 1e6  # the plugin stage's declared summary field
    assert own.stages["weights_report"].provided_by == "example"
    bf16 = {**spec, "precision": "bf16", "stages": ["count_params"]}
    for backend in ("cpu-1thread", "cpu"):
        params = run_spec(spec_from_dict({**bf16, "backend": backend}), plugins=plugins, output=None).model("lin")
        assert params.result("count_params").bytes_at_precision == 136 * 2  # bf16: 2 bytes per parameter


def test_the_example_plugin_prices_its_custom_operator(with_example):
    spec = spec_from_dict({"models": [{"name": "mlp", "source": "rpx_example_plugin.ops:fused_gelu_mlp",
                                       "inputs": [{"shape": [2, 16]}]}], "stages": ["count_flops"]})
    flops = run_spec(spec, plugins=Plugins.load(), output=None).model("mlp").result("count_flops")
    batch, width, hidden = 2, 16, 64
    assert flops.uncounted_ops == {} and flops.plugin_formulas == {"example.fused_gelu": "example"}
    assert flops.macs == 2 * batch * width * hidden  # the two linears
    gelu = 5 * batch * hidden  # the erf-form GELU's 5 FLOPs per element, as the plugin prices it
    assert flops.other_flops == batch * (hidden + width) + gelu  # bias adds + the custom operator
    assert flops.by_operator["example.fused_gelu"].other_flops == gelu


def test_loading_the_example_plugin_with_its_op_formulas_imports_no_torch(example_plugin_site):
    import os
    import subprocess
    import sys

    from tests.test_cli import NO_TORCH

    done = subprocess.run([sys.executable, "-c", NO_TORCH.format(args=["plugins"])], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env_with(example_plugin_site)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2:] == ["CODE: 0", "HEAVY:"], done.stdout[-500:] + done.stderr[-500:]
    assert "example" in done.stdout and "register_op_formulas" in done.stdout


def test_plugin_stage_options_are_validated(with_example):
    spec = spec_from_dict({"models": [MODEL], "stages": ["weights_report"], "options": {"weights_report": {"unti": "MB"}}})
    with pytest.raises(SpecError, match=r"s.toml: options.weights_report: unknown key 'unti'; did you mean 'unit'\?"):
        run_spec(spec, plugins=Plugins.load(), output=None, spec_path="s.toml")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_disabling_the_plugin_removes_everything_it_registered(example_plugin_site, write_spec, how):
    spec = write_spec('backend = "cpu-1thread"\nstages = ["count_params"]\n[[models]]\nname = "m"\nsource = "torch.nn:Identity"\n'
                      'inputs = [{ shape = [1, 2] }]\n')
    env = env_with(example_plugin_site)
    args = ["--disable", "example"] if how == "flag" else []
    if how == "env":
        env["RPX_DISABLE_PLUGINS"] = "example"
    listing = rpx_cli(*args, "plugins", "--json", env=env)
    assert next(i for i in json.loads(listing.stdout)["plugins"] if i["name"] == "example")["status"] == "disabled"
    done = rpx_cli(*args, "validate", str(spec), env=env)
    assert done.returncode == 2
    assert "backend: 'cpu-1thread' not recognized. Choose one of: cpu" in done.stderr


def test_builtin_plugins_can_be_disabled_like_any_other(write_spec):
    spec = write_spec('stages = ["system_card"]\n[[models]]\nname = "m"\nsource = "torch.nn:Identity"\ninputs = [{ shape = [1] }]\n')
    done = rpx_cli("--disable", "system-card", "run", str(spec), "-o", str(spec.with_suffix(".out.toml")))
    assert done.returncode == 1
    assert "no installed plugin implements stage 'system_card'" in done.stdout + done.stderr


def test_broken_plugin_warns_once_and_strict_mode_refuses(tmp_path):
    package = make_plugin_package(tmp_path / "src", "rpx-broken", "rpx_broken", "broken",
                                  "raise ImportError('needs libfoo')\n")
    site = pip_install_target(package, tmp_path / "site")
    done = rpx_cli("plugins", env=env_with(site))
    assert done.returncode == 0
    warning = [line for line in done.stderr.splitlines() if line.startswith("rpx: warning:")]
    assert len(warning) == 1
    assert "plugin 'broken' (rpx-broken 1.2.3) failed to import: ImportError: needs libfoo" in warning[0]
    strict = rpx_cli("--strict-plugins", "plugins", env=env_with(site))
    assert strict.returncode == 2 and "rpx: error: plugin 'broken' (rpx-broken 1.2.3) failed to import" in strict.stderr


def test_misspelled_hook_is_an_error_with_a_suggestion(tmp_path, monkeypatch):
    package = make_plugin_package(tmp_path / "src", "rpx-typo", "rpx_typo", "typo",
                                  "from rpx_core import hookimpl\n\n@hookimpl\ndef rpx_count_flop(ctx):\n    return None\n")
    monkeypatch.syspath_prepend(str(pip_install_target(package, tmp_path / "site")))
    with pytest.raises(PluginError, match="plugin 'typo': 'rpx_count_flop' is not an rpx hook; did you mean 'rpx_count_flops'"):
        Plugins.load()


def test_backend_name_clash_names_both_providers_unless_the_spec_chooses(tmp_path, monkeypatch):
    code = """
        from rpx_core import hookimpl
        from rpx_plugins.torch.cpu import CpuBackend

        @hookimpl
        def rpx_register_backends():
            return [CpuBackend()]
    """
    package = make_plugin_package(tmp_path / "src", "rpx-clash", "rpx_clash", "clash", code)
    monkeypatch.syspath_prepend(str(pip_install_target(package, tmp_path / "site")))
    plugins = Plugins.load()
    spec = {"models": [MODEL], "stages": ["count_params"]}
    with pytest.raises(SpecError) as info:
        run_spec(spec_from_dict(spec), plugins=plugins, output=None, spec_path="s.toml")
    message = str(info.value)
    assert message.startswith("s.toml: backend: backend 'cpu' is registered by plugin")
    assert f"plugin 'cpu' (rpx {__version__})" in message and "plugin 'clash' (rpx-clash 1.2.3)" in message
    chosen = run_spec(spec_from_dict({**spec, "choose": {"backends": {"cpu": "clash"}}}), plugins=plugins, output=None)
    assert chosen.model("lin").ok


def test_unknown_plugin_to_disable_is_a_warning():
    with pytest.warns(PluginLoadWarning, match="cannot disable unknown plugin"):
        Plugins.load(["no-such-plugin"])


def test_a_choice_must_name_a_plugin_that_registers_the_name():
    spec = spec_from_dict({"models": [MODEL], "stages": ["count_params"], "choose": {"backends": {"cpu": "nobody"}}})
    with pytest.raises(SpecError, match="choose.backends.cpu: 'nobody' does not register backend 'cpu'; it is registered by 'cpu'"):
        run_spec(spec, plugins=Plugins.load(), output=None)


def test_a_plugin_stage_gets_its_table_in_show_the_report_and_compare(with_example, tmp_path, capsys):
    """The example plugin declares its stage's table and compare figure through the public surface only; every
    display surface draws them, with no change to rpx (the commands run in this process, the plugin found by its
    entry point on the import path)."""
    from rpx_core.cli import main

    def rpx(*args: str) -> str:
        assert main(list(args)) == 0
        return capsys.readouterr().out

    spec = tmp_path / "w.toml"
    spec.write_text('stages = ["weights_report"]\n[options.weights_report]\nunit = "MB"\n[[models]]\nname = "lin"\n'
                    'source = "torch.nn:Linear"\nkwargs = { in_features = 16, out_features = 8 }\n'
                    'inputs = [{ shape = [1, 16] }]\n')
    weights = (16 * 8 + 8) * 4 / 1e6  # fp32 weights and bias in MB, by hand
    ended = rpx("run", str(spec), "-o", str(tmp_path / "a.toml"), "--isolation", "in-process")
    assert "Weight memory" in ended and f"{weights:.3g}" in ended  # the end of rpx run
    for fmt in ("table", "markdown"):
        shown = rpx("show", str(tmp_path / "a.toml"), "--format", fmt)
        assert "Weight memory" in shown and f"{weights:.3g}" in shown
    csv_text = rpx("show", str(tmp_path / "a.toml"), "--format", "csv", "--table", "weights")
    assert csv_text.splitlines()[0] == "model,precision,weights,unit" and f",{weights}," in csv_text
    data = json.loads(rpx("show", str(tmp_path / "a.toml"), "--format", "json"))
    assert data["tables"]["weights"]["rows"] == [["lin", "fp32", weights, "MB"]]
    rpx("report", str(tmp_path / "a.toml"), "-o", str(tmp_path / "r.html"))
    assert "Weight memory" in (tmp_path / "r.html").read_text()
    spec.write_text(spec.read_text().replace('unit = "MB"', 'unit = "MiB"'))
    rpx("run", str(spec), "-o", str(tmp_path / "b.toml"), "--isolation", "in-process")
    compared = rpx("compare", str(tmp_path / "a.toml"), str(tmp_path / "b.toml"))
    row = next(line for line in compared.splitlines() if "weight bytes" in line)
    assert "same" in row  # 0.544 MB and 0.519 MiB are the same bytes
    assert "Weight memory" not in rpx("show", str(tmp_path / "a.toml"), "--disable", "example")  # no plugin, no table
