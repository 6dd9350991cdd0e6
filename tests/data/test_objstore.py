"""An object-store root against a real S3 API (moto's server on 127.0.0.1): the same promises as on disk.

Import, runs, check and compact through the real CLI (subprocesses reaching
the server over HTTP, credentials and endpoint from the AWS environment),
results identical to the same log on a local root; a kill (SIGKILL) at every
step of an op-record switch leaves the old run or the new one for runwatch's
readers, and the next writer cleans up; the run lock by conditional create.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runwatch.data.locks import RunBusy
from runwatch.data.objstore import ObjectRoot
from runwatch.data.objwrite import ObjectRunLock, supports_create
from runwatch.data.record import metrics_table
from runwatch.data.staging import CRASH_ENV
from runwatch.data.store import Store
from tests.data.helpers import run_cli, write_log

KILLED = -9


def _rows(root: str | Path, run: str) -> list[tuple]:
    with Store(root) as store:
        if not store.has_run(run):
            return []
        return sorted(tuple(r[c] for c in ("segment", "rank", "step", "loss"))
                      for r in store.rows(run, rank=None).to_pylist())


def _plain_duckdb(root: ObjectRoot) -> list[tuple]:
    """What a plain DuckDB glob over the bucket reads (fsspec registered: no runwatch code)."""
    with duckdb.connect() as con:
        con.register_filesystem(root.fs)
        return con.sql(f"SELECT segment, rank, step, loss FROM read_parquet('{root.url}/**/*.parquet', "
                       "hive_partitioning=1, union_by_name=1) ORDER BY ALL").fetchall()


def test_import_runs_check_match_a_local_root(tmp_path: Path, s3_root: str) -> None:
    lines = [{"step": s, "time": 1.7e9 + s, "loss": 2.0 + (25.0 if s == 300 else 0.0) + 1.0 / (1 + s),
              "grad_norm": 1.0 + (40.0 if s == 300 else 0.0), "lr": 1e-3} for s in range(600)]
    lines.insert(200, {"event": "checkpoint", "step": 199, "path": "ck/199.pt"})
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    local = tmp_path / "local"
    for root in (str(local), s3_root):
        out = run_cli("import", "jsonl", str(log), "--root", root, "--run", "r")
        assert out.returncode == 0, out.stderr
    assert _rows(s3_root, "r") == _rows(local, "r") and len(_rows(s3_root, "r")) == 600
    listed = run_cli("runs", "--root", s3_root, "--json")
    assert listed.returncode == 0 and [r["run"] for r in json.loads(listed.stdout)] == ["r"]
    remote, here = (run_cli("check", "--root", root, "--run", "r", "--json") for root in (s3_root, str(local)))
    assert remote.returncode == here.returncode and json.loads(remote.stdout) == json.loads(here.stdout)
    assert json.loads(remote.stdout)["findings"], "the spike at step 300 is found on S3 as on disk"
    remote, here = (run_cli("advise", "--root", root, "--run", "r", "--json") for root in (s3_root, str(local)))
    assert remote.returncode == here.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(here.stdout)
    again = run_cli("import", "jsonl", str(log), "--root", s3_root, "--run", "r")
    assert again.returncode == 2 and "already exists" in again.stderr
    assert _plain_duckdb(ObjectRoot(s3_root)) == [(0, 0, s, lines[s + (s >= 200)]["loss"]) for s in range(600)]


def test_replace_and_the_run_lock(tmp_path: Path, s3_root: str) -> None:
    root = ObjectRoot(s3_root, create=True)
    assert supports_create(root), "moto refuses a second If-None-Match create, as AWS S3 does"
    assert run_cli("import", "jsonl", str(write_log(tmp_path / "a.jsonl", range(100), 1.0)),
                   "--root", s3_root, "--run", "r").returncode == 0
    with ObjectRunLock(root, "r", "compact"):
        busy = run_cli("import", "jsonl", str(write_log(tmp_path / "b.jsonl", range(50), 2.0)),
                       "--root", s3_root, "--run", "r", "--replace")
        assert busy.returncode == 2 and "is busy: compact (pid" in busy.stderr
        assert len(busy.stderr.strip().splitlines()) == 1
    out = run_cli("import", "jsonl", str(tmp_path / "b.jsonl"), "--root", s3_root, "--run", "r", "--replace")
    assert out.returncode == 0, out.stderr
    assert _rows(s3_root, "r") == [(0, 0, s, 2.0) for s in range(50)]
    assert not [k for k in root.listing() if "/_runwatch/" in k or k.endswith(".lock")]


def test_an_expired_lease_is_broken_and_a_live_one_is_not(s3_root: str) -> None:
    root = ObjectRoot(s3_root, create=True)
    dead = ObjectRunLock(root, "r", "import", lease=0.5)
    dead.acquire()
    dead._stop.set()  # the holder "dies": no more refreshes, no release
    with pytest.raises(RunBusy, match="is busy: import"):
        ObjectRunLock(root, "r", "compact").acquire()
    time.sleep(0.7)
    with ObjectRunLock(root, "r", "compact") as taker:
        assert json.loads(root.fs.cat_file(root.key(taker.rel)))["token"] == taker.token


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _monitor_like_parts(root: ObjectRoot, run: str, num_parts: int, rows_each: int) -> None:
    """Parts as a Monitor's uploader leaves them: many small files per partition, plus events."""
    for rank in (0, 1):
        for i in range(num_parts):
            steps = range(i * rows_each, (i + 1) * rows_each)
            table = metrics_table([{"step": s, "loss": 1.0 + s + rank / 10, "grad_norm": 0.5} for s in steps])
            root.put(f"run={run}/segment=0/rank={rank}/metrics-{i:020d}-0000000{rank}.parquet", _parquet(table))
        root.put(f"run={run}/segment=0/rank={rank}/events-{0:020d}-00000000.jsonl",
                 b'{"event": "checkpoint", "step": 9, "time": null, "payload": {"path": "c9"}}\n')
        root.put(f"run={run}/segment=0/rank={rank}/events-{1:020d}-00000000.jsonl",
                 b'{"event": "note", "step": 19, "time": null, "payload": {"text": "hi"}}\n')


