"""Divergence: a change in slope, not in level: the loss climbing block after block.

Judged on completed blocks of loss observations (robust block medians), so
batch noise and single spikes do not move it. A climb is confirmed at a block
whose median rose ``rising_blocks`` blocks in a row, most of whose
observations are high, that sits ``min_rise`` of the loss level and ``z_rise``
sigmas above the best level reached so far, and that a ramp explains better
than one jump (a jump that stays flat is an unrecovered spike). The onset is
where the trend broke: a hinge (flat, then rising) fit over the climb, moved
back to where the gradient norm or the final-layer activation norm began to
grow into it (OPT watched the activation norm rise before its blow-ups). An
LR that rose before the climb is evidence of the cause (``lr_rise_step``),
not the onset. The loss falling back near its best level ends it
(self-recovered); otherwise it needs action. The activation and gradient
norms blowing up before the loss moves (OPT's precursor) is a divergence too.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.config import AdviceConfig, DivergenceConfig, LRConfig
from runwatch.detectors.core import MAD_TO_SIGMA, BlockBaseline, Grow, row_median, safe_log, two_level_sse
from runwatch.detectors.finding import Finding, fmt_value, recovery_steps
from runwatch.detectors.scanner import Observations, ScanContext, own_findings

GROWTH_BLOCKS = 64
"""The history before an onset is searched for a growth precursor in at most ~64 blocks (bounds the cost)."""
BLOCK_ROWS = 16
"""The fewest rows in a block of that search: the median of 16 has a standard error of ~0.31 sigma."""
LR_LOOKBACK = 128
"""Observations before a climb searched for the learning-rate rise that caused it (its onset, then)."""


def _fit_sse(y: np.ndarray) -> tuple[float, float]:
    """Least-squares error of the best jump (flat, flat) and best ramp (flat, then linear) fits."""
    m = len(y)
    t = np.arange(m, dtype=np.float64)
    knots = np.arange(1, m - 1)
    sse_jump = two_level_sse(y, knots).min()
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

    Every candidate knot is scored in O(1) from suffix sums, so a long window
    costs O(m) memory rather than a (knots x m) matrix.
    """
    ok = np.isfinite(values)
    y, t = values[ok], np.flatnonzero(ok).astype(np.float64)
    m = len(y)
    if m < 4:
        return 0
    knots = t[:-2]

    def suffix(x: np.ndarray) -> np.ndarray:  # sums over the observations after knot j (index j+1 on)
        return np.cumsum(x[::-1])[::-1][1: m - 1]

    n, s_t, s_tt = np.arange(m - 1, 1, -1, dtype=np.float64), suffix(t), suffix(t * t)
    s_ty, s_y = suffix(t * y), suffix(y)
    s_h = s_t - knots * n
    s_hh = s_tt - 2 * knots * s_t + knots * knots * n
    s_hy = s_ty - knots * s_y
    y_mean = y.mean()
    shh = s_hh - s_h * s_h / m
    shy = s_hy - s_h * y_mean
    slope = shy / np.maximum(shh, 1e-300)
    sse = ((y - y_mean) ** 2).sum() - slope * shy
    sse = np.where(slope > 0, sse, np.inf)  # only rising fits
    best = int(np.argmin(sse)) if np.isfinite(sse).any() else 0
    return int(knots[best]) + 1 if best or np.isfinite(sse[0]) else 0


def growth_start(steps: np.ndarray, values: np.ndarray, before_step: int, min_growth: float,
                 growth_z: float = DivergenceConfig().growth_z) -> int | None:
    """First step of a climb of ``values`` that runs into ``before_step``, or None.

    On block medians of everything before ``before_step``: walk back from the
    end while the local slope stays at least a third of the average slope from
    there to the end. It counts when it grew ``min_growth`` x, began after a
    flat stretch (not rising since the first observations: early training),
    and is not decelerating (training settling, not blowing up).
    """
    ok = np.isfinite(values) & (steps < before_step)
    s, a = steps[ok], values[ok]
    block = max(BLOCK_ROWS, len(a) // GROWTH_BLOCKS)
    nb = len(a) // block
    if nb < 4:
        return None
    tail = len(a) - nb * block  # blocks end at before_step
    y = row_median(a[tail:].reshape(nb, block))
    if not np.isfinite(y).all():
        return None
    # The walk is on log values where the norm stays positive: a norm grows by ratios (a blow-up is exponential),
    # and on raw values the slopes of an exponential climb grow so fast that the walk stops a block or two from
    # its end (fresh seed 122814's run 120: block medians 2.95, 4.31, 7.99, 19.5 read as a climb of the last two).
    w = np.log(y) if (y > 0).all() else y
    d, last = np.diff(w), nb - 1
    start = last
    for j in range(last - 1, -1, -1):
        local = (d[j] + d[j - 1]) / 2 if j >= 1 else d[j]
        if local < (w[last] - w[j]) / (last - j) / 3 or local <= 0:
            break
        start = j
    if last - start < 2 or not y[last] >= min_growth * y[start] or start == 0:
        return None
    if not _beyond_block_noise(y, start, last, growth_z):
        return None
    mid = (start + last) // 2
    if (y[last] - y[mid]) / (last - mid) < 0.8 * (y[mid] - y[start]) / (mid - start):
        return None
    lo = tail + max(start - 1, 0) * block
    hi = min(tail + (start + 3) * block, len(a))
    return int(s[lo + hinge_onset(a[lo:hi])])


def median_shift_se(before: np.ndarray, after: np.ndarray) -> float:
    """Standard errors by which the median of ``after`` exceeds the median of ``before``: the pooled MAD about
    each one's own median keeps heavy tails and the shift itself out of the spread, and the standard error of a
    median is sqrt(pi/2) sigma / sqrt(n). NaN without a spread."""
    a, b = before[np.isfinite(before)], after[np.isfinite(after)]
    if not len(a) or not len(b):
        return math.nan
    ma, mb = float(np.median(a)), float(np.median(b))
    spread = MAD_TO_SIGMA * float(np.median(np.abs(np.concatenate([a - ma, b - mb]))))
    if not spread > 0:
        return math.nan
    return (mb - ma) / (math.sqrt(math.pi / 2) * spread * math.sqrt(1 / len(a) + 1 / len(b)))


def climb_se(values: np.ndarray, min_obs: int = 16) -> float:
    """How far the later half of an excursion's values sits above the earlier half (``median_shift_se``): a
    change in slope reads positive (still climbing), a jump that stays flat near 0, one coming back down
    negative (DETECTION.md section 5). NaN with fewer than ``min_obs`` finite values."""
    x = values[np.isfinite(values)]
    if len(x) < min_obs:
        return math.nan
    return median_shift_se(x[:len(x) // 2], x[len(x) // 2:])


def _beyond_block_noise(y: np.ndarray, start: int, last: int, growth_z: float) -> bool:
    """Whether the climb of block medians ``y`` from ``start`` to ``last`` stands ``growth_z`` standard errors out of
    their own noise (in log terms: growth is a ratio); True with too few blocks before it to measure that noise
    (4)."""
    if start < 4 or not (y > 0).all():
        return True
    d = np.diff(np.log(y[:start + 1]))
    noise = MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d))))  # of a difference of two medians
    return bool(np.log(y[last] / y[start]) >= growth_z * noise)


def act_growth_start(steps: np.ndarray, act: np.ndarray, before_step: int,
                     min_growth: float = DivergenceConfig().act_growth) -> int | None:
    """First step of an activation-norm climb into ``before_step`` (OPT's precursor), or None."""
    return growth_start(steps, act, before_step, min_growth)


def held_rows(steps: np.ndarray, lrc: LRConfig) -> int:
    """Rows that span ``lrc.held_steps`` updates at these rows' median spacing, at least two: how long an LR must
    be held to be a level the run trains at."""
    spacing = 1.0
    if len(steps) > 1:
        d = np.diff(steps)
        # Evenly spaced rows (the usual log) have that spacing as their median: no selection over every row.
        spacing = float(d[0]) if d.min() == d.max() else float(np.median(d))
    return max(2, int(np.ceil(lrc.held_steps / max(spacing, 1.0))))


def trained_level(steps: np.ndarray, lr: np.ndarray, lrc: LRConfig, trained_lr: float = -np.inf) -> float:
    """The highest LR the run trained at over these rows: the highest level held for ``lrc.held_steps`` updates
    (each run of that many rows, at least two, counts at its lowest), and ``trained_lr``; -inf without either.
    Callers pass every row before the point judged, and a resumed segment's ``ScanContext.trained_lr``: the run
    trained at its main line's levels before the resume, however far before the history the segment was seeded
    with (a warm restart back to a peak held before the resume is the schedule; tests 74 and 112)."""
    ok = np.isfinite(lr)
    v, at = (lr, steps) if ok.all() else (lr[ok], steps[ok])
    if not len(v):
        return float(trained_lr)
    rows = min(len(v), held_rows(at, lrc))
    return max(float(run_minima(v, rows).max()), float(trained_lr))


def run_minima(v: np.ndarray, rows: int) -> np.ndarray:
    """The lowest of each run of ``rows`` consecutive values of ``v`` (``len(v) - rows + 1`` runs), by doubling:
    minima of runs of 2, 4, 8, ... from shifted contiguous slices (a strided view's min is ~10x slower), and a run
    of ``rows`` is two overlapping runs of the largest power of two in it: log2(rows) passes, not rows - 1."""
    m, width = v, 1
    while 2 * width <= rows:
        m = np.minimum(m[:-width], m[width:])
        width *= 2
    return m if width == rows else np.minimum(m[:len(v) - rows + 1], m[rows - width:])


