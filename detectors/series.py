"""Series helpers shared by the detectors: robust block statistics and a trailing baseline.

Every detector judges an observation against a robust baseline built only from
*completed* blocks of earlier observations (median of block medians, scale from
block MADs). Because the baseline for observation i depends only on blocks
before i's block, the same code gives bit-identical numbers whether it runs
once over a whole run (offline, vectorised) or block by block on a live stream.
Observations, not steps: a run logged every 100 steps has one observation per
100 steps, so nothing here assumes a step spacing.
"""

from __future__ import annotations

import numpy as np

BLOCK = 16
"""Observations per block: large enough for a stable median, small enough to follow the trend."""
NUM_BLOCKS = 4
"""Trailing blocks in a baseline (64 observations)."""
MIN_BLOCKS = 2
"""Blocks needed before anything is judged: the first 32 observations of a segment are warm-up."""
MAD_TO_SIGMA = 1.4826


def row_median(values: np.ndarray, min_finite: int | None = None) -> np.ndarray:
    """Median of the finite values of each row of a 2-D array; NaN for a row with fewer than
    ``min_finite`` finite values (default: half the row).

    Written out (sort, pick) rather than ``np.nanmedian`` so that one row and
    many rows give bit-identical answers (streaming must equal offline).
    """
    values = np.where(np.isfinite(values), values, np.nan)
    ordered = np.sort(values, axis=1)  # NaN sorts last
    num_finite = np.isfinite(ordered).sum(axis=1)
    lo = np.clip((num_finite - 1) // 2, 0, values.shape[1] - 1)
    hi = np.clip(num_finite // 2, 0, values.shape[1] - 1)
    rows = np.arange(values.shape[0])
    med = (ordered[rows, lo] + ordered[rows, hi]) * 0.5
    need = (values.shape[1] + 1) // 2 if min_finite is None else min_finite
    return np.where(num_finite >= max(need, 1), med, np.nan)


def block_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of each row (a block of observations)."""
    med = row_median(values)
    mad = row_median(np.abs(values - med[:, None]))
    return med, mad


class Grow:
    """A float64 array that grows by doubling: amortized O(1) append for streams."""

    def __init__(self, dtype: type = np.float64, capacity: int = 256) -> None:
        self._data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.size + len(values)
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size:need] = values
        self.size = need

    def append(self, value: float) -> None:
        if self.size == len(self._data):
            grown = np.empty(2 * len(self._data), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size] = value
        self.size += 1

    @property
    def view(self) -> np.ndarray:
        return self._data[: self.size]


class TrailingBaseline:
    """Per-block baseline and scale from the ``NUM_BLOCKS`` completed blocks before it.

    ``base(b)`` is the lower of the median of the trailing block medians and the
    last block's median: the median resists a spike inside one block, the last
    block follows a falling loss without lagging a whole window behind.
    With ``follow_last=False`` (step times: no trend to follow, tiny blocks
    whose medians are noisy) it is the plain median of the block medians.
    ``scale(b)`` is the median trailing MAD as a sigma, floored so a constant
    series does not make every rounding error an infinite z-score.
    """

    def __init__(self, rel_floor: float, abs_floor: float, block: int = BLOCK, num_blocks: int = NUM_BLOCKS,
                 follow_last: bool = True) -> None:
        self.rel_floor, self.abs_floor, self.block = rel_floor, abs_floor, block
        self.window, self.follow_last = num_blocks, follow_last
        self.med, self.mad = Grow(), Grow()
        self.base_of, self.scale_of = Grow(), Grow()
        self.base_of.append(np.nan)  # block 0 has no history
        self.scale_of.append(np.nan)

    @property
    def num_blocks(self) -> int:
        return self.med.size

    def update(self, values: np.ndarray) -> None:
        """Absorb every block of ``values`` (the whole series so far) completed since the last call."""
        block = self.block
        done, ready = self.med.size, len(values) // block
        if ready <= done:
            return
        med, mad = block_stats(values[done * block: ready * block].reshape(-1, block))
        self.med.extend(med)
        self.mad.extend(mad)
        # Baselines for blocks done+1 .. ready (each uses the blocks before it).
        all_med, all_mad = self.med.view, self.mad.view
        k = self.window
        first = max(done + 1 - k, 0)
        pad = np.full(k - 1, np.nan)
        med_w = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, all_med[first:ready]]), k)
        mad_w = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, all_mad[first:ready]]), k)
        # Row r of med_w ends at block first + r; we want windows ending at done .. ready-1.
        med_w, mad_w = med_w[done - first:], mad_w[done - first:]
        enough = np.isfinite(med_w).sum(axis=1) >= MIN_BLOCKS
        centre = row_median(med_w, MIN_BLOCKS)
        last = med_w[:, -1]
        base = np.where(np.isfinite(last), np.fmin(centre, last), centre) if self.follow_last else centre
        spread = MAD_TO_SIGMA * row_median(mad_w, 1)
        floor = self.rel_floor * np.abs(base) + self.abs_floor
        scale = np.fmax(np.where(np.isfinite(spread), spread, floor), floor)
        self.base_of.extend(np.where(enough, base, np.nan))
        self.scale_of.extend(np.where(enough, scale, np.nan))

    def at(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Baseline and scale for observations lo..hi-1 (their blocks must have a baseline)."""
        blocks = np.arange(lo, hi) // self.block
        return self.base_of.view[blocks], self.scale_of.view[blocks]


def safe_log(values: np.ndarray) -> np.ndarray:
    """log of the positive finite values; NaN elsewhere (a zero or NaN grad norm is not a ratio)."""
    out = np.full(len(values), np.nan)
    ok = np.isfinite(values) & (values > 0)
    out[ok] = np.log(values[ok])
    return out
