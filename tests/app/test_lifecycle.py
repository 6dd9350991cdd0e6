"""Run states people understand, and a "last update" that is the run's own clock."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from runwatch.app import lifecycle, state
from runwatch.data.compact import compact
from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite, data_files
from runwatch.data.store import Store
from tests.app.conftest import spike_lines, write_jsonl_run
from tests.app.test_pages import open_page


def _events(*rows: dict) -> pa.Table:
    import json

    return pa.Table.from_pylist([{"segment": 0, "rank": 0, "event": r["event"], "step": r["step"], "time": None,
                                  "payload": json.dumps(r.get("payload", {}))} for r in rows],
                                schema=pa.schema([("segment", pa.int32()), ("rank", pa.int32()), ("event", pa.string()),
                                                  ("step", pa.int64()), ("time", pa.float64()),
                                                  ("payload", pa.string())]))


@pytest.mark.parametrize("meta, events, health, expected", [
    ({"source": "import:jsonl"}, [], "stalled", "archived"),       # an archive never stalls or goes live
    ({}, [{"event": "note", "step": 9, "payload": {"status": "finished"}}], "healthy", "finished"),
    ({}, [], "stalled", "stalled"),
    ({}, [], "watching", "live"),
    ({"status": "completed"}, [], "healthy", "finished"),
])
def test_state(meta: dict, events: list, health: str, expected: str) -> None:
    assert lifecycle.run_state(lifecycle.base_state(meta, _events(*events)), health) == expected


@pytest.mark.parametrize("health, state, shown", [("watching", "archived", "unresolved"),
                                                  ("watching", "finished", "unresolved"),
                                                  ("watching", "live", "watching"), ("healthy", "archived", "healthy")])
def test_an_ended_run_is_not_watching_forever(health: str, state: str, shown: str) -> None:
    assert lifecycle.display_health(health, state) == shown


def test_last_update_is_the_runs_own_clock() -> None:
    assert lifecycle.last_update(100.0, 900.0, "archived") == 100.0  # the log's last time, not the import's
    assert lifecycle.last_update(None, 900.0, "archived") is None  # a log without a clock has none
    assert lifecycle.last_update(None, 900.0, "live") == 900.0


def test_main_last_step_skips_abandoned_segments() -> None:
    segments = [{"segment": 0, "last_step": 500, "abandoned_from": 301}, {"segment": 1, "last_step": 399,
                                                                         "abandoned_from": None}]
    assert lifecycle.main_last_step(segments) == 399


def test_an_import_and_a_compaction_leave_last_update_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    t_end = time.time() - 30 * 86400  # a month-old log, imported now
    write_jsonl_run(root, "archive", spike_lines(300, spike_at=-1, t0=t_end - 29.9))
    rows = spike_lines(300, spike_at=-1, t0=time.time() - 100)
    with StagedWrite(root) as staged:  # a Monitor run flushed in many parts
        for part in range(0, 300, 30):
            staged.add_metrics("live", 0, 0, metrics_table(rows[part:part + 30]))
    sig = state.signature(str(root), "archive")
    info, _ = state.run_summary(str(root), "archive", sig)
    assert info["last_update"] == pytest.approx(t_end, abs=1) and info["base_state"] == "archived"
    before, _ = state.run_summary(str(root), "live", state.signature(str(root), "live"))
    assert len(data_files(root, "live")) == 10
    time.sleep(0.05)
    compact(root, "live")
    assert len(data_files(root, "live")) == 1
    after, _ = state.run_summary(str(root), "live", state.signature(str(root), "live"))
    assert after["last_update"] == before["last_update"] == pytest.approx(rows[-1]["time"])


def test_overview_shows_state_per_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    t0 = time.time() - 1800
    rows = metrics_table(spike_lines(200, spike_at=-1, t0=t0))
    with StagedWrite(root) as staged:
        for run in ("died", "done"):
            staged.add_metrics(run, 0, 0, rows)
        staged.add_events("done", 0, 0, [{"event": "note", "step": 199, "time": t0 + 20, "status": "finished"}])
    write_jsonl_run(root, "archived", spike_lines(200, spike_at=-1, t0=t0))
    with StagedWrite(root) as staged:
        staged.add_metrics("running", 0, 0, metrics_table(spike_lines(200, spike_at=-1, t0=time.time() - 19.9)))
    at = open_page(monkeypatch, root, "overview")
    table = at.dataframe(key="overview_table").value
    states = dict(zip(table["run"], (s[0] for s in table["state"])))
    assert states == {"died": "stalled", "done": "finished", "archived": "archived", "running": "live"}
    with Store(root) as store:
        assert store.has_run("archived")
