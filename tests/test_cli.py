"""The CLI: fast commands never import torch; --version; one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rpx_core import __version__
from tests.conftest import rpx_cli

NO_TORCH = """
import sys
from rpx_core.cli import main
try:
    code = main({args!r})
except SystemExit as exit:
    code = exit.code
heavy = sorted(m for m in ("torch", "numpy", "jax") if m in sys.modules)
print("CODE:", code)
print("HEAVY:", ",".join(heavy))
"""


@pytest.mark.parametrize("args", [["--help"], ["plugins"], ["plugins", "--json"], ["gpus"], ["gpus", "H100-SXM"]])
def test_fast_commands_do_not_import_heavy_libraries(args):
    done = subprocess.run([sys.executable, "-c", NO_TORCH.format(args=args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2:] == ["CODE: 0", "HEAVY:"], done.stdout[-500:] + done.stderr[-500:]


def test_version():
    done = rpx_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"rpx {__version__}"


def test_missing_spec_is_one_line_exit_2(tmp_path):
    done = rpx_cli("run", str(tmp_path / "nope.toml"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"rpx: error: {tmp_path / 'nope.toml'}: no such spec file"


def test_plugins_lists_builtins_with_their_hooks():
    done = rpx_cli("plugins")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert "register_backends" in lines["cpu"] and "built-in" in lines["cpu"]
    assert "system_card" in lines["system-card"]
