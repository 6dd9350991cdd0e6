"""Measured from a run's own record: what its checkpoints cost, how often it was interrupted, what that lost.

Pure: the run's segments as column arrays (``split_segments`` of
``Store.rows(run)``), its checkpoints (``checkpoints_from_events``), its
events and its findings in; a ``Measured`` out. Which steps a restart threw
away is the record's one main-line rule (``segment_cuts``). A figure the
record cannot give is None, never a guess: no clock, no wall time.

- Checkpoint cost: the ``write_seconds`` the loop measured around its save;
  where it is missing, the time between the checkpoint's row and the next
  row of its segment beyond what those steps take (the median step time).
- Interruptions: every restart (a segment after the first) and every stall.
- Lost work per restart: the steps of the main line it replaced, the wall time
  spent on them, and the downtime from the last row before it to its first row
  (less the steps that row trained); per stall, its time beyond the expected.
- Goodput: the share of wall time left after lost work and the main line's
  checkpoint writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from runwatch.data.record import segment_cuts
from runwatch.detectors.finding import Finding

Cols = dict[str, np.ndarray]
"""One segment's rows, sorted by step: ``step``, ``time`` and ``step_time`` (NaN where not logged)."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint (all ranks' events at one segment and step, merged)."""

    step: int
    segment: int
    seconds: float | None
    """Blocking write time: the slowest rank's measured one, else estimated from the step gap, else None."""
    measured: bool
    """True when ``seconds`` was measured by the training loop (``write_seconds``)."""
    bytes: int | None
    """Size: distinct files added up (sharded checkpoints), one file counted once."""
    main: bool
    """On the main line (no later resume replaced its step)."""
    followed: bool
    """A row of its segment follows it, so its write lies inside the run's rows (not in a gap)."""
    deleted: bool = False
    """Retention deleted it (or a later save overwrote its path): it cannot be rolled back to."""


@dataclass(frozen=True)
class Restart:
    """One restart (a new segment) and the work lost to it."""

    segment: int
    resume_step: int | None
    """The checkpoint step it resumed from (its ``resume`` event), or None."""
    lost_steps: int
    """Steps of the main line as it stood that this segment replaced."""
    branch_seconds: float | None
    """Wall time spent on those steps (their checkpoint writes included); None without a clock."""
    downtime_seconds: float | None
    """Last row before the restart to this segment's first row, less the steps that row trained."""

    @property
    def lost_seconds(self) -> float | None:
        if self.branch_seconds is None or self.downtime_seconds is None:
            return None
        return self.branch_seconds + self.downtime_seconds


@dataclass(frozen=True)
class Stall:
    """A stall finding: training paused inside a segment."""

    step: int
    segment: int
    seconds: float
    """Time beyond what its steps and checkpoint writes should have taken."""
    main: bool
    """On the main line; a stall on an abandoned branch is already inside that branch's lost time."""


