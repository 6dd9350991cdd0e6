"""The real thing: `runwatch dashboard` in a subprocess, its pages in headless Debian Chromium.

One test per item of the dashboard issue that a page shows: the cause on screen, branches drawn
honestly, no traps, run states, the on-call workflow, air-gapped and phone-width, and live updates.
The charts are an ECharts canvas: what they draw is checked by pixels (the main line's colour in
each panel) and by the chart's accessible description (``charts.Chart.summary``, the canvas's
``aria-label``). The run-page screenshots the README shows are written here (``docs/``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from runwatch.app.state import LIVE_SECONDS
from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite
from tests.app.conftest import spike_lines, write_jsonl_run

CHROMIUM = "/usr/bin/chromium"
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
MAIN_RGB = (0x1F, 0x4E, 0x79)  # charts.MAIN_COLOR
VALIDATION_RGB = (0xD3, 0x54, 0x00)  # charts.VALIDATION_COLOR

pytestmark = pytest.mark.browser
LIVE_STEPS, LIVE_T0 = 150, time.time() - 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dashboard_server(root: str | Path) -> Iterator[str]:
    """``runwatch dashboard`` over ``root`` as its own process (inheriting the environment: S3 credentials),
    its URL once it answers; terminated after (serve() forwards SIGTERM to streamlit: nothing keeps the port)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runwatch.app.cli", "dashboard", "--root", str(root),
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
        proc.terminate()
        proc.wait(timeout=20)


