"""analyze(): every detector over every segment, then segments, open alarms, health and rollback advice.

This is the one entry point the CLI, the dashboard and the evaluation call:
``analyze(Store.rows(run, rank=0), Store.events(run), now, meta=Store.meta(run))``.
Each segment is judged on its own rows (a resumed segment starting from its
parent's baseline at the resume step); a finding on an abandoned branch, or
one a rollback already answered, is history (open=False).
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
from runwatch.detectors.config import DEFAULT, DetectorConfig
from runwatch.detectors.finding import Finding, Rollback, SegmentInfo, clean_json, fmt_value
from runwatch.detectors.rank_stall import pause_seconds
from runwatch.detectors.segment_scan import SegmentDetectors
from runwatch.detectors.segments import parent_history, read_rows
from runwatch.detectors.spike import lr_still_up
from runwatch.detectors.stall import live_stall

LOSS_KINDS = ("spike", "divergence")


@dataclass(frozen=True)
class Report:
    findings: list[Finding]
    segments: list[SegmentInfo]
    rollback: Rollback | None
    health: str
    """'healthy', 'watching', 'action needed' or 'stalled'; ``app.judge.judge_run`` says 'unresolved' for an
    ended run that would be 'watching'."""

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


def _diverged(f: Finding, cfg: DetectorConfig) -> bool:
    """A loss excursion that is a divergence by its cause or by its shape. By its cause: thrown by a learning rate
    that is still raised (not the schedule), whether or not the loss came back (the cause decides the fix: a
    raised LR is a divergence in the making, lower it; a burst that is over leaves a spike, roll back and skip
    its batches). By its shape: unrecovered and still climbing (``climbing``: the later half of it above the
    earlier by the divergence's ``growth_z`` standard errors), a change in slope (DETECTION.md section 5); or
    unrecovered after the gradient or activation norm had been climbing into it before the loss moved
    (``cause_start``: x2 or x3 over blocks, beyond the norm's own wander), OPT's precursor that the loss has now
    followed. A jump that stays up without any of these is a spike that did not recover."""
    if f.kind != "spike" or f.evidence.get("blip"):
        return False
    ev = f.evidence
    norms_led = any(ev.get(k) is not None and ev[k] < f.onset_step
                    for k in ("act_norm_climb_step", "grad_norm_climb_step"))
    return lr_still_up(ev) or (f.needs_action and (bool(ev.get("climbing")) or norms_led))


def _as_divergence(f: Finding, cfg: DetectorConfig) -> Finding:
    """Call it a divergence: the fix is the learning rate (or what drives the climb), not a data skip alone."""
    ev = f.evidence
    raised = lr_still_up(ev)
    grad, lr = ev.get("grad_norm_ratio"), ev.get("lr_ratio")
    why = ([f"learning rate x{lr:.2g}"] if raised and lr else []) + \
        [f"gradient norm x{grad:.2g}" for _ in [0] if grad and grad >= 1.5]
    # A divergence begins where the trend broke: the gradient or activation norm growing into the jump.
    onset = min(f.onset_step, ev.get("trend_break_step") or f.onset_step)
    rise = f"{ev['baseline_loss']:.4g} -> {fmt_value(ev['peak_loss'])}"
    message = (f"loss diverged from step {onset}: jumped {rise} and stayed up" if not ev.get("climbing") else
               f"loss diverging from step {onset}: {rise} and still climbing (the later half of the rise "
               f"{ev['climb_se']:.1f} standard errors above the earlier)")
    message += f" ({', '.join(why)})" if why else ""
    if onset < f.onset_step:
        # The onset is a norm's climb or the LR rise's first consequence (``cause_start``), whichever came first.
        norm = onset in (ev.get("act_norm_climb_step"), ev.get("grad_norm_climb_step"))
        rise = ev.get("lr_rise_step")
        what = "the gradient or activation norm began growing at" if norm or rise is None \
            else "the learning rate began rising at" if rise == onset \
            else f"the learning rate began rising at {rise}, its first loss at"
        message += f"; {what} {onset}, the loss {'rose from' if ev.get('climbing') else 'jumped at'} {f.onset_step}"
    if raised:
        message += "; the learning rate was raised at the onset and is still up"
    return dataclasses.replace(f, kind="divergence", message=message, self_recovered=False, needs_action=True,
                               severity="critical", onset_step=onset,
                               evidence={**ev, "from_spike": True, "loss_climb_step": f.onset_step})


def overlaps(a: Finding, b: Finding) -> bool:
    """Same segment and intersecting step ranges."""
    return a.segment == b.segment and a.onset_step <= b.end_step and b.onset_step <= a.end_step


def _began_inside(f: Finding, episode: Finding) -> bool:
    """Whether ``f`` began inside ``episode``'s span, in its segment."""
    return f.segment == episode.segment and episode.onset_step <= f.onset_step <= episode.end_step


def _outlived(collapse: Finding, nan: Finding) -> bool:
    """A scaler collapse that began inside a NaN episode and is a state of its own after it: the values came back
    finite and the scale stayed under the floor, a broken scaler by itself (``ScalerConfig.floor``) that regrowth at
    one doubling per growth interval does not undo within a run. A review's Lightning fp16 run halved 65536 to
    0.002 over 25 steps of infinite loss, trained on finite values at that scale and read 'watching'. Skips at a
    scale above the floor just after the values came back are the NaN's tail (a diverged run overflowing on)."""
    return bool(nan.self_recovered and collapse.self_recovered is not True and collapse.evidence.get("below_floor"))


def _a_slow_rise(f: Finding) -> bool:
    """A spike the CUSUM opened (a sustained rise, no observation far out) with no LR cause before it."""
    ev = f.evidence
    return ev.get("rule") == "cusum" and not ev.get("lr_raised") and ev.get("lr_step_up_step") is None


def _seen_first(o: Finding, d: Finding) -> bool:
    """Whether finding ``o``, unrecovered, is the start of the incident divergence ``d`` is part of: ``o`` began
    at or before ``d``'s onset, and ``d``'s climb began before ``o`` was even confirmed. A climb that began
    after that is a new development inside ``o``."""
    return not o.self_recovered and o.onset_step <= d.onset_step <= o.evidence.get("detected_step", o.onset_step)


def _a_jump(o: Finding) -> bool:
    """A spike opened by a single observation far out (the Shewhart rule): a change in level. A divergence that
    began with one measured its climb from before the jump, so the jump read as its start; the incident is an
    unrecovered spike (DETECTION.md section 5: a divergence is a change in slope). A sustained rise (the CUSUM
    rule) is a change in slope already: the divergence's."""
    return o.kind == "spike" and o.evidence.get("rule") == "shewhart"


def _second_cause(f: Finding) -> bool:
    """An LR raised off the schedule inside an unrecovered excursion (``divergence.lr_raise_inside``)."""
    return f.evidence.get("rule") == "lr_raise_inside"


def _one_per_raise(findings: list[Finding]) -> list[Finding]:
    """An LR raise inside an excursion that a spike and a divergence episode both cover is found by each: keep one."""
    seen, out = set(), []
    for f in findings:
        key = (f.segment, f.evidence.get("lr_rise_step")) if _second_cause(f) else None
        if key is None or key not in seen:
            out.append(f)
            seen.add(key)
    return out


def merge_overlaps(findings: list[Finding], cfg: DetectorConfig = DEFAULT) -> list[Finding]:
    """One incident, one finding.

    A spike under a learning rate still raised (not by the schedule) is a divergence,
    and where one covers an LR change point, the change point's finding gives way.
    Loss findings that begin inside an unrecovered divergence, and unrecovered
    ones that began first but were not yet confirmed when its climb began
    (``_seen_first``), merge into it (earliest onset), unless the first was a
    jump (``_a_jump``): then the incident is that unrecovered spike. A climb
    that began after an unrecovered finding was confirmed is a new development
    beside it, and so is an LR raised off the schedule inside it (a second cause, which absorbs nothing; one whose
    first consequence is where the excursion itself begins is its cause). A 'divergence' that came back
    down inside a spike was that spike.
    A NaN after a divergence stays its own finding: it changes the advice
    (BF16, data) and marks the point of no return; a scaler collapse that
    starts inside a NaN episode is that NaN (the scaler skips non-finite steps),
    unless it outlived it (finite again, the scale not regrown); a loss excursion wholly inside a NaN episode
    is that episode; and a slow rise of the loss that starts inside a scaler collapse is that
    collapse (skipped updates leave the loss above its trend).
    """
    out = [_as_divergence(f, cfg) if _diverged(f, cfg) else f for f in findings]
    out = _one_per_raise(out)
    # The LR change-point tests are the fallback for a lift nothing else saw: where another divergence covers
    # the raise or the burst, that one (its climb or jump, its LR story and advice) is the finding.
    out = [f for f in out if not (f.evidence.get("rule") in ("lr_change_point", "lr_burst_change_point") and any(
        o is not f and o.kind == "divergence" and overlaps(f, o) for o in out))]
    # OPT's precursor with the loss already rising through the climb gives way to the loss's own alarm where one
    # covers it: the loss finding (a spike's jump, a climb) is then the incident, its onset and cause the loss's
    # (fresh seed 118218's run 044: an LR burst's critical spike). With the loss's rise only noted, the norms
    # are what pages it (dev set's divergence-05: act x5.4 and grad x6.2 under a sustained rise left 'info').
    out = [f for f in out if not (f.evidence.get("rule") == "precursor" and f.evidence.get("loss_moved") and any(
        o is not f and o.kind in LOSS_KINDS and o.severity != "info" and overlaps(f, o) for o in out))]
    # Once weights or values are non-finite an fp16 scaler skips every step: that collapse is the NaN's echo, unless
    # it outlived the NaN (``_outlived``).
    nans = [f for f in out if f.kind == "nan"]
    out = [f for f in out if not (f.kind == "scaler_collapse" and any(
        _began_inside(f, n) and not _outlived(f, n) for n in nans))]
    # A loss excursion that lies wholly inside a NaN episode is that episode read off the loss (an overflowed loss
    # is out of every band): a review's fp16 run listed "spike 151-175: loss 0.099 -> not finite" beside it.
    out = [f for f in out if not (f.kind in LOSS_KINDS and any(
        _began_inside(f, n) and f.end_step <= n.end_step for n in nans))]
    # While the scaler skips updates the loss cannot follow its falling trend: a slow rise against the trend (the
    # CUSUM's, no LR cause) that begins then is the collapse's consequence, not a second incident. A jump, or a
    # move the LR made, is one skipped updates cannot explain.
    collapses = [f for f in out if f.kind == "scaler_collapse"]
    out = [f for f in out
           if not (f.kind == "spike" and _a_slow_rise(f) and any(_began_inside(f, c) for c in collapses))]
    for d in sorted([f for f in out if f.kind == "divergence"], key=lambda f: f.onset_step):
        if d not in out or _second_cause(d):
            continue  # a second cause stands beside the excursion it came inside: it absorbs nothing...
        # ...and is never absorbed.
        others = [o for o in out if o is not d and o.kind in LOSS_KINDS and overlaps(d, o) and not _second_cause(o)]
        if d.self_recovered:
            if any(o.kind == "spike" for o in others):
                out.remove(d)
            continue
        first = [o for o in others if _seen_first(o, d)]
        if any(_a_jump(o) for o in first):
            out.remove(d)
            continue
        # Everything the loss does after an unrecovered divergence began is part of it (it runs to the end).
        absorbed = first + [o for o in others if o.onset_step > d.onset_step]
        for o in absorbed:
            out.remove(o)
        merged = dataclasses.replace(d, onset_step=min([d.onset_step] + [o.onset_step for o in absorbed]),
                                     end_step=max([d.end_step] + [o.end_step for o in absorbed]))
        out[out.index(d)] = merged
    # A raise whose first consequence is where an excursion already begins is that excursion's cause, not a second
    # one (test 14a: a noisy row opened it five rows before the raise that threw it, and its onset moved there).
    return [f for f in out if not (_second_cause(f) and any(
        not _second_cause(o) and o.kind in LOSS_KINDS and o.segment == f.segment and o.onset_step == f.onset_step
        for o in out))]


def mark_open(findings: list[Finding], segments: list[SegmentInfo], main_steps: np.ndarray,
              cfg: DetectorConfig = DEFAULT) -> list[Finding]:
    """History vs alarm: abandoned branches and rolled-back incidents are closed; recovered ones close when old."""
    by_seg = {s.segment: s for s in segments}
    recent = max(cfg.advice.recent_obs, int(cfg.advice.recent_fraction * len(main_steps)))
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
    # Info annotations (a bad batch that came straight back) are not a reason to watch.
    return "watching" if any(f.severity != "info" for f in open_) else "healthy"


def assemble(raw: list[Finding], segments: list[SegmentInfo], main: dict[str, np.ndarray], checkpoints: list[dict],
             now: float | None, present_paths: set[str] | None, cfg: DetectorConfig = DEFAULT) -> Report:
    """Everything after the per-segment detectors; shared by offline and streaming analysis."""
    findings = merge_overlaps(raw, cfg)
    if now is not None and segments:
        stall = live_stall(main["step"], main["time"], now, segments[-1].segment, cfg.stall)
        if stall is not None:
            findings.append(stall)
    findings = mark_open(findings, segments, main["step"], cfg)
    findings.sort(key=lambda f: (f.onset_step, f.segment, f.kind))
    rollback = advise(findings, checkpoints, main, present_paths, segments, cfg.advice, cfg.lr)
    return Report(findings=findings, segments=segments, rollback=rollback, health=health_of(findings))


def analyze(rows: pa.Table, events: pa.Table | None = None, now: float | None = None,
            present_paths: set[str] | None = None, *, meta: dict | None = None,
            config: DetectorConfig | None = None) -> Report:
    """Judge one run (one rank): ``rows`` = ``Store.rows(run, rank=0)``, ``events`` = ``Store.events(run)``.

    ``now`` (unix seconds) enables the live-stall check; leave it None for an
    archived run. ``present_paths``: checkpoint paths known to exist on disk
    (None: do not check). ``meta``: the run's ``run.json`` (the scaler's
    parameters). ``config``: thresholds (default: the calibrated ones).
    """
    if "step" not in rows.column_names:
        raise ValueError("rows have no 'step' column (expected Store.rows(run))")
    cfg = config or DEFAULT
    checkpoints = checkpoints_from_events(events)
    event_rows = events.to_pylist() if events is not None else []
    seconds = pause_seconds(checkpoint_seconds(checkpoints), event_rows)  # checkpoint writes and evaluations
    resumes = resume_steps_of(event_rows)
    cols, infos, main = read_rows(rows, resumes)  # the segments' columns, their ranges and the main line
    raw: list[Finding] = []
    for segment in sorted(cols):
        history, resume_step, trained_lr = parent_history(segment, int(cols[segment]["step"][0]), cols, resumes, raw,
                                                          cfg.lr, cfg.slowdown.history_obs)
        scan = SegmentDetectors(segment, cfg, meta=meta, checkpoint_seconds=seconds, history=history,
                                resume_step=resume_step, trained_lr=trained_lr)
        scan.advance(cols[segment])
        raw.extend(scan.findings())
    return assemble(raw, infos, main, checkpoints, now, present_paths, cfg)
