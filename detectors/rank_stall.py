"""Stalls per rank: which rank stopped, live from its heartbeat, or afterwards from where its time went.

In synchronous training a rank that stops stops everyone: the others block in
the next collective, so every rank's rows go silent together and silence alone
cannot name the culprit. Two things can:

- live, each rank's heartbeat (``Monitor`` writes ``heartbeat.json`` from its
  writer thread, from host values only): how far the rank got (its last step,
  and whether its next forward pass began or ended) and whether the process
  still beats at all. When every rank is silent, the ranks behind the others
  (or the one whose heartbeat stopped) hold the job; the others wait for them.
- afterwards (a pause that ended), the time each rank spent before the first
  collective of the steps in the gap: input wait plus forward pass. The rank
  whose pre-collective time covers the gap held the others up.

The rule itself is the README's (``stall.is_live_stall``): silent for more than
10x the expected wait and 5 minutes, beyond the longest known pause
(checkpoint write, evaluation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runwatch.detectors.config import StallConfig
from runwatch.detectors.finding import Finding
from runwatch.detectors.stall import duration, expected_wait, is_live_stall

PHASES: dict[str, int] = {"step": 0, "forward": 1, "backward": 2}
"""How far a rank got since its last recorded step: recorded it, began the next forward pass, finished it."""
PHASE_WORDS = {"step": "recorded the step", "forward": "in its next forward pass (input ready)",
               "backward": "past its next forward pass (in backward or a collective)"}


@dataclass(frozen=True)
class RankProgress:
    """What one rank of the latest segment shows of itself: its rows' steps and times, and its heartbeat."""

    rank: int
    steps: np.ndarray
    times: np.ndarray
    heartbeat: Mapping | None = None


def _last(p: RankProgress) -> tuple[int | None, float]:
    """(last step, time of the last sign of progress): the newest row, or a later heartbeat phase."""
    ok = np.isfinite(p.times)
    step = int(p.steps[ok][-1]) if ok.any() else None
    at = float(p.times[ok][-1]) if ok.any() else float("nan")
    hb = p.heartbeat or {}
    if isinstance(hb.get("phase_time"), (int, float)):
        at = float(hb["phase_time"]) if np.isnan(at) else max(at, float(hb["phase_time"]))
    if isinstance(hb.get("step"), int):
        step = hb["step"] if step is None else max(step, hb["step"])
    return step, at


def _key(p: RankProgress) -> tuple[int, int]:
    step, _ = _last(p)
    hb = p.heartbeat or {}
    phase = PHASES.get(str(hb.get("phase")), 0) if hb.get("step") == step else 0
    return (-1 if step is None else step, phase)


def _dead(p: RankProgress, now: float, cfg: StallConfig) -> bool:
    hb = p.heartbeat
    if not hb or not isinstance(hb.get("time"), (int, float)) or not isinstance(hb.get("every_s"), (int, float)):
        return False
    return now - float(hb["time"]) > cfg.dead_heartbeats * float(hb["every_s"])


def live_rank_stalls(ranks: Mapping[int, RankProgress], segment: int, now: float, cfg: StallConfig,
                     allowance: float = 0.0, hosts: Mapping[int, str] | None = None) -> list[Finding]:
    """Stalls in progress in the latest segment: one per rank that holds the job, or one for the whole run
    when every rank stopped alike (nothing tells them apart)."""
    live = {r: p for r, p in ranks.items() if (p.heartbeat or {}).get("phase") != "closed"}
    expected = {r: expected_wait(p.steps, p.times) for r, p in live.items()}
    known = [e for e in expected.values() if e is not None]
    if not known:
        return []
    silent, stepping = {}, set()
    for r, p in live.items():
        wait = expected[r] if expected[r] is not None else float(np.median(known))
        _, at = _last(p)
        if np.isfinite(at) and is_live_stall(now - at, wait, cfg, allowance):
            silent[r] = (now - at, wait)
        elif not np.isfinite(at) or now - at <= cfg.ratio * wait + allowance:
            stepping.add(r)
    if not silent:
        return []
    # A rank still inside its own rhythm progresses; one stopped by it but not yet past the live floor waits in
    # a collective: its last sign of progress (the forward pass it finished) came just after the holder's.
    if stepping:  # the others still progress: each silent rank is its own stall
        return [_finding(live[r], segment, *silent[r], allowance, [], now, hosts, live, cfg) for r in sorted(silent)]
    culprits = [r for r in _culprits(live, now, cfg) if r in silent]
    if not culprits:
        r = min(silent, key=lambda k: silent[k][0])
        return [_finding(live[r], segment, *silent[r], allowance, [], now, hosts, live, cfg, whole_run=True)]
    waiting = sorted(set(live) - set(culprits))
    return [_finding(live[r], segment, *silent[r], allowance, waiting, now, hosts, live, cfg) for r in culprits]


