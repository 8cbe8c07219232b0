"""A plugin whose registration hook returns garbage is named and left out; the tool goes on without it.

One real distribution, pip-installed, with a plugin per kind of garbage: GPU packs that are a number and a missing
file, backends that are a string, a backend without a name, stages that are dicts, a GPU pack whose figures are nan
and 1e300. Every command keeps working (``rpx plugins`` lists each problem), and ``--strict-plugins`` makes the first
one an error.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import pip_install_target, rpx_cli

PLUGINS = {
    "packs42": "def rpx_register_gpu_packs():\n    return [42, '/nonexistent']\n",
    "stringy": "def rpx_register_backends():\n    return 'cpu'\n",
    "nameless": ("from rpx_core.plugin import Backend\n\nclass Nameless(Backend):\n    pass\n\n"
                 "def rpx_register_backends():\n    return [Nameless()]\n"),
    "dicts": "def rpx_register_stages():\n    return [{'name': 'energy'}]\n",
    "nanpack": ("from pathlib import Path\n\ndef rpx_register_gpu_packs():\n"
                "    return [Path(__file__).with_name('nan_gpus.toml')]\n"),
}

NAN_PACK = """
[pack]
name = "nanpack"
version = "1"
source = "made up"

[[gpu]]
name = "Nan-1"
vendor = "Acme"
segment = "datacenter"
memory_gb = nan
memory_type = "HBM3"
bandwidth_gb_s = 1e300
source = "made up"

[gpu.peaks.fp32]
tflops = inf
"""

SPEC = """
stages = ["roofline"]
gpus = ["L4"]
output = "out.toml"

[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = { in_features = 4, out_features = 2 }
inputs = [{ shape = [1, 4] }]
"""


@pytest.fixture(scope="module")
def garbage_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("garbage")
    package = root / "rpx-garbage"
    (package / "rpx_garbage").mkdir(parents=True)
    entry_points = "\n".join(f'{name} = "rpx_garbage.{name}"' for name in PLUGINS)
    (package / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "rpx-garbage"
        version = "0.0.1"
        [tool.setuptools.package-data]
        rpx_garbage = ["*.toml"]
        [project.entry-points.rpx]
    """) + entry_points + "\n")
    (package / "rpx_garbage" / "__init__.py").write_text("")
    (package / "rpx_garbage" / "nan_gpus.toml").write_text(NAN_PACK)
    for name, code in PLUGINS.items():
        (package / "rpx_garbage" / f"{name}.py").write_text(code)
    return pip_install_target(package, root / "site")


def test_every_command_works_and_names_each_broken_plugin(garbage_site: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(garbage_site)}
    listing = rpx_cli("plugins", env=env)
    assert listing.returncode == 0, listing.stderr
    expected = [
        "packs42: failed: plugin 'packs42': rpx_register_gpu_packs returned int 42, not the path of a GPU-pack file "
        "at index 0",
        "stringy: failed: plugin 'stringy': rpx_register_backends returned str 'cpu', not a list",
        "nameless: failed: plugin 'nameless': rpx_register_backends returned a Backend whose name is str '', not a "
        "non-empty string at index 0",
        "dicts: failed: plugin 'dicts': rpx_register_stages returned dict {'name': 'energy'}, not a Stage at index 0",
    ]
    for line in expected:
        assert f"problem: {line}" in listing.stdout
    assert "problem: plugin 'nanpack': GPU pack left out: " in listing.stdout
    assert "nan_gpus.toml: gpu[0].memory_gb: expected a finite number, got nan" in listing.stdout
    assert "nan_gpus.toml: gpu[0].peaks.fp32.tflops: expected a finite number, got inf" in listing.stdout
    assert "nan_gpus.toml: gpu[0].bandwidth_gb_s: must be at most 1e+06, got 1e+300" in listing.stdout

    for command in (["backends"], ["gpus"], ["gpus", "L4"]):
        done = rpx_cli(*command, env=env)
        assert done.returncode == 0, (command, done.stderr)
        assert "rpx: warning: plugin 'stringy': rpx_register_backends returned str 'cpu', not a list" in done.stderr
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    done = rpx_cli("validate", str(spec), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rpx: warning: plugin 'nanpack': GPU pack left out: " in done.stderr
    assert "internal error" not in done.stderr


def test_strict_plugins_make_the_first_broken_one_an_error(garbage_site: Path) -> None:
    done = rpx_cli("backends", "--strict-plugins", env={"PYTHONPATH": str(garbage_site)})
    assert done.returncode == 2
    assert done.stderr.startswith("rpx: error: plugin '") and len(done.stderr.strip().splitlines()) == 1
