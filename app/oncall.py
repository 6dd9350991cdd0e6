"""The on-call workflow in the record: acknowledging a finding and silencing a run, read and written.

Both are events of the run (``ack`` and ``silence``, shapes in
``data.record.check_oncall_event``), so ``runwatch check``, ``watch`` and every
dashboard on the root see the same thing. An ack names its finding by kind,
segment and onset step, which identify it across judgements; the latest ack
of a finding wins. A silence mutes the run's alerts until its ``until`` time;
the latest silence wins (a silence ``until`` now ends one early).

``alertable`` is the one rule an alerting loop applies: nothing while the run
is silenced, and no finding someone has acknowledged.

Writing: a new events file in the latest segment's rank-0 partition, written
whole and renamed into place (``storage.write_bytes_atomic``; on an object-store
root one PUT under its final key), under the run's lock (``ObjectRunLock``
there) so that it never lands in a tree an import is switching away.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from runwatch.data.locks import RunLock
from runwatch.data.roots import is_url, open_root, segment_rank
from runwatch.data.storage import events_jsonl, part_name, partition_dir, write_bytes_atomic


@dataclass(frozen=True)
class Ack:
    """Someone acknowledged a finding: they are on it."""

    kind: str
    segment: int
    onset_step: int
    by: str
    note: str
    time: float | None
    """When (unix seconds), as the event recorded it."""


@dataclass(frozen=True)
class Silence:
    """The run's alerts are muted until ``until``."""

    until: float
    by: str
    note: str
    time: float | None
    step: int
    """The run's last step when it was silenced (where the chart marks it)."""


@dataclass(frozen=True)
class OnCall:
    """A run's acknowledgements (latest per finding) and silences (in the order recorded)."""

    acks: dict[tuple[str, int, int], Ack] = field(default_factory=dict)
    silences: tuple[Silence, ...] = ()

    def ack_for(self, finding: object) -> Ack | None:
        return self.acks.get(finding_key(finding))

    def silenced(self, now: float) -> Silence | None:
        """The silence in force at ``now``, if any (the latest one recorded decides)."""
        latest = self.silences[-1] if self.silences else None
        return latest if latest is not None and latest.until > now else None


def finding_key(finding: object) -> tuple[str, int, int]:
    """What identifies a finding across judgements: its kind, segment and onset step."""
    return (str(finding.kind), int(finding.segment), int(finding.onset_step))


def _when(ev: dict) -> float:
    return ev["time"] if isinstance(ev.get("time"), (int, float)) else float("-inf")


def read_oncall(events: pa.Table | Iterable[dict]) -> OnCall:
    """The acks and silences among a run's events (``Store.events``, or its rows as a streaming analyser keeps
    them), in the order they were made."""
    rows = [r for r in (events.to_pylist() if isinstance(events, pa.Table) else events)
            if r["event"] in ("ack", "silence")]
    rows.sort(key=_when)  # events come by step; who acted last is decided by time
    acks: dict[tuple[str, int, int], Ack] = {}
    silences = []
    for r in rows:
        payload = json.loads(r["payload"] or "{}")
        by, note = str(payload.get("by", "")), str(payload.get("note", ""))
        if r["event"] == "ack":
            f = payload.get("finding") or {}
            key = (str(f.get("kind")), int(f.get("segment", 0)), int(f.get("onset_step", r["step"])))
            acks[key] = Ack(*key, by=by, note=note, time=r["time"])
        else:
            silences.append(Silence(until=float(payload.get("until", 0.0)), by=by, note=note, time=r["time"],
                                    step=int(r["step"])))
    return OnCall(acks=acks, silences=tuple(silences))


def alertable(findings: Iterable[object], oncall: OnCall, now: float) -> list:
    """The open findings an alert may page about: none while the run is silenced, none acknowledged."""
    if oncall.silenced(now) is not None:
        return []
    return [f for f in findings if getattr(f, "open", False) and oncall.ack_for(f) is None]


