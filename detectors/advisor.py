"""Rollback advice: which checkpoint to restart from, which batches to skip, what to change.

Pure: findings, checkpoint events and the main-line series in, a ``Rollback``
out. Whether a checkpoint file still exists is I/O, so the caller passes the
set of paths it found on disk (or None when it cannot tell).

The recipe is the published one (OPT, BLOOM, PaLM): restart from the latest
checkpoint before the onset and before any precursor, that is still retained
and healthy (loss scale >= 1 with no backoff burst before it, final-layer
activation norm not trending up, all values finite); if the activation norm
started growing long before the loss moved, walk back before that growth.
Skip the batches around the incident (PaLM restarted ~100 steps before a spike
and skipped ~200-500 batches); for divergence also lower the LR and tighten
clipping (OPT 1.0 -> 0.3); for NaN or scaler collapse under fp16, consider BF16.
"""

from __future__ import annotations

import json
import math
import shlex

import numpy as np
import pyarrow as pa

from runwatch.detectors.config import AdviceConfig, LRConfig
from runwatch.detectors.divergence import act_growth_start, answers_the_schedule, precursor_grown, slope_stepped_into
from runwatch.detectors.finding import Finding, Rollback, SegmentInfo
from runwatch.detectors.registry import DEVICE_FAULT_KINDS, NO_ROLLBACK_KINDS


def checkpoints_from_events(events: pa.Table) -> list[dict]:
    """Checkpoint events as dicts (step, segment, path, bytes, write_seconds, deleted), oldest first."""
    if events is None or events.num_rows == 0:
        return []
    rows = events.to_pylist()
    deleted_paths = set()
    for ev in rows:
        payload = _payload(ev)
        # Retention says so explicitly: a note {"path": ..., "deleted": true} (or "retained": false).
        if ev["event"] == "note" and payload.get("path") and (payload.get("deleted") is True or payload.get("retained") is False):
            deleted_paths.add(payload["path"])
    out = []
    for ev in rows:
        if ev["event"] != "checkpoint":
            continue
        payload = _payload(ev)
        path = payload.get("path")
        deleted = bool(payload.get("deleted")) or payload.get("retained") is False or path in deleted_paths
        out.append({"step": int(ev["step"]), "segment": ev.get("segment"), "path": path, "bytes": payload.get("bytes"),
                    "write_seconds": payload.get("write_seconds"), "deleted": deleted})
    out.sort(key=lambda c: c["step"])
    # A save to a path that a later save reused was overwritten (nanoGPT keeps one ckpt.pt): only the latest exists.
    latest_at = {c["path"]: c["step"] for c in out if c["path"]}
    for c in out:
        if c["path"] and latest_at[c["path"]] != c["step"]:
            c["deleted"] = True
    return out


def _payload(ev: dict) -> dict:
    raw = ev.get("payload")
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


HEALTHY = "loss scale ok, activation norm flat, all values finite"
CONTRACT = ("a checkpoint at step s holds the update of step s, and the first bad value at step o was made by "
            "update o-1 (or the batch of o), so only a checkpoint before the last logged healthy step is clean")
CONTRACT_LR = ("a checkpoint at step s holds the update of step s, and the LR logged at step s is the one update s "
               "ran at, so a checkpoint at the last row of the old LR holds no update under the raise")


