"""`runwatch dashboard` / `runwatch demo` wiring: loopback by default, usage stats off, bad input is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.app import serve
from runwatch.app.cli import build_parser


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


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "dashboard", "--root", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "runwatch: error:" in proc.stderr and "no such directory" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_port_is_refused() -> None:
    with pytest.raises(ValueError, match="--port"):
        serve.streamlit_command("127.0.0.1", 70000)