def branchy_lines() -> list[dict]:
    """An imported run that resumed from step 300 after its first segment ran to 500 and blew up; it logs
    validation loss, a run-specific metric and an LR that jumps 50x at 200 (the cause of its spike)."""
    lines = []
    for s in range(501):
        blown = s > 300
        lines.append({"step": s, "time": 1.7e9 + s + 0.3 * math.sin(s / 5), "tokens": 2048 * (s + 1),
                      "lr": 5e-2 if s == 200 else 1e-3 * (1 + s / 500),
                      "loss": (1e4 if s == 450 else 50.0 + s) if blown else 2.0 + math.exp(-s / 100),
                      "grad_norm": 1.0 + 0.3 * math.sin(s / 7), "loss_scale": 2.0 ** (12 + s // 100),
                      "my_metric": 0.5 + s / 1000})
        if s % 50 == 0:  # an evaluation every 50 steps, on its step's line (a repeated step starts a segment)
            lines[-1]["val_loss"] = 2.2 + math.exp(-s / 100)
        if s % 100 == 0 and s:
            lines.append({"event": "checkpoint", "step": s, "path": f"ck/{s}.pt"})
    lines.append({"event": "resume", "step": 300, "checkpoint": "ck/300.pt"})
    lines += [{"step": s, "time": 1.7e9 + 600 + s + 0.3 * math.sin(s / 5), "tokens": 2048 * (s + 1),
               "lr": 1e-3 * (1 + s / 500), "loss": 2.0 + math.exp(-s / 100), "grad_norm": 1.0 + 0.3 * math.sin(s / 7),
               "loss_scale": 2.0 ** (12 + s // 100), "my_metric": 0.5} for s in range(301, 400)]
    return lines


def slowed_lines(t0: float) -> list[dict]:
    """400 steps of 0.1 s with steps 200-259 five times slower: a slowdown that came back (a closed finding)."""
    lines, t = [], t0
    for s in range(400):
        t += (0.5 if 200 <= s < 260 else 0.1) * (1 + 0.02 * math.sin(s))
        lines.append({"step": s, "time": t, "tokens": 1024 * (s + 1), "loss": 2.0 + math.exp(-s / 100),
                      "grad_norm": 1.0, "lr": 1e-3})
    return lines


@pytest.fixture(scope="module")
def server(demo_root: Path) -> Iterator[str]:
    write_jsonl_run(demo_root, "live-run", spike_lines(LIVE_STEPS, spike_at=-1, t0=LIVE_T0)[:100])
    write_jsonl_run(demo_root, "branchy", branchy_lines())
    t0 = time.time() - 1800  # both recorded live (not imported), their last row half an hour ago
    with StagedWrite(demo_root) as staged:  # what a live Monitor leaves behind: one trainer died, one ended
        staged.add_metrics("died", 0, 0, metrics_table(spike_lines(200, spike_at=-1, t0=t0)))
        staged.add_metrics("slowed-done", 0, 0, metrics_table(slowed_lines(t0 - 100)))
        staged.add_events("slowed-done", 0, 0, [{"event": "note", "step": 399, "time": t0, "status": "finished"}])
    with dashboard_server(demo_root) as url:
        yield url


@pytest.fixture(scope="module")
def browser_context(server: str, tmp_path_factory: pytest.TempPathFactory):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Playwright takes the profile directory itself (it refuses --user-data-dir in args).
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 2600})
        requests: list[str] = []
        context.on("request", lambda r: requests.append(r.url))
        context.requests = requests
        yield context
        context.close()


@pytest.fixture(scope="module")
def page(server: str, browser_context):
    tab = browser_context.new_page()
    tab.goto(server)  # the entry page first, so the app's pages are registered before a deep link
    tab.wait_for_selector("h1", timeout=90_000)
    return tab


def _wait_idle(page, timeout_s: float = 30.0) -> None:
    """Until no script run is in flight (Streamlit fades the page while one is), then a moment to draw."""
    deadline = time.time() + timeout_s
    while page.locator('[data-testid="stStatusWidget"]').count() and time.time() < deadline:
        time.sleep(0.25)
    time.sleep(1.0)


def _run_chart(page, text: str = "Charts of run", timeout_s: float = 90.0):
    """The run page's chart once drawn, with ``text`` in its description."""
    chart = page.locator(f'[data-testid="stEChartsChart"][aria-busy="false"][aria-label*="{text}"]').first
    chart.wait_for(timeout=timeout_s * 1000)
    _wait_idle(page)
    return chart


def _summary(chart) -> str:
    return chart.get_attribute("aria-label") or ""


def _colour_bands(chart, rgb: tuple[int, int, int], tolerance: int = 14) -> int:
    """How many separate horizontal bands of the canvas hold pixels of ``rgb`` (one per panel drawn in it)."""
    return chart.evaluate("""(el, [rgb, tol]) => {
        const c = el.querySelector('canvas'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let bands = 0, gap = 99;
        for (let y = 0; y < c.height; y++) {
            let hit = 0;
            for (let x = 0; x < c.width && hit < 3; x += 2) {
                const i = 4 * (y * c.width + x);
                if (Math.abs(d[i] - rgb[0]) < tol && Math.abs(d[i + 1] - rgb[1]) < tol
                    && Math.abs(d[i + 2] - rgb[2]) < tol && d[i + 3] > 200) hit++;
            }
            if (hit >= 3) { if (gap > 20) bands++; gap = 0; } else gap++;
        }
        return bands;
    }""", [list(rgb), tolerance])


def _rows_with(chart, rgb: tuple[int, int, int], tolerance: int = 20) -> int:
    """How many pixel rows of the canvas hold ``rgb`` at all (a vertical line crosses one per pixel of height)."""
    return chart.evaluate("""(el, [rgb, tol]) => {
        const c = el.querySelector('canvas'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let rows = 0;
        for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
            const i = 4 * (y * c.width + x);
            if (Math.abs(d[i] - rgb[0]) < tol && Math.abs(d[i + 1] - rgb[1]) < tol && Math.abs(d[i + 2] - rgb[2]) < tol
                && d[i + 3] > 150) { rows++; break; }
        }
        return rows;
    }""", [list(rgb), tolerance])


def _drawn_in(chart, rgb: tuple[int, int, int], at_least: int, tolerance: int = 14, timeout_s: float = 20.0) -> int:
    """Until ``rgb`` is drawn in ``at_least`` panels (a chart replaced by its judged redraw repaints), or fail."""
    deadline = time.time() + timeout_s
    while (n := _colour_bands(chart, rgb, tolerance)) < at_least and time.time() < deadline:
        time.sleep(0.5)
    return n


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector('h1, h2, [data-testid="stAlert"]', timeout=90_000)


def test_run_page_shows_the_cause(server: str, page) -> None:
    """Item 1: LR, validation loss beside the loss, loss scale, a run's extras; log toggle, x axes; the advice."""
    _open(page, f"{server}/run?run=branchy")
    chart = _run_chart(page)
    assert page.locator(".stException").count() == 0
    summary = _summary(chart)
    for panel in ("loss", "grad norm", "learning rate", "loss scale (log)"):
        assert panel in summary
    assert "val loss" in summary  # validation loss on the loss panel, drawn in its own colour
    assert _drawn_in(chart, MAIN_RGB, 4) >= 4 and _drawn_in(chart, VALIDATION_RGB, 1) >= 1
    page.get_by_label("more charts (the run's own metrics)").click()
    page.get_by_role("option", name="my_metric").click()
    page.keyboard.press("Escape")
    chart = _run_chart(page, "step time (s), my_metric; lines:")
    page.locator('[data-testid="stButtonGroup"] button').filter(has_text=re.compile(r"^loss$")).click()  # log axis
    chart = _run_chart(page, "charts by step: loss (log), grad norm")
    page.get_by_text("wall-clock", exact=True).click()
    chart = _run_chart(page, "charts by wall-clock time (UTC): loss (log)")
    assert "x=time" in page.get_by_role("link", name="link to this view").get_attribute("href")

    _open(page, f"{server}/run?run=demo-diverged")
    chart = _run_chart(page)
    summary = _summary(chart)
    assert "roll back here: checkpoint @ step" in summary and "divergence (open)" in summary
    assert "spike (closed)" in summary  # closed findings are bands too, shaded alike
    assert _rows_with(chart, (0x1E, 0x84, 0x49)) > 300  # the advised checkpoint's dashed line down the panels
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "run_page.png"), full_page=True)
    chart.screenshot(path=str(SCREENSHOTS / "run_page_charts.png"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCREENSHOTS / "run_page.png", RESULTS / "run_page.png")
    assert (SCREENSHOTS / "run_page_charts.png").stat().st_size > 20_000


def test_branches_are_drawn_honestly(server: str, page) -> None:
    """Item 2: the branch after the resume is dimmed and labelled with the resume step, its blow-up is stated,
    not drawn over the healthy curve, and "last step" is the main line's."""
    _open(page, f"{server}/run?run=branchy")
    summary = _summary(_run_chart(page))
    assert "seg 0 abandoned (resume @ 300)" in summary
    assert "seg 0 abandoned branch peaks at 1e+04 (step 450): off this scale" in summary
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="last step (main line)")
    assert "399" in metric.inner_text()
    segments = page.locator('[data-testid="stExpander"]', has_text="segments (2)")
    segments.locator("summary").click()
    segments.locator('[role="row"]').nth(2).wait_for(state="attached", timeout=30_000)
    rows = segments.locator('[role="row"]').all_inner_texts()
    assert any("step 301" in r and "UTC" in r for r in rows), rows  # where the resume cut it; readable times