def _health(ckpt_step: int, main: dict[str, np.ndarray], findings: list[Finding], segments: list[SegmentInfo],
            cfg: AdviceConfig, lrc: LRConfig) -> tuple[bool, str, int | None]:
    """OPT criteria over the observations up to the checkpoint: (healthy, why, start of an act-norm climb or None)."""
    steps = main["step"]
    upto = int(np.searchsorted(steps, ckpt_step, side="right"))
    lo = max(0, upto - cfg.health_window)
    for name in ("loss", "act_norm"):
        v, present = main[name][lo:upto], main[name + "_present"][lo:upto]
        if (present & ~np.isfinite(v)).any():
            return False, f"non-finite {name} before it", None
    scale = main["loss_scale"][lo:upto]
    scale = scale[np.isfinite(scale)]
    if len(scale) and scale.min() < 1.0:
        return False, f"loss scale {scale.min():g} < 1 before it", None
    for f in findings:
        # Inside an incident (or at the step before its first bad value, which may hold its update). One that came
        # back by itself with no lasting cost does not count where the loss computed from the checkpoint's state
        # was already back in the incident's band (``_state_back``): training resumed from that state and
        # recovered (the run showed it; seed 890695's run 025: a recovered 1.5-sigma rise pushed a NaN's rollback
        # back a checkpoint). A checkpoint in the thick of a spike is not healthy for all that (fresh seed 468102's
        # run 032: 75 sigmas up at checkpoint 266; the playbook restarts before the spike).
        # Only the part of an incident on the main line: what a later resume abandoned is no state the main line
        # had, and its steps come again in the resumed segment (fresh seed 418024's run 095: a NaN from 143 on a
        # branch abandoned for checkpoint 80 refused the resumed segment's healthy checkpoint 160).
        if f.kind in NO_ROLLBACK_KINDS or f.severity == "info":
            continue
        end = min(_state_end(f), _abandoned_from(f.segment, segments) - 1)
        old_lr = old_lr_row(main, f, f.onset_step, lrc)
        if not (f.onset_step - 1 if old_lr is None else old_lr + 1) <= ckpt_step <= end:
            continue
        if f.kind == "scaler_collapse":  # the loss coming back says nothing of the scale (``_state_end``)
            regrew = f" (its scale regrew by step {end + 1})" if end > f.end_step else ""
            return False, f"inside the scaler_collapse from step {f.onset_step}{regrew}", None
        if not (f.self_recovered is True and not f.needs_action and _state_back(ckpt_step, main, f, cfg)):
            return False, f"inside the {f.kind} from step {f.onset_step}", None
    growth = _climb(main, ckpt_step + 1, cfg, lrc)
    if growth is not None:
        return False, f"activation norm climbing since step {growth}", growth
    return True, HEALTHY, None


def _state_end(f: Finding) -> int:
    """The last step whose state is incident ``f``'s: its end, and for a scaler collapse that came back the step
    before its scale regrew (``recovery_steps`` from the onset). A checkpoint holds the scaler's state with the
    weights: one taken after the last skip but while the scale is still more than 2^``recovered_within`` under
    where it was resumes the collapse, not the healthy run (fresh seed 172015's run 060: 4096 -> 8 from 517, back
    within 4x only by 847; checkpoint 732 was advised for an LR jump at 733, where the labeller, and the
    scanner's own "back to normal", say 488)."""
    rec = f.evidence.get("recovery_steps") if f.kind == "scaler_collapse" else None
    return max(f.end_step, f.onset_step + int(rec) - 1) if rec is not None else f.end_step


def _state_back(ckpt_step: int, main: dict[str, np.ndarray], f: Finding, cfg: AdviceConfig) -> bool:
    """Was the loss computed from checkpoint ``ckpt_step``'s state back in the band of incident ``f``? The median
    of the first ``cfg.resume_obs`` logged losses after it within ``cfg.resume_band`` of the finding's sigmas above
    its pre-onset level (an incident that states no level and sigma: its recovery is taken as the answer)."""
    base, sigma = f.evidence.get("baseline_loss"), f.evidence.get("loss_sigma")
    if base is None or not sigma:
        return True
    i = int(np.searchsorted(main["step"], ckpt_step, side="right"))
    after = main["loss"][i:i + cfg.resume_obs]
    after = after[np.isfinite(after)]
    return bool(len(after)) and float(np.median(after)) <= base + cfg.resume_band * sigma


def _climb(main: dict[str, np.ndarray], before_step: int, cfg: AdviceConfig, lrc: LRConfig) -> int | None:
    """Start of an activation-norm climb into ``before_step`` (after the warm-up) that has multiplied the norm by
    ``cfg.act_climb_ratio`` by then: OPT's precursor. A small model's natural growth of tens of percent is no
    precursor, nor is growth that came with learning (``loss_fell_through``)."""
    steps, act = main["step"], main["act_norm"]
    start = _not_the_schedules(act_growth_start(steps, act, before_step), main, lrc)
    if start is None:
        return None
    i, j = int(np.searchsorted(steps, start)), int(np.searchsorted(steps, before_step))
    return start if precursor_grown(act, main["loss"], i, j, cfg) else None


def _not_the_schedules(growth: int | None, main: dict[str, np.ndarray], lrc: LRConfig) -> int | None:
    """An activation-norm climb that answers the schedule (``answers_the_schedule``: the opening warm-up, a warm
    restart) is not a precursor: walking back before it would skip every checkpoint of early training, or of each
    cycle."""
    if growth is None or "lr" not in main:
        return growth
    return None if answers_the_schedule(main["step"], main["lr"], growth, lrc) else growth