def _culprits(live: Mapping[int, RankProgress], now: float, cfg: StallConfig) -> list[int]:
    """The ranks holding the others: those whose heartbeat stopped while others beat, else those behind."""
    dead = [r for r, p in live.items() if _dead(p, now, cfg)]
    if dead and len(dead) < len(live):
        return sorted(dead)
    keys = {r: _key(p) for r, p in live.items()}
    if len(set(keys.values())) < 2:
        return []
    behind = min(keys.values())
    return sorted(r for r, k in keys.items() if k == behind)


def _finding(p: RankProgress, segment: int, silence: float, expected: float, allowance: float, waiting: list[int],
             now: float, hosts: Mapping[int, str] | None, live: Mapping[int, RankProgress], cfg: StallConfig,
             whole_run: bool = False) -> Finding:
    step, _ = _last(p)
    step = -1 if step is None else step
    progress = {str(r): _progress_words(q, now, cfg) for r, q in sorted(live.items())}
    evidence = {"silence_s": silence, "expected_s": expected, "allowance_s": allowance, "live": True,
                "progress": progress, "waiting_ranks": waiting, "not_responding": _dead(p, now, cfg),
                "detected_step": step}
    if whole_run:
        message = f"no new step for {duration(silence)} after step {step} (expected one every {duration(expected)})"
        if len(live) > 1:
            message += "; every rank stopped at the same point"
    else:
        host = (hosts or {}).get(p.rank)
        where = f"rank {p.rank}" + (f" ({host})" if host else "")
        message = (f"{where} has made no progress for {duration(silence)} after step {step} "
                   f"(expected a step every {duration(expected)}): {progress[str(p.rank)]}")
        if waiting:
            message += f"; rank(s) {', '.join(map(str, waiting))} wait for it"
    return Finding(kind="stall", onset_step=step, end_step=step, peak_step=step, segment=segment,
                   severity="critical", self_recovered=None, needs_action=True, evidence=evidence,
                   message=message, rank=None if whole_run else p.rank)


def _progress_words(p: RankProgress, now: float, cfg: StallConfig) -> str:
    step, at = _last(p)
    hb = p.heartbeat or {}
    words = PHASE_WORDS.get(str(hb.get("phase")), "recorded the step") if hb.get("step") == step else "recorded the step"
    out = f"step {step}: {words}" + (f" {duration(now - at)} ago" if np.isfinite(at) else "")
    if _dead(p, now, cfg):
        out += f"; its heartbeat stopped {duration(now - float(hb['time']))} ago (process not responding)"
    return out


def stall_holder(stall: Finding, rank_rows: Mapping[int, Mapping[str, np.ndarray]],
                 cfg: StallConfig) -> tuple[int | None, dict]:
    """The rank that held a finished stall (seen on every rank): whose input wait + forward pass over the
    stalled steps covers most of the stall's excess; (None, evidence) when no one rank explains it."""
    ev = stall.evidence
    excess = float(ev.get("gap_s", 0.0)) - float(ev.get("expected_s", 0.0)) - float(ev.get("allowance_s", 0.0) or 0.0)
    pre = {}
    for r, rows in rank_rows.items():
        at = (rows["step"] > stall.onset_step) & (rows["step"] <= stall.end_step)
        fwd, data = rows["forward_time"][at], rows["data_time"][at]
        pre[r] = float(np.nansum(np.where(np.isnan(fwd), 0.0, fwd) + np.where(np.isnan(data), 0.0, data)))
    if len(pre) < 2 or not excess > 0:
        return None, {}
    over = {r: v - float(np.median([w for k, w in pre.items() if k != r])) for r, v in pre.items()}
    holders = [r for r, v in over.items() if v >= cfg.holder_share * excess]
    evidence = {"pre_collective_s": {str(r): v for r, v in sorted(pre.items())}}
    return (holders[0], evidence) if len(holders) == 1 else (None, evidence)


def eval_seconds(events: list[Mapping]) -> dict[int, float]:
    """Evaluation time by step, from ``note`` events with ``kind: eval`` (``seconds``: its duration; NaN when
    not logged, so a stall check treats the interval as holding a pause of unknown length)."""
    out: dict[int, float] = {}
    for ev in events:
        if ev.get("event") != "note":
            continue
        payload = ev.get("payload")
        if isinstance(payload, str):
            try:
                payload = json.loads(payload)
            except ValueError:
                continue
        if not isinstance(payload, Mapping) or payload.get("kind") != "eval":
            continue
        seconds = payload.get("seconds")
        step = int(ev["step"])
        known = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and np.isfinite(seconds)
        out[step] = out.get(step, 0.0) + float(seconds) if known else float("nan")
    return out


def pause_seconds(checkpoint_seconds: Mapping[int, float], events: list[Mapping]) -> dict[int, float]:
    """Known pauses by step, that a stall check allows for: checkpoint writes plus evaluations."""
    out = dict(checkpoint_seconds)
    for step, seconds in eval_seconds(events).items():
        out[step] = out.get(step, 0.0) + seconds  # NaN (unknown) stays unknown
    return out


def longest_pause(pauses: Mapping[int, float]) -> float:
    """The longest known pause so far: what a live stall check must also wait out (a save may be running)."""
    known = [v for v in pauses.values() if np.isfinite(v)]
    return max(known, default=0.0)
