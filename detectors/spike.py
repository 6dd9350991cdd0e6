"""Loss spikes: the loss (and the gradient norm) leave their trend, then come back or not.

An excursion is a run of observations more than ``Z_LOW`` robust sigmas above
the trailing baseline (loss, or log gradient norm); it becomes an episode when
one observation goes past ``Z_HIGH``. Onset is the first observation of that
run, so a gradient norm that moved first (BLOOM 31214: 0.24 -> 0.95 while the
loss barely moved) sets it. The baseline is frozen at onset; the episode ends
when loss and gradient norm are back under the frozen band for two
observations in a row (self-recovered) or after ``RECOVERY_WINDOW``
observations without that (not recovered: needs action).

What is deliberately not a finding: a loss excursion with fewer than
``MIN_FAR_OUT`` observations beyond ``Z_HIGH`` and a quiet gradient norm (heavy-tailed per-batch noise, e.g. modded-nanogpt's
+0.5..1.5 one-step bumps), and rises under ``MIN_RISE`` of the loss level. A
gradient-norm blip that recovers at once (llm.c steps 7435, 9025) is an 'info'
finding that never needs action.

``SpikeScanner.advance`` consumes observations incrementally; running it once
over a whole series and running it one observation at a time give the same
findings (the streaming guarantee).
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.finding import Finding
from runwatch.detectors.series import BLOCK, MIN_BLOCKS, Grow, TrailingBaseline, safe_log

Z_LOW = 3.0
"""Robust sigmas above baseline that count as 'out of the band' (excursion extent, recovery)."""
Z_HIGH = 6.0
"""Robust sigmas one observation must reach to make an excursion an episode."""
MIN_RISE = 0.03
"""A loss spike must rise at least 3% of the loss level: smaller is not worth a page."""
MIN_GRAD_RATIO = 4.0
"""A gradient-norm excursion must at least quadruple the norm: real runs (llm.c) have many 2-3x blips."""
MIN_FAR_OUT = 2
"""Observations beyond ``Z_HIGH`` a loss spike needs; fewer (with a quiet gradient norm) is batch noise."""
BAD_BATCH_RATIO = 2.0
"""A single observation at twice the loss level is a bad batch worth an 'info' line, not batch noise
(heavy-tailed per-step noise, e.g. modded-nanogpt, stays under about 1.6x)."""
SHORT_SPIKE = 3
"""A recovered spike out of band for at most this many observations is 'info' (a bad batch or two)."""
RECOVERY_WINDOW = 200
COLD_OBS = MIN_BLOCKS * BLOCK
COLD_LOSS_RISE = 0.5
COLD_GRAD_RATIO = 4.0
COLD_JUMP = 1.5
COLD_JUMP_GRAD = 2.0
"""Before the baseline exists: loss at 1.5x the median of the earlier observations with the gradient
norm at 2x its median (when logged) is a spike even for one observation: a per-batch loss bump
rarely comes with the gradient norm doubling (tr8-104B excerpts: 6.44 -> 11.42, grad norm x2.2)."""
RECOVERY_CHECK = 8
"""Observations from the first in-band one of which 75% must be in band to call it recovered."""
LR_JUMP = 1.5
"""A one-observation LR rise that counts as a jump (warm-up schedules rise by far smaller steps)."""
LEVEL_SIGMAS = 1.5
"""Recovered also means the median of the check window is within 1.5 sigmas (or ``MIN_RISE``) of the
pre-spike baseline: the median of 8 noisy observations is within ~0.5 sigma of its level."""
STILL_OUT = 16
"""An open episode whose last 16 observations are all out of band already counts as not recovered."""
"""Observations an episode may take to come back before it counts as not recovered."""


class SpikeScanner:
    """Incremental spike detection over one segment's loss and gradient-norm observations."""

    def __init__(self, segment: int = 0) -> None:
        self.segment = segment
        self.loss_base = TrailingBaseline(rel_floor=1e-3, abs_floor=1e-12)
        self.grad_base = TrailingBaseline(rel_floor=0.0, abs_floor=0.02)
        self.pos = 0  # next observation to look at
        self.floor = 0  # an excursion may not start before this (end of the last episode)
        self.streak_start: int | None = None  # start of the elevated run that reaches pos-1
        self.episode: dict | None = None
        self.dead_from: int | None = None  # after an unrecovered episode: wait for the band
        self.closed: list[tuple[dict, int, bool | None]] = []  # (episode, end index, recovered)
        self.log_grad = Grow()

    def advance(self, loss: np.ndarray, grad: np.ndarray) -> None:
        """Look at every observation not seen yet; ``loss``/``grad`` are the whole series so far."""
        n = len(loss)
        if n <= self.pos:
            return
        self.log_grad.extend(safe_log(grad[self.log_grad.size:n]))  # incremental: O(new rows) per call
        log_grad = self.log_grad.view
        self._loss, self._log_grad = loss, log_grad
        self.loss_base.update(loss)
        self.grad_base.update(log_grad)
        lo = self.pos
        z_l, z_g, rise_l, rise_g = self._scores(loss, log_grad, lo, n)
        elevated = (z_l > Z_LOW) | (z_g > Z_LOW)
        trigger = ((z_l > Z_HIGH) & (rise_l >= MIN_RISE)) | ((z_g > Z_HIGH) & (rise_g >= math.log(MIN_GRAD_RATIO)))
        i = lo
        while i < n:
            if self.episode is not None:
                i = self._follow_episode(loss, log_grad, i, n)
            elif self.dead_from is not None:
                calm = np.flatnonzero(~elevated[i - lo:])
                if not len(calm):
                    i = n
                    break
                i += int(calm[0])
                self.dead_from, self.floor, self.streak_start = None, i, None
            else:
                i = self._find_trigger(elevated, trigger, lo, i, n)
        self.pos = n

    def _scores(self, loss: np.ndarray, log_grad: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        base_l, scale_l = self._baseline(self.loss_base, loss, lo, hi, False)
        base_g, scale_g = self._baseline(self.grad_base, log_grad, lo, hi, True)
        with np.errstate(invalid="ignore", divide="ignore"):
            z_l = (loss[lo:hi] - base_l) / scale_l
            rise_l = (loss[lo:hi] - base_l) / np.abs(base_l)
            z_g = (log_grad[lo:hi] - base_g) / scale_g
            rise_g = log_grad[lo:hi] - base_g
        return np.nan_to_num(z_l, nan=-np.inf), np.nan_to_num(z_g, nan=-np.inf), rise_l, rise_g

    def _baseline(self, trailing: TrailingBaseline, x: np.ndarray, lo: int, hi: int, log: bool) -> tuple[np.ndarray, np.ndarray]:
        """Trailing block baseline; before it exists (the first ``COLD_OBS`` observations: short log
        excerpts, the start of a segment) the median of all earlier observations, with a scale that
        puts ``Z_HIGH`` at +50% loss or 4x gradient norm, so only gross excursions count."""
        base, scale = trailing.at(lo, hi)
        cold = min(hi, COLD_OBS)
        if lo < cold:
            base, scale = base.copy(), scale.copy()
            for i in range(max(lo, 1), cold):
                prior = x[:i][np.isfinite(x[:i])]
                if len(prior) and not np.isfinite(base[i - lo]):
                    m = float(np.median(prior))
                    base[i - lo] = m
                    scale[i - lo] = (math.log(COLD_GRAD_RATIO) if log else COLD_LOSS_RISE * abs(m)) / Z_HIGH
        return base, scale

    def _find_trigger(self, elevated: np.ndarray, trigger: np.ndarray, lo: int, i: int, n: int) -> int:
        """Idle: move to the next triggering observation, tracking where its elevated run began."""
        hits = np.flatnonzero(trigger[i - lo:])
        stop = n if not len(hits) else i + int(hits[0])
        window = elevated[i - lo: stop - lo + (stop < n)]
        quiet = np.flatnonzero(~window)
        if len(quiet):
            self.streak_start = i + int(quiet[-1]) + 1
        elif self.streak_start is None:
            self.streak_start = i
        if stop == n:
            if not elevated[n - 1 - lo]:
                self.streak_start = None
            return n
        onset = max(self.streak_start, self.floor)
        self._open_episode(onset, stop)
        self.streak_start = None
        return stop + 1

    def _open_episode(self, onset: int, trigger: int) -> None:
        base_l, scale_l = (float(v[0]) for v in self._baseline(self.loss_base, self._loss, onset, onset + 1, False))
        base_g, scale_g = (float(v[0]) for v in self._baseline(self.grad_base, self._log_grad, onset, onset + 1, True))
        if not math.isfinite(base_l):  # no history at the onset: judge against the trigger's baseline
            base_l, scale_l = (float(v[0]) for v in self._baseline(self.loss_base, self._loss, trigger, trigger + 1, False))
        if not math.isfinite(base_g):
            base_g, scale_g = (float(v[0]) for v in self._baseline(self.grad_base, self._log_grad, trigger, trigger + 1, True))
        self.episode = {
            "onset": onset, "trigger": trigger, "base_loss": base_l, "scale_loss": scale_l,
            "base_log_grad": base_g, "scale_log_grad": scale_g,
            "loss_band": base_l + max(Z_LOW * scale_l, MIN_RISE * abs(base_l)),
            "grad_band": base_g + max(Z_LOW * scale_g, math.log(1.5)) if math.isfinite(base_g) else math.inf,
        }

    def _ok(self, loss: np.ndarray, log_grad: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Observations back inside the frozen band (an unmeasured gradient norm does not object)."""
        ep = self.episode
        grad = log_grad[lo:hi]
        return (loss[lo:hi] <= ep["loss_band"]) & (np.isnan(grad) | (grad <= ep["grad_band"]))

    def _follow_episode(self, loss: np.ndarray, log_grad: np.ndarray, i: int, n: int) -> int:
        """In an episode: find two in-band observations in a row, or run out the window."""
        ep = self.episode
        t = ep["trigger"]
        first = ep.setdefault("next_check", t + 1)  # the first j whose check window was not complete yet
        last = min(t + RECOVERY_WINDOW, n - RECOVERY_CHECK)  # the check window after j must exist
        if last >= first:
            ok = self._ok(loss, log_grad, first, last + RECOVERY_CHECK)
            # Back means two in-band observations in a row and most of the next few in band too:
            # a noisy, still-elevated loss dips under the band now and then without having recovered.
            mostly = np.convolve(ok, np.ones(RECOVERY_CHECK), "valid")[: last - first + 1] >= 0.75 * RECOVERY_CHECK
            # ...and the level is back: a loss that came partly down but sits clearly above its old
            # trend (an LR jump still in effect) crosses a wide noise band now and then without that.
            level = _window_median(loss[first:last + RECOVERY_CHECK], RECOVERY_CHECK)[: last - first + 1]
            back = level <= ep["base_loss"] + max(LEVEL_SIGMAS * ep["scale_loss"], MIN_RISE * abs(ep["base_loss"]))
            pairs = np.flatnonzero(ok[: last - first + 1] & ok[1: last - first + 2] & mostly & back)
            if len(pairs):
                j = first + int(pairs[0])
                self.closed.append((ep, j - 1, True))
                self.episode, self.floor = None, j + RECOVERY_CHECK - 1
                return max(j + RECOVERY_CHECK - 1, i)
            ep["next_check"] = last + 1
        if n >= t + RECOVERY_WINDOW + RECOVERY_CHECK:
            resume = t + RECOVERY_WINDOW + RECOVERY_CHECK - 1
            self.closed.append((ep, t + RECOVERY_WINDOW, False))
            self.episode, self.dead_from = None, resume
            return resume
        return n

    def findings(self, steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, lr: np.ndarray | None = None) -> list[Finding]:
        """Closed episodes plus the one still open (``self_recovered`` None), as findings."""
        log_grad = safe_log(grad)
        out = [classify(ep, end, rec, steps, loss, log_grad, self.segment, lr) for ep, end, rec in self.closed]
        if self.episode is not None:
            out.append(classify(self.episode, len(loss) - 1, None, steps, loss, log_grad, self.segment, lr))
        return [f for f in out if f is not None]


def _lr_still_raised(lr: np.ndarray | None, onset: int, end: int) -> bool:
    """The LR jumped (one observation to the next, at most a few observations from the onset) by
    ``LR_JUMP`` x and is still that high at the episode's end: the cause is still in effect.
    A warm-up ramp rises by small steps, an LR burst is over by the end."""
    if lr is None or onset < 1:
        return False
    near = lr[max(0, onset - 4):min(len(lr), onset + 3)]
    prior = lr[max(0, onset - 4) - 1] if onset >= 5 else lr[0]
    ok = np.isfinite(near) & (near > 0)
    if not ok.any() or not (math.isfinite(prior) and prior > 0):
        return False
    seq = np.concatenate([[prior], near[ok]])
    jumps = seq[1:] / seq[:-1]
    return bool(jumps.max() >= LR_JUMP and math.isfinite(lr[end]) and lr[end] >= LR_JUMP * prior)


def _window_median(values: np.ndarray, width: int) -> np.ndarray:
    """Median of each run of ``width`` consecutive values (non-finite ones count as high)."""
    values = np.where(np.isfinite(values), values, np.inf)
    return np.median(np.lib.stride_tricks.sliding_window_view(values, width), axis=1)


def _lr_ratio(lr: np.ndarray | None, onset: int, end: int) -> float | None:
    """Median learning rate during the episode over the median of the observations just before it."""
    if lr is None:
        return None
    before, during = lr[max(0, onset - 16):onset], lr[onset:end + 1]
    before, during = before[np.isfinite(before) & (before > 0)], during[np.isfinite(during)]
    if not len(before) or not len(during):
        return None
    return float(np.median(during) / np.median(before))


def classify(ep: dict, end: int, recovered: bool | None, steps: np.ndarray, loss: np.ndarray,
             log_grad: np.ndarray, segment: int, lr: np.ndarray | None = None) -> Finding | None:
    """Turn an episode into a finding, or None when it is batch noise."""
    onset = ep["onset"]
    span_loss, span_grad = loss[onset:end + 1], log_grad[onset:end + 1]
    base_l, scale_l, base_g, scale_g = ep["base_loss"], ep["scale_loss"], ep["base_log_grad"], ep["scale_log_grad"]
    finite_l = np.where(np.isfinite(span_loss), span_loss, -np.inf)
    peak_i = int(np.argmax(finite_l))
    peak_loss = float(finite_l[peak_i])
    loss_spike = peak_loss > base_l + Z_HIGH * scale_l and peak_loss - base_l >= MIN_RISE * abs(base_l)
    num_loss_out = int(np.sum(span_loss > ep["loss_band"]))
    # Heavy-tailed batch noise makes one huge observation (now and then two in a row) and a
    # tail inside a few sigmas; a real spike keeps the loss far out for several observations.
    num_loss_high = int(np.sum(span_loss > base_l + Z_HIGH * scale_l))
    finite_g = np.where(np.isfinite(span_grad), span_grad, -np.inf)
    peak_g = float(finite_g.max()) if len(finite_g) else -math.inf
    grad_spike = math.isfinite(base_g) and peak_g > base_g + Z_HIGH * scale_g and peak_g - base_g >= math.log(MIN_GRAD_RATIO)
    bad_batch = loss_spike and base_l > 0 and peak_loss >= BAD_BATCH_RATIO * base_l
    # Very few earlier observations (a short excerpt, a segment's first lines): no noise model yet,
    # so a gross jump of loss and gradient norm together is what a person sees at once.
    cold_jump = (onset < COLD_OBS and loss_spike and base_l > 0 and peak_loss >= COLD_JUMP * base_l
                 and (not math.isfinite(base_g) or peak_g - base_g >= math.log(COLD_JUMP_GRAD)))
    if loss_spike and (num_loss_high >= MIN_FAR_OUT or cold_jump):
        blip = False
    elif grad_spike or bad_batch:
        blip = True
        if not loss_spike:
            peak_i = int(np.argmax(finite_g))
        what_blip = "gradient-norm blip" if grad_spike else "one-step loss spike (a bad batch?)"
    else:
        return None  # a one-observation loss bump with a quiet gradient norm: batch noise
    if recovered is None and not blip and len(span_loss) >= STILL_OUT and bool(np.all(span_loss[-STILL_OUT:] > ep["loss_band"])):
        recovered = False  # not over yet, but far out for a whole block: call it now, not in 200 steps
    if blip and recovered is not True:
        return None  # a gradient-norm level that moved and stays (warm-up, schedule) is a trend, not a blip
    if blip:
        severity, needs = "info", False
    else:
        short = recovered is True and num_loss_out <= SHORT_SPIKE
        severity = "critical" if recovered is False else ("info" if short else "warning")
        needs = recovered is False
    grad_moved_first = bool(np.isfinite(span_grad[0]) and span_grad[0] > base_g + Z_LOW * scale_g
                            and not span_loss[0] > ep["loss_band"])
    evidence = {
        "baseline_loss": base_l, "loss_sigma": scale_l, "peak_loss": peak_loss,
        "loss_rise": peak_loss - base_l, "observations_out_of_band": num_loss_out,
        "observations_far_out": num_loss_high,
        "baseline_grad_norm": math.exp(base_g) if math.isfinite(base_g) else None,
        "peak_grad_norm": math.exp(peak_g) if math.isfinite(peak_g) else None,
        "grad_norm_moved_first": grad_moved_first, "blip": blip, "trigger_step": int(steps[ep["trigger"]]),
        "grad_norm_ratio": (math.exp(float(np.median(span_grad[np.isfinite(span_grad)])) - base_g)
                            if math.isfinite(base_g) and np.isfinite(span_grad).any() else None),
        "lr_ratio": _lr_ratio(lr, onset, end),
        "lr_still_raised": _lr_still_raised(lr, onset, end),
    }
    what = what_blip if blip else "loss spike"
    span = end - onset + 1
    state = {True: "back to its pre-spike trend", False: f"not back to trend after {span} observations",
             None: "not back to trend yet"}[recovered]
    gn = evidence["peak_grad_norm"]
    message = (f"{what} from step {int(steps[onset])}: loss {base_l:.4g} -> {peak_loss:.4g}"
               + (f", grad norm {evidence['baseline_grad_norm']:.3g} -> {gn:.3g}" if gn and evidence["baseline_grad_norm"] else "")
               + (" (grad norm moved first)" if grad_moved_first else "") + f"; {state}")
    return Finding(kind="spike", onset_step=int(steps[onset]), end_step=int(steps[end]),
                   peak_step=int(steps[onset + peak_i]), segment=segment, severity=severity,
                   self_recovered=recovered, needs_action=needs, evidence=evidence, message=message)


def detect_spikes(steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, segment: int = 0) -> list[Finding]:
    """Offline: every spike in one segment's observations (rows where the loss was logged)."""
    scanner = SpikeScanner(segment)
    loss = np.asarray(loss, dtype=np.float64)
    grad = np.asarray(grad, dtype=np.float64)
    scanner.advance(loss, grad)
    return scanner.findings(np.asarray(steps), loss, grad)
