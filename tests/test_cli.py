"""The CLI: fast commands never import torch; --version; one-line errors."""

from __future__ import annotations

import json
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
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "register_backends" in lines["cpu"] and "built-in" in lines["cpu"]
    assert "system_card" in lines["system-card"]
    # the order plugins are asked in, per stage hook: the JAX counter passes on torch models, then the torch one answers
    assert lines["count_flops"].split(None, 1)[1] == "jax-counts -> torch-counts"


SPEC = """
stages = ["count_params"]
[[models]]
name = "lin"
source = "torch.nn:Linear"
kwargs = { in_features = 4, out_features = 2 }
inputs = [{ shape = [1, 4] }]
"""


def test_format_json_is_written_exactly_where_o_says(write_spec, tmp_path):
    done = rpx_cli("run", str(write_spec(SPEC)), "-o", str(tmp_path / "res.toml"), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "res.toml").read_text())["models"][0]["stages"]["count_params"]["status"] == "ok"
    assert not (tmp_path / "res.json").exists()


def test_unwritable_output_is_one_line_before_anything_runs(write_spec, tmp_path):
    (tmp_path / "afile").write_text("")
    done = rpx_cli("run", str(write_spec(SPEC)), "-o", str(tmp_path / "afile" / "x.toml"))
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"rpx: error: cannot write {tmp_path / 'afile' / 'x.toml'}: ")
    assert "count_params" not in done.stderr  # failed before the first stage


def test_bad_output_template_is_a_spec_error(write_spec):
    done = rpx_cli("validate", str(write_spec('output = "{nam}.toml"\n' + SPEC)))
    assert done.returncode == 2 and "output: '{nam}.toml' is not a valid template" in done.stderr


def test_corrupt_results_file_is_one_line(tmp_path):
    import rpx_core as rpx
    from rpx_core.errors import RpxError

    (tmp_path / "r.toml").write_text("schema_version = 1\nmodels = 3\n")
    with pytest.raises(RpxError, match=r"r.toml: not an rpx results file"):
        rpx.load_results(tmp_path / "r.toml")


def test_global_options_work_before_and_after_the_command(tmp_path):
    done = rpx_cli("--disable", "cuda", "plugins", "--json", "--disable", "mps")
    status = {info["name"]: info["status"] for info in json.loads(done.stdout)["plugins"]}
    assert status["cuda"] == status["mps"] == "disabled" and status["cpu"] == "loaded"
    after = rpx_cli("validate", str(tmp_path / "none.toml"), "--debug")
    assert after.returncode != 0 and "Traceback" in after.stderr


def test_rpx_backends_columns_line_up_for_long_names(tmp_path):
    """A backend named longer than the built-in ones (a plugin's) keeps every column aligned."""
    from tests.conftest import make_plugin_package, pip_install_target

    package = make_plugin_package(tmp_path, "rpx-longname", "rpx_longname", "longname", """
        from rpx_core.plugin import CpuBackend, hookimpl

        class Long(CpuBackend):
            name = "a-backend-with-a-long-name"

        @hookimpl
        def rpx_register_backends():
            return [Long()]
    """)
    site = pip_install_target(package, tmp_path / "site")
    done = rpx_cli("backends", env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    starts = {line.index("available") if " available" in line else line.index("unavailable") for line in lines}
    assert len(lines) >= 4 and len(starts) == 1