def _write(root: str | Path, run: str, segment: int, event: dict) -> str:
    """The event as a new events part of the segment's rank 0, under the run's lock; where it landed."""
    data, name, action = events_jsonl([event]), part_name("events", "jsonl"), f"runwatch {event['event']}"
    if is_url(root):  # one PUT under its final key is atomic, as a Monitor's uploads are (objstore.py)
        from runwatch.data.objwrite import ObjectRunLock

        bucket = open_root(root)
        key = (partition_dir("", run, segment, 0) / name).as_posix()  # the layout on disk, key for key
        with ObjectRunLock(bucket, run, action):
            if not any(segment_rank(f.path)[0] == segment for f in bucket.files(run, "metrics")):
                raise ValueError(f"run {run!r} has no segment {segment} under {root}")
            bucket.put(key, data)
            return bucket.full(key)
    with RunLock(root, run, action):
        directory = partition_dir(root, run, segment, 0)
        if not directory.parent.is_dir():
            raise ValueError(f"run {run!r} has no segment {segment} under {root}")
        return str(write_bytes_atomic(data, directory / name))


def write_ack(root: str | Path, run: str, finding: object, *, by: str, note: str = "", segment: int,
              now: float | None = None) -> str:
    """Record that ``by`` acknowledged ``finding`` (in the run's latest ``segment``)."""
    kind, seg, onset = finding_key(finding)
    return _write(root, run, segment, {"event": "ack", "step": onset, "time": time.time() if now is None else now,
                                       "finding": {"kind": kind, "segment": seg, "onset_step": onset},
                                       "by": by, "note": note})


def write_silence(root: str | Path, run: str, *, until: float, by: str, note: str = "", step: int, segment: int,
                  now: float | None = None) -> str:
    """Record that ``by`` silenced the run's alerts until ``until`` (unix seconds)."""
    return _write(root, run, segment, {"event": "silence", "step": step, "time": time.time() if now is None else now,
                                       "until": float(until), "by": by, "note": note})


def utc(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def ack_text(ack: Ack) -> str:
    """One line: who acknowledged, when, and their note (plain text; each sink escapes it)."""
    return f"acknowledged by {ack.by} at {utc(ack.time)}" + (f": {ack.note}" if ack.note else "")


def silence_text(silence: Silence) -> str:
    return f"silenced until {utc(silence.until)} by {silence.by}" + (f": {silence.note}" if silence.note else "")


def parse_duration(text: str) -> float:
    """'90m', '4h', '2d' or seconds -> seconds (0 lifts a silence); ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        value = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError as err:
        raise ValueError(f"--for {text!r}: expected a duration such as 90m, 4h or 2d") from err
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"--for {text!r}: must be 0 (lift the silence) or a positive duration")
    return value


def _latest_segment(root: str, run: str) -> tuple[int, int]:
    """The run's latest segment and its main line's last step."""
    from runwatch.app.lifecycle import main_last_step
    from runwatch.data.store import Store

    with Store(root) as store:
        segments = store.segments(run).to_pylist()
    return max(s["segment"] for s in segments), main_last_step(segments) or 0


def _matching(findings: Sequence, kind: str, segment: int | None, onset: int | None) -> object:
    hits = [f for f in findings if f.kind == kind and (segment is None or f.segment == segment)
            and (onset is None or f.onset_step == onset)]
    if len(hits) != 1:
        listed = "; ".join(f"{f.kind} seg {f.segment} onset {f.onset_step}" for f in findings) or "none"
        raise ValueError(f"{len(hits)} findings match --kind {kind}"
                         + (f" --segment {segment}" if segment is not None else "")
                         + (f" --onset {onset}" if onset is not None else "") + f" (findings: {listed})")
    return hits[0]


def main_ack(args: argparse.Namespace) -> int:
    """``runwatch ack``: acknowledge one finding of the run's current judgement."""
    from runwatch.app.check import run_check

    report = run_check(args.root, args.run)
    finding = _matching(report.findings, args.kind, args.segment, args.onset)
    segment, _ = _latest_segment(args.root, args.run)
    write_ack(args.root, args.run, finding, by=args.by, note=args.note or "", segment=segment)
    print(f"{args.run}: {finding.kind} seg {finding.segment} onset {finding.onset_step} acknowledged by {args.by}")
    return 0


def main_silence(args: argparse.Namespace) -> int:
    """``runwatch silence``: mute the run's alerts for a while (silence again to extend or shorten it)."""
    until = time.time() + parse_duration(args.duration)
    segment, step = _latest_segment(args.root, args.run)
    write_silence(args.root, args.run, until=until, by=args.by, note=args.note or "", step=step, segment=segment)
    print(f"{args.run}: alerts silenced until {utc(until)} by {args.by}" if until > time.time()
          else f"{args.run}: silence lifted by {args.by}")
    return 0
