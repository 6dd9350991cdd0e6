"""Who can reach the dashboard, with a real server: the bind rule, foreign Host headers, WebSocket Origins,
XSRF, and the login settings read from real secrets files."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwatch.app import auth, serve
from tests.app.conftest import free_port, spike_lines, wait_http, write_jsonl_run

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]
COOKIE_SECRET = "k" * 40


def _secrets(path: Path, **overrides: str) -> Path:
    values = {"redirect_uri": "http://dash.example.com:8501/oauth2callback", "cookie_secret": COOKIE_SECRET,
              "client_id": "runwatch", "client_secret": "s3cret",
              "server_metadata_url": "https://idp.example.com/.well-known/openid-configuration", **overrides}
    path.write_text("[auth]\n" + "".join(f'{k} = "{v}"\n' for k, v in values.items() if v is not None))
    return path


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("root")
    write_jsonl_run(root, "r", spike_lines(50, spike_at=-1))
    number = free_port()
    proc = subprocess.Popen([*RUNWATCH, "dashboard", "--root", str(root), "--port", str(number)],
                            cwd=tmp_path_factory.mktemp("cwd"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        wait_http(f"http://127.0.0.1:{number}/_stcore/health", proc)
        yield number
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _raw(port: int, request: str) -> tuple[int, str]:
    """Send ``request`` as it is (no client fixing up its Host) and return the status code and the head."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request.encode("latin-1"))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    text = head.decode("latin-1")
    return int(text.split(" ", 2)[1]), text


def _get(port: int, path: str, host: str | None) -> int:
    host_line = "" if host is None else f"Host: {host}\r\n"
    return _raw(port, f"GET {path} HTTP/1.1\r\n{host_line}Connection: close\r\n\r\n")[0]


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1:{port}", True), ("localhost:{port}", True), ("LOCALHOST.:{port}", True),
    ("evil.example", False), ("evil.example:{port}", False), ("127.0.0.1.evil.example:{port}", False),
    ("user@127.0.0.1:{port}", False), ("127.0.0.1:{port}:1", False), ("", False), (None, False),
])
@pytest.mark.parametrize("path", ["/", "/_stcore/health", "/_stcore/host-config", "/static/index.html"])
def test_foreign_host_headers_are_refused(port: int, host: str | None, allowed: bool, path: str) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends its own Host."""
    status = _get(port, path, None if host is None else host.format(port=port))
    assert (status < 400) if allowed else (status == 400), status


def _websocket(port: int, origin: str | None, host: str = "127.0.0.1:{port}") -> int:
    origin_line = "" if origin is None else f"Origin: {origin.format(port=port)}\r\n"
    return _raw(port, f"GET /_stcore/stream HTTP/1.1\r\nHost: {host.format(port=port)}\r\nConnection: Upgrade\r\n"
                      "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      f"Sec-WebSocket-Protocol: streamlit\r\n{origin_line}\r\n")[0]


@pytest.mark.parametrize("origin, status", [
    ("http://127.0.0.1:{port}", 101), (None, 101),  # the page itself; a non-browser client sends none
    ("http://evil.example", 403), ("http://evil.example:{port}", 403), ("null", 403),
    ("http://localhost:{port}", 403),  # another origin than the Host the page was loaded from
    ("http://127.0.0.1:1", 403), ("file://", 403), ("http://127.0.0.1", 403),
    ("https://127.0.0.1:{port}", 101),  # same host and port: only this server listens there
])
def test_websocket_only_from_the_pages_own_origin(port: int, origin: str | None, status: int) -> None:
    """Cross-site WebSocket hijacking: any page in the browser can try to open ws://127.0.0.1:PORT."""
    assert _websocket(port, origin) == status


def test_websocket_with_a_foreign_host_is_refused(port: int) -> None:
    assert _websocket(port, "http://evil.example:{port}", host="evil.example:{port}") == 403


def test_uploads_need_the_xsrf_token(port: int) -> None:
    body = "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\n{}\r\n--b--\r\n"
    status, _ = _raw(port, f"PUT /_stcore/upload_file/session/file HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {len(body)}\r\n"
                           f"Connection: close\r\n\r\n{body}")
    assert status == 403


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "dash.example.com"])
def test_network_bind_without_login_is_refused(tmp_path: Path, host: str) -> None:
    (tmp_path / "root").mkdir()
    out = subprocess.run([*RUNWATCH, "dashboard", "--root", str(tmp_path / "root"), "--host", host],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no login" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.8.0.1", True), ("localhost", True),
                                            ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                            ("10.0.0.1", False), ("localhost.evil.example", False)])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert auth.is_loopback(host) is loopback