def _position(main: dict[str, np.ndarray], name: str, step: int) -> int | None:
    """Samples or tokens consumed at ``step``, interpolated between logged rows."""
    ok = main[name + "_present"] & np.isfinite(main[name])
    if ok.sum() < 2:
        return None
    return int(round(float(np.interp(step, main["step"][ok], main[name][ok]))))


def skip_window(ckpt_step: int | None, target: Finding, main: dict[str, np.ndarray],
                cfg: AdviceConfig) -> tuple[list[int], dict]:
    a = max((ckpt_step + 1) if ckpt_step is not None else 0, target.onset_step - cfg.replay_before)
    # A spike's batches run to its peak; for a divergence, NaN or collapse the peak is often the last
    # step logged, and the data near the onset is what to skip (the real fix is elsewhere).
    anchor = target.peak_step if target.kind == "spike" else target.onset_step
    b = max(anchor + cfg.skip_after, a + cfg.min_skip - 1)
    extra = {}
    for name in ("samples", "tokens"):
        lo, hi = _position(main, name, a - 1), _position(main, name, b)
        if lo is not None and hi is not None:
            extra[f"skip_{name}"] = [lo, hi]
    return [a, b], extra


def _target(findings: list[Finding]) -> Finding | None:
    """The earliest open finding that needs action now (recovered ones are history and do not count)."""
    actionable = [f for f in findings if f.open and f.needs_action and f.kind not in NO_ROLLBACK_KINDS]
    return min(actionable, key=lambda f: (f.onset_step, f.segment)) if actionable else None


def _abandoned_from(segment: int | None, segments: list[SegmentInfo]) -> float:
    """The first step of ``segment`` a later resume abandoned (the main-line cut), inf where none did."""
    seg = next((s for s in segments if s.segment == segment), None)
    return math.inf if seg is None or seg.abandoned_from is None else seg.abandoned_from


def _on_main_line(ckpt: dict, segments: list[SegmentInfo]) -> bool:
    """A checkpoint saved on a branch a later resume abandoned holds a state the main line never had."""
    return ckpt["step"] < _abandoned_from(ckpt.get("segment"), segments)


def _choose(checkpoints: list[dict], cutoff: int, main: dict[str, np.ndarray], findings: list[Finding],
            present_paths: set[str] | None, segments: list[SegmentInfo], cfg: AdviceConfig,
            lrc: LRConfig) -> tuple[dict | None, dict | None, list[dict], int]:
    """(chosen, the better one that is gone, rejected with reasons latest first, the final cutoff step)."""
    rejected, missing = [], None
    for ckpt in reversed([c for c in checkpoints if c["step"] < cutoff and _on_main_line(c, segments)]):
        if ckpt["step"] >= cutoff:  # a climb found on a later checkpoint moved the cutoff back
            rejected.append({"step": ckpt["step"], "why": f"after the activation-norm climb from step {cutoff}"})
            continue
        healthy, why, growth = _health(ckpt["step"], main, findings, segments, cfg, lrc)
        if not healthy:
            rejected.append({"step": ckpt["step"], "why": why})
            # The climb into a rejected checkpoint began at ``growth``: a checkpoint taken after that
            # point but too early in the climb to show it is no healthier. Walk back before it.
            if growth is not None:
                cutoff = min(cutoff, growth)
            continue
        gone = ckpt["deleted"] or (present_paths is not None and ckpt["path"] is not None and ckpt["path"] not in present_paths)
        if gone:
            missing = missing or ckpt
            rejected.append({"step": ckpt["step"], "why": "deleted (not retained or not on disk)"})
            continue
        return ckpt, missing, rejected, cutoff
    return None, missing, rejected, cutoff


