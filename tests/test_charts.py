"""``rpx plot``: both charts drawn from results files of real runs, checked as valid images of sensible size."""

from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from rpx_core.api import load_results
from rpx_core.errors import RpxError
from rpx_core.show import charts, declared
from rpx_plugins.stages.batch_search import batch_chart
from rpx_plugins.stages.roofline import roofline_chart
from tests.conftest import builtin_stages

pytest.importorskip("matplotlib")  # in the test extra; the message without it is tested below

DATA = Path(__file__).parent / "data"
RUN_A, BATCH = DATA / "run_a_results.toml", DATA / "batch_results.toml"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("source, kind, name", [(RUN_A, "roofline", "roofline.png"), (BATCH, "batch", "batch.png")])
def test_png_charts_are_valid_and_sized(tmp_path, source, kind, name):
    out = tmp_path / name
    charts.save(declared.figure_for(load_results(source), kind, builtin_stages()), out)
    width, height = png_size(out)
    assert 500 <= width <= 3000 and 400 <= height <= 2000
    assert out.stat().st_size > 20_000  # lines, points and text, not a blank canvas


def test_roofline_has_a_roof_per_gpu_and_the_model_points():
    run = load_results(RUN_A)
    figure = roofline_chart(run)
    ax = figure.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    gpus = list(run.models[0].result("roofline").gpus)
    assert all(f"{gpu} fp32" in labels for gpu in gpus)
    assert "tiny-cnn measured on cpu (p50)" in labels and "tiny-cnn, fused traffic" in labels
    assert "tiny-transformer, fused traffic" in labels  # every model on one chart, with a legend
    assert ax.get_xscale() == ax.get_yscale() == "log"
    # the roof of the first GPU flattens at its peak
    roof = ax.get_lines()[0]
    peak = run.models[0].result("roofline").gpus[gpus[0]]["fp32"].peak_tflops * 1e12
    assert max(roof.get_ydata()) == pytest.approx(peak)
    charts.pyplot().close(figure)


def test_batch_chart_marks_failures_budget_and_choice():
    run = load_results(BATCH)
    result = run.run_stages["batch_search"].result
    figure = batch_chart(run)
    memory = figure.axes[1]
    labels = [line.get_label() for line in memory.get_lines()]
    assert any("failed" in label for label in labels)
    budget = next(line for line in memory.get_lines() if line.get_label() == "usable budget")
    assert budget.get_ydata()[0] == pytest.approx(result.usable_bytes / 1e6)
    assert any(f"chosen (trial {result.chosen_trial})" == line.get_label() for line in figure.axes[0].get_lines())
    charts.pyplot().close(figure)


def test_cli_svg_and_errors(tmp_path):
    out = tmp_path / "roof.svg"
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "plot", str(RUN_A), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    root = ElementTree.parse(out).getroot()
    assert root.tag.endswith("svg") and len(list(root.iter())) > 100
    wrong = subprocess.run([sys.executable, "-m", "rpx_core.cli", "plot", str(RUN_A), "--kind", "batch", "-o",
                            str(tmp_path / "b.png")], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "no batch search" in wrong.stderr and "Traceback" not in wrong.stderr


def test_without_matplotlib_the_message_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(RpxError, match=r"pip install 'rpx\[plot\]'"):
        charts.pyplot()
