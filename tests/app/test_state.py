"""What the dashboard recomputes, and when: judgements, run summaries and change signatures over a real store."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from runwatch.app import state
from runwatch.app.state import Judged, is_stale
from runwatch.data.compact import compact
from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite, data_files
from runwatch.data.store import Store
from tests.app.conftest import spike_lines, write_jsonl_run

ENTRY = Path(__file__).resolve().parents[2] / "app" / "dashboard.py"
NOW = 1.8e9


def _judged(sig_time: float, judged_at: float, *, live: bool, cost: float = 0.01, health: str = "healthy") -> Judged:
    return Judged(sig=(sig_time, 3), judged_at=judged_at, cost=cost, live=live, report=SimpleNamespace(health=health),
                  error=None)


@pytest.mark.parametrize("entry, sig, now, stale", [
    (None, (NOW, 3), NOW, True),                                                   # never judged
    (_judged(NOW - 99, NOW - 1, live=False), (NOW - 99, 4), NOW, True),            # a new file
    (_judged(NOW - 9e6, NOW - 9e6, live=False), (NOW - 9e6, 3), NOW, False),       # archived: time changes nothing
    (_judged(NOW - 100, NOW - 14, live=True), (NOW - 100, 3), NOW, False),         # live: at least 15 s apart
    (_judged(NOW - 100, NOW - 15, live=True), (NOW - 100, 3), NOW, True),
    (_judged(NOW - 3600, NOW - 300, live=True), (NOW - 3600, 3), NOW, False),      # silent 55 min: every 5.5 min
    (_judged(NOW - 3600, NOW - 331, live=True), (NOW - 3600, 3), NOW, True),
    (_judged(NOW - 100, NOW - 30, live=True, cost=2.0), (NOW - 100, 3), NOW, False),  # a slow judgement: 20x its cost
    (_judged(NOW - 3600, NOW - 400, live=True, health="stalled"), (NOW - 3600, 3), NOW, False),  # stalled stays so
    (_judged(NOW - 3600, NOW - 400, live=True, health="stalled"), (NOW - 3600, 4), NOW, True),   # ... until it writes
])
def test_when_a_run_is_judged_again(entry: Judged | None, sig: tuple[float, int], now: float, stale: bool) -> None:
    assert is_stale(entry, sig, now) is stale


def test_the_run_page_keeps_a_stalled_runs_message_current() -> None:
    entry = _judged(NOW - 3600, NOW - 400, live=True, health="stalled")
    assert is_stale(entry, (NOW - 3600, 3), NOW, detail=True)


def test_a_silent_live_run_is_judged_a_few_times_a_day_not_every_tick() -> None:
    last_file, judged_at, count = NOW, NOW + 1, 0
    for tick in range(int(86400 / state.LIVE_SECONDS)):
        now = NOW + 1 + tick * state.LIVE_SECONDS
        if is_stale(_judged(last_file, judged_at, live=True), (last_file, 3), now):
            judged_at, count = now, count + 1
    assert 30 < count < 100  # a fixed 15 s tick would be 5,760


def _add_flush(root: Path, run: str, first_step: int) -> None:
    rows = [dict(line, step=line["step"] + first_step) for line in spike_lines(10, spike_at=-1)]
    with StagedWrite(root) as staged:
        staged.add_metrics(run, 0, 0, metrics_table(rows))


def test_signatures_follow_flushes_compaction_and_removal(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for run in ("a", "b"):
        write_jsonl_run(root, run, spike_lines(50, spike_at=-1))
    (root / "run=empty").mkdir()  # a run directory with no committed file is no run yet
    os.utime(root, (time.time() - 60,) * 2)
    for path in root.rglob("*"):
        os.utime(path, (time.time() - 60,) * 2)  # older than the racy window, so stamps are trusted
    first = state.signatures(str(root))
    assert set(first) == {"a", "b"} and first == {r: state.signature(str(root), r) for r in ("a", "b")}
    _add_flush(root, "a", 50)
    second = state.signatures(str(root))
    assert second["a"] != first["a"] and second["b"] == first["b"] and second["a"][1] == first["a"][1] + 1
    time.sleep(state.RACY_SECONDS + 0.1)
    compact(root, "a")
    third = state.signatures(str(root))
    assert third["a"] == state.signature(str(root), "a") != second["a"]
    for path in data_files(root, "b", "metrics") + data_files(root, "b", "events"):
        path.unlink()
    assert set(state.signatures(str(root))) == {"a"}


def test_run_summaries_match_the_store_whichever_way_they_are_read(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for i in range(12):  # more than the batch threshold: the first read is one scan of the root
        write_jsonl_run(root, f"r{i}", spike_lines(30 + i, spike_at=-1))
    sigs = state.signatures(str(root))
    batch, errors = state.run_summaries(str(root), sigs)
    assert not errors
    with Store(root) as store:
        expected = store.runs().to_pylist()
        one_by_one = [state._summary(store, r["run"]) for r in expected]
    keys = ("run", "first_step", "last_step", "num_segments", "num_ranks", "tokens", "num_rows")
    assert [{k: r[k] for k in keys} for r in batch] == [{k: r[k] for k in keys} for r in expected]
    assert [{k: r[k] for k in keys} for r in one_by_one] == [{k: r[k] for k in keys} for r in expected]


def test_a_corrupt_file_is_pinned_on_its_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for run in ("good", "bad"):
        write_jsonl_run(root, run, spike_lines(60, spike_at=-1))
    victim = data_files(root, "bad", "metrics")[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # truncated, as a dead disk leaves it
    monkeypatch.setenv(state.ROOT_ENV, str(root))
    at = AppTest.from_file(str(ENTRY), default_timeout=120)
    at.switch_page("screens/overview.py")
    at.run()
    assert not at.exception
    table = at.dataframe(key="overview_table").value
    health = dict(zip(table["run"], (h[0] for h in table["health"])))  # a one-item label list per run
    assert health["good"] in ("healthy", "watching") and health["bad"] == "error"
    assert str(victim.name) in dict(zip(table["run"], table["what"]))["bad"]