def _actions(target: Finding, ckpt: dict | None, skip: list[int] | None, fp16: bool,
             suspects: list[Finding]) -> list[str]:
    where = f"checkpoint step {ckpt['step']} ({ckpt['path']})" if ckpt else "the earliest healthy state you have (no checkpoint qualifies)"
    if skip is None:  # a device's fault: the replicas read the same batches, and one of them computed wrong
        hosts = ", ".join(f"rank {f.rank}" + (f" on {f.host}" if f.host else "") for f in suspects)
        what, it = ("device", "it") if len(suspects) < 2 else ("devices", "them")
        return [f"restart from {where} without the suspect {what} ({hosts}): silent data corruption is suspected, "
                f"run a hardware check on {it}; the batches are not the cause, so skip none"]
    actions = [f"restart from {where} and skip batches {skip[0]}-{skip[1]}"]
    ev = target.evidence
    ratio, before, at = ev.get("lr_ratio"), ev.get("lr_before"), ev.get("lr_at_onset")
    if ev.get("lr_raised") and ratio and before and at:
        # ``lr_at_onset`` is the highest LR of the updates that made the excursion, up to its peak: a ramp's is
        # reached long after the onset (a user read "x2.34e+04 just before the onset (0.000567 -> 13.2)").
        actions.append(f"the learning rate rose x{ratio:.3g} into the excursion ({before:.3g} before it, {at:.3g} at "
                       "its highest): restore it before resuming")
    if target.kind == "divergence":
        lr_text = f" ({at:.3g} -> {at * 0.5:.3g})" if at and not ev.get("lr_raised") else ""
        actions.append(f"lower the learning rate x0.5{lr_text}")
        actions.append("tighten gradient clipping (e.g. max norm 1.0 -> 0.3)")
    if target.kind == "bad_resume":
        actions.append("the checkpoint you resumed from already held the damage: resume from the earlier one above")
    if target.kind in ("nan", "scaler_collapse") and fp16:
        actions.append("consider BF16 instead of FP16 (the fp16 loss scale could not absorb this)")
    elif target.kind == "nan":
        actions.append("inspect the skipped batches for corrupt data before resuming")
    return actions


def resume_hint(path: str | None, skip: list[int] | None) -> str:
    """The resume arguments in one form for every surface (CLI, JSON, dashboard), shell-quoted:
    a checkpoint path is text from a log, never a command."""
    parts = [f"--resume {shlex.quote(str(path))}"] if path else []
    if skip:
        parts.append(f"--skip-batches {int(skip[0])}-{int(skip[1])}")
    return " ".join(parts)


def last_healthy_step(steps: np.ndarray, onset: int) -> int:
    """The last logged step before the onset: the latest step known healthy.

    A checkpoint must lie strictly before it (``CONTRACT``): on a per-step log
    that is onset - 2; on a log written every k steps the fault began somewhere
    in (that row, onset], so a checkpoint saved in between may already hold it.
    """
    i = int(np.searchsorted(steps, onset, side="left"))
    return int(steps[i - 1]) if i > 0 else onset - 1


def old_lr_row(main: dict[str, np.ndarray], f: Finding, step: int, lrc: LRConfig) -> int | None:
    """The row before ``step`` where ``step`` is the first row to show the LR raise that finding ``f`` names as its
    cause (above the row before, or, for a ramp riding a decaying schedule, its log slope stepped up into it:
    ``divergence.slope_stepped_into``) and that row is still on the old LR's path; else None. The LR logged at step s
    is the one update s ran at, so every update up to that row ran at the old LR: its checkpoint is clean
    (``last_healthy_step`` itself, where the onset of a bad value alone excludes it; fresh seed 499698's run 039, a
    ramp on a linear decay first shown at 850 on a log every 10 steps, checkpoint 840 clean). On the path: not above
    the row before it, and fallen no more than the schedule fell on any of the ``kink_rows`` rows before (or under
    10%, ``lrc.flat``), as a cosine's coarse rows fall alike. A row that fell further, a schedule's step down, may
    hide the raise's first updates under the step (fresh seed 890668's run 045: x0.3 and x1.0134 a step from update
    1049 at once, the rise read from the next row)."""
    ev = f.evidence
    if "lr" not in main or not (ev.get("lr_raised") or ev.get("lr_rise_step") is not None
                                or ev.get("lr_step_up_step") is not None):
        return None
    i = int(np.searchsorted(main["step"], step))
    if not 1 < i < len(main["step"]) or main["step"][i] != step:
        return None
    lo = max(0, i - 2 - lrc.kink_rows)
    past, now = main["lr"][lo:i], main["lr"][i]
    if not (np.isfinite(past).all() and (past > 0).all() and now > 0):
        return None
    if not (now > past[-1] or slope_stepped_into(main["step"][lo:i + 1].astype(np.float64), main["lr"][lo:i + 1],
                                                 i - lo, lrc)):
        return None
    fall = -np.diff(np.log(past))  # each row's fall from the row before it; the last is the row before the raise's
    on_path = 0.0 <= fall[-1] <= max(math.log(lrc.flat), float(fall[:-1].max(initial=0.0)))
    return int(main["step"][i - 1]) if on_path else None


