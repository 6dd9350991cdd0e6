"""The dashboard on an ``s3://`` root, in headless Debian Chromium: overview, run page, a live upload.

The runs live in a real S3 API (moto's server in this process); the dashboard
runs as its own process and reaches it with the AWS environment. The
verdicts come from ``check --all`` (stored as findings beside each run), and a
Monitor shipping to the bucket shows up without a reload.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.conftest import spike_lines
from tests.app.test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    _run_chart,
    _summary,
    _wait_idle,
    dashboard_server,
)
from tests.data.helpers import run_cli
from tests.s3server import MotoS3

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def s3_fleet(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = f"s3://{moto_s3.bucket()}/fleet"
    here = tmp_path_factory.mktemp("logs")
    for run, spike_at in (("calm-run", -1), ("spiky-run", 250)):
        lines = spike_lines(400, spike_at=spike_at)
        if spike_at > 0:  # the loss stays up after the spike: action needed
            lines = [{**line, "loss": line["loss"] + (8.0 if line["step"] > spike_at else 0.0)} for line in lines]
            lines.insert(200, {"event": "checkpoint", "step": 199, "path": "ck/199.pt"})
        log = here / f"{run}.jsonl"
        log.write_text("".join(json.dumps(line) + "\n" for line in lines))
        out = run_cli("import", "jsonl", str(log), "--root", root, "--run", run)
        assert out.returncode == 0, out.stderr
    out = run_cli("check", "--all", "--root", root)
    assert out.returncode == 1 and "spiky-run: ACTION NEEDED" in out.stdout, out.stdout + out.stderr
    return root


@pytest.fixture(scope="module")
def server(s3_fleet: str) -> Iterator[str]:
    with dashboard_server(s3_fleet) as url:
        yield url


@pytest.fixture(scope="module")
def page(server: str, tmp_path_factory: pytest.TempPathFactory):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1800})
        tab = context.new_page()
        tab.goto(server)
        tab.wait_for_selector("h1", timeout=90_000)
        yield tab
        context.close()


def test_overview_lists_the_buckets_runs_with_their_health(page, server: str) -> None:
    page.goto(server)
    page.get_by_text("spiky-run").first.wait_for(timeout=90_000)
    _wait_idle(page)
    text = page.locator("body").inner_text()
    assert "spiky-run — action needed" in text and "calm-run —" not in text  # only the run that needs action
    page.locator('td[role="gridcell"]', has_text="calm-run").first.wait_for(state="attached", timeout=30_000)
    banner = page.locator('[data-testid="stMarkdownContainer"] h4').first.inner_text()
    assert "1" in banner and "healthy" in banner.lower(), banner  # calm-run counted healthy, spiky-run not
    assert page.locator(".stException").count() == 0


def test_run_page_draws_the_charts_from_s3(page, server: str) -> None:
    page.goto(f"{server}/run?run=spiky-run")
    chart = _run_chart(page, "Charts of run spiky-run")
    assert page.locator(".stException").count() == 0
    described = _summary(chart)
    assert "loss" in described and "grad" in described, described  # the panels drawn from the bucket's rows
    assert "ck/199.pt" in page.locator("body").inner_text()  # the rollback card names the checkpoint


def test_a_monitor_shipping_to_the_bucket_appears_without_reload(page, server: str, s3_fleet: str,
                                                                 tmp_path: Path) -> None:
    from runwatch.collectors.monitor import Monitor, MonitorConfig
    from runwatch.collectors.uploader import UploaderConfig

    page.goto(server)
    page.get_by_text("spiky-run").first.wait_for(timeout=90_000)
    mon = Monitor(s3_fleet, "shipped-run", spool=tmp_path / "spool", config=MonitorConfig(flush_every_steps=20),
                  upload=UploaderConfig(poll_seconds=0.2, retry_initial_seconds=0.2))
    for s in range(100):
        mon.step(s, loss=3.0 - s / 100, grad_norm=1.0)
    mon.close()
    assert mon.num_uploaded_parts >= 1
    # The table is a canvas grid; its cells are mirrored in hidden <td>s for accessibility.
    page.locator('td[role="gridcell"]', has_text="shipped-run").first.wait_for(state="attached", timeout=60_000)
    assert page.locator(".stException").count() == 0
