"""Names are shown as text on every surface: a model named ``budget_$1_$2`` is no formula to matplotlib, and escape
sequences in names (from a spec, a results file, a GPU pack or a plugin) reach no terminal raw: tables in every
format, ``rpx run``'s progress lines, ``rpx plugins``, ``rpx gpus``, ``rpx backends`` and error lines show them as
visible escapes (rpx_core.show.text). Real ``rpx`` processes; a real pip-installed plugin."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import HOSTILE_NAME, make_plugin_package, pip_install_target, rpx_cli

SHOWN = r"budget_$1_$2\x1b]0;pwned\x07\x1b[31mred\u202e"  # HOSTILE_NAME as every surface writes it
RAW = ("\x1b", "\x07", "\u202e")  # none of these may reach a terminal

PLUGIN = '''
from rpx_core.plugin import Availability, Backend, ModelSource, hookimpl


class Blinking(Backend):
    name = "blinking"
    description = "a backend whose reason holds escape sequences"

    def probe(self):
        return Availability(False, "needs \\x1b]0;pwned\\x07\\x1b[5mblinking\\x1b[0m hardware")


@hookimpl
def rpx_register_backends():
    return [Blinking()]


@hookimpl
def rpx_register_model_sources():
    return [ModelSource(scheme="blink", description="models \\x1b[2Jthat clear the screen",
                        build=lambda target, config: None, inputs=lambda target, shape, config: ())]
'''


def no_raw_escapes(done: subprocess.CompletedProcess) -> str:
    """stdout and stderr together, once none of RAW is in them."""
    text = done.stdout + done.stderr
    assert not any(char in text for char in RAW), text
    return text


def test_a_name_with_dollars_draws_as_text_in_plot_and_report(roofline_results, tmp_path):
    results, _ = roofline_results
    for command, output in (("plot", "chart.svg"), ("report", "report.html")):
        done = rpx_cli(command, str(results), "-o", str(tmp_path / output), timeout=120)
        assert done.returncode == 0, done.stderr
        assert "budget_$1_$2" in (tmp_path / output).read_text()  # the title as written, not typeset maths


def test_run_progress_and_tables_show_escapes_in_names_as_text(roofline_results):
    _, run = roofline_results
    assert f"  {SHOWN} count_flops        ok" in no_raw_escapes(run)


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv"])
def test_show_writes_escapes_in_names_as_text_in_every_format(roofline_results, fmt):
    results, _ = roofline_results
    done = rpx_cli("show", str(results), "--format", fmt, *(["--table", "tier1"] if fmt == "csv" else []), timeout=120)
    assert done.returncode == 0, done.stderr
    assert SHOWN in no_raw_escapes(done)


def test_compare_writes_escapes_in_names_as_text(roofline_results):
    results, _ = roofline_results
    done = rpx_cli("compare", str(results), str(results), timeout=120)
    assert done.returncode == 0, done.stderr
    assert SHOWN in no_raw_escapes(done)


def test_gpus_shows_a_pack_s_names_and_notes_as_text(tmp_path):
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent("""
        [pack]
        name = "esc\\u001b[31m"
        version = "1"
        source = "a test"
        [[gpu]]
        name = "Blink\\u001b]0;pwned\\u0007"
        vendor = "nobody"
        segment = "datacenter"
        memory_gb = 16
        memory_type = "HBM"
        bandwidth_gb_s = 1000
        source = "a test"
        notes = "clears \\u001b[2J the screen"
        [gpu.peaks.fp32]
        tflops = 10
    """))
    env = {"RPX_GPU_PACKS": str(pack)}
    listing, described = rpx_cli("gpus", env=env, timeout=120), rpx_cli("gpus", "blink", env=env, timeout=120)
    assert listing.returncode == described.returncode == 0, listing.stderr + described.stderr
    assert r"Blink\x1b]0;pwned\x07" in no_raw_escapes(listing)
    assert r"clears \x1b[2J the screen" in no_raw_escapes(described)


@pytest.fixture(scope="module")
def blinking_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pip-installed plugin whose backend reason and model-source description hold escape sequences."""
    root = tmp_path_factory.mktemp("blinking")
    package = make_plugin_package(root / "src", "rpx-blinking", "rpx_blinking", "blinking", PLUGIN)
    return pip_install_target(package, root / "site")


def test_plugins_and_backends_show_what_a_plugin_says_as_text(blinking_plugin):
    env = {"PYTHONPATH": str(blinking_plugin)}
    plugins, backends = rpx_cli("plugins", env=env, timeout=120), rpx_cli("backends", env=env, timeout=120)
    assert plugins.returncode == backends.returncode == 0, plugins.stderr + backends.stderr
    assert r"models \x1b[2Jthat clear the screen" in no_raw_escapes(plugins)
    assert r"needs \x1b]0;pwned\x07\x1b[5mblinking\x1b[0m hardware" in no_raw_escapes(backends)


def test_error_lines_show_what_they_quote_as_text(tmp_path):
    done = rpx_cli("show", str(tmp_path / "\x1b[2Jgone.toml"), timeout=120)
    assert done.returncode == 2
    assert no_raw_escapes(done) == f"rpx: error: {tmp_path}/\\x1b[2Jgone.toml: no such results file\n"
    warned = rpx_cli("gpus", "--disable", "\x1b]0;pwned\x07", timeout=120)
    assert r"cannot disable unknown plugin(s): \x1b]0;pwned\x07" in no_raw_escapes(warned)


def test_shown_writes_every_character_a_terminal_would_obey_as_its_escape():
    from rpx_core.show.text import shown

    assert shown(HOSTILE_NAME) == SHOWN
    assert shown("tab\tnew\nline\x7f\x9b1m\u2028\u200b") == r"tab\tnew\nline\x7f\x9b1m\u2028\u200b"
    assert shown("ResNet-50 · fp16 [b=8] ünïcödé 模型 $x$") == "ResNet-50 · fp16 [b=8] ünïcödé 模型 $x$"  # unchanged
