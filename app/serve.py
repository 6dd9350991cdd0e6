"""``runwatch dashboard``: serve the Streamlit app over one root.

Runs ``streamlit run dashboard.py`` as a child process bound to 127.0.0.1
unless told otherwise, headless, with usage statistics off. The root travels
in ``RUNWATCH_ROOT`` (resolved to an absolute path first, since the child runs
from the app folder so that its ``.streamlit/config.toml`` applies).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT_ENV = "RUNWATCH_ROOT"  # how the Streamlit child learns its root (read by state.py)
APP_DIR = Path(__file__).resolve().parent
ENTRY = APP_DIR / "dashboard.py"


def streamlit_command(host: str, port: int) -> list[str]:
    """The exact ``streamlit run`` command line (security settings spelled out, not left to defaults)."""
    if not 0 < port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {port}")
    return [
        sys.executable, "-m", "streamlit", "run", str(ENTRY),
        "--server.address", host, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.runOnSave", "false",
        "--server.fileWatcherType", "none", "--global.developmentMode", "false",
    ]


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8501) -> int:
    """Serve until interrupted; returns streamlit's exit code."""
    root_path = Path(root).expanduser().resolve()
    if not root_path.is_dir():
        raise ValueError(f"{root}: no such directory (expected a runwatch root)")
    env = {**os.environ, ROOT_ENV: str(root_path)}
    where = "this machine only" if host in ("127.0.0.1", "localhost", "::1") else "REACHABLE FROM THE NETWORK"
    print(f"runwatch dashboard on http://{host}:{port}  (root {root_path}; {where}); Ctrl-C stops it", flush=True)
    proc = subprocess.Popen(streamlit_command(host, port), cwd=APP_DIR, env=env)
    # A SIGTERM to us (a supervisor, a test) must not orphan the server still holding the port.
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
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
    return serve(args.root, host=args.host, port=args.port)