def test_no_traps(server: str, page, demo_root: Path) -> None:
    """Item 3: an unknown run names the runs and keeps its URL; a row click opens the run; full range clears
    an inverted range; finding messages are whole; Compare keeps its selection in the URL."""
    _open(page, f"{server}/run?run=no-such-run")
    page.wait_for_selector('[data-testid="stAlert"]', timeout=60_000)
    _wait_idle(page)
    alert = page.locator('[data-testid="stAlert"]').first.inner_text()
    assert "no run named 'no-such-run'" in alert and "demo-diverged" in alert
    assert "run=no-such-run" in page.url and page.locator('[data-testid="stEChartsChart"]').count() == 0

    _open(page, f"{server}/run?run=branchy&from=300&to=100")
    _run_chart(page)
    assert page.locator('[data-testid="stAlert"]', has_text="inverted").count() == 1
    page.get_by_role("button", name="full range").click()
    page.wait_for_function("() => !location.search.includes('from=') && !location.search.includes('to=')",
                           timeout=30_000)
    _run_chart(page)
    assert page.locator('[data-testid="stAlert"]', has_text="inverted").count() == 0

    _open(page, f"{server}/run?run=demo-diverged")
    _run_chart(page)
    out = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "check", "--root", str(demo_root), "--run",
                          "demo-diverged", "--json"], capture_output=True, text=True, timeout=180, check=False)
    longest = max((f["message"] for f in json.loads(out.stdout)["findings"] if f["open"]), key=len)
    shown = " ".join(page.locator('[class*="st-key-finding_"]').all_inner_texts())
    # Whole, not cut at a table cell's width (Streamlit's Markdown draws "->" as an arrow).
    assert len(longest) > 150 and longest.replace("->", "→") in shown

    _open(page, f"{server}/")
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.wait_for(timeout=60_000)
    _wait_idle(page)
    box = grid.bounding_box()
    page.mouse.click(box["x"] + 300, box["y"] + 35 + 17)  # the first row's "run" cell (worst first)
    page.wait_for_url("**/run?run=*", timeout=60_000)
    opened = parse_qs(urlsplit(page.url).query)["run"][0]
    page.wait_for_selector(f"h2:has-text('{opened}')", timeout=60_000)

    _open(page, f"{server}/compare?runs=demo-rollback&runs=branchy")
    _wait_idle(page)
    chosen = page.locator('[data-testid="stMultiSelect"]').first.inner_text()
    assert "demo-rollback" in chosen and "branchy" in chosen and "demo-diverged" not in chosen
    assert "\\" not in chosen  # run names as text, not Markdown-escaped


