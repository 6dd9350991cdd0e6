"""The statistical core every detector stands on: robust residuals, two control charts, an extreme-value
tail, and one episode lifecycle.

- ``BlockBaseline``: a signal's robust trailing level and scale (median of block medians, 1.4826 x MAD),
  computed per block of observations from completed blocks only, so a baseline never sees the observation
  it judges and streaming is bit-identical to offline. Blocks that overlapped an episode are kept out of
  later baselines (River's "protect the detector"); the baseline of an open episode is frozen at its onset.
  It also keeps the maxima of the clean blocks, from which ``tail_threshold`` reads the run's own
  extreme-value tail (block maxima, Gumbel by moments).
- ``cusum``: the one-sided CUSUM S_t = max(0, S_{t-1} + r_t - k), vectorised (the Lindley recursion
  closed form), with its change-point estimate (the last t with S_t = 0).
- ``first_run``: where m consecutive observations first satisfy a test (the "back in band" rule).
- ``Episode``: what every detector opens at an onset, follows, and closes.

Residual r_t = (x_t - level_t) / scale_t; the Shewhart rule reads r_t > k, the CUSUM reads the sum of
r_t - k. See ../shared/DETECTION.md for the background.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MAD_TO_SIGMA = 1.4826
"""The MAD of a normal sample is 0.6745 sigma."""
EULER_GAMMA = 0.5772156649


def row_median(values: np.ndarray, min_finite: int | None = None) -> np.ndarray:
    """Median of the finite values of each row of a 2-D array; NaN for a row with fewer than
    ``min_finite`` finite values (default: half the row).

    Written out (sort, pick) rather than ``np.nanmedian`` so that one row and
    many rows give bit-identical answers (streaming must equal offline): the
    two middle order statistics are the same values however they are found.
    """
    return _row_median(values, min_finite)[0]


PARTITION_FROM = 4096
"""Row width from which the two middle values are selected (np.partition, ~3x faster than a sort at 15,625)."""
SORT_ONCE_FROM = 1 << 16
"""Values from which ``row_median_and_mad`` reads the deviations off the sorted rows instead of sorting twice..."""
WIDE_ROW = 512
"""...in rows at least this wide (numpy sorts rows of up to 256 float64 with a sorting network, ~2.5 ns a value
on this machine, wider ones at ~12 ns: bench/detector_speed.py)."""


def row_median_and_mad(values: np.ndarray, min_finite: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(row_median(values, m), row_median(abs(values - median), m))`` with one sort of the rows, not two: the
    deviations' middle order statistics are read off the sorted row, where they form two sorted runs (below
    the median and above it). The same values as the two calls (fl(c - x) is -fl(x - c)), so exact."""
    # Few rows (a streaming update) or narrow ones, which sort ~5x faster per value than wide rows: a second
    # sort beats the search's loop.
    sort_once = values.size >= SORT_ONCE_FROM and values.shape[1] >= WIDE_ROW
    med, ordered, whole = _row_median(values, min_finite, keep_sorted=sort_once)
    if ordered is None:  # not sorted (selected, too few values, or not worth it): the second call
        return med, row_median(np.abs(values - med[:, None]), min_finite)
    mad = np.full(len(med), np.nan)
    if whole.any():
        mad[whole] = _middle_deviation(ordered[whole], med[whole])
    if not whole.all():
        rest = ~whole
        mad[rest] = row_median(np.abs(values[rest] - med[rest][:, None]), min_finite)
    return med, mad


