"""The plugin guide (docs/plugins.md) cannot rot: its walk-through is extracted, pip-installed and run as written, and
its hook reference, GPU-pack schema, ``[choose]`` table and public-surface table are checked against the code."""

from __future__ import annotations

import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from rpx_core.registry import hookspecs
from rpx_core.registry.manager import Plugins
from tests.conftest import REPO, pip_install_target

GUIDE = REPO / "docs" / "plugins.md"
FILE_MARK = re.compile(r"^# file: (\S+)\n")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, in document order."""
    return re.findall(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", text, flags=re.DOTALL | re.MULTILINE)


def section(text: str, heading: str) -> str:
    """The text under the level-2 ``heading``, up to the next level-2 heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def walkthrough_blocks() -> list[tuple[str, str]]:
    return fenced_blocks(section(GUIDE.read_text(), "Walk-through: a plugin for the Acme N1"))


def write_walkthrough_files(folder: Path) -> list[Path]:
    """Write every ``# file: PATH`` block of the walk-through (blocks naming one file are joined in order)."""
    written: dict[Path, str] = {}
    for _, body in walkthrough_blocks():
        mark = FILE_MARK.match(body)
        if mark:
            path = folder / mark.group(1)
            written[path] = written.get(path, "") + body[mark.end() :]
    for path, content in written.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return list(written)


def command_line(command: str) -> list[str]:
    """A shell line of the guide, run with this interpreter (``rpx`` is ``python -m rpx_core.cli``)."""
    words = shlex.split(command)
    if words[0] == "rpx":
        return [sys.executable, "-m", "rpx_core.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"the guide runs only rpx and python commands, not {words[0]!r}")


def console_steps(body: str) -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip():
            steps[-1][1].append(line)
    return steps


def squeeze(line: str) -> str:
    return " ".join(line.split())


def assert_shown_lines_appear_in_order(shown: list[str], output: str, command: str) -> None:
    lines = [squeeze(line) for line in output.splitlines()]
    position = 0
    for expected in map(squeeze, shown):
        found = next((i for i in range(position, len(lines)) if expected in lines[i]), None)
        assert found is not None, f"`{command}`: {expected!r} not in the output (after line {position}):\n{output}"
        position = found + 1


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The walk-through's package folder, and the folder it is pip-installed into."""
    folder = tmp_path_factory.mktemp("acme")
    write_walkthrough_files(folder)
    return folder, pip_install_target(folder, tmp_path_factory.mktemp("acme-site"))


def test_the_walkthrough_runs_as_written(acme, monkeypatch):
    folder, site = acme
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(site))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    ran = {"console": 0, "python": 0}
    for language, body in walkthrough_blocks():
        if FILE_MARK.match(body):
            continue
        if language == "console":
            for command, shown in console_steps(body):
                done = subprocess.run(command_line(command), capture_output=True, text=True, cwd=folder, env=env,
                                      timeout=600)
                assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
                assert_shown_lines_appear_in_order(shown, done.stdout, command)
        elif language == "python":
            exec(compile(body, f"{GUIDE}: walk-through block", "exec"), {"__name__": "guide"})
        else:
            continue
        ran[language] += 1
    assert ran == {"console": 5, "python": 1}  # a block whose language changed would silently stop being run


def test_every_python_block_of_the_guide_compiles():
    for number, (language, body) in enumerate(fenced_blocks(GUIDE.read_text())):
        if language == "python":
            compile(body, f"{GUIDE}: block {number}", "exec")


def test_console_lines_are_matched_in_order():
    output = "a  b\nc\nd e\n"
    assert_shown_lines_appear_in_order(["a b", "d"], output, "x")
    with pytest.raises(AssertionError, match="'c' not in the output"):
        assert_shown_lines_appear_in_order(["d", "c"], output, "x")


# -- the reference parts, against the code ----------------------------------------------------------------------------