def test_run_states_and_on_call(server: str, page, demo_root: Path) -> None:
    """Items 4 and 5: an import is archived (not "watching"); acknowledge a finding from the page, then
    `runwatch check` shows it; a silence shows as a banner; the page gives a link at its step range."""
    _open(page, f"{server}/run?run=branchy&from=100&to=200")
    _run_chart(page)
    heading = page.locator("h2").first.inner_text()
    assert "archived" in heading and "watching" not in heading
    link = page.get_by_role("link", name="link to this view").get_attribute("href")
    assert "run=branchy" in link and "from=100" in link and "to=200" in link and link.startswith(server)

    _open(page, f"{server}/run?run=demo-diverged")
    _run_chart(page)
    page.get_by_label("your name (recorded with what you do here)").fill("oncall-bob")
    page.keyboard.press("Tab")
    _wait_idle(page)
    first = page.locator('[class*="st-key-finding_"]').first
    kind = first.locator("strong").nth(1).inner_text()
    first.get_by_role("button", name="acknowledge").click()
    page.get_by_label("note (what you are doing about it)").fill("rolling back")
    page.get_by_label("note (what you are doing about it)").press("Tab")
    _wait_idle(page)  # leaving the field reruns the page; a click during that rerun can land under its overlay
    page.locator('[data-testid="stPopoverBody"] button', has_text="acknowledge").click()
    page.wait_for_selector("text=acknowledged by oncall-bob", timeout=60_000)
    check = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "check", "--root", str(demo_root),
                            "--run", "demo-diverged"], capture_output=True, text=True, timeout=180, check=False)
    assert check.returncode == 1 and "acknowledged by oncall-bob" in check.stdout and "rolling back" in check.stdout
    assert kind.replace(" ", "_") in check.stdout

    page.get_by_text("silence alerts", exact=True).first.click()  # the section's expander
    page.get_by_label("why (maintenance, known issue, ...)").fill("node swap")
    page.get_by_label("why (maintenance, known issue, ...)").press("Tab")
    _wait_idle(page)
    page.get_by_role("button", name="silence alerts").click()
    banner = page.locator('[data-testid="stAlert"]', has_text="Alerts silenced until")
    banner.wait_for(timeout=60_000)
    assert "oncall-bob" in banner.inner_text() and "node swap" in banner.inner_text()
    check = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "check", "--root", str(demo_root),
                            "--run", "demo-diverged", "--json"], capture_output=True, text=True, timeout=180)
    assert json.loads(check.stdout)["silence"]["by"] == "oncall-bob"


