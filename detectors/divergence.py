"""Divergence: the loss climbs and keeps climbing, with elevated gradient norms and a growing activation norm.

Judged on completed blocks of loss observations (robust block medians), so
batch noise, evaluation noise and single spikes do not move it: divergence is
confirmed at a block whose median is above each of the three blocks before
it in turn (three rises in a row), most of whose observations are high, and which sits at least ``MIN_RISE`` of the loss level
and ``Z_RISE`` per-observation sigmas above the best level reached so far.
Onset is the observation after the last one at or below that best level, i.e.
where the climb began. The loss falling back near its best level ends it
(self-recovered); otherwise it needs action. Gradient-norm and activation-norm
ratios (climb vs. best block) are evidence, and raise the severity story, but
the loss decides.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.finding import Finding
from runwatch.detectors.series import BLOCK, MAD_TO_SIGMA, MIN_BLOCKS, TrailingBaseline, row_median

ACT_GROWTH = 1.2
"""Activation-norm growth (x) into an onset that counts as its precursor."""
ACT_BLOCKS = 64
"""The whole history before an onset is searched for an activation-norm precursor, in at most ~64 blocks."""
LR_RISE = 1.5
LR_LOOKBACK = 128
"""Observations before a loss climb searched for the learning-rate rise that caused it."""
PRECURSOR_ACT = 3.0
PRECURSOR_GRAD = 2.0
"""Activation norm x3 and gradient norm x2 on an accelerating climb: divergence even before the loss moves."""
RAMP_BLOCKS = 32
"""Blocks (since the best level, at most) that the ramp-versus-jump test looks at."""
MIN_RISE = 0.05
Z_RISE = 3.0
SUSTAINED = 0.75
"""Fraction of the confirming block that must sit above the best level plus half the rise threshold."""
MAX_ONSET_WINDOW = 512
"""Observations searched for where the climb began (bounds the one-off O(m^2) fit)."""


def _fit_sse(y: np.ndarray) -> tuple[float, float]:
    """Least-squares error of the best jump (flat, flat) and best ramp (flat, then linear) fits."""
    m = len(y)
    t = np.arange(m, dtype=np.float64)
    knots = np.arange(1, m - 1)
    # Jump at k: two means.
    csum, csq = np.cumsum(y), np.cumsum(y * y)
    left_n, right_n = knots, m - knots
    left_s, right_s = csum[knots - 1], csum[-1] - csum[knots - 1]
    sse_jump = (csq[-1] - left_s ** 2 / left_n - right_s ** 2 / right_n).min()
    # Ramp from k: intercept + slope * max(0, t - k).
    h = np.maximum(t[None, :] - knots[:, None], 0.0)
    hc, yc = h - h.mean(axis=1, keepdims=True), y - y.mean()
    slope = (hc @ yc) / np.maximum((hc * hc).sum(axis=1), 1e-300)
    sse_ramp = ((yc[None, :] - slope[:, None] * hc) ** 2).sum(axis=1).min()
    return float(sse_jump), float(sse_ramp)


def ramp_beats_jump(block_medians: np.ndarray) -> bool:
    """True when the block medians since the best level look like a climb rather than one step up."""
    y = block_medians[np.isfinite(block_medians)]
    if len(y) < 4:
        return False
    sse_jump, sse_ramp = _fit_sse(y)
    return sse_ramp < sse_jump


def hinge_onset(values: np.ndarray) -> int:
    """Index where a flat-then-rising (hinge) least-squares fit puts the start of the climb.

    For a slow climb, "the last value at the best level" lands well after the
    real start; the hinge fit uses every observation of the climb instead.
    Every candidate knot is scored in O(1) from suffix sums, so a long window
    costs O(m) memory rather than a (knots x m) matrix.
    """
    ok = np.isfinite(values)
    y, t = values[ok], np.flatnonzero(ok).astype(np.float64)
    m = len(y)
    if m < 4:
        return 0
    knots = t[:-2]
    # Observations with t > knot j are those from index j + 1 on (t is increasing).
    def suffix(x: np.ndarray) -> np.ndarray:
        return np.cumsum(x[::-1])[::-1][1 : m - 1]

    n, s_t, s_tt = np.arange(m - 1, 1, -1, dtype=np.float64), suffix(t), suffix(t * t)
    s_ty, s_y = suffix(t * y), suffix(y)
    # Sums of the hinge regressor h = max(t - knot, 0), of h^2 and of h*y.
    s_h = s_t - knots * n
    s_hh = s_tt - 2 * knots * s_t + knots * knots * n
    s_hy = s_ty - knots * s_y
    y_mean = y.mean()
    shh = s_hh - s_h * s_h / m  # centred sum of squares of h
    shy = s_hy - s_h * y_mean  # centred cross product with y
    slope = shy / np.maximum(shh, 1e-300)
    sse = ((y - y_mean) ** 2).sum() - slope * shy
    sse = np.where(slope > 0, sse, np.inf)  # only rising fits
    best = int(np.argmin(sse)) if np.isfinite(sse).any() else 0
    return int(knots[best]) + 1 if best or np.isfinite(sse[0]) else 0


def act_growth_start(steps: np.ndarray, act: np.ndarray, before_step: int) -> int | None:
    """First step of an activation-norm climb that runs into ``before_step``, or None.

    On block medians of everything before ``before_step``: walk back from the
    end while the local slope stays at least a third of the average slope from
    there to the end. The climb counts as a precursor when it reached
    ``ACT_GROWTH`` x and is not decelerating (its second half rises at least as
    fast as its first, within 20%): early-training growth that levels off is not one.
    """
    ok = np.isfinite(act) & (steps < before_step)
    s, a = steps[ok], act[ok]
    block = max(BLOCK, len(a) // ACT_BLOCKS)
    nb = len(a) // block
    if nb < 4:
        return None
    tail = len(a) - nb * block  # blocks end at before_step
    y = row_median(a[tail:].reshape(nb, block))
    if not np.isfinite(y).all():
        return None
    d, last = np.diff(y), nb - 1
    start = last
    for j in range(last - 1, -1, -1):
        local = (d[j] + d[j - 1]) / 2 if j >= 1 else d[j]
        if local < (y[last] - y[j]) / (last - j) / 3 or local <= 0:
            break
        start = j
    if last - start < 2 or not y[last] >= ACT_GROWTH * y[start]:
        return None
    if start == 0:
        return None  # rising since the first observations: early training, with no flat stretch to depart from
    mid = (start + last) // 2
    first_rate, second_rate = (y[mid] - y[start]) / (mid - start), (y[last] - y[mid]) / (last - mid)
    if second_rate < 0.8 * first_rate:  # decelerating: training settling, not blowing up
        return None
    # Refine inside the block: a hinge fit over the raw values around the start.
    lo = tail + max(start - 1, 0) * block
    hi = min(tail + (start + 3) * block, len(a))
    return int(s[lo + hinge_onset(a[lo:hi])])


def lr_rise_start(lr: np.ndarray, onset: int) -> int | None:
    """Start of a learning-rate rise (>= ``LR_RISE`` x) that runs into the onset, if the LR is logged.

    An LR that went up just before the loss climbed is the cause: the healthy
    state is before it, and the fix is the LR.
    """
    lo = max(0, onset - LR_LOOKBACK)
    window = lr[lo:onset + 1]
    if len(window) < 2 or not np.isfinite(window).all():
        return None
    falls = np.flatnonzero(np.diff(window) < 0)
    start = lo + (int(falls[-1]) + 1 if len(falls) else 0)
    if start >= onset or not lr[onset] >= LR_RISE * lr[start] or lr[start] <= 0:
        return None
    rising = np.flatnonzero(lr[start:onset + 1] > lr[start])
    return start + int(rising[0]) if len(rising) else None


def act_precursor(steps: np.ndarray, act: np.ndarray, grad: np.ndarray, segment: int) -> Finding | None:
    """Divergence caught early: activation and gradient norms blowing up before the loss moves (OPT)."""
    if len(steps) == 0:
        return None
    climb = act_growth_start(steps, act, int(steps[-1]) + 1)
    if climb is None:
        return None
    i = int(np.searchsorted(steps, climb))
    before = slice(max(0, i - BLOCK), i + 1)
    end = slice(max(i + 1, len(steps) - BLOCK), len(steps))
    act_ratio, grad_ratio = _ratio(act, before, end), _ratio(grad, before, end)
    if act_ratio is None or grad_ratio is None or act_ratio < PRECURSOR_ACT or grad_ratio < PRECURSOR_GRAD:
        return None
    return Finding(kind="divergence", onset_step=climb, end_step=int(steps[-1]), peak_step=int(steps[-1]),
                   segment=segment, severity="critical", self_recovered=False, needs_action=True,
                   evidence={"act_norm_ratio": act_ratio, "grad_norm_ratio": grad_ratio, "act_norm_climb_step": climb,
                             "loss_moved": False},
                   message=f"diverging from step {climb}: activation norm x{act_ratio:.2g} and gradient norm "
                           f"x{grad_ratio:.2g} and still climbing, before the loss has moved (OPT's precursor)")


class _Offset:
    """A list indexed as if it started at ``offset`` (block numbers stay global)."""

    def __init__(self, values: list[float], offset: int) -> None:
        self.values, self.offset = values, offset

    def __getitem__(self, key: int | slice) -> float | list[float]:
        if isinstance(key, slice):
            return self.values[key.start - self.offset:key.stop - self.offset]
        return self.values[key - self.offset]


class DivergenceScanner:
    """Incremental over one segment's loss observations, one completed block at a time."""

    def __init__(self, segment: int = 0) -> None:
        self.segment = segment
        self.blocks = TrailingBaseline(rel_floor=1e-3, abs_floor=1e-12)
        self.done = 0  # blocks judged
        self.best: tuple[float, int, float] | None = None  # (median, block, sigma)
        self.episode: dict | None = None
        self.closed: list[tuple[dict, int, bool]] = []

    def advance(self, loss: np.ndarray) -> None:
        self.blocks.update(loss)
        med, mad = self.blocks.med.view, self.blocks.mad.view
        if len(med) == self.done:
            return
        # Plain floats: the per-block test is a few comparisons, numpy only on candidate blocks.
        # Only the last RAMP_BLOCKS + a few blocks are ever looked at again, so only those are converted.
        offset = max(0, self.done - RAMP_BLOCKS - 8)
        meds = _Offset(med[offset:].tolist(), offset)
        for b in range(self.done, len(med)):
            self._judge(b, meds, mad, loss)
        self.done = len(med)

    def _threshold(self) -> float:
        best, _, sigma = self.best
        return max(MIN_RISE * abs(best), Z_RISE * sigma)

    def _judge(self, b: int, med: "_Offset", mad: np.ndarray, loss: np.ndarray) -> None:
        m = med[b]
        if m != m:  # NaN block (mostly non-finite)
            return
        if self.episode is not None:
            if m <= self.best[0] + 0.5 * self._threshold():
                self.closed.append((self.episode, b * BLOCK - 1, True))
                self.episode, self.best = None, (m, b, MAD_TO_SIGMA * float(mad[b]))
            return
        if self.best is None or m < self.best[0]:
            self.best = (m, b, MAD_TO_SIGMA * float(mad[b]))
            return
        if b < MIN_BLOCKS + 1 or b - self.best[1] < 3 or m - self.best[0] < self._threshold():
            return
        if not med[b] > med[b - 1] > med[b - 2] > med[b - 3]:
            return
        # Sustained, not a few bumps dragging a median: most of the last block is well above the best level.
        last = loss[b * BLOCK:(b + 1) * BLOCK]
        if np.mean(last > self.best[0] + 0.5 * self._threshold()) < SUSTAINED:
            return
        # A ramp must explain the blocks since the best level better than a single jump does:
        # a loss that jumped once and stays flat is an unrecovered spike, not a climb.
        if not ramp_beats_jump(np.asarray(med[max(self.best[1], b - RAMP_BLOCKS):b + 1])):
            return
        start, stop = max(self.best[1] * BLOCK, (b + 1) * BLOCK - MAX_ONSET_WINDOW), (b + 1) * BLOCK
        onset = start + hinge_onset(loss[start:stop])
        self.episode = {"onset": onset, "confirm": stop - 1, "best": self.best}

    def findings(self, steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, act: np.ndarray, lr: np.ndarray) -> list[Finding]:
        items = list(self.closed) + ([(self.episode, len(loss) - 1, False)] if self.episode else [])
        out = [classify(ep, end, rec, steps, loss, grad, act, lr, self.segment) for ep, end, rec in items]
        if self.episode is None:
            early = act_precursor(steps, act, grad, self.segment)
            if early is not None:
                out.append(early)
        return out


