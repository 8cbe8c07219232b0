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
    for heading in ("Tier 1", "Per operator", "Per module", "Batch search", "Comparison", "Provenance"):
        assert heading in html
    assert "not comparable: input shapes differ" in html


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