def test_stalled_and_finished_badges_and_a_closed_slowdown(server: str, page) -> None:
    """Item 4 in the browser: a live run whose trainer went silent reads "stalled", one that recorded its end
    reads "finished" (each a shape as well as a colour), and item 1's closed findings of every kind are bands:
    a slowdown that came back is shaded on the step-time panel as closed."""
    _open(page, f"{server}/run?run=died")
    _run_chart(page)
    heading = page.locator("h2").first.inner_text()
    assert "⏸ stalled" in heading and "live" not in heading, heading
    _open(page, f"{server}/run?run=slowed-done")
    summary = _summary(_run_chart(page))
    heading = page.locator("h2").first.inner_text()
    assert "✓ finished" in heading and "stalled" not in heading, heading
    assert "slowdown (closed)" in summary and "step time" in summary, summary


def _canvas_digest(chart) -> str:
    """A digest of what the chart's canvas shows (the same drawing gives the same pixels)."""
    return chart.evaluate("""el => { const d = el.querySelector('canvas').toDataURL();
        let h = 0; for (let i = 0; i < d.length; i++) h = (h * 31 + d.charCodeAt(i)) | 0; return h + ':' + d.length; }""")


def test_full_range_clears_a_wheel_zoom(server: str, page) -> None:
    """Item 3: a wheel zoom on the chart is client-side (no step range in the URL); "full range" still clears
    it: the chart draws the whole run again, pixel for pixel."""
    _open(page, f"{server}/run?run=branchy")
    chart = _run_chart(page)
    whole = _canvas_digest(chart)
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 120)  # inside the first panel's plot area
    for _ in range(4):
        page.mouse.wheel(0, -400)
        time.sleep(0.2)
    time.sleep(LIVE_SECONDS + 2)  # a refresh of the page in between keeps the zoom: only the button clears it
    assert _canvas_digest(chart) != whole  # zoomed in: the axis and the lines moved
    assert "from=" not in page.url
    page.get_by_role("button", name="full range").click()
    _wait_idle(page)
    deadline = time.time() + 30
    while (now := _canvas_digest(_run_chart(page))) != whole and time.time() < deadline:
        time.sleep(0.5)
    assert now == whole


def _every_frame(page, expression: str, seconds: float) -> list:
    """The distinct values of a JavaScript ``expression`` evaluated on every animation frame for ``seconds``, in
    the page (a change lasting a few frames is missed by polling from here)."""
    page.evaluate("""(expr) => { window.__seen = new Set(); const f = new Function('return ' + expr);
        const tick = () => { window.__seen.add(f()); requestAnimationFrame(tick); }; requestAnimationFrame(tick); }""",
                  expression)
    time.sleep(seconds)
    return page.evaluate("() => [...window.__seen]")