def warm_restart(lr: np.ndarray, low: int, first: int, trained_max: float, lrc: LRConfig) -> bool:
    """Row ``first`` is one step from row ``low`` back up to a level the run already trained at (``trained_max``,
    within ``restart_slack``), the LR fell into that step, and the row after it is no higher: the schedule's
    warm restart, not a raise that could cause a divergence.

    A restart ends a decay (SGDR anneals the LR down, then restarts it), so within the ``lag_rows`` rows up to
    ``low`` the LR stood ``flat`` x above it; a step up from a level held flat that long (a step schedule's
    decayed LR, a constant one) is a change, not the schedule (seed 260854's run 141: x7.9 back up to 0.8 of
    the peak, 55 steps after a step decay, read as a restart). A restart decays or holds from its first row; a
    ramp passing through the old levels on its way up goes on rising.

    A step back to the trained level itself (within ``restart_slack`` either way) is a restart however the LR came
    into it: a cosine with a floor flattens into its low, moving under 10% in the last ``lag_rows`` rows of a long
    cycle (fresh seed 396069's run 010: 0.000121 -> 0.000116 over the 25 steps before its restart to 0.00231, the
    first cycle's peak), and a fault's jump lands within 5% of an earlier peak only by chance."""
    after = lr[first + 1:first + 2]
    with np.errstate(invalid="ignore"):
        back_to_peak = lr[first] * lrc.restart_slack >= trained_max
        return bool(lr[first] >= lrc.raise_factor * lr[low] and lr[first] <= lrc.restart_slack * trained_max
                    and (back_to_peak or fell_into(lr, low, lrc)) and not np.any(after > lrc.flat * lr[first]))


def fell_into(lr: np.ndarray, low: int, lrc: LRConfig) -> bool:
    """The LR decayed into row ``low``: within the ``lag_rows`` rows up to it, it stood ``flat`` x above its value
    there (``warm_restart``: a restart ends a decay)."""
    before = lr[max(0, low - lrc.lag_rows):low + 1]
    with np.errstate(invalid="ignore"):
        return bool(np.any(before >= lrc.flat * lr[low]))


def lr_step_before(lr: np.ndarray, onset: int, history: int, lrc: LRConfig) -> int | None:
    """The row of the last one-row rise of the LR by ``raise_factor`` in the ``lag_rows`` rows up to the
    onset, or None: the update an excursion that begins there may be answering."""
    lo = max(history + 1, onset - lrc.lag_rows)
    if onset < lo:
        return None
    with np.errstate(invalid="ignore"):
        rises = np.flatnonzero(lr[lo:onset + 1] >= lrc.raise_factor * lr[lo - 1:onset])
    return lo + int(rises[-1]) if len(rises) else None


def restart_before(steps: np.ndarray, lr: np.ndarray, onset: int, until: int, lrc: LRConfig,
                   history: int = 0, trained_lr: float = -np.inf) -> int | None:
    """The row of the schedule's warm restart an excursion follows, or None.

    The LR's last step up before the onset (``lr_step_before``) when it took the LR
    back to a level the run had already trained at (``warm_restart``), with the LR held on the schedule from it to
    ``until`` (the excursion's end): never above that level, and no one-row step by ``raise_factor`` up or down
    after it (schedules move smoothly; a burst ends with a step back down, and a jump on top of the restart is a
    cause of its own). A loss that rises after such a restart and comes back is the schedule doing what it does
    (its clean twin does the same), not a fault."""
    r = lr_step_before(lr, onset, history, lrc)
    if r is None:
        return None
    top = trained_level(steps[:r], lr[:r], lrc, trained_lr)
    if not warm_restart(lr, r - 1, r, top, lrc):
        return None
    held = lr[r:max(until, onset) + 1]
    held = held[np.isfinite(held)]
    with np.errstate(invalid="ignore", divide="ignore"):
        step = held[1:] / held[:-1]
        if np.any(held > lrc.restart_slack * top) or np.any((step * lrc.raise_factor <= 1.0)
                                                                      | (step >= lrc.raise_factor)):
            return None
    return r


def ramp_low(at: np.ndarray, v: np.ndarray, k: int, lrc: LRConfig) -> tuple[int, float]:
    """(index, schedule factor): the lowest row of the rise row ``k`` is on (into ``at``/``v``: the rows of a finite,
    positive LR), back down it while the LR rose into each row and on across a schedule's one-row step down inside
    it, and the product of the steps crossed (1.0 when none). A step or multistep schedule multiplies the LR by a
    constant at one row, while a ramp multiplies every update: where the LR rose into the row before the step at the
    same rate per step as it rises out of the row after it (within ``LRConfig.ramp_rate_spread``), one ramp runs on
    both sides and began before the step (fresh seed 978851's run 097: a ramp of x1.025 a step from its update at 261
    across the multistep's x0.35 at 387, read as a raise at 388; the advice was a checkpoint 117 updates into the
    ramp). How far the ramp itself raised the LR is then the LR's rise over that row divided by the schedule's own
    factor, the step less the ramp's growth over its interval. A burst that ended steps down from a held LR, not
    from a rise."""
    def rate(i: int) -> float:  # log LR's rise per step from row i - 1 to row i
        return math.log(v[i] / v[i - 1]) / max(float(at[i] - at[i - 1]), 1.0)

    factor = 1.0
    while k > 0:
        if v[k - 1] < v[k]:
            k -= 1
            continue
        if not (v[k - 1] > v[k] and k >= 2 and k + 1 < len(v)):
            break
        before, after = rate(k - 1), rate(k + 1)
        same_ramp = max(before, after) <= lrc.ramp_rate_spread * min(before, after)
        if not (before > KINK_FLOOR and after > KINK_FLOOR and same_ramp):
            break
        ramp = math.exp((before + after) / 2 * max(float(at[k] - at[k - 1]), 1.0))
        factor *= float(v[k] / v[k - 1]) / ramp
        k -= 1  # the row before the step: the ramp goes on down from there
    return k, factor


def lr_rise_start(steps: np.ndarray, lr: np.ndarray, onset: int, lrc: LRConfig, until: int | None = None,
                  since: int | None = None, trained_lr: float = -np.inf) -> int | None:
    """Index of the first row of a learning-rate rise (to >= ``raise_factor`` x its lowest point in the last
    ``LR_LOOKBACK`` rows, looking twice as far back while that point is the window's first row: a slow ramp started
    before it) that runs into the onset: the first update under the raised LR, the cause, where the LR left its
    schedule's path (``rise_began``; on a decaying schedule a ramp begins before the lowest point, and one that never
    lifts the LR over it is read against the schedule's path instead, ``off_path_rise``). A ramp may reach
    the factor only after the loss began to move, so the rise is measured up to ``until`` (the excursion's peak;
    default the onset): a cause only has to precede the worst of its effect. None without one. The schedule is no
    cause: the warm-up that opens the run, or a warm restart (one step back up to a level the run already trained
    at, as the spike detector's ``lr_scheduled`` reads it); a rise after a restart still counts. ``since``: a row
    the window reaches back from as well (``raise_after``: an excursion's onset long before the alarm it asks about,
    a slow ramp's kink lying between them)."""
    # The search starts after the opening warm-up: its first row is the lowest LR of a short or coarse log, and
    # a rise from there is the warm-up's, which would hide a ramp that began long after it. An onset after a
    # warm-up that went on rising past a burst inside it is read after all of it (``warmup_resumed_end``).
    warm = warmup_end(steps, lr, lrc)
    resumed = warmup_resumed_end(steps, lr, lrc, warm)
    if resumed is not None and resumed < steps[onset]:
        warm = resumed
    start = 0 if warm is None else int(np.searchsorted(steps, warm))
    back = onset if since is None else min(onset, since)
    lo, lookback = max(start, back - LR_LOOKBACK), LR_LOOKBACK
    end = max(onset, until if until is not None else onset)
    while True:
        idx = lo + np.flatnonzero(np.isfinite(lr[lo:end + 1]) & (lr[lo:end + 1] > 0))
        at = int(np.searchsorted(idx, onset))
        if at < 1 or at >= len(idx) or idx[at] != onset:
            return None
        top = at + int(np.argmax(lr[idx[at:]]))  # the highest LR from the onset to the peak
        # The last lowest LR before that: on a decaying schedule a ramp's lowest point can follow the onset.
        k = top - int(np.argmin(lr[idx[:top + 1]][::-1]))
        k, steps_down = ramp_low(steps[idx], lr[idx], k, lrc)  # a ramp across a schedule's step began before it
        low = idx[k]
        if k == 0 and lo > start and lo == back - lookback:  # a ramp longer than the window: it began further back
            lookback *= 2
            lo = max(start, back - lookback)
            continue
        # The warm-up's own rise: its first raised row inside the warm-up (the row before a burst may be its last).
        if k < top and in_warmup(steps, lr, int(steps[idx[k + 1]]), lrc):
            return None
        if k >= top or not lr[idx[top]] >= lrc.raise_factor * lr[low] * steps_down:  # no rise: off the path?
            ramp = off_path_rise(steps[idx], lr[idx], at, len(idx) - 1, lrc)
            # A warm restart steps log LR's slope as a ramp's first update does, and is the schedule (fresh seed
            # 884729's run 077, cosine with restarts: the restart at 1593 read as a ramp inside a burst's spike).
            if ramp is None:
                return None
            j = int(idx[ramp])  # the level trained at before it, over every row (the window may start past a peak)
            return None if warm_restart(lr[idx], ramp - 1, ramp, trained_level(steps[:j], lr[:j], lrc, trained_lr),
                                        lrc) else j
        first = int(idx[k + 1])
        if warm_restart(lr, low, first, trained_level(steps[:low + 1], lr[:low + 1], lrc, trained_lr), lrc):
            lo = first  # a warm restart: look for a rise after it
            continue
        began = int(idx[rise_began(steps[idx], lr[idx], k, 0, lrc)])  # where the LR left its schedule's path
        return began if began <= onset else None  # a cause precedes its effect


KINK_FLOOR = 1e-6
"""The smallest step in log LR's slope per step that counts as a kink: float32 keeps an LR to ~6e-8 of itself, so
a flat LR read back from a log moves its slope by ~1e-7 per row at most, while a ramp of x1.001 per update is
1e-3."""


