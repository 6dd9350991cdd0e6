"""Slowdowns: step time sustained above the run's own normal variability.

Judged on the log step time, whose trailing baseline counts the within-block
jitter and the between-block wander together (``BlockBaseline(wander=True)``):
a shared or preemptible host whose step time wanders 20-50% for tens of steps
has that wander in its sigma, so only what lies beyond it pages. Two rules
open a slowdown: ``min_obs`` observations in a row at least ``min_rise``
slower and ``z`` sigmas out (a sudden slow node), or a CUSUM of the clipped
residuals of observations at least ``min_rise`` slower passing ``cusum_h`` (a
moderate slowdown that lasts). It ends when two observations in a row are
back inside the band. A slowdown never needs a rollback; it is a 'warning'
from ``warn_rise`` up and 'info' below, and one under ``warn_rise`` must last
``min_small_obs`` observations; any must span ``min_steps`` training steps.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.core import (
    BlockBaseline,
    Episode,
    Grow,
    cusum,
    first_run,
    safe_log,
)
from runwatch.detectors.finding import Finding
from runwatch.detectors.scanner import Observations, ScanContext

SCAN_CHUNK = 32768
"""Observations scanned per pass (any chunking gives the same findings)."""
Z_BAND = 3.0
"""Back within 3 sigmas of the run's own variability (or under ``min_rise``) is back to normal."""
RECOVERY_OBS = 2
"""In-band observations in a row that end a slowdown (step time is often logged sparsely)."""


