"""Chart series from bucket envelopes: the points to draw, NaN markers, y ranges, step <-> x maps.

Pure numpy over the per-bucket tables of ``Store.downsample_columns``
(``data/downsample.py``), independent of the charting library, so what the
charts promise (no spike lost, the y range following the main line, an
abandoned branch's peak stated) is tested here directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


def envelope(ds: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """x, y through each bucket's min and max value, in x order.

    A bucket is about a pixel column of the chart (``state.NUM_BUCKETS``), so
    its min and max are what that column draws: a one-step spike is some
    bucket's max. The bucket's first and last value would add two points per
    pixel that land inside the same column (drawn line within a pixel of the
    same), doubling what the browser parses and strokes.
    Buckets whose values are all non-finite are skipped (they are drawn as
    markers by ``nonfinite_points``), so a NaN never bends the line.
    """
    if ds.num_rows == 0:
        return np.empty(0), np.empty(0)
    cols = {c: ds[c].to_numpy(zero_copy_only=False).astype(float) for c in ("x_min", "min", "x_max", "max")}
    xs = np.stack([cols["x_min"], cols["x_max"]], axis=1)
    ys = np.stack([cols["min"], cols["max"]], axis=1)
    keep = np.isfinite(ys).all(axis=1) & np.isfinite(xs).all(axis=1)
    xs, ys = xs[keep], ys[keep]
    order = np.argsort(xs, axis=1, kind="stable")
    xs, ys = np.take_along_axis(xs, order, axis=1).ravel(), np.take_along_axis(ys, order, axis=1).ravel()
    if xs.size == 0:  # every bucket non-finite (a segment of NaN steps): markers only
        return xs, ys
    # Drop repeated points (a bucket of one row yields the same point four times).
    same = np.r_[False, (np.diff(xs) == 0) & (np.diff(ys) == 0)]
    return xs[~same], ys[~same]


def nonfinite_points(ds: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Where a bucket held NaN or Inf: its x and how many such values."""
    if ds.num_rows == 0:
        return np.empty(0), np.empty(0, np.int64)
    counts = ds["num_nonfinite"].to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(counts > 0)
    return ds["x_first"].to_numpy(zero_copy_only=False).astype(float)[idx], counts[idx].astype(np.int64)


def main_part(ds: pa.Table) -> pa.Table:
    return ds.filter(ds["main"]) if ds.num_rows else ds


def branch_parts(ds: pa.Table) -> dict[int, pa.Table]:
    """Each segment's abandoned rows (segment -> buckets)."""
    if ds.num_rows == 0:
        return {}
    branch = ds.filter(np.logical_not(ds["main"].to_numpy(zero_copy_only=False)))
    segments = branch["segment"].to_numpy(zero_copy_only=False)
    return {int(s): branch.filter(segments == s) for s in np.unique(segments)}


