"""Storage: atomic files, all-or-nothing staging, compaction, and plain-DuckDB readability."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa
import pytest

from runwatch.data.compact import compact
from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite, check_run_name, data_files
from runwatch.data.store import Store


def _rows(lo: int, hi: int, **extra: float) -> pa.Table:
    return metrics_table([{"step": s, "time": 1000.0 + s, "loss": 5.0 - s / 100, **extra} for s in range(lo, hi)])


def _write_parts(root, run: str = "r", parts: int = 5, per: int = 10) -> None:
    for i in range(parts):
        extra = {"aux": float(i)} if i % 2 else {}
        with StagedWrite(root) as staged:
            staged.add_metrics(run, 0, 0, _rows(i * per, (i + 1) * per, **extra))


def test_plain_duckdb_reads_the_tree_without_runwatch(tmp_path):
    _write_parts(tmp_path)
    with StagedWrite(tmp_path) as staged:
        staged.add_events("r", 0, 0, [{"event": "checkpoint", "step": 9, "path": "ckpt/9.pt"}])
    glob = str(tmp_path / "**" / "*.parquet")
    con = duckdb.connect()
    rows = con.sql(
        "SELECT run, segment, rank, count(*) AS n, max(step) AS last FROM "
        "read_parquet(?, hive_partitioning=1, union_by_name=1) GROUP BY ALL", params=[glob]
    ).fetchall()
    # Events live in JSON Lines, so the metrics glob sees metric rows only.
    assert rows == [("r", 0, 0, 50, 49)]


def test_staged_write_lands_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with StagedWrite(tmp_path) as staged:
            staged.add_metrics("r", 0, 0, _rows(0, 10))
            staged.add_events("r", 0, 0, [{"event": "note", "step": 1, "text": "hi"}])
            raise RuntimeError("parser failed half-way")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_staged_write_rejects_unknown_event_kind(tmp_path):
    with pytest.raises(ValueError, match="unknown event kind"):
        with StagedWrite(tmp_path) as staged:
            staged.add_events("r", 0, 0, [{"event": "explode", "step": 1}])
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_compact_merges_parts_without_changing_results(tmp_path):
    _write_parts(tmp_path, parts=6)
    with StagedWrite(tmp_path) as staged:
        for step in (5, 15):
            staged.add_events("r", 0, 0, [{"event": "checkpoint", "step": step, "path": f"c/{step}"}])
    with Store(tmp_path) as store:
        before = store.rows("r").sort_by("step")
        events_before = store.events("r")
    assert len(data_files(tmp_path, "r")) == 6
    counts = compact(tmp_path)
    assert (counts.files_before, counts.files_after) == (8, 2)  # 6 metric parts + 2 event files
    assert len(data_files(tmp_path, "r")) == 1
    with Store(tmp_path) as store:
        after = store.rows("r").sort_by("step")
        assert after.equals(before.select(after.column_names))
        assert store.events("r").equals(events_before)


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 200, "a b", "run=1"])
def test_run_names_cannot_leave_the_root(name):
    with pytest.raises(ValueError, match="invalid run name"):
        check_run_name(name)


def test_nan_and_inf_are_stored_as_they_are(tmp_path):
    values = [1.0, math.nan, math.inf, -math.inf, 2.0]
    table = metrics_table([{"step": i, "loss": v, "grad_norm": v} for i, v in enumerate(values)])
    with StagedWrite(tmp_path) as staged:
        staged.add_metrics("r", 0, 0, table)
    with Store(tmp_path) as store:
        got = store.rows("r")["loss"].to_pylist()
    assert got[0] == 1.0 and math.isnan(got[1]) and got[2] == math.inf and got[3] == -math.inf and got[4] == 2.0


def test_duckdb_globs_hidden_directories_and_not_symlinked_ones(tmp_path):
    """Why staging lives beside the root (data/storage.py): inside it, ``**`` would read the staged copy."""
    for where in ("run=a", ".staging/run=b"):
        with StagedWrite(tmp_path / "x") as staged:
            staged.add_metrics("a", 0, 0, _rows(0, 3))
        (tmp_path / "root" / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "x" / "run=a").rename(tmp_path / "root" / where)
    (tmp_path / "root" / "run=c").symlink_to(tmp_path / "root" / "run=a", target_is_directory=True)
    found = duckdb.sql(f"SELECT file FROM glob('{tmp_path}/root/**/*.parquet')").fetchall()
    assert sorted(f[0].split("/root/")[1].split("/")[0] for f in found) == [".staging", "run=a"]
