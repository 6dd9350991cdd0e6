"""fp16 loss-scale collapse: the scaler skipping steps far above its own healthy rate, or its scale under 1.

Dynamic loss scaling halves the scale on an overflow (the step is skipped)
and doubles it after ``growth_interval`` clean steps, so a healthy fp16 run
skips about one step per growth interval: the sawtooth. A collapse is a skip
rate far above that, judged with a Bernoulli CUSUM of the skip indicator
(../shared/DETECTION.md, section 6): the healthy rate p0 of about one skip per
growth interval (from ``run.json``, else learned from the sawtooth or the
config's default) against a collapse rate p1 of at least twice that
(``rates``); each skipped step adds log(p1 / p0), each clean step
log((1 - p1) / (1 - p0)); an alarm at ``skip_h``. The skip indicator is the
logged ``found_inf`` (overflow logs such as DeepSpeed's print every skip, so the
steps between two flagged rows ran clean), else a decrease of the logged scale
(log2 of the ratio skips, somewhere in the interval). Every step skipped at a
pinned minimum (DeepSpeed's "Attempted loss scale: 1, reducing to 1") is the
limit case: no halving, the scale never under 1, and still a collapse. A scale
under ``floor`` is one too.

Start-up calibration, the scale halving down from its initial value before it
ever grew in the first ``calibration_steps`` training steps, is the scaler
finding its level: a property of the scale and of the step number, not of the
row index, so a log excerpt that starts late is judged in full. A collapse is
over when the sum is back at 0 and the scale grew back to within
2^``recovered_within`` of where it trained (``_target``: recovered), or when the sum is back at
0 and nothing was skipped for ``patience_steps`` with the scale still lower
(not recovered, unless it regrows before the next incident: a late recovery;
a later burst is another collapse); one still skipping at the last step, under
the floor, or not over ``patience_steps`` after its last skip needs action.
"""

from __future__ import annotations

import math

import numpy as np

from runwatch.detectors.config import ScalerConfig
from runwatch.detectors.core import ROWS_AT_ONCE, Grow, cusum
from runwatch.detectors.finding import Finding, recovery_steps
from runwatch.detectors.scanner import Observations, ScanContext


