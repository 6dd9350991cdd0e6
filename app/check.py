"""``runwatch check``: judge one run from the store and say what to do, for a human or a script.

Human-readable by default (health first, then findings, then the rollback
with a copyable resume hint); ``--json`` prints exactly one strict JSON object.
Exit status: 0 healthy or only findings that need no action, 1 when an open
finding needs action (or the run is stalled), 2 for usage and data errors.
This module does the I/O the pure detectors must not: reading the store,
checking which checkpoint files still exist, and the clock.

Acknowledgements and silences (``oncall.py``) are shown, not hidden: an
acknowledged finding still counts for the exit status (someone is on it; the
run still needs the action), and ``--json`` gives each finding an ``ack``
(``by``, ``note``, ``time``, or null) and the run a ``silence`` in force (or null).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from runwatch.app import escape
from runwatch.app.judge import judge_run
from runwatch.app.oncall import OnCall, ack_text, read_oncall, silence_text
from runwatch.data.store import Store
from runwatch.detectors.analysis import Report

EXIT_OK, EXIT_ACTION, EXIT_USAGE = 0, 1, 2
MAX_HISTORY = 10
"""History lines in the human view: the newest ten; --json has them all."""


def run_check(root: str | Path, run: str, now: float | None = None) -> Report:
    """Judge one run of the store under ``root`` (see ``judge_run``)."""
    with Store(root) as store:
        return judge_run(store, run, now=now)


ACTION_HEALTH = ("action needed", "stalled")
"""The healths that make ``check`` (and ``check --all``, for any run) exit 1."""


def check_with_oncall(root: str | Path, run: str, now: float | None = None) -> tuple[Report, OnCall]:
    """The judgement and the run's acknowledgements and silences, from one store."""
    with Store(root) as store:
        return judge_run(store, run, now=now), read_oncall(store.events(run))


def to_json(run: str, report: Report, oncall: OnCall, now: float) -> dict:
    """``--json``'s object: the report, each finding's ``ack`` and the ``silence`` in force."""
    out = report.to_dict(run)
    for f, d in zip(report.findings, out["findings"]):
        ack = oncall.ack_for(f)
        d["ack"] = None if ack is None else {"by": ack.by, "note": ack.note, "time": ack.time}
    silence = oncall.silenced(now)
    out["silence"] = None if silence is None else {"until": silence.until, "by": silence.by, "note": silence.note,
                                                   "time": silence.time}
    return out


def exit_code(report: Report) -> int:
    return EXIT_ACTION if report.health in ACTION_HEALTH else EXIT_OK


def came_back_by_itself(finding: dict) -> bool:
    """An open finding (a finding's fields, or its ``--json`` object) that is no longer going on: recent, it keeps
    the run watching a while, but it came back without needing action."""
    return bool(finding.get("open") and finding.get("self_recovered") and not finding.get("needs_action"))


def format_report(run: str, report: Report, oncall: OnCall | None = None, now: float | None = None) -> str:
    """The 3 a.m. view: one health line, what happened, what to do; every line passes ``escape.terminal``."""
    oncall = oncall or OnCall()
    lines = [f"{run}: {report.health.upper()}"]
    silence = oncall.silenced(time.time() if now is None else now)
    if silence is not None:
        lines.append(f"alerts {silence_text(silence)}")
    # Open: needs action or not back yet. A recent one that came back by itself stays open (it keeps the run
    # watching a while) but is no longer going on: "recent", so the on-call does not read "it resumed" as a stall.
    came_back = [f for f in report.findings if came_back_by_itself(vars(f))]
    open_ = [f for f in report.findings if f.open and f not in came_back]
    history = [f for f in report.findings if not f.open]
    if not report.findings:
        lines.append("no findings")
    for title, group in (("open", open_), ("recent (came back by itself)", came_back), ("history", history)):
        if group:
            lines.append(f"{title}:")
        if title == "history" and len(group) > MAX_HISTORY:
            lines.append(f"  ... {len(group) - MAX_HISTORY} older (see --json)")
            group = group[-MAX_HISTORY:]
        for f in group:
            flag = "ACTION" if f.needs_action and f.open else f.severity
            where = "" if f.rank is None else f" rank {f.rank}" + (f" ({f.host})" if f.host else "")
            lines.append(f"  [{flag}] {f.kind} seg {f.segment}{where} steps {f.onset_step}-{f.end_step}: {f.message}")
            if (ack := oncall.ack_for(f)) is not None:
                lines.append(f"      {ack_text(ack)}")
    rb = report.rollback
    if rb is not None:
        lines.append("what to do:")
        lines.extend(f"  - {a}" for a in rb.actions)
        lines.append(f"  why: {rb.reason}")
        if rb.checkpoint_missing:
            lines.append("  note: the right checkpoint is gone (or none qualifies); see why")
        hint = rb.evidence.get("resume_hint")
        if hint:
            lines.append(f"  resume: {hint}")
    elif report.health == "stalled":
        lines.append("what to do: check the job (hung collective, dead node, full disk); no rollback needed")
    lines.append("segments: " + ", ".join(
        f"{s.segment} [{s.first_step}-{s.last_step}"
        + (f", abandoned from {s.abandoned_from}]" if s.abandoned_from is not None else "]")
        for s in report.segments))
    # Messages, paths and the resume hint quote the run's events: no control character reaches the terminal.
    return "\n".join(escape.terminal(line) for line in lines)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``runwatch check``; ValueError/OSError/RuntimeError become exit 2 in the CLI."""
    if getattr(args, "all", False):
        from runwatch.app import check_all

        return check_all.main(args)
    if getattr(args, "engine", "local") != "local":
        raise ValueError("--engine applies to --all only")
    now = getattr(args, "now", None)
    report, oncall = check_with_oncall(args.root, args.run, now=now)
    clock = time.time() if now is None else now
    if args.json:
        sys.stdout.write(json.dumps(to_json(args.run, report, oncall, clock), allow_nan=False) + "\n")
    else:
        print(format_report(args.run, report, oncall, clock))
    return exit_code(report)
