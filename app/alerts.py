"""The alert book of ``runwatch watch``: which findings were announced, which resolved, what waits for delivery.

``AlertBook.update(run, report, now)`` compares a run's findings that need
attention (open, not recovered, warning or critical) with the alerts already
open for that run. A new one is announced, unless someone acknowledged it or
the run is silenced (``oncall.alertable``: nothing is sent while a silence
lasts), or unless an alert of the same run,
kind and rank went out less than ``cooldown_s`` ago (a flapping finding pages
once); one that matches an open alert (same kind, segment and rank, an
overlapping step range) is the same incident and is not announced again; an
open alert that no finding matches any more is resolved, with a message if
it was announced (none if a finding of another kind took its place, a spike
that became a divergence: that one is announced itself).

Messages wait in the outbox, one entry per message and target, until
delivered; the book is a JSON file (``save``/``load``), so a cron job's
passes remember what they sent and an undelivered message is retried on the
next pass. Targets are kept as a hash of their URL, never the URL (it holds
the webhook's secret).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runwatch.app.fleet_views import opt_checklist
from runwatch.app.oncall import OnCall, alertable
from runwatch.data.storage import write_bytes_atomic
from runwatch.detectors.analysis import Report
from runwatch.detectors.finding import Finding
from runwatch.detectors.registry import SERIES_OF

STATE_VERSION = 1
MAX_EVIDENCE_CHARS = 600
"""Evidence in a message holds whole fields within this many characters (the rest is in ``runwatch check --json``
and a click away)."""


def needs_attention(f: Finding) -> bool:
    """A finding worth a message: open, not recovered by itself, and a warning or critical (info never pages)."""
    return f.open and f.self_recovered is not True and f.severity in ("warning", "critical")


def url_key(url: str) -> str:
    """How the book names a target without storing its secret."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass(kw_only=True, frozen=True)
class AlertConfig:
    """How ``runwatch watch`` announces findings."""

    cooldown_s: float = 1800.0
    """After an alert for a run, kind and rank, another one for the same is held back this long: a finding
    that resolves and comes back (a flapping stall) pages once per half hour, not on every flap."""
    dashboard_url: str | None = None
    """Base URL of the dashboard (``runwatch dashboard``); each message links the run's page under it."""

    def __post_init__(self) -> None:
        if not self.cooldown_s >= 0:
            raise ValueError(f"cooldown must be >= 0 seconds, got {self.cooldown_s}")
        if self.dashboard_url is not None and urllib.parse.urlsplit(self.dashboard_url).scheme not in ("http", "https"):
            raise ValueError(f"--dashboard-url must be an http(s) URL, got {self.dashboard_url!r}")


