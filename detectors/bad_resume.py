"""A resume that did not restore a healthy state: the new segment starts far above its parent's level.

A resumed segment carries its parent's healthy history (the parent's loss
observations up to the resume step, outside any of the parent's findings) as
the leading observations of its series. If the median of its own first
``first_obs`` observations lies ``z`` of the parent's sigmas and ``min_rise``
above the parent's level there (a non-finite loss counts as infinitely far),
the checkpoint it loaded already held the damage: a ``bad_resume`` that needs
action, whose advice is an earlier checkpoint. Unless the first of them, the
loaded state's own loss, is back in the parent's band: then the damage came
from the updates after the resume, not from the checkpoint.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.core import MAD_TO_SIGMA, block_stats
from runwatch.detectors.finding import Finding
from runwatch.detectors.scanner import Observations, ScanContext


class BadResumeScanner:
    """Judges the first observations of a resumed segment against the parent's history."""

    def __init__(self, ctx: ScanContext) -> None:
        self.ctx, self.cfg = ctx, ctx.config.bad_resume
        self.block = ctx.config.baseline.block
        self.window = ctx.config.baseline.window_blocks
        self.verdict: Finding | None = None
        self.judged = ctx.history == 0  # nothing to compare with without a parent

    def advance(self, obs: Observations) -> None:
        h, k = self.ctx.history, self.cfg.first_obs
        if self.judged or len(obs["loss"]) < h + k:
            return
        self.judged = True
        parent = obs["loss"][:h]
        parent = parent[np.isfinite(parent)]
        usable = len(parent) // self.block * self.block
        if usable < 2 * self.block:
            return
        med, mad = block_stats(parent[-usable:].reshape(-1, self.block)[-self.window:])
        level, sigma = float(np.median(med)), max(MAD_TO_SIGMA * float(np.median(mad)), 1e-3 * abs(float(np.median(med))))
        first = obs["loss"][h:h + k]
        head = float(np.median(np.where(np.isfinite(first), first, np.inf)))
        z = (head - level) / sigma
        # An infinite gradient norm alone is no sign: a resumed fp16 scaler re-calibrates and skips its first steps.
        if not (z > self.cfg.z and head - level >= self.cfg.min_rise * abs(level)):
            return
        # The first loss after the resume is the loaded state's own (computed before the first resumed update on a
        # per-step log): back in the parent's band, the state was healthy and the updates since made the damage (a
        # restored optimizer carrying a raised LR: an excursion of the new segment, judged with its LR story).
        own = obs["loss"][h]
        if math.isfinite(own) and (own - level) / sigma <= self.ctx.config.spike.z_band:
            return
        steps = obs["step"]
        resumed = self.ctx.resume_step if self.ctx.resume_step is not None else int(steps[h - 1])
        evidence = {"resume_step": resumed, "parent_loss": level, "parent_sigma": sigma,
                    "first_loss_median": head if math.isfinite(head) else None, "z": z if math.isfinite(z) else None,
                    "detected_step": int(steps[h + k - 1])}
        message = (f"the resume from step {resumed} did not restore a healthy state: its first {k} losses sit at "
                   f"{head:.4g} against {level:.4g} before the checkpoint; the checkpoint already held the damage")
        self.verdict = Finding(kind="bad_resume", onset_step=int(steps[h]), end_step=int(steps[h + k - 1]),
                               peak_step=int(steps[h + int(np.nanargmax(np.where(np.isfinite(first), first, np.inf)))]),
                               segment=self.ctx.segment, severity="critical", self_recovered=False,
                               needs_action=True, evidence=evidence, message=message)

    def findings(self, obs: Observations) -> list[Finding]:
        return [self.verdict] if self.verdict is not None else []