def hook_sections() -> dict[str, str]:
    """``### rpx_...`` heading -> its text, in the hook reference."""
    reference = section(GUIDE.read_text(), "Hook reference")
    parts = re.split(r"^### (\S+)\n", reference, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_hook_reference_is_the_last_part_of_the_guide():
    text = GUIDE.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[-1] == "Hook reference"


def test_the_hook_reference_documents_every_hook_with_its_signature_and_semantics():
    plugins = Plugins.load(entry_points=False)
    stages = {stage.hook: stage for stage in plugins.stages().unambiguous().values()}
    stage_specs = hookspecs.stage_hook_specs(stages.values())
    registration = {name: getattr(hookspecs, name) for name in dir(hookspecs) if name.startswith("rpx_register_")}
    sections = hook_sections()
    assert set(registration) | set(stages) <= set(sections), "hooks missing from the hook reference"
    for hook, text in sections.items():
        spec = registration.get(hook) or getattr(stage_specs, hook, None)
        assert spec is not None, f"### {hook}: no such hook in rpx_core/hookspecs.py or the built-in stages"
        arguments = ", ".join(inspect.signature(spec).parameters)
        signature = re.search(rf"def {hook}\(([^)]*)\) -> ([^:]+):", text)
        assert signature, f"### {hook}: no `def {hook}(...) -> ...:` signature block"
        assert re.sub(r": [^,]+", "", signature.group(1)) == arguments, f"### {hook}: arguments"
        first_result = spec.rpx_spec.get("firstresult", False)
        assert text.split("```\n\n", 1)[1].startswith("First result" if first_result else "Collected"), hook
        if hook in stages:
            assert signature.group(2) == f"{stages[hook].result.__name__} | None", f"### {hook}: return type"
        else:
            assert signature.group(2).startswith("list["), f"### {hook}: return type"


def table_keys(text: str, after: str) -> list[str]:
    """First-column backticked names of the markdown table that follows the line ``after``."""
    rows = text[text.index(after) :].split("\n\n")[1].splitlines()[2:]
    return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]


def test_the_gpu_pack_schema_lists_every_key_of_the_format():
    from rpx_core.precision import PRECISIONS
    from rpx_core.registry.gpus import SEGMENTS, GPUSpec, Peak, _PackHeader

    schema = section(GUIDE.read_text(), "The GPU-pack format")
    assert set(table_keys(schema, "`[pack]`:")) == set(attrs.fields_dict(_PackHeader))
    gpu_keys = set(attrs.fields_dict(GPUSpec)) - {"pack"}  # set by the loader; refused in a file (the text says so)
    assert set(table_keys(schema, "`[[gpu]]` (at least one):")) == gpu_keys
    assert set(table_keys(schema, "`[gpu.peaks.<precision>]`:")) == set(attrs.fields_dict(Peak))
    segment_row = next(line for line in schema.splitlines() if line.startswith("| `segment`"))
    peaks_row = next(line for line in schema.splitlines() if line.startswith("| `peaks`"))
    assert all(f"`{segment}`" in segment_row for segment in SEGMENTS)
    assert all(f"`{precision}`" in peaks_row for precision in PRECISIONS)


def test_the_walkthrough_pack_loads_with_every_documented_key(tmp_path):
    from rpx_core.registry.gpus import load_pack

    (path,) = [p for p in write_walkthrough_files(tmp_path) if p.suffix == ".toml" and p.parent.name == "rpx_acme"]
    gpu = load_pack(path, provider="rpx-acme 0.1.0").gpus[0]
    assert gpu.peak_flops("bf16") == 400e12 and gpu.bandwidth_bytes_s == 2000e9 and gpu.peaks["fp8"].estimate


def test_the_choose_table_has_a_row_per_choice():
    from rpx_core.spec.schema import Choices

    choose = section(GUIDE.read_text(), "The `[choose]` table")
    documented = set(re.findall(r"^\| `choose\.(\w+)` \|", choose, flags=re.MULTILINE))
    assert documented == set(attrs.fields_dict(Choices))
    assert all(f"[choose.{name}]" in choose for name in attrs.fields_dict(Choices))