@dataclass
class AlertBook:
    """The state of ``runwatch watch``: alerts, outbox, counters (see the module docstring)."""

    config: AlertConfig = field(default_factory=AlertConfig)
    targets: list[str] = field(default_factory=list)
    alerts: dict[str, dict] = field(default_factory=dict)
    last_alert: dict[str, float] = field(default_factory=dict)  # "run|kind|rank" -> when one was last announced
    outbox: list[dict] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=lambda: {
        "alerts": 0, "resolves": 0, "held_by_cooldown": 0, "delivered": 0, "failed_attempts": 0,
        "delivered_after_retry": 0})
    health: dict[str, str] = field(default_factory=dict)  # run -> health at its last judgement
    last_pass: float | None = None
    """When the watch last judged every run that changed (unix seconds): a run written since, finished or not, is
    judged at the next pass (its last rows may hold what ended it); None before the first pass."""

    # -- judging ----------------------------------------------------------------------

    def update(self, run: str, report: Report, now: float | None = None, oncall: OnCall | None = None, *,
               checkpoints: list[dict] | None = None, meta: dict | None = None) -> int:
        """Compare a run's report with its open alerts; returns how many messages were queued.

        ``checkpoints`` (``advisor.checkpoints_from_events``) and ``meta`` (the run's ``run.json``) complete the
        procedure a stall's message gives: the resume command with the newest checkpoint and the run's own command.

        ``oncall`` (the run's acks and silences, ``oncall.read_oncall``) is respected: a finding someone
        acknowledged opens no alert, and while the run is silenced nothing is sent (an alert already open goes
        on quietly; one that resolves meanwhile resolves unannounced; a finding still open when the silence
        ends pages then)."""
        now = time.time() if now is None else now
        oncall = oncall or OnCall()
        self.health[run] = report.health
        before = len(self.outbox)
        current = [f for f in report.findings if needs_attention(f)]
        may_page = {id(f) for f in alertable(current, oncall, now)}
        silenced = oncall.silenced(now) is not None
        open_ = {aid: a for aid, a in self.alerts.items() if a["run"] == run and a["status"] == "open"}
        matched: set[str] = set()
        for f in current:
            aid = next((aid for aid, a in open_.items() if aid not in matched and _same_incident(a, f)), None)
            if aid is not None:
                matched.add(aid)
                self.alerts[aid].update(end_step=f.end_step, severity=f.severity, last_seen=now)
                continue
            if id(f) in may_page:
                matched.add(self._open(run, f, report, now, checkpoints, meta))
        for aid, a in open_.items():
            if aid not in matched:
                self._resolve(aid, a, report, current, now, quiet=silenced)
        return len(self.outbox) - before

    def _open(self, run: str, f: Finding, report: Report, now: float, checkpoints: list[dict] | None = None,
              meta: dict | None = None) -> str:
        aid = f"{run}|{f.kind}|seg{f.segment}|rank{'-' if f.rank is None else f.rank}|{f.onset_step}|{int(now)}"
        key = f"{run}|{f.kind}|{f.rank}"
        held = now - self.last_alert.get(key, float("-inf")) < self.config.cooldown_s
        self.alerts[aid] = {"run": run, "kind": f.kind, "segment": f.segment, "rank": f.rank, "host": f.host,
                            "onset_step": f.onset_step, "end_step": f.end_step, "severity": f.severity,
                            "opened": now, "last_seen": now, "status": "open", "announced": not held}
        if held:
            self.counters["held_by_cooldown"] += 1
            return aid
        self.last_alert[key] = now
        self.counters["alerts"] += 1
        title, body = alert_text(run, f, report, self.config.dashboard_url, aid, checkpoints, meta)
        self._queue(aid, "alert", title, body, "failure" if f.severity == "critical" else "warning", now)
        return aid

    def _resolve(self, aid: str, a: dict, report: Report, current: list[Finding], now: float, *,
                 quiet: bool = False) -> None:
        # Another reading of the same observations over the same steps took its place (a spike that became a
        # divergence, a whole-run hang now pinned on one rank): that one is announced on its own, this one is not
        # "resolved". A finding of another signal over those steps is another incident (a review: a slowdown from
        # 391 kept a spike at 400-404 that came back from ever being resolved).
        taken_over = [f for f in current if f.segment == a["segment"] and SERIES_OF.get(f.kind) == SERIES_OF.get(a["kind"])
                      and (f.rank == a["rank"] or f.rank is None or a["rank"] is None)
                      and f.onset_step <= a["end_step"] and a["onset_step"] <= f.end_step]
        a.update(status="superseded" if taken_over else "resolved", resolved=now)
        if taken_over or not a["announced"] or quiet:
            return
        self.counters["resolves"] += 1
        title, body = resolve_text(a, report, self.config.dashboard_url, aid)
        self._queue(aid, "resolve", title, body, "success", now)

    def _queue(self, aid: str, what: str, title: str, body: str, kind: str, now: float) -> None:
        for target in self.targets:
            self.outbox.append({"id": f"{aid}|{what}|{target}", "alert": aid, "what": what, "target": target,
                                "title": title, "body": body, "type": kind, "created": now, "attempts": 0,
                                "next_try": now})

    def open_runs(self) -> set[str]:
        """Runs with an alert still open (a cron pass judges them even when they stopped being live)."""
        return {a["run"] for a in self.alerts.values() if a["status"] == "open"}

    # -- persistence ------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"version": STATE_VERSION, "alerts": self.alerts, "last_alert": self.last_alert,
                "outbox": self.outbox, "counters": self.counters, "health": self.health, "last_pass": self.last_pass}

    def save(self, path: Path) -> None:
        """The whole state, renamed into place (a crash never leaves half a file); readable by its owner only."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(json.dumps(self.to_json(), indent=1, allow_nan=False).encode(), path)
        os.chmod(path, 0o600)

    @classmethod
    def load(cls, path: Path, config: AlertConfig, targets: Iterable[str]) -> "AlertBook":
        """The saved state (a fresh one when there is none); its outbox keeps only targets still configured."""
        book = cls(config=config, targets=[url_key(u) for u in targets])
        if not path.exists():
            return book
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: unreadable watch state ({err}); move it away to start afresh") from err
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: not a runwatch watch state (version {STATE_VERSION})")
        book.alerts, book.last_alert = data.get("alerts", {}), data.get("last_alert", {})
        book.counters.update(data.get("counters", {}))
        book.health, book.last_pass = data.get("health", {}), data.get("last_pass")
        book.outbox = [e for e in data.get("outbox", []) if e.get("target") in book.targets]
        return book


def _same_incident(a: dict, f: Finding) -> bool:
    return (a["kind"] == f.kind and a["segment"] == f.segment and a["rank"] == f.rank
            and f.onset_step <= a["end_step"] and a["onset_step"] <= f.end_step)


def run_link(dashboard_url: str | None, run: str) -> str | None:
    if not dashboard_url:
        return None
    return f"{dashboard_url.rstrip('/')}/run?run={urllib.parse.quote(run, safe='')}"


def _where(f: Finding | dict) -> str:
    rank, host = (f.rank, f.host) if isinstance(f, Finding) else (f["rank"], f["host"])
    return "" if rank is None else f" on rank {rank}" + (f" ({host})" if host else "")


def alert_text(run: str, f: Finding, report: Report, dashboard_url: str | None, aid: str,
               checkpoints: list[dict] | None = None, meta: dict | None = None) -> tuple[str, str]:
    """(title, message) of an alert: the title names the run and kind, the message holds the rest."""
    title = f"[runwatch] {'ACTION' if f.needs_action else f.severity.upper()} {run}: {f.kind}{_where(f)}"
    lines = [f"run: {run} (health: {report.health})",
             f"finding: {f.kind}, {f.severity}, segment {f.segment}{_where(f)}",
             f"onset: step {f.onset_step} (detected at step {f.evidence.get('detected_step', f.end_step)})",
             f"what: {f.message}",
             f"evidence: {_evidence(f.evidence)}"]
    rb = report.rollback
    if rb is not None and f.kind not in ("stall", "straggler", "slowdown"):
        lines.append("what to do: " + "; ".join(rb.actions))
        if rb.evidence.get("resume_hint"):
            lines.append(f"resume: {rb.evidence['resume_hint']}")
    steps = opt_checklist(report, [f], meta, checkpoints)
    if steps:
        lines.append("procedure: " + " | ".join(f"{i + 1}. {s}" for i, s in enumerate(steps)))
    link = run_link(dashboard_url, run)
    if link:
        lines.append(f"dashboard: {link}")
    lines.append(f"alert id: {aid}")
    return title, "\n".join(lines)


def resolve_text(a: dict, report: Report, dashboard_url: str | None, aid: str) -> tuple[str, str]:
    title = f"[runwatch] RESOLVED {a['run']}: {a['kind']}{_where(a)}"
    lines = [f"run: {a['run']} (health: {report.health})",
             f"resolved: the {a['kind']} from step {a['onset_step']} no longer needs attention "
             "(recovered, rolled back, or the run finished)"]
    link = run_link(dashboard_url, a["run"])
    if link:
        lines.append(f"dashboard: {link}")
    lines.append(f"alert id: {aid}")
    return title, "\n".join(lines)


def _evidence(evidence: dict) -> str:
    """``key=value`` for each field that says something (not null, false or empty), numbers to 4 significant
    digits, cut at a field's end: a 3 a.m. reader got JSON cut in the middle of a value."""
    fields = []
    for key in sorted(evidence):
        value = evidence[key]
        if value is None or value is False or value in ("", [], {}):
            continue
        if isinstance(value, float):
            text = f"{value:.4g}"
        elif isinstance(value, (str, int)):
            text = str(value)
        else:
            text = json.dumps(value, default=str, sort_keys=True)
        fields.append(f"{key}={text}")
    out, used = [], 0
    for item in fields:  # a field too long for what is left (a list of rejected checkpoints) is left out whole
        if used + len(item) <= MAX_EVIDENCE_CHARS:
            out.append(item)
            used += len(item) + 2
    if len(out) < len(fields):
        out.append(f"(+{len(fields) - len(out)} more: runwatch check --json)")
    return ", ".join(out)
