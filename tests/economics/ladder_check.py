"""Replay retention against the run's own findings: at each finding's detection step, with only the checkpoints a
ladder would still hold, does the rollback advisor find a clean checkpoint before the onset?

The record is cut back to what existed when the finding was detected (its segment up to the detected step,
the segments before it as they stood), so a finding on a branch a later resume abandoned is judged in its own
time. The advisor (``detectors.advisor.advise``) is the judge of "clean": before the last healthy logged step,
before any precursor, healthy by the OPT criteria.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pyarrow.compute as pc

from runwatch.app.judge import judge_run
from runwatch.data.record import resume_steps_of
from runwatch.data.store import Store
from runwatch.detectors.advisor import advise, checkpoints_from_events
from runwatch.detectors.finding import Finding, Rollback
from runwatch.detectors.segments import main_line, segment_infos
from runwatch.economics.retention import depths

Keep = Callable[[list[int], int], set[int]]
"""(checkpoint steps of the line, oldest first; the newest step saved) -> the steps still held."""


def dense_only(keep_last: int) -> Keep:
    return lambda steps, newest: set([s for s in steps if s <= newest][-keep_last:])


def replay(store: Store, run: str, keep: Keep) -> list[tuple[Finding, Rollback]]:
    """The advisor's answer for every finding with a rollback depth, given only what ``keep`` held then."""
    report = judge_run(store, run)
    rows = store.rows(run).drop_columns(["main"])
    events = store.events(run)
    resumes = resume_steps_of(events.to_pylist())
    segments = {k: {"step": rows.filter(pc.equal(rows["segment"], k))["step"].to_numpy()}
                for k in set(rows["segment"].to_pylist())}
    out = []
    for depth in depths(report.findings, segments, report.rollback):
        target = next(f for f in report.findings if (f.kind, f.segment, f.onset_step) ==
                      (depth.kind, depth.segment, depth.onset_step))
        then = rows.filter(pc.or_(pc.less(rows["segment"], depth.segment),
                                  pc.and_(pc.equal(rows["segment"], depth.segment),
                                          pc.less_equal(rows["step"], depth.detected_step))))
        infos = segment_infos(then, {k: s for k, s in resumes.items() if k <= depth.segment})
        cut = {s.segment: s.abandoned_from for s in infos}
        ckpts = [c for c in checkpoints_from_events(events)
                 if c["segment"] is not None and (c["segment"] < depth.segment or (
                     c["segment"] == depth.segment and c["step"] <= depth.detected_step))
                 and (cut.get(c["segment"]) is None or c["step"] < cut[c["segment"]])]
        line = sorted(c["step"] for c in ckpts)
        held = keep(line, line[-1]) if line else set()
        present = {c["path"] for c in ckpts if c["step"] in held}
        known = [dataclasses.replace(f, open=f is target, needs_action=True if f is target else f.needs_action)
                 for f in report.findings if f.segment <= depth.segment and f.onset_step <= depth.detected_step]
        rollback = advise(known, ckpts, main_line(then, infos), present, infos)
        out.append((target, rollback))
    return out


def all_clean(answers: list[tuple[Finding, Rollback]]) -> bool:
    return bool(answers) and all(rb is not None and rb.checkpoint_step is not None and not rb.checkpoint_missing
                                 for _, rb in answers)
