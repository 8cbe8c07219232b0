"""The plugin API as a third party meets it: stages declared once, the public surface, defensive loading, ordering.

Every plugin here is a real distribution, pip-installed offline into a temporary folder and found by entry point.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from rpx_core.api import load_results, run_spec
from rpx_core.errors import PluginError, RpxError, SpecError
from rpx_core.registry.manager import Plugins
from rpx_core.spec.schema import spec_from_dict
from rpx_core.testing import make_context, run_stage
from tests.conftest import EXAMPLE_PLUGIN, REPO, make_plugin_package, pip_install_target, rpx_cli

LINEAR = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 8},
          "inputs": [{"shape": [1, 16]}]}
LINEAR_TOML = """
[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = { in_features = 16, out_features = 8 }
inputs = [{ shape = [1, 16] }]
"""


def install(tmp_path: Path, dist: str, plugin_name: str, code: str) -> Path:
    module = dist.replace("-", "_")
    package = make_plugin_package(tmp_path / "src", dist, module, plugin_name, code)
    return pip_install_target(package, tmp_path / f"site-{plugin_name}")


def env_with(*sites: Path) -> dict[str, str]:
    return {"PYTHONPATH": ":".join(str(site) for site in sites)}


# -- a third-party stage behaves like a built-in one ------------------------------------------------------------------

OVERRIDE = """
from rpx_core.plugin import hookimpl
from rpx_example_plugin.plugin import WeightsReport


@hookimpl
def rpx_weights_report(ctx):
    # another plugin answers the example plugin's stage, for the cpu backend only
    if ctx.backend.name != "cpu":
        return None
    return WeightsReport(unit="MB", weights=-1.0, precision=ctx.results["count_params"].precision)
"""


def test_a_plugin_stage_is_ordered_validated_overridable_and_reloaded_like_a_builtin(example_plugin_site, tmp_path,
                                                                                     monkeypatch):
    override_site = install(tmp_path, "rpx-override", "override", OVERRIDE)
    monkeypatch.syspath_prepend(str(example_plugin_site))
    monkeypatch.syspath_prepend(str(override_site))
    plugins = Plugins.load()
    spec = {"models": [LINEAR], "stages": ["weights_report"], "options": {"weights_report": {"unit": "MiB"}}}
    own = run_spec(spec_from_dict({**spec, "backend": "cpu-1thread"}), plugins=plugins, output=tmp_path / "own.toml")
    model = own.model("lin")
    assert list(model.stages) == ["count_params", "weights_report"]  # its dependency was pulled in and ran first
    assert model.result("weights_report").weights == 136 * 4 / 2**20 and model.stages["weights_report"].provided_by == "example"
    overridden = run_spec(spec_from_dict({**spec, "backend": "cpu"}), plugins=plugins, output=None).model("lin")
    assert overridden.stages["weights_report"].provided_by == "override"  # per-backend override, like count_flops
    assert overridden.result("weights_report").weights == -1.0
    reloaded = load_results(tmp_path / "own.toml", plugins=plugins).model("lin").result("weights_report")
    assert reloaded == model.result("weights_report") and type(reloaded).__name__ == "WeightsReport"
    with pytest.raises(SpecError, match=r"s.toml: options.weights_report.unit: must be in \('MB', 'MiB'\) \(got 'kB'\)$"):
        run_spec(spec_from_dict({**spec, "options": {"weights_report": {"unit": "kB"}}}), plugins=plugins,
                 output=None, spec_path="s.toml")
    assert plugins.hook_order("rpx_weights_report") == ["override", "example"]


def test_plugin_stages_show_in_rpx_plugins_and_in_hook_traces(example_plugin_site, write_spec, tmp_path):
    listing = rpx_cli("plugins", "--json", env=env_with(example_plugin_site))
    assert json.loads(listing.stdout)["stage_hook_order"]["weights_report"] == ["example"]
    spec = write_spec('backend = "cpu-1thread"\nstages = ["weights_report"]\n' + LINEAR_TOML)
    done = rpx_cli("run", str(spec), "-o", str(tmp_path / "r.toml"), env={**env_with(example_plugin_site),
                                                                          "RPX_TRACE_HOOKS": "1"})
    assert done.returncode == 0, done.stderr
    assert "rpx: hook rpx_weights_report [example] -> WeightsReport" in done.stderr
    assert "rpx: hook rpx_count_params [example] -> ParamsResult" in done.stderr


# -- the public surface ---------------------------------------------------------------------------------------------


def rpx_imports(path: Path) -> set[str]:
    """Every rpx module a Python file imports, at any depth of the file (functions and TYPE_CHECKING blocks too);
    ``from package import module`` counts as importing that module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                is_module = (REPO / Path(*submodule.split("."))).with_suffix(".py").exists()
                found.add(submodule if is_module else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("rpx_core", "rpx_plugins")}


def test_the_example_plugin_imports_only_the_public_surface():
    for path in (EXAMPLE_PLUGIN / "rpx_example_plugin").rglob("*.py"):
        assert rpx_imports(path) <= {"rpx_core.plugin"}, path


def test_the_plugins_written_from_the_guide_import_only_the_public_surface(tmp_path):
    """The guide's walk-through plugin (as extracted from docs/plugins.md; its own tests may also use the testing
    helper) and the independent one in the tests."""
    from tests.test_plugin_guide import FLEET, write_walkthrough_files

    guide_files = [path for path in write_walkthrough_files(tmp_path) if path.suffix == ".py"]
    fleet_files = list((FLEET / "rpx_fleet").rglob("*.py"))
    assert {path.name for path in guide_files} >= {"plugin.py", "ops.py"} and len(fleet_files) >= 2
    for path in [*guide_files, *fleet_files]:
        allowed = {"rpx_core.plugin", "rpx_core.testing"} if path.parent.name == "tests" else {"rpx_core.plugin"}
        assert rpx_imports(path) <= allowed, path
    assert any(rpx_imports(path) == {"rpx_core.plugin"} for path in guide_files)  # the check sees the imports


def test_the_public_surface_exports_what_it_lists():
    import rpx_core.plugin as surface

    assert all(hasattr(surface, name) for name in surface.__all__)
    assert {"hookimpl", "Backend", "TorchBackend", "Stage", "StageContext", "RunContext", "Precision", "GPUSpec",
            "ParamsResult", "FlopsResult", "RpxError", "UnsupportedError"} <= set(surface.__all__)


def test_no_import_cycles_among_rpx_modules():
    modules = {}
    for root in ("rpx_core", "rpx_plugins"):
        for path in (REPO / root).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: {target for target in rpx_imports(path) if target in modules and target != name}
             for name, path in modules.items()}
    # a module imports its package's __init__ only if it says so; an import of a.b.c imports a.b.c
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*stack[stack.index(target):], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_testing_helper_runs_a_hook_without_a_run():
    import torch

    ctx = make_context(torch.nn.Linear(16, 8), inputs=[(4, 16)], stages=["count_flops"])
    flops = run_stage("count_flops", ctx)
    assert flops.macs == 4 * 16 * 8 and ctx.options("count_flops").count_on == "auto"
    assert ctx.precision.element_bytes == 4 and ctx.precision.dtype("torch") == "float32"