def rise_began(at: np.ndarray, v: np.ndarray, low: int, lo: int, lrc: LRConfig) -> int:
    """Index (into ``at``/``v``: the rows of a finite, positive LR) of the first raised row of the rise whose lowest
    row is ``low``: the row after the last kink (``LRConfig.kink``) in the slope of log LR at or before the rise's
    first interval, or after the first of consecutive kinks ending there, looked for back to row ``lo``; ``low + 1``
    when there is none."""
    kink = last_kink(at, v, low, lo, lrc)
    return low + 1 if kink is None else kink[0]


def last_kink(at: np.ndarray, v: np.ndarray, low: int, lo: int,
              lrc: LRConfig) -> tuple[int, float, float] | None:
    """(first row after it, the slope of log LR per step before it, the slope after it) of the last kink
    (``LRConfig.kink``: the slope steps up past ``kink`` x its largest change over the ``kink_rows`` rows before) in
    the intervals from row ``lo`` to row ``low + 1``, walked back over consecutive kinks (a bend over two rows: a
    ramp that began between two logged rows); None without one. The slopes are medians over up to ``kink_rows``
    intervals each side (after it, from the last of the consecutive kinks). Indices into ``at``/``v``, the rows of
    a finite, positive LR."""
    a = max(lo, 0)
    if low - a < 1:
        return None
    rate = log_slopes(at[a:low + 2], v[a:low + 2])  # interval i: row a+i -> a+i+1
    # Only where kink_rows changes before it are there to judge by: at the search's first rows any bend of a
    # smooth schedule would pass (a cosine flattening into its floor bends its slope up on every row).
    change, bar = slope_changes(rate, lrc)
    up = change > bar
    if not up.any():
        return None
    last = int(np.flatnonzero(up)[-1])
    m = last
    while m > 0 and up[m - 1]:  # walked back over consecutive kinks
        m -= 1
    i, last = m + lrc.kink_rows + 1, last + lrc.kink_rows + 1  # element m of the changes: interval m + kink_rows + 1
    return (a + i + 1, float(np.median(rate[max(0, i - lrc.kink_rows):i])),
            float(np.median(rate[last:last + lrc.kink_rows])))


