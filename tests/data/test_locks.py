"""One run-level writer at a time: the second fails at once naming the holder; a killed holder's lock is free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from runwatch.data.store import Store
from tests.data.helpers import plain_rows, run_cli, write_log

HOLD = """
import sys, time
from runwatch.data.locks import RunLock
lock = RunLock(sys.argv[1], sys.argv[2], "import").acquire()
print("locked", flush=True)
time.sleep(120)
"""


def _holder(root: Path, run: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), run], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    root = tmp_path / "root"
    log = write_log(tmp_path / "in.jsonl", range(10))
    holder = _holder(root, "r")
    try:
        for args in (["import", "jsonl", str(log), "--root", str(root), "--run", "r"],
                     ["import", "jsonl", str(log), "--root", str(root), "--run", "r", "--replace"],
                     ["compact", "--root", str(root), "--run", "r"]):
            t0 = time.monotonic()
            out = run_cli(*args)
            assert out.returncode == 2, out
            assert time.monotonic() - t0 < 30  # no waiting: the busy check is a non-blocking lock
            line = out.stderr.strip()
            assert "\n" not in line and "Traceback" not in line
            assert f"pid {holder.pid} on host {socket.gethostname()}" in line and "busy" in line
        assert plain_rows(root) == []
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_of_a_killed_writer_is_taken_over(tmp_path: Path) -> None:
    root = tmp_path / "root"
    holder = _holder(root, "r")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    out = run_cli("import", "jsonl", str(write_log(tmp_path / "in.jsonl", range(10))), "--root", str(root),
                  "--run", "r")
    assert out.returncode == 0, out.stderr
    assert len(plain_rows(root, "r")) == 10
    assert not list(root.glob(".*.lock"))  # the holder removes its lock file when done


def test_two_imports_into_one_new_run_land_it_once(tmp_path: Path) -> None:
    """The reproduction of issue 9.1: both used to succeed and every row landed twice."""
    log = write_log(tmp_path / "in.jsonl", range(200_000))
    for attempt in range(3):
        root = tmp_path / f"root{attempt}"
        procs = [subprocess.Popen([sys.executable, "-m", "runwatch.app.cli", "import", "jsonl", str(log), "--root",
                                   str(root), "--run", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        assert sorted(rc for rc, _ in results) == [0, 2], results
        loser = next(err for rc, err in results if rc == 2)
        assert "busy" in loser or "already exists" in loser
        with Store(root) as store:
            assert store.rows("r").num_rows == 200_000
