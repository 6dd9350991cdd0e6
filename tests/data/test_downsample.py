"""The bucket envelopes equal a SQL GROUP BY over the same rows (DuckDB as the reference), NaN and nulls included."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.data.downsample import ENVELOPE_COLUMNS, envelopes
from runwatch.data.store import derived_step_time

# What the envelope means, written as the plain GROUP BY it replaced (per bucket of x: first/last/min/max of the
# finite values, where min and max sit, how many values were not finite).
REFERENCE_SQL = """
WITH r AS (SELECT segment, main, x, v FROM rows_tbl WHERE v IS NOT NULL AND x IS NOT NULL),
b AS (SELECT *, least(CAST(floor((x - $lo) * $nb / greatest($hi - $lo, 1e-9)) AS BIGINT), $nb - 1) AS bucket
      FROM r WHERE x >= $lo AND x <= $hi)
SELECT segment, main, bucket, min(x) AS x_first, max(x) AS x_last,
       arg_min(v, x) FILTER (WHERE isfinite(v)) AS first, arg_max(v, x) FILTER (WHERE isfinite(v)) AS last,
       min(v) FILTER (WHERE isfinite(v)) AS min, max(v) FILTER (WHERE isfinite(v)) AS max,
       arg_min(x, v) FILTER (WHERE isfinite(v)) AS x_min, arg_max(x, v) FILTER (WHERE isfinite(v)) AS x_max,
       count(*) FILTER (WHERE NOT isfinite(v)) AS num_nonfinite, count(*) AS num_rows
FROM b GROUP BY segment, main, bucket ORDER BY segment, main, bucket
"""


def _rows(seed: int, n: int, float_x: bool) -> pa.Table:
    rng = np.random.default_rng(seed)
    segment = np.sort(rng.integers(0, 3, n)).astype(np.int32)
    x = rng.permutation(n * 3)[:n].astype(np.int64)  # distinct, unordered: the sort is the envelope's job
    v = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)  # continuous: no ties for arg_min to break
    v[rng.random(n) < 0.05] = np.nan
    v[rng.random(n) < 0.03] = np.inf
    v[rng.random(n) < 0.02] = -np.inf
    v_mask = rng.random(n) < 0.05  # nulls: not measured, never counted
    x_mask = rng.random(n) < 0.02
    x_arr = pa.array(x.astype(float) + 0.25 if float_x else x, mask=x_mask)
    return pa.table({"segment": segment, "main": rng.random(n) < 0.7, "x": x_arr, "v": pa.array(v, mask=v_mask)})


def _same(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400), num_buckets=st.integers(1, 60),
       float_x=st.booleans(), window=st.sampled_from([None, (0.2, 0.7), (0.5, 0.5)]))
def test_envelope_equals_the_sql_group_by(seed: int, n: int, num_buckets: int, float_x: bool, window) -> None:
    rows = _rows(seed, n, float_x)
    span = 3.0 * n
    lo, hi = (0.0, span) if window is None else (window[0] * span, window[1] * span)
    got = envelopes(rows, "x", ["v"], lo=lo, hi=hi, num_buckets=num_buckets)["v"]
    con = duckdb.connect()
    con.register("rows_tbl", rows)
    want = con.sql(REFERENCE_SQL, params={"lo": lo, "hi": hi, "nb": num_buckets}).to_arrow_table()
    assert got.column_names == list(ENVELOPE_COLUMNS)
    assert got.num_rows == want.num_rows
    for name in ENVELOPE_COLUMNS:
        ours, theirs = got[name].to_pylist(), want[name].to_pylist()
        assert all(_same(a, b) for a, b in zip(ours, theirs)), (name, ours, theirs)


def test_no_rows_in_range_is_an_empty_table_with_the_columns() -> None:
    rows = pa.table({"segment": pa.array([0], pa.int32()), "main": [True], "x": [5], "v": [1.0]})
    out = envelopes(rows, "x", ["v"], lo=10, hi=20, num_buckets=4)["v"]
    assert out.num_rows == 0 and out.column_names == list(ENVELOPE_COLUMNS)


def test_a_one_step_spike_and_a_nan_survive_a_million_rows() -> None:
    n = 1_000_000
    v = np.full(n, 2.0)
    v[613_007], v[800_003] = 40.0, np.nan
    rows = pa.table({"segment": pa.array(np.zeros(n, np.int32)), "main": np.ones(n, bool), "x": np.arange(n), "v": v})
    out = envelopes(rows, "x", ["v"], lo=0, hi=n - 1, num_buckets=2000)["v"]
    assert out.num_rows == 2000
    assert max(out["max"].to_pylist()) == 40.0 and out["x_max"].to_pylist()[out["max"].to_pylist().index(40.0)] == 613_007
    assert sum(out["num_nonfinite"].to_pylist()) == 1


def test_derived_step_time_is_per_segment_and_rank() -> None:
    rows = pa.table({"segment": pa.array([0, 0, 0, 1, 1], pa.int32()), "rank": pa.array([0, 0, 0, 0, 0], pa.int32()),
                     "step": [2, 0, 1, 10, 12], "time": [12.0, 10.0, 11.0, 100.0, 104.0]})
    got = derived_step_time(rows)
    assert np.isnan(got[1]) and got[2] == 1.0 and got[0] == 1.0  # by step order, whatever the row order
    assert np.isnan(got[3]) and got[4] == 2.0  # a new segment starts with no previous row


@pytest.mark.parametrize("num_buckets", [0, -1])
def test_bad_bucket_count_is_refused(num_buckets: int) -> None:
    rows = pa.table({"segment": pa.array([0], pa.int32()), "main": [True], "x": [5], "v": [1.0]})
    with pytest.raises(ValueError, match="num_buckets"):
        envelopes(rows, "x", ["v"], lo=0, hi=10, num_buckets=num_buckets)
