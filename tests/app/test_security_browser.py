"""Security in real headless Chromium: hostile text stays text, nothing leaves for another host, and the
OpenID Connect login works end to end against a real (mock) provider on 127.0.0.1."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from runwatch.app import charts
from tests.app.conftest import HOSTILE_PATH, free_port, hostile_lines, spike_lines, wait_http, write_jsonl_run

CHROMIUM = "/usr/bin/chromium"
RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]
# What the attacker hopes the browser will load or render: any of these in the DOM, or any request to it, fails.
EVIL = "evil.example"
HOSTILE_URL_RUN = f"[x](http://{EVIL}/l)![i](http://{EVIL}/u.png)<img src=http://{EVIL}/h.png>`"
HOSTILE_LOG_VALUE = f"<img src=http://{EVIL}/e.png>![m](http://{EVIL}/m.png)[l](http://{EVIL}/l)"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def _dashboard(root: Path, cwd: Path, *args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([*RUNWATCH, "dashboard", "--root", str(root), "--port", str(port), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc)
    return proc, port


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def _settle(page, timeout_s: float = 30.0) -> None:
    """Until no script run is in flight, then a moment for the charts to draw."""
    deadline = time.time() + timeout_s
    while page.locator('[data-testid="stStatusWidget"]').count() and time.time() < deadline:
        time.sleep(0.25)
    time.sleep(1.0)


def _visible(text: str) -> str:
    return text.replace("\u2060", "")  # the word joiner escape.markdown puts in URLs is invisible


def _no_injected_markup(page) -> None:
    assert page.locator(f'a[href*="{EVIL}"], img[src*="{EVIL}"], [src*="{EVIL}"], #pwn, b#pwn').count() == 0
    # Streamlit's own heading anchors (href="#...") are the only links its Markdown may hold here.
    assert page.locator('[data-testid="stMarkdownContainer"] a:not([href^="#"]), '
                        '[data-testid="stMarkdownContainer"] img, [data-testid="stMarkdownContainer"] code').count() == 0
    assert EVIL not in "".join(page.evaluate("[...document.querySelectorAll('[href],[src]')]"
                                             ".map(e => (e.getAttribute('href') || '') + (e.getAttribute('src') || ''))"))


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    root = tmp_path_factory.mktemp("hostile-root")
    write_jsonl_run(root, "hostile", hostile_lines())
    (root / "archive").mkdir()
    (root / "archive" / "bad.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n"
                                                + json.dumps({"step": 1, "loss": HOSTILE_LOG_VALUE}) + "\n")
    proc, port = _dashboard(root, tmp_path_factory.mktemp("cwd"))
    try:
        yield root, port
    finally:
        _stop(proc)


def test_hostile_text_is_shown_as_text_and_fetches_nothing(chromium, hostile_server) -> None:
    root, port = hostile_server
    own = f"127.0.0.1:{port}"
    context = chromium.new_context(viewport={"width": 1400, "height": 2200})
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    page = context.new_page()
    page.goto(f"http://{own}/")
    page.wait_for_selector("h1", timeout=90_000)

    # The run page: checkpoint path in the rollback card, the reason and the actions; the resume command.
    page.goto(f"http://{own}/run?run=hostile")
    page.wait_for_selector(".st-key-rollback_card", timeout=90_000)
    page.wait_for_selector('[data-testid="stEChartsChart"][aria-busy="false"]', timeout=60_000)
    _settle(page)
    card = _visible(page.locator(".st-key-rollback_card").inner_text())
    literal = HOSTILE_PATH.replace("\x1b", " ")
    assert literal in card  # the whole path, as text (the ESC shows as a space)
    assert f"--resume '{HOSTILE_PATH}'" in page.locator('.st-key-rollback_card [data-testid="stCode"]').first.inner_text()
    _no_injected_markup(page)

    # ECharts: the checkpoint marker's tooltip (HTML that ECharts builds), found by moving along the marker strip.
    chart = page.locator('[data-testid="stEChartsChart"]').first
    num_panels = len((chart.get_attribute("aria-label") or "").split("; lines:")[0].split(":", 2)[2].split(","))
    box = chart.bounding_box()
    strip_y = box["y"] + charts.TOP + num_panels * (charts.PANEL_HEIGHT + charts.PANEL_GAP) - 16 + charts.STRIP_HEIGHT / 2
    tip = chart.locator("div").filter(has_text="checkpoint @ step")
    for x in range(int(box["x"] + 72), int(box["x"] + box["width"] - 28), 2):
        page.mouse.move(x, strip_y)
        if tip.count():
            break
    assert tip.count(), "no checkpoint tooltip along the marker strip"
    text = tip.last.text_content()
    assert "[click](http://evil.example/link)" in text and "<b id=pwn>" in text
    assert tip.last.locator("a, image, img, b").count() == 0

    # The URL: a run name that is Markdown and HTML.
    page.goto(f"http://{own}/run?run={quote(HOSTILE_URL_RUN)}")
    page.wait_for_selector('[data-testid="stAlert"]', timeout=60_000)
    _settle(page)
    alert = _visible(page.locator('[data-testid="stAlert"]').first.inner_text())
    assert "invalid run name" in alert and HOSTILE_URL_RUN in alert
    _no_injected_markup(page)

    # The import page: a parse error quoting the hostile line.
    page.goto(f"http://{own}/import_log")
    page.get_by_label("path (relative to the root, or absolute inside it)").fill("archive/bad.jsonl")
    page.get_by_label("run name").fill("bad-run")
    page.get_by_role("button", name="import").click()
    page.wait_for_selector('[data-testid="stAlert"]', timeout=60_000)
    _settle(page)
    error = _visible(page.locator('[data-testid="stAlert"]').first.inner_text())
    assert "bad.jsonl:2" in error and HOSTILE_LOG_VALUE in error
    _no_injected_markup(page)
    assert not (root / "run=bad-run").exists()
    context.close()

    assert requests, "no request was recorded"
    foreign = [u for u in requests if urlsplit(u).scheme not in ("data", "blob", "about") and urlsplit(u).netloc != own]
    assert not foreign, foreign
    # Each page found the server's API at once: no probe of a page's own path first (/run/_stcore/health, a 404
    # and a 100 ms retry before the WebSocket: app/backend_base.py).
    probes = [urlsplit(u).path for u in requests if u.endswith("/_stcore/health")]
    assert probes and set(probes) == {"/_stcore/health"}, probes


def test_replace_needs_the_run_name_typed(chromium, hostile_server) -> None:
    root, port = hostile_server
    (root / "archive" / "good.jsonl").write_text("".join(json.dumps(line) + "\n" for line in spike_lines(40, -1)))
    before = sorted(p.name for p in (root / "run=hostile").rglob("*.parquet"))
    page = chromium.new_page()
    page.goto(f"http://127.0.0.1:{port}/import_log")
    page.get_by_label("path (relative to the root, or absolute inside it)").fill("archive/good.jsonl")
    page.get_by_label("run name").fill("hostile")
    page.get_by_text("replace the run if it exists").click()
    page.wait_for_selector("text=Importing with replace deletes", timeout=30_000)
    page.get_by_role("button", name="import").click()
    page.wait_for_selector("text=Not imported", timeout=30_000)
    assert sorted(p.name for p in (root / "run=hostile").rglob("*.parquet")) == before  # untouched
    page.get_by_label("type the run name to confirm the replacement").fill("hostile")
    page.get_by_role("button", name="import").click()
    page.wait_for_selector("text=Imported 40 rows", timeout=60_000)
    assert sorted(p.name for p in (root / "run=hostile").rglob("*.parquet")) != before
    page.close()


def test_an_uploaded_log_is_named_as_uploaded_in_errors_and_imports(chromium, hostile_server) -> None:
    """The Import page writes an upload to a temporary folder first; its errors name the file the user chose
    (night run.jsonl, shown as night_run.jsonl:2), never that folder, and a good upload is imported."""
    root, port = hostile_server
    page = chromium.new_page()
    page.goto(f"http://127.0.0.1:{port}/import_log")
    page.get_by_text("upload", exact=True).click()
    page.locator('input[type="file"]').wait_for(state="attached", timeout=30_000)
    bad = b'{"step": 0, "loss": 1.0}\n{"step": "one"}\n'
    page.locator('input[type="file"]').set_input_files(
        files=[{"name": "night run.jsonl", "mimeType": "application/json", "buffer": bad}])
    page.wait_for_selector("text=night run.jsonl", timeout=30_000)  # the uploader lists it
    page.get_by_label("run name").fill("uploaded")
    page.get_by_role("button", name="import").click()
    page.wait_for_selector('[data-testid="stAlert"]', timeout=60_000)
    _settle(page)
    error = _visible(page.locator('[data-testid="stAlert"]').first.inner_text())
    assert "night_run.jsonl:2" in error and "runwatch-upload-" not in error and "/tmp" not in error, error
    assert not (root / "run=uploaded").exists()
    good = "".join(json.dumps(line) + "\n" for line in spike_lines(30, -1)).encode()
    page.locator('input[type="file"]').set_input_files(
        files=[{"name": "night run fixed.jsonl", "mimeType": "application/json", "buffer": good}])
    # Import only once the uploader holds the new file: a click before its upload lands imports the old one
    # (a loaded CI machine did, and waited for a success that never came).
    page.locator('[data-testid="stFileChip"][aria-label^="night run fixed.jsonl"]').wait_for(timeout=30_000)
    page.get_by_role("button", name="import").click()
    page.wait_for_selector("text=Imported 30 rows", timeout=60_000)
    assert (root / "run=uploaded").is_dir()
    page.close()


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """oidc-provider-mock, a real OpenID Connect provider, on 127.0.0.1 with two known users."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(port),
                             "--user", "alice@example.com", "--user", "mallory@example.net"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/.well-known/openid-configuration", proc)
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def login_server(provider: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("login-root")
    write_jsonl_run(root, "secret-run", spike_lines(60, spike_at=-1))
    cwd = tmp_path_factory.mktemp("login-cwd")
    port = free_port()
    (cwd / ".streamlit").mkdir()
    (cwd / ".streamlit" / "secrets.toml").write_text(
        f'[auth]\nredirect_uri = "http://localhost:{port}/oauth2callback"\n'
        f'cookie_secret = "{secrets.token_urlsafe(32)}"\nclient_id = "runwatch-test"\nclient_secret = "{secrets.token_urlsafe(16)}"\n'
        f'server_metadata_url = "{provider}/.well-known/openid-configuration"\n'
        '[runwatch]\nallowed_users = ["alice@example.com"]\n')
    # 0.0.0.0: refused without a login (test_security), started with one. The secrets file is found in the cwd.
    proc = subprocess.Popen([*RUNWATCH, "dashboard", "--root", str(root), "--port", str(port), "--host", "0.0.0.0"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc)
        yield port
    finally:
        _stop(proc)


def _log_in(chromium, port: int, user: str):
    context = chromium.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    page.goto(f"http://localhost:{port}/")
    page.get_by_role("button", name="Log in").wait_for(timeout=90_000)
    assert "secret-run" not in page.content()  # nothing before the login
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: urlsplit(url).hostname == "127.0.0.1", timeout=30_000)  # at the provider
    page.get_by_role("button", name=user).click()
    page.wait_for_url(lambda url: urlsplit(url).hostname == "localhost", timeout=30_000)  # back, with a session
    return context, page


def test_login_end_to_end(chromium, login_server: int) -> None:
    context, page = _log_in(chromium, login_server, "alice@example.com")
    page.wait_for_selector('td:has-text("secret-run")', state="attached", timeout=90_000)  # the overview's table
    assert "Logged in as alice@example.com" in _visible(page.locator('[data-testid="stSidebar"]').inner_text())
    assert page.locator(".stException").count() == 0
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(lambda url: urlsplit(url).hostname == "127.0.0.1", timeout=30_000)  # the provider's logout
    page.get_by_role("button", name="End session").click()
    page.get_by_role("button", name="Log in").wait_for(timeout=60_000)  # back, logged out
    assert "secret-run" not in page.content()
    context.close()


def test_a_user_off_the_allow_list_sees_nothing(chromium, login_server: int) -> None:
    context, page = _log_in(chromium, login_server, "mallory@example.net")
    page.wait_for_selector("text=is not allowed on this dashboard", timeout=90_000)
    time.sleep(2)
    assert "secret-run" not in page.content()
    context.close()


def test_a_page_link_without_login_shows_nothing(chromium, login_server: int) -> None:
    page = chromium.new_page()
    page.goto(f"http://localhost:{login_server}/run?run=secret-run")
    page.get_by_role("button", name="Log in").wait_for(timeout=90_000)
    time.sleep(2)
    assert "secret-run" not in page.inner_text("body")
    page.close()
