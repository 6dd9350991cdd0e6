"""Stragglers: the rank that holds every step back.

Synchronous training makes every rank's step equally long, so step time
cannot say who is slow: the fast ranks wait inside the all-reduce for the slow
one. What differs is the time each rank needs before it can join the first
collective: its input wait (``data_time``) plus its forward pass
(``forward_time``), which has no collective in it. ``Monitor`` records both
per step and rank.

Per block of ``block`` steps that every rank logged, each rank's median of
that pre-collective time is compared with the median of the other ranks'
medians. A rank is slow in a block when its excess costs at least
``min_cost`` of the step time (every rank waits for it, every step) and is
``z`` standard errors of the difference of two block medians past chance. A
straggler is ``persist_blocks`` slow blocks in a row, dated from the first
slow block of their stretch (slow blocks fewer than ``recovery_blocks``
normal ones apart); it ends after ``recovery_blocks`` normal ones. The evidence also carries
nvidia-resiliency-ext's relative score (the fastest rank's median over this
rank's; below 0.75 it calls a straggler) so the two can be compared. Only
complete blocks are judged, so streaming equals offline.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from runwatch.detectors.core import MAD_TO_SIGMA
from runwatch.detectors.finding import Finding
from runwatch.detectors.scanner import Observations, ScanContext

MEDIAN_SE = 1.2533
"""Standard error of a sample median over that of the mean, for normal data: sqrt(pi / 2)."""


@dataclass
class _Episode:
    first_block: int
    detected_block: int
    last_slow_block: int
    costs: list[float] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)
    quiet: int = 0


def _pre_collective(obs: Observations, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input wait + forward, forward, input wait) per step and rank over rows lo..hi; NaN where not timed."""
    fwd = obs["forward_time"][lo:hi]
    data = obs["data_time"][lo:hi]
    # The first step of a segment has no input wait (nothing before it): count its forward alone.
    return fwd + np.where(np.isnan(data), 0.0, data), fwd, data


