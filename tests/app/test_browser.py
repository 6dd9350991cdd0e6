"""The real thing: `runwatch dashboard` in a subprocess, the demo's run page in headless Debian Chromium."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite
from tests.app.conftest import spike_lines, write_jsonl_run

CHROMIUM = "/usr/bin/chromium"
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]

pytestmark = pytest.mark.browser
LIVE_STEPS, LIVE_T0 = 150, time.time() - 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(demo_root: Path) -> Iterator[str]:
    write_jsonl_run(demo_root, "live-run", spike_lines(LIVE_STEPS, spike_at=-1, t0=LIVE_T0)[:100])
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runwatch.app.cli", "dashboard", "--root", str(demo_root),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"dashboard exited: {proc.stdout.read()}")
                time.sleep(0.25)
        else:
            pytest.fail("dashboard did not come up in 60 s")
        yield url
    finally:
        proc.terminate()  # serve() forwards SIGTERM to streamlit: nothing keeps the port
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def page(server: str, tmp_path_factory: pytest.TempPathFactory):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Playwright takes the profile directory itself (it refuses --user-data-dir in args).
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 2000})
        tab = context.new_page()
        tab.goto(server)  # the entry page first, so the app's pages are registered before a deep link
        tab.wait_for_selector("h1", timeout=90_000)
        yield tab
        context.close()


def _wait_idle(page, timeout_s: float = 30.0) -> None:
    """Until no script run is in flight (Streamlit fades the page while one is), then a moment for plotly."""
    deadline = time.time() + timeout_s
    while page.locator('[data-testid="stStatusWidget"]').count() and time.time() < deadline:
        time.sleep(0.25)
    time.sleep(1.0)


def test_run_page_renders_charts_and_rollback_card(server: str, page, tmp_path: Path) -> None:
    page.goto(f"{server}/run?run=demo-diverged")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=90_000)
    page.wait_for_selector(".st-key-rollback_card", timeout=60_000)
    _wait_idle(page)
    assert page.locator(".stException").count() == 0
    card = page.locator(".st-key-rollback_card").inner_text()
    assert "Rollback advice" in card and "Roll back to checkpoint @ step" in card and "--resume " in card
    titles = page.locator(".js-plotly-plot .g-gtitle, .js-plotly-plot .annotation-text").all_text_contents()
    for panel in ("loss", "grad norm", "loss scale (log)", "final-layer act norm", "step time (s)"):
        assert panel in titles
    assert page.locator(".js-plotly-plot .scatterlayer .trace").count() >= 5
    shot = tmp_path / "run_page.png"
    page.screenshot(path=str(shot), full_page=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, RESULTS / "run_page.png")
    assert shot.stat().st_size > 20_000


def test_new_flush_appears_without_reload(server: str, page, demo_root: Path) -> None:
    page.goto(f"{server}/run?run=live-run")
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="last step")
    metric.wait_for(timeout=60_000)
    assert "99" in metric.inner_text()
    # The next flush continues the same curve and clock (a restart from the first loss would be a real spike).
    rows = spike_lines(LIVE_STEPS, spike_at=-1, t0=LIVE_T0)[100:]
    with StagedWrite(demo_root) as staged:
        staged.add_metrics("live-run", 0, 0, metrics_table(rows))
    deadline = time.time() + 30
    while "149" not in metric.inner_text():
        assert time.time() < deadline, "the new flush did not appear within 30 s"
        time.sleep(0.5)
    assert page.locator(".stException").count() == 0
