"""Slowdowns: step time sustained above the run's own normal variability.

Judged on the log step time, whose trailing baseline counts the within-block
jitter and the between-block wander together (``BlockBaseline(wander=True)``):
a shared or preemptible host whose step time wanders 20-50% for tens of steps
has that wander in its sigma, so only what lies beyond it pages. Two rules
open a slowdown: ``min_obs`` observations in a row at least ``min_rise``
slower and ``z`` sigmas out (a sudden slow node), or a CUSUM of the clipped
residuals of observations at least ``min_rise`` slower passing ``cusum_h`` (a
moderate slowdown that lasts). It ends when two observations in a row are
back inside the band, unless it opens again within the wander's correlation
time (one slow spell). Its median is judged against the variability of a
median over as many observations: the wander averages down over a spell many
correlation times long. A slowdown never needs a rollback; it is a 'warning'
from ``warn_rise`` up and 'info' below (within a segment's first ``learn_steps``,
from ``host_wander`` up: ``severity``), and one under ``warn_rise`` must last
``min_small_steps`` training steps; any must span ``min_steps``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from runwatch.detectors.core import (
    BlockBaseline,
    Episode,
    Grow,
    LastZeros,
    cusum,
    first_run,
    safe_log,
    two_level_sse,
)
from runwatch.detectors.config import SlowdownConfig
from runwatch.detectors.finding import Finding, recovery_steps
from runwatch.detectors.scanner import Observations, ScanContext

SCAN_CHUNK = 32768
"""Observations scanned per pass (any chunking gives the same findings)."""
FOLLOW_PIECE = SCAN_CHUNK
"""Observations an episode's recovery is looked for in at a time (any size follows it to the same end)."""
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
        # A resumed segment's series starts with its parent's step times (``ctx.history``): baseline, not scanned.
        self.pos, self.s, self.zero, self.slow_run = ctx.history, 0.0, ctx.history - 1, 0
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
            raised = (lt - level) >= math.log1p(cfg.min_rise)  # NaN compares False
            slow = raised & (z > cfg.z)
        warm = np.isfinite(level)
        inc = np.where(warm & raised, np.minimum(np.nan_to_num(z, nan=0.0), self.winsor), 0.0) - cfg.cusum_k
        s = cusum(np.where(warm, inc, -1e6), self.s, self.zero, lo, with_zero=False)[0]
        zero = LastZeros(s, self.zero, lo)  # the change point, looked up at a trigger and the pass's end
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
                                       **self._variability(at, float(sc[0]))},
                               end=trigger, data={"last_slow": trigger})
        self.pos, self.slow_run = trigger + 1, 0

    def _variability(self, i: int, scale: float) -> dict:
        """The host's variability as known before observation i, from the block medians' autocorrelation
        rho (an AR(1) wander): its correlation time ``tau_obs`` = block (1 + rho) / (1 - rho) observations
        (rho at its upper bound),
        and ``scale_ucb``, the sigma raised by how uncertain it still is. A sigma is known to about
        1/sqrt(2 n_eff), with n_eff = n (1 - rho) / (1 + rho) the blocks seen discounted for their
        autocorrelation; a MAD doubles that, so 1 + 2 / sqrt(n_eff): a calm stretch early in a noisy host's
        run does not make its normal wander look like a slowdown. Under 3 normal blocks there is no lag-1 pair
        to measure the wander by: the variability is unknown and nothing is judged beyond it (fresh seed
        418024's run 113 opened a spell at step 9, over 8 observations of 2% jitter, and kept it open for the
        host's next 370 steps of ordinary wander)."""
        nb = min(i // self.cfg.block, self.base.med.size)
        lo = max(0, nb - self.cfg.wander_blocks)
        med = self.base.med.view[lo:nb]
        keep = np.isfinite(med)  # blocks of earlier slowdowns are not the host's normal wander
        if self.base.excluded.size:
            gone = np.zeros(len(med), bool)
            view = self.base.excluded.view[lo:nb]
            gone[:len(view)] = view
            keep &= ~gone
        if keep.sum() < 3:
            return {"scale_ucb": math.inf, "tau_obs": math.inf, "tau_join": 0.0}
        pair = keep[:-1] & keep[1:]  # lag-1 pairs of adjacent normal blocks
        x, y = med[:-1][pair], med[1:][pair]
        a, b = x - x.mean(), y - y.mean()
        denom = math.sqrt(float((a * a).sum() * (b * b).sum()))
        rho = min(max(float((a * b).sum()) / denom, 0.0), 0.99) if denom > 0 else 0.0
        n = int(keep.sum())
        n_eff = max(n * (1 - rho) / (1 + rho), 1.0)
        # The correlation time from an upper bound on rho (two standard errors of an AR(1) estimate,
        # sqrt((1 - rho^2) / n)): a wander measured over few blocks may be slower than it looked, and a
        # too-short tau would average it away. Spells are joined over the lower bound (a pause is called part
        # of a spell only when it is surely shorter than the wander's memory).
        se = 2.0 * math.sqrt((1 - rho * rho) / n)
        rho_hi, rho_lo = min(rho + se, 0.99), max(rho - se, 0.0)
        return {"scale_ucb": scale * (1.0 + 2.0 / math.sqrt(n_eff)),
                "tau_obs": self.cfg.block * (1 + rho_hi) / (1 - rho_hi),
                "tau_join": self.cfg.block * (1 + rho_lo) / (1 - rho_lo)}

    def _in_band(self, ep: Episode, lo: int, n: int) -> np.ndarray:
        """Which of observations lo..n-1 are back to normal: under ``min_rise`` slower or within the band."""
        lt = self.log_t.view[lo:n]
        with np.errstate(invalid="ignore"):
            return ((lt - ep.frozen["level"]) < math.log1p(self.cfg.min_rise)) | \
                ((lt - ep.frozen["level"]) / ep.frozen["scale"] <= Z_BAND)

    def _recovered_by(self, n: int) -> int:
        """The end of the first piece of ``FOLLOW_PIECE`` observations from ``pos`` in which the episode's in-band run
        completes, having begun from ``pos`` on (else ``n``): following it up to there ends it where following it
        to ``n`` would, without the rows after it."""
        carry = self.episode.carry
        for a in range(self.pos, n, FOLLOW_PIECE):
            b = min(n, a + FOLLOW_PIECE)
            start, carry = first_run(self._in_band(self.episode, a, b), RECOVERY_OBS, carry)
            if start < b - a:
                return b if a + start >= self.pos else n
        return n

    def _follow(self, n: int) -> None:
        ep, lo = self.episode, self.pos
        n = self._recovered_by(n)
        lt = self.log_t.view[lo:n]
        ok = self._in_band(ep, lo, n)
        start, ep.carry = first_run(ok, RECOVERY_OBS, ep.carry)
        # No row from the recovery's first on is a slow row of this episode; that row may lie in the last flush
        # (``start`` < 0), and a slice to a negative index would read this flush's later rows as the episode's.
        upto = max(min(start, len(ok)), 0)
        slow = np.flatnonzero(~ok[:upto] & np.isfinite(lt[:upto]))
        if len(slow):
            ep.data["last_slow"] = lo + int(slow[-1])
        if start < len(ok):
            ep.close(lo + start)
            self.closed.append(ep)
            last = lo + start + RECOVERY_OBS - 1
            if self._rise(ep, ep.end) is not None:
                # Only a slowdown leaves the baseline: a spell within the run's own variability is the host's
                # normal wander, which the baseline must learn (fresh seed 645321's run 002: a 20% wander at
                # step 12, over a baseline of 8 observations, kept every later block out of it, and the
                # host's next 50% wander paged against the first 8 steps' 2%).
                self.base.exclude(ep.onset, last)
            self.episode, self.pos, self.s, self.zero = None, last + 1, 0.0, last
            return
        ep.end, self.pos = n - 1, n

    def _rise(self, ep: Episode, end: int) -> float | None:
        """How much slower the spell from ``ep``'s onset to ``end`` ran than its baseline, or None where that is
        within the run's own variability. Judged as the CUSUM saw it, from where it began summing (the bars are
        calibrated so): the spell's median against the variability of a median over as many observations (the
        wander averages down once the spell outlasts its correlation time, never below one tau)."""
        span = np.exp(self.log_t.view[ep.onset:end + 1])
        rise = float(np.nanmedian(span)) / math.exp(ep.frozen["level"]) - 1
        n_obs = int(np.isfinite(span).sum())
        spread = ep.frozen["scale_ucb"] * math.sqrt(min(1.0, ep.frozen["tau_obs"] / max(n_obs, 1)))
        if rise < self.cfg.min_rise or math.log1p(rise) < self.cfg.min_sigmas * spread:
            return None
        return rise

    def findings(self, obs: Observations) -> list[Finding]:
        steps, step_time, cfg = obs["step"], obs["step_time"], self.cfg
        items = [(ep, True) for ep in self.closed] + ([(self.episode, None)] if self.episode else [])
        out = []
        for ep, end, recovered in _spells(items):
            rise = self._rise(ep, end)
            if rise is None:
                continue  # within the run's own variability (a noisy host wanders this much by itself)
            if rise < cfg.warn_rise and steps[end] - steps[ep.onset] + 1 < cfg.min_small_steps:
                continue  # a few percent for a few steps is machine jitter, not a slowdown
            if steps[end] - steps[ep.onset] + 1 < cfg.min_steps:
                continue  # a hiccup of a few steps (a GC pause, a noisy neighbour), not sustained
            onset = step_change(self.log_t.view, ep.onset, ep.trigger, end)
            base = math.exp(ep.frozen["level"])
            span = step_time[onset:end + 1]
            level = float(np.nanmedian(span))
            rise = level / base - 1
            peak = onset + int(np.nanargmax(span))
            took = recovery_steps(steps, onset, end + 1) if recovered else None
            evidence = {"baseline_step_s": base, "median_step_s": level, "rise": rise, "rule": ep.rule,
                        "variability_upper_bound": math.expm1(ep.frozen["scale_ucb"]),
                        "normal_variability": math.expm1(ep.frozen["scale"]),
                        "detected_step": int(steps[ep.trigger]), "recovery_steps": took}
            out.append(Finding(
                kind="slowdown", onset_step=int(steps[onset]), end_step=int(steps[end]), peak_step=int(steps[peak]),
                segment=self.ctx.segment, severity=severity(rise, int(steps[onset] - steps[0]),
                                                            int(steps[end] - steps[onset]) + 1, cfg),
                self_recovered=recovered, needs_action=False, evidence=evidence,
                message=_message(int(steps[onset]), evidence, recovered)))
        return out


def severity(rise: float, since_start: int, lasted: int, cfg: SlowdownConfig) -> str:
    """'warning' from ``warn_rise`` up, 'info' below. A spell ``since_start`` training steps into a segment,
    before ``learn_steps``, is a warning only beyond what a noisy host wanders by itself (``host_wander``): the
    run has not yet shown whether its host is one; unless it has ``lasted`` ``learn_steps`` (a wander lasts
    tens of steps, so a slow node early in a segment still pages once it has lasted that long)."""
    early = since_start < cfg.learn_steps and lasted < cfg.learn_steps
    bar = max(cfg.warn_rise, cfg.host_wander) if early else cfg.warn_rise
    return "warning" if rise >= bar else "info"


def _message(onset_step: int, ev: dict, recovered: bool | None) -> str:
    state = f"back to normal after {ev['recovery_steps']} steps" if recovered else "still slow at the last step"
    return (f"steps {_how_much_slower(ev['rise'])} from step {onset_step} ({ev['baseline_step_s']:.3g}s -> "
            f"{ev['median_step_s']:.3g}s per step, normal variability {ev['normal_variability']:.0%}); {state}")


def join_spells(slowdowns: list[Finding], spells: list[Finding], timed: np.ndarray) -> list[Finding]:
    """The slowdowns with each stall spell (``stall_spells``) that runs into one taken into it: a spell whose last
    slow interval ends fewer than ``RECOVERY_OBS`` timed rows (``timed``: their steps) before a slowdown's onset, as
    the slowdown rule itself ends a slowdown, is that slowdown's start, seen interval by interval before the slowdown
    rule's own bar was passed: one slow spell, one slowdown from the spell's onset (fresh seed 880457's run 111, 2.8x
    slower over 410-580 on a log every 10 steps: a stall spell 410-460 and a slowdown from 470; test 29)."""
    out, taken = [], set()
    for sd in slowdowns:
        runs_in = [i for i, sp in enumerate(spells) if i not in taken and sp.segment == sd.segment
                   and sp.onset_step < sd.onset_step
                   and np.searchsorted(timed, sd.onset_step) - np.searchsorted(timed, sp.end_step, "right")
                   < RECOVERY_OBS]
        if not runs_in:
            out.append(sd)
            continue
        taken.update(runs_in)
        onset = min(spells[i].onset_step for i in runs_in)
        ev = dict(sd.evidence, joined_stall_spell_from=onset)
        if ev.get("recovery_steps") is not None:
            ev["recovery_steps"] += sd.onset_step - onset
        message = _message(onset, ev, sd.self_recovered)
        out.append(dataclasses.replace(sd, onset_step=onset, evidence=ev, message=message))
    return out + [sp for i, sp in enumerate(spells) if i not in taken]


def _how_much_slower(rise: float) -> str:
    """"52% slower", or from twice as slow on "taking 25.8x as long" (a review read "2476% slower")."""
    return f"{rise:.0%} slower" if rise < 1 else f"taking {1 + rise:.3g}x as long"


def step_change(log_t: np.ndarray, lo: int, trigger: int, end: int) -> int:
    """Where the step time changed level, in [``lo``, ``trigger``]: the split of the log step times around them
    into two constant levels with the least squared error (the maximum-likelihood change point of a step in
    Gaussian noise), over as many observations before ``lo`` and after ``trigger`` as lie between them (4 at
    least). The CUSUM starts summing at the first raised observation, so a host's ordinary slow stretch just
    before a slow node joins its onset (seed 890695's run 018: a 40% wander from 337, the 3x node from 354);
    ``lo`` where any value is missing."""
    width = max(trigger - lo + 1, 4)
    first, hi = max(lo - width, 0), min(end, trigger + width) + 1
    x = log_t[first:hi]
    if trigger <= lo or lo == first or not np.isfinite(x).all():
        return lo
    k = np.arange(lo - first, trigger - first + 1)  # observations before the split: the change at lo .. trigger
    return first + int(k[np.argmin(two_level_sse(x, k))])


def stall_spells(stalls: list[Finding], cfg: SlowdownConfig,
                 timed: tuple[int, int]) -> tuple[list[Finding], list[Finding]]:
    """(the stalls left, the slowdowns they make): a stretch of stalls in consecutive logged intervals is no
    pause but a slow spell, by the slowdown's own rules: ``min_obs`` slow intervals in it, none separated by
    ``RECOVERY_OBS`` normal ones, spanning ``min_steps`` steps. On a coarse log a slowdown of factor f adds
    (f - 1) k steps' time to every interval of k steps, which the stall rule reads interval by interval; the
    slowdown rule itself may still call the same spell the host's wander when the log is short and its
    correlation time uncertain (fresh seed 880457's runs 089 and 111: 2.4-2.8x slower for 115-160 steps,
    logged every 5 and 10, read as 6 and 15 stalls and no slowdown). ``timed``: the segment's first and last timed
    rows' steps (a spell that reaches the last is still slow; one early in the segment is judged as ``severity``)."""
    out, spells, group = [], [], []
    for st in sorted(stalls, key=lambda f: f.onset_step) + [None]:
        if st is not None and group and st.segment == group[-1].segment and st.onset_step - group[-1].end_step \
                <= (RECOVERY_OBS - 1) * max(int(group[-1].evidence.get("num_steps", 1)), 1):
            group.append(st)
            continue
        if len(group) >= cfg.min_obs and group[-1].end_step - group[0].onset_step + 1 >= cfg.min_steps:
            spells.append(_stall_spell(group, cfg, timed))
        else:
            out += group
        group = [] if st is None else [st]
    return out, spells


def _stall_spell(group: list[Finding], cfg: SlowdownConfig, timed: tuple[int, int]) -> Finding:
    base = float(np.median([f.evidence["per_step_s"] for f in group]))
    per = [(f.evidence["gap_s"] - f.evidence.get("allowance_s", 0.0)) / max(f.evidence["num_steps"], 1) for f in group]
    level = float(np.median(per))
    rise = level / base - 1 if base > 0 else math.inf
    onset, end = group[0].onset_step, group[-1].end_step
    recovered = True if end < timed[1] else None
    return Finding(
        kind="slowdown", onset_step=onset, end_step=end, peak_step=group[int(np.argmax(per))].end_step,
        segment=group[0].segment, severity=severity(rise, onset - timed[0], end - onset + 1, cfg),
        self_recovered=recovered,
        needs_action=False,
        evidence={"baseline_step_s": base, "median_step_s": level, "rise": rise, "rule": "stall_spell",
                  "slow_intervals": len(group), "detected_step": group[cfg.min_obs - 1].end_step},
        message=f"steps {_how_much_slower(rise)} from step {onset} ({base:.3g}s -> {level:.3g}s per step over "
                f"{len(group)} slow logged intervals, each one past the stall rule); "
                + ("back to normal" if recovered else "still slow at the last step"))


def _spells(items: list[tuple[Episode, bool | None]]) -> list[tuple[Episode, int, bool | None]]:
    """Episodes as slow spells: (first episode, last slow observation, recovered). An episode that opens
    again within the wander's correlation time (``tau_join``, its lower bound) of the last one's last slow observation
    continues it: a host's state outlives a few observations back in band (a moderate slowdown near the
    band's edge dips in and out of it), so that pause is no evidence the slowdown ended."""
    spells: list[list] = []
    for ep, recovered in items:
        last = spells[-1] if spells else None
        if last is not None and ep.onset - last[1] <= last[0].frozen["tau_join"]:
            last[1], last[2] = ep.data["last_slow"], recovered
        else:
            spells.append([ep, ep.data["last_slow"], recovered])
    return [tuple(spell) for spell in spells]


def detect_slowdowns(steps: np.ndarray, step_time: np.ndarray, segment: int = 0,
                     config: object | None = None) -> list[Finding]:
    """Offline: sustained rises in step time over one segment's step-time observations."""
    from runwatch.detectors.config import DEFAULT

    obs = {"step": np.asarray(steps, dtype=np.int64), "step_time": np.asarray(step_time, dtype=np.float64)}
    scanner = SlowdownScanner(ScanContext(segment=segment, config=config or DEFAULT))
    scanner.advance(obs)
    return scanner.findings(obs)