def test_an_open_page_holds_still_while_it_refreshes(server: str, page) -> None:
    """An open page reruns every few seconds; nothing on it may move or blink. It did: the run page's rollback
    card placeholder was emptied at the top of each rerun and refilled at its end, so everything below it
    jumped by the card's height (~640 px) every 5 s, and a click aimed during that (a CI run's acknowledge
    button) landed elsewhere; the compare page drew its chart without bands, then with them, on every rerun.
    Watched on every frame over three refreshes (a rerun whose emptying and refilling fall in one frame shows
    nothing; most do not, and fewer do on a loaded machine)."""
    _open(page, f"{server}/run?run=demo-diverged")
    _run_chart(page)
    _wait_idle(page)
    page.get_by_role("link", name="link to this view").wait_for()
    tops = _every_frame(page, """(() => { const a = [...document.querySelectorAll('a')]
        .find(e => e.textContent.includes('link to this view'));
        return a ? Math.round(a.getBoundingClientRect().top + window.scrollY) : -1; })()""", 3 * LIVE_SECONDS + 1)
    assert len(tops) == 1 and -1 not in tops, tops

    _open(page, f"{server}/compare?runs=demo-rollback&runs=demo-diverged")
    page.wait_for_selector('[data-testid="stEChartsChart"][aria-label*="with findings"]', timeout=90_000)
    _wait_idle(page)
    labels = _every_frame(page, """(() => { const c = document.querySelector('[data-testid="stEChartsChart"]');
        return c ? c.getAttribute('aria-label') : 'none'; })()""", 3 * LIVE_SECONDS + 1)
    assert labels == ["Runs overlaid with findings"], labels


def test_air_gapped_and_phone_width(server: str, browser_context) -> None:
    """Item 6: a full visit of every page sends no request to any host but the dashboard's own; the overview
    at phone width keeps health, state and run in view."""
    own = urlsplit(server).netloc
    start = len(browser_context.requests)
    tab = browser_context.new_page()
    icons = []
    for path in ("/", "/run?run=demo-diverged", "/run?run=branchy", "/compare", "/import_log"):
        tab.goto(f"{server}{path}")
        tab.wait_for_selector("h1, h2", timeout=90_000)
        _wait_idle(tab)
        if path.startswith("/run"):
            _run_chart(tab)
        # The browser fetches the page icon itself, out of Playwright's sight (microsoft/playwright#7493): a
        # Material icon as favicon is a fonts.gstatic.com URL, so the link itself is checked.
        icons += tab.eval_on_selector_all("link[rel~='icon']", "els => els.map(e => e.href)")
    seen = browser_context.requests[start:]
    assert seen, "no request was recorded"
    assert icons, "no page icon link on the pages"
    foreign = [u for u in seen + icons
               if urlsplit(u).scheme not in ("data", "blob", "about") and urlsplit(u).netloc != own]
    assert not foreign, foreign
    tab.set_viewport_size({"width": 390, "height": 844})
    tab.goto(f"{server}/")
    grid = tab.locator('[data-testid="stDataFrame"]').first
    grid.wait_for(timeout=60_000)
    _wait_idle(tab)
    assert grid.bounding_box()["width"] <= 390
    headers = tab.locator('[data-testid="stDataFrame"] [role="columnheader"]').all_inner_texts()
    assert headers[:3] == ["health", "state", "run"]
    tab.screenshot(path=str(SCREENSHOTS / "overview_phone.png"))
    tab.close()


def test_new_flush_appears_without_reload(server: str, page, demo_root: Path) -> None:
    _open(page, f"{server}/run?run=live-run")
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


def test_the_api_base_is_the_address_less_a_page_name(browser_context) -> None:
    """``backend_base``'s head script, run by Chromium on pages at several addresses (served by the test itself):
    a trailing page name is dropped, a path prefix (a reverse proxy's) is kept, and nothing else is taken for a page."""
    from runwatch.app.backend_base import head_script

    tab = browser_context.new_page()
    html = b"<html><head>" + head_script() + b"</head><body></body></html>"
    tab.route("http://dash.test/**", lambda route: route.fulfill(status=200, content_type="text/html", body=html))
    cases = {"/run?run=x": "", "/": "", "/compare": "", "/import_log/": "", "/runwatch/run": "/runwatch",
             "/runwatch/": "/runwatch", "/running": "/running"}
    try:
        for path, base in cases.items():
            tab.goto("http://dash.test" + path)
            assert tab.evaluate("window.__streamlit.BACKEND_BASE_URL") == "http://dash.test" + base, path
    finally:
        tab.close()
