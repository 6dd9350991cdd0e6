"""``runwatch check``: judge one run from the store and say what to do, for a human or a script.

Human-readable by default (health first, then findings, then the rollback
with a copyable resume hint); ``--json`` prints exactly one strict JSON object.
Exit status: 0 healthy or only findings that need no action, 1 when an open
finding needs action (or the run is stalled), 2 for usage and data errors.
This module does the I/O the pure detectors must not: reading the store,
checking which checkpoint files still exist, and the clock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runwatch.app import escape
from runwatch.app.judge import judge_run
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


def exit_code(report: Report) -> int:
    return EXIT_ACTION if report.health in ACTION_HEALTH else EXIT_OK


def format_report(run: str, report: Report) -> str:
    """The 3 a.m. view: one health line, what happened, what to do; every line passes ``escape.terminal``."""
    lines = [f"{run}: {report.health.upper()}"]
    open_ = [f for f in report.findings if f.open]
    history = [f for f in report.findings if not f.open]
    if not report.findings:
        lines.append("no findings")
    for title, group in (("open", open_), ("history", history)):
        if group:
            lines.append(f"{title}:")
        if title == "history" and len(group) > MAX_HISTORY:
            lines.append(f"  ... {len(group) - MAX_HISTORY} older (see --json)")
            group = group[-MAX_HISTORY:]
        for f in group:
            flag = "ACTION" if f.needs_action and f.open else f.severity
            where = "" if f.rank is None else f" rank {f.rank}" + (f" ({f.host})" if f.host else "")
            lines.append(f"  [{flag}] {f.kind} seg {f.segment}{where} steps {f.onset_step}-{f.end_step}: {f.message}")
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
    report = run_check(args.root, args.run, now=getattr(args, "now", None))
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(args.run), allow_nan=False) + "\n")
    else:
        print(format_report(args.run, report))
    return exit_code(report)
