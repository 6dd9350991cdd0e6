"""analyze(): every detector over every segment, then segments, open alarms, health and rollback advice.

This is the one entry point the CLI, the dashboard and the evaluation call:
``analyze(Store.rows(run, rank=0), Store.events(run), now)``. Each segment is
judged on its own rows (findings carry their segment); a finding on an
abandoned branch, or one a rollback already answered, is history (open=False).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from runwatch.data.record import resume_steps_of
from runwatch.detectors.advisor import advise, checkpoints_from_events
from runwatch.detectors.finding import Finding, Rollback, SegmentInfo, clean_json
from runwatch.detectors.segment_scan import SegmentDetectors
from runwatch.detectors.segments import main_line, segment_infos, split_segments
from runwatch.detectors.spike import SHORT_SPIKE
from runwatch.detectors.stall import live_stall

DIVERGED_GRAD_RATIO = 1.5
"""Median gradient norm over an unrecovered spike, relative to before it, that makes it a divergence."""
DIVERGED_LR_RATIO = 1.5
"""Learning rate over an unrecovered spike, relative to before it, that makes it a divergence."""
RECENT_OBSERVATIONS = 100
RECENT_FRACTION = 0.05
"""A finding that needs no action stays 'open' (health: watching) while it ended within the last
max(100 observations, 5% of the main line); after that it is history."""


@dataclass(frozen=True)
class Report:
    findings: list[Finding]
    segments: list[SegmentInfo]
    rollback: Rollback | None
    health: str
    """'healthy', 'watching', 'action needed' or 'stalled'."""

    def to_dict(self, run: str) -> dict:
        """The JSON object of ``runwatch check --json``: strict JSON, no NaN."""
        out = {"run": run, "health": self.health,
               "findings": [f.to_dict() for f in self.findings],
               "segments": [s.to_dict() for s in self.segments],
               "rollback": self.rollback.to_dict() if self.rollback else None}
        json.dumps(out, allow_nan=False)  # fail here, not in a consumer, if anything slipped through
        return clean_json(out)  # type: ignore[return-value]


def checkpoint_seconds(checkpoints: list[dict]) -> dict[int, float]:
    """Write time of each checkpoint by step: wall time a stall detector must allow for (NaN: not logged)."""
    out: dict[int, float] = {}
    for c in checkpoints:
        if isinstance(c.get("write_seconds"), (int, float)):
            out[c["step"]] = (0.0 if math.isnan(out.get(c["step"], 0.0)) else out.get(c["step"], 0.0)) \
                + float(c["write_seconds"])
        else:
            out.setdefault(c["step"], math.nan)
    return out


def _diverged(f: Finding) -> bool:
    """An unrecovered loss jump with gradient norms still up, or under a raised learning rate."""
    if f.kind != "spike" or f.evidence.get("blip"):
        return False
    if f.evidence.get("lr_still_raised") and f.evidence.get("observations_out_of_band", 0) > SHORT_SPIKE:
        return True  # the loss may have come partly back, but the raised LR that threw it is still there
    if f.self_recovered is not False:
        return False
    grad, lr = f.evidence.get("grad_norm_ratio") or 0.0, f.evidence.get("lr_ratio") or 0.0
    return grad >= DIVERGED_GRAD_RATIO or lr >= DIVERGED_LR_RATIO


def _as_divergence(f: Finding) -> Finding:
    """The fix for such a jump is the learning rate, not a data skip alone: call it a divergence."""
    grad, lr = f.evidence.get("grad_norm_ratio"), f.evidence.get("lr_ratio")
    why = [f"gradient norm x{grad:.2g}" for _ in [0] if grad and grad >= DIVERGED_GRAD_RATIO]
    why += [f"learning rate x{lr:.2g}" for _ in [0] if lr and lr >= DIVERGED_LR_RATIO]
    message = (f"loss diverged from step {f.onset_step}: jumped {f.evidence['baseline_loss']:.4g} -> "
               f"{f.evidence['peak_loss']:.4g} and stayed up ({', '.join(why)})")
    if f.evidence.get("lr_still_raised"):
        message += "; the learning rate jumped at the onset and is still up"
    return dataclasses.replace(f, kind="divergence", message=message, self_recovered=False, needs_action=True,
                               severity="critical", evidence={**f.evidence, "from_spike": True})


def _overlaps(a: Finding, b: Finding) -> bool:
    return a.segment == b.segment and a.onset_step <= b.end_step and a.end_step >= a.onset_step and b.end_step >= a.onset_step


def merge_overlaps(findings: list[Finding]) -> list[Finding]:
    """One incident, one finding.

    An unrecovered spike with gradient norms still ``DIVERGED_GRAD_RATIO`` x up,
    or under a learning rate raised ``DIVERGED_LR_RATIO`` x, is a divergence. Overlapping unrecovered loss findings in a segment merge
    into the divergence with the earliest onset; a 'divergence' that came back
    down inside a spike was that spike. A NaN after a divergence stays its own
    finding: it changes the advice (BF16, data) and marks the point of no return.
    """
    out = [_as_divergence(f) if _diverged(f) else f for f in findings]
    for d in sorted([f for f in out if f.kind == "divergence"], key=lambda f: f.onset_step):
        if d not in out:
            continue
        others = [o for o in out if o is not d and o.kind in ("spike", "divergence") and _overlaps(d, o)]
        if d.self_recovered:
            if any(o.kind == "spike" for o in others):
                out.remove(d)
            continue
        absorbed = [o for o in others if not o.self_recovered]
        for o in absorbed:
            out.remove(o)
        merged = dataclasses.replace(d, onset_step=min([d.onset_step] + [o.onset_step for o in absorbed]),
                                     end_step=max([d.end_step] + [o.end_step for o in absorbed]))
        out[out.index(d)] = merged
    return out


def mark_open(findings: list[Finding], segments: list[SegmentInfo], main_steps: np.ndarray) -> list[Finding]:
    """History vs alarm: abandoned branches and rolled-back incidents are closed; blips close when old."""
    by_seg = {s.segment: s for s in segments}
    recent = max(RECENT_OBSERVATIONS, int(RECENT_FRACTION * len(main_steps)))
    recent_from = int(main_steps[max(0, len(main_steps) - recent)]) if len(main_steps) else 0
    out = []
    for f in findings:
        seg = by_seg.get(f.segment)
        rolled_back = seg is not None and seg.abandoned_from is not None and f.end_step >= seg.abandoned_from
        is_open = not rolled_back and (f.needs_action or f.end_step >= recent_from)
        out.append(dataclasses.replace(f, open=is_open))
    return out


def health_of(findings: list[Finding]) -> str:
    open_ = [f for f in findings if f.open]
    if any(f.needs_action and f.kind != "stall" for f in open_):
        return "action needed"
    if any(f.kind == "stall" and f.evidence.get("live") for f in open_):
        return "stalled"
    return "watching" if open_ else "healthy"


def assemble(raw: list[Finding], segments: list[SegmentInfo], main: dict[str, np.ndarray], checkpoints: list[dict],
             now: float | None, present_paths: set[str] | None) -> Report:
    """Everything after the per-segment detectors; shared by offline and streaming analysis."""
    findings = merge_overlaps(raw)
    if now is not None and segments:
        stall = live_stall(main["step"], main["time"], now, segments[-1].segment)
        if stall is not None:
            findings.append(stall)
    findings = mark_open(findings, segments, main["step"])
    findings.sort(key=lambda f: (f.onset_step, f.segment, f.kind))
    rollback = advise(findings, checkpoints, main, present_paths)
    return Report(findings=findings, segments=segments, rollback=rollback, health=health_of(findings))


def analyze(rows: pa.Table, events: pa.Table | None = None, now: float | None = None,
            present_paths: set[str] | None = None) -> Report:
    """Judge one run (one rank): ``rows`` = ``Store.rows(run, rank=0)``, ``events`` = ``Store.events(run)``.

    ``now`` (unix seconds) enables the live-stall check; leave it None for an
    archived run. ``present_paths``: checkpoint paths known to exist on disk
    (None: do not check).
    """
    if "step" not in rows.column_names:
        raise ValueError("rows have no 'step' column (expected Store.rows(run))")
    checkpoints = checkpoints_from_events(events)
    seconds = checkpoint_seconds(checkpoints)
    raw: list[Finding] = []
    for segment, cols in split_segments(rows).items():
        scan = SegmentDetectors(segment, seconds)
        scan.advance(cols)
        raw.extend(scan.findings())
    infos = segment_infos(rows, resume_steps_of(events.to_pylist() if events is not None else []))
    return assemble(raw, infos, main_line(rows, infos), checkpoints, now, present_paths)
