"""``runwatch advise``: what checkpoints and interruptions cost one run, and the cadence and retention to use.

This module does the I/O the pure ``runwatch.economics`` must not: reading the
run's rows and events, and judging the run (``judge_run``) for its findings
and rollback advice. The dashboard's panel calls ``checkpoint_advice`` too, so
both show the same figures. Human-readable by default; ``--json`` prints the
one object of the contract (null where the record cannot give a figure).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from runwatch.app.checkpoint_views import figure_text, retention_line, size_text
from runwatch.app.judge import judge_run
from runwatch.data.record import resume_steps_of
from runwatch.data.store import Store
from runwatch.detectors.advisor import checkpoints_from_events
from runwatch.detectors.analysis import Report
from runwatch.detectors.segments import split_segments
from runwatch.economics.advice import CheckpointAdvice, advise_checkpoints
from runwatch.economics.cadence import lost_hours_per_day
from runwatch.economics.measure import measure


def skip_windows(events: list[dict]) -> dict[int, tuple[int, int]]:
    """Segment -> the batches its resume skipped, from ``resume`` events."""
    out = {}
    for ev in events:
        if ev.get("event") != "resume":
            continue
        try:
            skip = json.loads(ev.get("payload") or "{}").get("skip_batches")
        except (TypeError, ValueError, AttributeError):
            continue
        if isinstance(skip, list) and len(skip) == 2 and all(isinstance(b, int) for b in skip):
            out[int(ev["segment"])] = (skip[0], skip[1])
    return out


def checkpoint_advice(store: Store, run: str, report: Report | None = None, *,
                      mtbf_hours: float | None = None) -> CheckpointAdvice:
    """The run's checkpoint advice; ``report``: its ``judge_run`` result when the caller has one."""
    report = report if report is not None else judge_run(store, run)
    ranks = store.ranks(run)
    rows = store.rows(run, rank=0 if 0 in ranks else ranks[0])
    events = store.events(run)
    listed = events.to_pylist()
    segments = split_segments(rows)
    measured = measure(segments, checkpoints_from_events(events), resume_steps_of(listed), skip_windows(listed),
                       report.findings)
    return advise_checkpoints(measured, segments, report.findings, report.rollback, mtbf_hours=mtbf_hours)


def per_day(advice: CheckpointAdvice, interval: float | None, cost_per_hour: float | None) -> str:
    """Expected hours lost per day at ``interval`` seconds (and their cost), or why it cannot be said."""
    delta, mtbf = advice.measured.checkpoint_seconds, advice.mtbf_seconds
    if interval is None or not delta or mtbf is None:
        return "unknown"
    hours = lost_hours_per_day(interval, delta, mtbf, advice.measured.restart_seconds or 0.0)
    return f"{hours:.3g} h/day" + (f" (${hours * cost_per_hour:,.2f}/day)" if cost_per_hour is not None else "")


def format_advice(run: str, advice: CheckpointAdvice, cost_per_hour: float | None = None) -> str:
    """The human view: measured figures, then cadence, then retention."""
    m, d = advice.measured, advice.to_dict()
    timed = [c for c in m.checkpoints if c.seconds is not None]
    source = "measured by the loop" if all(c.measured for c in timed) else \
        "estimated from the step gaps" if not any(c.measured for c in timed) else "measured, some estimated"
    mtbf_from = "given" if advice.mtbf_given else \
        f"wall time {figure_text(_hours(m.wall_seconds), ' h')} / {_count(m.interruptions, 'interruption')}"
    lines = [f"{run}: checkpoints and interruptions",
             f"  checkpoint cost   {figure_text(m.checkpoint_seconds, ' s')}"
             + (f" (median of {len(timed)}; {source})" if timed else ""),
             f"  checkpoint size   {size_text(m.checkpoint_bytes)}",
             f"  interruptions     {m.interruptions} ({_count(len(m.restarts), 'restart')}, {_count(len(m.stalls), 'stall')}); "
             f"MTBF {figure_text(d['mtbf_hours'], ' h')}" + (f" ({mtbf_from})" if d["mtbf_hours"] is not None else ""),
             f"  lost work         {m.lost_steps} steps, {figure_text(d['lost_hours'], ' h')}"]
    for r in m.restarts:
        lines.append(f"    restart into segment {r.segment}"
                     + (f" from checkpoint {r.resume_step}" if r.resume_step is not None else "")
                     + f": {r.lost_steps} steps, {figure_text(r.branch_seconds, ' s')} on them, "
                     f"{figure_text(r.downtime_seconds, ' s')} down")
    spacing = f" (every {m.interval_steps:g} steps at {m.step_seconds:.3g} s/step)" \
        if m.current_seconds is not None else ""
    lines += [f"  goodput           {figure_text(m.goodput)}",
              "cadence (training time between checkpoints):",
              (f"  current  {figure_text(d['cadence']['current_minutes'], ' min')}{spacing}"
               f"   lost {per_day(advice, m.current_seconds, cost_per_hour)}")]
    for name, seconds in (("Young", advice.young_seconds), ("Daly", advice.daly_seconds)):
        lines.append(f"  {name:<8} {figure_text(None if seconds is None else seconds / 60, ' min')}"
                     f"   lost {per_day(advice, seconds, cost_per_hour)}")
    if advice.mtbf_seconds is None:
        lines.append("  (no interruption measured: pass --mtbf-hours to size the cadence)")
    lines += ["retention:", f"  {retention_line(advice)}", f"  why: {advice.retention.reason}"]
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def _check_number(name: str, value: float | None, *, positive: bool) -> None:
    if value is not None and not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise ValueError(f"{name} must be a {'positive' if positive else 'non-negative'} number, got {value}")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``runwatch advise``; ValueError/OSError/RuntimeError become exit 2 in the CLI."""
    _check_number("--mtbf-hours", args.mtbf_hours, positive=True)
    _check_number("--cost-per-hour", args.cost_per_hour, positive=False)
    with Store(args.root) as store:  # a directory or an object-store URL (Path would fold s3://)
        advice = checkpoint_advice(store, args.run, mtbf_hours=args.mtbf_hours)
    if args.json:
        sys.stdout.write(json.dumps(advice.to_dict(), allow_nan=False) + "\n")
    else:
        print(format_advice(args.run, advice, args.cost_per_hour))
    return 0