def _middle_deviation(ordered: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Median of |x - centre| of each sorted, all-finite row: the two middle order statistics of the union of
    the runs ``centre - x`` below the centre (read leftwards) and ``x - centre`` from it, each found by a
    binary search on how many of the smallest come from the left run (the k-th of two sorted arrays). Both
    searches run as one over the rows stacked twice (each row's steps are its own), reading the rows flat."""
    rows, width = ordered.shape
    flat = ordered.ravel()
    split = (ordered < centre[:, None]).sum(axis=1)  # the left run's length
    k = np.repeat(np.array([(width - 1) // 2, width // 2]), rows)  # the order statistic each stacked row asks for
    base, split, centre = np.tile(np.arange(rows) * width, 2), np.tile(split, 2), np.tile(centre, 2)
    n_right = width - split

    def at(i: np.ndarray) -> np.ndarray:  # column i of each row, i clipped into the row (np.clip costs ~50 us)
        return flat[base + np.minimum(np.maximum(i, 0), width - 1)]

    def left(j: np.ndarray) -> np.ndarray:  # j-th smallest deviation below the centre (j < split)
        return centre - at(split - 1 - j)

    def right(j: np.ndarray) -> np.ndarray:  # j-th smallest deviation from the centre up (j < n_right)
        return at(split + j) - centre

    lo, hi = np.maximum(0, k + 1 - n_right), np.minimum(k + 1, split)
    while np.any(lo < hi):  # the number a of the k + 1 smallest that lie left of the centre
        mid = (lo + hi) // 2
        more = (lo < hi) & (left(mid) < right(k - mid))
        lo, hi = np.where(more, mid + 1, lo), np.where(more | (lo >= hi), hi, mid)
    a = lo
    kth = np.maximum(np.where(a > 0, left(a - 1), -np.inf), np.where(k - a >= 0, right(k - a), -np.inf))
    return (kth[:rows] + kth[rows:]) * 0.5


def _row_median(values: np.ndarray, min_finite: int | None = None,
                keep_sorted: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(medians, the sorted rows when sorted and asked for, which rows are all finite)."""
    width = values.shape[1]
    need = max((width + 1) // 2 if min_finite is None else min_finite, 1)
    ordered = None
    if width == 0:
        return np.full(values.shape[0], np.nan), None, np.zeros(values.shape[0], bool)
    # Rows all finite (nearly every row) take the fast path; which rows are is read off its own work (a NaN or
    # an infinity makes a sum non-finite and sorts to an end of its row), not from a pass of isfinite.
    with np.errstate(invalid="ignore", over="ignore"):  # rows with inf or NaN are redone below
        if width == 4:  # the commonest rows (blocks of 4): the middle two by a min/max network
            a, b, c, d = (values[:, j] for j in range(4))
            whole = np.isfinite(a + b + c + d)  # an overflowing sum only sends a finite row the slow way
            inner_lo = np.maximum(np.minimum(a, b), np.minimum(c, d))
            inner_hi = np.minimum(np.maximum(a, b), np.maximum(c, d))
            med = (np.minimum(inner_lo, inner_hi) + np.maximum(inner_lo, inner_hi)) * 0.5
        elif width >= PARTITION_FROM:  # a long row (one whole series in blocks): selection, not a sort
            mid = np.partition(values, [(width - 1) // 2, width // 2], axis=1)
            whole = np.isfinite(values.sum(axis=1))
            med = (mid[:, (width - 1) // 2] + mid[:, width // 2]) * 0.5
        else:  # the two middle columns of the sorted rows (a SIMD row sort beats partition here; NaN sorts last)
            ordered = np.sort(values, axis=1)
            whole = np.isfinite(ordered[:, 0]) & np.isfinite(ordered[:, -1])
            med = (ordered[:, (width - 1) // 2] + ordered[:, width // 2]) * 0.5
    out = np.where(whole, med, np.nan) if width >= need else np.full(values.shape[0], np.nan)
    if not whole.all():
        rest = values[~whole]
        out[~whole] = _row_median_sorted(rest, np.isfinite(rest), need)
    return out, (ordered if keep_sorted and width >= need else None), whole & (width >= need)


def _sorted_row_median(values: np.ndarray) -> np.ndarray:
    """``row_median(values)`` of rows that are usually already in order (a block's coordinates: log steps, which
    only grow): read off the middle columns when every value is finite and in order throughout (a row's sort is
    then the row itself), else sorted as ``row_median`` sorts."""
    flat = values.reshape(-1)
    width = values.shape[1]
    if width and len(flat) and np.isfinite(flat[0]) and np.isfinite(flat[-1]) and bool(np.all(flat[1:] >= flat[:-1])):
        return (values[:, (width - 1) // 2] + values[:, width // 2]) * 0.5
    return row_median(values)


def _row_median_sorted(values: np.ndarray, finite: np.ndarray, need: int) -> np.ndarray:
    """``row_median`` of rows with non-finite values: sort (NaN last) and pick within the finite ones."""
    values = np.where(finite, values, np.nan)
    ordered = np.sort(values, axis=1)  # NaN sorts last
    num_finite = finite.sum(axis=1)
    lo = np.clip((num_finite - 1) // 2, 0, values.shape[1] - 1)
    hi = np.clip(num_finite // 2, 0, values.shape[1] - 1)
    rows = np.arange(values.shape[0])
    med = (ordered[rows, lo] + ordered[rows, hi]) * 0.5
    return np.where(num_finite >= need, med, np.nan)


MAD_SMALL_SAMPLE = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}
"""Croux & Rousseeuw (1992): the MAD of n normal values is biased low for small n; multiply by b_n
(n / (n - 0.8) beyond 9). A block of 4 step times would otherwise understate sigma by a quarter."""


def two_level_sse(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Least-squares error of ``x`` fitted by two constant levels split before each index of ``k`` (1 <= k < len(x)):
    one jump, scored in O(1) per split from running sums."""
    s, sq = np.cumsum(x), np.cumsum(x * x)
    left = s[k - 1]
    return sq[-1] - left ** 2 / k - (s[-1] - left) ** 2 / (len(x) - k)


def mad_consistency(n: int) -> float:
    return MAD_SMALL_SAMPLE.get(n, n / (n - 0.8)) if n > 1 else 1.0


def block_stats(values: np.ndarray, detrend: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of each row (a block of observations).

    With ``detrend`` the MAD is that of the first differences over sqrt(2): the
    same sigma for white noise, but blind to a trend inside the block (early
    training, where the loss falls a lot within one block of a coarse log, would
    otherwise pass for noise).
    """
    med = row_median(values)
    if detrend:
        d = np.diff(values, axis=1)
        d_med = row_median(d)
        return med, row_median(np.abs(d - d_med[:, None])) * mad_consistency(d.shape[1]) / np.sqrt(2.0)
    mad = row_median(np.abs(values - med[:, None]))
    return med, mad * mad_consistency(values.shape[1])


_BIG = float(np.finfo(np.float64).max)


def nan_low(values: np.ndarray) -> np.ndarray:
    """``np.nan_to_num(values, nan=-np.inf)`` in three passes instead of its nine: NaN becomes -inf, +-inf the
    largest finite value of its sign, the rest stays as it is."""
    out = np.minimum(np.maximum(values, -_BIG), _BIG)  # NaN stays NaN through both
    np.copyto(out, -np.inf, where=np.isnan(values))
    return out


def safe_log(values: np.ndarray) -> np.ndarray:
    """log of the positive finite values; NaN elsewhere (a zero or NaN grad norm is not a ratio). In pieces of
    UPDATE_VALUES, the usual all-positive piece without a gather: numpy's log gives a value the same bits
    wherever it sits in the array (its SIMD lanes are alike; checked here for log, log1p, log2 and exp)."""
    out = np.full(len(values), np.nan)
    for a in range(0, len(values), UPDATE_VALUES):
        part = values[a:a + UPDATE_VALUES]
        ok = np.isfinite(part) & (part > 0)
        if ok.all():
            np.log(part, out=out[a:a + len(part)])
        else:
            out[a:a + len(part)][ok] = np.log(part[ok])
    return out


TREND_BLOCKS = 16
"""Blocks a trend's slope is measured over (Tukey's two halves of 8): a dip of a block or two does not tilt it."""
TAIL_QUANTUM = 1024
"""Block maxima enter the tail sums as integers in units of 1/1024 sigma (capped at +-1000 sigma): integer
sums are exact whatever the order blocks are added and removed in, so streaming equals offline bit for bit."""


def _quantize(values: np.ndarray) -> np.ndarray:
    return np.round(np.clip(values, -1000.0, 1000.0) * TAIL_QUANTUM).astype(np.int64)


def _distinct_sorted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of a non-decreasing array, without its sort."""
    if not len(values):
        return values, np.zeros(0, dtype=np.int64)
    new = np.empty(len(values), dtype=bool)
    new[0] = True
    np.not_equal(values[1:], values[:-1], out=new[1:])
    return values[new], np.cumsum(new) - 1


class Grow:
    """A growing 1-D array with amortized O(1) appends: the buffers of incremental detectors."""

    def __init__(self, dtype: type = np.float64, capacity: int = 256) -> None:
        self._data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray, share: bool = False) -> None:
        """Append ``values``. With ``share`` an empty buffer takes a long array of its dtype as it is, read-only,
        instead of a copy (a segment's columns read whole: 1M rows a column); the next append copies it out, so
        nothing is ever written into it."""
        need = self.size + len(values)
        if share and self.size == 0 and need > len(self._data) and isinstance(values, np.ndarray) \
                and values.ndim == 1 and values.dtype == self._data.dtype:
            self._data = values.view()
            self._data.flags.writeable = False
            self.size = need
            return
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size:need] = values
        self.size = need

    def append(self, value: object) -> None:
        if self.size == len(self._data):
            grown = np.empty(2 * len(self._data), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size] = value
        self.size += 1

    def truncate(self, size: int) -> None:
        self.size = min(self.size, max(size, 0))

    @property
    def view(self) -> np.ndarray:
        return self._data[: self.size]


class BlockBaseline:
    """Robust trailing level and scale of one signal, per block, protected from episodes.

    ``level`` is the lower of the median of the trailing block medians and the
    last block's median (with ``follow_last``): the median resists a spike
    inside one block, the last block follows a falling loss without lagging a
    window behind. ``scale`` is 1.4826 x the median block MAD; ``total_scale``
    adds the between-block spread of the medians in quadrature (beyond what
    the noise of a median explains), so a run whose level wanders for tens of
    observations (data order, a shared host) has that wander in its normal
    variability; with ``wander`` that is the scale. With ``follow_rising_noise`` the scale is at least the
    last block's: noise that grows is followed at once, noise that falls at the window's pace (early in
    training a loss's batch-to-batch spread grows several-fold within a few blocks as the model leaves its
    near-uniform prediction; a scale two blocks behind would call that growth a string of 10-sigma spikes,
    while one quiet block must not make ordinary values outliers). Both are floored so a constant series
    does not make every rounding error an infinite z-score. With ``level_only`` only the level is kept (its
    scale is NaN): a fine-grained level beside a coarser noise model need not pay for a second one.
    """

    def __init__(self, *, block: int, window: int, min_blocks: int, rel_floor: float, abs_floor: float,
                 follow_last: bool = True, wander: bool = False, detrend: bool = False,
                 wander_window: int | None = None, follow_rising_noise: bool = False,
                 long_noise_floor: float = 0.5, level_only: bool = False) -> None:
        self.block, self.window, self.min_blocks = block, window, min_blocks
        self.level_only = level_only
        self.long_noise_floor = long_noise_floor
        self.follow_rising_noise = follow_rising_noise
        self.rel_floor, self.abs_floor = rel_floor, abs_floor
        self.follow_last, self.wander, self.detrend = follow_last, wander, detrend
        self.wander_window = max(wander_window or window, window)
        self.med, self.mad, self.tmid = Grow(), Grow(), Grow()
        self.excluded = Grow(np.bool_)
        self._level, self._scale = Grow(), Grow()  # cache: block j's baseline from the blocks before it
        self._total = Grow()  # the scale with the between-block wander added in quadrature
        self._max = Grow()  # per block: largest residual seen while scanning it outside an episode
        self._in_tail = Grow(np.bool_)
        self._centre, self._count = Grow(), Grow(np.int64)  # per block: sum and count of clipped residuals
        self._tail = [0, 0, 0]  # sum, sum of squares, count of the clean block maxima (fixed point: exact)

    @property
    def num_blocks(self) -> int:
        return self.med.size

    def update(self, values: np.ndarray, coords: np.ndarray | None = None) -> None:
        """Absorb every block of ``values`` (the whole series so far) completed since the last call."""
        done, ready = self.med.size, len(values) // self.block
        if ready <= done:
            return
        # In pieces of UPDATE_VALUES observations: each block's statistics are its own, and a long segment's
        # sorted copies, differences and deviations then stay in cache instead of fresh memory each.
        per = max(1, UPDATE_VALUES // self.block)
        for a in range(done, ready, per):
            b = min(ready, a + per)
            chunk = values[a * self.block: b * self.block].reshape(-1, self.block)
            med, mad = (row_median(chunk), np.full(b - a, np.nan)) if self.level_only \
                else block_stats(chunk, self.detrend)
            self.med.extend(med)
            self.mad.extend(mad)
            if coords is not None:
                self.tmid.extend(_sorted_row_median(coords[a * self.block: b * self.block].reshape(-1, self.block)))
        self.excluded.extend(np.zeros(ready - done, dtype=bool))

    def _ensure(self, last_block: int) -> None:
        """Compute the cached baseline of blocks ``cached .. last_block`` from the current exclusions."""
        first = self._level.size
        if last_block < first:
            return
        js = np.arange(first, last_block + 1)
        stride = self.window // 16 if self.window > 32 else 0
        series = _ValidBlocks(self, first, min(self.med.size, last_block), stride)
        k = series.ranks(js)  # valid blocks before each j
        if stride:  # a long window moves slowly: evaluate it every window/16 blocks and hold it
            k = np.where(k < 2 * stride, k, k - k % stride)
            # Blocks with the same number of valid blocks before them share one window: compute each once.
            k, rows = _distinct_sorted(k)
        else:  # k rises by 0 or 1 from one block to the next: its distinct values are a range
            rows = k - k[0]
            k = np.arange(k[0], k[-1] + 1)
        # In pieces of rows (``ENSURE_VALUES``): every value is a function of its own row alone.
        per = max(1, ENSURE_VALUES // max(self.window, self.wander_window))
        parts = [self._baseline_rows(k[a:a + per], series) for a in range(0, len(k), per)]
        caches = (self._level,) if self.level_only else (self._level, self._scale, self._total)
        for cache, cols in zip(caches, zip(*parts)):  # a level-only baseline's scale stays NaN: nothing to keep
            values = cols[0] if len(cols) == 1 else np.concatenate(cols)
            cache.extend(values if len(rows) == len(values) else values[rows])  # one row per block: in order

    def _baseline_rows(self, k: np.ndarray, series: "_ValidBlocks") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(level, scale, total) from the valid blocks before each of ``k`` (NaN without ``min_blocks``)."""
        med_w, mad_w = series.windows(k, self.window)
        enough = series.finite_in(k, self.window) >= self.min_blocks
        # Over its own window the wander is the medians' spread about this centre: one sort gives both.
        own = not (self.level_only or self.detrend or self.wander_window > self.window)
        centre, about = row_median_and_mad(med_w, self.min_blocks) if own else (row_median(med_w, self.min_blocks), None)
        last = med_w[:, -1]
        level = np.where(np.isfinite(last), np.fmin(centre, last), centre) if self.follow_last else centre
        if self.level_only:  # its scale and total stay NaN (``_per_obs`` reads NaN past a cache's end)
            return np.where(enough, level, np.nan), None, None
        spread = MAD_TO_SIGMA * row_median(mad_w, 1)
        # The wander: how far the block medians stray from one another, beyond what the within-block noise
        # of a median of ``block`` observations explains (its standard error is ~1.25 sigma / sqrt(block)).
        between, noise_long = self._between(k, series, med_w, spread, about)
        if self.follow_rising_noise:
            spread = np.fmax(spread, MAD_TO_SIGMA * mad_w[:, -1])
        # The noise does not drop below half its long-run level in a window: a stretch of repeated values (a
        # log printed with few digits, a stalled counter) would otherwise make every normal value an outlier.
        spread = np.fmax(spread, self.long_noise_floor * noise_long)
        noise = np.where(np.isfinite(spread), spread, 0.0)
        excess = np.maximum(np.where(np.isfinite(between), between, 0.0) ** 2 - 1.57 * noise ** 2 / self.block, 0.0)
        total = np.sqrt(noise ** 2 + excess)
        floor = self.rel_floor * np.abs(level) + self.abs_floor
        scale = np.fmax(np.where(np.isfinite(spread), spread, floor), floor)
        total = np.fmax(total, scale)
        if self.wander:
            scale = total
        return np.where(enough, level, np.nan), np.where(enough, scale, np.nan), np.where(enough, total, np.nan)

    def _between(self, k: np.ndarray, series: "_ValidBlocks", med_w: np.ndarray, noise: np.ndarray,
                 about: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The wander (how far the block medians stray) and the long-run noise (median block MAD as a sigma), over
        the last ``wander_window`` valid blocks.

        With ``detrend`` from the differences of consecutive medians (blind to a
        smooth trend such as a falling loss, not to wander); otherwise from the
        medians' spread about their centre (slow wander too). A long window is
        evaluated at every ``wander_window // 16``-th block only and held between
        (it changes slowly, and this keeps it O(n)). Over the baseline's own window (``wander_window`` no longer
        than ``window``) the window's spread about its centre (``about``, without ``detrend``) and ``noise`` (the
        median block MAD as a sigma) are reused.
        """
        if self.wander_window <= self.window:
            anchors, rows = k, np.arange(len(k))
            med_long, noise_long, spread = med_w, noise, about
        else:
            stride = max(1, self.wander_window // 16)
            anchor = k - k % stride
            anchors, rows = _distinct_sorted(anchor)
            med_long, mad_long = series.windows(anchors, self.wander_window)
            noise_long = MAD_TO_SIGMA * row_median(mad_long, 1)
            spread = None if self.detrend else row_median_and_mad(med_long, self.min_blocks)[1]
        if self.detrend:
            spread = row_median_and_mad(np.diff(med_long, axis=1), 1)[1] / np.sqrt(2.0)
        if not len(anchors):
            return np.full(len(k), np.nan), np.full(len(k), np.nan)
        return (MAD_TO_SIGMA * spread)[rows], noise_long[rows]

    def _slopes(self, k: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slope per unit of the blocks' coordinates, coordinate span) of the last ``TREND_BLOCKS`` valid blocks
        before each row (all of them, from 4 on, early in a segment); NaN with fewer than 4."""
        slope, span = np.full(len(k), np.nan), np.zeros(len(k))
        if self.tmid.size < self.med.size or not len(valid):
            return slope, span
        coords = self.tmid.view
        w = TREND_BLOCKS
        idx = k[:, None] - w + np.arange(w)[None, :]
        full = (idx >= 0).all(axis=1)
        if full.any():
            pick = valid[np.clip(idx[full], 0, len(valid) - 1)]
            slope[full], span[full] = self._tukey(self.med.view[pick], coords[pick])
        for r in np.flatnonzero(~full & (k >= 4)):  # the first blocks of a segment: what there is
            pick = valid[:k[r]][None, :]
            slope[r:r + 1], span[r:r + 1] = self._tukey(self.med.view[pick], coords[pick])
        return slope, span

    @staticmethod
    def _tukey(m: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tukey's resistant slope of each row: (median of the later half - earlier half) over their coordinates."""
        half = m.shape[1] // 2
        dt = np.median(t[:, -half:], axis=1) - np.median(t[:, :half], axis=1)
        dm = np.median(m[:, -half:], axis=1) - np.median(m[:, :half], axis=1)
        good = (dt > 0) & np.isfinite(dm)
        return np.where(good, dm / np.where(dt > 0, dt, 1.0), np.nan), t[:, -1] - t[:, 0]

    def at(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Level and scale for observations lo..hi-1 (NaN where the segment is still warming up)."""
        return self.level_at(lo, hi), self.scale_at(lo, hi)

    def level_at(self, lo: int, hi: int) -> np.ndarray:
        """``at(lo, hi)[0]`` alone (a level-only baseline has no scale, a noise model's level goes unread)."""
        return self._cached_at(self._level, lo, hi)

    def scale_at(self, lo: int, hi: int) -> np.ndarray:
        """``at(lo, hi)[1]`` alone."""
        return self._cached_at(self._scale, lo, hi)

    def _cached_at(self, cache: Grow, lo: int, hi: int) -> np.ndarray:
        if hi <= lo:
            return np.empty(0)
        self._ensure_obs(lo, hi)
        return self._per_obs(cache, lo, hi, self.med.size + 1)

    def scale_of_blocks(self, first: int, last: int) -> np.ndarray:
        """``at(first * block, last * block)[1][::block]``: the scale of blocks first..last-1, one value a block."""
        if last <= first:
            return np.empty(0)
        self._ensure_obs(first * self.block, last * self.block)
        out = np.full(last - first, np.nan)
        have = min(last, self.med.size + 1, self._scale.size) - first
        if have > 0:
            out[:have] = self._scale.view[first:first + have]
        return out

    def _ensure_obs(self, lo: int, hi: int) -> None:
        # Only blocks whose predecessors are all complete have a baseline (a later call must not find a value
        # cached before its history was there: streaming would then differ from offline).
        first, last = lo // self.block, (hi - 1) // self.block
        if first > self.med.size or last < self._level.size:
            self._ensure(-1 if first > self.med.size else min(last, self.med.size))
            return
        # Computed ahead, up to AHEAD_OBS observations past the cache: a scanner that reads a few observations at
        # a time (after an episode) asks once, not each time. A block's baseline depends only on the complete
        # blocks before it and the exclusions, and an exclusion drops every later block's (``exclude``), so one
        # computed early is the one computed late.
        self._ensure(min(max(last, self._level.size + AHEAD_OBS // self.block), self.med.size))

    def total_scale(self, lo: int, hi: int) -> np.ndarray:
        """The scale with the between-block wander added in quadrature, for observations lo..hi-1 (after ``at``)."""
        return self._per_obs(self._total, lo, hi, self._total.size)

    def _per_obs(self, cache: Grow, lo: int, hi: int, limit: int) -> np.ndarray:
        """Observations lo..hi-1 of a per-block cache: their block's value for blocks under ``limit``, else NaN."""
        if hi <= lo:
            return np.empty(0)
        first, last = lo // self.block, (hi - 1) // self.block
        have = min(last + 1, limit, cache.size) - first
        if have == last + 1 - first:  # every block known: straight from the cache
            per_block = cache.view[first:last + 1]
        else:
            per_block = np.full(last + 1 - first, np.nan)
            if have > 0:
                per_block[:have] = cache.view[first:first + have]
        return np.repeat(per_block, self.block)[lo - first * self.block:hi - first * self.block]  # a new array

    def slope(self, i: int, decreasing: bool = True) -> tuple[float, float, float]:
        """(slope per unit coordinate, coordinate span, floor) of the trend at observation i's block.

        The slope of ``_slopes`` (clamped to <= 0 with ``decreasing``: a loss
        baseline never projects a rise), the span it was measured over (how far
        it may be carried forward), and the lowest of the last window's block
        medians (a projection never goes below where the run has actually been).
        """
        j = i // self.block
        nb = min(self.med.size, j)
        valid = np.flatnonzero(~self.excluded.view[:nb])
        if not len(valid):
            return 0.0, 0.0, -np.inf
        slope, span = self._slopes(np.array([len(valid)]), valid)
        floor = float(np.nanmin(self.med.view[valid[-self.window:]]))
        s = float(slope[0]) if np.isfinite(slope[0]) else 0.0
        return (min(s, 0.0) if decreasing else s), float(span[0]), floor

    def note_scanned(self, lo: int, z: np.ndarray) -> None:
        """Residuals ``z`` of observations lo.. were scanned outside any episode: keep each block's maximum,
        and once a block is complete and scanned, its maximum joins the tail (unless excluded)."""
        if not len(z):
            return
        first, last = lo // self.block, (lo + len(z) - 1) // self.block
        grow = last + 1 - self._max.size
        if grow > 0:
            self._max.extend(np.full(grow, np.nan))
            self._in_tail.extend(np.zeros(grow, dtype=bool))
            self._centre.extend(np.zeros(grow))
            self._count.extend(np.zeros(grow, dtype=np.int64))
        starts = np.arange(first * self.block, (last + 1) * self.block, self.block) - lo
        starts[0] = 0  # each block's first residual in z
        finite = np.isfinite(z)
        view = self._max.view
        if finite.all():  # the usual pass: no NaN to keep out of the maxima, the sums and the counts
            view[first:last + 1] = np.fmax(view[first:last + 1], np.maximum.reduceat(z, starts))
            self._centre.view[first:last + 1] += np.add.reduceat(np.clip(z, -3.0, 3.0), starts)
            self._count.view[first:last + 1] += np.diff(starts, append=len(z))
        else:
            seg_max = np.maximum.reduceat(np.where(finite, z, -np.inf), starts)
            view[first:last + 1] = np.fmax(view[first:last + 1], np.where(np.isfinite(seg_max), seg_max, np.nan))
            self._centre.view[first:last + 1] += np.add.reduceat(np.where(finite, np.clip(z, -3.0, 3.0), 0.0),
                                                                 starts)
            self._count.view[first:last + 1] += np.add.reduceat(finite.astype(np.int64), starts)
        stop = min((lo + len(z)) // self.block, last + 1)  # blocks from ``first`` to ``stop`` are fully scanned
        if stop <= first:
            return
        known = max(min(stop, self._level.size) - first, 0)  # of those, the blocks the baseline fitted
        has_level = np.zeros(stop - first, dtype=bool)
        has_level[:known] = np.isfinite(self._level.view[first:first + known])
        # Only blocks the baseline fitted (their clipped mean residual within one sigma of 0) inform the tail:
        # a level lagging a fast fall leaves whole blocks below it, which says nothing about the upper tail.
        centred = np.abs(self._centre.view[first:stop] / np.maximum(self._count.view[first:stop], 1)) <= 1.0
        ok = (~self._in_tail.view[first:stop] & ~self.excluded.view[first:stop] & np.isfinite(view[first:stop])
              & has_level & centred)
        q = _quantize(view[first:stop][ok])
        self._tail[0] += int(q.sum())
        self._tail[1] += int((q * q).sum())
        self._tail[2] += int(ok.sum())
        self._in_tail.view[first:stop][ok] = True

    def _add_tail(self, b: int, sign: int) -> None:
        q = int(_quantize(self._max.view[b:b + 1])[0])
        self._tail[0] += sign * q
        self._tail[1] += sign * q * q
        self._tail[2] += sign
        self._in_tail.view[b] = sign > 0

    def tail_threshold(self, risk: float, min_blocks: int) -> float:
        """The residual a single observation exceeds with probability ``risk``, from the run's own clean block
        maxima (a Gumbel law fitted by moments); NaN until ``min_blocks`` maxima exist."""
        total, squares, count = self._tail
        if count < min_blocks:
            return math.nan
        mean = total / count / TAIL_QUANTUM
        var = max(squares / count / TAIL_QUANTUM ** 2 - mean * mean, 0.0)
        beta = math.sqrt(6.0 * var) / math.pi
        loc = mean - EULER_GAMMA * beta
        p_block = -math.expm1(self.block * math.log1p(-risk))  # P(block max exceeds) = 1 - (1 - risk)^block
        return loc - beta * math.log(-math.log1p(-p_block))

    def exclude(self, lo: int, hi: int) -> None:
        """Keep observations lo..hi (an episode) out of every later baseline and out of the tail."""
        first, last = lo // self.block, hi // self.block
        while self.excluded.size <= last:
            self.excluded.append(False)
        view = self.excluded.view
        view[first:last + 1] = True
        for b in range(first, min(last + 1, self._in_tail.size)):
            if self._in_tail.view[b]:
                self._add_tail(b, -1)
        for cache in (self._level, self._scale, self._total):  # later blocks have a new history
            cache.truncate(first + 1)


UPDATE_VALUES = 1 << 20
"""Observations ``update`` turns into block statistics (and ``safe_log`` takes logs) at a time: a bound on their
temporaries for segments longer than the benchmark's 1M rows. Much smaller pieces cost more than they save when
the scanners run side by side: every numpy call hands the GIL over (2^14: analyze() on 2 threads 0.60-0.63 s
against 0.53 s whole, bench/detector_speed.py's run on this machine)."""
AHEAD_OBS = 1 << 15
"""Observations a baseline computes past what it is asked for (``_ensure_obs``): a spike scan after an episode
reads 1024, 2048, ... observations at a time."""
ENSURE_VALUES = 1 << 19
"""Window values (4 MiB of float64) a baseline computes at a time: the windows' copies, sorts and deviations of a
long segment read whole (250k windows of 16, 62k of 64: tens of MB each) are reused pieces that stay in cache
rather than fresh memory faulted in for each step."""


def _windows_view(values: np.ndarray, first: int, count: int, step: int, width: int) -> np.ndarray:
    """Rows first, first + step, ... (``count`` of them) of the sliding windows of ``width`` over the contiguous
    ``values``: a view, made directly (``sliding_window_view`` costs ~40 us a call, hundreds of calls a scan)."""
    size = values.itemsize
    return np.ndarray((count, width), dtype=values.dtype, buffer=values, offset=first * size,
                      strides=(step * size, size))


class _ValidBlocks:
    """The block medians and MADs a baseline may use (blocks not excluded), in order, from far enough back for
    every window ``_ensure`` asks of them: the window of rank ``k`` and width ``w`` holds the valid blocks of rank
    k - w .. k - 1, NaN for ranks before the first. Read from the valid blocks before ``first`` that the windows
    reach and those from it on alone, so a call costs what its new blocks cost, not the whole series."""

    def __init__(self, base: BlockBaseline, first: int, nb: int, stride: int) -> None:
        excluded = base.excluded.view
        reach = max(base.window, base.wander_window)
        # A window may start this many ranks before the first block's (a held anchor lies up to a stride back).
        need = reach + stride + max(1, base.wander_window // 16)
        end = min(first, nb)
        start = max(end - need, 0)
        while start > 0 and (end - start) - int(np.count_nonzero(excluded[start:end])) < need:
            start = max(end - 2 * (end - start), 0)
        kept = ~excluded[start:nb]
        self.valid = start + np.flatnonzero(kept)  # valid blocks from ``start`` on, under ``nb``
        self.before = start - int(np.count_nonzero(excluded[:start]))  # valid blocks before ``start``
        self._start, self._kept = start, kept
        pad = np.full(reach, np.nan)
        self.med = np.concatenate([pad, base.med.view[self.valid]])
        self.mad = None if base.level_only else np.concatenate([pad, base.mad.view[self.valid]])
        self.offset = reach - self.before  # rank r sits at index r + offset
        self._finite: np.ndarray | None = None

    def ranks(self, js: np.ndarray) -> np.ndarray:
        """The number of valid blocks before each block of ``js`` (consecutive, from ``first``): a running count
        of the valid blocks from ``start``, not a search for each."""
        at = np.minimum(js - self._start, len(self._kept))
        if len(self.valid) == len(self._kept):  # none excluded from ``start`` on
            return self.before + at
        return self.before + np.concatenate([[0], np.cumsum(self._kept)])[at]

    def windows(self, k: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(medians, MADs) of the ``width`` valid blocks before each rank of ``k`` (ascending): views where the
        ranks are evenly spaced."""
        starts = k + self.offset - width
        step = int(k[1] - k[0]) if len(k) > 1 else 1
        if len(k) and step > 0 and k[-1] - k[0] == step * (len(k) - 1) \
                and (len(k) < 3 or bool(np.all(np.diff(k) == step))):
            first, count = int(starts[0]), len(k)  # evenly spaced: a view of just those rows
        else:
            first, count, step = 0, len(self.med) - width + 1, 1  # every window, then the rows asked for
        med = _windows_view(self.med, first, count, step, width)
        mad = None if self.mad is None else _windows_view(self.mad, first, count, step, width)
        if first == 0 and step == 1 and count != len(k):
            return med[starts], (None if mad is None else mad[starts])
        return med, mad

    def finite_in(self, k: np.ndarray, width: int) -> np.ndarray:
        """How many of the medians in each window of ``windows(k, width)`` are finite (a running count)."""
        if self._finite is None:
            self._finite = np.concatenate([[0], np.cumsum(np.isfinite(self.med))])
        starts = k + self.offset - width
        return self._finite[starts + width] - self._finite[starts]


ROWS_AT_ONCE = 1 << 18
"""Rows a long stretch is read in per pass, by ``cusum`` and the stall and scaler scanners: a pass's temporaries
(2 MB) are reused, where a 1M-row segment read whole makes dozens of fresh arrays of its length (faulted in); every
row's value is the same either way (each row judged on its own; running sums, minima and maxima carried from pass
to pass). Much smaller passes cost more GIL hand-overs (one per numpy call) than they save beside the other
scanners."""


def cusum(inc: np.ndarray, s0: float, zero0: int, offset: int,
          with_zero: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """One-sided CUSUM over increments ``inc`` (r_t - k), starting from S = ``s0``.

    Returns S for each increment and the change-point estimate at each: the
    index (``offset``-based) of the last observation where S was 0, ``zero0``
    when it has not been 0 in this chunk. Closed form of the Lindley recursion
    S_t = max(0, S_{t-1} + inc_t): S_t = C_t - min(0, min_{j<=t} C_j) with C the
    running sum from ``s0``. Without ``with_zero`` only S (None for the change points).
    """
    if not len(inc):
        return np.empty(0), (np.empty(0, dtype=np.int64) if with_zero else None)
    if len(inc) <= ROWS_AT_ONCE:
        c = s0 + np.cumsum(inc)
        s = c - np.minimum.accumulate(np.minimum(c, 0.0))
        if not with_zero:
            return s, None
        at_zero = np.where(s <= 0.0, np.arange(offset, offset + len(inc)), -1)
        last_zero = np.maximum.accumulate(at_zero)
        return s, np.where(last_zero < 0, zero0, last_zero)
    # A long series in pieces, each carrying on the running sum, minimum and last zero of the one before: the
    # same sequential sums (a piece's first increment is added to the sum so far, as cumsum adds it), and exact
    # minima and maxima, with a piece's temporaries in cache instead of a dozen fresh arrays of the whole length.
    s, zero = np.empty(len(inc)), (np.empty(len(inc), dtype=np.int64) if with_zero else None)
    total, low, last = 0.0, 0.0, -1
    for a in range(0, len(inc), ROWS_AT_ONCE):
        part = inc[a:a + ROWS_AT_ONCE].copy()
        if a:
            part[0] = total + part[0]
        run = np.cumsum(part)
        total = float(run[-1])
        c = s0 + run
        floor = np.minimum.accumulate(np.minimum(c, 0.0))
        if a:
            np.minimum(floor, low, out=floor)
        low = float(floor[-1])
        part_s = np.subtract(c, floor, out=s[a:a + len(c)])
        if not with_zero:
            continue
        at_zero = np.where(part_s <= 0.0, np.arange(a, a + len(c)) + offset, -1)
        last_zero = np.maximum(np.maximum.accumulate(at_zero), last)
        last = int(last_zero[-1])
        zero[a:a + len(c)] = np.where(last_zero < 0, zero0, last_zero)
    return s, zero


class LastZeros:
    """``cusum``'s change points looked up at the few rows asked for instead of built for every row
    (``cusum(..., with_zero=False)``): at row j, ``offset`` plus the last index at or before j where S <= 0,
    looked for backwards (a CUSUM rests at 0 most of the time), else ``zero0``. Indexed like the array."""

    PIECE = 4096

    def __init__(self, s: np.ndarray, zero0: int, offset: int) -> None:
        self.s, self.zero0, self.offset = s, zero0, offset

    def __len__(self) -> int:
        return len(self.s)

    def __getitem__(self, j: int) -> int:
        end = int(j) % len(self.s) + 1
        for b in range(end, 0, -self.PIECE):
            a = max(b - self.PIECE, 0)
            hit = np.flatnonzero(self.s[a:b] <= 0.0)
            if len(hit):
                return self.offset + a + int(hit[-1])
        return self.zero0


def first_run(ok: np.ndarray, m: int, carry: int) -> tuple[int, int]:
    """Where ``m`` consecutive True values first complete, counting ``carry`` True values just before ``ok``.

    Returns (start, carry'): ``start`` is the index in ``ok`` of the run's first
    value (negative when the run began before ``ok``; ``len(ok)`` when no run
    completed) and carry' the number of True values ending ``ok`` (capped at m).
    """
    ext = np.concatenate([np.ones(min(carry, m), dtype=bool), ok])
    pre = min(carry, m)
    if len(ext) >= m:
        csum = np.concatenate([[0], np.cumsum(ext)])
        full = np.flatnonzero(csum[m:] - csum[:-m] == m)
        if len(full):
            return int(full[0]) - pre, 0
    falses = np.flatnonzero(~ext)
    tail = len(ext) - (int(falses[-1]) + 1) if len(falses) else len(ext)
    return len(ok), min(tail, m)


@dataclass
class Episode:
    """One excursion a detector opened: the shared lifecycle (open -> follow -> closed or still open).

    Indices are observation indices in the detector's own series. The baseline
    is frozen at the onset; ``recovered_at`` is the first observation of the
    in-band run that closed it (None while open).
    """

    onset: int
    """First observation of the excursion (not where the rule fired)."""
    trigger: int
    """Observation at which the rule fired."""
    rule: str
    """Which rule opened it (e.g. 'shewhart', 'cusum', 'chain', 'skip_rate')."""
    frozen: dict = field(default_factory=dict)
    """The baseline numbers frozen at the onset (level, scale, slope, ...)."""
    end: int = -1
    """Last observation still affected (while open: the last one seen)."""
    recovered_at: int | None = None
    """First observation of the in-band run that ended it; None while open."""
    carry: int = 0
    """In-band observations in a row at the end of the last call (the run may complete in the next)."""
    data: dict = field(default_factory=dict)
    """Detector-specific facts gathered while following."""

    @property
    def is_open(self) -> bool:
        return self.recovered_at is None

    def close(self, recovered_at: int) -> None:
        self.recovered_at = recovered_at
        self.end = recovered_at - 1
