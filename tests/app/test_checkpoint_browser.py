"""The checkpoint panel in headless Debian Chromium: the figures of `runwatch advise --json`, and the what-if."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.app.checkpoint_views import figure_text, size_text
from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, RESULTS, _wait_idle, dashboard_server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(demo_root: Path) -> Iterator[str]:
    with dashboard_server(demo_root) as url:
        yield url


def _legend(panel) -> str:
    return " ".join(e.get_attribute("aria-label") or "" for e in panel.locator("[aria-label]").all())


def test_panel_matches_advise_json_and_draws_the_whatif(server: str, demo_root: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    out = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "advise", "--root", str(demo_root), "--run",
                          "demo-rollback", "--json"], capture_output=True, text=True, timeout=180, check=True)
    d = json.loads(out.stdout)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 2400})
        page = context.new_page()
        page.goto(server)
        page.wait_for_selector("h1", timeout=90_000)
        page.goto(f"{server}/run?run=demo-rollback")
        panel = page.locator(".st-key-checkpoint_panel")
        panel.wait_for(timeout=90_000)
        panel.get_by_text("what if: checkpoint interval").click()  # made once opened
        chart = panel.locator('[data-testid="stEChartsChart"][aria-busy="false"]')
        chart.first.wait_for(timeout=60_000)
        _wait_idle(page)
        assert page.locator(".stException").count() == 0
        text = panel.inner_text()
        for value in (figure_text(d["checkpoint_seconds"], " s"), size_text(d["checkpoint_bytes"]),
                      figure_text(d["mtbf_hours"], " h"), figure_text(d["lost_hours"], " h"),
                      figure_text(d["goodput"]), figure_text(d["cadence"]["young_minutes"], " min"),
                      figure_text(d["cadence"]["daly_minutes"], " min"),
                      figure_text(d["cadence"]["current_minutes"], " min"), d["retention"]["reason"]):
            assert value in text
        legend = _legend(panel)  # a canvas: its series names are in the chart's accessible text
        assert "current " in legend and "Daly " in legend and "cost per day" not in legend
        # Price it: the cost axis appears and the markers say what a day costs.
        cost = panel.get_by_label("cluster cost per hour ($)")
        cost.fill("98.32")
        cost.press("Enter")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.st-key-checkpoint_panel [aria-label]')]"
            ".some(e => e.getAttribute('aria-label').includes('cost per day'))", timeout=60_000)
        _wait_idle(page)
        assert re.search(r"current [^;]*/day\)", _legend(panel))
        shot = tmp_path / "checkpoint_panel.png"
        panel.screenshot(path=str(shot))
        RESULTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, RESULTS / "checkpoint_panel.png")
        assert shot.stat().st_size > 20_000
        context.close()