class ScalerScanner:
    """Incremental over the rows of one segment where the loss scale or the skip flag was logged."""

    def __init__(self, ctx: ScanContext) -> None:
        self.ctx, self.cfg = ctx, ctx.config.scaler
        scaler = ctx.meta.get("scaler") if isinstance(ctx.meta.get("scaler"), dict) else {}
        known = scaler.get("growth_interval")
        # The growth interval sets the healthy skip rate: the run's metadata says it, or its own sawtooth
        # shows it (the steps a regrowth took per doubling, the shortest seen so far), else the default.
        self.interval = float(known) if known else float(self.cfg.growth_interval)
        self.learn_interval = not known
        self.last_drop_step: int | None = None
        self.pos = 0
        self.prev_step: int | None = None  # the last row judged
        self.prev_scale = math.nan  # the last logged scale
        self.prev_flag = 0.0  # whether the row before was flagged skipped
        self.grew = False  # the scale has grown once: calibration is over
        self.s = 0.0
        self.cp: int | None = None  # first skipped row since the sum was last 0 (None: none yet)
        self.episode: dict | None = None
        self.closed: list[dict] = []
        self.all_skips = Grow()  # skipped steps on every row so far
        self.own_skip = Grow(np.bool_)  # per row: its skip is its own logged step (flagged, no halving before it)
        self.intervals = Grow()  # the growth interval in force at every row
        self.chain: dict | None = None  # the halving chain in progress
        self.chain_closed: list[dict] = []
        self.chain_ends: list[tuple[int, int]] = []  # (row a collapse chain was closed at, its last skip's row)
        self.chain_prev, self.chain_grew = math.nan, False
        self.chain_prev_step: int | None = None
        self.drop_step, self.drop_scale = Grow(np.int64), Grow()  # every decrease of the logged scale: step, scale before

    def advance(self, obs: Observations) -> None:
        steps, scale = obs["step"], obs["loss_scale"]
        n, lo = len(steps), self.pos
        if n <= lo:
            return
        skips, grew_at, interval, own = self._skips(lo, n, obs)
        self.all_skips.extend(skips, share=True)  # the scanner's own arrays: kept, not copied
        self.own_skip.extend(own, share=True)
        self.intervals.extend(interval, share=True)
        self._chains(lo, n, steps, scale)
        inc = self._increments(lo, n, steps, skips, interval, grew_at)
        s = cusum(inc, self.s, -1, lo, with_zero=False)[0]
        cp = self._change_points(s, -1, lo)
        self.s = self._episodes(lo, n, s, cp, inc, steps, scale)
        self.prev_step, self.pos = int(steps[n - 1]), n

    def _increments(self, lo: int, n: int, steps: np.ndarray, skips: np.ndarray, interval: np.ndarray,
                    grew_at: int) -> np.ndarray:
        """The Bernoulli CUSUM's increment at each row lo..n-1: log(p1 / p0) a skip, log((1 - p1) / (1 - p0)) a
        clean step. Each row on its own, in passes of ``ROWS_AT_ONCE``."""
        inc = np.empty(n - lo)
        first = self.prev_step if self.prev_step is not None else int(steps[lo]) - 1
        for a in range(lo, n, ROWS_AT_ONCE):
            b = min(n, a + ROWS_AT_ONCE)
            prev = steps[a - 1:b - 1] if a > lo else np.concatenate([[first], steps[lo:b - 1]])
            span = np.maximum(steps[a:b] - prev, 1)
            sk, iv = skips[a - lo:b - lo], interval[a - lo:b - lo]
            if iv.min() == iv.max():  # one growth interval over the piece (the usual case): its two logs once
                iv = iv[:1]  # a value's log is the same bits alone or among others (numpy's SIMD lanes are alike)
            p0, p1 = rates(iv, self.cfg, not self.learn_interval)
            part = sk * np.log(p1 / p0) + (span - sk) * np.log((1 - p1) / (1 - p0))
            # A skip seen on a row happened somewhere since the row before: calibration when that interval began
            # in the opening steps (a log written every 100 steps shows the opening halvings at step 100).
            calibrating = (np.arange(a, b) < grew_at) & (prev < self.cfg.calibration_steps)
            inc[a - lo:b - lo] = np.where(calibrating, np.minimum(part, 0.0), part)  # calibration skips by design
        return inc

    def _chains(self, lo: int, n: int, steps: np.ndarray, scale: np.ndarray) -> None:
        """Halving chains: decreases of the logged scale with no growth in between (walks changed rows only)."""
        finite = np.isfinite(scale[lo:n])
        if finite.all():  # every row logs its scale (the usual fp16 log): no search and gather
            rows, vals = np.arange(lo, n), scale[lo:n]
        else:
            rows = lo + np.flatnonzero(finite)
            vals = scale[rows]
        if not len(rows):
            return
        prev = np.concatenate([[self.chain_prev], vals[:-1]])
        if math.isnan(self.chain_prev) and vals[0] < self.cfg.floor:  # a log that starts under the floor
            prev[0] = self.cfg.floor
        with np.errstate(invalid="ignore"):
            changed = np.flatnonzero((vals != prev) & np.isfinite(prev))
        # The changed rows' values as Python numbers at once (the loop reads each several times).
        at_rows = rows[changed]
        at_steps = steps[at_rows].tolist()
        steps_before = steps[rows[np.maximum(changed - 1, 0)]].tolist()  # the logged row before each
        for k, i, before, now, step_i, step_before in zip(changed.tolist(), at_rows.tolist(), prev[changed].tolist(),
                                                          vals[changed].tolist(), at_steps, steps_before):
            ch = self.chain
            if now > before:  # growth ends a chain (a burst that regrew near its start is over)
                self.chain_grew = True
                if ch is not None and self._counts(ch):
                    if now >= self._target(ch, steps, scale) / 2.0 ** self.cfg.recovered_within:
                        ch["end"] = ch["last_skip"]
                        self.chain_closed.append(ch)
                        self.chain_ends.append((i, ch["end"]))
                        self.chain = None
                elif ch is not None:
                    self.chain = None
                continue
            since = step_before if k > 0 else (self.chain_prev_step if self.chain_prev_step is not None else step_i)
            if ch is not None and ch["calibration"] and since >= self.cfg.calibration_steps:
                ch = self.chain = None  # the opening calibration is over: a later halving starts a chain of its own
            idle = ch is not None and (
                step_i - int(steps[ch["last_skip"]]) > self.cfg.patience_steps
                or burst_over(ch["num_skipped"], int(steps[ch["first"]]), int(steps[ch["last_skip"]]), since,
                              self.cfg.burst_over_risk))
            if idle and "alarm" in ch:
                # A collapse that never regrew, over (no halving for ``patience_steps``, or clean for longer than its
                # own skip rate allows): this halving begins another.
                ch["end"], ch["regrown"] = ch["last_skip"], False
                self.chain_closed.append(ch)
                self.chain_ends.append((i, ch["end"]))
                ch = self.chain = None
            if ch is None:
                ch = self.chain = {"first": i, "first_lo": i, "last_skip": i, "min": now, "min_i": i, "drops": [],
                                   "before": before, "ref": min(before, self._ceiling(i, steps)),
                                   "num_skipped": 0.0, "halvings": 0.0,
                                   "calibration": not self.chain_grew and since < self.cfg.calibration_steps}
            ch["last_skip"] = i
            skipped = max(round(math.log2(before / now)), 1) if now > 0 and before > 0 else 1
            ch["drops"].append((since, skipped))
            self.drop_step.append(step_i)
            self.drop_scale.append(before)
            # The depth counts from the scale it usually overflows at; the recovery aims at where it ran
            # (``_target``).
            ch["halvings"] = math.log2(ch["ref"] / now) if now > 0 and ch["ref"] > 0 else math.inf
            if "alarm" not in ch and ch["halvings"] >= self.cfg.min_halvings and not ch["calibration"] \
                    and self._faster_than_healthy(ch, step_i, float(self.intervals.view[i])):
                ch["alarm"] = i
                # The scale a row logs is the one its step ran with: the first decrease shows the halving of the
                # skip flagged on the row before it, whether or not the decrease's own step skipped too (every
                # other step overflowing) and however far apart the rows are logged, unless that row's scale had
                # just grown (``_probe``); a burst of flagged skips one step apart running into that row began at
                # its first. The change point chooses among them.
                start, own = ch["first"], self.own_skip.view
                if start > 0 and own[start - 1] and not _probe(scale, start - 1):
                    start -= 1
                    while start > 0 and own[start - 1] and int(steps[start]) - int(steps[start - 1]) == 1:
                        start -= 1
                ch["first"], ch["first_lo"] = self._onset(start, i, steps)
            ch["num_skipped"] += skipped
            if now < ch["min"]:
                ch["min"], ch["min_i"] = now, i
        self.chain_prev = float(vals[-1])
        self.chain_prev_step = int(steps[rows[-1]])

    def _faster_than_healthy(self, ch: dict, step: int, interval: float) -> bool:
        """Whether a chain's skips came too fast for the healthy rate: for some run of its latest halvings, as many
        skips over the steps since the row before the first of them would come with probability under
        ``chain_risk`` at one skip per growth interval (``rates``' p0; a Poisson tail). A deep tooth of a healthy
        sawtooth is independent overflows, each after hundreds of clean steps, that happen to come before the
        scale could regrow: bench/calibrate.py's draw 1 had three on one run logged every 100 steps (16384 -> 1024
        in ~1900 steps, growth interval 1000: 4 skips where 1.9 are expected, a 1-in-8 tail), three of its six
        false alarms. A collapse halves the scale within steps of each halving (every step, every other step,
        pinned at the floor), also after an ordinary overflow the scale has not yet regrown from (fresh seed
        9881's run 097: one at 115, three in a row at 169-171). Asked only where the run's metadata states its
        growth interval: one learned from the sawtooth is a lower bound on the real one (the shortest regrowth
        seen, ``rates``), so its healthy rate is an upper bound that would clear real collapses, and a coarse
        log's halvings are a lower bound on its skips."""
        if self.learn_interval:
            return True
        p0, skips = float(rates(interval, self.cfg, True)[0]), 0
        for since, k in reversed(ch["drops"]):
            skips += k
            if poisson_tail(skips, max(step - since, skips) * p0) < self.cfg.chain_risk:
                return True
        return False

    def _ceiling(self, i: int, steps: np.ndarray) -> float:
        """The scale this scaler usually overflows at: the median scale before its halvings of the last
        ``level_window`` growth intervals (inf before any). A healthy sawtooth now and then regrows one doubling
        above it and falls straight back; a chain counted from that peak is a halving or two deeper than the
        scaler ever fell (bench/calibrate.py: both false collapses left in 3M healthy steps were such peaks)."""
        past = self.drop_scale.view[int(np.searchsorted(self.drop_step.view, self._level_since(i, steps))):]
        return _median(past) if len(past) else math.inf

    def _level_since(self, i: int, steps: np.ndarray) -> float:
        """The first step of the ``level_window`` growth intervals up to row ``i``, over which the scaler's usual
        level is read (``_ceiling``, ``_target``)."""
        return int(steps[i]) - self.cfg.level_window * float(self.intervals.view[i])

    def _skips(self, lo: int, n: int, obs: Observations) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
        """Skipped steps on each row (the flag or the halvings of the logged scale), the first growth row,
        the growth interval in force at each row, and whether a row's skip is its own logged step alone."""
        skips, own = np.empty(n - lo), np.empty(n - lo, dtype=bool)
        parts = [self._skips_part(a, min(n, a + ROWS_AT_ONCE), obs, skips[a - lo:], own[a - lo:])
                 for a in range(lo, n, ROWS_AT_ONCE)]
        grown = np.concatenate([g for g, _ in parts])  # rows where the logged scale grew, and the scale before
        grown_from = np.concatenate([f for _, f in parts])
        grew_at = lo if self.grew else (int(grown[0]) if len(grown) else n)
        self.grew = self.grew or bool(len(grown))
        interval = np.full(n - lo, self.interval)
        steps, scale = obs["step"], obs["loss_scale"]
        drops = set((lo + np.flatnonzero(skips > 0)).tolist())
        grows = {int(i): k for k, i in enumerate(grown)}
        for i in sorted(drops | grows.keys()):
            # A row that shows the scale grew (and, on an overflow log, skipped again): the growth came first.
            if i in grows and self.learn_interval and self.last_drop_step is not None:
                doublings = max(math.log2(float(scale[i] / grown_from[grows[i]])), 1.0)
                estimate = (int(steps[i]) - self.last_drop_step) / doublings
                if 1.0 <= estimate < self.interval:
                    self.interval = estimate
                    interval[i - lo + 1:] = estimate  # in force from the next row on
            if i in drops:
                self.last_drop_step = int(steps[i])
        return skips, grew_at, interval, own

    def _skips_part(self, lo: int, n: int, obs: Observations, skips: np.ndarray,
                    own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_skips`` of rows lo..n-1 into ``skips`` and ``own`` (from their starts), carrying the last logged scale
        and flag on to the next rows; the rows where the scale grew and the scale before each."""
        scale = obs["loss_scale"][lo:n]
        known = np.concatenate([[self.prev_scale], scale])
        idx = np.maximum.accumulate(np.where(np.isfinite(known), np.arange(len(known)), 0))
        before = known[idx][:-1]  # the last logged scale before each row
        with np.errstate(invalid="ignore", divide="ignore"):
            logged = np.isfinite(scale) & np.isfinite(before)
            # Halvings where the scale fell (a few rows in thousands): the ratio's log2 there alone.
            fell = np.flatnonzero(logged & (scale < before))
            halvings = np.zeros(len(scale))
            if len(fell):
                now, then = scale[fell], before[fell]
                ratio = np.where((now > 0) & (then > 0), then / np.where(now > 0, now, 1.0), 2.0)
                halvings[fell] = np.clip(np.round(np.log2(ratio)), 1.0, 1e6)
            grown = np.flatnonzero(logged & (scale > before) & (before > 0))
        flagged = obs["found_inf_present"][lo:n]
        flag = np.where(flagged, obs["found_inf"][lo:n].astype(np.float64), 0.0)
        # The flag says whether the logged step itself was skipped; the halvings since the row before count the
        # skips in between (a log every k steps sees most of them only that way), less the flagged row before's
        # own (the scale a row logs is the one its step ran with: that skip's halving shows on the next row). The
        # row's own skip is one more: its halving shows only on the next row.
        prev = np.concatenate([[self.prev_flag], flag[:-1]])
        np.add(flag, np.maximum(halvings - prev, 0.0), out=skips[:n - lo])
        np.logical_and(flag > 0, halvings - prev <= 0, out=own[:n - lo])
        if len(flag):
            self.prev_flag = float(flag[-1])
        self.prev_scale = float(known[idx[-1]])  # the last logged scale (as it was, where no row logs one)
        return lo + grown, before[grown]

    def _change_points(self, s: np.ndarray, zero0: int, lo: int):
        """The CUSUM's change-point estimate at a row (index into ``s``, the sums of rows lo..): the first skipped
        row after the sum was last 0, ``cusum``'s last zero (``zero0`` before any) plus one. A function, not an
        array of every row: the episodes ask for it at an alarm, a few times a segment, so the last zero is
        looked for back from that row."""
        pending = self.cp if self.cp is not None else lo
        end = lo + len(s) - 1

        def at(j: int) -> int:
            last = _last_at_or_below_zero(s, j + 1)
            zero = lo + last if last is not None else zero0
            return min(zero + 1, end) if zero >= 0 else pending

        self.cp = None if s[-1] <= 0.0 else at(len(s) - 1)
        return at

    def _episodes(self, lo: int, n: int, s: np.ndarray, cp, inc: np.ndarray, steps: np.ndarray,
                  scale: np.ndarray) -> float:
        """Open, follow and close skip-burst episodes over rows lo..n-1; the CUSUM's sum after the last row (a
        skip after a burst over by its own rate restarts it at 0 there)."""
        p, within, base = lo, 2.0 ** self.cfg.recovered_within, lo  # s and cp hold rows base..n-1
        while p < n:
            ep = self.episode
            if ep is None:
                hit = _first(piece > self.cfg.skip_h for piece in _pieces(s, p - base))
                if hit is None:
                    return float(s[-1])
                p += hit
                # A change point never reaches back past a collapse already over by this row: the sum still
                # carried that one's skips, but a later burst is an incident of its own.
                floor = max((end + 1 for at, end in self.chain_ends if at <= p), default=0)
                first, first_lo = self._onset(max(cp(p - base), floor), p, steps)
                ep = self.episode = {"first": first, "first_lo": first_lo, "last_skip": first, "min": math.inf,
                                     "min_i": first, "before": _last_finite(scale, first), "num_skipped": 0.0}
                self._absorb(ep, first, p, scale)
            end = self._episode_end(ep, p, n, s[p - base:], steps, scale, within)
            if end is None:
                self._absorb(ep, p, n, scale)
                return float(s[-1])
            k, done, renewed = end
            low = self._low(self._target(ep, steps, scale), scale, within)
            if renewed and not done:
                self._absorb(ep, p, p + k, scale)
                ep["end"], ep["regrown"] = ep["last_skip"], not low(p + max(k - 1, 0))
                self.closed.append(ep)
                self.episode = None
                # The chart restarts at that skip: the sum still held the ended burst's nats.
                r = p + k
                s = cusum(inc[r - lo:], 0.0, r - 1, r, with_zero=False)[0]
                self.cp = None
                cp = self._change_points(s, r - 1, r)
                p = base = r
                continue
            stop = p + k
            self._absorb(ep, p, stop, scale)
            ep["end"], ep["regrown"] = ep["last_skip"], not low(p + k)
            self.closed.append(ep)
            self.episode = None
            p = stop + 1
        return float(s[-1])

    def _episode_end(self, ep: dict, p: int, n: int, s: np.ndarray, steps: np.ndarray, scale: np.ndarray,
                     within: float) -> tuple[int, bool, bool] | None:
        """(k, done, renewed) at the first row p + k that ends the open episode ``ep`` (``s``: the sums from row
        p), or None: read in passes of ``ROWS_AT_ONCE`` carrying the last skip and the skips counted, so a
        collapse that ends within a few rows costs a few rows, not the rest of the segment."""
        last_skip, counted = ep["last_skip"], 0.0
        for a in range(p, n, ROWS_AT_ONCE):
            b = min(n, a + ROWS_AT_ONCE)
            x = scale[a:b]
            low = np.isfinite(x) & (x < self._target(ep, steps, scale) / within)
            # Or the skipping has been over for ``patience_steps`` with the scale still low: the collapse ended
            # without the scaler regrowing (it did not recover), and a later burst is an incident of its own.
            own = self.all_skips.view[a:b]
            hit = np.where(own > 0, np.arange(a, b), -1)
            last = np.maximum(np.maximum.accumulate(hit), last_skip)
            idle = steps[a:b] - steps[last] > self.cfg.patience_steps
            done = (s[a - p:b - p] <= 0.0) & (~low | idle)
            # Or a skip comes after the burst was over by its own rate (clean since its last skip for longer than
            # that rate allows): this one ended at its last skip, and the skip begins another, judged afresh.
            before_last = np.concatenate([[last_skip], last[:-1]])
            seen_clean_to = steps[np.maximum(np.arange(a, b) - 1, 0)]  # a coarse row's skips fell since the row before
            running = own.copy()  # the skips counted up to each row: one sequential sum across the passes
            if a > p:
                running[0] = counted + running[0]
            running = np.cumsum(running)
            renewed = (own > 0) & burst_over(ep["num_skipped"] + running - own, int(steps[ep["first"]]),
                                             steps[before_last], seen_clean_to, self.cfg.burst_over_risk)
            ends = np.flatnonzero(done | renewed)
            if len(ends):
                j = int(ends[0])
                return a + j - p, bool(done[j]), bool(renewed[j])
            last_skip, counted = int(last[-1]), float(running[-1])
        return None

    @staticmethod
    def _low(target: float, scale: np.ndarray, within: float):
        """Whether row i's scale is still under an episode's ``_target`` by more than 2^``recovered_within``."""
        def low(i: int) -> bool:
            x = scale[i]
            return bool(np.isfinite(x) & (x < target / within))
        return low

    def _target(self, ep: dict, steps: np.ndarray, scale: np.ndarray) -> float:
        """The scale a collapse regrows towards: the scale before it, or, where the scaler was in its sawtooth
        (it had fallen over the ``level_window`` growth intervals before), the lower of that and the median logged
        scale over them: where the run usually trained (NaN without either). A sawtooth at its ceiling logs the
        scale it overflows at for one step a growth interval and half of it for the rest (fresh seed 277506's run
        082: 262144 once each 27 steps, 131072 between), so the scale before a burst can be that one peak. A scaler
        still growing from its initial scale has no usual level yet: its median lags where it is going (fresh seed
        991661's run 064: 1024 -> 65536 by 370 with no overflow, a median of 8192 over the window, and a collapse
        to 512 read as regrown at 1024 while the clean twin went on to 262144). Computed once, when a recovery is
        first asked about (a few times a segment)."""
        if "target" not in ep:
            i = ep["first"]
            start, since = int(steps[i]), self._level_since(i, steps)
            drops = self.drop_step.view
            fell = np.searchsorted(drops, start) > np.searchsorted(drops, since)
            past = scale[int(np.searchsorted(steps[:i], since)):i] if fell else np.empty(0)
            past = past[np.isfinite(past)]
            usual = float(np.median(past)) if len(past) else math.nan
            ep["target"] = float(np.fmin(ep["before"], usual))
        return ep["target"]

    def _onset(self, zero_next: int, alarm: int, steps: np.ndarray) -> tuple[int, int]:
        """The maximum-likelihood change point between the CUSUM's last zero and the alarm, and the earliest
        row of its confidence set.

        The CUSUM's own estimate (the first skip after its last zero) assumes the
        collapse rate p1; a real collapse skips far more often, and an ordinary
        backoff shortly before it would pull the onset early. With the rate after
        the change estimated from the data (p = k/m: k skips in the m steps from a
        candidate row to the alarm), the onset is the skipped row that maximises
        k log(p/p0) + (m - k) log((1 - p)/(1 - p0)).

        The rows whose log-likelihood ratio lies within ``cfg.change_point_slack`` of that maximum are the change
        point's confidence set (the profile-likelihood interval); a rollback must precede all of it. On a coarse
        log one halving in the row before the burst is as likely the collapse's first skip as an ordinary
        backoff (fresh seed 260854's runs 128 and 147, logged every 10 and 25 steps: the change point put one
        row late, a checkpoint in between advised).
        """
        rows = np.arange(zero_next, alarm + 1)
        skips = self.all_skips.view[zero_next:alarm + 1]
        cand = rows[skips > 0]
        if len(cand) <= 1:
            return (int(cand[0]),) * 2 if len(cand) else (zero_next, zero_next)
        k = np.cumsum(skips[::-1])[::-1][skips > 0]  # skips from each candidate to the alarm
        # A candidate's skips happened somewhere since the row before, unless the row's skip is its own logged
        # step (flagged, no halving before it): then the change is at that very step.
        prev = np.where((cand > 0) & ~self.own_skip.view[cand], steps[np.maximum(cand - 1, 0)], steps[cand] - 1)
        m = np.maximum(steps[alarm] - prev, k)
        p0 = float(rates(float(self.intervals.view[alarm]), self.cfg, not self.learn_interval)[0])
        p = np.clip(k / m, p0, 1 - 1e-12)
        llr = k * np.log(p / p0) + (m - k) * np.log((1 - p) / (1 - p0))
        plausible = cand[llr >= llr.max() - self.cfg.change_point_slack]
        return int(cand[int(np.argmax(llr))]), int(plausible.min())

    def _absorb(self, ep: dict, a: int, b: int, scale: np.ndarray) -> None:
        """Count rows a..b-1 into the episode."""
        if b <= a:
            return
        skips = self.all_skips.view[a:b]
        hit = np.flatnonzero(skips > 0)
        if len(hit):
            ep["last_skip"] = a + int(hit[-1])
            ep["num_skipped"] += float(skips.sum())
        x = scale[a:b]
        if np.isfinite(x).any():
            k = int(np.nanargmin(np.where(np.isfinite(x), x, np.nan)))
            if x[k] < ep["min"]:
                ep["min"], ep["min_i"] = float(x[k]), a + k

    def findings(self, obs: Observations) -> list[Finding]:
        steps = obs["step"]
        items = [(ep, ep.get("regrown", True)) for ep in self.closed + self.chain_closed]
        items += [(ep, None) for ep in (self.episode, self.chain) if ep is not None and self._counts(ep)]
        items = [(ep, rec) for ep, rec in items if self._counts(ep)]
        items.sort(key=lambda it: it[0]["first"])
        # One that ended without regrowing and regrew later, before the next incident, recovered late: a late
        # recovery is a recovery (the scaler regrows a doubling per growth interval, the run went on healthy).
        for k, (ep, rec) in enumerate(items):
            if rec is False:
                upto = next((it[0]["first"] for it in items[k + 1:] if it[0]["first"] > ep["end"]), len(steps))
                if self._regrown_at(obs["loss_scale"], self._target(ep, steps, obs["loss_scale"]), ep["end"] + 1,
                                    upto) is not None:
                    items[k] = (ep, True)
        merged: list[tuple[dict, bool | None]] = []
        for ep, rec in items:  # one incident, one finding: a skip burst and its halving chain overlap
            if merged and ep["first"] <= merged[-1][0].get("end", len(steps) - 1) + 1:
                prev, prev_rec = merged.pop()
                both = {**prev, "first": min(prev["first"], ep["first"]),
                        "first_lo": min(prev["first_lo"], ep["first_lo"]),
                        "last_skip": max(prev["last_skip"], ep["last_skip"]),
                        "num_skipped": max(prev["num_skipped"], ep["num_skipped"])}
                if ep["min"] < prev["min"]:
                    both["min"], both["min_i"] = ep["min"], ep["min_i"]
                if "end" in prev or "end" in ep:
                    both["end"] = max(prev.get("end", -1), ep.get("end", -1))
                if rec is None or prev_rec is None:
                    both.pop("end", None)
                merged.append((both, None if None in (rec, prev_rec) else rec and prev_rec))
            else:
                merged.append((ep, rec))
        out = [self._classify(ep, rec, obs) for ep, rec in merged]
        return out

    def _regrown_at(self, scale: np.ndarray, target: float, lo: int, hi: int) -> int | None:
        """The first row in lo..hi-1 where the scale is back within 2^``recovered_within`` of ``target``, or None."""
        if not math.isfinite(target):
            return None
        with np.errstate(invalid="ignore"):
            back = np.flatnonzero(scale[lo:hi] >= target / 2.0 ** self.cfg.recovered_within)
        return lo + int(back[0]) if len(back) else None

    def _counts(self, ep: dict) -> bool:
        """A skip burst always counts; a halving chain once it fell under the floor, or 2^min_halvings (outside
        calibration) faster than the healthy rate explains (its alarm). A chain that began under the floor did not
        fall under it: it is an ordinary backoff in the tail of the collapse that took the scale there (fresh seed
        694513's run 089: one overflow at 0.25 while the scaler regrew from 0.03, read as a collapse of its own,
        which ended the first one's search for its late recovery; test 97)."""
        if "calibration" not in ep:
            return True
        return (ep["min"] < self.cfg.floor and not ep["before"] < self.cfg.floor) or "alarm" in ep

    def _classify(self, ep: dict, recovered: bool | None, obs: Observations) -> Finding:
        steps, cfg, n = obs["step"], self.cfg, len(obs["step"])
        low, before = ep["min"], ep["before"]
        below = low < cfg.floor
        end = ep.get("end", n - 1)
        still_skipping = recovered is None and ep["last_skip"] >= n - 2
        if recovered is None and (below or still_skipping or int(steps[n - 1]) - int(steps[ep["last_skip"]]) > cfg.patience_steps):
            recovered = False
        # A scale still deeper than a healthy sawtooth below where it was is a run training at degraded precision
        # now: act, unlike a young loss excursion, it cannot come back within a few steps (regrowth takes growth
        # intervals).
        needs = recovered is not True
        halvings = math.log2(before / low) if math.isfinite(low) and math.isfinite(before) and 0 < low < before else 0.0
        evidence = {"scale_before": before if math.isfinite(before) else None,
                    "scale_min": low if math.isfinite(low) else None, "halvings": halvings,
                    "num_skipped": int(ep["num_skipped"]), "below_floor": below, "floor": cfg.floor,
                    "still_skipping": still_skipping, "detected_step": int(steps[min(ep["first"], n - 1)]),
                    "earliest_onset_step": int(steps[ep["first_lo"]])}
        # Back within 2^recovered_within of its target: when, counted from the onset (a late recovery is a
        # recovery, and its time is part of the story: hundreds of steps at a 16x lower scale is not "at once").
        target = self._target(ep, steps, obs["loss_scale"])
        regrown = self._regrown_at(obs["loss_scale"], target, ep["min_i"], n) if recovered is True else None
        evidence["recovery_steps"] = recovery_steps(steps, ep["first"], regrown)
        state = {True: "the scaler is back to normal", False: "it did not recover", None: "not recovered yet"}[recovered]
        if regrown is not None and regrown > ep["last_skip"] + 1:
            state += (f" (regrown to {float(obs['loss_scale'][regrown]):g} by step {int(steps[regrown])}, "
                      f"{evidence['recovery_steps']} steps after the onset)")
        scales = f"{before:g} -> {low:g}, " if math.isfinite(low) and math.isfinite(before) else ""
        pinned = "every step skipped at the minimum scale, " if still_skipping and halvings < 1 else ""
        message = (f"loss scale collapsed from step {int(steps[ep['first']])}: {scales}{pinned}"
                   f"{int(ep['num_skipped'])} steps skipped{', below the floor of 1' if below else ''}; {state}")
        return Finding(kind="scaler_collapse", onset_step=int(steps[ep["first"]]),
                       end_step=int(steps[min(end, n - 1)]), peak_step=int(steps[min(ep["min_i"], n - 1)]),
                       segment=self.ctx.segment, severity="critical" if needs else "warning",
                       self_recovered=recovered, needs_action=needs, evidence=evidence, message=message)


def _pieces(values: np.ndarray, start: int):
    """``values[start:]`` in pieces of ``ROWS_AT_ONCE``."""
    for a in range(start, len(values), ROWS_AT_ONCE):
        yield values[a:a + ROWS_AT_ONCE]


def _first(masks) -> int | None:
    """Index of the first True across consecutive boolean pieces, or None."""
    offset = 0
    for mask in masks:
        hit = np.flatnonzero(mask)
        if len(hit):
            return offset + int(hit[0])
        offset += len(mask)
    return None


def _probe(scale: np.ndarray, row: int) -> bool:
    """Whether ``row`` logged a scale above the last one logged before it: the scaler had just grown, and an
    overflow there is its sawtooth probing the next doubling (GradScaler backs off at the first overflow after
    each growth), not the first skip of a collapse that follows (fresh seed 448775's run 027: 131072 -> 262144
    at 2202, flagged, then a burst from 2214)."""
    earlier = scale[:row][np.isfinite(scale[:row])]
    return bool(len(earlier)) and bool(scale[row] > earlier[-1])


def _last_at_or_below_zero(sums: np.ndarray, end: int) -> int | None:
    """Index of the last sum <= 0 before ``end`` (None without one), read backwards in pieces: a CUSUM rests at 0
    most of the time, so it is usually in the first."""
    for b in range(end, 0, -ROWS_AT_ONCE):
        a = max(b - ROWS_AT_ONCE, 0)
        hit = np.flatnonzero(sums[a:b] <= 0.0)
        if len(hit):
            return a + int(hit[-1])
    return None


def _last_finite(values: np.ndarray, end: int) -> float:
    """The last finite value before index ``end`` (NaN without one), read backwards in pieces."""
    for b in range(end, 0, -ROWS_AT_ONCE):
        part = values[max(b - ROWS_AT_ONCE, 0):b]
        ok = np.flatnonzero(np.isfinite(part))
        if len(ok):
            return float(part[ok[-1]])
    return math.nan


def _median(values: np.ndarray) -> float:
    """``np.median`` of the logged scales before a chain's halvings (finite, a handful per growth interval) without
    its per-call overhead, ~1000 calls on a 1M-step fp16 run: the same middle values, averaged as it averages."""
    if len(values) > 64:
        return float(np.median(values))
    ordered, m = sorted(values.tolist()), len(values)
    return ordered[m // 2] if m % 2 else (ordered[m // 2 - 1] + ordered[m // 2]) / 2


def rates(interval: np.ndarray | float, cfg: ScalerConfig, known: bool) -> tuple[np.ndarray, np.ndarray]:
    """The Bernoulli CUSUM's two skip rates for a scaler with growth interval ``interval``: healthy p0 and
    collapse p1. A scaler at its ceiling overflows once per growth interval and holds its scale there (a doubling
    per ``interval`` clean steps, a halving per skip): p0 = 1 / (interval + 1), and p1 = ``collapse_ratio`` p0,
    or ``skip_rate`` where that is more. That holds for an interval the run's metadata states (``known``); one
    learned from the sawtooth is the shortest regrowth seen so far, a lower bound on the real one, so its p0
    stays capped at ``skip_rate`` / 2 against ``skip_rate``. An interval under 2 is judged as 2 (p1 under 1)."""
    iv = np.maximum(np.asarray(interval, dtype=np.float64), 2.0)
    if not known:
        return np.minimum(1.0 / iv, cfg.skip_rate / 2), np.full(iv.shape, cfg.skip_rate)
    p0 = 1.0 / (iv + 1.0)
    return p0, np.minimum(np.maximum(cfg.skip_rate, cfg.collapse_ratio * p0), 1.0 - 1e-9)


def poisson_tail(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam), summed in log space (k up to the hundreds of skips a collapse can infer)."""
    if k <= 0:
        return 1.0
    if lam <= 0:
        return 0.0
    terms = [j * math.log(lam) - lam - math.lgamma(j + 1) for j in range(k)]
    return max(0.0, 1.0 - math.fsum(math.exp(t) for t in terms))


def burst_over(skipped: np.ndarray | float, first_step: int, last_skip_step: np.ndarray | int,
               now_step: np.ndarray | int, risk: float) -> np.ndarray | bool:
    """Whether a burst of ``skipped`` skips between steps ``first_step`` and ``last_skip_step`` is over at
    ``now_step``: the clean steps since its last skip would come with probability under ``risk`` at its own skip
    rate (skips over the steps it spans), (1 - rate)^m < risk."""
    span = np.maximum(np.asarray(last_skip_step) - first_step + 1, np.maximum(skipped, 1.0))
    rate = np.clip(np.asarray(skipped, dtype=np.float64) / span, 0.0, 1.0)
    clean = np.asarray(now_step) - np.asarray(last_skip_step)
    with np.errstate(divide="ignore", invalid="ignore"):  # rate 1: any clean step ends it (0 * -inf is no step)
        over = (clean >= 1) & (clean * np.log1p(-rate) < math.log(risk))
    return over if over.ndim else bool(over)


def detect_scaler_collapse(steps: np.ndarray, scale: np.ndarray, segment: int = 0,
                           found_inf: np.ndarray | None = None, config: object | None = None,
                           meta: dict | None = None) -> list[Finding]:
    """Offline: every loss-scale collapse in one segment's loss-scale observations."""
    from runwatch.detectors.config import DEFAULT

    steps = np.asarray(steps, dtype=np.int64)
    obs = {"step": steps, "loss_scale": np.asarray(scale, dtype=np.float64),
           "found_inf": np.zeros(len(steps), bool) if found_inf is None else np.asarray(found_inf, bool),
           "found_inf_present": np.zeros(len(steps), bool) if found_inf is None else np.ones(len(steps), bool)}
    scanner = ScalerScanner(ScanContext(segment=segment, config=config or DEFAULT, meta=meta or {}))
    scanner.advance(obs)
    return scanner.findings(obs)