def test_the_public_surface_table_names_everything_rpx_core_plugin_exports():
    import rpx_core.plugin as surface

    table = section(GUIDE.read_text(), "The public surface")
    named = set(re.findall(r"`(\w+)`", table))
    assert set(surface.__all__) <= named, set(surface.__all__) - named


# -- a second, independent plugin written from the guide alone --------------------------------------------------------

FLEET = REPO / "tests" / "plugins" / "rpx-fleet"


@pytest.fixture(scope="module")
def fleet_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_install_target(FLEET, tmp_path_factory.mktemp("fleet-site"))


def test_the_second_plugin_is_found_by_its_entry_point(fleet_site):
    import json

    from tests.conftest import rpx_cli

    done = rpx_cli("plugins", "--json", env={"PYTHONPATH": str(fleet_site)})
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    fleet = next(info for info in listing["plugins"] if info["name"] == "fleet")
    assert (fleet["distribution"], fleet["version"], fleet["status"]) == ("rpx-fleet", "2.0.0", "loaded")
    assert set(fleet["hooks"]) == {"rpx_register_gpu_packs", "rpx_register_stages", "rpx_fleet_memory",
                                   "rpx_register_op_formulas"}
    assert listing["stage_hook_order"]["fleet_memory"] == ["fleet"]


def test_the_second_plugin_runs_its_run_scoped_stage_pack_and_formula(fleet_site, monkeypatch):
    from rpx_core.api import run_spec
    from rpx_core.spec.schema import spec_from_dict

    monkeypatch.syspath_prepend(str(fleet_site))
    linear = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 8},
              "inputs": [{"shape": [1, 16]}]}
    mlp = {"name": "mlp", "source": "rpx_fleet.models:gelu_mlp", "inputs": [{"shape": [1, 16]}]}
    spec = spec_from_dict({"models": [linear, mlp], "precision": "fp16", "gpus": ["Fleet-E1"],
                           "stages": ["roofline", "fleet_memory"]})
    run = run_spec(spec, plugins=Plugins.load(), output=None)
    # lin: 16 x 8 + 8 = 136 parameters, mlp: 16 x 32 + 32 = 544, each 2 bytes at fp16; the E1 holds 0.001 GB = 1e6 bytes
    memory = run.run_stages["fleet_memory"]
    assert memory.status == "ok" and memory.provided_by == "fleet" and type(memory.result).__name__ == "FleetMemory"
    assert memory.result.weights_bytes == {"lin": 272, "mlp": 1088} and memory.result.total_bytes == 1360
    assert (memory.result.gpu_memory_bytes, memory.result.fits) == (10**6, True)
    # lin on the E1 at fp16: 320 fused bytes (272 weights, 32 input, 16 output) / 100 GB/s against 264 FLOP / 20 TFLOP/s
    bound = run.model("lin").result("roofline").gpus["Fleet-E1"]["fp16"]
    assert bound.bound_ms_fused == pytest.approx(320 / 100e9 * 1e3) and bound.bottleneck_fused == "memory"
    # mlp: the plugin's GELU at 1 FLOP per element instead of rpx's 5; 32 bias additions
    flops = run.model("mlp").result("count_flops")
    assert flops.macs == 16 * 32 and flops.other_flops == 32 + 32 and flops.plugin_formulas == {"aten.gelu": "fleet"}


def test_the_second_plugin_checks_its_options_before_anything_runs(fleet_site, monkeypatch):
    from rpx_core.api import run_spec
    from rpx_core.errors import SpecError
    from rpx_core.spec.schema import spec_from_dict

    monkeypatch.syspath_prepend(str(fleet_site))
    spec = spec_from_dict({"models": [{"name": "m", "source": "torch.nn:Identity", "inputs": [{"shape": [1, 2]}]}],
                           "gpus": ["L4"], "stages": ["fleet_memory"]})
    with pytest.raises(SpecError, match=r"^s.toml: options.fleet_memory.gpu: 'Fleet-E1' is not one of the spec's gpus \(L4\)$"):
        run_spec(spec, plugins=Plugins.load(), output=None, spec_path="s.toml")


# -- the ordering the guide states ------------------------------------------------------------------------------------

