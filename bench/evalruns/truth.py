"""The rollback truth of a labelled run: one rule for the dev, held-out and fresh sets.

The record's contract: a checkpoint at step s holds the state after the update
of step s, so the first loss computed from it is the one logged at s+1. A
checkpoint is safe only if a logged observation after it and before the
problem's onset was healthy. The right checkpoint for a run that needs action
is therefore the latest checkpoint c on the main line that

- lies strictly before the last logged step before the onset of the earliest
  open label that needs action (per-step logs: c <= onset - 2); labels that
  recovered before it do not push it back. The one exception is an LR the
  log shows: the LR logged at step s is the one update s ran at, so where the
  onset's own row is the first to show an LR fault's raised LR, every update
  up to the row before it ran at the old LR and the checkpoint at that row is
  clean (a coarse log: the raise came somewhere after that row);
- is not inside any labelled excursion's [onset - 1, end] (its state is
  mid-excursion: checkpoint onset - 1 made the onset's observation), where a
  spike that needs no action ends, for this, at its ``settled`` step less 2:
  from there on the run was no worse than before it (fresh-v10), so the
  checkpoint that made that step's loss loses nothing against one before the
  onset and keeps the training since (the economics that decide whether the
  spike needs action at all, fresh-v9);
- is not inside a loss-scale backoff burst (a healthy checkpoint has its loss
  scale at a normal level);

and None when no checkpoint qualifies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Kinds whose [onset - 1, end] holds a damaged state (a stall or a slowdown leaves the weights alone).
EXCURSION_KINDS = ("spike", "divergence", "nan", "scaler_collapse")
# Overflows this close (in steps) belong to one backoff burst: consecutive, or every other step.
BURST_GAP = 2


@dataclass(frozen=True)
class MainLine:
    """What the rule reads of a run's main line."""

    logged: np.ndarray  # logged steps on the main line, ascending
    checkpoints: tuple[int, ...]  # checkpoint steps on the main line
    backoff_bursts: tuple[tuple[int, int], ...] = ()  # [first, last] overflow steps of each burst
    lr_raised: tuple[tuple[int, int, int], ...] = ()  # (segment, first, last) steps an LR fault raised the LR at


LR_FAULTS = ("lr_burst", "lr_jump", "lr_grow", "lr_ramp")


def lr_raised(faults: Iterable[object], last_step: int) -> tuple[tuple[int, int, int], ...]:
    """(segment, first, last) steps each LR fault of ``faults`` (``training.Fault``) raised the LR at."""
    return tuple((f.segment, f.step, min(f.step + f.length - 1, last_step)) for f in faults if f.kind in LR_FAULTS)


def backoff_bursts(overflow_steps: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Runs of two or more overflows at most ``BURST_GAP`` steps apart, as [first, last] step ranges.

    A single overflow is the scaler's ordinary backoff: the checkpoint after it is healthy.
    """
    steps = sorted(set(int(s) for s in overflow_steps))
    out: list[tuple[int, int]] = []
    start = prev = None
    for s in steps + [None]:
        if s is not None and prev is not None and s - prev <= BURST_GAP:
            prev = s
            continue
        if start is not None and prev != start:
            out.append((start, prev))
        start = prev = s
    return tuple(out)


def right_checkpoint(labels: Sequence[object], line: MainLine) -> int | None:
    """The checkpoint a correct advisor names for this run, or None (no action needed, or none qualifies).

    ``labels`` are ``scenarios.Label`` records (kind, onset, end, needs_action,
    open, dont_care); only open ones (on the main line) are read.
    """
    real = [lab for lab in labels if lab.open and not getattr(lab, "dont_care", False)]
    targets = [lab for lab in real if lab.needs_action]
    if not targets:
        return None
    first = min(targets, key=lambda lab: lab.onset)
    onset = first.onset
    before = line.logged[line.logged < onset]
    if not len(before):
        return None
    limit = int(before[-1])

    def raised(step: int) -> bool:
        return any(seg == first.segment and a <= step <= b for seg, a, b in line.lr_raised)

    clean_to = limit if raised(onset) and not raised(limit) else limit - 1
    blocked = [(lab.onset - 1, _damaged_to(lab)) for lab in real if lab.kind in EXCURSION_KINDS]
    blocked += list(line.backoff_bursts)
    ok = [c for c in line.checkpoints if c <= clean_to and not any(lo <= c <= hi for lo, hi in blocked)]
    return max(ok, default=None)


def _damaged_to(lab: object) -> int:
    """The last checkpoint step an excursion's damage reaches: its end, or for one that needs no action and settled
    before it (no worse than before its onset from ``settled`` on), the step before the one that made ``settled``'s
    loss."""
    settled = getattr(lab, "settled", None)
    return lab.end if settled is None or lab.needs_action else min(lab.end, settled - 2)


def logged_steps(spec: object, segment: int) -> np.ndarray:
    """The steps segment ``segment`` of a ``training.RunSpec`` logs, all of them (abandoned ones too).

    ``log_every`` (1 for a plain RunSpec) keeps the rows ``heldout.subsample``
    keeps: every multiple of it, and the run's final row.
    """
    every, r = getattr(spec, "log_every", 1), spec.resume
    if segment == 0:
        steps = np.arange(0, (r.at_step if r is not None else spec.num_steps - 1) + 1)
    else:
        steps = np.arange(r.from_ckpt + 1 + (r.num_skip if r.skip_steps else 0), spec.num_steps)
    final = steps[-1] if segment == (1 if r is not None else 0) else -1
    return steps[(steps % every == 0) | (steps == final)]


def spec_main_line(spec: object) -> MainLine:
    """The main line a ``training.RunSpec`` produces, read from the spec (no training needed).

    Checkpoints are training.py's (every ``ckpt_every`` steps from the first,
    none at step 0); overflow bursts are the injected ones, the ordinary ones
    and the start-up calibration.
    """
    r = spec.resume
    seg0 = logged_steps(spec, 0)
    seg0_last = r.at_step if r is not None else spec.num_steps - 1
    ckpts = [c for c in range(spec.ckpt_every, seg0_last + 1, spec.ckpt_every) if r is None or c <= r.from_ckpt]
    parts = [seg0 if r is None else seg0[seg0 <= r.from_ckpt]]
    if r is not None:
        seg1 = logged_steps(spec, 1)
        parts.append(seg1)
        ckpts += [c for c in range(int(seg1[0]), spec.num_steps) if c % spec.ckpt_every == 0]
    overflows = list(range(spec.startup_overflows)) + list(spec.normal_overflows)
    for f in spec.faults:
        if f.kind == "overflow":
            overflows += list(range(f.step, f.step + f.length, f.every))
    if r is not None:  # segment 0's overflows after the checkpoint it resumed from are an abandoned branch
        seg1_overflows = [s for f in spec.faults if f.kind == "overflow" and f.segment == 1
                          for s in range(f.step, f.step + f.length, f.every)]
        overflows = [s for s in overflows if s <= r.from_ckpt] + seg1_overflows
    return MainLine(np.unique(np.concatenate(parts)), tuple(ckpts), backoff_bursts(overflows),
                    lr_raised(spec.faults, spec.num_steps - 1))
