"""Which checkpoints to keep: a ladder deep enough that a problem noticed late still has a clean one before it.

Pure. A spike is often noticed well after it began, so keeping only the newest
checkpoint is not enough: by the time the alarm rings, the checkpoint to roll
back to may be gone. The ladder: the last ``keep_last`` checkpoints, every
``every_nth`` older one, and a milestone at about every 10% of training.

Sizing, from the run's own findings. A finding with onset o detected at step d
needs a checkpoint strictly before h, the last healthy logged step before o
(the advisor's rule, ``last_healthy_step``; earlier where the advice walked
back before a precursor). Its depth is D = d - h + 1 steps. With a checkpoint
every I steps, the newest checkpoint at detection and the one needed are at
most ceil(D / I) intervals apart wherever the onset falls, so keeping
``ceil(D / I) + 1`` covers every finding the run had (D: the deepest). Older
ones, every ``keep_last``-th: a problem noticed later than any here replays at
most one more dense window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runwatch.detectors.advisor import last_healthy_step
from runwatch.detectors.finding import Finding, Rollback
from runwatch.detectors.registry import NO_ROLLBACK_KINDS
from runwatch.economics.measure import Checkpoint, Cols

MILESTONE_FRACTIONS: tuple[float, ...] = tuple(p / 10 for p in range(1, 10))
"""A milestone at about every 10% of training so far (the newest ones are the dense tier's)."""


@dataclass(frozen=True)
class Depth:
    """How far back one finding's rollback reaches from the step it was detected at."""

    kind: str
    segment: int
    onset_step: int
    detected_step: int
    clean_before: int
    """A clean checkpoint must be at a step before this one."""

    @property
    def lag_steps(self) -> int:
        """Detection lag: detected_step - onset_step."""
        return self.detected_step - self.onset_step

    @property
    def depth_steps(self) -> int:
        return self.detected_step - self.clean_before + 1


@dataclass(frozen=True)
class Ladder:
    """The retention advice; None where the record cannot size a tier."""

    keep_last: int | None
    every_nth: int | None
    milestones: list[int] | None
    reason: str

    def keeps(self, steps: list[int], newest: int) -> set[int] | None:
        """The checkpoint steps this ladder still holds when ``newest`` is the newest one saved.

        ``steps``: every checkpoint step of the line, oldest first (the index
        counts for ``every_nth``). None when the ladder is not sized.
        """
        if self.keep_last is None or self.every_nth is None:
            return None
        saved = [s for s in steps if s <= newest]
        kept = set(saved[-self.keep_last:])
        kept.update(s for i, s in enumerate(saved) if i % self.every_nth == 0)
        kept.update(s for s in self.milestones or [] if s <= newest)
        return kept


def depths(findings: list[Finding], segments: dict[int, Cols], rollback: Rollback | None = None) -> list[Depth]:
    """The rollback depth of every finding that can need a rollback and says when it was detected."""
    out = []
    walked = (rollback.evidence or {}) if rollback is not None else {}
    for f in findings:
        detected = f.evidence.get("detected_step")
        if f.kind in NO_ROLLBACK_KINDS or f.severity == "info" or not isinstance(detected, int) \
                or f.segment not in segments:
            continue
        clean = last_healthy_step(segments[f.segment]["step"], f.onset_step)
        if walked.get("finding") == f.kind and walked.get("onset_step") == f.onset_step and f.open \
                and isinstance(walked.get("cutoff_step"), int):
            clean = min(clean, walked["cutoff_step"])  # the advice walked back before a precursor
        out.append(Depth(kind=f.kind, segment=f.segment, onset_step=f.onset_step,
                         detected_step=max(detected, f.onset_step), clean_before=clean))
    return out


def milestones(checkpoints: list[Checkpoint], findings: list[Finding], last_step: int) -> list[int] | None:
    """Per ~10% of training so far, the latest kept, healthy main-line checkpoint at or before it."""
    if not checkpoints:
        return None
    bad = [(f.segment, f.onset_step - 1, f.end_step) for f in findings
           if f.kind not in NO_ROLLBACK_KINDS and f.severity != "info"]
    good = sorted(c.step for c in checkpoints if c.main and not c.deleted
                  and not any(seg == c.segment and lo <= c.step <= hi for seg, lo, hi in bad))
    picks = []
    for fraction in MILESTONE_FRACTIONS:
        i = int(np.searchsorted(good, fraction * last_step, side="right")) - 1
        if i >= 0 and good[i] not in picks:
            picks.append(good[i])
    return picks


def ladder(depth_list: list[Depth], interval_steps: float | None, checkpoints: list[Checkpoint],
           findings: list[Finding], last_step: int, rollback: Rollback | None = None) -> Ladder:
    """Size the ladder (see the module docstring) and say why, with the advisor's missing checkpoint if any."""
    marks = milestones(checkpoints, findings, last_step)
    if not depth_list:
        reason = ("No finding on this run that can need a rollback says when it was detected, so its detection "
                  "lag is not measured; the dense and sparse tiers are sized from it.")
        keep = None
    elif interval_steps is None or interval_steps <= 0:
        reason = "Fewer than two checkpoints on the main line: no checkpoint interval to size the tiers in."
        keep = None
    else:
        deepest = max(depth_list, key=lambda d: d.depth_steps)
        keep = math.ceil(deepest.depth_steps / interval_steps) + 1
        reason = (f"Keep the last {keep} checkpoints: the deepest rollback on this run is the {deepest.kind} from "
                  f"step {deepest.onset_step}, detected at step {deepest.detected_step} ({deepest.lag_steps} steps "
                  f"after its onset; slowest detection lag here "
                  f"{max(d.lag_steps for d in depth_list)} steps over {len(depth_list)} finding(s)), which needs a "
                  f"checkpoint before step {deepest.clean_before}: {deepest.depth_steps} steps back, at one "
                  f"checkpoint every {interval_steps:g} steps ceil({deepest.depth_steps}/{interval_steps:g}) + 1 = "
                  f"{keep}. Older: every {ordinal(keep)}, so a problem noticed later than any here replays at most "
                  f"{keep * interval_steps:g} steps more.")
    if marks:
        reason += f" Milestones at about every 10% of training: steps {', '.join(map(str, marks))}."
    result = Ladder(keep_last=keep, every_nth=keep, milestones=marks, reason=reason)
    return Ladder(keep_last=keep, every_nth=keep, milestones=marks,
                  reason=reason + _missing_note(result, checkpoints, rollback))


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _missing_note(result: Ladder, checkpoints: list[Checkpoint], rollback: Rollback | None) -> str:
    """The advisor's ``checkpoint_missing``: the checkpoint it wanted is gone; would this ladder have kept it?"""
    if rollback is None or not rollback.checkpoint_missing:
        return ""
    missing = (rollback.evidence or {}).get("missing_checkpoint")
    if not missing:
        return " The rollback advice found no retained healthy checkpoint before the onset."
    line = sorted(c.step for c in checkpoints if c.main)
    kept = result.keeps(line, line[-1]) if line else None
    verdict = ("" if kept is None else " This ladder keeps it." if missing["step"] in kept
               else " This ladder would not have kept it either: keep more.")
    return (f" The rollback advice wanted checkpoint {missing['step']} ({missing['path']}), already deleted "
            f"(checkpoint_missing).{verdict}")