def _incident_onset(target: Finding, findings: list[Finding]) -> int:
    """Where the damage began: the earliest step of the onset's confidence set where the finding states one
    (``earliest_onset_step``: the advice must precede every step the change may have been at), or where the trend
    broke before it (``trend_break_step``: an unrecovered spike's LR cause, whose first consequence can precede the
    first loss the detector saw; fresh seed 160396's run 005, a burst first logged at 546, the loss flagged at 548
    and checkpoint 545 holding an update under the burst); a bad resume goes back to the incident its parent was
    rolled back for."""
    if target.kind != "bad_resume":
        ev = target.evidence
        return min(target.onset_step, int(ev.get("earliest_onset_step", target.onset_step)),
                   int(ev.get("trend_break_step") or target.onset_step))
    resumed = int(target.evidence.get("resume_step", target.onset_step - 1))
    earlier = [f.onset_step for f in findings if f.segment < target.segment and f.kind not in NO_ROLLBACK_KINDS
               and f.severity != "info" and f.onset_step <= resumed + 1 <= f.end_step + 1]
    return min(earlier + [resumed + 1])


def advise(findings: list[Finding], checkpoints: list[dict], main: dict[str, np.ndarray],
           present_paths: set[str] | None = None, segments: list[SegmentInfo] | None = None,
           config: AdviceConfig | None = None, lr_config: LRConfig | None = None) -> Rollback | None:
    """Rollback advice for the earliest open finding that needs action, or None when nothing does (``lr_config``:
    what counts as the schedule's LR, ``DetectorConfig.lr``)."""
    cfg = config or AdviceConfig()
    target = _target(findings)
    if target is None:
        return None
    onset = _incident_onset(target, findings)
    healthy_step = last_healthy_step(main["step"], onset)
    lrc = lr_config or LRConfig()
    cause = old_lr_row(main, target, onset, lrc) is not None  # then that row is healthy_step, and clean itself
    cutoff = healthy_step + 1 if cause else healthy_step  # checkpoints before the first update that may hold it
    evidence = {"finding": target.kind, "onset_step": target.onset_step, "incident_onset_step": onset,
                "last_healthy_step": healthy_step}
    growth = (_not_the_schedules(target.evidence.get("act_norm_climb_step"), main, lrc)
              or _climb(main, onset, cfg, lrc))
    if growth is not None and growth <= cutoff:
        cutoff, evidence["act_norm_growth_from"] = growth, growth
    chosen, missing, rejected, walked = _choose(checkpoints, cutoff, main, findings, present_paths, segments or [],
                                                cfg, lrc)
    if walked < cutoff:
        cutoff = evidence["act_norm_growth_from"] = walked
    skip, positions = skip_window(chosen["step"] if chosen else None, target, main, cfg) \
        if target.kind not in DEVICE_FAULT_KINDS else (None, {})
    evidence.update(positions)
    evidence["cutoff_step"] = cutoff
    evidence["rejected_checkpoints"] = rejected[:10]
    for key in ("lr_before", "lr_at_onset", "lr_ratio", "lr_raised"):
        evidence[key] = target.evidence.get(key)
    fp16 = bool(np.isfinite(main["loss_scale"]).any())
    suspects = sorted((f for f in findings if f.kind == target.kind and f.open and f.needs_action),
                      key=lambda f: (f.rank is None, f.rank))
    actions = _actions(target, chosen, skip, fp16, suspects)
    if "act_norm_growth_from" in evidence:
        before = f"before the activation-norm growth from step {evidence['act_norm_growth_from']}"
    else:
        before = (f"at or before step {healthy_step}, the last row at the old LR before its raise at step {onset},"
                  if cause else f"before step {healthy_step}, the last logged step before the onset at {onset}")
    if chosen:
        reason = (f"{target.message}. Checkpoint {chosen['step']} is the latest one {before} that is retained and "
                  f"healthy ({HEALTHY}); {CONTRACT_LR if cause else CONTRACT}.")
        evidence["resume_hint"] = resume_hint(chosen["path"], skip)
    else:
        reason = f"{target.message}. No retained, healthy checkpoint exists {before}."
    if missing:
        reason += f" The right checkpoint (step {missing['step']}, {missing['path']}) no longer exists."
        evidence["missing_checkpoint"] = {"step": missing["step"], "path": missing["path"]}
    return Rollback(checkpoint_step=chosen["step"] if chosen else None, checkpoint_path=chosen["path"] if chosen else None,
                    skip_batches=skip, actions=actions, reason=reason, evidence=evidence,
                    checkpoint_missing=missing is not None or chosen is None)
