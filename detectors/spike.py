"""Loss spikes: the loss (and the gradient norm) leave their trend, then come back or not.

Two rules open an excursion, the classic combined chart (Montgomery):
- Shewhart: one observation past ``z_trigger`` robust sigmas (loss, or the log
  gradient norm with at least ``grad_min_ratio`` x), or past the run's own
  extreme-value tail at ``tail_risk`` when that is higher;
- CUSUM: the residuals, clipped at ``winsor`` sigmas, summing past
  ``cusum_h`` above ``cusum_k``: a small shift that lasts (a few steps of
  raised LR lifting the loss 3 sigma for 20 steps sums to ~50); and a second
  CUSUM of the same residuals above ``burst_k`` past ``burst_h`` for a short
  burst (a bad batch of a few steps at 4-6 sigma: Lorden's bank of CUSUMs,
  one per size of shift worth catching), which notes three rows near the clip
  and counts as lasting only past ``burst_lasted_h``.
Onset is the first observation of the elevated run (either signal: BLOOM's
gradient norm moved first), or the CUSUM's change point; where the alarm came
only after an LR raise off the schedule, and the rows before the raise carry
no lift of their own, the raise's first consequence. The baseline is frozen
where the statistics dated the change; the excursion ends when the loss (and,
for one the gradient norm led, the gradient norm) stays inside the band of the pre-onset
trend carried forward for ``recovery_obs`` observations, however late: the
finding records ``recovery_steps`` and the ``lasting_cost`` (how far above the
projected trend the loss stays afterwards).

Severity: one or two far-out observations that came straight back are 'info'
(a bad batch, a gradient-norm blip: outside the alarm budget), and so is a
short burst under ``burst_lasted_h``; an excursion
that persisted is a 'warning'; one still out after ``patience_obs``
observations, or that came back with a lasting cost, is 'critical' and needs
action. An excursion that follows the LR returning to a level the run
already trained at (a warm restart) is the schedule: 'info'.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from runwatch.detectors.config import LRConfig, SpikeConfig
from runwatch.detectors.core import (
    MAD_TO_SIGMA,
    BlockBaseline,
    Episode,
    Grow,
    LastZeros,
    block_stats,
    cusum,
    first_run,
    nan_low,
    safe_log,
)
from runwatch.detectors.divergence import (
    LR_BEFORE_ROWS,
    cause_start,
    climb_se,
    fell_into,
    first_consequence,
    held_rows,
    in_warmup,
    lr_before,
    lr_burst_shifts,
    lr_jump_inside,
    lr_raise_inside,
    lr_rise_start,
    lr_step_before,
    raise_after,
    restart_before,
    trained_level,
    warmup_end,
    warmup_resumed_end,
)
from runwatch.detectors.finding import Finding, fmt_value, recovery_steps
from runwatch.detectors.scanner import Observations, ScanContext, own_findings

SCAN_CHUNK = 32768
"""Most observations scanned or followed per pass (any chunking gives the same findings)."""
FIRST_CHUNK = 1024
"""The first pass after an episode opens or ends: most episodes end, and most triggers come, within a few
hundred observations, and baselines and residuals computed past them would be thrown away. Each pass
doubles the next, up to ``SCAN_CHUNK``."""


class SpikeScanner:
    """Incremental spike detection over one segment's loss observations."""

    def __init__(self, ctx: ScanContext) -> None:
        self.ctx, self.cfg, base = ctx, ctx.config.spike, ctx.config.baseline
        kw = dict(block=base.block, window=base.window_blocks, min_blocks=base.min_blocks)
        # The scale (within-block noise, any trend inside a block differenced away, and the wander) from blocks
        # of ``block``; the level from a finer grain: the median of the last few small blocks, so a falling
        # loss is followed within a few observations and a dip of one block does not carry it away.
        noise = dict(follow_last=False, detrend=True, wander_window=base.wander_blocks, follow_rising_noise=True)
        self.loss_base = BlockBaseline(rel_floor=1e-3, abs_floor=1e-12, **noise, **kw)
        self.grad_base = BlockBaseline(rel_floor=0.0, abs_floor=0.02, **noise, **kw)
        fine = dict(block=base.level_block, window=base.level_window, min_blocks=2, follow_last=False, level_only=True)
        self.loss_level = BlockBaseline(rel_floor=0.0, abs_floor=0.0, **fine)
        self.grad_level = BlockBaseline(rel_floor=0.0, abs_floor=0.0, **fine)
        self.cold_obs = base.min_blocks * base.block
        self.cold_window = base.level_block * base.level_window
        self.winsor, self.tail_blocks = base.winsor, base.tail_min_blocks
        self.pos = ctx.history
        self.floor = ctx.history  # no excursion may begin before this (the history, the last episode's end)
        # The CUSUM bank: (reference value, decision interval, rule) and each one's sum and last zero.
        self.bank = ((self.cfg.cusum_k, self.cfg.cusum_h, "cusum"), (self.cfg.burst_k, self.cfg.burst_h, "burst"))
        self.s, self.zero = [0.0] * len(self.bank), [ctx.history - 1] * len(self.bank)
        self.streak: int | None = None  # start of the elevated run that reaches pos - 1
        self.episode: Episode | None = None
        self.closed: list[Episode] = []
        self.log_grad, self.coord = Grow(), Grow()
        self.chunk = FIRST_CHUNK
        self._noted = ctx.history  # observations whose residuals the tail has seen

    # -- scanning -----------------------------------------------------------------------------

    def advance(self, obs: Observations) -> None:
        loss, n = obs["loss"], len(obs["loss"])
        if n <= self.pos:
            return
        self.log_grad.extend(safe_log(obs["grad_norm"][self.log_grad.size:n]))
        for a in range(self.coord.size, n, SCAN_CHUNK):  # in pieces: a 1M-step segment's temporaries stay small
            self.coord.extend(np.log1p(np.maximum(obs["step"][a:min(n, a + SCAN_CHUNK)], 0)).astype(np.float64))
        self.loss_base.update(loss, self.coord.view)
        self.grad_base.update(self.log_grad.view, self.coord.view)
        self.loss_level.update(loss)
        self.grad_level.update(self.log_grad.view)
        while self.pos < n:
            hi = min(n, self.pos + self.chunk)
            self.chunk = min(2 * self.chunk, SCAN_CHUNK)
            if self.episode is not None:
                self._follow(obs, hi)
            else:
                self._scan(obs, hi)

    def _baselines(self, loss: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        """Loss and log-grad level and scale for lo..hi-1, and where a real (not cold) baseline exists."""
        level, scale = self.loss_level.level_at(lo, hi), self.loss_base.scale_at(lo, hi)
        glevel, gscale = self.grad_level.level_at(lo, hi), self.grad_base.scale_at(lo, hi)
        level = np.where(np.isfinite(scale), level, np.nan)  # warm once the noise is known
        glevel = np.where(np.isfinite(gscale), glevel, np.nan)
        warm = np.isfinite(level)
        if not warm.all():
            level, scale, glevel, gscale = (a.copy() for a in (level, scale, glevel, gscale))
            cfg = self.cfg
            for i in np.flatnonzero(~warm) + lo:
                # Cold: the median of the last observations (as many as the level's window), with a scale that
                # puts z_trigger at a gross rise, so only what a person sees at once counts before a noise model
                # exists (recent ones: a warm-up's norms climb far from the first observations' median); or the
                # spread the last observations already show, where it is wider (``cold_spread``): a 50% rise is a
                # batch-2 run's everyday noise. The noise carries over a resume (its parent's rows count); the
                # level is the segment's own.
                for x, lv, sc, log in ((loss, level, scale, False), (self.log_grad.view, glevel, gscale, True)):
                    prior = x[max(self.ctx.history, i - self.cold_window):i]
                    prior = prior[np.isfinite(prior)]
                    if len(prior) and not np.isfinite(lv[i - lo]):
                        m = float(np.median(prior))
                        lv[i - lo] = m
                        rise = math.log(cfg.cold_grad_ratio) if log else cfg.cold_loss_rise * abs(m)
                        near = x[max(0, i - self.cold_window):i]
                        spread = cold_spread(near[np.isfinite(near)], cfg.cold_spread_obs)
                        sc[i - lo] = max(rise / cfg.z_trigger, spread, 1e-12)
        return level, scale, glevel, gscale, warm

    def _frozen_baselines(self, loss: np.ndarray, lo: int, n: int) -> tuple[np.ndarray, ...]:
        """Baselines for lo..n-1, frozen inside an excursion at its first observation: the excursion's own
        first values must not widen the noise the rest of it is judged against (protect the detector)."""
        level, scale, glevel, gscale, warm = self._baselines(loss, lo, n)
        total_l, total_g = self.loss_base.total_scale(lo, n), self.grad_base.total_scale(lo, n)
        cols = [level, scale, glevel, gscale, total_l, total_g]
        all_warm = bool(warm.all())
        with np.errstate(invalid="ignore", divide="ignore"):  # each residual over its own scale, warm or cold
            ext_l = (loss[lo:n] - level) / (total_l if all_warm else np.where(warm, total_l, scale))
            ext_g = (self.log_grad.view[lo:n] - glevel) / (total_g if all_warm else np.where(warm, total_g, gscale))
        # Cold (no noise model yet) the gradient norm is out of band only past a gross rise (the trigger's): a
        # warm-up's norms climb past a cold scale's band and would carry the onset back through the climb.
        band_g = self.cfg.z_band if all_warm else np.where(warm, self.cfg.z_band, self.cfg.z_trigger)
        elevated = (ext_l > self.cfg.z_band) | (ext_g > band_g)  # a NaN residual is not elevated
        if not elevated.any():
            return (*cols, warm, elevated)
        idx = np.arange(n - lo)
        carried = self.streak is not None and self.streak < lo
        prev = np.concatenate([[carried], elevated[:-1]])
        starts = np.maximum.accumulate(np.where(elevated & ~prev, idx, -1))
        if carried:
            b = self._baselines(loss, self.streak, self.streak + 1)
            at = [b[0], b[1], b[2], b[3], self.loss_base.total_scale(self.streak, self.streak + 1),
                  self.grad_base.total_scale(self.streak, self.streak + 1)]
        # The rows inside an excursion take its first row's values (or those carried in): a few rows, set in place
        # (the columns are this call's own arrays), the values read before any is set.
        inside = np.flatnonzero(elevated & ((starts >= 0) | carried))
        first = starts[inside]
        for k, col in enumerate(cols):
            col[inside] = np.where(first >= 0, col[np.maximum(first, 0)], at[k][0] if carried else np.nan)
        return (*cols, warm, elevated)

    def _scan(self, obs: Observations, n: int) -> None:
        lo, cfg, loss = self.pos, self.cfg, obs["loss"]
        level, scale, glevel, gscale, total_l, total_g, warm, elevated_all = self._frozen_baselines(loss, lo, n)
        lg = self.log_grad.view
        with np.errstate(invalid="ignore", divide="ignore"):
            above = loss[lo:n] - level
            rise_g = lg[lo:n] - glevel
            zl, zg = above / scale, rise_g / gscale
            rise_l = above / np.abs(level)
            # The residuals with NaN as -inf (and +-inf finite); as they are when all are finite (the usual scan).
            zl_c, zg_c = (z if np.isfinite(z).all() else nan_low(z) for z in (zl, zg))
            loss_cand = (zl_c > cfg.z_trigger) & (rise_l >= cfg.min_rise)
            grad_cand = (zg_c > cfg.z_trigger) & (rise_g >= math.log(cfg.grad_min_ratio))
            if not warm.all():
                # Cold: a gross loss rise counts only with the gradient norm moving too (when it is logged).
                cold_ok = ~warm & (~np.isfinite(glevel) | ~np.isfinite(lg[lo:n])
                                   | (rise_g >= math.log(cfg.cold_grad_ratio)))
                loss_cand &= warm | cold_ok
                grad_cand &= warm
        with np.errstate(invalid="ignore", divide="ignore"):
            z_total = (loss[lo:n] - self._guarded(level, lo, n)) / total_l
        sums = self._cusums(z_total, warm, lo)
        past = [s > h for (s, _), (_, h, _) in zip(sums, self.bank)]
        hit = np.logical_or.reduce(past) | loss_cand | grad_cand
        trigger = None
        for j in np.flatnonzero(hit):
            i = lo + int(j)
            # A single observation must also pass the run's own tail (heavy-tailed runs raise the bar). It is
            # tested first: a CUSUM that crosses on the same observation crosses because of it (clipped at
            # ``winsor``, it adds its most), and its last zero dates the noise it had been summing, not the
            # jump (fresh seed 719649's run 031: a bad batch 70 sigmas out at 1592, dated 1543 and called "a
            # small shift alone: no observation far out"). A lift that led up to the jump is still its onset:
            # the elevated streak.
            self._note_scanned(lo, i, zl_c, zg_c, warm)
            thr_l, thr_g = self._thresholds()
            if (loss_cand[j] and (zl_c[j] > thr_l or not warm[j])) or (grad_cand[j] and zg_c[j] > thr_g):
                trigger, rule = i, "shewhart"
                break
            if any(p[j] for p in past) and not self._burst_while_settling(sums, past, j):
                trigger, (rule, zero) = i, self._change_point(sums, past, j, i)
                break
        stop = n if trigger is None else trigger
        self._note_scanned(lo, stop, zl_c, zg_c, warm)
        # The excursion's extent (its onset) is judged against the run's variability with its wander: a trend
        # the lagging baseline has not caught up with (a warm-up) is not the start of a spike.
        self._track_streak(elevated_all[:stop - lo + (trigger is not None)], lo)
        if trigger is None:
            self.s, self.zero = [float(s[-1]) for s, _ in sums], [int(z[-1]) for _, z in sums]
            self.pos = n
            return
        onset = self.streak if self.streak is not None else trigger
        if rule != "shewhart":  # a CUSUM's change point: the observation after its last zero
            onset = min(onset, zero + 1)
        anchor = max(onset, self.floor)
        onset = self._not_before_its_cause(obs, anchor, trigger)
        self._open(onset, trigger, rule, obs, int(np.argmax([zl_c[trigger - lo], zg_c[trigger - lo]])), anchor)

    def _not_before_its_cause(self, obs: Observations, onset: int, trigger: int) -> int:
        """The onset, or the first consequence of an LR raise off the schedule the alarm came after (``raise_after``):
        fresh seed 158901's run 081, the LR growing from 776, the CUSUM's last zero at 762, the divergence dated 763
        and checkpoint 688 advised for 774. Unless the rows before it carry a lift of their own (below). Read from the
        rows up to the trigger alone, so a stream dates it as the whole run does."""
        if "lr" not in obs:
            return onset
        first = raise_after(obs["step"], obs["lr"], onset, trigger, trigger, self.ctx.config.lr, self.ctx.trained_lr)
        if first is None:
            return onset
        # Not enough to alarm on is not nothing: rows before the raise whose mean stands ``growth_z`` standard errors
        # above the level at the onset, in the scale with the wander and clipped as the CUSUM clips them, carry a lift
        # of their own, and the excursion began with them (a 4-sigma lift three rows before an LR doubling: a
        # checkpoint inside it).
        level = self._baselines(obs["loss"], onset, onset + 1)[0][0]
        total = self.loss_base.total_scale(onset, onset + 1)[0]
        with np.errstate(invalid="ignore"):
            z = np.minimum((obs["loss"][onset:first] - level) / total, self.winsor)
        z = z[np.isfinite(z)]
        lifted = len(z) > 0 and float(z.mean()) * math.sqrt(len(z)) >= self.ctx.config.divergence.growth_z
        return onset if lifted else first

    def _burst_while_settling(self, sums: list[tuple[np.ndarray, np.ndarray]], past: list[np.ndarray], j: int) -> bool:
        """Only the burst CUSUM past its interval at row ``j``, under the bar that pages (``burst_lasted_h``), from
        rows inside the last excursion's settling window (``_settles_in``): not yet an alarm. What comes out there
        carries that excursion on (``_open``: its aftershock), and only what would page does so: three rows near
        the clip a run's own noise put there read a burst's spike that had come back as never back (fresh seed
        822603's run 021, test 124)."""
        if past[0][j]:  # the slow one alarms too
            return False
        s, zero = sums[1]  # the burst CUSUM
        return bool(s[j] <= self.cfg.burst_lasted_h and zero[j] + 1 < self._settling_until())

    def _settling_until(self) -> int:
        """The first row after the last closed excursion's settling window (``_settles_in`` rows after the
        ``recovery_obs`` that ended it), or -1 when none is settling: a blip was over at once, and a superseded one
        ended where the next incident began."""
        last = self.closed[-1] if self.closed else None
        if last is None or last.data.get("blip") or last.data.get("superseded"):
            return -1
        return last.recovered_at + self.cfg.recovery_obs + self._settles_in(last)

    def _change_point(self, sums: list[tuple[np.ndarray, np.ndarray]], past: list[np.ndarray], j: int,
                      i: int) -> tuple[str, int]:
        """(rule, last zero) of the CUSUM that dates the shift, among those of the bank past their decision interval
        at row ``j`` of this pass (row ``i`` of the segment). Each CUSUM's last zero is its own estimate of where the
        shift began; when two alarm at once they disagree (the slow one's zero lies further back). The members
        differ only in their reference value ``k``, so they sum the same clipped residuals: ``S`` over the ``m``
        rows since a zero is that CUSUM's sum plus ``k m``, and the generalised likelihood ratio of a shift of
        unknown size from there, ``S^2 / 2m`` (Siegmund and Venkatraman 1995), is how well a shift from that zero
        explains the rows. The later zero dates it only where it explains them better by ``change_point_margin``:
        a burst of far-out rows after a drift the slow one had been summing is dated at the burst (fresh seed 9881's
        run 107: a five-step bad batch at step 401, dated 354 by the slow CUSUM's zero); a gradual rise both alarm
        on, which they explain alike, at its start (test 79's guard: a hump whose rows reach the clip as the slow
        sum passes its interval). One that alarms alone dates it. Ties go to the bank's order (the slow one)."""
        fits = []
        for order, ((s, zero), fired, (k, _, rule)) in enumerate(zip(sums, past, self.bank)):
            m = i - int(zero[j])
            if fired[j] and m > 0:
                fits.append(((s[j] + k * m) ** 2 / (2 * m), int(zero[j]), order, rule))
        best = max(fit[0] for fit in fits)  # two members from one zero differ by rounding only: a tie
        near = best - self.cfg.change_point_margin - 1e-9 * max(1.0, best)
        _, zero, _, rule = min((fit for fit in fits if fit[0] >= near),
                               key=lambda fit: (fit[1], fit[2]))
        return rule, zero

    def _guarded(self, level: np.ndarray, lo: int, n: int) -> np.ndarray:
        """The level the CUSUM judges against: the lower of ``level`` and the level ``cusum_guard`` observations
        earlier (see ``SpikeConfig.cusum_guard``), so a lasting rise stays a residual until the CUSUM can see it."""
        g = self.cfg.cusum_guard
        start = max(lo - g, 0)
        if g <= 0 or n - g <= start:
            return level
        if start + g == lo:  # the guard's rows all lie in the segment: the level g rows back, row for row
            earlier = self.loss_level.level_at(start, n - g)
        else:
            earlier = np.full(n - lo, np.nan)
            earlier[start + g - lo:] = self.loss_level.level_at(start, n - g)
        return np.where(np.isfinite(earlier), np.fmin(level, earlier), level)

    def _cusums(self, zl: np.ndarray, warm: np.ndarray, lo: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each CUSUM of the bank over the clipped loss residuals, scaled by the run's variability wander
        included (a sustained shift must stand out from how far the level wanders by itself); it rests at 0
        without a baseline. The members differ only in their reference value: the clipped residuals and the runs
        of warm observations are found once for all of them."""
        finite = np.isfinite(zl)
        clipped = np.minimum(zl, self.winsor) if finite.all() else np.where(finite, np.minimum(zl, self.winsor), 0.0)
        if warm.all():  # one run from the first observation: the sums carry on from the last pass; each change
            # point is looked up where an alarm or the next pass asks for it (LastZeros), not built for every row
            sums = [cusum(clipped - k, self.s[c], self.zero[c], lo, with_zero=False)[0]
                    for c, (k, _, _) in enumerate(self.bank)]
            return [(s, LastZeros(s, self.zero[c], lo)) for c, s in enumerate(sums)]
        bounds = np.flatnonzero(np.diff(np.concatenate([[0], warm.astype(np.int8), [0]])))
        out = []
        for c, (k, _, _) in enumerate(self.bank):
            inc = clipped - k
            s, zero = np.zeros(len(zl)), np.arange(len(zl)) + lo
            s0, z0 = self.s[c], self.zero[c]
            for a, b in zip(bounds[::2], bounds[1::2]):  # runs of warm observations
                start_s, start_z = (s0, z0) if a == 0 else (0.0, lo + a - 1)
                s[a:b], zero[a:b] = cusum(inc[a:b], start_s, start_z, lo + a)
            out.append((s, zero))
        return out

    def _note_scanned(self, lo: int, hi: int, zl: np.ndarray, zg: np.ndarray, warm: np.ndarray) -> None:
        a = max(self._noted, lo)
        if hi > a:
            w = warm[a - lo:hi - lo]
            every = w.all()  # then the residuals go in as they are
            self.loss_base.note_scanned(a, zl[a - lo:hi - lo] if every else np.where(w, zl[a - lo:hi - lo], np.nan))
            self.grad_base.note_scanned(a, zg[a - lo:hi - lo] if every else np.where(w, zg[a - lo:hi - lo], np.nan))
            self._noted = hi

    def _thresholds(self) -> tuple[float, float]:
        cfg = self.cfg
        tail_l = self.loss_base.tail_threshold(cfg.tail_risk, self.tail_blocks)
        tail_g = self.grad_base.tail_threshold(cfg.tail_risk, self.tail_blocks)
        return (max(cfg.z_trigger, tail_l) if math.isfinite(tail_l) else cfg.z_trigger,
                max(cfg.z_trigger, tail_g) if math.isfinite(tail_g) else cfg.z_trigger)

    def _track_streak(self, elevated: np.ndarray, lo: int) -> None:
        """Keep the start of the run of elevated observations that reaches the last one scanned."""
        if not len(elevated):
            return
        quiet = np.flatnonzero(~elevated)
        if len(quiet):
            last_quiet = lo + int(quiet[-1])
            self.streak = last_quiet + 1 if last_quiet + 1 < lo + len(elevated) else None
        elif self.streak is None:
            self.streak = lo

    def _open(self, onset: int, trigger: int, rule: str, obs: Observations, led_by: int, anchor: int) -> None:
        """Open an episode at ``onset`` (or go on with the last one), its baseline frozen at ``anchor``: where the
        statistics date the change, at or before the onset (``_not_before_its_cause``), so no row the change may
        have lifted is in it."""
        loss = obs["loss"]
        last = self.closed[-1] if self.closed else None
        if onset < self._settling_until() \
                and not self._lr_stepped_up(obs["lr"], last.recovered_at, onset - 1) \
                and self._fresh_excursion(last, loss, trigger, trigger + 1,
                                          self._recent(last, loss, trigger, trigger + 1)) > 0:
            # Out again before it settled (``_settles_in``: before its lasting cost was measured): the excursion
            # was not over (the tail of a slow recovery, an aftershock of a burst), so the episode goes on rather
            # than a second one starting. A blip that came straight back was over: what comes out after
            # ``recovery_obs`` in-band observations is an incident of its own (two bad batches 23 observations
            # apart are two, not one wider spread), and so was one whose next excursion is a fresh incident by
            # the test that ends an episode for one (``_fresh_excursion``), or one the LR stepped up before (a
            # cause of its own: a jump, the schedule's warm restart).
            self.closed.pop()
            last.recovered_at, last.carry, last.end = None, 0, trigger
            last.data["below"] = last.data["above"] = 0  # judged afresh (what came before the recovery is settled)
            last.data["loss_moved"] = last.data.get("loss_moved", False) or bool(self.far_out(
                last, loss, onset, self.residuals(last, loss, onset, trigger + 1)[0]).any())
            self.episode = last
            self.pos = self._noted = trigger + 1
            self.streak = None
            self.chunk = FIRST_CHUNK
            return
        # Frozen at the anchor, cold or warm: a cold baseline at the trigger is the median of rows the excursion
        # already lifted (BLOOM 31214: a level of 2.24 and a grad norm of 2.39 read from 31215-31219, where 2.20
        # and 0.24 came before). Only an onset with no row before it in the segment has none: then the trigger.
        at, base = anchor, self._baselines(loss, anchor, anchor + 1)
        if not np.isfinite(base[0][0]):
            at, base = trigger, self._baselines(loss, trigger, trigger + 1)
        level, scale, glevel, gscale, _ = (float(v[0]) for v in base)
        slope, span, floor = self.loss_base.slope(at)
        thr_l, thr_g = self._thresholds()
        # The paging bar: the tail's 1e-6 point where the tail raised the opening bar (so it is fitted), else that bar.
        alarm_l = (max(thr_l, self.loss_base.tail_threshold(self.cfg.alarm_risk, self.tail_blocks))
                   if thr_l > self.cfg.z_trigger else thr_l)
        total = float(self.loss_base.total_scale(at, at + 1)[0])
        self.episode = Episode(onset=onset, trigger=trigger, rule=rule, end=trigger, frozen={
            "level": level, "scale": scale, "total": total if math.isfinite(total) else scale,
            "glevel": glevel, "gscale": gscale, "slope": slope, "span": span,
            "floor": min(floor, level),
            "t0": float(self.coord.view[anchor]), "thr_loss": thr_l, "thr_grad": thr_g,
            "alarm_loss": alarm_l},
            data={"grad_led": led_by == 1 and rule == "shewhart"})
        # Judged against the baseline just frozen, as ``_follow`` and ``classify`` judge every later row: the live
        # one at the trigger has taken in the rows the excursion lifted since its onset (fresh seed 431310's run 102:
        # a loss 6.8 sigmas out at the trigger read as not moved, and the episode, led by a gradient norm that settled
        # at a new level, stayed open 474 steps and swallowed the burst that needed action).
        self.episode.data["loss_moved"] = bool(self.far_out(
            self.episode, loss, onset, self.residuals(self.episode, loss, onset, trigger + 1)[0]).any())
        self.pos = trigger + 1
        self._noted = self.pos
        self.streak = None
        self.chunk = FIRST_CHUNK

    def _settles_in(self, ep: Episode) -> int:
        """Observations after its recovery window within which an episode is not yet settled: an excursion's, the
        ``lasting_obs`` its lasting cost is measured over (a burst's loss that comes back, then rises again within them
        is its aftershock: fresh seed 392002's run 025, back at 1556 from an x51 burst at 1289 and up again from 1594,
        the clean twin ~0.25 lower throughout, was a second warning); a wider spread's, ``patience_obs``: it has no
        level to come back to, and a later excursion is judged on its own."""
        return self.cfg.patience_obs if ep.data.get("noise_grew") else self.cfg.lasting_obs

    def _lr_stepped_up(self, lr: np.ndarray, lo: int, hi: int) -> bool:
        """Did the LR step up (``LRConfig.raise_factor`` from one logged row to the next) into a row of lo..hi?"""
        v = lr[lo:hi + 1]
        v = v[np.isfinite(v) & (v > 0)]
        return bool(np.any(v[1:] >= self.ctx.config.lr.raise_factor * v[:-1]))

    # -- following an episode ---------------------------------------------------------------------

    def projection(self, ep: Episode, lo: int, hi: int) -> np.ndarray:
        """The pre-onset trend carried forward over observations lo..hi-1 (never further than its own span)."""
        f = ep.frozen
        dt = np.clip(self.coord.view[lo:hi] - f["t0"], 0.0, f["span"])
        return np.maximum(f["level"] + f["slope"] * dt, f["floor"])

    def far_out(self, ep: Episode, loss: np.ndarray, lo: int, zl: np.ndarray) -> np.ndarray:
        """The rows from ``lo`` whose loss residuals (``residuals``) are ``zl`` where the loss itself is far out: past
        the opening bar (``thr_loss``) of the episode's frozen baseline and ``min_rise`` above its projected trend.
        What "the loss moved" means, wherever it is asked."""
        hi = lo + len(zl)
        with np.errstate(invalid="ignore", divide="ignore"):
            rise = (loss[lo:hi] - self.projection(ep, lo, hi)) / abs(ep.frozen["level"])
        return (np.nan_to_num(zl, nan=-np.inf) > ep.frozen["thr_loss"]) & (rise >= self.cfg.min_rise)

    def residuals(self, ep: Episode, loss: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        f = ep.frozen
        with np.errstate(invalid="ignore"):
            return ((loss[lo:hi] - self.projection(ep, lo, hi)) / f["scale"],
                    (self.log_grad.view[lo:hi] - f["glevel"]) / f["gscale"])

    def _follow(self, obs: Observations, n: int) -> None:
        ep, cfg, lo, loss = self.episode, self.cfg, self.pos, obs["loss"]
        zl, zg = self.residuals(ep, loss, lo, n)
        moved = None
        with np.errstate(invalid="ignore"):
            ok = zl <= cfg.z_band
            if ep.data["grad_led"]:
                # Led by the gradient norm: until the loss itself moves, the gradient norm must come back too;
                # once the loss moved, the loss decides (a norm that settles at a new level is a new regime).
                moved = np.maximum.accumulate(self.far_out(ep, loss, lo, zl)) | ep.data.get("loss_moved", False)
                ok &= moved | np.isnan(zg) | (zg <= cfg.z_band)
        start, ep.carry = first_run(ok, cfg.recovery_obs, ep.carry)
        # Each way an episode can end is decided at one observation, the earliest wins (ties in this order), so
        # following it one observation at a time or all at once ends it at the same place.
        recovered_by = start + cfg.recovery_obs - 1 if start < len(ok) else len(ok)
        # Far below the level about as often as far above it: the noise grew (the scale frozen at the onset is
        # refuted), which is no excursion of the level. A spike does not take the loss many sigmas under its
        # trend; symmetric noise puts about half its far-out values below (a sign test: refuted while the count
        # below is within 2.33 standard deviations, one-sided 1%, of half the far-out ones).
        zl_0, thr = np.nan_to_num(zl, nan=0.0), ep.frozen["thr_loss"]
        below = np.cumsum(zl_0 < -thr) + ep.data.get("below", 0)
        above = np.cumsum(zl_0 > thr) + ep.data.get("above", 0)
        far = below + above
        symmetric = (below >= cfg.persist_obs) & (below >= far / 2 - 1.165 * np.sqrt(far))
        refuted = int(np.argmax(symmetric)) if symmetric.any() else len(ok)
        if refuted < min(recovered_by, len(ok)) and (ep.data.get("lr_cause") or self._lr_caused(ep, obs, lo + refuted)):
            # The sign test refutes a level shift on the assumption that nothing changed: an LR raised off the
            # schedule at the onset is a change, and a loss thrown both ways under it is that change's damage,
            # not the run's noise growing (fresh seed 198280's run 100: LR x254, the loss 4.1 -> 82 and far
            # below, called "the noise grew"). Decided once, at the first refutation, from the data up to it.
            ep.data["lr_cause"] = True
            refuted = len(ok)
        # Led by the gradient norm, which moved to a new level and stays there while the loss never left its
        # band: a trend (warm-up, a schedule change), not an excursion. Decided once, ``patience_obs`` in.
        trend_at = max(ep.onset + cfg.patience_obs - 1, lo) - lo if ep.data["grad_led"] else len(ok)
        recent = self._recent(ep, loss, lo, n)
        fresh = self._fresh_excursion(ep, loss, lo, n, recent)
        nested = self._nested(ep, recent)
        if trend_at < len(ok) and trend_at < min(recovered_by, refuted, fresh):
            zl_all, _ = self.residuals(ep, loss, ep.onset, lo + trend_at + 1)
            if not np.any(np.nan_to_num(zl_all, nan=-np.inf) > cfg.z_band):
                self._restart_after(ep, lo + trend_at)  # re-learn the baseline from here
                return
        if fresh < min(recovered_by, refuted, len(ok)):
            # Back at its trend and then far out again: a new incident (a bad batch inside an LR burst's slow
            # tail), not more of this one. This one ends where its last ``recovery_obs`` began.
            ep.data["superseded"] = True
            self._close(ep, lo + fresh - cfg.recovery_obs, loss, nested)
            return
        if refuted < len(ok) and refuted < recovered_by:
            ep.data["noise_grew"] = True
            self._close(ep, lo + refuted, loss, nested)
            return
        if len(far):
            ep.data["below"], ep.data["above"] = int(below[-1]), int(above[-1])
        if moved is not None and len(moved):  # what was seen up to where this call stops looking
            ep.data["loss_moved"] = bool(moved[max(min(recovered_by, len(moved) - 1), 0)])
        if start < len(ok):
            self._close(ep, lo + start, loss, nested)
            return
        ep.end, self.pos = n - 1, n
        ep.data["nested"] = ep.data.get("nested", []) + nested

    def _lr_caused(self, ep: Episode, obs: Observations, at: int) -> bool:
        """An LR raised off the schedule at the episode's onset, read from the rows up to ``at`` alone (so that a
        stream decides it as the whole run does)."""
        steps, lr = obs["step"][:at + 1], obs["lr"][:at + 1]
        story = _lr_story(steps, lr, ep.onset, at, self.ctx.history, self.cfg.patience_obs, self.ctx.config.lr,
                          trained_lr=self.ctx.trained_lr)
        return bool(story["lr_raised"]) and not story["lr_scheduled"]

    def _recent(self, ep: Episode, loss: np.ndarray, lo: int, n: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """The residuals (loss, gradient norm) from row ``a`` to n-1, where ``a`` is ``2 * recovery_obs`` rows before
        lo but not before the episode's onset: what the tests of a second incident read each new observation against
        (the episode's own last observations; its rows before a CUSUM's alarm are its own too, test 79). None when
        no observation in lo..n-1 has that many before it."""
        w = 2 * self.cfg.recovery_obs
        a = max(lo - w, ep.onset)
        if n - a <= w:
            return None
        zl, zg = self.residuals(ep, loss, a, n)
        return a, zl, zg

    def _fresh_excursion(self, ep: Episode, loss: np.ndarray, lo: int, n: int,
                         recent: tuple[int, np.ndarray, np.ndarray] | None) -> int:
        """Index (from ``lo``) of the first observation that opens a new incident inside this episode; ``n - lo``
        when none does.

        The recovery rule wants ``recovery_obs`` in band in a row, so that a ragged tail is not called over too
        soon. A loss whose last ``recovery_obs`` observations sit, as a median, back in the band has come back
        all the same; an observation then past the trigger bar both against the frozen baseline and against
        the episode's own last ``2 * recovery_obs`` observations (their median, and their standard deviation
        where it is wider than the frozen scale: a ragged tail's own swings are not new) is what a scan would open an
        excursion on, the next incident (a bad batch in an LR burst's slow tail), not more of this one."""
        m, cfg = self.cfg.recovery_obs, self.cfg
        w = 2 * m
        if recent is None:
            return n - lo
        a, zl, zg = recent
        thr = ep.frozen["thr_loss"]
        far = self.far_out(ep, loss, a, zl)
        if not far[w:].any():
            return n - lo
        z = np.nan_to_num(zl, nan=np.inf)  # a missing value is not back in band
        past = np.lib.stride_tricks.sliding_window_view(z, w)[:-1]  # the w observations before each of a+w..n-1
        recent = np.median(past[:, m:], axis=1)
        # Back means the gradient norm too, where it is logged: a norm still up is the same incident going on.
        grad = np.lib.stride_tricks.sliding_window_view(np.where(np.isfinite(zg), zg, -np.inf), m)[w - m:-1]
        grad_back = np.median(grad, axis=1) <= cfg.z_band  # not logged (all -inf) is no objection
        centre = np.median(past, axis=1)
        with np.errstate(invalid="ignore"):  # the standard deviation, swings and all (an infinite one: no test)
            spread = np.maximum(np.std(past, axis=1), 1.0)
            new = far[w:] & (recent <= cfg.z_band) & grad_back & ((z[w:] - centre) / spread > thr)
        hit = np.flatnonzero(new)
        return int(hit[0]) + w + a - lo if len(hit) else n - lo

    def _nested(self, ep: Episode, recent: tuple[int, np.ndarray, np.ndarray] | None) -> list[int]:
        """Observations in lo..n-1 (absolute; ``recent`` from ``_recent``) where a second incident begins inside this
        one while it is still out: past the trigger bar against the frozen baseline and, by that bar again in the
        episode's own spread, past everything the episode did in its last ``2 * recovery_obs`` observations (their
        highest value and their standard deviation, where it is wider than the frozen scale). A new jump over the excursion's own
        path, not its climb: growing by a constant ratio, or thrashing, never passes its own recent highest by
        that many of its own swings. One incident per window: the observations after a jump are that jump's.

        A bad batch or an LR burst while the loss is still coming back from an earlier one is an incident of its
        own (fresh seeds 930351's run 041, a bad batch 61 sigmas out during an LR burst's slow tail; 448775's
        run 148, an LR burst x80 inside the rise after a warm restart)."""
        cfg, w = self.cfg, 2 * self.cfg.recovery_obs
        if recent is None:
            return []
        a, zl, _ = recent
        thr, level = ep.frozen["thr_loss"], abs(ep.frozen["level"])
        past = np.lib.stride_tricks.sliding_window_view(zl, w)[:-1]  # the w observations before each of a+w..n-1
        cur = zl[w:]
        with np.errstate(invalid="ignore"):  # a window with a missing or infinite value tests nothing
            top, spread = past.max(axis=1), np.maximum(past.std(axis=1), 1.0)
            jump = (cur - top) / spread
            rise = (cur - top) * ep.frozen["scale"] / level
            new = np.isfinite(cur) & (cur > thr) & (jump > thr) & (rise >= cfg.min_rise)
        hits, last = [], (ep.data.get("nested") or [-w])[-1]
        for i in (np.flatnonzero(new) + a + w).tolist():
            if i - last >= w:
                hits.append(i)
                last = i
        return hits

    def _close(self, ep: Episode, recovered_at: int, loss: np.ndarray, nested: list[int] | None = None) -> None:
        ep.close(recovered_at)
        ep.data["nested"] = ep.data.get("nested", []) + [i for i in nested or [] if i <= ep.end]
        self.closed.append(ep)
        last = recovered_at + self.cfg.recovery_obs - 1
        if ep.data.get("noise_grew"):
            self._rearm(recovered_at)  # the baselines keep it all: the larger noise is the run's from now on
            return
        ep.data["blip"] = not self._persistent(ep, loss, recovered_at)
        if ep.data["blip"]:
            # A blip that came straight back is the run's own tail, not an incident: the baselines keep it
            # (their medians do not move) and so does the extreme-value tail, which is made of such blips, each
            # as high as the bar it passed. A tail fitted by moments is as fragile as a mean: one bad batch 50
            # sigmas out would put the bar past 50 for the rest of the run (fresh seed 755048's run 084: a
            # second bad batch at 21 sigmas unseen). Each blip at the bar raises it, so blips that recur still
            # lift it (a heavy-tailed run), while one cannot blind the run; SPOT keeps alarms out of its tail.
            level, scale, glevel, gscale, warm = self._baselines(loss, ep.onset, last + 1)
            f = ep.frozen
            with np.errstate(invalid="ignore", divide="ignore"):
                zl = np.where(warm, np.minimum((loss[ep.onset:last + 1] - level) / scale, f["thr_loss"]), np.nan)
                zg = np.where(warm, np.minimum((self.log_grad.view[ep.onset:last + 1] - glevel) / gscale,
                                               f["thr_grad"]), np.nan)
            self.loss_base.note_scanned(ep.onset, zl)
            self.grad_base.note_scanned(ep.onset, zg)
            self._rearm(last)
            return
        self._restart_after(ep, last)

    def _persistent(self, ep: Episode, loss: np.ndarray, end: int) -> bool:
        """The excursion lasted (the ``classify`` test, ``lasted``): consecutive far-out observations, or a CUSUM
        sum over the episode past ``cusum_h`` or ``burst_lasted_h``. A blip is the run's own tail, not an incident
        worth excluding."""
        zl, _ = self.residuals(ep, loss, ep.onset, end)
        return self.lasted(zl, self.far_out(ep, loss, ep.onset, zl))

    def lasted(self, zl: np.ndarray, far: np.ndarray) -> bool:
        """An excursion with residuals ``zl`` lasted: ``persist_obs`` far-out observations in a row, its clipped
        residuals summing past ``cusum_h`` over it, or the burst CUSUM passing ``burst_lasted_h`` inside it."""
        clipped = np.minimum(np.where(np.isfinite(zl), zl, 0.0), self.winsor)
        burst = cusum(clipped - self.cfg.burst_k, 0.0, 0, 0)[0]
        return bool(_longest_run(far) >= self.cfg.persist_obs or np.sum(clipped - self.cfg.cusum_k) >= self.cfg.cusum_h
                    or (len(burst) and burst.max() > self.cfg.burst_lasted_h))

    def _restart_after(self, ep: Episode, last: int) -> None:
        """Keep the episode out of every later baseline and scan again after ``last``."""
        for base in (self.loss_base, self.grad_base, self.loss_level, self.grad_level):
            base.exclude(ep.onset, last)
        self._rearm(last)

    def _rearm(self, last: int) -> None:
        self.episode = None
        self.pos = self.floor = self._noted = last + 1
        self.s, self.zero, self.streak = [0.0] * len(self.bank), [last] * len(self.bank), None
        self.chunk = FIRST_CHUNK

    # -- findings ----------------------------------------------------------------------------------

    def findings(self, obs: Observations) -> list[Finding]:
        current = classify(self, self.episode, obs) if self.episode is not None else None
        pairs = [(ep, classify(self, ep, obs)) for ep in self.closed] + [(self.episode, current)]
        out = [f for _, f in pairs if f is not None]
        out += [g for ep, f in pairs if f is not None for g in nested_findings(self, ep, f, obs)]
        if current is not None:  # a second cause inside the excursion still open
            inside = lr_raise_inside(obs, current, self.episode.trigger, self.ctx.history, self.ctx.config,
                                     self.ctx.trained_lr)
            out += [] if inside is None else [inside]
        # An LR burst is a known change point: a lift after it that no excursion above covers is its own finding.
        bursts = lr_burst_shifts(obs, self.ctx.history, self.ctx.config, self.ctx.segment, self.ctx.trained_lr)
        out += [b for b in own_findings(bursts, obs["step"], self.ctx.history)
                if not any(f.onset_step <= b.end_step and b.onset_step <= f.end_step for f in out)]
        return sorted(out, key=lambda f: f.onset_step)


def nested_findings(sc: SpikeScanner, ep: Episode, outer: Finding, obs: Observations) -> list[Finding]:
    """The second incidents ``SpikeScanner._nested`` saw inside episode ``ep`` (whose finding is ``outer``), once
    the loss came back from both: each a spike of its own from its jump, ending with the excursion it arrived in.
    Inside an excursion not back (yet), everything the loss does is part of the one incident that needs the
    rollback (as inside an unrecovered divergence, ``analysis.merge_overlaps``): a blown-up loss thrashing
    from 67 to 189 is no news (fresh seed 247925's run 027, test 26).

    One incident pages once: a second jump is an 'info' annotation on the excursion already paged, as a lone bad
    batch is outside one, unless a cause of its own is in view (the LR raised at it). On the 20 looked-at fresh
    seeds of labels v11 the 26 second jumps were never a labelled fault's own finding: 23 lay inside their
    excursion's label, 3 were a batch-2 or batch-3 loss thrashing on its way down (test 118)."""
    steps, loss, lr, w = obs["step"], obs["loss"], obs["lr"], 2 * sc.cfg.recovery_obs
    out = []
    if not outer.self_recovered:
        return out
    for i in ep.data.get("nested", []):
        if steps[i] <= outer.onset_step or steps[i] > outer.end_step:
            continue
        before = loss[i - w:i]
        end = min(i + w, len(loss))
        peak = i + int(np.nanargmax(np.where(np.isfinite(loss[i:end]), loss[i:end], -np.inf)))
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = float(lr[i] / np.nanmedian(lr[i - w:i])) if np.isfinite(lr[i - w:i]).any() else math.nan
        lr_ratio = ratio if math.isfinite(ratio) else None  # unknown, as the LR story says (a NaN equals nothing)
        evidence = {"rule": "nested", "outer_onset_step": outer.onset_step, "outer_kind": outer.kind,
                    "loss_before": float(np.nanmax(before)), "peak_loss": float(loss[peak]),
                    "threshold_sigmas": ep.frozen["thr_loss"], "lr_ratio": lr_ratio,
                    "detected_step": int(steps[i]), "trigger_step": int(steps[i])}
        cause = (f" after the LR rose x{fmt_value(lr_ratio)}"
                 if lr_ratio is not None and lr_ratio >= sc.ctx.config.lr.raise_factor else "")
        out.append(Finding(
            kind="spike", onset_step=int(steps[i]), end_step=outer.end_step, peak_step=int(steps[peak]),
            segment=outer.segment, severity="warning" if cause else "info", self_recovered=True, needs_action=False,
            evidence=evidence,
            message=(f"a second loss spike from step {int(steps[i])}, inside the excursion open since step "
                     f"{outer.onset_step}: loss {fmt_value(evidence['loss_before'])} -> {fmt_value(loss[peak])}"
                     f"{cause}; both came back to the trend")))
    return out


def _lr_story(steps: np.ndarray, lr: np.ndarray, onset: int, end: int, history: int, patience: int, lrc: LRConfig,
              peak: int | None = None, trained_lr: float = -np.inf) -> dict:
    """The LR around the onset, read from the data: the highest LR of the updates that produced the
    excursion up to its peak (from the row before the onset, and the onset row for a burst between coarse
    rows) against the LR before. Up to the peak, not at the onset only: a ramp reaches ``raise_factor`` after the loss
    began to move, and a noisy first row can open the excursion a few rows before the LR jump that makes it.
    An excursion that follows the schedule's warm restart (``restart_before``) is the schedule's too. The loss
    answers a raised LR over tens of updates, so an excursion that begins within ``lrc.lag_rows`` of the LR's
    last step up (``lr_step_before``), still in effect at the onset, is read against the LR before that step."""
    anchor = onset
    step_up = lr_step_before(lr, onset, history, lrc)
    if step_up is not None and in_warmup(steps, lr, int(steps[step_up]), lrc):
        # The opening warm-up's rise is the schedule's, not a cause: on a coarse log the lag's rows reach back into
        # it (32 rows of a log every 10 steps span 320 steps), and the LR before its last step was the warm-up's
        # first (seed 899445's run 062: a loss excursion at step 190 read against the LR of step 0, "x50").
        step_up = None
    if step_up is not None and step_up < onset:
        kept = lr[step_up:onset + 1]
        if not np.any(kept[np.isfinite(kept)] * lrc.raise_factor <= lr[step_up]):  # not stepped back down since
            anchor = step_up
    # A ramp still rising into the excursion is read from where it left the schedule's path, not against the LR a
    # few rows before the onset, which the ramp has already raised (fresh seed 371818's run 139: x1.027 a step from
    # 1072, x22 by the peak of a spike at 1187, read as x1.3 against the rows just before it).
    ramp = lr_rise_start(steps, lr, onset, lrc, until=peak, trained_lr=trained_lr)
    if ramp is not None and history < ramp < anchor:
        anchor = ramp
    level = lr_before(steps, lr, anchor, lrc, history)
    cause = lr[max(anchor - 1, 0):max(onset, peak if peak is not None else onset) + 1]
    cause = cause[np.isfinite(cause)]
    if level is None or not len(cause):
        return {"lr_before": None, "lr_at_onset": None, "lr_ratio": None, "lr_raised": False,
                "lr_still_raised": False, "lr_scheduled": False, "lr_restart_step": None, "lr_step_up_step": None}
    lr_cause = float(cause.max())
    ratio = lr_cause / level
    # An LR that rose on the opening warm-up's own path up to the excursion's peak rose on the schedule: the warm-up
    # ends before any row that steepens its rise (``warmup_end``), so a burst inside it is still read as a raise,
    # while a log excerpt that ends inside its warm-up has no level to read one against (bigscience's
    # perf-meg-ds-zero, 4 rows of a linear warm-up: "the LR rose x3 into the excursion: restore it").
    raised = bool(ratio >= lrc.raise_factor) and not in_warmup(steps, lr, int(steps[max(onset, peak or onset)]), lrc)
    first = max(history, anchor - 1 - LR_BEFORE_ROWS)
    window = lr[first:onset + 1]
    rise = np.flatnonzero(np.isfinite(window) & (window >= lrc.raise_factor * level))
    rise_at = first + int(rise[0]) if len(rise) else onset
    # Still raised: over the episode (not at its last row only: a warm restart may land there) at raise_factor x
    # the LR before, and never back at it (within ``flat``), nor, after a one-row step up, at the LR of the row
    # before it (a ramp's rows are each within ``flat`` of the row before them). A burst that ended is over, even
    # where a warm-up goes on rising past it (held-out h-spike-12: x110 for two steps in a 150-step warm-up, back
    # on its path at once, which the median before lags), while a schedule's own decay of a raised LR (a step
    # schedule's x0.1) leaves it raised.
    # A ramp is still raised too once its last ``held_steps`` updates are all at the factor: the median over the
    # episode lags it (its first rows are under the factor; fresh seed 501650's run 115: x1.0004 a step from 1017,
    # x1.68 at the log's end, the median x1.3), while a burst of a few updates is no level the run trains at.
    finite = np.isfinite(lr[onset:end + 1]) & (lr[onset:end + 1] > 0)
    during, at = lr[onset:end + 1][finite], steps[onset:end + 1][finite]
    hold_rows = held_rows(at, lrc)
    stepped_up = rise_at > history and bool(lr[rise_at] >= lrc.raise_factor * lr[rise_at - 1])  # not a ramp
    back = max(level, float(lr[rise_at - 1])) if stepped_up else level
    earlier = trained_level(steps[:rise_at], lr[:rise_at], lrc, trained_lr)  # the highest LR trained at before it
    # Back on the schedule: at the LR before (within ``flat``), or stepped onto the highest level the run trained
    # at before the rise and not rising on (the schedule's warm restart, here where a burst ends straight into it:
    # fresh seed 930351's run 082, a burst x1.2e3 at 292-295 and the restart to the first cycle's peak at 296,
    # "still raised" at 19x the decayed LR before; a fault's level lands within 5% of that peak only by chance).
    rows = lr[onset:end + 1]
    prev = lr[onset - 1:end] if onset > 0 else np.full(len(rows), np.nan)
    nxt = np.concatenate([lr[onset + 1:end + 2], np.full(len(rows), np.nan)])[:len(rows)]
    with np.errstate(invalid="ignore"):
        stepped_on = (rows >= lrc.raise_factor * prev) | (rows * lrc.raise_factor <= prev)  # a step, not a ramp
        restart = ((rows <= lrc.restart_slack * earlier) & (rows * lrc.restart_slack >= earlier) & stepped_on
                   & ~(nxt > lrc.flat * rows))
        on_path = (rows <= lrc.flat * back) | restart
    # The opening warm-up read through the bursts inside it (``warmup_resumed_end``: the LR came back onto its path)
    # is the schedule up to its end: a burst that ended there is over, however far the warm-up then raises the LR
    # (fresh seed 246827's run 068: x270 at 65 of a 204-step warm-up, "still raised" at 3.3x by the warm-up's end).
    warm = warmup_resumed_end(steps, lr, lrc, warmup_end(steps, lr, lrc))
    if warm is not None:
        on_path |= steps[onset:end + 1] <= warm
    on_path = on_path[finite]
    up = np.flatnonzero(during >= lrc.raise_factor * level)
    since = during[up[0]:] if len(up) else during[:0]  # from the first row at the factor (a ramp's start is not)
    held_up = len(since) >= hold_rows and bool(np.all(since[-hold_rows:] >= lrc.raise_factor * level))
    still = bool(raised and len(during) and (
        (float(np.median(during)) >= lrc.raise_factor * level and not np.any(on_path))
        or (held_up and not np.any(on_path[up[0]:] if len(up) else on_path[:0]))))
    held = lr[onset:onset + patience]
    # The schedule: the LR decayed, then went back to a level the run already trained at and stayed there (a warm
    # restart; a step up from a level held flat is a change, ``warm_restart``).
    scheduled = bool(raised and lr_cause <= lrc.restart_slack * earlier and fell_into(lr, max(rise_at - 1, 0), lrc)
                     and len(held) >= patience and np.all(held >= 0.5 * lr_cause))
    restart = restart_before(steps, lr, onset, end, lrc, history, trained_lr)
    # The last step up within the lag, ended or not (outside the opening warm-up): evidence a shift has a cause.
    stepped = step_up is not None
    return {"lr_before": level, "lr_at_onset": lr_cause, "lr_ratio": ratio, "lr_raised": raised,
            "lr_still_raised": still, "lr_scheduled": scheduled or restart is not None,
            "lr_restart_step": None if restart is None else int(steps[restart]),
            "lr_step_up_step": int(steps[step_up]) if stepped else None}


def lr_still_up(story: dict) -> bool:
    """The LR that threw the excursion is still raised, off the schedule (an LR story, or evidence that holds one)."""
    return bool(story.get("lr_still_raised")) and not story.get("lr_scheduled")


def classify(sc: SpikeScanner, ep: Episode, obs: Observations) -> Finding | None:
    """Turn an episode into a finding, or None when it is no excursion of the loss worth one."""
    cfg, f = sc.cfg, ep.frozen
    steps, loss, n = obs["step"], obs["loss"], len(obs["loss"])
    onset, end = ep.onset, (ep.end if not ep.is_open else n - 1)
    zl, zg = sc.residuals(ep, loss, onset, end + 1)
    z = np.nan_to_num(zl, nan=-np.inf)
    top = onset + int(np.argmax(z)) if len(z) else onset
    jump = lr_jump_inside(steps, obs["lr"], onset, top, sc.ctx.config.lr, sc.ctx.history, trained_lr=sc.ctx.trained_lr)
    if jump is not None and in_band_until(z[:jump - onset], cfg.z_band):
        # The loss was in band until the LR jumped: the excursion began with the jump's first consequence.
        jump = min(first_consequence(steps, jump), top)
        zl, zg, onset = zl[jump - onset:], zg[jump - onset:], jump
    elif onset < top and first_consequence(steps, onset) == onset + 1 \
            and lr_step_before(obs["lr"], onset, sc.ctx.history, sc.ctx.config.lr) == onset:
        # The LR stepped up at the onset's own row on a per-step stretch: that row's loss was computed before the
        # first update under it, so it was out by chance, and the excursion began with the step's first consequence
        # (fresh seed 433315's run 138: a batch-1 loss of 9.2 at a burst's row 149, the twin's alike; test 84).
        zl, zg, onset = zl[1:], zg[1:], onset + 1
    zl_c, zg_c = np.nan_to_num(zl, nan=-np.inf), np.nan_to_num(zg, nan=-np.inf)
    base = f["level"]
    far = sc.far_out(ep, loss, onset, zl)
    num_far, num_out = int(far.sum()), int((zl_c > cfg.z_band).sum())
    loss_moved = num_far > 0 or ep.rule != "shewhart"  # a CUSUM of the bank fired: the loss moved
    grad_far = math.isfinite(f["glevel"]) and bool(np.any((zg_c > f["thr_grad"]) & (zg_c * f["gscale"] >= math.log(cfg.grad_min_ratio))))
    # Open and out for longer than the patience allows: not recovered (yet; a later recovery still counts). Rows
    # back in band at the end (``ep.carry``, fewer than a recovery needs) are a recovery under way.
    out_of_patience = patience_ran_out(steps, onset, n, n - 1 - ep.carry, cfg) if ep.is_open else None
    recovered = True if not ep.is_open else (False if out_of_patience is not None else None)
    if not loss_moved and (not grad_far or recovered is not True):
        return None  # the gradient norm alone moved to a new level: a trend, not an excursion
    peak_i = onset + int(np.argmax(zl_c if loss_moved else zg_c))
    # The LR up to the peak is the cause's, except inside the opening warm-up, whose rise is the schedule's.
    lr_peak = None if in_warmup(steps, obs["lr"], int(steps[peak_i]), sc.ctx.config.lr) else peak_i
    lr_story = _lr_story(steps, obs["lr"], onset, end, sc.ctx.history, cfg.patience_obs, sc.ctx.config.lr, lr_peak,
                         sc.ctx.trained_lr)
    # Lasting, or not back: no blip. Nor one still open while the LR that threw it stays raised off the schedule: a
    # bad batch is over at once, a raised LR goes on acting (fresh seed 122814's run 123: an LR growing x1.027 a
    # step, x8.8 when the loss went 3.5 -> 24 four rows before the log ended, read as "a bad batch?").
    cause_on = recovered is None and lr_still_up(lr_story)
    persistent = loss_moved and (sc.lasted(zl, far) or recovered is False or cause_on)
    lasting = _lasting_cost(sc, ep, loss, n) if recovered else {}
    # Worse than its trend would have been AND not even back to where it was: the spike cost real progress.
    costly = bool(lasting and min(lasting["lasting_cost_sigmas"], lasting["lasting_above_level_sigmas"]) >= cfg.lasting_sigmas
                  and lasting["lasting_above_level"] >= cfg.lasting_rise * abs(base))
    if ep.data.get("noise_grew"):
        persistent, recovered = False, True
    # A shift only the CUSUM bank saw (no observation past the run's own single-observation bar) with neither
    # the LR raised before it nor the gradient norm past its bar: training's own wander (a rebound after a fast
    # fall) makes such shifts with nothing wrong, and they last: back after tens to hundreds of observations, so
    # one still out at the end of the data is no more a fault than one that came back. Annotated, open or not,
    # unless it left a lasting cost; paged once something corroborates it (far-out values, the LR, the norm).
    lr_moved = lr_story["lr_raised"] or lr_story["lr_step_up_step"] is not None
    # Far-out values corroborate a shift as they would page on their own: ``persist_obs`` in a row past the bar
    # against the run's variability with its wander (the scale the CUSUM itself reads). Over tens of observations a
    # shift of a few sigmas of a wandering loss puts some values past the bar of its short-term noise by chance
    # (fresh seed 396069's run 122: a late rebound the clean twin makes too, 169 steps long, 3 values past 6.5
    # short-term sigmas), and over hundreds a lone value past any per-observation bar: a bar passed once in 10^4
    # observations is passed somewhere in a 250-observation shift one time in 40, more often as a small batch's
    # loss noise grows with the level it shifted to (the clean twins of 448775-023 and 930351-015: one or two
    # lone values past it in rebounds 150-250 steps long). A lone far value is an 'info' blip, and so is a
    # shift; together they are still two pieces of noise.
    far_wander = far & (zl_c > f["thr_loss"] * f["total"] / f["scale"])  # the bar in short-term sigmas (no overflow)
    # An excursion a single observation opened pages on the loss alone once one passes the run's own tail at the
    # budget's risk (``alarm_risk``), or as a shift does; under both, it needs the LR or the norm behind it. A jump
    # that stays up has far values in a row against the wander too (a review's 3x lift on test 120's twin: critical).
    loss_alone = _longest_run(far_wander) >= cfg.persist_obs or (
        ep.rule == "shewhart" and bool(np.any(far & (zl_c > f["alarm_loss"]))))
    quiet = cfg.corroborate_shifts and not loss_alone and not grad_far and not lr_moved
    if not persistent or (quiet and not costly) or (recovered is not False and lr_story["lr_scheduled"]):
        severity, needs = "info", False
    elif recovered is False or costly:
        severity, needs = "critical", True
    else:
        severity, needs = "warning", False
    finite_l = loss[onset:end + 1][np.isfinite(loss[onset:end + 1])]
    peak_loss = float(finite_l.max()) if len(finite_l) else None  # None, not NaN: evidence is JSON
    lg = sc.log_grad.view[onset:end + 1]
    peak_g = float(np.nanmax(lg)) if np.isfinite(lg).any() else math.nan
    first_z = (zl_c[0], zg_c[0])
    grad_first = bool(first_z[1] > cfg.z_band and not first_z[0] > cfg.z_band)
    evidence = {
        "rule": ep.rule, "baseline_loss": base, "loss_sigma": f["scale"], "trend_slope": f["slope"],
        "peak_loss": peak_loss, "loss_rise": None if peak_loss is None else peak_loss - base,
        "observations_out_of_band": num_out, "observations_far_out": num_far, "threshold_sigmas": f["thr_loss"],
        "alarm_sigmas": f["alarm_loss"],
        "baseline_grad_norm": math.exp(f["glevel"]) if math.isfinite(f["glevel"]) else None,
        "peak_grad_norm": math.exp(peak_g) if math.isfinite(peak_g) else None,
        "grad_norm_ratio": (math.exp(float(np.nanmedian(lg)) - f["glevel"])
                            if math.isfinite(f["glevel"]) and np.isfinite(lg).any() else None),
        "grad_norm_moved_first": grad_first, "blip": not persistent, "noise_grew": bool(ep.data.get("noise_grew")),
        "trigger_step": int(steps[max(ep.trigger, onset)]),
        "detected_step": int(steps[out_of_patience]) if recovered is False
        else int(steps[max(ep.trigger, onset)]),
        **lr_story, **lasting,
        "recovery_steps": recovery_steps(steps, onset, ep.recovered_at),
        "uncorroborated": quiet,
    }
    if recovered is False and loss_moved:  # still climbing at the end is a change in slope: a divergence's shape
        se = climb_se(loss[onset:end + 1], 2 * cfg.recovery_obs)
        evidence.update(climb_se=None if math.isnan(se) else se,
                        climbing=bool(se >= sc.ctx.config.divergence.growth_z))
    if recovered is False or lr_story["lr_still_raised"]:  # a divergence's onset is where the trend broke
        at, growth = cause_start(steps, obs, onset, sc.ctx.history, sc.ctx.config.divergence, sc.ctx.config.lr,
                                 sc.ctx.config.advice, until=peak_i, trained_lr=sc.ctx.trained_lr)
        evidence.update(growth, trend_break_step=int(steps[at]))
    return Finding(kind="spike", onset_step=int(steps[onset]), end_step=int(steps[end]), peak_step=int(steps[peak_i]),
                   segment=sc.ctx.segment, severity=severity, self_recovered=recovered, needs_action=needs,
                   evidence=evidence, message=_message(evidence, steps[onset], recovered, loss_moved, costly))


def in_band_until(z: np.ndarray, band: float) -> bool:
    """Were the rows ``z`` (an excursion's residuals up to a cause inside it) in band: none out, or most of them from
    the first one out on? A CUSUM dates a shift at its last zero, a few rows before the first row out of band (its
    lead-in, summing a lift each row of which is under the band): those rows say nothing of the band (test 88's
    guard, a 4-sigma lift dated two rows early by the burst CUSUM, moved past the LR doubling three rows in)."""
    out = np.flatnonzero(z > band)
    return not len(out) or bool(np.median(z[out[0]:]) < band)


def patience_ran_out(steps: np.ndarray, onset: int, n: int, last_out: int, cfg: SpikeConfig) -> int | None:
    """The row at which an open excursion from row ``onset`` (data up to row ``n - 1``) has outlasted its patience,
    or None: out for ``patience_obs`` rows, or on a coarse log sooner, once it has been out for ``patience_obs``
    training steps over more than ``recovery_obs`` rows (enough to have shown a recovery). A spike comes back
    within so many updates, not rows: a log every 10 steps would otherwise wait 160 steps to call a loss 300x its
    level for 135 steps anything but "not back yet" (fresh seed 402220's run 121, drawn at the freeze 0d6c708).
    Out means up to ``last_out``, its last row out of band (``n - 1`` while it still is): rows back in band at the end of
    the data are a recovery under way, not yet confirmed, though they count among the rows that could have shown
    one (BLOOM 31214's excerpt: out at 31215-31222, a gap in the log, back at 31250-31251; 35 steps from its
    onset, but out for 7 of them)."""
    if last_out - onset + 1 >= cfg.patience_obs:
        return onset + cfg.patience_obs - 1
    first = onset + cfg.recovery_obs  # the first row with more than recovery_obs rows since the onset
    if first >= n or steps[last_out] - steps[onset] < cfg.patience_obs:
        return None
    late = np.flatnonzero(steps[first:n] - steps[onset] >= cfg.patience_obs)
    return first + int(late[0]) if len(late) else None


def cold_spread(prior: np.ndarray, min_obs: int) -> float:
    """The noise sigma of the observations before a cold row (``SpikeScanner._baselines``): 1.4826 x their first
    differences' MAD over sqrt(2), as a block's (``core.block_stats``), so a warm-up's fall within them is not read as
    noise; 0 with fewer than ``min_obs``. Before a noise model exists a page wants a gross rise, but a rise within the
    spread of the rows it is judged against is their noise however gross (fresh seed 344831's run 130, batch 2
    every 5 steps: the loss 2.0-5.9 over the 16 rows before 5.95, a rise of 74% read as a spike never back)."""
    if len(prior) < min_obs:
        return 0.0
    return MAD_TO_SIGMA * float(block_stats(prior[None, :], detrend=True)[1][0])


def _longest_run(mask: np.ndarray) -> int:
    """Length of the longest run of True values."""
    if not mask.any():
        return 0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return int((edges[1::2] - edges[::2]).max())


def _lasting_cost(sc: SpikeScanner, ep: Episode, loss: np.ndarray, n: int) -> dict:
    """How far above the pre-onset trend carried forward the loss stays once back (the lasting cost), and
    above the pre-onset level itself: measured after the recovery window, over ``lasting_obs``. Where the data ends
    within ``recovery_obs`` of that window, over the rows since the recovery: the run as it is now, not nothing
    (a report read when a long burst has just come back, as at the end of a run, saw no cost at all). The rows of a
    later excursion that opened an episode of its own (a cause of its own: ``_open``), up to the end of its recovery
    window, are left out: they are its values, not this one's cost (fresh seed 826151's run 115: an LR burst back at
    426, a second burst from 443 inside the window, and the first burst's "lasting cost" was the second's 49 sigma;
    the rows after a later excursion came back are the run settled again, and still this one's cost)."""
    a = ep.recovered_at + sc.cfg.recovery_obs
    if n - a < sc.cfg.recovery_obs:
        a = ep.recovered_at
    spans, at, want = [], a, sc.cfg.lasting_obs
    first = bisect.bisect_right(sc.closed, ep.onset, key=lambda e: e.onset)  # the closed ones are in onset order
    for e in [*sc.closed[first:], sc.episode]:  # each later one skipped up to the end of its recovery window
        if e is None or want <= 0:
            break
        if e.onset > at:
            spans.append(np.arange(at, min(e.onset, at + want)))
            want -= len(spans[-1])
        at = max(at, n if e.is_open else e.recovered_at + sc.cfg.recovery_obs)
    spans.append(np.arange(at, min(n, at + max(want, 0))))
    rows = np.concatenate(spans)
    rows = rows[np.isfinite(loss[rows])]
    if len(rows) < sc.cfg.recovery_obs:
        return {}
    after, f = loss[rows], ep.frozen
    trend = float(np.median(after - sc.projection(ep, a, int(rows[-1]) + 1)[rows - a]))
    level = float(np.median(after)) - f["level"]
    return {"lasting_cost": trend, "lasting_cost_sigmas": trend / f["scale"], "lasting_above_level": level,
            "lasting_above_level_sigmas": level / f["scale"]}


def _message(ev: dict, onset_step: int, recovered: bool | None, loss_moved: bool, costly: bool) -> str:
    out = ev["observations_out_of_band"]
    # Three rows near the clip the burst CUSUM noted have none past the single-observation bar (test 123).
    blip = (f"short loss burst, {out} observations out of band" if ev["observations_far_out"] == 0 and out > 1
            else "one-step loss spike" if out <= 1 else "loss spike, one observation far out")
    # A blip is a bad batch's look, unless the LR rose into it: then the LR is the cause the message names.
    guess = "" if ev.get("lr_raised") else " (a bad batch?)"
    what = ("loss spike" if not ev["blip"] else f"{blip}{guess}") if loss_moved else "gradient-norm blip"
    if ev.get("noise_grew"):
        return (f"the loss noise grew from step {int(onset_step)}: values far below its level {ev['baseline_loss']:.4g}"
                f" as well as above it (up to {fmt_value(ev['peak_loss'])}); a wider spread, not a spike")
    if ev["rule"] == "cusum" and not ev["blip"]:
        what = "sustained loss rise"
    text = f"{what} from step {int(onset_step)}: loss {ev['baseline_loss']:.4g} -> {fmt_value(ev['peak_loss'])}"
    if ev["baseline_grad_norm"] and ev["peak_grad_norm"]:
        text += f", grad norm {ev['baseline_grad_norm']:.3g} -> {ev['peak_grad_norm']:.3g}"
    if ev["grad_norm_moved_first"]:
        text += " (grad norm moved first)"
    if ev.get("lr_raised"):
        text += f" after the LR rose x{ev['lr_ratio']:.3g}" + (" (the schedule)" if ev["lr_scheduled"] else "")
    elif ev.get("lr_restart_step") is not None:
        text += f" after the schedule's warm restart of the LR at step {ev['lr_restart_step']}"
    if recovered is True:
        text += f"; back to its trend after {ev['recovery_steps']} steps"
        if costly:
            text += f" but {ev['lasting_cost']:.3g} ({ev['lasting_cost_sigmas']:.1f} sigma) above it since"
    elif recovered is False:
        text += "; not back to its trend"
    else:
        text += "; not back to trend yet"
    if ev.get("uncorroborated") and not costly:
        alone = "a short burst" if ev["rule"] == "burst" else "a small shift"
        text += (f" ({alone} alone: no observation far out" if ev["rule"] != "shewhart" else
                 f" (inside this run's own tail: no observation past its paging bar of {ev['alarm_sigmas']:.3g} sigmas")
        text += ", the LR and gradient norm steady; noted, not paged)"
    return text


def detect_spikes(steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, segment: int = 0,
                  lr: np.ndarray | None = None, config: object | None = None) -> list[Finding]:
    """Offline: every spike in one segment's observations (rows where the loss was logged)."""
    from runwatch.detectors.config import DEFAULT

    obs = {"step": np.asarray(steps, dtype=np.int64), "loss": np.asarray(loss, dtype=np.float64),
           "grad_norm": np.asarray(grad, dtype=np.float64)}
    obs["lr"] = np.full(len(obs["step"]), np.nan) if lr is None else np.asarray(lr, dtype=np.float64)
    scanner = SpikeScanner(ScanContext(segment=segment, config=config or DEFAULT))
    scanner.advance(obs)
    return scanner.findings(obs)