def _ratio(values: np.ndarray, before: slice, during: slice) -> float | None:
    a, b = values[before], values[during]
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not len(a) or not len(b) or np.median(a) <= 0:
        return None
    return float(np.median(b) / np.median(a))


def classify(ep: dict, end: int, recovered: bool, steps: np.ndarray, loss: np.ndarray, grad: np.ndarray,
             act: np.ndarray, lr: np.ndarray, segment: int) -> Finding:
    onset = ep["onset"]
    # The final-layer activation norm often starts climbing long before the loss (OPT): that is the onset.
    climb = act_growth_start(steps, act, int(steps[onset]))
    act_onset = int(np.searchsorted(steps, climb)) if climb is not None else None
    if act_onset is not None and act_onset < onset:
        onset = act_onset
    lr_start = lr_rise_start(lr, ep["onset"])
    if lr_start is not None and lr_start < onset:
        onset = lr_start
    best, best_b, sigma = ep["best"]
    before = slice(best_b * BLOCK, (best_b + 1) * BLOCK)
    during = slice(onset, end + 1)
    span = np.where(np.isfinite(loss[during]), loss[during], -np.inf)
    peak = onset + int(np.argmax(span)) if len(span) else onset
    grad_ratio, act_ratio = _ratio(grad, before, during), _ratio(act, before, during)
    evidence = {"best_loss": best, "loss_sigma": sigma, "peak_loss": float(span.max()) if len(span) else None,
                "grad_norm_ratio": grad_ratio, "act_norm_ratio": act_ratio,
                "lr_at_onset": float(lr[onset]) if math.isfinite(lr[onset]) else None,
                "confirmed_step": int(steps[min(ep["confirm"], len(steps) - 1)]),
                "loss_climb_step": int(steps[ep["onset"]]), "act_norm_climb_step": climb,
                "lr_rise_step": int(steps[lr_start]) if lr_start is not None else None}
    extra = []
    if grad_ratio is not None:
        extra.append(f"grad norm x{grad_ratio:.2g}")
    if act_ratio is not None:
        extra.append(f"act norm x{act_ratio:.2g}")
    message = (f"loss diverging from step {int(steps[onset])}: {best:.4g} -> {evidence['peak_loss']:.4g}"
               + (f" ({', '.join(extra)})" if extra else "")
               + ("; it came back down" if recovered else "; still climbing or high at the last step"))
    return Finding(kind="divergence", onset_step=int(steps[onset]), end_step=int(steps[end]), peak_step=int(steps[peak]),
                   segment=segment, severity="warning" if recovered else "critical", self_recovered=recovered,
                   needs_action=not recovered, evidence=evidence, message=message)


def detect_divergence(steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, act: np.ndarray, lr: np.ndarray,
                      segment: int = 0) -> list[Finding]:
    """Offline: every divergence in one segment's loss observations (other signals on the same rows)."""
    scanner = DivergenceScanner(segment)
    loss = np.asarray(loss, dtype=np.float64)
    scanner.advance(loss)
    return scanner.findings(np.asarray(steps), loss, *(np.asarray(a, dtype=np.float64) for a in (grad, act, lr)))