def test_the_testing_helper_takes_the_spec_backend_by_name():
    import torch

    ctx = make_context(torch.nn.Linear(16, 8), inputs=[(1, 16)], backend="cpu", stages=["count_params"])
    assert ctx.backend.name == ctx.job.backend == "cpu"
    with pytest.raises(SpecError, match=r"make_context\(\): backend: 'no-such' not recognized. Choose one of: cpu"):
        make_context(torch.nn.Linear(16, 8), inputs=[(1, 16)], backend="no-such", stages=["count_params"])


# -- defensive, diagnosable loading -----------------------------------------------------------------------------------

RIVAL_PACK = """
[pack]
name = "rival"
version = "1.0"
description = "a pack redefining a reference GPU"
source = "test"

[[gpu]]
name = "H100-SXM"
vendor = "NVIDIA"
segment = "datacenter"
memory_gb = 80
memory_type = "HBM3"
bandwidth_gb_s = 1
source = "test"

[gpu.peaks.fp32]
tflops = 1
"""

CLASHING = """
from pathlib import Path

from rpx_core.plugin import CpuBackend, hookimpl


@hookimpl
def rpx_register_backends():
    return [CpuBackend()]


@hookimpl
def rpx_register_gpu_packs():
    return [Path(__file__).with_name("rival.toml")]
"""


