"""Import, --replace and compact killed (SIGKILL, real processes) at every step of the switch: old or new, never mixed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from runwatch.data.compact import compact
from runwatch.data.record import metrics_table
from runwatch.data.staging import CRASH_ENV, new_op, switch_in
from runwatch.data.storage import StagedWrite, data_files, part_name, write_parquet_atomic
from runwatch.data.store import Store
from tests.data.helpers import plain_rows, run_cli, staging_leftovers, write_log

KILLED = -9


def _rows(root: Path, run: str) -> list[tuple]:
    """(segment, rank, step, loss) by runwatch, checked equal to what plain DuckDB reads."""
    plain = [r[1:] for r in plain_rows(root, run)]
    with Store(root) as store:
        mine = sorted(tuple(r[c] for c in ("segment", "rank", "step", "loss"))
                      for r in store.rows(run, rank=None).to_pylist()) if store.has_run(run) else []
    assert mine == plain
    return mine


def _import(tmp_path: Path, root: Path, steps: range, loss: float, *extra: str, crash: str | None = None):
    log = write_log(tmp_path / f"in-{loss}.jsonl", steps, loss)
    return run_cli("import", "jsonl", str(log), "--root", str(root), "--run", "r", *extra,
                   env={CRASH_ENV: crash} if crash else None)


@pytest.mark.parametrize("point", ["import.staged", "switch.before", "switch.after"])
def test_a_killed_import_leaves_no_run_or_the_whole_run(tmp_path: Path, point: str) -> None:
    """Issue 9.5: a killed import used to leave a run that `import` saw and `runs`/`check` did not."""
    root = tmp_path / "root"
    out = _import(tmp_path, root, range(100), 1.0, crash=point)
    assert out.returncode == KILLED
    rows = _rows(root, "r")
    landed = point == "switch.after"
    assert rows == ([(0, 0, s, 1.0) for s in range(100)] if landed else [])
    listed = run_cli("runs", "--root", str(root), "--json")
    assert ('"r"' in listed.stdout) == landed
    again = _import(tmp_path, root, range(100), 1.0)
    assert again.returncode == (2 if landed else 0), again.stderr
    assert len(_rows(root, "r")) == 100
    assert staging_leftovers(root) == []  # the next writer of the run cleaned what the dead one left


@pytest.mark.parametrize("point", ["import.staged", "switch.before", "switch.after"])
def test_a_killed_replace_leaves_the_old_run_or_the_new_one(tmp_path: Path, point: str) -> None:
    root = tmp_path / "root"
    assert _import(tmp_path, root, range(100), 1.0).returncode == 0
    out = _import(tmp_path, root, range(50, 120), 2.0, "--replace", crash=point)
    assert out.returncode == KILLED
    old, new = [(0, 0, s, 1.0) for s in range(100)], [(0, 0, s, 2.0) for s in range(50, 120)]
    assert _rows(root, "r") == (new if point == "switch.after" else old)
    assert run_cli("compact", "--root", str(root), "--run", "r").returncode == 0  # the next writer
    assert _rows(root, "r") == (new if point == "switch.after" else old)
    assert staging_leftovers(root) == []


def _parts(root: Path, run: str = "r", parts: int = 6, per: int = 20) -> list[tuple]:
    for i in range(parts):
        with StagedWrite(root) as staged:
            staged.add_metrics(run, 0, 0, metrics_table([{"step": s, "loss": float(s)}
                                                         for s in range(i * per, (i + 1) * per)]))
            staged.add_events(run, 0, 0, [{"event": "checkpoint", "step": (i + 1) * per - 1, "path": f"c/{i}"}])
    return _rows(root, run)


@pytest.mark.parametrize("point", ["compact.staged", "switch.before", "switch.after"])
def test_a_killed_compact_never_duplicates_or_loses_rows(tmp_path: Path, point: str) -> None:
    """Issue 9.4: compact killed between writing the merged file and deleting the parts duplicated rows."""
    root = tmp_path / "root"
    before = _parts(root)
    with Store(root) as store:
        events = store.events("r").to_pylist()
    out = run_cli("compact", "--root", str(root), env={CRASH_ENV: point})
    assert out.returncode == KILLED
    assert _rows(root, "r") == before
    assert len(data_files(root, "r")) == (1 if point == "switch.after" else 6)
    assert run_cli("compact", "--root", str(root)).returncode == 0
    assert _rows(root, "r") == before and len(data_files(root, "r")) == 1
    with Store(root) as store:
        assert store.events("r").to_pylist() == events
    assert staging_leftovers(root) == []


WITHOUT_EXCHANGE = """
import sys
import runwatch.data.staging as staging
staging.exchange = lambda a, b: False  # a filesystem without renameat2(RENAME_EXCHANGE), as NFS
from runwatch.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_where_the_filesystem_cannot_exchange_the_next_writer_finishes_the_switch(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _import(tmp_path, root, range(100), 1.0).returncode == 0
    log = write_log(tmp_path / "new.jsonl", range(30), 2.0)
    out = subprocess.run([sys.executable, "-c", WITHOUT_EXCHANGE, "import", "jsonl", str(log), "--root", str(root),
                          "--run", "r", "--replace"], env={**__import__("os").environ, CRASH_ENV: "switch.middle"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == KILLED
    assert _rows(root, "r") == []  # the old tree is out, the new one not in yet: missing, never mixed
    assert run_cli("compact", "--root", str(root), "--run", "r").returncode == 0  # finishes the switch first
    assert _rows(root, "r") == [(0, 0, s, 2.0) for s in range(30)]
    assert staging_leftovers(root) == []


def _split(root: Path, per: int = 20, parts: int = 6) -> None:
    """The inverse of compact, switched in the same way: the partition as six parts again."""
    rel = "run=r/segment=0/rank=0"
    op = new_op(root, "r", rel)
    (op / rel).mkdir(parents=True)
    for i in range(parts):
        table = metrics_table([{"step": s, "loss": float(s)} for s in range(i * per, (i + 1) * per)])
        write_parquet_atomic(table, op / rel / part_name("metrics", "parquet"))
    switch_in(root, op)


def test_readers_during_compact_never_fail_and_never_see_a_mix(tmp_path: Path) -> None:
    """Issue 9.4: a reader during compact sometimes got "No files found"."""
    root = tmp_path / "root"
    _parts(root)
    stop = threading.Event()
    seen = {"store": [], "store_errors": [], "plain": [], "plain_errors": 0}

    def read_store() -> None:
        with Store(root) as store:
            while not stop.is_set():
                try:
                    seen["store"].append(store.rows("r").num_rows)
                except Exception as err:  # noqa: BLE001 - any failure is what this test looks for
                    seen["store_errors"].append(repr(err))

    def read_plain() -> None:
        with duckdb.connect() as con:
            while not stop.is_set():
                try:
                    seen["plain"].append(con.sql(f"SELECT count(*) FROM read_parquet('{root}/**/*.parquet', "
                                                 "hive_partitioning=1)").fetchall()[0][0])
                except duckdb.IOException:
                    seen["plain_errors"] += 1  # listed before a switch, opened after it: rerun

    readers = [threading.Thread(target=read_store), threading.Thread(target=read_plain)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 4
    num_switches = 0
    while time.monotonic() < deadline:
        compact(root, "r")
        _split(root)
        num_switches += 2
    stop.set()
    for t in readers:
        t.join()
    assert num_switches >= 10 and len(seen["store"]) >= 10 and len(seen["plain"]) >= 10
    assert seen["store_errors"] == []
    assert set(seen["store"]) == {120} and set(seen["plain"]) == {120}


# Root ignores file modes (CAP_DAC_OVERRIDE): the writer runs without that capability, as a normal user would.
_WITHOUT_DAC = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if os.geteuid() == 0 and libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
    sys.exit("cannot drop CAP_DAC_OVERRIDE")
os.execv(sys.executable, [sys.executable, "-m", "runwatch.app.cli", *sys.argv[1:]])
"""


def test_replace_over_an_unwritable_old_partition_switches_whole(tmp_path: Path) -> None:
    """Issue 9.3: failing on one unwritable old file used to leave old and new rows mixed in one segment."""
    root = tmp_path / "root"
    assert _import(tmp_path, root, range(100), 1.0).returncode == 0
    stuck = root / "run=r" / "segment=0" / "rank=0"
    stuck.chmod(0o555)  # its files cannot be deleted
    try:
        log = write_log(tmp_path / "new.jsonl", range(30), 2.0)
        out = subprocess.run([sys.executable, "-c", _WITHOUT_DAC, "import", "jsonl", str(log), "--root", str(root),
                              "--run", "r", "--replace"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert _rows(root, "r") == [(0, 0, s, 2.0) for s in range(30)]
        assert out.stderr.count("\n") == 1 and "could not delete" in out.stderr  # the old tree, now in staging
    finally:
        for left in [stuck, *(p for p in staging_leftovers(root) for p in p.rglob("rank=0"))]:
            left.chmod(0o755)
    assert run_cli("compact", "--root", str(root)).returncode == 0
    assert staging_leftovers(root) == []
