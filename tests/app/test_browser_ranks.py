"""The per-rank view in headless Chromium, on a real 2-rank DDP job whose replicas disagree (torchrun, gloo)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.app.fleet_views import rank_rows, resume_line
from runwatch.app.judge import judge_run
from runwatch.data.store import Store
from runwatch.detectors.advisor import checkpoints_from_events
from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, RESULTS, _wait_idle, dashboard_server

JOB = Path(__file__).resolve().parents[1] / "collectors" / "fleet_job.py"

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def fleet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet") / "store"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(JOB), "--root", str(root), "--name", "ddp-sdc", "--out", str(root.parent / "out"),
                           "--fault", "perturb", "--steps", "200", "--at", "120", "--save-every", "50"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def server(fleet_root: Path) -> Iterator[str]:
    with dashboard_server(fleet_root) as url:
        yield url


def _cell_pixels(chart) -> int:
    """Pixels of the heat map's warm colours (yellow to red; text and axes are grey) left of its colour legend."""
    return chart.evaluate("""el => {
        let n = 0;
        for (const c of el.querySelectorAll('canvas')) {  // ECharts may draw on several layers
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width * 0.8; x++) {
                const i = 4 * (y * c.width + x);
                if (d[i] - d[i + 2] > 40 && d[i + 3] > 200) n++;
            }
        }
        return n;
    }""")


def test_per_rank_view_shows_heat_map_findings_by_host_and_the_checklist(server: str, fleet_root: Path,
                                                                         tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with Store(fleet_root) as store:
        report = judge_run(store, "ddp-sdc")
        meta, events = store.meta("ddp-sdc"), store.events("ddp-sdc")
    expected_command = resume_line(report, meta, checkpoints_from_events(events))
    assert "--resume " in expected_command and "step-100.pt" in expected_command  # the last one before step 120
    host = socket.gethostname()
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 2400})
        page = context.new_page()
        page.goto(server)
        page.wait_for_selector("h1", timeout=90_000)
        page.goto(f"{server}/run?run=ddp-sdc")
        view = page.locator(".st-key-rank_view")
        view.wait_for(timeout=90_000)
        heat = view.locator('[data-testid="stEChartsChart"][aria-busy="false"]')
        heat.wait_for(timeout=60_000)
        _wait_idle(page)
        # The checklist's four steps render after the heat map (a loaded machine's fresh-clone run read the view
        # between the two): wait for the last of them before reading the view's text.
        view.locator(".stCheckbox").nth(3).wait_for(timeout=60_000)
        assert page.locator(".stException").count() == 0
        text = view.inner_text()
        assert "Ranks (2)" in text and "The OPT procedure" in text
        for step in ("pause the job", f"run diagnostics on {host} (rank 0), {host} (rank 1)", "cordon",
                     "resume from the newest healthy checkpoint on healthy nodes"):
            assert step in text
        assert view.locator(".stCheckbox").count() == 4
        code = view.locator(".st-key-opt_checklist [data-testid='stCode']").inner_text().strip()
        assert code == expected_command
        # The heat map: one row per rank, labelled with its host, rank x step.
        described = heat.get_attribute("aria-label") or ""
        assert f"2 ranks (rank 0 · {host}; rank 1 · {host})" in described, described
        assert _cell_pixels(heat) > 2000  # the rank x step cells are drawn on the canvas
        # Both replicas are suspects (two cannot outvote each other), and the table holds exactly the findings
        # judge_run names by rank (timings are real: a run on a loaded machine has been seen to hold a third).
        rows = rank_rows(report.findings)
        assert sorted(r["rank"] for r in rows if r["kind"] == "rank_disagreement") == [0, 1]
        assert f"Findings by rank and host ({len(rows)})" in text, [(r["kind"], r["rank"]) for r in rows]
        assert view.locator("[data-testid='stDataFrame']").count() == 1
        # Ticking a step of the checklist sticks across the page's live refresh.
        box = view.locator(".stCheckbox").first
        box.click()
        time.sleep(6)  # one live tick (LIVE_SECONDS)
        assert view.locator(".stCheckbox input").first.is_checked()
        page.screenshot(path=str(tmp_path / "ranks.png"), full_page=True)
        context.close()
    RESULTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "ranks.png", RESULTS / "rank_view.png")
