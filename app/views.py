"""Pure view helpers for the dashboard: tables, cards and commands from analysis results.

No Streamlit here: the pages call these and render what they return, so the
wording the on-call engineer reads is unit-tested directly. Markdown they
return has every outside string escaped (``escape.markdown``); tables and
code blocks are plain text and take strings as they are. Findings and
rollback advice are duck-typed against ``runwatch.detectors`` (frozen
dataclasses with the documented fields).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from runwatch.app import escape, lifecycle
from runwatch.app.oncall import OnCall, alertable
from runwatch.detectors.advisor import resume_hint

HEALTH_ORDER = {"action needed": 0, "stalled": 1, "error": 2, "analysing": 3, "watching": 4, "unresolved": 5,
                "healthy": 6}
# Streamlit markdown colour names; the colour carries the message before the words are read.
HEALTH_COLORS = {"action needed": "red", "stalled": "violet", "error": "gray", "analysing": "gray",
                 "watching": "orange", "unresolved": "orange", "healthy": "green"}
# Cell backgrounds for the tables (the same meaning as HEALTH_COLORS).
CELL_COLORS = {"red": "#f8d0cc", "violet": "#e3d5f5", "gray": "#e5e7ea", "orange": "#fde3bf", "green": "#d3f0dc",
               "blue": "#d6e6f7"}
SEVERITY_COLORS = {"critical": "red", "warning": "orange", "info": "blue"}
from runwatch.detectors.registry import PERFORMANCE_KINDS  # noqa: E402

"""Findings about speed, not about the model: drawn on the step-time panel only."""


def health_label(health: str) -> str:
    """Markdown: a coloured dot and the health word, e.g. ``:red[● action needed]``."""
    return f":{HEALTH_COLORS.get(health, 'gray')}[● {health}]"


def cell_style(value: object) -> str:
    """CSS for a table cell holding a health or severity word."""
    color = HEALTH_COLORS.get(str(value)) or SEVERITY_COLORS.get(str(value))
    return f"background-color: {CELL_COLORS[color]}" if color else ""


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} s ago"


def human_count(value: float | None) -> str:
    """12_345_678 -> '12.3M' (tokens are read at a glance, not digit by digit)."""
    if value is None:
        return "-"
    for suffix, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{suffix}"
    return f"{value:,.0f}"


def finding_status(finding: object) -> str:
    if getattr(finding, "open", False):
        return "OPEN"
    if getattr(finding, "self_recovered", None):
        return "recovered"
    return "closed"


def open_findings(report: object) -> list:
    return [f for f in getattr(report, "findings", []) if getattr(f, "open", False)]


def overview_rows(runs: Sequence[Mapping], reports: Mapping[str, object], errors: Mapping[str, str],
                  now: float, pending: Iterable[str] = ()) -> list[dict]:
    """One row per run, worst health first, then most recently updated.

    ``runs``: the dashboard's run summaries (``state.run_summaries``: the runs
    table plus ``base_state`` and ``oncall``); ``reports``:
    run -> analysis report; ``errors``: run -> why it could not be analysed
    (shown, never hidden); ``pending``: runs whose first analysis has not run yet.
    """
    pending = set(pending)
    rows = []
    for r in runs:
        name = r["run"]
        report = reports.get(name)
        health = ("analysing" if name in pending else "error" if name in errors or report is None
                  else report.health)
        state = lifecycle.run_state(r.get("base_state", "live"), health)
        health = lifecycle.display_health(health, state)
        opened = open_findings(report) if report is not None else []
        oncall = r.get("oncall") or OnCall()
        num_acked = sum(1 for f in opened if oncall.ack_for(f) is not None)
        updated = r.get("last_update")
        silence = oncall.silenced(now)
        kinds = "; ".join(sorted({f.kind for f in opened}))
        rows.append({
            "health": health,
            "state": state,
            "run": name,
            "last step": r.get("last_step"),
            "updated": None if updated is None else datetime.fromtimestamp(updated, tz=timezone.utc),
            "idle": ago(None if updated is None else now - updated),
            "tokens": r.get("tokens"),
            "open findings": len(opened),
            "what": errors.get(name) or (kinds + (f" ({num_acked} acknowledged)" if num_acked else "")) or "-",
            "alerts": "on" if silence is None else f"silenced until {utc_time(silence.until)[:-7]} UTC",
            # Whether the overview's banner calls for someone: the alert rule (oncall.alertable), so a silenced
            # run or one whose every open finding someone acknowledged stays off it; an error always calls.
            "paging": name in errors or report is None or bool(alertable(opened, oncall, now)),
            "segments": r.get("num_segments"),
            "_order": (HEALTH_ORDER.get(health, 9), -(updated or 0.0)),
        })
    rows.sort(key=lambda row: row.pop("_order"))
    return rows


def findings_rows(findings: Iterable[object]) -> list[dict]:
    """The findings table: open alarms first, then by onset."""
    rows = []
    for f in sorted(findings, key=lambda f: (not getattr(f, "open", False), f.onset_step)):
        rows.append({
            "severity": f.severity,
            "kind": f.kind,
            "status": finding_status(f),
            "onset": f.onset_step,
            "peak": f.peak_step,
            "end": f.end_step,
            "segment": f.segment,
            "needs action": bool(f.needs_action),
            "message": f.message,
        })
    return rows


def finding_bands(findings: Iterable[object], last_step: int,
                  x_of_step: Callable[[float], float] | None = None,
                  abandoned_from: Mapping[int, int] | None = None,
                  ack_of: Callable[[object], object | None] | None = None) -> list[dict]:
    """Shaded chart bands (in x units) for findings; an open one runs to the last step.

    Every finding gets a band, open or closed, whatever its kind: the chart
    shades closed ones alike (grey, lighter) and open ones by severity. Speed
    findings (a stall, a slowdown) are drawn on the step-time panel only. A
    finding on a branch that a resume abandoned is history: labelled "rolled
    back", it stops where the main line took over, so it never shades the
    healthy replay. An acknowledged finding (``ack_of``) says who is on it.
    """
    to_x = x_of_step or float
    abandoned_from = abandoned_from or {}
    bands = []
    for f in findings:
        is_open = bool(getattr(f, "open", False))
        end = f.end_step if f.end_step is not None else (last_step if is_open else f.peak_step)
        end = f.onset_step if end is None else end
        label, severity = f.kind.replace("_", " "), f.severity
        cut = abandoned_from.get(f.segment)
        if not is_open and cut is not None and end >= cut:
            end, label, severity = max(f.onset_step, cut), f"{label} (rolled back)", "history"
        ack = ack_of(f) if ack_of is not None else None
        if ack is not None:
            label += f" ✓ {getattr(ack, 'by', '')}"
        bands.append({"x0": to_x(f.onset_step), "x1": to_x(end), "severity": severity, "label": label,
                      "open": is_open, "panels": ("step_time",) if f.kind in PERFORMANCE_KINDS else None})
    return bands


def event_marks(events: pa.Table, kind: str, x_of_step: Callable[[float], float] | None = None) -> list[dict]:
    """Checkpoint or resume events as chart ticks with a hover text."""
    to_x = x_of_step or float
    marks = []
    for ev in events.to_pylist():
        if ev["event"] != kind:
            continue
        payload = json.loads(ev["payload"] or "{}")
        if kind == "checkpoint":
            text = f"checkpoint @ step {ev['step']:,}: {payload.get('path', '?')}"
        else:
            skip = payload.get("skip_batches")
            text = (f"resume (segment {ev['segment']}) @ step {ev['step']:,} from {payload.get('checkpoint', '?')}"
                    + (f", skipped batches {skip[0]}-{skip[1]}" if skip else ""))
        marks.append({"x": to_x(ev["step"]), "text": text, "step": ev["step"]})
    return marks


def utc_time(t: float | None) -> str:
    """A unix time as a reader reads it (UTC, to the second)."""
    return "-" if t is None else datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def segment_rows(segments: Iterable[Mapping]) -> list[dict]:
    """The segments table: steps, readable start and end times, how long, and where a resume cut it."""
    rows = []
    for s in segments:
        start, end = s.get("first_time"), s.get("last_time")
        cut = s.get("abandoned_from")
        rows.append({"segment": s["segment"], "first step": s["first_step"], "last step": s["last_step"],
                     "started": utc_time(start), "last logged": utc_time(end),
                     "lasted": duration(None if start is None or end is None else end - start),
                     "rows": s.get("num_rows"),
                     "abandoned from": "-" if cut is None else f"step {cut:,} (a later segment resumed before it)"})
    return rows


def rollback_lines(rollback: object) -> list[str]:
    """The rollback card as Markdown lines: where to go back to, what to skip, what to change, why.

    The checkpoint path, the actions and the reason quote text from the run's
    events, so each is escaped (``escape.markdown``); only the emphasis around
    them is Markdown.
    """
    lines = []
    if getattr(rollback, "checkpoint_step", None) is None:
        lines.append("**No healthy checkpoint before the onset was found.**")
    else:
        lines.append(f"**Roll back to checkpoint @ step {int(rollback.checkpoint_step):,}**  \n"
                     f"{escape.markdown(rollback.checkpoint_path)}")
    # Retention's warning only where a checkpoint was recorded and is gone: a run with none (an import) has no
    # "that checkpoint" (``checkpoint_missing`` is also true when none qualifies at all).
    if getattr(rollback, "evidence", {}).get("missing_checkpoint"):
        lines.append("⚠️ That checkpoint is no longer retained (deleted by retention): restore it or go further back.")
    skip = getattr(rollback, "skip_batches", None)
    if skip:
        lines.append(f"**Skip batches** {int(skip[0]):,} – {int(skip[1]):,}")
    actions = list(getattr(rollback, "actions", []) or [])
    if actions:
        lines.append("**Then:**\n" + "\n".join(f"- {escape.markdown(a)}" for a in actions))
    if getattr(rollback, "reason", ""):
        lines.append(f"_Why:_ {escape.markdown(rollback.reason)}")
    return lines


def evidence_rows(evidence: Mapping[str, object]) -> list[dict]:
    return [{"evidence": str(k), "value": json.dumps(v, default=str) if not isinstance(v, str) else v}
            for k, v in (evidence or {}).items()]


def resume_command(run: str, rollback: object, meta: Mapping[str, object] | None = None) -> str:
    """The copyable shell line of the resume recipe: the run's own command when known (else a placeholder, said
    so in a comment) with the checkpoint and skip window appended. runwatch does not launch training. The
    training script's side is ``monitor_call``, a block of its own: one copy button, one language."""
    meta = meta or {}
    known = bool(meta.get("command"))
    base = str(meta.get("command") or "python train.py")
    path, skip = getattr(rollback, "checkpoint_path", None), getattr(rollback, "skip_batches", None)
    shell = [base] + ([hint] if (hint := resume_hint(path, skip)) else [])
    head = "" if known else "# the run recorded no command: put yours in place of `python train.py`\n"
    return head + " \\\n    ".join(shell)