def main_line(ds: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The main line's points: each segment's main part in x order, with a NaN between segments (a gap)."""
    main = main_part(ds)
    if main.num_rows == 0:
        return np.empty(0), np.empty(0)
    segments = main["segment"].to_numpy(zero_copy_only=False)
    parts = []
    for seg in np.unique(segments):
        xs, ys = envelope(main.filter(segments == seg))
        if xs.size:
            parts.append((xs, ys))
    parts.sort(key=lambda p: p[0][0])
    xs_all, ys_all = [], []
    for i, (xs, ys) in enumerate(parts):
        if i:
            xs_all.append(np.array([(xs_all[-1][-1] + xs[0]) / 2]))
            ys_all.append(np.array([np.nan]))
        xs_all += [xs]
        ys_all += [ys]
    return np.concatenate(xs_all), np.concatenate(ys_all)


def _finite_values(tables: Iterable[pa.Table], positive: bool) -> np.ndarray:
    values = [t[c].to_numpy(zero_copy_only=False).astype(float) for t in tables if t.num_rows for c in ("min", "max")]
    if not values:
        return np.empty(0)
    v = np.concatenate(values)
    v = v[np.isfinite(v)]
    return v[v > 0] if positive else v


def y_range(tables: Iterable[pa.Table], *, log: bool, pad: float = 0.06) -> tuple[float, float] | None:
    """The y range that shows every value of ``tables`` (the main line, validation points), padded.

    None when there is no finite value (positive, on a log axis): the chart
    then scales itself. A flat series gets a small band around its value.
    """
    v = _finite_values(tables, positive=log)
    if v.size == 0:
        return None
    lo, hi = float(v.min()), float(v.max())
    if log:
        span = math.log10(hi / lo) if hi > lo else 0.2
        f = 10 ** (pad * span)
        return lo / f, hi * f
    span = hi - lo if hi > lo else max(abs(hi) * 0.05, 1e-12)
    return lo - pad * span, hi + pad * span


@dataclass(frozen=True)
class OffScale:
    """An abandoned branch's extreme that the main line's y range leaves out (stated, not drawn)."""

    segment: int
    value: float
    x: float
    above: bool


def off_scale(branches: dict[int, pa.Table], y: tuple[float, float] | None) -> list[OffScale]:
    """Per abandoned segment, its highest value above the range (or lowest below it), if any."""
    if y is None:
        return []
    out = []
    for seg, ds in sorted(branches.items()):
        xs, ys = envelope(ds)
        if ys.size == 0:
            continue
        i_hi, i_lo = int(np.argmax(ys)), int(np.argmin(ys))
        if ys[i_hi] > y[1]:
            out.append(OffScale(seg, float(ys[i_hi]), float(xs[i_hi]), above=True))
        elif ys[i_lo] < y[0]:
            out.append(OffScale(seg, float(ys[i_lo]), float(xs[i_lo]), above=False))
    return out


def _interp(frm: np.ndarray, to: np.ndarray) -> Callable[[float], float]:
    """``frm`` -> ``to`` by linear interpolation over the pairs (the identity when there are none)."""
    order = np.argsort(frm)
    a, b = np.asarray(frm, float)[order], np.asarray(to, float)[order]
    if a.size == 0:
        return lambda v: float(v)
    return lambda v: float(np.interp(float(v), a, b))


def step_mapper(pairs_step: np.ndarray, pairs_x: np.ndarray) -> Callable[[float], float]:
    """A step -> x (tokens, time) function by interpolating the main line's (step, x) pairs."""
    return _interp(pairs_step, pairs_x)


def x_mapper(pairs_step: np.ndarray, pairs_x: np.ndarray) -> Callable[[float], float]:
    """The inverse: x (tokens, time) -> step on the main line (x grows with step there)."""
    return _interp(pairs_x, pairs_step)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Readable ticks for a log axis over [lo, hi]: 1-2-5 per decade when few decades, powers of ten when many.

    Every tick is labelled with its whole value (the axis never reads "2, 5, 1M, 2, 5").
    """
    if not (lo > 0 and hi > lo):
        return []
    decades = math.log10(hi / lo)
    mantissas = (1, 2, 5) if decades <= 3 else (1,)
    step = max(1, math.ceil(decades / 6)) if decades > 6 else 1
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1, step):
        ticks += [m * 10.0 ** e for m in mantissas if lo <= m * 10.0 ** e <= hi]
    if len(ticks) < 2:  # less than a decade between two 1-2-5 values: a finer 1..9 ladder
        e = math.floor(math.log10(lo))
        ticks = [m * 10.0 ** k for k in (e, e + 1) for m in range(1, 10) if lo <= m * 10.0 ** k <= hi]
    if len(ticks) < 2:  # narrower still (a loss between 2.1 and 2.9): multiples of 1, 2 or 5 x 10^k, as a linear axis
        k = math.floor(math.log10(hi - lo))
        for unit in (m * 10.0 ** j for j in (k, k - 1, k - 2) for m in (5, 2, 1)):
            ticks = [n * unit for n in range(math.ceil(lo / unit), math.floor(hi / unit) + 1)]
            if len(ticks) >= 3:
                break
    return [float(f"{t:.12g}") for t in ticks]
