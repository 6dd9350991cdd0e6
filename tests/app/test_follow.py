"""The follower (watch, dashboard): file events in, streaming reports out, equal to ``judge_run`` on the same files."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from runwatch.app.follow import RunFollower
from runwatch.app.judge import judge_run
from runwatch.data.compact import compact
from runwatch.data.storage import StagedWrite
from runwatch.data.store import Store
from tests.app.webhook import train_run
from tests.detectors.test_fleet import fleet_rows, meta_for


def _follow_until(follower: RunFollower, done: threading.Event) -> None:
    while not done.is_set():
        follower.sync_paths(follower.drain(timeout=0.05))
    time.sleep(0.5)
    follower.sync_paths(follower.drain(timeout=0.2))


def _same(a, b) -> None:
    assert a.findings == b.findings
    assert a.segments == b.segments and a.rollback == b.rollback and a.health == b.health


def test_following_live_files_gives_judge_runs_report(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    root.mkdir()
    follower = RunFollower(root)
    follower.start()
    done = threading.Event()

    def train() -> None:
        train_run(root, "gpt", 120, nan_at=95, ckpt_dir=ckpt)  # checkpoints land between its flushes
        train_run(root, "gpt", 40, resume=(80, ckpt / "gpt-80.pt"))  # a rollback: a new segment
        done.set()

    worker = threading.Thread(target=train)
    worker.start()
    _follow_until(follower, done)
    worker.join()
    now = time.time()
    with Store(root) as store:
        offline = judge_run(store, "gpt", now=now)
    _same(follower.report("gpt", now), offline)
    assert {f.kind for f in offline.findings} >= {"nan"} and len(offline.segments) == 2
    assert len(follower.runs["gpt"].consumed) > 10 and follower.num_rebuilds == 0
    follower.stop()


def test_a_compaction_is_read_again_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    rows = fleet_rows(2, n=600, slow={1: (200, 0.02)}, nan_at={0: 500})
    with StagedWrite(root) as staged:
        for part in range(6):  # six flushes per rank
            for r in (0, 1):
                t = rows.filter(pa.compute.equal(rows["rank"], r)).slice(100 * part, 100)
                staged.add_metrics("fleet", 0, r, t.drop_columns(["rank", "segment", "main"]))
        staged.add_run_meta("fleet", {**meta_for(2), "finished": True})
    follower = RunFollower(root)
    follower.start()
    before = follower.report("fleet")
    assert {(f.kind, f.rank) for f in before.findings} >= {("straggler", 1), ("nan", 0)}
    compact(root)
    deadline = time.time() + 10
    while follower.num_rebuilds == 0 and time.time() < deadline:
        follower.sync_paths(follower.drain(timeout=0.2))
    assert follower.num_rebuilds >= 1
    _same(follower.report("fleet"), before)
    with Store(root) as store:
        _same(judge_run(store, "fleet"), before)
    follower.stop()


def test_the_dashboard_judges_through_the_follower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runwatch.app import judge, state

    def offline(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dashboard ran the offline detectors")

    root, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    root.mkdir()
    train_run(root, "gpt", 120, nan_at=95, ckpt_dir=ckpt)
    with monkeypatch.context() as m:
        m.setattr(judge, "judge_run", offline)
        report, error, live = state._judge(str(root), "gpt")
    assert error is None and live  # closed without finished=True: a live run
    follower = state.get_follower(str(root))
    assert len(follower.runs["gpt"].consumed) > 1  # the follower read the run's files
    with Store(root) as store:
        _same(report, judge_run(store, "gpt"))
    # A rollback lands; judged at once, before (or without) its file events: the run is listed again.
    train_run(root, "gpt", 40, resume=(80, ckpt / "gpt-80.pt"))
    with monkeypatch.context() as m:
        m.setattr(judge, "judge_run", offline)
        report, error, _ = state._judge(str(root), "gpt")
    assert error is None and len(report.segments) == 2
    with Store(root) as store:
        _same(report, judge_run(store, "gpt"))
    follower.stop()


def test_polling_follows_where_inotify_sees_nothing(tmp_path: Path) -> None:
    """``--poll`` (network filesystems): watchdog's polling observer finds each new part without inotify."""
    root = tmp_path / "runs"
    rows = fleet_rows(2, n=300, nan_at={1: 250})
    with StagedWrite(root) as staged:
        staged.add_run_meta("fleet", {**meta_for(2), "finished": True})
    follower = RunFollower(root, poll_seconds=0.3)
    follower.start()
    assert type(follower._observer).__name__ == "PollingObserver"
    for part in range(3):
        with StagedWrite(root) as staged:
            for r in (0, 1):
                t = rows.filter(pa.compute.equal(rows["rank"], r)).slice(100 * part, 100)
                staged.add_metrics("fleet", 0, r, t.drop_columns(["rank", "segment", "main"]))
    deadline = time.time() + 20
    while len(follower.runs["fleet"].consumed) < 6 and time.time() < deadline:
        follower.sync_paths(follower.drain(timeout=0.3))  # only what the observer reports: no listing
    assert len(follower.runs["fleet"].consumed) == 6
    with Store(root) as store:
        _same(follower.report("fleet"), judge_run(store, "fleet"))
    assert ("nan", 1) in {(f.kind, f.rank) for f in follower.report("fleet").findings}
    follower.stop()