def test_compact_merges_parts_and_changes_no_result(s3_root: str) -> None:
    root = ObjectRoot(s3_root, create=True)
    _monitor_like_parts(root, "m", num_parts=6, rows_each=10)
    before_rows, before_plain = _rows(s3_root, "m"), _plain_duckdb(root)
    with Store(s3_root) as store:
        before_check = store.events("m").to_pylist()
    out = run_cli("compact", "--root", s3_root)
    assert out.returncode == 0 and "compacted 16 files into 4" in out.stdout, out.stdout + out.stderr
    assert _rows(s3_root, "m") == before_rows and _plain_duckdb(root) == before_plain
    with Store(s3_root) as store:
        assert store.events("m").to_pylist() == before_check
    assert len(root.files("m", "metrics")) == 2 and len(root.files("m", "events")) == 2
    out = run_cli("manifests", "--root", s3_root)
    assert out.returncode == 0 and "wrote 2 manifests" in out.stdout, out.stderr
    for rank in (0, 1):
        listed = root.fs.cat_file(root.key(f"_symlink/run=m/segment=0/rank={rank}/manifest")).decode().split()
        assert listed == [f.path for f in root.files("m", "metrics") if f"/rank={rank}/" in f.path]


@pytest.mark.parametrize("point", ["objop.pending", "objop.uploaded", "objop.committed"])
def test_a_kill_during_replace_leaves_the_old_run_or_the_new(tmp_path: Path, s3_root: str, point: str) -> None:
    old = [(0, 0, s, 1.0) for s in range(100)]
    new = [(0, 0, s, 2.0) for s in range(60)]
    assert run_cli("import", "jsonl", str(write_log(tmp_path / "a.jsonl", range(100), 1.0)),
                   "--root", s3_root, "--run", "r").returncode == 0
    out = run_cli("import", "jsonl", str(write_log(tmp_path / "b.jsonl", range(60), 2.0)), "--root", s3_root,
                  "--run", "r", "--replace", env={CRASH_ENV: point})
    assert out.returncode == KILLED
    assert _rows(s3_root, "r") == (new if point == "objop.committed" else old)
    listed = run_cli("runs", "--root", s3_root, "--json")
    assert [r["num_rows"] for r in json.loads(listed.stdout)] == [60 if point == "objop.committed" else 100]
    root = ObjectRoot(s3_root)
    # The killed writer's lease still holds the run: the next writer waits it out (here: the lease broken by hand).
    root.delete([".run=r.lock"])
    assert run_cli("compact", "--root", s3_root, "--run", "r").returncode == 0  # recovers first
    assert _rows(s3_root, "r") == (new if point == "objop.committed" else old)
    keys = root.listing()
    assert not [k for k in keys if "/_runwatch/" in k], keys
    assert _plain_duckdb(root) == (new if point == "objop.committed" else old)  # nothing stray left for globs


