"""Per-bucket envelopes of chart columns: what the dashboard draws instead of every row, losing no spike.

``Store.downsample_columns`` reads a run's rows once (DuckDB) and hands the
arrays here. For each column, rows are cut into ``num_buckets`` equal slices
of x per segment and branch, and each bucket keeps the first, last, minimum
and maximum of its finite values with the x where each sits, plus how many
values were not finite: a one-step spike is some bucket's maximum and a NaN is
counted, so neither disappears at any zoom level. A range holding fewer rows
than buckets comes back one row per bucket (full resolution).

The arithmetic is sorted-array reductions (``numpy.ufunc.reduceat``), linear
in the rows after one sort by (segment, branch, bucket, x), which the rows
already nearly have; the result table is the same as a SQL ``GROUP BY``
(``tests/data/test_downsample.py`` checks it against DuckDB on random runs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ENVELOPE_COLUMNS: tuple[str, ...] = ("segment", "main", "bucket", "x_first", "x_last", "first", "last", "min", "max",
                                     "x_min", "x_max", "num_nonfinite", "num_rows")


def _values(column: pa.ChunkedArray | pa.Array, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """The column as numpy values and a validity mask (null is "not measured", NaN is data)."""
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    filled = pc.fill_null(column, 0) if column.null_count else column
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=dtype), np.asarray(valid, dtype=bool)


class _Buckets:
    """The bucket structure of rows sorted by (key, x): where each bucket starts and ends, and each row's bucket.

    Built once per set of kept rows and shared by every column kept on the same rows (a run's columns are
    nearly always all present), so each column pays only for its own values.
    """

    def __init__(self, key: np.ndarray, x: np.ndarray) -> None:
        self.key, self.x, self.size = key, x, key.size
        self.starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        self.ends = np.r_[self.starts[1:], key.size] - 1
        self.group = np.repeat(np.arange(self.starts.size), np.diff(np.r_[self.starts, key.size]))
        self._index = np.arange(key.size)

    def first_where(self, mask: np.ndarray) -> np.ndarray:
        """Per bucket, the index of its first row where ``mask`` holds, or -1."""
        first = np.minimum.reduceat(np.where(mask, self._index, self.size), self.starts)
        return np.where(first < self.size, first, -1)

    def last_where(self, mask: np.ndarray) -> np.ndarray:
        return np.maximum.reduceat(np.where(mask, self._index, -1), self.starts)


def _take(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``values[index]`` with -1 as missing (NaN), for the arrays that become nullable columns."""
    out = values[np.maximum(index, 0)].astype(float)
    out[index < 0] = np.nan
    return out


def _envelope(b: _Buckets, v: np.ndarray, x_type: pa.DataType) -> dict[str, pa.Array]:
    """One column's buckets from its values ``v`` on the rows of ``b``."""
    finite = np.isfinite(v)
    everywhere = bool(finite.all())
    # All finite (the common case): each bucket's first and last finite rows are its first and last rows.
    first, last = (b.starts, b.ends) if everywhere else (b.first_where(finite), b.last_where(finite))
    v_finite = v if everywhere else np.where(finite, v, np.nan)
    with np.errstate(invalid="ignore"):
        lo, hi = np.fmin.reduceat(v_finite, b.starts), np.fmax.reduceat(v_finite, b.starts)
    at_min = b.first_where(v_finite == lo[b.group])  # NaN equals nothing: only finite rows match
    at_max = b.first_where(v_finite == hi[b.group])
    x = b.x

    def x_at(index: np.ndarray) -> pa.Array:
        return pa.array(x[np.maximum(index, 0)], type=x_type, mask=index < 0)

    def nullable(values: np.ndarray, index: np.ndarray) -> pa.Array:
        return pa.array(values, type=pa.float64(), mask=index < 0)

    return {
        "x_first": pa.array(x[b.starts], type=x_type), "x_last": pa.array(x[b.ends], type=x_type),
        "first": nullable(_take(v, first), first), "last": nullable(_take(v, last), last),
        "min": nullable(lo, first), "max": nullable(hi, first),
        "x_min": x_at(at_min), "x_max": x_at(at_max),
        "num_nonfinite": pa.array(np.zeros(b.starts.size, dtype=np.int64) if everywhere
                                  else np.add.reduceat((~finite).astype(np.int64), b.starts)),
        "num_rows": pa.array(b.ends - b.starts + 1, type=pa.int64()),
    }


def envelopes(rows: pa.Table, x: str, columns: list[str], *, lo: float, hi: float,
              num_buckets: int) -> dict[str, pa.Table]:
    """Per-bucket envelope of each of ``columns`` over ``x`` in [lo, hi], per segment and branch.

    ``rows`` holds ``segment``, ``main`` (on the main line), ``x`` and the
    columns. Each result has ``ENVELOPE_COLUMNS``, ordered by segment, branch
    (abandoned first) and bucket; rows whose x or value is null are left out.
    """
    if num_buckets < 1:
        raise ValueError("num_buckets must be >= 1")
    segment = rows["segment"].to_numpy(zero_copy_only=False).astype(np.int64)
    main = rows["main"].to_numpy(zero_copy_only=False).astype(bool)
    x_type = rows.schema.field(x).type
    xs, x_valid = _values(rows[x], np.int64 if pa.types.is_integer(x_type) else np.float64)
    xf = xs.astype(float)
    with np.errstate(invalid="ignore"):
        in_range = x_valid & (xf >= lo) & (xf <= hi)
        bucket = np.minimum(np.floor((xf - lo) * num_buckets / max(hi - lo, 1e-9)), num_buckets - 1)
    bucket = np.where(in_range, bucket, 0).astype(np.int64)
    key = (segment * 2 + main) * num_buckets + bucket
    order = np.lexsort((xf, key))
    order = order[in_range[order]]  # the rows in range, sorted by (segment, branch, bucket, x)
    key, xs = key[order], xs[order]
    shared: _Buckets | None = None
    out = {}
    for name in columns:
        values, valid = _values(rows[name], np.float64)
        v, keep = values[order], valid[order]
        if keep.all():  # present on every row in range: the shared buckets
            shared = shared or _Buckets(key, xs)
            out[name] = _table(shared, v, x_type, num_buckets)
        else:
            out[name] = _table(_Buckets(key[keep], xs[keep]) if keep.any() else None, v[keep], x_type, num_buckets)
    return out


def _table(b: _Buckets | None, v: np.ndarray, x_type: pa.DataType, num_buckets: int) -> pa.Table:
    if b is None or b.size == 0:
        return pa.table({name: pa.array([], type=t) for name, t in _schema(x_type).items()})
    cols = _envelope(b, v, x_type)
    seg_main, bucket = np.divmod(b.key[b.starts], num_buckets)
    seg, main = np.divmod(seg_main, 2)
    head = {"segment": pa.array(seg, type=pa.int32()), "main": pa.array(main.astype(bool)),
            "bucket": pa.array(bucket, type=pa.int64())}
    return pa.table({**head, **cols}, schema=pa.schema([(n, t) for n, t in _schema(x_type).items()]))


def _schema(x_type: pa.DataType) -> Mapping[str, pa.DataType]:
    return {"segment": pa.int32(), "main": pa.bool_(), "bucket": pa.int64(), "x_first": x_type, "x_last": x_type,
            "first": pa.float64(), "last": pa.float64(), "min": pa.float64(), "max": pa.float64(),
            "x_min": x_type, "x_max": x_type, "num_nonfinite": pa.int64(), "num_rows": pa.int64()}