def test_a_login_allows_a_network_bind_and_names_the_public_host(tmp_path: Path) -> None:
    config = auth.read_auth(_secrets(tmp_path / "secrets.toml"))
    assert config is not None and config.provider == "default"
    auth.check_bind("0.0.0.0", config)  # does not raise
    assert auth.allowed_hosts("0.0.0.0", config) == ["127.0.0.1", "::1", "dash.example.com", "localhost"]
    cmd = serve.streamlit_command("0.0.0.0", 8501, config)
    assert cmd[cmd.index("--secrets.files") + 1] == str(tmp_path / "secrets.toml")
    assert cmd[cmd.index("--server.enableXsrfProtection") + 1] == "true"
    assert cmd[cmd.index("--server.enableCORS") + 1] == "true"


@pytest.mark.parametrize("overrides, message", [
    ({"redirect_uri": "http://dash.example.com/callback"}, "redirect_uri must be"),
    ({"redirect_uri": "javascript:alert(1)//oauth2callback"}, "redirect_uri must be"),
    ({"cookie_secret": "short"}, "at least 32 characters"),
    ({"cookie_secret": None}, "missing cookie_secret"),
    ({"client_secret": None}, "needs client_id, client_secret, server_metadata_url"),
])
def test_bad_login_settings_are_one_clear_line(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        auth.read_auth(_secrets(tmp_path / "secrets.toml", **overrides))
    (tmp_path / "root").mkdir()
    out = subprocess.run([*RUNWATCH, "dashboard", "--root", str(tmp_path / "root"), "--host", "0.0.0.0",
                          "--secrets", str(tmp_path / "secrets.toml")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message.split()[0] in out.stderr and "Traceback" not in out.stderr


def test_named_provider_and_allow_list(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    path.write_text(f'[auth]\nredirect_uri = "https://dash.example.com/oauth2callback"\ncookie_secret = "{COOKIE_SECRET}"\n'
                    '[auth.okta]\nclient_id = "a"\nclient_secret = "b"\n'
                    'server_metadata_url = "https://example.okta.com/.well-known/openid-configuration"\n'
                    '[runwatch]\nallowed_users = ["alice@example.com", "@ops.example.com"]\n')
    config = auth.read_auth(path)
    assert config is not None and config.provider == "okta" and config.public_host == "dash.example.com"
    assert auth.read_auth(None) is None
    (tmp_path / "plain.toml").write_text('api_key = "x"\n')
    assert auth.read_auth(tmp_path / "plain.toml") is None  # a secrets file without [auth]: no login configured


@pytest.mark.parametrize("email, verified, allowed", [
    ("alice@example.com", True, True), ("ALICE@example.com", None, True), ("bob@ops.example.com", True, True),
    ("bob@example.com", True, False), ("alice@example.com", False, False), ("eve@ops.example.com.evil", True, False),
    ("alice@example.com.evil.example", True, False), (None, True, False), ("", True, False),
])
def test_allow_list(email: object, verified: object, allowed: bool) -> None:
    assert auth.user_allowed(email, verified, ("alice@example.com", "@ops.example.com")) is allowed
    assert auth.user_allowed(email, verified, ()) is True  # no list: whoever the provider let in


@pytest.mark.parametrize("host, origin, refused", [
    ("dash.example.com", "https://dash.example.com", None),  # behind a TLS proxy that keeps the Host
    ("dash.example.com", "https://evil.example", "foreign Origin"),
    ("dash.example.com:8501", "http://dash.example.com:8501", None),
    ("dash.example.com:8501", "http://dash.example.com:8502", "foreign Origin"),
    ("evil.example", "http://evil.example", "unknown Host"),
])
def test_host_guard_rules(host: str, origin: str, refused: str | None) -> None:
    from runwatch.app.auth import HostGuard

    guard = HostGuard(lambda *a: None, ["localhost", "dash.example.com"])
    scope = {"type": "websocket", "headers": [(b"host", host.encode()), (b"origin", origin.encode())]}
    assert guard.refusal(scope) == refused