def _block_stats(values: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column: the median and the standard error of that median (robust sigma from the MAD)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column (a rank not timed) stays NaN
        med = np.nanmedian(values, axis=0)
        mad = np.nanmedian(np.abs(values - med), axis=0)
        n = np.sum(np.isfinite(values), axis=0)
        sigma = np.maximum(MAD_TO_SIGMA * mad, floor * np.abs(med))
        return med, MEDIAN_SE * sigma / np.sqrt(np.maximum(n, 1))


def _step_seconds(obs: Observations, lo: int, hi: int) -> float:
    """The block's wall time per step (the same on every rank of a synchronous job): median over ranks."""
    steps, times = obs["step"][lo:hi], obs["time"][lo:hi]
    if hi - lo < 2:
        return float("nan")
    with np.errstate(all="ignore"):
        per = np.diff(times, axis=0) / np.diff(steps)[:, None]
    per = per[np.isfinite(per) & (per > 0)]
    return float(np.median(per)) if per.size else float("nan")


class StragglerScanner:
    """Incremental over one segment's steps that every rank logged (series 'ranks')."""

    def __init__(self, ctx: ScanContext) -> None:
        self.segment, self.cfg = ctx.segment, ctx.config.straggler
        self.num_blocks = 0
        self.runs: dict[int, _Episode] = {}  # column -> the current stretch of slow blocks, not yet an episode
        self.open: dict[int, _Episode] = {}
        self.closed: list[tuple[int, _Episode]] = []

    def advance(self, obs: Observations) -> None:
        if "forward_time" not in obs or len(obs["rank"]) < 2:
            return  # nothing to compare a lone rank with
        block = self.cfg.block
        while (self.num_blocks + 1) * block <= len(obs["step"]):
            self._judge(obs, self.num_blocks)
            self.num_blocks += 1

    def _judge(self, obs: Observations, b: int) -> None:
        """One complete block: which columns (ranks) were slow in it, and the episodes that follows."""
        cfg, lo, hi = self.cfg, b * self.cfg.block, (b + 1) * self.cfg.block
        pre, fwd, data = _pre_collective(obs, lo, hi)
        med, se = _block_stats(pre, cfg.rel_noise_floor)
        step_s = _step_seconds(obs, lo, hi)
        num_ranks = pre.shape[1]
        for j in range(num_ranks):
            others = [k for k in range(num_ranks) if k != j and np.isfinite(med[k])]
            slow, detail = False, None
            if others and np.isfinite(med[j]) and np.isfinite(step_s) and step_s > 0:
                ref = float(np.median(med[others]))
                se_ref = float(np.median(se[others])) / np.sqrt(len(others))
                excess = float(med[j]) - ref
                z = excess / max(float(np.hypot(se[j], se_ref)), 1e-12)
                cost = excess / step_s
                slow = cost >= cfg.min_cost and z >= cfg.z
                detail = {"block": b, "rank_s": float(med[j]), "others_s": ref, "excess_s": excess, "cost": cost, "z": z,
                          "step_s": step_s, "score": float(np.nanmin(med)) / float(med[j]) if med[j] > 0 else None,
                          "section": _section(fwd[:, j], data[:, j], fwd[:, others], data[:, others])}
            self._update(j, b, slow, detail)

    def _update(self, j: int, b: int, slow: bool, detail: dict | None) -> None:
        """Follow column j's slow blocks. A stretch of them ends after ``recovery_blocks`` normal ones, whether
        it is an episode yet or not: one block in which a neighbour's burst slowed the others too (a loaded CI
        machine had one) does not move the onset of the slow stretch that goes on after it. A stretch becomes
        an episode, dated from its first slow block, once ``persist_blocks`` of them come in a row."""
        ep = self.open.get(j) or self.runs.get(j)
        if not slow:
            if ep is not None:
                ep.quiet += 1
                if ep.quiet >= self.cfg.recovery_blocks and j in self.open:
                    self.closed.append((j, self.open.pop(j)))
                elif ep.quiet >= self.cfg.recovery_blocks:
                    del self.runs[j]
            return
        if ep is None:
            ep = self.runs[j] = _Episode(first_block=b, detected_block=b, last_slow_block=b)
        ep.last_slow_block, ep.quiet = b, 0
        ep.costs.append(detail["cost"])
        ep.details.append(detail)
        recent = [d["block"] for d in ep.details[-self.cfg.persist_blocks:]]
        if j in self.runs and recent == list(range(b - self.cfg.persist_blocks + 1, b + 1)):
            ep.detected_block = b
            self.open[j] = self.runs.pop(j)

    def findings(self, obs: Observations) -> list[Finding]:
        steps, ranks, block = obs["step"], obs["rank"], self.cfg.block
        items = [(j, ep, True) for j, ep in self.closed] + [(j, ep, False) for j, ep in sorted(self.open.items())]
        return [self._finding(int(ranks[j]), ep, recovered, steps, block) for j, ep, recovered in items]

    def _finding(self, rank: int, ep: _Episode, recovered: bool, steps: np.ndarray, block: int) -> Finding:
        cfg = self.cfg
        cost = float(np.median(ep.costs))
        peak_block = ep.details[int(np.argmax(ep.costs))]["block"]
        mid = ep.details[len(ep.details) // 2]
        scores = [d["score"] for d in ep.details if d["score"] is not None]
        section = max(("forward", "input wait"), key=[d["section"] for d in ep.details].count)
        onset, end = int(steps[ep.first_block * block]), int(steps[ep.last_slow_block * block + block - 1])
        evidence = {"cost": cost, "rank_s": float(np.median([d["rank_s"] for d in ep.details])),
                    "others_s": float(np.median([d["others_s"] for d in ep.details])),
                    "excess_s": float(np.median([d["excess_s"] for d in ep.details])),
                    "step_s": float(np.median([d["step_s"] for d in ep.details])), "z": float(mid["z"]),
                    "section": section, "score": min(scores) if scores else None,
                    "anchor_flags": bool(scores and min(scores) < cfg.anchor_score),
                    "num_blocks": len(ep.costs), "detected_step": int(steps[ep.detected_block * block + block - 1])}
        state = "back in step with the others" if recovered else "still slow at the last block"
        message = (f"rank {rank} holds every step back from step {onset}: {evidence['rank_s'] * 1e3:.3g} ms of "
                   f"{section} before the first collective vs {evidence['others_s'] * 1e3:.3g} ms on the other "
                   f"ranks, {cost:.0%} of each {evidence['step_s'] * 1e3:.3g} ms step lost; {state}")
        return Finding(kind="straggler", onset_step=onset, end_step=end,
                       peak_step=int(steps[peak_block * block]), segment=self.segment,
                       severity="warning" if cost >= cfg.warn_cost else "info", self_recovered=recovered,
                       needs_action=False, evidence=evidence, message=message, rank=rank)


def _section(fwd: np.ndarray, data: np.ndarray, fwd_others: np.ndarray, data_others: np.ndarray) -> str:
    """Where the excess lies: the forward pass (a slow device) or the input wait (a slow host or loader)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no input wait timed: NaN
        fwd_excess = np.nanmedian(fwd) - np.nanmedian(np.nanmedian(fwd_others, axis=0))
        data_excess = np.nanmedian(data) - np.nanmedian(np.nanmedian(data_others, axis=0))
    if not np.isfinite(data_excess) or (np.isfinite(fwd_excess) and fwd_excess >= data_excess):
        return "forward"
    return "input wait"