TRYLAST_COUNT = """
from rpx_core.plugin import ParamsResult, hookimpl


@hookimpl(trylast=True)
def rpx_count_params(ctx):
    return ParamsResult(total=-1, trainable=0, non_trainable=-1, buffers=0, bytes_at_precision=0,
                        precision=ctx.job.precision)
"""


def test_third_party_trylast_implementations_come_after_the_builtins(tmp_path, monkeypatch):
    package = tmp_path / "rpx-late"
    package.mkdir()
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "rpx-late"\nversion = "1.0"\n'
        '[project.entry-points.rpx]\nalpha = "rpx_late_alpha"\nomega = "rpx_late_omega"\n'
        '[tool.setuptools]\npy-modules = ["rpx_late_alpha", "rpx_late_omega"]\n')
    for module in ("rpx_late_alpha", "rpx_late_omega"):
        (package / f"{module}.py").write_text(TRYLAST_COUNT)
    monkeypatch.syspath_prepend(str(pip_install_target(package, tmp_path / "site")))
    plugins = Plugins.load()
    assert plugins.hook_order("rpx_count_params") == ["jax-counts", "torch-counts", "omega", "alpha"]
    from rpx_core.api import run_spec
    from rpx_core.spec.schema import spec_from_dict

    model = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 8},
             "inputs": [{"shape": [1, 16]}]}
    run = run_spec(spec_from_dict({"models": [model], "stages": ["count_params"]}), plugins=plugins, output=None)
    assert run.model("lin").stages["count_params"].provided_by == "torch-counts"  # the built-in answers for cpu
    assert run.model("lin").result("count_params").total == 136


RIVAL_ENERGY = """
from rpx_core.plugin import Stage, hookimpl


@hookimpl
def rpx_register_stages():
    return [Stage("energy", "a rival declaration of the walk-through's stage", needs=("count_params",))]
"""


def test_choose_stages_settles_two_declarations_of_one_stage(acme, tmp_path, monkeypatch):
    from rpx_core.api import run_spec
    from rpx_core.errors import SpecError
    from rpx_core.spec.schema import spec_from_dict
    from tests.conftest import make_plugin_package

    rival = make_plugin_package(tmp_path / "src", "rpx-rival-energy", "rpx_rival_energy", "rival", RIVAL_ENERGY)
    monkeypatch.syspath_prepend(str(pip_install_target(rival, tmp_path / "site")))
    monkeypatch.syspath_prepend(str(acme[1]))
    plugins = Plugins.load()
    model = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 8},
             "inputs": [{"shape": [1, 16]}]}
    spec = {"models": [model], "stages": ["energy"]}
    with pytest.raises(SpecError, match=r"stage 'energy' is registered by plugin '(acme|rival)' .* \[choose\.stages\]"):
        run_spec(spec_from_dict(spec), plugins=plugins, output=None)
    chosen = run_spec(spec_from_dict({**spec, "choose": {"stages": {"energy": "acme"}}}), plugins=plugins, output=None)
    lin = chosen.model("lin")
    assert list(lin.stages) == ["count_flops", "estimate_traffic", "energy"]  # acme's declaration: its needs
    assert type(lin.result("energy")).__name__ == "EnergyEstimate"
    with pytest.raises(SpecError, match=r"choose\.stages\.energy: 'nobody' does not register stage 'energy'"):
        run_spec(spec_from_dict({**spec, "choose": {"stages": {"energy": "nobody"}}}), plugins=plugins, output=None)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE),
                          flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_link_to_a_section_of_the_guide_or_the_readme_exists():
    documents = {"docs/plugins.md": GUIDE, "README.md": REPO / "README.md"}
    anchors = {name: heading_anchors(path.read_text()) for name, path in documents.items()}
    for name, path in documents.items():
        for target, anchor in re.findall(r"\]\(([\w./]*)#([\w-]+)\)", path.read_text()):
            linked = str((path.parent / target).resolve().relative_to(REPO)) if target else name
            assert anchor in anchors[linked], f"{name}: link to {linked}#{anchor}: no such heading"