FRAMEWORK_RESUMES = (  # (the run's ``framework`` package, its callback, the call that resumes from ``{path}``)
    (("transformers",), "RunwatchTrainerCallback", "trainer.train(resume_from_checkpoint={path})"),
    (("lightning", "pytorch_lightning"), "RunwatchCallback", "trainer.fit(model, datamodule, ckpt_path={path})"),
)


def monitor_call(run: str, rollback: object, meta: Mapping[str, object] | None = None) -> str:
    """The resume recipe's lines in the training script: the ``Monitor`` that records the resume as a segment, or,
    for a run a framework's callback recorded (``meta['framework']``), the callback and the framework's own resume
    (the step comes from the checkpoint there)."""
    step, path = getattr(rollback, "checkpoint_step", None), getattr(rollback, "checkpoint_path", None)
    skip = getattr(rollback, "skip_batches", None)
    skip_arg = [f"skip_batches=({int(skip[0])}, {int(skip[1])})"] if skip else []
    framework = str((meta or {}).get("framework") or "")
    for packages, callback, resume in FRAMEWORK_RESUMES:
        if framework.split(" ")[0] in packages:
            lines = [f"callback = {callback}(root, run={', '.join([repr(run), *skip_arg])})"]
            if skip:
                lines.insert(0, f"# skip batches {int(skip[0])}-{int(skip[1])} in your data pipeline: the callback "
                                "records the range, the trainer does not skip it")
            if not path:
                lines.insert(0, "# no retained, healthy checkpoint qualifies (see why): resume from the earliest state")
            lines.append(resume.format(path=repr(str(path)) if path else "None"))
            return "\n".join(lines)
    monitor_args = [repr(run)]
    if step is not None:
        monitor_args.append(f"resume_step={int(step)}")
    if path:
        monitor_args.append(f"resume_checkpoint={str(path)!r}")
    return f"mon = Monitor(root, run={', '.join(monitor_args + skip_arg)}, model=model)"