class SlowdownScanner:
    """Incremental over one segment's step-time observations."""

    def __init__(self, ctx: ScanContext) -> None:
        self.ctx, self.cfg = ctx, ctx.config.slowdown
        self.winsor = ctx.config.baseline.winsor
        self.base = BlockBaseline(block=self.cfg.block, window=self.cfg.window_blocks, min_blocks=2,
                                  rel_floor=0.0, abs_floor=0.005, follow_last=False, wander=True,
                                  wander_window=self.cfg.wander_blocks)
        self.log_t = Grow()
        self.pos, self.s, self.zero, self.slow_run = 0, 0.0, -1, 0
        self.episode: Episode | None = None
        self.closed: list[Episode] = []

    def advance(self, obs: Observations) -> None:
        n = len(obs["step_time"])
        if n <= self.pos:
            return
        self.log_t.extend(safe_log(obs["step_time"][self.log_t.size:n]))
        self.base.update(self.log_t.view)
        while self.pos < n:
            if self.episode is not None:
                self._follow(n)
            else:  # in chunks, so a trigger early on does not pay for baselines up to the end
                self._scan(min(n, self.pos + SCAN_CHUNK))

    def _scan(self, n: int) -> None:
        lo, cfg = self.pos, self.cfg
        level, scale = self.base.at(lo, n)
        lt = self.log_t.view[lo:n]
        with np.errstate(invalid="ignore"):
            z = (lt - level) / scale
            raised = np.nan_to_num(lt - level, nan=-np.inf) >= math.log1p(cfg.min_rise)
            slow = raised & (np.nan_to_num(z, nan=-np.inf) > cfg.z)
        warm = np.isfinite(level)
        inc = np.where(warm & raised, np.minimum(np.nan_to_num(z, nan=0.0), self.winsor), 0.0) - cfg.cusum_k
        s, zero = cusum(np.where(warm, inc, -1e6), self.s, self.zero, lo)
        # Runs of min_obs slow observations in a row, counting the slow ones carried from the last call.
        ext = np.concatenate([np.ones(self.slow_run, bool), slow])
        csum = np.concatenate([[0], np.cumsum(ext)])
        m = cfg.min_obs
        runs = np.flatnonzero(csum[m:] - csum[:-m] == m) + m - 1 - self.slow_run if len(ext) >= m else np.array([], int)
        hits = np.union1d(runs[runs >= 0], np.flatnonzero(s > cfg.cusum_h))
        if not len(hits):
            quiet = np.flatnonzero(~slow)
            self.slow_run = min(n - lo - (int(quiet[-1]) + 1), m - 1) if len(quiet) else min(self.slow_run + n - lo, m - 1)
            self.s, self.zero, self.pos = float(s[-1]), int(zero[-1]), n
            return
        j = int(hits[0])
        trigger = lo + j
        quiet = np.flatnonzero(~slow[:j + 1])
        run_start = lo + int(quiet[-1]) + 1 if len(quiet) else lo - self.slow_run
        onset = min(run_start, int(zero[j]) + 1) if s[j] > cfg.cusum_h else run_start
        at = max(onset, 0)
        lv, sc = self.base.at(at, at + 1)
        if not np.isfinite(lv[0]):
            lv, sc = self.base.at(trigger, trigger + 1)
        self.episode = Episode(onset=at, trigger=trigger, rule="cusum" if s[j] > cfg.cusum_h else "shewhart",
                               frozen={"level": float(lv[0]), "scale": float(sc[0]),
                                       "scale_ucb": float(sc[0]) * self._uncertainty(at)},
                               end=trigger, data={"last_slow": trigger})
        self.pos, self.slow_run = trigger + 1, 0

    def _uncertainty(self, i: int) -> float:
        """How much the variability measured before observation i may understate the host's: its sigma is
        known to about 1/sqrt(2 n_eff), with n_eff the blocks seen discounted for their autocorrelation
        (n (1 - rho) / (1 + rho) for an AR(1) wander); a MAD doubles that. So 1 + 2 / sqrt(n_eff): a calm
        stretch early in a noisy host's run does not make its normal wander look like a slowdown."""
        med = self.base.med.view[:i // self.cfg.block][-self.cfg.wander_blocks:]
        med = med[np.isfinite(med)]
        if len(med) < 3:
            return 3.0
        a, b = med[:-1] - med[:-1].mean(), med[1:] - med[1:].mean()
        denom = math.sqrt(float((a * a).sum() * (b * b).sum()))
        rho = min(max(float((a * b).sum()) / denom, 0.0), 0.99) if denom > 0 else 0.0
        n_eff = max(len(med) * (1 - rho) / (1 + rho), 1.0)
        return 1.0 + 2.0 / math.sqrt(n_eff)

    def _follow(self, n: int) -> None:
        ep, lo = self.episode, self.pos
        lt = self.log_t.view[lo:n]
        with np.errstate(invalid="ignore"):
            ok = ((lt - ep.frozen["level"]) < math.log1p(self.cfg.min_rise)) | \
                ((lt - ep.frozen["level"]) / ep.frozen["scale"] <= Z_BAND)
        start, ep.carry = first_run(ok, RECOVERY_OBS, ep.carry)
        upto = min(start, len(ok))
        slow = np.flatnonzero(~ok[:upto] & np.isfinite(lt[:upto]))
        if len(slow):
            ep.data["last_slow"] = lo + int(slow[-1])
        if start < len(ok):
            ep.close(lo + start)
            self.closed.append(ep)
            last = lo + start + RECOVERY_OBS - 1
            self.base.exclude(ep.onset, last)
            self.episode, self.pos, self.s, self.zero = None, last + 1, 0.0, last
            return
        ep.end, self.pos = n - 1, n

    def findings(self, obs: Observations) -> list[Finding]:
        steps, step_time, cfg = obs["step"], obs["step_time"], self.cfg
        items = [(ep, True) for ep in self.closed] + ([(self.episode, None)] if self.episode else [])
        out = []
        for ep, recovered in items:
            end = ep.data["last_slow"]
            span = step_time[ep.onset:end + 1]
            base = math.exp(ep.frozen["level"])
            level = float(np.nanmedian(span))
            rise = level / base - 1
            if rise < cfg.min_rise or math.log1p(rise) < cfg.min_sigmas * ep.frozen["scale_ucb"]:
                continue  # within the run's own variability (a noisy host wanders this much by itself)
            if rise < cfg.warn_rise and end - ep.onset + 1 < cfg.min_small_obs:
                continue  # a few percent for a few observations is machine jitter, not a slowdown
            if steps[end] - steps[ep.onset] + 1 < cfg.min_steps:
                continue  # a hiccup of a few steps (a GC pause, a noisy neighbour), not sustained
            peak = ep.onset + int(np.nanargmax(span))
            state = "back to normal" if recovered else "still slow at the last step"
            out.append(Finding(
                kind="slowdown", onset_step=int(steps[ep.onset]), end_step=int(steps[end]), peak_step=int(steps[peak]),
                segment=self.ctx.segment, severity="warning" if rise >= cfg.warn_rise else "info",
                self_recovered=recovered, needs_action=False,
                evidence={"baseline_step_s": base, "median_step_s": level, "rise": rise, "rule": ep.rule,
                          "variability_upper_bound": math.expm1(ep.frozen["scale_ucb"]),
                          "normal_variability": math.expm1(ep.frozen["scale"]),
                          "detected_step": int(steps[ep.trigger])},
                message=f"steps {rise:.0%} slower from step {int(steps[ep.onset])} "
                        f"({base:.3g}s -> {level:.3g}s per step, normal variability "
                        f"{math.expm1(ep.frozen['scale']):.0%}); {state}"))
        return out


def detect_slowdowns(steps: np.ndarray, step_time: np.ndarray, segment: int = 0,
                     config: object | None = None) -> list[Finding]:
    """Offline: sustained rises in step time over one segment's step-time observations."""
    from runwatch.detectors.config import DEFAULT

    obs = {"step": np.asarray(steps, dtype=np.int64), "step_time": np.asarray(step_time, dtype=np.float64)}
    scanner = SlowdownScanner(ScanContext(segment=segment, config=config or DEFAULT))
    scanner.advance(obs)
    return scanner.findings(obs)