@dataclass(frozen=True)
class Measured:
    """Everything the record says about checkpoint cost and interruptions (seconds, steps)."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    wall_seconds: float | None = None
    """First to last timestamp over every segment; None without a clock."""
    step_seconds: float | None = None
    """Median wall seconds per step on the main line (from its clock, else its ``step_time``)."""
    interval_steps: float | None = None
    """Median spacing of consecutive main-line checkpoints, in steps."""

    @property
    def checkpoint_seconds(self) -> float | None:
        return _median([c.seconds for c in self.checkpoints])

    @property
    def checkpoint_bytes(self) -> int | None:
        size = _median([c.bytes for c in self.checkpoints])
        return None if size is None else round(size)

    @property
    def interruptions(self) -> int:
        return len(self.restarts) + len(self.stalls)

    @property
    def lost_steps(self) -> int:
        return sum(r.lost_steps for r in self.restarts)

    @property
    def lost_seconds(self) -> float | None:
        parts = [r.lost_seconds for r in self.restarts] + [s.seconds for s in self.stalls if s.main]
        return None if any(p is None for p in parts) else float(sum(parts))

    @property
    def overhead_seconds(self) -> float | None:
        """Main-line checkpoint writes inside the run's rows (a write at a segment's end falls in a gap)."""
        parts = [c.seconds for c in self.checkpoints if c.main and c.followed]
        return None if any(p is None for p in parts) else float(sum(parts))

    @property
    def goodput(self) -> float | None:
        lost, overhead, wall = self.lost_seconds, self.overhead_seconds, self.wall_seconds
        if lost is None or overhead is None or not wall:
            return None
        return min(1.0, max(0.0, (wall - lost - overhead) / wall))

    @property
    def mtbf_seconds(self) -> float | None:
        """Wall time over interruptions; None when none happened (nothing measured) or without a clock."""
        if not self.interruptions or self.wall_seconds is None:
            return None
        return self.wall_seconds / self.interruptions

    @property
    def restart_seconds(self) -> float | None:
        """Mean downtime per restart (the R of Daly's model), where the clock shows it."""
        return _mean([r.downtime_seconds for r in self.restarts])

    @property
    def current_seconds(self) -> float | None:
        """The run's checkpoint interval in seconds of training (steps between checkpoints x step time)."""
        if self.interval_steps is None or self.step_seconds is None:
            return None
        return self.interval_steps * self.step_seconds


def _median(values: list[float | int | None]) -> float | None:
    known = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(np.median(known)) if known else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def _rates(c: Cols, keep: np.ndarray | None = None) -> np.ndarray:
    """Seconds per step of each logged interval of one segment (its clock, else its ``step_time``)."""
    keep = np.ones(len(c["step"]), dtype=bool) if keep is None else keep
    timed = keep & np.isfinite(c["time"])
    if timed.sum() >= 2:
        steps, times = c["step"][timed], c["time"][timed]
        ds = np.diff(steps)
        return np.diff(times)[ds > 0] / ds[ds > 0]
    step_time = c.get("step_time", np.full(len(keep), np.nan))[keep]
    return step_time[np.isfinite(step_time)]


@dataclass(frozen=True)
class Timeline:
    """One segment's rows as the arithmetic needs them, searched in O(log n)."""

    steps: np.ndarray
    timed_steps: np.ndarray
    times: np.ndarray
    per_step: float | None
    """Median wall seconds per step of the segment."""

    @classmethod
    def of(cls, c: Cols) -> Timeline:
        timed = np.isfinite(c["time"])
        rates = _rates(c)
        return cls(steps=c["step"], timed_steps=c["step"][timed], times=c["time"][timed],
                   per_step=float(np.median(rates)) if len(rates) else None)

    @property
    def first(self) -> int:
        return int(self.steps[0])

    @property
    def last(self) -> int:
        return int(self.steps[-1])

    def at_or_before(self, step: int) -> tuple[int, float] | None:
        """(step, time) of the last timed row at or before ``step``."""
        i = int(np.searchsorted(self.timed_steps, step, side="right")) - 1
        return (int(self.timed_steps[i]), float(self.times[i])) if i >= 0 else None

    def after(self, step: int) -> tuple[int, float] | None:
        """(step, time) of the first timed row after ``step``."""
        i = int(np.searchsorted(self.timed_steps, step, side="right"))
        return (int(self.timed_steps[i]), float(self.times[i])) if i < len(self.timed_steps) else None

    def has_row_after(self, step: int) -> bool:
        return bool(self.steps[-1] > step)


def merge_checkpoints(checkpoints: list[dict], segments: dict[int, Timeline],
                      cuts: dict[int, int | None]) -> list[Checkpoint]:
    """One ``Checkpoint`` per segment and step from every rank's events, with its cost and place."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for ckpt in checkpoints:
        if ckpt.get("segment") is not None and int(ckpt["segment"]) in segments:
            groups.setdefault((int(ckpt["segment"]), int(ckpt["step"])), []).append(ckpt)
    out = []
    for (seg, step), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        c = segments[seg]
        measured = [float(g["write_seconds"]) for g in group if _number(g.get("write_seconds"))]
        seconds = max(measured) if measured else _gap_estimate(c, step)
        by_path: dict[object, int] = {}
        for g in group:
            if _number(g.get("bytes")):
                by_path[g.get("path")] = max(by_path.get(g.get("path"), 0), int(g["bytes"]))
        cut = cuts.get(seg)
        out.append(Checkpoint(step=step, segment=seg, seconds=seconds, measured=bool(measured),
                              bytes=sum(by_path.values()) if by_path else None,
                              main=cut is None or step < cut, followed=c.has_row_after(step),
                              deleted=all(bool(g.get("deleted")) for g in group)))
    return out


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _gap_estimate(c: Timeline, step: int) -> float | None:
    """The write time a checkpoint without ``write_seconds`` took: its interval's time beyond its steps' time."""
    before, after = c.at_or_before(step), c.after(step)
    if before is None or after is None or c.per_step is None:
        return None
    return max(0.0, after[1] - before[1] - c.per_step * (after[0] - before[0]))


def _first_last(segments: dict[int, Timeline], which: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    return {k: segments[k].first for k in which}, {k: segments[k].last for k in which}


def restarts(segments: dict[int, Timeline], resumes: dict[int, int], skips: dict[int, tuple[int, int]],
             checkpoints: list[Checkpoint]) -> list[Restart]:
    """Each segment after the first: the main line it replaced (``segment_cuts`` over the segments before it),
    the time spent on that, and the downtime before it."""
    order = sorted(segments)
    out = []
    for j in range(1, len(order)):
        seg, earlier = order[j], order[:j]
        first, last = _first_last(segments, earlier)
        start = min(segments[seg].first, resumes[seg] + 1) if seg in resumes else segments[seg].first
        cuts = segment_cuts(first, last, {k: resumes[k] for k in earlier if k in resumes})
        lost, branch = 0, 0.0
        for k in earlier:
            end = last[k] if cuts[k] is None else cuts[k] - 1
            lo = max(start, first[k])
            if end < lo:
                continue
            lost += end - lo + 1
            seconds = _branch_seconds(segments[k], lo, end, [c for c in checkpoints if c.segment == k])
            branch = None if branch is None or seconds is None else branch + seconds
        out.append(Restart(segment=seg, resume_step=resumes.get(seg), lost_steps=lost, branch_seconds=branch,
                           downtime_seconds=_downtime(segments[order[j - 1]], segments[seg], start, skips.get(seg))))
    return out


def _branch_seconds(c: Timeline, lo: int, end: int, checkpoints: list[Checkpoint]) -> float | None:
    """Wall time one segment spent on its steps lo..end: from the row before them to their last row, less the
    writes of checkpoints kept on the main line (at steps before lo) that fall in between."""
    anchor = c.at_or_before(lo - 1)
    if anchor is None:  # the whole segment was replaced: from its first timed row
        anchor = c.after(lo - 1)
    stop = c.at_or_before(end)
    if anchor is None or stop is None:
        return None
    kept = [k.seconds for k in checkpoints if anchor[0] <= k.step < lo]
    if any(s is None for s in kept):
        return None
    return max(0.0, stop[1] - anchor[1] - sum(kept))


def _downtime(before: Timeline, after: Timeline, start: int, skip: tuple[int, int] | None) -> float | None:
    """From the last timed row of the segment before to the first timed row of this one, less the steps that
    row trained (skipped batches take no training time)."""
    last, first = before.at_or_before(before.last), after.after(after.first - 1)
    per_step = after.per_step or before.per_step
    if last is None or first is None or per_step is None:
        return None
    trained = first[0] - start + 1
    if skip is not None:
        trained -= max(0, min(skip[1], first[0]) - max(skip[0], start) + 1)
    return max(0.0, first[1] - last[1] - per_step * max(trained, 0))


def stalls(findings: list[Finding], cuts: dict[int, int | None]) -> list[Stall]:
    """The stall findings inside segments (a live stall is the run's state now, not a past interruption)."""
    out = []
    for f in findings:
        if f.kind != "stall" or f.evidence.get("live"):
            continue
        ev = f.evidence
        seconds = max(0.0, float(ev.get("gap_s", 0.0)) - float(ev.get("allowance_s") or 0.0)
                      - float(ev.get("expected_s", 0.0)))
        cut = cuts.get(f.segment)
        out.append(Stall(step=f.onset_step, segment=f.segment, seconds=seconds, main=cut is None or f.end_step < cut))
    return out


def measure(segments: dict[int, Cols], checkpoints: list[dict], resumes: dict[int, int],
            skips: dict[int, tuple[int, int]], findings: list[Finding]) -> Measured:
    """What the record says (see the module docstring). ``segments``: ``split_segments(Store.rows(run))``;
    ``checkpoints``: ``checkpoints_from_events``; ``resumes``: ``resume_steps_of``; ``skips``: each resumed
    segment's skipped batches; ``findings``: the run's (``judge_run``), for its stalls."""
    segments = {k: c for k, c in segments.items() if len(c["step"])}
    if not segments:
        return Measured()
    lines = {k: Timeline.of(c) for k, c in segments.items()}
    first, last = _first_last(lines, sorted(lines))
    cuts = segment_cuts(first, last, {k: s for k, s in resumes.items() if k in segments})
    merged = merge_checkpoints(checkpoints, lines, cuts)
    times = np.concatenate([c["time"] for c in segments.values()])
    times = times[np.isfinite(times)]
    rates = np.concatenate([_rates(c, None if cuts[k] is None else c["step"] < cuts[k]) for k, c in segments.items()])
    main_steps = sorted({c.step for c in merged if c.main})
    spacing = np.diff(main_steps)
    return Measured(
        checkpoints=merged, restarts=restarts(lines, resumes, skips, merged), stalls=stalls(findings, cuts),
        wall_seconds=float(times.max() - times.min()) if len(times) >= 2 else None,
        step_seconds=float(np.median(rates)) if len(rates) else None,
        interval_steps=float(np.median(spacing)) if len(spacing) else None)
