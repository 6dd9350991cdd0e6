"""Monitor under faults, in real subprocesses: kill -9, a read-only root, a full disk, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from runwatch.data.store import Store

SCRIPT = Path(__file__).with_name("train_script.py")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _result(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT line in output:\n{stdout[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _read_all(root: Path) -> list[int]:
    """Steps in the tree, read by plain DuckDB with no runwatch code."""
    with duckdb.connect() as con:
        rel = con.sql(f"SELECT step FROM read_parquet('{root}/**/*.parquet', hive_partitioning=1, "
                      "union_by_name=1) ORDER BY step")
        return [r[0] for r in rel.fetchall()]


class TreePoller(threading.Thread):
    """Reads the whole tree with DuckDB in a loop while a trainer writes it; records any failure."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.errors, self.num_reads, self.max_rows = root, [], 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if any(self.root.glob("**/*.parquet")):
                try:
                    self.max_rows = max(self.max_rows, len(_read_all(self.root)))
                    self.num_reads += 1
                except duckdb.Error as err:
                    self.errors.append(str(err))
            time.sleep(0.005)


@pytest.mark.integration
def test_kill_9_loses_at_most_the_unflushed_buffer(tmp_path: Path) -> None:
    flush_every = 10
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path), "--steps", "100000", "--flush-every", str(flush_every),
         "--sleep", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    poller = TreePoller(tmp_path)
    poller.start()
    try:
        for line in proc.stdout:
            if line.startswith("step ") and int(line.split()[1]) >= 100:
                break
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    finally:
        poller.stop.set()
        poller.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    last_printed = max(int(ln.split()[1]) for ln in ("step 100\n" + rest).splitlines() if ln.startswith("step "))
    steps = _read_all(tmp_path)
    # Every file is whole and readable; the rows are a prefix of the run made of whole flushes.
    assert steps == list(range(len(steps))) and len(steps) % flush_every == 0
    # Lost: the unflushed buffer, plus at most one flush still on its way to the writer.
    assert last_printed + 1 - len(steps) <= 2 * flush_every
    assert poller.errors == [] and poller.num_reads > 5 and poller.max_rows > 0


# Root ignores file modes through CAP_DAC_OVERRIDE (CI runs as root): this launcher drops
# that capability from the bounding set, so the exec'd trainer really cannot write a 0o555 dir.
_DROP_DAC_AND_EXEC = """
import ctypes, os, sys
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1
libc = ctypes.CDLL(None, use_errno=True)
if os.geteuid() == 0 and libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
    sys.exit(f"cannot drop CAP_DAC_OVERRIDE: errno {ctypes.get_errno()}")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def test_read_only_root_does_not_stop_training(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir(mode=0o555)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _DROP_DAC_AND_EXEC, str(SCRIPT), "--root", str(root), "--steps", "40",
             "--flush-every", "10"], capture_output=True, text=True, env=_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = _result(proc.stdout)
        assert result["steps_done"] == 40 and result["num_written_rows"] == 0
        assert result["num_errors"] >= 4 and result["num_dropped_rows"] == 40
        assert len(result["warnings"]) == 1 and "Permission" in result["warnings"][0]
        assert list(root.iterdir()) == []
    finally:
        root.chmod(0o755)


def test_full_disk_does_not_stop_training(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path), "--steps", "40", "--flush-every", "10",
         "--fsize-limit", "256"], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _result(proc.stdout)
    assert result["steps_done"] == 40 and result["num_written_rows"] == 0
    assert result["num_errors"] >= 4 and result["num_dropped_rows"] == 40
    assert len(result["warnings"]) == 1 and "File too large" in result["warnings"][0]
    # A failed write leaves no partial file a reader could pick up.
    assert list(tmp_path.glob("**/*.parquet")) == [] and list(tmp_path.glob("**/*.tmp-*")) == []


def test_exit_without_close_still_writes_everything(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path), "--steps", "37", "--flush-every", "10", "--no-close"],
        capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _read_all(tmp_path) == list(range(37))  # the last 7 unflushed rows were written at exit


@pytest.mark.integration
def test_torchrun_writes_one_shard_per_rank(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
         "--distributed", "--root", str(tmp_path), "--name", "ddp", "--steps", "20", "--flush-every", "5"],
        capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "run=ddp" / "segment=0").iterdir()) == ["rank=0", "rank=1"]
    with Store(tmp_path) as store:
        assert store.ranks("ddp") == [0, 1]
        for rank in (0, 1):
            rows = store.rows("ddp", rank=rank)
            assert rows["step"].to_pylist() == list(range(20)) and rows["loss"].null_count == 0
        assert store.meta("ddp")["world_size"] == 2
