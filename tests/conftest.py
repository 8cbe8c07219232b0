"""Shared fixtures: real plugin packages installed with pip into a throwaway folder, and spec files on disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: rpx's caches (``rpx backends``' availability) go to a folder of the test session, never the user's home.
os.environ.setdefault("RPX_CACHE_DIR", tempfile.mkdtemp(prefix="rpx-test-cache-"))
EXAMPLE_PLUGIN = REPO / "examples" / "rpx-example-plugin"


def pip_install_target(source: Path, target: Path) -> Path:
    """Really install a plugin distribution (metadata, entry points and all) into ``target``, offline. The source is
    copied first, so the build's leftovers (build/, *.egg-info) never land in the repository."""
    copy = target.with_name(target.name + "-src")
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(copy)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return target


@pytest.fixture(scope="session")
def example_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the example plugin package is pip-installed; put it on sys.path/PYTHONPATH to activate it."""
    return pip_install_target(EXAMPLE_PLUGIN, tmp_path_factory.mktemp("example-site"))


def make_plugin_package(root: Path, dist: str, module: str, plugin_name: str, code: str) -> Path:
    """Write a minimal plugin distribution (pyproject + module) to ``root`` and return its folder."""
    package = root / dist
    package.mkdir(parents=True)
    (package / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{dist}"
        version = "1.2.3"
        [project.entry-points.rpx]
        {plugin_name} = "{module}"
        [tool.setuptools]
        py-modules = ["{module}"]
    """))
    (package / f"{module}.py").write_text(textwrap.dedent(code))
    return package


def rpx_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real ``rpx`` command in a subprocess (killed, and the test failed, past ``timeout`` seconds)."""
    return subprocess.run(
        [sys.executable, "-m", "rpx_core.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


@pytest.fixture
def write_spec(tmp_path: Path):
    """Write a spec TOML file into tmp_path and return its path."""

    def write(text: str, name: str = "spec.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def builtin_stages() -> dict:
    """The stage declarations of the built-in plugins (what the display code draws tables from)."""
    from rpx_core.registry.manager import Plugins

    return Plugins.load(tolerant=True).stages().in_load_order()


def console_text(run) -> str:
    """What ``rpx run`` prints when it ends for ``run`` (its tables, as piped to a file)."""
    import io

    from rpx_core.show import declared
    from rpx_core.show import formats as render

    out = io.StringIO()
    render.terminal(declared.tables(run, builtin_stages()), [], out)
    return out.getvalue()


#: A model name no surface may obey: a formula to matplotlib ($...$), a window title (OSC) and a colour (CSI) to a
#: terminal, and a right-to-left override.
HOSTILE_NAME = "budget_$1_$2\x1b]0;pwned\x07\x1b[31mred\u202e"


@pytest.fixture(scope="session")
def roofline_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A real ``rpx run`` of a tiny model named HOSTILE_NAME (counts and a roofline on an L4): its results file and
    the finished process (what it printed)."""
    import json

    folder = tmp_path_factory.mktemp("hostile")
    spec = folder / "spec.toml"
    spec.write_text(textwrap.dedent(f"""
        backend = "cpu"
        stages = ["count_flops", "estimate_traffic", "roofline"]
        gpus = ["L4"]
        [[models]]
        name = {json.dumps(HOSTILE_NAME)}
        source = "torch.nn:Linear"
        kwargs = {{ in_features = 4, out_features = 2 }}
        inputs = [{{ shape = [1, 4] }}]
    """))
    done = rpx_cli("run", str(spec), "-o", str(folder / "results.toml"))
    assert done.returncode == 0, done.stderr
    return folder / "results.toml", done
