"""``rpx report``: one self-contained HTML file, checked as text and in a real headless browser (the system's
Chromium driven by Playwright): no console errors, tables sort on click, the charts render at a real size."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
RUN_A, RUN_B, BATCH = DATA / "run_a_results.toml", DATA / "run_b_other_shapes_results.toml", DATA / "batch_results.toml"
LLAMA_SHAPES, SWEEP = DATA / "llama2_70b_shapes_results.toml", DATA / "sweep_results.toml"
CHROMIUM = os.environ.get("RPX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "report", str(RUN_A), str(RUN_B), str(BATCH), "-o",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def test_the_file_is_self_contained(report):
    html = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "the report loads something from a network"
    assert html.count("<svg") == 3  # a roofline per run with one, the batch chart
    for heading in ("Tier 1", "Per operator", "Per module", "Batch search", "Comparison", "Provenance", "Contents"):
        assert heading in html
    assert "not comparable: input shapes differ" in html
    assert html.index('id="comparison"') < html.index('id="file-1"')  # several files: the comparison first


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (.ci/run installs it)")
def test_in_a_browser_loads_sorts_and_draws(report):
    playwright = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(report.as_uri())
        assert errors == []
        assert all(url.startswith("file:") for url in requests)

        table = page.locator("table[data-name=operators]").first
        column = "FLOPs"
        index = table.locator("thead th").all_inner_texts().index(column)
        table.locator("thead th").nth(index).click()

        def values() -> list[float]:
            return [float(v) for v in table.locator(f"tbody tr td:nth-child({index + 1})").evaluate_all(
                "cells => cells.map(c => c.getAttribute('data-value'))")]

        ascending = values()
        assert ascending == sorted(ascending) and len(ascending) > 3
        table.locator("thead th").nth(index).click()
        assert values() == sorted(ascending, reverse=True)

        charts = page.locator(".chart svg")
        assert charts.count() == 3
        for i in range(charts.count()):
            box = charts.nth(i).bounding_box()
            assert box["width"] > 200 and box["height"] > 150
            assert charts.nth(i).locator("path").count() > 20  # drawn lines and markers, not an empty frame
        assert errors == []
        browser.close()


def write_report(out: Path, *results: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "report", *map(str, results), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory) -> Path:
    """The 16-point Llama-2-70B shape sweep, the 2 x 3 CPU sweep with latency, and one model at one shape named
    with mathtext characters (its roofline labels its top operators)."""
    folder = tmp_path_factory.mktemp("sweeps")
    spec = folder / "one.toml"
    spec.write_text('stages = ["roofline"]\ngpus = ["H100-SXM", "A100-SXM-80GB"]\n[[models]]\nname = "budget_$1_$2"\n'
                    'source = "rpx_plugins.torch.zoo:tiny_transformer"\nkwargs = { vocab = 1000, max_seq = 128 }\n'
                    'inputs = [{ shape = [1, 64], dtype = "int64", high = 1000 }]\n')
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "run", str(spec), "-o", str(folder / "one.toml.out"),
                           "--format", "toml", "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return write_report(folder / "sweeps.html", LLAMA_SHAPES, SWEEP, folder / "one.toml.out")


def test_a_sweep_has_its_table_and_charts(sweep_report):
    html = sweep_report.read_text()
    assert html.count('data-name="sweep"') == 2  # the two sweeps; the single model has none
    assert "Sweep over seq_len" in html and "Sweep over batch_size, precision" in html
    assert len(re.findall(r'id="file-\d-chart-sweep"', html)) == 2
    assert len(re.findall(r'id="file-\d-chart-roofline"', html)) == 3
    assert "budget_$1_$2" in html  # a name with mathtext characters is drawn, not parsed


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (.ci/run installs it)")
def test_a_sweep_report_reads_at_1280_pixels(sweep_report):
    """At a 1280-pixel window: every contents link lands, no chart and no table is wider than the page, and every
    data label of a chart lies inside its axes (checked on the drawn SVG)."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(sweep_report.as_uri())
        broken = page.evaluate("""() => Array.from(document.querySelectorAll('nav.contents a'))
            .map(a => a.getAttribute('href')).filter(h => !document.getElementById(h.slice(1)))""")
        links = page.locator("nav.contents a").count()
        assert broken == [] and links > 10
        width = page.evaluate("() => document.documentElement.clientWidth")
        too_wide = page.evaluate("""(width) => Array.from(document.querySelectorAll('.chart svg, table'))
            .filter(e => e.getBoundingClientRect().right > width + 1).map(e => e.tagName + ' ' +
            (e.getAttribute('data-name') || ''))""", width)
        assert too_wide == []
        assert page.locator("[id$='-chart-sweep'] + .chart svg").count() == 2
        outside = page.evaluate("""() => {
            const bad = [];
            document.querySelectorAll('.chart svg').forEach((svg, index) => {
                svg.querySelectorAll('g[id=data-label]').forEach(label => {
                    const axes = label.closest('g[id^=axes]');
                    const frame = axes.querySelector('g[id^=patch] path').getBoundingClientRect();
                    const box = label.getBoundingClientRect();
                    if (box.left < frame.left - 1 || box.right > frame.right + 1 || box.top < frame.top - 1 ||
                        box.bottom > frame.bottom + 1) { bad.push(index + ': ' + label.textContent); }
                });
            });
            return bad; }""")
        labels = page.locator("g[id=data-label]").count()
        assert outside == [] and labels >= 3
        assert errors == []
        browser.close()
