"""``judge_run``: how a run of the store is judged, the one function the CLI and the dashboard call.

It does the I/O the pure detectors must not: reading the run's rows, events
and metadata, checking which checkpoint files still exist, and the clock (a
live run can stall; an archived import or a run that recorded its own end
cannot).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pyarrow as pa

from runwatch.data.storage import read_heartbeats
from runwatch.data.store import Store
from runwatch.detectors.advisor import checkpoints_from_events
from runwatch.detectors.analysis import Report
from runwatch.detectors.config import DetectorConfig
from runwatch.detectors.fleet_analysis import analyze_fleet


def present_checkpoint_paths(root: Path | str, checkpoints: list[dict]) -> set[str] | None:
    """Checkpoint paths found on this machine (absolute, or relative to the root or cwd).

    None when none of them is here at all: the run was trained (or imported)
    elsewhere, so absence proves nothing and the advisor must not call every
    checkpoint deleted.
    """
    paths = {c["path"] for c in checkpoints if isinstance(c.get("path"), str)}
    # A relative path is looked up under a local root; under an object-store URL only from here.
    found = {p for p in paths if os.path.exists(p) or (isinstance(root, Path) and (root / p).exists())}
    return found if found else None


def is_finished(events: pa.Table) -> bool:
    """True when the run's latest segment recorded its own normal end (a ``note`` with status "finished").

    Such a run is judged without a live-stall check: silence after the end is
    not a hang. A run that stops without saying so still turns "stalled".
    """
    rows = events.to_pylist()
    if not rows:
        return False
    last_segment = max(r["segment"] for r in rows)
    return any(r["event"] == "note" and r["segment"] == last_segment
               and json.loads(r["payload"] or "{}").get("status") == "finished" for r in rows)


def is_live(meta: dict, events: pa.Table) -> bool:
    """A run still being recorded (not an archived import, not finished) can stall."""
    source = str(meta.get("source") or "")
    status = str(meta.get("status") or "").lower()
    return (not source.startswith("import") and not meta.get("finished")
            and status not in ("finished", "completed", "ended") and not is_finished(events))


def judge_run(store: Store, run: str, *, now: float | None = None, config: DetectorConfig | None = None) -> Report:
    """Judge one run as of ``now`` (default: the clock) over every rank's shard: findings (with the rank and
    host they are about), segments, health and rollback advice."""
    if not store.has_run(run):
        known = ", ".join(store.run_names()) or "none"
        raise ValueError(f"unknown run {run!r} under {store.root} (runs there: {known})")
    rows = store.rows(run, rank=None)
    events = store.events(run)
    meta = store.meta(run)
    present = present_checkpoint_paths(store.root, checkpoints_from_events(events))
    live = is_live(meta, events)
    live_now = (time.time() if now is None else now) if live else None
    heartbeats = read_heartbeats(store.root, run) if live else None
    report = analyze_fleet(rows, events, now=live_now, present_paths=present, meta=meta, config=config,
                           heartbeats=heartbeats)
    return as_of_now(report, live)


def as_of_now(report: Report, live: bool) -> Report:
    """The analysis' report as a run's judgement says it (``ended_health``): ``judge_run``'s and the live follower's."""
    return dataclasses.replace(report, health=ended_health(report.health, live))


def ended_health(health: str, live: bool) -> str:
    """The health of a run as judged now: an ended run (an archived import, a finished run) is never "watching".

    "watching" means an episode may still come back; once the run has ended it cannot, so the finding that
    was open at the end reads "unresolved" (exit 0 like "watching": nothing to act on, and nothing will
    change). One rule for ``check``, ``check --all`` (both engines), ``watch`` and the dashboard.
    """
    return "unresolved" if health == "watching" and not live else health
