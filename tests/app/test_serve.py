"""`runwatch dashboard` / `runwatch demo` wiring: loopback by default, usage stats off, bad input is one line."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.app import serve
from runwatch.app.cli import build_parser
from tests.app.conftest import free_port


def test_binds_loopback_unless_told_otherwise() -> None:
    args = build_parser().parse_args(["dashboard", "--root", "somewhere"])
    assert args.host == "127.0.0.1"
    cmd = serve.streamlit_command(args.host, args.port)
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert Path(cmd[cmd.index("run") + 1]).name == "asgi.py"  # dashboard.py behind the host guard
    demo = build_parser().parse_args(["demo"])
    assert demo.host == "127.0.0.1" and not demo.no_dashboard


def _banner_then_stop(args: list[str], cwd: Path) -> tuple[str, int]:
    """Start ``runwatch dashboard``; its first lines once it serves (or its whole output when it exits)."""
    proc = subprocess.Popen([sys.executable, "-m", "runwatch.app.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("note:") or proc.poll() is not None:
                break
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
    return "".join(lines) + (proc.stdout.read() if proc.stdout else ""), code


@pytest.mark.parametrize("make", [False, True])
def test_starts_on_a_missing_or_empty_root_and_says_how_to_fill_it(tmp_path: Path, make: bool) -> None:
    root = tmp_path / "runs"
    if make:
        root.mkdir()
    out, _ = _banner_then_stop(["dashboard", "--root", str(root), "--port", str(free_port())], tmp_path)
    assert "runwatch dashboard on http://127.0.0.1:" in out
    note = "does not exist yet" if not make else "has no runs yet"
    assert f"note: {root} {note}" in out and "runwatch demo --root" in out and "runwatch import auto" in out
    assert root.exists() == make  # nothing created behind the user's back


def test_a_taken_port_fails_before_any_banner(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "dashboard", "--root", str(tmp_path),
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
        demo = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "demo", "--root", str(tmp_path / "demo"),
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
    for done in (proc, demo):
        assert done.returncode == 2 and done.stdout == ""  # no success banner, no "recording the demo runs"
        assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "demo").exists()


def test_bad_port_is_refused() -> None:
    with pytest.raises(ValueError, match="--port"):
        serve.streamlit_command("127.0.0.1", 70000)


def test_pages_name_the_chart_chunks_for_preload(tmp_path: Path) -> None:
    """The run page's chart code is named to the browser with the page (a Link header), so it loads while the
    server reads the run; every name is one this server serves, and only HTML pages carry the header."""
    import urllib.request
    from urllib.parse import urljoin

    from runwatch.app.preload import PRELOADED_CHUNKS
    from tests.app.test_browser import dashboard_server

    with dashboard_server(tmp_path) as base:
        page = urllib.request.urlopen(f"{base}/run?run=x", timeout=30)
        assert page.headers.get_content_type() == "text/html"
        links = [part.split(";")[0].strip().strip("<>") for part in (page.headers.get("link") or "").split(",")]
        assert len(links) == len(PRELOADED_CHUNKS) and all("rel=modulepreload" in part for part in
                                                           page.headers["link"].split(","))
        for stem, link in zip(PRELOADED_CHUNKS, links):
            assert f"/{stem}." in link
            chunk = urllib.request.urlopen(urljoin(f"{base}/run", link), timeout=30)
            assert chunk.status == 200 and "javascript" in chunk.headers.get_content_type()
            assert chunk.headers.get("link") is None  # assets are not pages


def test_pages_tell_the_browser_where_the_api_is(tmp_path: Path) -> None:
    """Every HTML page, gzipped or not, starts its head with the script that sets Streamlit's backend base URL;
    assets and the API are served as they are."""
    import gzip
    import urllib.request

    from runwatch.app.backend_base import head_script
    from tests.app.test_browser import dashboard_server

    def get(url: str, **headers: str) -> tuple[object, bytes]:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r, r.read()

    with dashboard_server(tmp_path) as base:
        for path in ("/", "/run?run=x", "/compare"):
            plain, body = get(base + path)
            packed, packed_body = get(base + path, **{"Accept-Encoding": "gzip"})
            assert plain.headers.get_content_type() == "text/html" and packed.headers.get("content-encoding") is None
            assert body == packed_body and int(plain.headers["content-length"]) == len(body)
            head = body.index(b"<head>") + len(b"<head>")
            assert body[head:head + len(head_script())] == head_script()
        asset, asset_body = get(base + "/_stcore/health", **{"Accept-Encoding": "gzip"})
        assert asset_body == b"ok" and head_script() not in asset_body
        found = next(p for p in __import__("re").findall(rb'src="(\./static/js/[^"]+)"', body))
        js, js_body = get(base + "/" + found.decode().lstrip("./"), **{"Accept-Encoding": "gzip"})
        raw = gzip.decompress(js_body) if js.headers.get("content-encoding") == "gzip" else js_body
        assert head_script() not in raw