def test_a_name_clash_fails_only_the_specs_and_commands_that_use_the_name(tmp_path, write_spec):
    site = install(tmp_path, "rpx-rival", "rival", CLASHING)
    (site / "rival.toml").write_text(RIVAL_PACK)
    env = env_with(site)
    gpus = rpx_cli("gpus", env=env)
    assert gpus.returncode == 0, gpus.stderr
    assert "clash: GPU 'H100-SXM' is defined by pack" in gpus.stdout and "L4" in gpus.stdout
    assert re.search(r"^H100-SXM \(clash\) +reference \(rpx ", gpus.stdout, re.M)
    assert re.search(r"^H100-SXM \(clash\) +rival \(rpx-rival 1.2.3\)", gpus.stdout, re.M)
    one = rpx_cli("gpus", "h100-sxm", env=env)  # the command that diagnoses the clash shows both definitions
    assert one.returncode == 0, one.stderr
    assert "pack: reference (rpx " in one.stdout and "pack: rival (rpx-rival 1.2.3)" in one.stdout
    assert one.stdout.count("  clash: GPU 'H100-SXM' is defined by pack") == 2
    rows = [row for row in json.loads(rpx_cli("gpus", "--json", env=env).stdout) if row["name"] == "H100-SXM"]
    assert sorted(row["pack"].split()[0] for row in rows) == ["reference", "rival"]
    assert all(row["clash"].startswith("GPU 'H100-SXM' is defined by pack") for row in rows)
    plugins = rpx_cli("plugins", env=env)
    assert plugins.returncode == 0 and "problem: backend 'cpu' is registered by 'rival', 'cpu'" in plugins.stdout
    clash = next(line for line in plugins.stdout.splitlines() if line.startswith("problem: GPU 'H100-SXM' is defined"))
    assert "pack reference (rpx " in clash and "pack rival (rpx-rival 1.2.3)" in clash
    l4 = write_spec('backend = "cpu"\nstages = ["roofline"]\ngpus = ["L4"]\nchoose = { backends = { cpu = "cpu" } }\n'
                    + LINEAR_TOML, name="l4.toml")
    assert rpx_cli("validate", str(l4), env=env).returncode == 0
    h100 = write_spec('stages = ["roofline"]\ngpus = ["H100-SXM"]\nchoose = { backends = { cpu = "cpu" } }\n'
                      + LINEAR_TOML, name="h100.toml")
    done = rpx_cli("validate", str(h100), env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "gpus[0]: GPU 'H100-SXM' is defined by pack" in done.stderr and '[choose.gpus]' in done.stderr
    unchosen = write_spec('stages = ["count_params"]\n' + LINEAR_TOML, name="cpu.toml")
    done = rpx_cli("validate", str(unchosen), env=env)
    assert done.returncode == 2
    assert (f"{unchosen}: backend: backend 'cpu' is registered by plugin 'rival' (rpx-rival 1.2.3) and by plugin 'cpu'"
            in done.stderr) and '[choose.backends] "cpu" = "rival"' in done.stderr


def test_a_hook_without_its_marker_is_registered_not_dropped(tmp_path, monkeypatch):
    code = "def rpx_count_params(ctx):\n    return None\n"  # no @hookimpl
    monkeypatch.syspath_prepend(str(install(tmp_path, "rpx-unmarked", "unmarked", code)))
    plugins = Plugins.load()
    assert "unmarked" in plugins.hook_order("rpx_count_params")
    assert next(info for info in plugins.infos() if info.name == "unmarked").hooks == ("rpx_count_params",)


def test_wrong_argument_names_are_one_line_naming_the_plugin_and_the_arguments(tmp_path, write_spec):
    code = "from rpx_core.plugin import hookimpl\n\n@hookimpl\ndef rpx_count_flops(context):\n    return None\n"
    env = env_with(install(tmp_path, "rpx-args", "args", code))
    spec = write_spec('stages = ["count_params"]\n' + LINEAR_TOML)
    done = rpx_cli("validate", str(spec), env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "plugin 'args': rpx_count_flops(context) takes 'context'; rpx_count_flops passes: ctx" in done.stderr
    listing = rpx_cli("plugins", env=env)  # the command to diagnose it still works, and shows it
    assert listing.returncode == 0 and "args" in listing.stdout and "[invalid: plugin 'args'" in listing.stdout


def test_a_registration_that_raises_leaves_its_plugin_out_with_a_warning_naming_it(tmp_path):
    code = "def rpx_register_backends():\n    raise RuntimeError('no driver')\n"
    env = env_with(install(tmp_path, "rpx-raising", "raising", code))
    listing = rpx_cli("plugins", env=env)
    assert listing.returncode == 0
    assert "[failed: plugin 'raising': rpx_register_backends raised RuntimeError: no driver]" in listing.stdout
    backends = rpx_cli("backends", env=env)  # every other command works without it, and says so
    assert backends.returncode == 0 and "cpu" in backends.stdout
    assert "rpx: warning: plugin 'raising': rpx_register_backends raised RuntimeError: no driver" in backends.stderr
    strict = rpx_cli("backends", "--strict-plugins", env=env)
    assert strict.returncode == 2 and strict.stderr.strip() == (
        "rpx: error: plugin 'raising': rpx_register_backends raised RuntimeError: no driver")


def test_misspelled_hook_makes_its_plugin_invalid_with_a_suggestion(tmp_path, monkeypatch):
    code = "from rpx_core.plugin import hookimpl\n\n@hookimpl\ndef rpx_count_flop(ctx):\n    return None\n"
    monkeypatch.syspath_prepend(str(install(tmp_path, "rpx-typo", "typo", code)))
    with pytest.raises(PluginError, match="plugin 'typo': 'rpx_count_flop' is not an rpx hook; did you mean 'rpx_count_flops'"):
        Plugins.load()
    tolerant = Plugins.load(tolerant=True)
    assert next(info for info in tolerant.infos() if info.name == "typo").status == "invalid"
    assert "typo" not in tolerant.hook_order("rpx_count_flops")


def test_a_failed_stage_names_the_plugin_that_was_answering(tmp_path, monkeypatch):
    code = "from rpx_core.plugin import hookimpl\n\n@hookimpl\ndef rpx_count_params(ctx):\n    raise ValueError('boom')\n"
    monkeypatch.syspath_prepend(str(install(tmp_path, "rpx-raises", "raises", code)))
    run = run_spec(spec_from_dict({"models": [LINEAR], "stages": ["count_params"]}), plugins=Plugins.load(), output=None)
    record = run.model("lin").stages["count_params"]
    assert record.status == "failed" and record.error == "ValueError: boom" and record.provided_by == "raises"


ANSWERS = """
from rpx_core.plugin import ParamsResult, hookimpl


@hookimpl{marker}
def rpx_count_params(ctx):
    return ParamsResult(total={total}, trainable=0, non_trainable={total}, buffers=0, bytes_at_precision=0,
                        precision=ctx.job.precision)
"""


def test_plugins_are_asked_alphabetically_and_tryfirst_goes_first(tmp_path, monkeypatch):
    for name, total, marker in (("beta", 2, ""), ("alpha", 1, ""), ("gamma", 3, "(tryfirst=True)")):
        site = install(tmp_path, f"rpx-{name}", name, ANSWERS.format(total=total, marker=marker))
        monkeypatch.syspath_prepend(str(site))
    plugins = Plugins.load()
    assert plugins.hook_order("rpx_count_params") == ["gamma", "alpha", "beta", "jax-counts", "torch-counts"]
    run = run_spec(spec_from_dict({"models": [LINEAR], "stages": ["count_params"]}), plugins=plugins, output=None)
    assert run.model("lin").result("count_params").total == 3
    assert run.model("lin").stages["count_params"].provided_by == "gamma"


# -- precision resolved in the plan -----------------------------------------------------------------------------------


def test_validate_refuses_a_precision_the_backend_cannot_execute_for_the_stages_asked(write_spec):
    spec = write_spec('precision = "tf32"\nstages = ["measure_latency"]\n' + LINEAR_TOML)
    done = rpx_cli("validate", str(spec))
    assert done.returncode == 2
    assert ("precision: backend 'cpu' cannot execute 'tf32' (it executes fp32, bf16, fp16), which stage "
            "'measure_latency' needs") in done.stderr
    counted = write_spec('precision = "tf32"\nstages = ["count_params", "count_flops"]\n' + LINEAR_TOML, name="c.toml")
    assert rpx_cli("validate", str(counted)).returncode == 0  # counting on meta executes nothing
    on_device = write_spec('precision = "tf32"\nstages = ["count_flops"]\n[options.count_flops]\ncount_on = "device"\n'
                           + LINEAR_TOML, name="d.toml")
    assert "which stage 'count_flops' needs" in rpx_cli("validate", str(on_device)).stderr


def test_display_code_names_no_builtin_stage():
    """rpx_core/show and the commands draw what the stage declarations give them: a string equal to a built-in
    stage's name there would be display code that knows a built-in stage."""
    from rpx_plugins.stages import BUILTIN_STAGES

    names = {stage.name for stage in BUILTIN_STAGES}
    found = []
    for folder in ("show", "commands"):
        for path in (REPO / "rpx_core" / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_importing_the_public_surface_imports_no_plugin():
    code = ("import sys, rpx_core.plugin; "
            "print(sorted(m for m in sys.modules if m.startswith('rpx_plugins') or m in ('torch', 'jax')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_call_next_gives_the_answer_of_the_plugins_after_this_one():
    import types

    from rpx_core.plugin import ParamsResult, call_next, hookimpl

    @hookimpl
    def rpx_count_params(ctx):
        built_in = call_next(ctx)  # the torch count, then one figure adjusted
        return attrs.evolve(built_in, bytes_at_precision=built_in.bytes_at_precision * 2)

    plugins = Plugins.load()
    plugins.register(types.SimpleNamespace(rpx_count_params=rpx_count_params), "doubler")
    ctx = make_context(torch_linear(), inputs=[(1, 16)], stages=["count_params"], plugins=plugins)
    params = run_stage("count_params", ctx)
    assert isinstance(params, ParamsResult) and params.total == 136 and params.bytes_at_precision == 2 * 136 * 4
    with pytest.raises(RpxError, match=r"call_next\(ctx\) is for a stage hook's body"):
        call_next(ctx)


def test_the_cost_table_prices_an_operation_by_name():
    from rpx_core.plugin import cost_table

    assert (cost_table.per_element("mul"), cost_table.per_element("sigmoid"), cost_table.per_element("_softmax")) == (
        1, 4, cost_table.SOFTMAX)
    with pytest.raises(KeyError, match="no operation 'mull'; did you mean 'mul'"):
        cost_table.per_element("mull")


def torch_linear():
    import torch

    return torch.nn.Linear(16, 8)