def log_slopes(at: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Log LR's slope per step over each interval between consecutive rows (``at``/``v``: finite, positive LR)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.diff(np.log(v)) / np.maximum(np.diff(at), 1)


def slope_changes(rate: np.ndarray, lrc: LRConfig) -> tuple[np.ndarray, np.ndarray]:
    """(change, bar) of log LR's slope into each interval from ``kink_rows + 1`` on (element m: interval
    m + kink_rows + 1 of ``rate``): its change from the interval before, and ``kink`` x its largest change over the
    ``kink_rows`` intervals before that (at least ``KINK_FLOOR``). A change past the bar is a kink (up) or a step
    back down (down, ``off_path_rise``); a schedule bends its log LR smoothly, a ramp's first update steps it."""
    jump, k = np.diff(rate), lrc.kink_rows
    if len(jump) <= k:
        return np.empty(0), np.empty(0)
    bar = np.maximum(lrc.kink * -run_minima(-np.abs(jump[:-1]), k), KINK_FLOOR)
    return jump[k:], bar


def slope_stepped_into(at: np.ndarray, v: np.ndarray, i: int, lrc: LRConfig) -> bool:
    """Does log LR's slope step up past its bar (``slope_changes``) into the interval ending at row ``i`` (into
    ``at``/``v``: the rows of a finite, positive LR)? A ramp riding a decaying schedule shows itself so: its first
    raised row falls less than the schedule, it does not rise."""
    lo = i - lrc.kink_rows - 2
    if lo < 0:
        return False
    change, bar = slope_changes(log_slopes(at[lo:i + 1], v[lo:i + 1]), lrc)
    return bool(change[-1] > bar[-1])


def off_path_rise(at: np.ndarray, v: np.ndarray, onset: int, end: int, lrc: LRConfig) -> int | None:
    """Index (into ``at``/``v``, the rows of a finite, positive LR) of the first row of a ramp riding a decaying
    schedule, or None: the last kink in log LR's slope (``last_kink``) by the onset, after which the ramp's own rate
    (the slope's step at the kink) has lifted the LR ``flat`` x or more by a row from the onset to ``end``. A
    multiplicative ramp on a decaying schedule lifts the LR off the schedule's path while the logged LR still falls
    (fresh seed 495323's run 039: x1.005 a step from 899 on a cosine falling 0.35% a step, no row above an earlier
    one), so no rise over its lowest point shows. The kink is what says the schedule was left (a schedule bends its
    log LR smoothly, ``LRConfig.kink``); its lift need only be material, not a jump's ``raise_factor``. A kink into a
    flat LR is a decay reaching its floor, the schedule (a review of d89fec3: a linear decay to a held minimum read as
    a ramp from it); a ramp from the floor is then read on the floor alone. From the LR column a ramp that exactly
    cancels the decay is that floor too, and a knee into a flatter decay reads as a ramp slower than the decay.

    The lift is the ramp's rate times the steps since the kink, up to where the slope steps back down by
    ``LRConfig.ramp_end_share`` of that rate (the ramp ended), not the LR against the slope before the kink carried
    forward: a decay steepens or flattens its own log slope over the hundreds of steps a slow ramp takes to matter,
    so that path misreads the ramp by as much as the ramp itself (fresh seed 7843's run 103: x1.0022 a step from 393
    on a linear decay of 0.46% a step, its norms x3.3 by 574; against the path the LR rose x1.09 at most, by its
    rate x1.49; the precursor's climb, dated by blocks at 384, stayed there and the advice at 336, where 392 is
    clean)."""
    kink = last_kink(at, v, onset - 1, 0, lrc)
    if kink is None:
        return None
    first, slope, after = kink
    if abs(after) < KINK_FLOOR:  # a decay that reached its floor and holds there: the schedule, no ramp
        # A ramp that starts on the floor shows as a later kink once the decay before it is out of view (the floor's
        # own step in the slope raises the kink bar for ``kink_rows`` rows after it).
        held = v.copy()
        held[:first] = v[first]
        later = last_kink(at, held, onset - 1, 0, lrc)
        return None if later is None or later[0] <= first else off_path_rise(at, held, onset, end, lrc)
    base, ramp = first - 1, after - slope  # the ramp's own rate per step: the slope's step at the kink
    change, bar = slope_changes(log_slopes(at[base:end + 1], v[base:end + 1]), lrc)
    ended = np.flatnonzero((-change > bar) & (change < -lrc.ramp_end_share * ramp))
    until = math.inf if not len(ended) else at[base + int(ended[0]) + lrc.kink_rows + 1]
    lifted = ramp * (np.minimum(at[onset:end + 1], until) - at[base])
    off = np.flatnonzero(lifted >= math.log(lrc.flat))
    if not len(off):
        return None
    # Held all the way: a burst that ended with a step back down (by ``raise_factor`` in one row) left the path,
    # and a later lift is another cause's (test 75: a burst x150 at 690, then a ramp from 920).
    held = v[first:onset + int(off[0]) + 1]
    return None if np.any(held[1:] * lrc.raise_factor <= held[:-1]) else first


LR_BEFORE_ROWS = 16
"""Rows before an excursion's onset (the onset's own row and the one before it left out: they may hold the
update that caused it, unless that is the warm-up's last row, ``lr_before``) whose median is "the LR before"."""


def lr_before(steps: np.ndarray, lr: np.ndarray, onset: int, lrc: LRConfig, history: int = 0) -> float | None:
    """The LR the run trained at just before an excursion (median of ``LR_BEFORE_ROWS`` rows), or None. Not the
    opening warm-up's rising rows, which are the schedule on its way to that LR (fresh seed 581459's run 049: an
    excursion two rows of 10 steps after the warm-up, read as x2.1 against a median that took in the warm-up),
    once it ended before the onset: from its last row (the LR it reached) on, that row included even where it is
    the onset's own row before. An excursion inside a warm-up that ends later in the data is read against the LR
    the warm-up reaches (its last row): the LR's rise on to it is the schedule's, not a raise (fresh seed 210507's
    run 060: a batch-1 jump at step 200 of a 261-step warm-up, its peak after it, read as "LR x2.5, still raised"
    against the rows before, a divergence). Inside a warm-up that rises to the log's end, the rows before are
    all there is. Where the LR stepped (by ``raise_factor`` either way from one row to the next: a warm restart,
    a step schedule's drop, a burst's end) inside those rows, the LR before is the level in force since its last
    step, not a median of two levels (fresh seed 142542's run 144: a warm restart x20 six rows before a burst x50,
    the burst read as x956 against the rows before the restart and 'still raised' at the restarted level)."""
    lo, hi = max(history, onset - 1 - LR_BEFORE_ROWS), max(history, onset - 1)
    if hi <= lo and history:
        # At a resumed segment's start the LR before is the parent's at the resume (its seeded history's last rows):
        # the LR the run trained at when the checkpoint was saved, which a resume should carry on (a restored
        # optimizer holding a raised LR for its first update is then a raise at the resume).
        lo, hi = max(0, history - LR_BEFORE_ROWS), history
    warm = warmup_end(steps, lr, lrc)
    if warm is not None and onset < len(steps):
        end = int(np.searchsorted(steps, warm, side="right")) - 1
        if warm < steps[onset]:
            lo, hi = max(lo, end), max(hi, end + 1)
        elif end < len(steps) - 1 and np.isfinite(lr[end]) and lr[end] > 0:
            return float(lr[end])
    before = lr[lo:hi]
    before = before[np.isfinite(before) & (before > 0)]
    ratio = before[1:] / before[:-1]
    stepped = np.flatnonzero((ratio >= lrc.raise_factor) | (ratio * lrc.raise_factor <= 1.0))
    if len(stepped):
        before = before[int(stepped[-1]) + 1:]
    return float(np.median(before)) if len(before) else None


def first_consequence(steps: np.ndarray, row: int) -> int:
    """The first row whose observation an update under the LR first logged at ``row`` can have made: the record
    logs at step s the LR of update s and the loss computed before it, so on a per-step stretch the next row;
    where updates went unlogged since the row before (a coarse log), the raise may be older than ``row``'s own
    step and ``row`` itself can show it. An LR jump is the cause; the onset is its first consequence
    (DETECTION.md section 7a), so a checkpoint at the step before the jump stays a healthy one."""
    if 0 < row < len(steps) - 1 and steps[row] - steps[row - 1] <= 1:
        return row + 1
    return row


def lr_jump_inside(steps: np.ndarray, lr: np.ndarray, onset: int, until: int, lrc: LRConfig,
                   history: int = 0, level: float | None = None, trained_lr: float = -np.inf) -> int | None:
    """The row of an LR jump inside an excursion: the first row in (onset, until] at >= ``raise_factor`` x the LR before
    the onset (or ``level``), with the LR still at that level from the onset to it and after the opening warm-up;
    else None.

    An onset estimated from the loss alone can land a few rows early (a heavy-tailed batch, a hinge fit
    smeared by the jump); when the LR was unchanged there and jumps before the peak, the change point is the
    first update under the raised LR (DETECTION.md section 5), and the rollback must precede that. Where the
    first jump is the schedule's warm restart and the LR jumps again from the restart's level before ``until``,
    the later jump is the one the loss answered (a restart at 396 and a burst at 405 put the onset at the
    restart, a checkpoint too early); a restart alone stays the change point (the schedule's)."""
    level = lr_before(steps, lr, onset, lrc, history) if level is None else level
    if level is None or until <= onset:
        return None
    inside = lr[onset + 1:until + 1]
    hit = np.flatnonzero(np.isfinite(inside) & (inside >= lrc.raise_factor * level))
    if not len(hit):
        return None
    jump = onset + 1 + int(hit[0])
    flat = lr[onset:jump]  # a ramp's first rows are already its cause: only a jump from the level moves the onset
    if not np.all(np.isfinite(flat) & (flat <= lrc.flat * level)) or in_warmup(steps, lr, int(steps[jump]), lrc):
        return None
    if warm_restart(lr, jump - 1, jump, trained_level(steps[:jump], lr[:jump], lrc, trained_lr), lrc):
        later = lr_jump_inside(steps, lr, jump, until, lrc, history, level=float(lr[jump]), trained_lr=trained_lr)
        return jump if later is None else later
    return jump


def cause_start(steps: np.ndarray, obs: Observations, onset: int, history: int, cfg: DivergenceConfig,
                lrc: LRConfig, advice: AdviceConfig, until: int | None = None,
                trained_lr: float = -np.inf) -> tuple[int, dict]:
    """Move an onset (an index) back to where the trend broke: the gradient or activation norm began growing
    into it (after the opening warm-up), or the learning rate began rising into it, by the excursion's peak
    ``until`` (DETECTION.md section 5: the change point, not the step where the loss crossed a line). Never
    into a resumed segment's seeded parent history."""
    at = int(steps[onset])
    act = growth_start(steps, obs["act_norm"], at, cfg.act_growth, cfg.growth_z) if "act_norm" in obs else None
    grad = growth_start(steps, obs["grad_norm"], at, cfg.grad_growth, cfg.growth_z) if "grad_norm" in obs else None
    rise = lr_rise_start(steps, obs["lr"], onset, lrc, until, trained_lr=trained_lr) if "lr" in obs else None
    lr_step = int(steps[rise]) if rise is not None else None
    floor = int(steps[history]) if history < len(steps) else at
    if "lr" in obs:  # norms growing in the warm-up or after a warm restart are the model answering the schedule,
        # and a climb dated before an LR burst inside it began with the burst unless it had risen before it
        act, grad = (None if s is None or answers_the_schedule(steps, obs["lr"], s, lrc, trained_lr) else s
                     for s in (act, grad))
        act, grad = (_after_burst(steps, obs.get(key), s, at, obs["lr"], lrc, history, cfg.growth_z)
                     for key, s in (("act_norm", act), ("grad_norm", grad)))
    answer = int(steps[first_consequence(steps, rise)]) if rise is not None else None
    if rise == onset and answer > at:
        at = answer  # the onset's own row holds the rise's first update, not its consequence (test 84)
    if answer is not None and answer >= floor:
        # The LR rise is the cause and its first consequence the onset: a norm "growing" before its cause is the
        # hinge fit's error, not an earlier break, unless it had grown into a precursor of its own by then
        # (``precursor_grown``: test 75's guard, a climb from 400, a burst at 690, a ramp from 920).
        act, grad = (s if s is not None and (s >= answer or precursor_grown(
            obs[key], obs["loss"], int(np.searchsorted(steps, s)), int(np.searchsorted(steps, answer)), advice))
            else None for key, s in (("act_norm", act), ("grad_norm", grad)))
    first = min([at] + [s for s in (act, grad, answer) if s is not None and s >= floor])
    return int(np.searchsorted(steps, first)), {"act_norm_climb_step": act, "grad_norm_climb_step": grad,
                                                "lr_rise_step": lr_step}


def _after_burst(steps: np.ndarray, values: np.ndarray, start: int | None, at: int, lr: np.ndarray, lrc: LRConfig,
                 history: int, growth_z: float) -> int | None:
    """A norm's climb start, moved to the first consequence of an LR burst inside the climb (after its start, by the
    loss's onset ``at``) unless the norm had already risen before the burst. ``growth_start`` dates a climb on
    blocks of 16+ rows and walks back past a flat block beside a steep one, so a climb the burst began can be dated
    blocks before it, into healthy training (fresh seed 142542's run 050: a x150 burst at 690 and a ramp at 920,
    the grad norm flat at 2-4 until 690, its climb dated at 490 and the rollback put before that). As with an LR
    rise (``cause_start``), a norm "growing" before its cause is the fit's error. Risen: the (log) norm's median
    over the ``BLOCK_ROWS`` rows before the burst stands ``growth_z`` standard errors above its median over as many
    rows before the climb's start (``median_shift_se``); then the climb is a precursor of its own and stays."""
    if start is None:
        return None
    for first, _ in lr_bursts(steps, lr, lrc, history):
        hit = int(steps[first_consequence(steps, first)])
        if start < hit <= at:
            i, j = int(np.searchsorted(steps, start)), int(np.searchsorted(steps, hit))
            logs = safe_log(values)
            risen = median_shift_se(logs[max(0, i - BLOCK_ROWS):i], logs[max(i, j - BLOCK_ROWS):j]) >= growth_z
            return start if risen else hit
    return start


def precursor_grown(values: np.ndarray, loss: np.ndarray, i: int, j: int, advice: AdviceConfig) -> bool:
    """Has a norm climbing from row ``i`` grown into OPT's precursor by row ``j`` (``norm_grown``), with the loss
    shown to have bought nothing through the climb (``loss_stalled``: norms grow as a model learns)? The advice's
    walk back and the onset of a divergence ask the same."""
    return norm_grown(values, i, j, advice) and loss_stalled(loss[i:j], advice.learning_obs, advice.learning_z,
                                                             advice.learning_fall)


def norm_grown(values: np.ndarray, i: int, j: int, advice: AdviceConfig) -> bool:
    """Is a norm's median over the 8 rows before row ``j`` ``advice.act_climb_ratio`` x its median over the 8 rows
    up to row ``i``, by ``advice.act_climb_z`` standard errors of the two medians? Beyond the noise of the two
    medians as well as the ratio: on a batch-1 log the activation norm's medians of 8 stray by 20% and more (seed
    837336's run 033: a natural drift read as x1.6, and the checkpoint before a NaN refused)."""
    a, b = values[max(i - 8, 0):i + 1], values[max(j - 8, i):j]
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not len(a) or not len(b) or np.median(a) <= 0:
        return False
    grown = float(np.median(b) / np.median(a)) >= advice.act_climb_ratio
    return grown and median_shift_se(np.log(a), np.log(b)) >= advice.act_climb_z


def warmup_end(steps: np.ndarray, lr: np.ndarray, lrc: LRConfig) -> int | None:
    """Last step of the LR warm-up that opens the run (the LR rising from the first row), or None."""
    # Read from the front in growing prefixes: a warm-up is a run's first hundreds of rows, and the LR is asked
    # about on every LR story (10 times a 1M-row run read whole: a tenth of analyze()).
    m = WARMUP_PREFIX
    while True:
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(lr[:m]) & (lr[:m] > 0)
        v, at = lr[:m][ok], steps[:m][ok]
        whole = m >= len(lr)
        if len(v) >= 3 or whole:
            if len(v) < 3 or not v[1] > v[0]:
                return None
            v, at = _unrounded(v, at, lrc)
            # It ends where the LR stops rising, or before a burst steepens its rise (``LRConfig.warmup_steepen``).
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = np.diff(np.log(v)) / np.maximum(np.diff(at), 1)
            stop = np.flatnonzero((rate <= 0) | np.r_[False, rate[1:] > lrc.warmup_steepen * rate[:-1]])
            if len(stop) or whole:
                return int(at[stop[0] if len(stop) else -1])
        m *= 8


def _unrounded(v: np.ndarray, at: np.ndarray, lrc: LRConfig) -> tuple[np.ndarray, np.ndarray]:
    """The LR rows (``v`` at steps ``at``) without the repeats a log's rounding makes: a value repeated over fewer
    than ``lrc.held_steps`` updates, the LR rising past it after, is no level the run was held at (llm.c prints
    1e-06, 2e-06, 3e-06, 3e-06, 4e-06 for a linear warm-up, read as its end at step 2 and every later rise as a
    raise off the schedule, "x189"). A value held longer, or the last, stays: there the rise stopped."""
    same = np.flatnonzero(v[1:] == v[:-1]) + 1  # rows repeating the row before
    if not len(same):
        return v, at
    run = np.cumsum(np.r_[True, np.diff(same) > 1]) - 1  # which run of repeats each repeating row is in
    first, last = same[np.r_[True, run[1:] != run[:-1]]], same[np.r_[run[1:] != run[:-1], True]]
    after = np.minimum(last + 1, len(v) - 1)
    drop = (last + 1 < len(v)) & (v[after] > v[last]) & (at[last] - at[first - 1] < lrc.held_steps)
    keep = np.ones(len(v), bool)
    keep[same[drop[run]]] = False
    return v[keep], at[keep]


WARMUP_PREFIX = 4096
"""Rows the warm-up's end is first looked for in (then 8x as many, until it is found or the rows end)."""


def warmup_resumed_end(steps: np.ndarray, lr: np.ndarray, lrc: LRConfig, end: int | None) -> int | None:
    """The last step of the opening warm-up read through the bursts inside it (``end``: ``warmup_end``, which stops
    before a burst so that the burst reads as a raise): where the LR, within ``lag_rows`` of the burst, is back within
    ``flat`` of the warm-up's path (its last rise per step carried forward) and rises on from there, the warm-up
    goes on, up to its own end. The rest of a warm-up is the schedule, not a ramp into a later excursion (fresh
    seed 694513's run 015: an x5 burst at 46 of a 189-step warm-up, and an x300 burst at 202 read as a rise from
    46, a divergence dated there)."""
    while end is not None:
        i = int(np.searchsorted(steps, end, side="right")) - 1
        if i < 1 or i + 2 >= len(lr) or not (np.isfinite(lr[i - 1:i + 1]).all() and lr[i] > lr[i - 1] > 0):
            return end
        rate = math.log(lr[i] / lr[i - 1]) / max(float(steps[i] - steps[i - 1]), 1.0)
        if not (np.isfinite(lr[i + 1]) and lr[i + 1] > lr[i] and math.log(lr[i + 1] / lr[i])
                > lrc.warmup_steepen * rate * max(float(steps[i + 1] - steps[i]), 1.0)):
            return end  # no burst: the LR stopped rising there, and the warm-up with it
        with np.errstate(divide="ignore", invalid="ignore"):
            ahead = slice(i + 2, min(len(lr), i + 2 + lrc.lag_rows))
            path = math.log(lr[i]) + rate * (steps[ahead] - steps[i]) + math.log(lrc.flat)
            back = np.flatnonzero(np.log(lr[ahead]) <= path)
        if not len(back):
            return end  # no way back to the path: the warm-up ended there
        b = i + 2 + int(back[0])
        later = warmup_end(steps[b:], lr[b:], lrc)  # rising on from the path, up to its own end
        if later is None:
            return end
        end = later
    return end


def in_warmup(steps: np.ndarray, lr: np.ndarray, step: int, lrc: LRConfig) -> bool:
    """True when ``step`` lies inside the LR warm-up that opens the run, its last row (the LR it reached) included:
    on a coarse log that row is the warm-up's last step up, not a raise (fresh seed 198280's run 113, a log every
    25 steps, read its warm-up's end as an LR step up before an excursion)."""
    end = warmup_end(steps, lr, lrc)
    return end is not None and step <= end


def answers_the_schedule(steps: np.ndarray, lr: np.ndarray, step: int, lrc: LRConfig,
                         trained_lr: float = -np.inf) -> bool:
    """A norm's climb from ``step`` is the model answering an LR the schedule raised, not a broken trend: it began
    inside the opening warm-up, or within ``lrc.lag_rows`` of one of the schedule's warm restarts
    (``restart_before``), either side, since the start of a climb on a noisy norm is an estimate good to
    several rows (seed 247925's run 77: a batch-2 run's activation norm, its fault-free twin's alike, 1.7x after a
    restart at 318, the climb's start estimated at 311)."""
    if in_warmup(steps, lr, step, lrc):
        return True
    at = int(np.searchsorted(steps, step))
    ahead = min(at + lrc.lag_rows, len(steps) - 1)  # restart_before looks back lag_rows from where it is asked
    return any(restart_before(steps, lr, o, o, lrc, trained_lr=trained_lr) is not None for o in (at, ahead))


class DivergenceScanner:
    """Incremental over one segment's loss observations, one completed block at a time."""

    def __init__(self, ctx: ScanContext) -> None:
        self.ctx, self.cfg = ctx, ctx.config.divergence
        base = ctx.config.baseline
        self.block = base.block
        self.blocks = BlockBaseline(block=base.block, window=base.window_blocks, min_blocks=base.min_blocks,
                                    rel_floor=1e-3, abs_floor=1e-12)
        self.min_blocks = base.min_blocks
        self.done = 0  # blocks judged
        self.best: tuple[float, int, float] | None = None  # (median, block, sigma)
        self.noise = Grow()  # per block: the noise a rise from it is judged in
        self.episode: dict | None = None
        self.closed: list[tuple[dict, int, bool]] = []

    def advance(self, obs: Observations) -> None:
        loss = obs["loss"]
        self.blocks.update(loss)
        med, mad = self.blocks.med.view, self.blocks.mad.view
        if len(med) == self.done:
            return
        meds = med.tolist()  # plain floats: the per-block test is a few comparisons
        # The per-observation noise a rise from each new block as the best level is judged in: its own MAD, but
        # never under the run's noise in the blocks before it. The best block is the lowest median, and a loss's
        # spread shrinks with its level, so a block selected for its low median has a low MAD as well: a batch-1
        # run whose block medians wander 0.2-4 (fresh seed 645321's run 140: one block at 0.16 with a MAD of 0.17
        # among blocks with 1.3) would judge its return to its usual level in the calm block's noise.
        scale = self.blocks.scale_of_blocks(self.done, len(med))
        self.noise.extend(np.fmax(MAD_TO_SIGMA * mad[self.done:], scale))
        b = self.done
        while b < len(med):
            if self.episode is None and self.best is not None:
                b = self._next_event(med, b)
                if b >= len(med):
                    break
            self._judge(b, meds, mad, loss)
            b += 1
        self.done = len(med)

    def _next_event(self, med: np.ndarray, b: int) -> int:
        """The first block from ``b`` on that ``_judge`` would do more with outside an episode than make it the new
        best: one past the rise threshold of the best in force before it (every other block leaves the state as
        it is). The new bests on the way (a falling loss makes one every few blocks) are taken here, in order,
        as ``_judge`` takes them. Found vectorised, in windows that double, so a long healthy stretch, falling or
        flat, costs no Python loop."""
        width = 256
        while b < len(med):
            w = med[b:b + width]
            best, best_b, sigma = self.best
            with np.errstate(invalid="ignore"):
                level = np.fmin.accumulate(np.concatenate([[best], w]))[:-1]  # the best in force before each block
                record = w < level  # a new best (NaN compares False)
                last = np.maximum.accumulate(np.where(record, np.arange(len(w)), -1))  # the last new best so far
                since = np.concatenate([[-1], last[:-1]])  # ... before each block
                noise = np.where(since >= 0, self.noise.view[b + np.maximum(since, 0)], sigma)
                # ``_threshold`` of the best in force: max(a, b) as Python's max takes it (b only if b > a)
                low, high = self.cfg.min_rise * np.abs(level), self.cfg.z_rise * noise
                hit = np.flatnonzero(~record & (w - level >= np.where(high > low, high, low)))
            end = int(hit[0]) if len(hit) else len(w)
            k = int(last[end - 1]) if end else -1  # the last new best before the event (or the window's end)
            if k >= 0:
                self.best = (float(w[k]), b + k, float(self.noise.view[b + k]))
            if len(hit):
                return b + end
            b, width = b + len(w), min(2 * width, 1 << 16)
        return b

    def _threshold(self) -> float:
        best, _, sigma = self.best
        return max(self.cfg.min_rise * abs(best), self.cfg.z_rise * sigma)

    def _judge(self, b: int, med: list[float], mad: np.ndarray, loss: np.ndarray) -> None:
        m, cfg = med[b], self.cfg
        if m != m:  # a mostly non-finite block
            return
        if self.episode is not None:
            if m <= self.best[0] + 0.5 * self._threshold():
                self.closed.append((self.episode, b * self.block - 1, True))
                self.episode, self.best = None, (m, b, float(self.noise.view[b]))
            return
        if self.best is None or m < self.best[0]:
            self.best = (m, b, float(self.noise.view[b]))
            return
        k = cfg.rising_blocks
        if b < self.min_blocks + k or b - self.best[1] < k:
            return
        # Still climbing after it got there: the last k block medians are all past the rise threshold and
        # each above the one before (a spike that jumped and is coming back down is not a climb).
        if not all(med[b - i] - self.best[0] >= self._threshold() for i in range(k)):
            return
        if not all(med[b - i] > med[b - i - 1] for i in range(k - 1)):
            return
        last = loss[b * self.block:(b + 1) * self.block]
        if np.mean(last > self.best[0] + 0.5 * self._threshold()) < cfg.sustained:
            return
        if not ramp_beats_jump(np.asarray(med[max(self.best[1], b - cfg.ramp_blocks):b + 1])):
            return
        start = max(self.best[1] * self.block, (b + 1) * self.block - cfg.max_onset_window)
        stop = (b + 1) * self.block
        onset = start + hinge_onset(loss[start:stop])
        self.episode = {"onset": max(onset, self.ctx.history), "confirm": stop - 1, "best": self.best}

    def findings(self, obs: Observations) -> list[Finding]:
        loss = obs["loss"]
        items = list(self.closed) + ([(self.episode, len(loss) - 1, False)] if self.episode else [])
        out = [self._classify(ep, end, rec, obs) for ep, end, rec in items]
        if self.episode is not None:  # a second cause inside the divergence still open
            inside = lr_raise_inside(obs, out[-1], self.episode["confirm"], self.ctx.history, self.ctx.config,
                                     self.ctx.trained_lr)
            out += [] if inside is None else [inside]
        else:
            early = self._precursor(obs)
            if early is not None:
                out.append(early)
            else:
                shift = lr_level_shift(obs, self.ctx.history, self.cfg, self.ctx.config.lr, self.ctx.segment,
                                       self.ctx.trained_lr)
                if shift is not None:
                    out.append(shift)
        return own_findings(out, obs["step"], self.ctx.history)

    def _classify(self, ep: dict, end: int, recovered: bool, obs: Observations) -> Finding:
        steps, loss, grad, act, lr = obs["step"], obs["loss"], obs["grad_norm"], obs["act_norm"], obs["lr"]
        jump = lr_jump_inside(steps, lr, ep["onset"], ep["confirm"], self.ctx.config.lr, self.ctx.history,
                              trained_lr=self.ctx.trained_lr)
        start = first_consequence(steps, jump) if jump is not None else ep["onset"]
        # A slow LR raise the climb was confirmed after: the hinge's knot before it lies in noise (fresh seed 103205's
        # run 064, an LR growing x1.1 a step from 942, the knot at 924). Read up to the episode's end: a slow ramp
        # reaches ``raise_factor`` only as the loss climbs.
        start = self._not_before_its_cause(steps, lr, loss, start, ep["confirm"], end)
        onset, growth = cause_start(steps, obs, start, self.ctx.history, self.cfg, self.ctx.config.lr,
                                    self.ctx.config.advice, until=ep["confirm"], trained_lr=self.ctx.trained_lr)
        best, best_b, sigma = ep["best"]
        before = slice(best_b * self.block, (best_b + 1) * self.block)
        during = slice(onset, end + 1)
        span = np.where(np.isfinite(loss[during]), loss[during], -np.inf)
        peak = onset + int(np.argmax(span)) if len(span) else onset
        grad_ratio, act_ratio = _ratio(grad, before, during), _ratio(act, before, during)
        cause = lr[max(onset - 1, 0):onset + 1]
        evidence = {"best_loss": best, "loss_sigma": sigma, "peak_loss": float(span.max()) if len(span) else None,
                    "grad_norm_ratio": grad_ratio, "act_norm_ratio": act_ratio,
                    "lr_at_onset": float(np.nanmax(cause)) if np.isfinite(cause).any() else None,
                    "detected_step": int(steps[min(ep["confirm"], len(steps) - 1)]),
                    "confirmed_step": int(steps[min(ep["confirm"], len(steps) - 1)]),
                    "loss_climb_step": int(steps[ep["onset"]]), **growth}
        # A climb on the schedule's warm restart that came back down is the schedule (its clean twin does it too).
        restart = restart_before(steps, lr, onset, end, self.ctx.config.lr, self.ctx.history,
                                 self.ctx.trained_lr) if recovered else None
        evidence["lr_restart_step"] = None if restart is None else int(steps[restart])
        evidence["recovery_steps"] = recovery_steps(steps, onset, end + 1) if recovered else None
        extra = [f"grad norm x{grad_ratio:.2g}" for _ in [0] if grad_ratio is not None]
        extra += [f"act norm x{act_ratio:.2g}" for _ in [0] if act_ratio is not None]
        message = (f"loss diverging from step {int(steps[onset])}: {best:.4g} -> {fmt_value(evidence['peak_loss'])}"
                   + (f" ({', '.join(extra)})" if extra else "")
                   + ("" if restart is None else f" after the schedule's warm restart of the LR at step {int(steps[restart])}")
                   + (f"; it came back down after {evidence['recovery_steps']} steps" if recovered
                      else "; still climbing or high at the last step"))
        severity = "critical" if not recovered else "warning" if restart is None else "info"
        return Finding(kind="divergence", onset_step=int(steps[onset]), end_step=int(steps[end]),
                       peak_step=int(steps[peak]), segment=self.ctx.segment,
                       severity=severity, self_recovered=recovered,
                       needs_action=not recovered, evidence=evidence, message=message)

    def _not_before_its_cause(self, steps: np.ndarray, lr: np.ndarray, values: np.ndarray, onset: int, by: int,
                              upto: int, log: bool = False) -> int:
        """``onset``, or the first consequence of an LR raise off the schedule the alarm at ``by`` came after
        (``raise_after``) when ``values`` (a norm: ``log``) carry no lift of their own before it."""
        first = raise_after(steps, lr, onset, by, upto, self.ctx.config.lr, self.ctx.trained_lr)
        if first is None or lifted_before(safe_log(values) if log else values, onset, first, self.cfg.growth_z):
            return onset
        return first

    def _precursor(self, obs: Observations) -> Finding | None:
        """Divergence caught early: activation and gradient norms blowing up before the loss moves (OPT)."""
        steps, act, grad = obs["step"], obs["act_norm"], obs["grad_norm"]
        if len(steps) == 0:
            return None
        climb = growth_start(steps, act, int(steps[-1]) + 1, self.cfg.act_growth, self.cfg.growth_z)
        if climb is None or answers_the_schedule(steps, obs["lr"], climb, self.ctx.config.lr, self.ctx.trained_lr):
            return None  # a climb that began in the warm-up or at a warm restart answers the schedule's LR
        i = int(np.searchsorted(steps, climb))
        before = slice(max(0, i - self.block), i + 1)
        end = slice(max(i + 1, len(steps) - self.block), len(steps))
        act_ratio, grad_ratio = _ratio(act, before, end), _ratio(grad, before, end)
        if act_ratio is None or grad_ratio is None or act_ratio < self.cfg.precursor_act \
                or grad_ratio < self.cfg.precursor_grad:
            return None
        if loss_fell_through(obs["loss"][i:], self.block, self.cfg.growth_z, self.ctx.config.advice.learning_fall):
            # The model learning, not blowing up: fresh seed 396069's run 116, act x3.5 and grad x2.3 over
            # steps 36-201 after a 22-step warm-up, while the loss fell 4.1 -> 3.1.
            return None
        # The loss rose through the climb by ``growth_z`` standard errors: no longer "before the loss moved". The
        # finding stays (the norms corroborate a rise the loss detectors may only note), and gives way to an alarm of
        # the loss's own where one covers it (``analysis.merge_overlaps``).
        moved = bool(loss_shift_se(obs["loss"][i:], self.block) > self.cfg.growth_z)
        # An LR rising into the climb is where it began. A slow ramp reaches ``raise_factor`` only as the norms climb
        # (seed 372696's run 071: x1.02 at the climb's start, x3.6 by the last row), so the rise is measured up to
        # the last row, the worst of the effect so far, as a spike's is up to its peak.
        rise = lr_rise_start(steps, obs["lr"], i, self.ctx.config.lr, until=len(steps) - 1,
                             trained_lr=self.ctx.trained_lr)
        if rise is not None:
            at = first_consequence(steps, rise)
            if at > i and lifted_before(safe_log(act), i, at, self.cfg.growth_z):
                at, rise = i, None  # risen of its own before the rise's first consequence: the climb began it
        else:  # or one that began after the climb's block-dated start, before the norms had grown of their own
            at = self._not_before_its_cause(steps, obs["lr"], act, i, len(steps) - 1, len(steps) - 1, log=True)
        onset, caused = int(steps[at]), rise is not None or at != i
        # A climb dated before the cause the onset moved to is the fit's error, not where the incident began, and
        # the evidence does not name it: the advice walks back to a named climb (fresh seed 34384's run 008, an LR
        # ramp from 1892, the climb dated 1886 and checkpoint 1785 advised for the clean 1890).
        return Finding(kind="divergence", onset_step=onset, end_step=int(steps[-1]), peak_step=int(steps[-1]),
                       segment=self.ctx.segment, severity="critical", self_recovered=False, needs_action=True,
                       evidence={"act_norm_ratio": act_ratio, "grad_norm_ratio": grad_ratio,
                                 "act_norm_climb_step": climb if at <= i else None,
                                 "lr_rise_step": onset if caused else None,
                                 "rule": "precursor", "loss_moved": moved, "detected_step": int(steps[-1])},
                       message=f"diverging from step {onset}: activation norm x{act_ratio:.2g} and gradient norm "
                               f"x{grad_ratio:.2g} and still climbing, "
                               + ("the loss rising with them" if moved else "before the loss has moved")
                               + " (OPT's precursor)")


SHIFT_BLOCK = 8
"""Observations per block when the spread of the loss level is measured for the LR change-point test."""


def lr_raised_since(steps: np.ndarray, lr: np.ndarray, lrc: LRConfig, history: int = 0,
                    trained_lr: float = -np.inf) -> int | None:
    """The first row of the LR's current raise, or None: the last row at which the LR stood ``raise_factor`` x or more
    below its value now, walked back to the low its rise started from and on to where it left the schedule's path
    (``rise_began``: a ramp's first row, not the row where it crossed the factor). Not inside the opening warm-up,
    and not a warm restart (one step back up to a level the run already trained at): those are the schedule."""
    idx = np.flatnonzero(np.isfinite(lr) & (lr > 0))
    if len(idx) < 3 or idx[-1] != len(lr) - 1:
        return None
    v = lr[idx]
    low = np.flatnonzero(v <= v[-1] / lrc.raise_factor)
    if not len(low):
        return None
    k, _ = ramp_low(steps[idx], v, int(low[-1]), lrc)  # back down the rise to its lowest row
    # Where it left the schedule's path, looked for no further back than a cause is (``LR_LOOKBACK``) nor before
    # the history a resumed segment was seeded with.
    first = rise_began(steps[idx], v, k, max(int(np.searchsorted(idx, history)), k - LR_LOOKBACK), lrc)
    if idx[first] <= history or in_warmup(steps, lr, int(steps[idx[first]]), lrc):
        return None
    if warm_restart(v, first - 1, first, trained_level(steps[idx[:first]], v[:first], lrc, trained_lr), lrc):
        return None
    return int(idx[first])


def _known_change_point(loss: np.ndarray, rise: int, history: int, cfg: DivergenceConfig):
    """The two-median test at a known change point (row ``rise``): ``lift(lo, hi)`` -> (standard errors, lift,
    level before) of the loss level over lo..hi-1 against the level before ``rise``; None with fewer than 4
    blocks before it.

    A CUSUM against a baseline that follows the level sees a small lift only until the baseline catches up;
    with the change point given by the LR, two medians suffice. Their standard error comes from the spread
    of the block medians before the rise (noise and wander at the scale of a block), scaled to each window."""
    history_rows = loss[max(history, rise - 16 * SHIFT_BLOCK):rise]
    history_rows = history_rows[np.isfinite(history_rows)]
    nb = len(history_rows) // SHIFT_BLOCK
    if nb < 4:
        return None
    # The spread from up to 16 blocks (15 differences: a MAD of them is ~30% off sigma by chance, 1 in 20 times
    # under 0.55 of it: a review's 20,000 Gaussian draws; fewer blocks are worse).
    blocks = row_median(history_rows[len(history_rows) - nb * SHIFT_BLOCK:].reshape(nb, SHIFT_BLOCK))
    spread = MAD_TO_SIGMA * float(np.median(np.abs(np.diff(blocks)))) / np.sqrt(2.0)  # a trend cancels
    if not spread > 0:
        return None

    def lift(lo: int, hi: int) -> tuple[float, float, float]:
        after = loss[lo:hi]
        after = after[np.isfinite(after)]
        if len(after) < cfg.lr_shift_obs // 2:
            return 0.0, 0.0, math.nan
        # The level before over the same span as the level after (two blocks at least, eight at most): over a
        # longer one a loss still falling puts the median before far above the level the rise came from (a log
        # every 25 steps spans 1,600 steps in eight blocks), which hides the lift.
        before = history_rows[-min(max(len(after), 2 * SHIFT_BLOCK), 8 * SHIFT_BLOCK):]
        level = float(np.median(before))
        se = spread * np.sqrt(SHIFT_BLOCK / len(after) + SHIFT_BLOCK / len(before))
        return float((np.median(after) - level) / se), float(np.median(after)) - level, level

    return lift


def lr_level_shift(obs: Observations, history: int, cfg: DivergenceConfig, lrc: LRConfig,
                   segment: int, trained_lr: float = -np.inf) -> Finding | None:
    """A divergence at a known change point (``_known_change_point``): the LR was raised off the schedule and
    stayed up, and the loss level since (over the rows of ``lr_shift_windows``: the last 64 at most, and shorter
    windows only while the LR still grows) is above the level before by ``lr_shift_z`` standard errors (and 5% of
    it) at the last step."""
    steps, loss, lr = obs["step"], obs["loss"], obs["lr"]
    rise = lr_raised_since(steps, lr, lrc, history, trained_lr)
    if rise is None or len(loss) - rise < cfg.lr_shift_obs:
        return None
    lift = _known_change_point(loss, rise, history, cfg)
    if lift is None:
        return None
    widths = [k * cfg.lr_shift_obs for k in cfg.lr_shift_windows]
    known = np.isfinite(lr) & (lr > 0)
    lr_at = lr[np.maximum.accumulate(np.where(known, np.arange(len(lr)), 0))]  # the last LR logged by each row

    def lift_to(hi: int) -> tuple[float, float, float]:
        # The rows since the raise (the longest window at most), and each shorter window ending at row hi over
        # which the LR still grew: an effect that grows with its cause shows in the latest rows first. Under an
        # LR that stopped growing a short window is one more look at the same change with every new row.
        looks = [max(rise, hi - max(widths))] + [hi - w for w in widths if hi - w > rise
                                                 and lr_at[hi - 1] >= lrc.flat * lr_at[hi - w]]
        lifted = [t for t in (lift(lo, hi) for lo in looks) if t[2] > 0 and t[1] >= cfg.min_rise * t[2]]
        return max(lifted, key=lambda t: t[0], default=(-math.inf, 0.0, math.nan))

    z_now, rise_now, level = lift_to(len(loss))
    if z_now < cfg.lr_shift_z:
        return None  # not up now: the run absorbed the raised LR (or it never moved the loss)
    looks = range(rise + cfg.lr_shift_obs - 1, min(len(loss), rise + 16 * max(widths)))  # bounded: O(1) a report
    detected = next((j for j in looks if lift_to(j + 1)[0] >= cfg.lr_shift_z), len(loss) - 1)
    span = np.where(np.isfinite(loss[rise:]), loss[rise:], -np.inf)
    peak = rise + int(np.argmax(span))
    before_lr, now_lr = (float(lr[rise - 1]) if rise > 0 and lr[rise - 1] > 0 else None), float(lr[-1])
    ratio = now_lr / before_lr if before_lr else None
    after_level = level + rise_now
    return Finding(kind="divergence", onset_step=int(steps[first_consequence(steps, rise)]), end_step=int(steps[-1]),
                   peak_step=int(steps[peak]),
                   segment=segment, severity="critical", self_recovered=False, needs_action=True,
                   evidence={"lr_rise_step": int(steps[rise]), "lr_before": before_lr, "lr_at_onset": now_lr,
                             "lr_ratio": ratio, "lr_raised": True, "loss_before": level,
                             "loss_after": after_level, "shift_se": z_now, "detected_step": int(steps[detected]),
                             "rule": "lr_change_point"},
                   message=f"loss level up since the learning rate was raised at step {int(steps[rise])}"
                           + (f" (x{ratio:.3g})" if ratio else "")
                           + f": {level:.4g} -> {after_level:.4g}, {z_now:.1f} standard errors; still up at the last"
                             " step")


def raise_after(steps: np.ndarray, lr: np.ndarray, onset: int, by: int, upto: int, lrc: LRConfig,
                trained_lr: float = -np.inf) -> int | None:
    """The first consequence of an LR rise off the schedule (``lr_rise_start``: a jump, a ramp, a ramp riding a
    decaying schedule) running into row ``by`` (the alarm) and measured up to row ``upto``, when it lies after
    ``onset`` and by ``by``; else None. The alarm came only after the rise, so where the statistics date the change
    before it (a CUSUM's last zero, a hinge's knot, a climb dated by blocks) lies in noise that did not alarm, and
    the rise is the cause (DETECTION.md section 7a: an LR rise is the cause, its first consequence the onset). The
    caller keeps its onset where the rows before the rise carry a lift of their own (``lifted_before``). Reads no
    row after ``upto``."""
    if not onset < by <= upto < len(lr):
        return None
    steps, lr = steps[:upto + 1], lr[:upto + 1]
    rise = lr_rise_start(steps, lr, by, lrc, until=upto, since=onset, trained_lr=trained_lr)
    if rise is None or rise >= by:  # a rise on the alarm's own row has no consequence before it
        return None
    first = first_consequence(steps, rise)
    return first if onset < first <= by else None


def lifted_before(values: np.ndarray, onset: int, first: int, growth_z: float) -> bool:
    """Do the rows from ``onset`` to ``first`` stand ``growth_z`` standard errors above as many rows before the onset
    (at least ``BLOCK_ROWS``; ``median_shift_se``)? Then the change began with them, not with what came at ``first``."""
    before = values[max(0, onset - max(first - onset, BLOCK_ROWS)):onset]
    return bool(median_shift_se(before, values[onset:first]) >= growth_z)


def lr_raise_inside(obs: Observations, excursion: Finding, confirmed: int, history: int, config: object,
                    trained_lr: float = -np.inf) -> Finding | None:
    """A second cause inside an unrecovered loss excursion: the LR raised off the schedule (``lr_raised_since``), or
    a ramp lifting it off the schedule's path while the logged LR still falls (``lr_rise_start`` read into the last
    row: ``off_path_rise``), after the excursion was confirmed (row ``confirmed``), and still up at the last row (a
    raise; a ramp not stepped back down by ``raise_factor`` in one row since its first update).

    The two-median test of ``lr_level_shift`` cannot see it: the level before the raise is the excursion's own, so
    the loss has no lift left to show. The LR column shows the cause itself, and a run cannot come back while an LR
    raised off its schedule stays up (for ``lr_shift_obs`` rows, as ``lr_level_shift`` asks), so it is a divergence
    of its own beside the excursion (the rollback still precedes the excursion, the earliest problem). A healthy
    run has no unrecovered excursion to test, so the false-alarm budget is untouched (fresh seed 402220's run 077:
    an LR burst's spike never came back, and the LR then grew x1.5 and more, labelled a divergence of its own and
    reported as nothing). A ramp on a decay is the same cause, though no row rises over an earlier one: 6 of the
    33 divergences missed on the 20 looked-at fresh seeds (726552's run 032: x1.0018 a step from 607 on a linear
    decay of 0.9% a step, inside an LR burst's spike from 405). A raise before the excursion was confirmed is part of
    it (its cause, or a slow rise the excursion's trigger came after: 253768's run 062)."""
    steps, lr = obs["step"], obs["lr"]
    if excursion.self_recovered is not False or not len(lr):
        return None
    def judged(r: int | None) -> bool:  # after the confirmation, and held the rows the change-point test asks
        return r is not None and confirmed < r <= len(lr) - config.divergence.lr_shift_obs

    rise, raised = lr_raised_since(steps, lr, config.lr, history, trained_lr), True
    if not judged(rise):  # none, the excursion's own raise, or one too recent (a restart on the last row): before it?
        rise, raised = lr_rise_start(steps, lr, len(lr) - 1, config.lr, since=confirmed, trained_lr=trained_lr), False
    if not judged(rise):
        return None
    onset = first_consequence(steps, rise)
    logged = np.flatnonzero(np.isfinite(lr[:rise]) & (lr[:rise] > 0))  # the LR before it, where one was logged
    before = float(lr[logged[-1]]) if len(logged) else None  # None, not NaN: evidence is JSON
    now = float(lr[-1])
    ratio = now / before if before else None
    by_now = f" (x{ratio:.3g} by the last step)" if ratio and ratio >= 1 else ""
    how = (f"was raised off its schedule at step {int(steps[rise])}{by_now}" if raised else
           f"left its schedule's path at step {int(steps[rise])}"
           + (", a ramp riding its decay" if ratio is not None and ratio < 1 else by_now))
    return Finding(kind="divergence", onset_step=int(steps[onset]), end_step=int(steps[-1]), peak_step=int(steps[-1]),
                   segment=excursion.segment, severity="critical", self_recovered=False, needs_action=True,
                   evidence={"rule": "lr_raise_inside", "lr_rise_step": int(steps[rise]), "lr_before": before,
                             "lr_at_onset": now, "lr_ratio": ratio, "lr_raised": True, "lr_still_raised": True,
                             "inside_step": excursion.onset_step, "detected_step": int(steps[-1])},
                   message=f"the learning rate {how} while the loss was still out from step {excursion.onset_step}:"
                           " the run cannot come back under it")


def lr_bursts(steps: np.ndarray, lr: np.ndarray, lrc: LRConfig, history: int = 0) -> list[tuple[int, int]]:
    """(first row, first row back down) of each LR burst: a one-row step up by ``raise_factor`` over the row
    before, outside the opening warm-up, back within ``flat`` of that LR within ``lag_rows`` rows. One that
    stays up longer is a raise (``lr_raised_since``, the divergence's); whether a burst is the schedule's warm
    restart is asked only of one that moved the loss (``lr_burst_shifts``), since asking costs a pass over
    the LR before it."""
    if len(lr) < 2:
        return []
    with np.errstate(invalid="ignore"):
        ups = history + 1 + np.flatnonzero(lr[history + 1:] >= lrc.raise_factor * lr[history:-1])
    out: list[tuple[int, int]] = []
    for a in ups.tolist():
        if out and a < out[-1][1]:
            continue  # a second step up inside a burst is the same burst
        level = lr[a - 1]
        with np.errstate(invalid="ignore"):
            back = np.flatnonzero(lr[a + 1:a + 1 + lrc.lag_rows] <= lrc.flat * level)
        if not len(back) or not level > 0 or in_warmup(steps, lr, int(steps[a]), lrc):
            continue
        out.append((a, a + 1 + int(back[0])))
    return out


def lr_burst_shifts(obs: Observations, history: int, config: object, segment: int,
                    trained_lr: float = -np.inf) -> list[Finding]:
    """Spikes at known change points: an LR burst (``lr_bursts``) after which the loss level stood
    ``lr_shift_z`` standard errors (and the spike's ``min_rise`` of it) above the level before, over one of the
    windows of ``lr_burst_windows`` from the burst's first consequence (``_known_change_point``); a lift past
    ``lr_note_z`` only is an 'info' annotation.

    A burst of a few updates can lift the loss 4-8 of its noise sigmas for tens of rows: under every
    one-observation bar and too short for the CUSUM bank to reach its interval, so nothing else finds it (11 of
    the 17 spike labels missed on fresh seeds 368521, 866182 and 709008). The LR column names the change point,
    as it does for a raise that stays up, and the false-alarm budget is untouched: a healthy run has no burst to
    test. Lifted up to the data's end, it is not seen to come back: critical, it needs action (as a spike still
    out at the last step).

    Not inside the opening warm-up, read through the bursts in it (``warmup_resumed_end``): the test's risk was
    measured after the warm-up, and in it the loss level moves with the rising LR by tens of standard errors of
    the two medians with nothing wrong (fresh seed 34384's run 141: an x3 burst at 154 of a 272-step warm-up,
    "20 standard errors" up, its clean twin's loss alike to 0.1). A burst there that throws the loss is the
    spike's own (Shewhart, the CUSUM bank)."""
    steps, loss, lr = obs["step"], obs["loss"], obs["lr"]
    cfg, lrc, min_rise = config.divergence, config.lr, config.spike.min_rise
    n, out = len(loss), []
    warm = warmup_resumed_end(steps, lr, lrc, warmup_end(steps, lr, lrc))
    for a, back in lr_bursts(steps, lr, lrc, history):
        if warm is not None and steps[a] <= warm:
            continue
        c = first_consequence(steps, a)
        lift = _known_change_point(loss, a, history, cfg)
        if lift is None or n - c < cfg.lr_shift_obs:
            continue
        tests = [(lift(c, min(n, c + k * cfg.lr_shift_obs)), min(n, c + k * cfg.lr_shift_obs))
                 for k in cfg.lr_burst_windows]
        (z, up, level), hi = max(tests, key=lambda t: t[0][0])
        if z < cfg.lr_note_z or not level > 0 or up < min_rise * level:
            continue
        if warm_restart(lr, a - 1, a, trained_level(steps[:a], lr[:a], lrc, trained_lr), lrc):
            continue  # the schedule's restart: the loss answering it is the schedule's (``restart_before``)
        lasting, end = hi == n, hi - 1  # lifted up to the data's end: not seen to come back (yet)
        span = np.where(np.isfinite(loss[c:hi]), loss[c:hi], -np.inf)
        peak = c + int(np.argmax(span))
        before_lr, burst_lr = float(lr[a - 1]), float(np.nanmax(lr[a:back]))
        evidence = {"rule": "lr_burst_change_point", "lr_rise_step": int(steps[a]), "lr_back_step": int(steps[back]),
                    "lr_before": before_lr, "lr_at_onset": burst_lr, "lr_ratio": burst_lr / before_lr,
                    "lr_raised": True, "lr_still_raised": False, "lr_scheduled": False, "baseline_loss": level,
                    "loss_after": level + up, "peak_loss": float(span.max()) if np.isfinite(span).any() else None,
                    "shift_se": z, "detected_step": int(steps[hi - 1]),
                    "recovery_steps": None if lasting else recovery_steps(steps, c, end)}
        message = (f"loss level up after the learning rate burst at step {int(steps[a])} "
                   f"(x{burst_lr / before_lr:.3g} until step {int(steps[back])}): {level:.4g} -> {level + up:.4g}, "
                   f"{z:.1f} standard errors; " + ("still up at the last step" if lasting else
                                                     f"back by step {int(steps[end])}"))
        paged = z >= cfg.lr_shift_z  # under it: noted (``lr_note_z``), not paged
        out.append(Finding(kind="spike", onset_step=int(steps[c]), end_step=int(steps[end]),
                           peak_step=int(steps[peak]), segment=segment,
                           severity=("critical" if lasting else "warning") if paged else "info",
                           self_recovered=not lasting, needs_action=lasting and paged, evidence=evidence,
                           message=message))
    return out


def _loss_ends(loss: np.ndarray, n: int) -> tuple[float, float, float] | None:
    """The loss's median over the first quarter of a norms' climb, over its last quarter (at least ``n`` finite
    values each; halves of a shorter climb, from 16 values on, as ``climb_se``), and the standard error of their
    difference (1.2533 sigma / sqrt(n) each; sigma from the loss's successive differences, blind to the trend).
    Quarters, not a fixed ``n``: both ends of the climb are still compared, and the power grows with its length
    (fresh seed 795446's run 039, batch 3: the loss fell 3.9 -> 3.1 over a 200-step climb, 1.9 standard errors on
    16 values each, 5.6 on quarters). None with fewer values or no spread."""
    loss = loss[np.isfinite(loss)]
    n = min(max(n, len(loss) // 4), len(loss) // 2)
    if n < 8:
        return None
    d = np.diff(loss)
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2.0)
    se = np.sqrt(2.0) * 1.2533 * sigma / np.sqrt(n)
    return (float(np.median(loss[:n])), float(np.median(loss[-n:])), se) if se > 0 else None


def loss_stalled(loss: np.ndarray, n: int, z: float, min_fall: float) -> bool:
    """Did the loss buy nothing over a norms' climb: its fall (``_loss_ends``), ``z`` standard errors up, still
    under ``min_fall`` of its level? OPT's precursor is growth that buys nothing, before a loss that stalls or
    rises, and a climb called one refuses every checkpoint taken during it: the advice throws that training away.
    So the stall must be shown, as the growth is (``act_climb_z``), not merely a fall left unproven: on the clean
    twins of eleven fresh seeds (``bench/climb_null.py``) 33 of 105 natural climbs at a checkpoint were refused
    while the loss fell through them by too few standard errors to call it learning (batch 2-6 losses: 10-73%
    falls at 2.2-2.5 standard errors), 6 by this test. False with too few values (nothing shown)."""
    ends = _loss_ends(loss, n)
    if ends is None:
        return False
    first, last, se = ends
    return first - last + z * se < min_fall * abs(first)


def loss_shift_se(loss: np.ndarray, n: int) -> float:
    """How far the loss moved over a norms' climb (``_loss_ends``: its last quarter's median less its first's), in
    standard errors of that difference. NaN with too few values or no spread."""
    ends = _loss_ends(loss, n)
    return math.nan if ends is None else (ends[1] - ends[0]) / ends[2]


def loss_fell_through(loss: np.ndarray, n: int, z: float, min_fall: float) -> bool:
    """Did the loss fall over a norms' climb by ``z`` standard errors (``loss_shift_se``) and by ``min_fall`` of its
    level? Norms grow as a model learns (early training takes them several-fold up while the loss falls fast), and
    OPT's precursor is growth that buys nothing, before a loss that stalls or rises: the precursor finding and the
    advice's walk back both ask. The floor is practical significance, as a spike's ``min_rise``: over a long climb
    the standard error shrinks until a fall of a fraction of a percent, the slow descent of late training, is
    significant, and that buys nothing for a norm that doubles."""
    ends = _loss_ends(loss, n)
    if ends is None:
        return False
    first, last, se = ends
    return (last - first) / se < -z and first - last >= min_fall * abs(first)


def _ratio(values: np.ndarray, before: slice, during: slice) -> float | None:
    a, b = values[before], values[during]
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not len(a) or not len(b) or np.median(a) <= 0:
        return None
    return float(np.median(b) / np.median(a))


def detect_divergence(steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, act: np.ndarray, lr: np.ndarray,
                      segment: int = 0, config: object | None = None) -> list[Finding]:
    """Offline: every divergence in one segment's loss observations (other signals on the same rows)."""
    from runwatch.detectors.config import DEFAULT

    obs = {"step": np.asarray(steps, dtype=np.int64)}
    for name, values in (("loss", loss), ("grad_norm", grad), ("act_norm", act), ("lr", lr)):
        obs[name] = np.asarray(values, dtype=np.float64)
    scanner = DivergenceScanner(ScanContext(segment=segment, config=config or DEFAULT))
    scanner.advance(obs)
    return scanner.findings(obs)

