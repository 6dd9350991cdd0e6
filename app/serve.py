"""``runwatch dashboard``: serve the Streamlit app over one root, to this machine or behind a login.

Runs ``streamlit run asgi.py`` as a child process: the dashboard behind a
host guard (``asgi.py``), headless, usage statistics off, XSRF and CORS
checks on. The root travels in ``RUNWATCH_ROOT`` (resolved to an absolute
path first, since the child runs from the app folder so that its
``.streamlit/config.toml`` applies). The bind rule and the login settings
are ``auth.py``'s: a non-loopback ``--host`` is refused unless the secrets
file configures OpenID Connect.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from runwatch.app.auth import (
    ALLOWED_HOSTS_ENV,
    AUTH_ENV,
    AuthConfig,
    allowed_hosts,
    check_bind,
    default_secrets_file,
    read_auth,
)
from runwatch.data.roots import is_url, open_root

ROOT_ENV = "RUNWATCH_ROOT"  # how the Streamlit child learns its root (read by state.py)
APP_DIR = Path(__file__).resolve().parent
ENTRY = APP_DIR / "asgi.py"


def streamlit_command(host: str, port: int, auth: AuthConfig | None = None) -> list[str]:
    """The exact ``streamlit run`` command line (security settings spelled out, not left to defaults)."""
    if not 0 < port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {port}")
    cmd = [
        sys.executable, "-m", "streamlit", "run", str(ENTRY),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.runOnSave", "false",
        "--server.fileWatcherType", "none", "--global.developmentMode", "false",
        "--server.enableXsrfProtection", "true", "--server.enableCORS", "true",
        # A full gen-2 collection after every 5 s tick of every open page was a third of an idle
        # overview's CPU; Python's own generational GC still runs.
        "--runner.postScriptGC", "false",
    ]
    for name in allowed_hosts(host, auth):  # Streamlit's own WebSocket Host check, behind asgi.HostGuard
        cmd += ["--server.allowedHosts", name]
    if auth is not None:
        cmd += ["--secrets.files", str(auth.secrets_file)]
    return cmd


def check_port(host: str, port: int) -> None:
    """Fail now, before anything is printed, when ``host:port`` cannot be listened on (taken, not ours)."""
    if not 0 < port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own listener does
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as err:
            raise ValueError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror or err}); "
                             "another program (another dashboard?) may hold it: pick a free port with --port") from err


def root_note(root: Path) -> str | None:
    """What to say when the root has no runs yet, and how to fill it (the dashboard starts anyway)."""
    has_runs = root.is_dir() and any(p.name.startswith("run=") for p in root.iterdir())
    if has_runs:
        return None
    state = "does not exist yet" if not root.exists() else "has no runs yet"
    return (f"note: {root} {state}; runs appear as they are recorded: Monitor(\"{root}\", run=...) in a training "
            f"loop, `runwatch import auto LOG --root {root} --run NAME`, or `runwatch demo --root {root} --no-dashboard`")


def _wait_ready(proc: subprocess.Popen, host: str, port: int, timeout_s: float = 120.0) -> None:
    """Until the server answers its health check; an early exit (the port taken after all) is an error."""
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host.strip("[]"), host.strip("[]"))
    url = f"http://{'[' + probe + ']' if ':' in probe else probe}:{port}/_stcore/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard did not start on {host}:{port} (streamlit exited with {proc.returncode})")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (a login may guard the health check)
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the dashboard did not answer on {host}:{port} within {timeout_s:.0f} s")


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8501, secrets: str | Path | None = None) -> int:
    """Serve until interrupted; returns streamlit's exit code.

    Everything that can be checked is checked before anything is printed
    (the secrets, the bind rule, the port); the address is printed once the
    server answers, never before a failure. A missing or empty local root is
    not an error: the dashboard starts and says how to fill it.
    """
    if is_url(root):  # an object store: checked here (one clear error), read through fsspec by the app
        open_root(str(root))
        root_path = str(root).rstrip("/")
    else:
        root_path = Path(root).expanduser().resolve()
        if root_path.exists() and not root_path.is_dir():
            raise ValueError(f"{root}: not a directory (expected a runwatch root)")
    if secrets is not None and not Path(secrets).is_file():
        raise ValueError(f"--secrets {secrets}: no such file")
    secrets_file = Path(secrets).resolve() if secrets is not None else default_secrets_file()
    auth = read_auth(secrets_file)
    check_bind(host, auth)
    check_port(host, port)
    env = {**os.environ, ROOT_ENV: str(root_path), ALLOWED_HOSTS_ENV: ",".join(allowed_hosts(host, auth))}
    env.pop(AUTH_ENV, None)
    if auth is not None:
        env[AUTH_ENV] = str(auth.secrets_file.resolve())
    who = (f"login through {auth.provider} OIDC" + ("" if auth.allowed_users else ", ANY account the provider knows")
           if auth is not None else "this machine only")
    # A SIGTERM to us (a supervisor, a test) must not orphan the server still holding the port.
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    proc = subprocess.Popen(streamlit_command(host, port, auth), cwd=APP_DIR, env=env)
    try:
        _wait_ready(proc, host, port)
        print(f"runwatch dashboard on http://{host}:{port}  (root {root_path}; {who}); Ctrl-C stops it", flush=True)
        if isinstance(root_path, Path) and (note := root_note(root_path)) is not None:
            print(note, flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(args: argparse.Namespace) -> int:
    return serve(args.root, host=args.host, port=args.port, secrets=getattr(args, "secrets", None))