def test_a_reader_resolves_an_op_in_flight(s3_root: str) -> None:
    """A pending op's parts are not there yet; a committed op's old parts are gone already."""
    root = ObjectRoot(s3_root, create=True)
    _monitor_like_parts(root, "m", num_parts=2, rows_each=5)
    old = _rows(s3_root, "m")
    merged = metrics_table([{"step": s, "loss": 1.0 + s, "grad_norm": 0.5} for s in range(10)])
    new_key = "run=m/segment=0/rank=0/metrics-99999999999999999999-ffffffff.parquet"
    old_keys = [k for k in root.listing("m") if k.startswith("run=m/segment=0/rank=0/metrics-")]
    record = {"add": [new_key], "remove": old_keys}
    root.put("run=m/_runwatch/op-1.json", json.dumps({**record, "state": "pending"}).encode())
    root.put(new_key, _parquet(merged))
    assert _rows(s3_root, "m") == old  # pending: the merged part is hidden
    root.put("run=m/_runwatch/op-1.json", json.dumps({**record, "state": "committed"}).encode())
    assert _rows(s3_root, "m") == old  # committed: the old parts hidden, the merged one (same rows) shown
    with Store(s3_root) as store:
        assert len(store.location.files("m", "metrics")) == 1 + 2  # rank 0 merged, rank 1's two parts


def test_the_listing_change_source_reports_only_what_changed(s3_root: str) -> None:
    from runwatch.data.changes import ListingChanges

    root = ObjectRoot(s3_root, create=True)
    _monitor_like_parts(root, "a", num_parts=1, rows_each=5)
    _monitor_like_parts(root, "b", num_parts=1, rows_each=5)
    changes = ListingChanges(s3_root, interval=0.01)
    first = changes.poll()
    assert sorted(first) == ["a", "b"] and first["a"][1] == 6  # per rank (two): a metrics part and two events parts
    assert changes.poll() == {}
    root.put("run=b/segment=0/rank=0/metrics-99999999999999999999-00000001.parquet",
             _parquet(metrics_table([{"step": 100, "loss": 1.0}])))
    assert list(changes.poll()) == ["b"]
    root.put("run=a/findings.jsonl", b"{}\n")  # not data: no change
    assert changes.poll() == {}
    root.delete(k for k in root.listing("a"))
    assert changes.poll() == {"a": None}
    assert changes.wait()


@pytest.mark.parametrize("point", ["objop.pending", "objop.uploaded", "objop.committed"])
def test_a_kill_during_compact_changes_no_row(s3_root: str, point: str) -> None:
    """``compact`` killed at each step of its switch: runwatch reads every row once, the next writer finishes it."""
    root = ObjectRoot(s3_root, create=True)
    _monitor_like_parts(root, "m", num_parts=4, rows_each=10)
    before, before_plain = _rows(s3_root, "m"), _plain_duckdb(root)
    out = run_cli("compact", "--root", s3_root, "--run", "m", env={CRASH_ENV: point})
    assert out.returncode == KILLED
    assert _rows(s3_root, "m") == before  # the old parts or the merged one, never both, never neither
    root.delete([".run=m.lock"])  # the killed writer's lease (it would expire by itself)
    out = run_cli("compact", "--root", s3_root)
    assert out.returncode == 0, out.stderr
    assert _rows(s3_root, "m") == before and _plain_duckdb(root) == before_plain
    assert len(root.files("m", "metrics")) == 2 and not [k for k in root.listing() if "/_runwatch/" in k]


def test_no_credential_is_printed_or_stored(tmp_path: Path, s3_root: str) -> None:
    """Keys come from the AWS chain (here the environment); none reaches an object, a record or the output."""
    secrets = [os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]]
    log = write_log(tmp_path / "a.jsonl", range(300), 1.0, grad_norm=0.5)
    outputs = [run_cli("import", "jsonl", str(log), "--root", s3_root, "--run", "r"),
               run_cli("import", "jsonl", str(log), "--root", s3_root, "--run", "r", "--replace"),
               run_cli("runs", "--root", s3_root), run_cli("check", "--root", s3_root, "--run", "r", "--json"),
               run_cli("check", "--all", "--root", s3_root), run_cli("compact", "--root", s3_root),
               run_cli("manifests", "--root", s3_root),
               run_cli("runs", "--root", s3_root.replace("/fleet", "/nothing-here"))]
    assert [o.returncode for o in outputs] == [0, 0, 0, 0, 0, 0, 0, 2], [o.stderr for o in outputs]
    root = ObjectRoot(s3_root)
    stored = {k: root.fs.cat_file(root.key(k)) for k in root.listing()}
    assert any(k.endswith("findings.jsonl") for k in stored) and any("_symlink/" in k for k in stored)
    for secret in secrets:
        assert not [k for k, data in stored.items() if secret.encode() in data]
        assert not [o for o in outputs if secret in o.stdout or secret in o.stderr]