# The command line's words in errors the importers raise, as the Import page names the same things.
PAGE_TERMS = (("choose another --run or pass --replace", "choose another run name or tick “replace the run if it exists”"),
              ("--skip-bad-lines", "“skip bad lines”"), ("--replace", "“replace the run if it exists”"),
              ("--run", "run name"), ("--root", "root"))


def page_terms(error: object, shown_as: Mapping[str, str] | None = None) -> str:
    """An importer's error as the Import page says it: its temporary paths shown as what the user gave
    (``shown_as``: path -> name), and the CLI's flags as the page's own labels."""
    text = str(error)
    for path, name in sorted((shown_as or {}).items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, name)
    for flag, words in PAGE_TERMS:
        text = text.replace(flag, words)
    return text


def upload_name(name: str) -> str:
    """An uploaded file's own name, safe as a file name in a temporary folder."""
    base = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in Path(str(name)).name).lstrip(".")
    return base[:100] or "upload.log"


def resolve_under_root(root: str | Path, given: str) -> Path:
    """Resolve a user-typed path against the root; refuse anything that lands outside it."""
    root_path = Path(root).resolve()
    candidate = Path(given).expanduser()
    path = (candidate if candidate.is_absolute() else root_path / candidate).resolve()
    if path != root_path and root_path not in path.parents:
        raise ValueError(f"{given}: outside the dashboard root {root_path}; only files under it can be imported")
    if not path.is_file():
        raise ValueError(f"{given}: no such file under {root_path}")
    return path
